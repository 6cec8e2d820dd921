//! The one typed configuration of kiln.
//!
//! Sources, later ones winning: built-in defaults, a TOML file (`--config`),
//! `KILN_*` environment variables, command-line flags. Every field documents
//! its default and what it trades off.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::plugins::compile::CompileConfig;
use crate::plugins::identity::PluginGrant;
use crate::plugins::{OperatorLimits, RuntimeConfig};

/// kiln's settings.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Extra plugin directories, each holding plugins (subdirectories with a
    /// `kiln-plugin.toml`) or being one. Default: none (bundled plugins only).
    pub plugin_dirs: Vec<PathBuf>,
    /// Plugins allowed to read the secrets their manifests ask for under
    /// `capabilities.secrets` — today a job's partner key,
    /// `extra_data.api_key_svc_org`. Each entry names a plugin by what the
    /// operator controls, never by the name its manifest claims (any plugin
    /// can claim any name):
    /// - a plugin directory (the one holding its `kiln-plugin.toml`), written
    ///   with a `/`: `"/srv/kiln/plugins/partner"`, `"./partner"`; it must
    ///   exist and is compared canonicalized (symlinks, `..` resolved);
    /// - a component hash, `"blake3:<64 hex digits>"`: the blake3 of the
    ///   plugin's `.wasm` file (`b3sum partner.wasm`); any plugin running
    ///   exactly that code.
    ///
    /// A bare name (`"partner"`) is refused at start with a message saying
    /// what to write instead. Default: none; a plugin that asks for a secret
    /// without being listed is refused at load, and its error names both
    /// ways to grant it. `KILN_SECRET_PLUGINS` is `:`-separated.
    pub secret_plugins: Vec<String>,
    /// Where compiled components are cached. Default: `$XDG_CACHE_HOME/kiln`
    /// or `~/.cache/kiln`. A warm cache turns seconds of compilation at start
    /// into milliseconds.
    pub cache_dir: Option<PathBuf>,
    /// Node calls that may run at once (also sizes the instance pool).
    /// Default: the number of CPUs.
    pub max_concurrency: u32,
    /// Linear memory a node gets when its manifest does not say. Default 512.
    pub node_memory_mb: u64,
    /// Most linear memory any node may get, whatever its manifest asks.
    /// Default 4096 (the wasm32 maximum).
    pub max_node_memory_mb: u64,
    /// Wall-clock time a node gets when its manifest does not say. Default 60 s.
    pub node_timeout_ms: u64,
    /// Most time any node may get. Default 600 s.
    pub max_node_timeout_ms: u64,
    /// Bytes of tensors one node call may create on the host. Default 4096 MiB.
    pub node_tensor_budget_mb: u64,
    /// Bytes of files one node call may save. Default 1024 MiB.
    pub node_file_budget_mb: u64,
    /// Captured stdout + stderr per node call. Default 64 KiB.
    pub node_log_kb: u64,
    /// Memory for cached node results reused across runs. Default 1024 MiB;
    /// 0 disables the cache.
    pub result_cache_mb: u64,
    /// Finished node instances whose memory is released together. 1 (the
    /// default) returns memory at once, which a long-running server wants;
    /// `kiln run` uses 16 (~10 µs per node call less when nothing is kept
    /// resident; no measurable difference with `node_keep_resident_kb`).
    pub decommit_batch: usize,
    /// Linear memory each instance slot keeps resident between node calls,
    /// reset in place to its original contents instead of unmapped, so the
    /// next call takes no page faults there. Default 1024 KiB; 0 turns it
    /// off. Only used where the kernel has PAGEMAP_SCAN (Linux ≥ 6.7).
    /// Costs up to this much RSS per instance slot (max_concurrency + 1,
    /// two memories each).
    pub node_keep_resident_kb: u64,
    /// Most nodes one workflow may have; more is `invalid_workflow` (exit 2
    /// for `kiln run`). Default 5000 (ComfyUI graphs have tens to hundreds).
    pub max_workflow_nodes: usize,
    /// Largest workflow (the request body on `/api/v2/jobs`, the file for
    /// `kiln run`), KiB. Default 8192. A parsed JSON document takes several
    /// times its size in memory.
    pub max_workflow_kb: usize,
    /// Memory one job may hold at once, MiB: its live tensors (node results
    /// not yet read by their last reader, host copies made for nodes) and
    /// its nodes' linear memories. Past it the node asking fails with
    /// `node_out_of_memory` naming this limit. Default 4096.
    pub job_memory_mb: u64,
    /// Files one node call may save. Default 4096 (ComfyUI's largest batch).
    pub node_max_files: u64,
    /// Files one job may save (outputs and previews). Default 10000.
    pub job_max_files: u64,
    /// Bytes of files one job may save, MiB. Default 4096.
    pub job_output_mb: u64,
    /// Wall-clock seconds one plugin's compilation may take. Cranelift cannot
    /// be interrupted mid-function, so `kiln` compiles each component (when
    /// its compiled artifact is not cached) in a child process
    /// (`kiln compile-component`) and kills it past this; the plugin then
    /// fails to load, naming this limit. Default 60: the bundled plugins
    /// compile in about 0.5 s on 2 cores (1 s of CPU), so a legitimate
    /// plugin 50× their size still fits on a slow host. The child's CPU
    /// time is capped too (`RLIMIT_CPU`: this many seconds per CPU, since
    /// compilation uses every core), in case the parent dies first.
    pub compile_timeout_s: u64,
    /// Address space of that child process (`RLIMIT_AS`), MiB. Default 2048:
    /// compiling the bundled plugins fits in 256 MiB of address space on 2
    /// cores (60 MiB resident); each further CPU adds a compiler thread's
    /// stack and allocator arena (up to 64 MiB of address space each). A
    /// component built to make the compiler allocate without end is
    /// stopped here instead of taking the host's memory.
    pub compile_memory_mb: u64,
    /// The executable run as `<exe> compile-component` to compile plugins
    /// under those limits. Not a configuration setting: the `kiln` binary
    /// sets it to itself. `None` (kiln linked as a library, e.g. in tests,
    /// where the current executable has no such subcommand) compiles in
    /// this process, without the limits.
    #[serde(skip)]
    pub compiler_exe: Option<PathBuf>,
    /// List the compiled guest code in `/tmp/perf-<pid>.map`, so `perf
    /// record` / `perf report` name the functions of plugins. For
    /// profiling; default false.
    pub guest_perf_map: bool,

    // --- `kiln serve` ---
    /// Threads answering HTTP. Default: a quarter of the CPUs, at least 1.
    /// Jobs execute on threads of their own (`max_running_jobs`), so HTTP
    /// needs few: each extra thread costs hand-offs between them on every
    /// request. On 2 vCPUs one thread measured ~0.1 ms less latency and
    /// ~15 % less CPU per job than two, at 90k `GET`s/s (BENCHMARKS.md).
    pub http_threads: usize,
    /// Address the server listens on. Default `127.0.0.1` (loopback only).
    pub host: String,
    /// Port the server listens on. Default 8188 (ComfyUI's).
    pub port: u16,
    /// Where jobs, assets and blobs are kept. Default `./kiln-data`.
    pub data_dir: PathBuf,
    /// When set, every `/api/v2` route except health needs
    /// `Authorization: Bearer <token>`. Default: none (open, self-hosted).
    pub token: Option<String>,
    /// Path prefix the APIs are mounted under (e.g. `/deployment/x`); links
    /// in responses include it. Default: none.
    pub mount_prefix: String,
    /// Jobs that may wait in the queue; beyond it submission gets 429
    /// `queue_full`. Default 1000.
    pub max_queued_jobs: usize,
    /// Jobs executing at once. Default: the number of CPUs.
    pub max_running_jobs: usize,
    /// How long a job and its outputs are kept after creation. Default 86400 s.
    pub job_retention_s: u64,
    /// How often the retention sweeper runs. Default 60 s.
    pub sweep_interval_s: u64,
    /// Largest asset upload. Default 100 MiB.
    pub max_upload_mb: u64,
    /// Event streams (SSE) open at once; beyond it 429 `too_many_streams`.
    /// Default 10000.
    pub max_event_streams: usize,
    /// Answer `GET /assets/{id}/content` with a 302 to a signed, expiring URL
    /// instead of the bytes. Default false.
    pub download_redirect: bool,
    /// Lifetime of signed download URLs. Default 3600 s.
    pub signed_url_ttl_s: u64,
    /// Silence after which an event stream sends a keepalive comment.
    /// Default 15 s (clients give up after 45 s).
    pub sse_keepalive_s: u64,
    /// Build absolute URLs from `X-Forwarded-Proto`/`X-Forwarded-Host`
    /// (only behind a trusted proxy). Default false.
    pub trust_forwarded_headers: bool,
    /// A built ComfyUI web frontend (the `static/` directory of PyPI's
    /// `comfyui-frontend-package`) to serve at `/`, with a
    /// Content-Security-Policy that keeps the browser on this server.
    /// Default: none (`/` answers 404).
    pub front_end_root: Option<PathBuf>,
    /// Largest file the frontend may keep under `/api/userdata` (a saved
    /// workflow), KiB. Default 16384.
    pub max_userdata_file_kb: u64,
    /// All of a user's `/api/userdata` files together, MiB. Default 1024.
    pub max_userdata_mb: u64,
    /// Most `/api/userdata` files per user (also bounds a listing).
    /// Default 10000.
    pub max_userdata_files: usize,
    /// Largest settings document (`/api/settings`, serialized), KiB.
    /// Default 1024 (the frontend's settings take a few KiB).
    pub max_settings_kb: usize,

    // Issue 17: GPU compute (see `gpu`).
    /// `"auto"` (the default): use a GPU adapter when there is one — host
    /// kernels run on it when it is a real GPU and the tensor is large
    /// enough, or when their input is already on the device; `"off"`: never;
    /// `"required"`: fail start-up without an adapter (Mesa's software
    /// Vulkan counts) and run every host kernel that has a GPU version on it.
    /// `KILN_GPU`.
    pub gpu: crate::gpu::GpuMode,
    /// Largest single device tensor, MiB. Default 1024.
    pub gpu_max_buffer_mb: u64,
    /// Most workgroups along one dimension of a plugin's dispatch. Default 65535.
    pub gpu_max_workgroups: u32,
    /// Most invocations of one dispatch. Default 2³⁰.
    pub gpu_max_invocations: u64,
    /// Most loop iterations one kernel invocation may run (every loop is
    /// rewritten to stop there, so a looping kernel ends). Default 2²⁰.
    pub gpu_loop_budget: u32,
    /// Longest WGSL source a plugin may compile, KiB. Default 256.
    pub gpu_max_source_kb: usize,
    /// Smallest result (values) `auto` sends to a real GPU. Default 65536.
    pub gpu_min_auto_elements: usize,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            plugin_dirs: Vec::new(),
            secret_plugins: Vec::new(),
            cache_dir: None,
            max_concurrency: std::thread::available_parallelism().map_or(2, |n| n.get() as u32),
            node_memory_mb: 512,
            max_node_memory_mb: 4096,
            node_timeout_ms: 60_000,
            max_node_timeout_ms: 600_000,
            node_tensor_budget_mb: 4096,
            node_file_budget_mb: 1024,
            node_log_kb: 64,
            result_cache_mb: 1024,
            decommit_batch: 1,
            node_keep_resident_kb: 1024,
            max_workflow_nodes: 5_000,
            max_workflow_kb: 8192,
            job_memory_mb: 4096,
            node_max_files: 4096,
            job_max_files: 10_000,
            job_output_mb: 4096,
            compile_timeout_s: 60,
            compile_memory_mb: 2048,
            compiler_exe: None,
            guest_perf_map: false,
            http_threads: std::thread::available_parallelism().map_or(1, |n| (n.get() / 4).max(1)),
            host: "127.0.0.1".into(),
            port: 8188,
            data_dir: PathBuf::from("kiln-data"),
            token: None,
            mount_prefix: String::new(),
            max_queued_jobs: 1000,
            max_running_jobs: std::thread::available_parallelism().map_or(2, |n| n.get()),
            job_retention_s: 86_400,
            sweep_interval_s: 60,
            max_upload_mb: 100,
            max_event_streams: 10_000,
            download_redirect: false,
            signed_url_ttl_s: 3600,
            sse_keepalive_s: 15,
            trust_forwarded_headers: false,
            front_end_root: None,
            max_userdata_file_kb: 16 * 1024,
            max_userdata_mb: 1024,
            max_userdata_files: 10_000,
            max_settings_kb: 1024,
            gpu: crate::gpu::GpuMode::Auto,
            gpu_max_buffer_mb: 1024,
            gpu_max_workgroups: 65_535,
            gpu_max_invocations: 1 << 30,
            gpu_loop_budget: 1 << 20,
            gpu_max_source_kb: 256,
            gpu_min_auto_elements: 1 << 16,
        }
    }
}

/// Why the configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("invalid config: {0}")]
    Parse(#[from] toml::de::Error),
    #[error("invalid value for {var}: {value:?}")]
    Env { var: String, value: String },
    #[error("invalid secret_plugins entry: {0}")]
    SecretPlugins(#[from] crate::plugins::identity::GrantError),
    #[error(transparent)]
    Gpu(#[from] crate::gpu::GpuStartError),
}

impl Config {
    /// Defaults, then `file`, then `KILN_*` environment variables.
    pub fn load(file: Option<&Path>) -> Result<Config, ConfigError> {
        let mut table = match file {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })?;
                toml::from_str::<toml::Table>(&text)?
            }
            None => toml::Table::new(),
        };
        apply_env(&mut table, std::env::vars())?;
        Ok(Config::deserialize(toml::Value::Table(table))?)
    }

    /// The compiled-component cache directory in effect.
    pub fn artifact_dir(&self) -> Option<PathBuf> {
        self.cache_dir.clone().or_else(|| {
            std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
                .map(|d| d.join("kiln"))
        })
    }

    /// Bounds on a workflow's size.
    pub fn workflow_limits(&self) -> crate::workflow::WorkflowLimits {
        crate::workflow::WorkflowLimits { max_nodes: self.max_workflow_nodes.max(1), max_bytes: self.max_workflow_kb.saturating_mul(1024).max(1024) }
    }

    /// What the frontend's user may keep (`/api/userdata`, `/api/settings`).
    pub fn user_file_limits(&self) -> crate::service::user_files::UserFileLimits {
        crate::service::user_files::UserFileLimits {
            file_bytes: self.max_userdata_file_kb.saturating_mul(1024),
            total_bytes: self.max_userdata_mb.saturating_mul(1 << 20),
            max_files: self.max_userdata_files,
            settings_bytes: self.max_settings_kb.saturating_mul(1024),
        }
    }

    /// What one job may consume.
    pub fn job_limits(&self) -> crate::budget::JobLimits {
        crate::budget::JobLimits {
            memory_bytes: self.job_memory_mb.saturating_mul(1 << 20),
            max_files: self.job_max_files,
            output_bytes: self.job_output_mb.saturating_mul(1 << 20),
        }
    }

    /// The bounds on GPU kernels.
    pub fn gpu_limits(&self) -> crate::gpu::GpuLimits {
        crate::gpu::GpuLimits {
            max_buffer_bytes: self.gpu_max_buffer_mb.saturating_mul(1 << 20).max(1 << 20),
            max_workgroups_per_dim: self.gpu_max_workgroups.max(1),
            max_invocations: self.gpu_max_invocations.max(1),
            loop_budget: self.gpu_loop_budget.max(1),
            max_source_bytes: self.gpu_max_source_kb.saturating_mul(1024),
            min_auto_elements: self.gpu_min_auto_elements,
            ..crate::gpu::GpuLimits::default()
        }
    }

    /// The plugin runtime's slice of the configuration; refuses
    /// `secret_plugins` entries that do not name a directory or a hash, and
    /// `gpu = "required"` without an adapter (the GPU is opened here, once
    /// per process).
    pub fn runtime(&self) -> Result<RuntimeConfig, ConfigError> {
        let mb = |v: u64| v.saturating_mul(1 << 20);
        Ok(RuntimeConfig {
            max_concurrency: self.max_concurrency.max(1),
            limits: OperatorLimits {
                default_memory_bytes: mb(self.node_memory_mb).min(mb(self.max_node_memory_mb)),
                max_memory_bytes: mb(self.max_node_memory_mb).min(4 << 30),
                default_timeout: Duration::from_millis(self.node_timeout_ms.min(self.max_node_timeout_ms)),
                max_timeout: Duration::from_millis(self.max_node_timeout_ms),
            },
            tensor_budget_bytes: mb(self.node_tensor_budget_mb),
            file_budget_bytes: mb(self.node_file_budget_mb),
            max_files: self.node_max_files,
            log_bytes: (self.node_log_kb as usize).saturating_mul(1024),
            artifact_dir: self.artifact_dir(),
            decommit_batch: self.decommit_batch,
            keep_resident_bytes: usize::try_from(self.node_keep_resident_kb.saturating_mul(1024)).unwrap_or(usize::MAX),
            perf_map: self.guest_perf_map,
            secret_plugins: PluginGrant::parse_all(&self.secret_plugins)?,
            compile: CompileConfig {
                exe: self.compiler_exe.clone(),
                timeout: Duration::from_secs(self.compile_timeout_s.max(1)),
                memory_bytes: mb(self.compile_memory_mb.max(1)),
            },
            gpu: crate::gpu::Gpu::start(self.gpu, self.gpu_limits())?,
        })
    }
}

/// Overlays `KILN_<FIELD>` variables on `table` (lists are `:`-separated).
fn apply_env(table: &mut toml::Table, vars: impl Iterator<Item = (String, String)>) -> Result<(), ConfigError> {
    let fields = [
        "plugin_dirs",
        "secret_plugins",
        "cache_dir",
        "max_concurrency",
        "node_memory_mb",
        "max_node_memory_mb",
        "node_timeout_ms",
        "max_node_timeout_ms",
        "node_tensor_budget_mb",
        "node_file_budget_mb",
        "node_log_kb",
        "result_cache_mb",
        "decommit_batch",
        "node_keep_resident_kb",
        "compile_timeout_s",
        "compile_memory_mb",
        "guest_perf_map",
        "max_workflow_nodes",
        "max_workflow_kb",
        "job_memory_mb",
        "node_max_files",
        "job_max_files",
        "job_output_mb",
        "http_threads",
        "host",
        "port",
        "data_dir",
        "token",
        "mount_prefix",
        "max_queued_jobs",
        "max_running_jobs",
        "job_retention_s",
        "sweep_interval_s",
        "max_upload_mb",
        "max_event_streams",
        "download_redirect",
        "signed_url_ttl_s",
        "sse_keepalive_s",
        "trust_forwarded_headers",
        "front_end_root",
        "max_userdata_file_kb",
        "max_userdata_mb",
        "max_userdata_files",
        "max_settings_kb",
        "gpu",
        "gpu_max_buffer_mb",
        "gpu_max_workgroups",
        "gpu_max_invocations",
        "gpu_loop_budget",
        "gpu_max_source_kb",
        "gpu_min_auto_elements",
    ];
    for (var, value) in vars {
        let Some(field) = var.strip_prefix("KILN_").map(str::to_ascii_lowercase) else { continue };
        if !fields.contains(&field.as_str()) {
            continue;
        }
        let parsed = match field.as_str() {
            "plugin_dirs" | "secret_plugins" => toml::Value::Array(value.split(':').filter(|s| !s.is_empty()).map(|s| toml::Value::String(s.into())).collect()),
            "cache_dir" | "host" | "data_dir" | "token" | "mount_prefix" | "front_end_root" | "gpu" => toml::Value::String(value),
            "download_redirect" | "trust_forwarded_headers" | "guest_perf_map" => match value.as_str() {
                "1" | "true" => toml::Value::Boolean(true),
                "0" | "false" => toml::Value::Boolean(false),
                _ => return Err(ConfigError::Env { var: var.clone(), value: value.clone() }),
            },
            _ => toml::Value::Integer(value.parse().map_err(|_| ConfigError::Env { var: var.clone(), value: value.clone() })?),
        };
        table.insert(field, parsed);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_then_env_override_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kiln.toml");
        std::fs::write(&path, "node_timeout_ms = 5000\nresult_cache_mb = 7\n").unwrap();
        let mut table = toml::from_str::<toml::Table>(&std::fs::read_to_string(&path).unwrap()).unwrap();
        apply_env(&mut table, [("KILN_NODE_TIMEOUT_MS".to_string(), "250".to_string()), ("KILN_PLUGIN_DIRS".into(), "/a:/b".into())].into_iter()).unwrap();
        let config = Config::deserialize(toml::Value::Table(table)).unwrap();
        assert_eq!(config.node_timeout_ms, 250);
        assert_eq!(config.result_cache_mb, 7);
        assert_eq!(config.plugin_dirs, vec![PathBuf::from("/a"), PathBuf::from("/b")]);
        assert_eq!(config.node_memory_mb, Config::default().node_memory_mb);
        assert_eq!(config.runtime().unwrap().limits.default_timeout, Duration::from_millis(250));
    }

    #[test]
    fn gpu_mode_comes_from_kiln_gpu() {
        let parse = |value: &str| {
            let mut table = toml::Table::new();
            apply_env(&mut table, [("KILN_GPU".to_string(), value.to_string())].into_iter()).unwrap();
            Config::deserialize(toml::Value::Table(table))
        };
        assert_eq!(parse("required").unwrap().gpu, crate::gpu::GpuMode::Required);
        assert_eq!(parse("off").unwrap().gpu, crate::gpu::GpuMode::Off);
        assert!(parse("fast").is_err(), "only auto, off, required");
        assert_eq!(Config::default().gpu, crate::gpu::GpuMode::Auto);
        let config = Config { gpu: crate::gpu::GpuMode::Off, ..Config::default() };
        assert!(config.runtime().unwrap().gpu.is_none(), "off opens no device");
    }

    #[test]
    fn secret_plugins_name_directories_or_hashes() {
        let dir = tempfile::tempdir().unwrap();
        let hash = format!("blake3:{}", blake3::hash(b"wasm").to_hex());
        let config = Config { secret_plugins: vec![dir.path().display().to_string(), hash], ..Config::default() };
        assert_eq!(config.runtime().unwrap().secret_plugins.len(), 2);
        let old_style = Config { secret_plugins: vec!["partner".into()], ..Config::default() };
        let err = old_style.runtime().unwrap_err().to_string();
        assert!(err.contains("secret_plugins") && err.contains("`partner` looks like a plugin name") && err.contains("blake3:"), "{err}");
        // Not settable from a file: only the binary names itself.
        assert!(toml::from_str::<Config>("compiler_exe = '/bin/sh'").is_err());
    }

    #[test]
    fn rejects_unknown_fields_and_bad_env() {
        assert!(toml::from_str::<Config>("surprise = 1").is_err());
        let mut table = toml::Table::new();
        assert!(apply_env(&mut table, [("KILN_NODE_LOG_KB".to_string(), "lots".to_string())].into_iter()).is_err());
    }
}
