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
use crate::plugins::network::{HostPattern, NetGrant, OutboundLimits};
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
    /// `kiln run`), KiB. Default 8192.
    pub max_workflow_kb: usize,
    /// Most JSON values (objects, arrays, strings, numbers, literals) one
    /// submission may hold, counted on its bytes before it is parsed; more
    /// is `invalid_workflow` naming this setting. Default 262144. A parsed
    /// value takes up to ~256 bytes (a one-element array or object, with
    /// its allocation), so a body's tree is bounded by this, not by its
    /// size alone (a 7 MiB body of tiny arrays parsed to 700 MiB). A
    /// 5,000-node chain holds ~30,000 values.
    pub max_workflow_values: usize,
    /// Memory, MiB, that submissions being parsed and validated and
    /// uploads being decoded (`/upload/mask`) may hold at once, server-wide,
    /// estimated before the work from the request (its bytes and value
    /// count, an image's dimensions): a request waits until its estimate
    /// fits. Default 512.
    pub intake_memory_mb: u64,
    /// Memory, MiB, that queued jobs may hold as parsed workflows and
    /// plans so they start without parsing again. A queued job over it
    /// keeps only its stored bytes and is parsed and validated when it
    /// starts. Default 64.
    pub queued_parsed_mb: u64,
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
    /// With accounts (cloud, serverless): the most jobs one account (or
    /// deployment) may have waiting, whatever its tier says: its effective
    /// bound is the lesser of the two. Default: a quarter of
    /// `max_queued_jobs` (at least 1), so one account without a tier never
    /// fills the whole queue and locks the others out; raise it (up to
    /// `max_queued_jobs`) to let tiers give more. A self-hosted server's
    /// one owner keeps `max_queued_jobs` (or its default tier's).
    /// `KILN_MAX_QUEUED_JOBS_PER_ACCOUNT`.
    pub max_queued_jobs_per_account: Option<usize>,
    /// Jobs executing at once. Default: the number of CPUs.
    pub max_running_jobs: usize,
    /// How long a job and its outputs are kept after creation. Default 86400 s.
    pub job_retention_s: u64,
    /// How often the retention sweeper runs. Default 60 s.
    pub sweep_interval_s: u64,
    /// Largest asset upload. Default 100 MiB.
    pub max_upload_mb: u64,
    /// Event streams open at once on the whole server: SSE streams of
    /// `/api/v2` and WebSocket connections of the compatibility API;
    /// beyond it 429 `too_many_streams`. Default 10000.
    pub max_event_streams: usize,
    /// With accounts (cloud, serverless): the most event streams (SSE and
    /// WebSockets together) one account may hold open; beyond it that
    /// account's next one is 429 `too_many_streams` while other accounts
    /// still open theirs. Default: a quarter of `max_event_streams` (at
    /// least 1), so one account never holds the whole pool. A self-hosted
    /// server's one owner is bounded by `max_event_streams` only.
    /// `KILN_MAX_EVENT_STREAMS_PER_ACCOUNT`.
    pub max_event_streams_per_account: Option<usize>,
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

    // --- HTTP connections (`api::listener`) ---
    /// Seconds a request's headers may take to arrive, counted from the
    /// connection's opening for its first request and from the first byte
    /// of each later one. Past it the connection is closed: a client that
    /// sends half a request (slowloris) holds a connection this long at
    /// most. Default 10 (a browser or SDK sends its headers in one write).
    pub http_header_timeout_s: u64,
    /// Seconds a kept-alive connection may sit between requests with
    /// nothing read (no request in flight) before the server closes it.
    /// Default 60. Responses that stream (event streams) and WebSockets
    /// are requests in flight, never idle.
    pub http_idle_timeout_s: u64,
    /// Seconds a request body may go without a byte while its handler
    /// waits for one; past it the request fails with 408
    /// `request_timeout` and the connection is closed. Default 30. A
    /// handler busy elsewhere (writing an upload to disk) does not count.
    /// Also how long a response may wait for the client to read any of
    /// it (a client that stops reading a download or an event stream);
    /// past it the connection is closed.
    pub http_body_timeout_s: u64,
    /// Connections served at once, all clients together. Past it a new
    /// connection only gets `/api/v2/health` (from a small reserve), else
    /// 503 `too_many_connections`, and is closed. Default 4096; `kiln serve`
    /// lowers it to what the open-file limit (`RLIMIT_NOFILE`, raised to
    /// its hard limit at start) leaves after a descriptor per connection
    /// for the file it may stream and a margin for the store and plugins,
    /// with a warning.
    pub max_connections: usize,
    /// Connections one client address holds at once (IPv6: one /64
    /// network); past it as past `max_connections`. Default 256. Behind a
    /// reverse proxy every client is the proxy's address: raise it there.
    pub max_connections_per_ip: usize,

    // --- issue 18 (branch `tenants`): deployment kinds, accounts, credits ---
    /// `self-hosted` (the default: open, or the one static `token`),
    /// `cloud` or `serverless` (callers are accounts, each with its own
    /// keys, credits and jobs; see OPERATORS.md). `KILN_MODE`, `--mode`.
    pub mode: Mode,
    /// The operator token that opens the admin API under `/admin/`
    /// (`Authorization: Bearer`). Default: none, and the admin API answers
    /// 404. `KILN_ADMIN_TOKEN`.
    pub admin_token: Option<String>,
    /// Credits a job costs per second of execution (cloud and serverless),
    /// charged when it ends, rounded up. Default 1.
    pub credits_per_second: u64,
    /// Least a job that executed costs, credits. Default 1.
    pub credits_min_per_job: u64,

    // --- Issue 18 (branch `fair`): tiers, job logs, deployments. ---
    /// Named tiers of per-account limits, `[tiers.NAME]` with `max_running`
    /// (jobs running at once; more wait in the queue) and `max_queued`
    /// (jobs waiting; more are 429 `queue_full`). An account's tier comes
    /// from its record. Default: none.
    pub tiers: std::collections::BTreeMap<String, TierConfig>,
    /// The tier of accounts without one (and of a self-hosted server's one
    /// owner). Default: none, which means `max_running_jobs` /
    /// `max_queued_jobs` for each.
    pub default_tier: Option<String>,
    /// The tail of a job's stdout + stderr kept as its `logs`, KiB.
    /// Default 1024.
    pub job_log_kb: u64,

    // Issue 16: plugin network capabilities and the bundled partner proxy.
    /// The partner provider's base URL (`KILN_PARTNER_BASE_URL`), e.g.
    /// `https://api.freepik.com` or `http://127.0.0.1:9999`. The bundled
    /// partner plugin may reach this host and port only (an IP literal
    /// names an internal address explicitly; a name must resolve to public
    /// addresses). Default: none — its routes answer 503.
    pub partner_base_url: Option<String>,
    /// The provider key (`KILN_PARTNER_API_KEY`), sent as
    /// `x-freepik-api-key`; only the partner plugin sees it. Default: none.
    pub partner_api_key: Option<String>,
    /// Tokens the partner routes (and the partner node, as a job's
    /// `api_key_svc_org`) accept (`KILN_PARTNER_TOKENS`, comma-separated).
    /// Default: none (every request is 401).
    pub partner_tokens: Vec<String>,
    /// Further hosts (`host` or `host:port`) the partner node may download
    /// results from, e.g. the provider's CDN (`KILN_PARTNER_DOWNLOAD_HOSTS`,
    /// comma-separated). Default: none.
    pub partner_download_hosts: Vec<String>,
    /// Network grants to other plugins (config file only): each names a
    /// plugin by directory or `blake3:` component hash, with the hosts it
    /// may reach (intersected with its manifest's `outbound_hosts`),
    /// whether its manifest's routes are mounted, and its configuration
    /// (handed to it, and only to it, as its WASI environment).
    pub plugin_network: Vec<PluginNetwork>,
    /// Connect timeout of a plugin's outbound request (name resolution, TCP,
    /// TLS), ms; a plugin may ask for less. Default 10000.
    pub outbound_connect_timeout_ms: u64,
    /// Most time from an outbound request sent to its response's first
    /// byte, and between two chunks of its body, ms. Default 60000.
    pub outbound_first_byte_timeout_ms: u64,
    /// Largest response body a plugin may receive, MiB. Default 64.
    pub outbound_max_response_mb: u64,
    /// Largest request body a plugin route accepts (413 beyond), MiB, and
    /// largest response it may give. Default 64 (a base64 image).
    pub route_max_body_mb: u64,
    /// Most time one route call may take, ms (the plugin's own time limit
    /// if lower); 504 beyond. Default 120000.
    pub route_timeout_ms: u64,

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
    /// Most loop iterations one plugin dispatch may run, all invocations
    /// together (each invocation's budget is this over their number, at
    /// most `gpu_loop_budget`). Default 2³².
    pub gpu_max_dispatch_iterations: u64,
    /// Longest WGSL source a plugin may compile, KiB. Default 256.
    pub gpu_max_source_kb: usize,
    /// Smallest result (values) `auto` sends to a real GPU. Default 65536.
    pub gpu_min_auto_elements: usize,
}

/// One `[[plugin_network]]` grant (see [`Config::plugin_network`]).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct PluginNetwork {
    /// The plugin: its directory or `blake3:<hex>` (as `secret_plugins`).
    pub plugin: String,
    /// `host` or `host:port` entries.
    pub outbound_hosts: Vec<String>,
    /// Mount the routes its manifest declares.
    pub routes: bool,
    /// Its configuration.
    pub env: std::collections::BTreeMap<String, String>,
}

/// One tier's limits (`[tiers.NAME]`).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct TierConfig {
    pub max_running: usize,
    pub max_queued: usize,
}

/// The deployment kind a server runs as.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// One operator: open, or one static bearer token.
    #[default]
    SelfHosted,
    /// A hosted cloud: account keys, credits, subscriptions.
    Cloud,
    /// Per-deployment serverless hosts: account keys and credits.
    Serverless,
}

impl Mode {
    /// Whether callers are accounts (cloud, serverless).
    pub fn has_accounts(self) -> bool {
        self != Mode::SelfHosted
    }
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
            max_workflow_values: 1 << 18,
            intake_memory_mb: 512,
            queued_parsed_mb: 64,
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
            max_queued_jobs_per_account: None,
            max_running_jobs: std::thread::available_parallelism().map_or(2, |n| n.get()),
            job_retention_s: 86_400,
            sweep_interval_s: 60,
            max_upload_mb: 100,
            max_event_streams: 10_000,
            max_event_streams_per_account: None,
            download_redirect: false,
            signed_url_ttl_s: 3600,
            sse_keepalive_s: 15,
            trust_forwarded_headers: false,
            front_end_root: None,
            max_userdata_file_kb: 16 * 1024,
            max_userdata_mb: 1024,
            max_userdata_files: 10_000,
            max_settings_kb: 1024,
            http_header_timeout_s: 10,
            http_idle_timeout_s: 60,
            http_body_timeout_s: 30,
            max_connections: 4096,
            max_connections_per_ip: 256,
            mode: Mode::SelfHosted,
            admin_token: None,
            credits_per_second: 1,
            credits_min_per_job: 1,
            tiers: Default::default(),
            default_tier: None,
            job_log_kb: 1024,
            partner_base_url: None,
            partner_api_key: None,
            partner_tokens: Vec::new(),
            partner_download_hosts: Vec::new(),
            plugin_network: Vec::new(),
            outbound_connect_timeout_ms: 10_000,
            outbound_first_byte_timeout_ms: 60_000,
            outbound_max_response_mb: 64,
            route_max_body_mb: 64,
            route_timeout_ms: 120_000,
            gpu: crate::gpu::GpuMode::Auto,
            gpu_max_buffer_mb: 1024,
            gpu_max_workgroups: 65_535,
            gpu_max_invocations: 1 << 30,
            gpu_loop_budget: 1 << 20,
            gpu_max_dispatch_iterations: 1 << 32,
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
    #[error("invalid {field}: {reason}")]
    Network { field: &'static str, reason: String },
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
        crate::workflow::WorkflowLimits {
            max_nodes: self.max_workflow_nodes.max(1),
            max_bytes: self.max_workflow_kb.saturating_mul(1024).max(1024),
            max_values: self.max_workflow_values.max(16),
        }
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

    /// The tiers of per-account limits; an unknown `default_tier` is
    /// refused at start (see `check_tiers`).
    pub fn tiers(&self) -> crate::service::fair::Tiers {
        let limits = |t: &TierConfig| crate::service::fair::OwnerLimits { max_running: t.max_running.max(1), max_queued: t.max_queued };
        crate::service::fair::Tiers {
            tiers: self.tiers.iter().map(|(name, t)| (name.clone(), limits(t))).collect(),
            default: self.default_tier.as_ref().and_then(|d| self.tiers.get(d)).map(limits),
        }
    }

    /// The queued jobs one account may hold (see
    /// `max_queued_jobs_per_account`).
    pub fn queued_jobs_per_account(&self) -> usize {
        self.max_queued_jobs_per_account.unwrap_or(self.max_queued_jobs / 4).max(1)
    }

    /// The event streams one account may hold open (see
    /// `max_event_streams_per_account`).
    pub fn event_streams_per_account(&self) -> usize {
        self.max_event_streams_per_account.unwrap_or(self.max_event_streams / 4).max(1)
    }

    /// `default_tier` must name a configured tier.
    pub fn check_tiers(&self) -> Result<(), String> {
        match &self.default_tier {
            Some(d) if !self.tiers.contains_key(d) => Err(format!("default_tier {d:?} is not one of the configured [tiers.NAME]")),
            _ => Ok(()),
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
            max_dispatch_iterations: self.gpu_max_dispatch_iterations.max(1),
            max_source_bytes: self.gpu_max_source_kb.saturating_mul(1024),
            min_auto_elements: self.gpu_min_auto_elements,
            ..crate::gpu::GpuLimits::default()
        }
    }

    /// The plugin runtime's slice of the configuration; refuses
    /// `secret_plugins` entries that do not name a directory or a hash, and
    /// `gpu = "required"` without an adapter (that GPU is opened here, once
    /// per process; `auto` looks for one only when a node would use it).
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
            // The bundled partner plugin reads the partner key (issue 16).
            secret_plugins: PluginGrant::parse_all(&self.secret_plugins)?.into_iter().chain([PluginGrant::Bundled("partner".into())]).collect(),
            compile: CompileConfig {
                exe: self.compiler_exe.clone(),
                timeout: Duration::from_secs(self.compile_timeout_s.max(1)),
                memory_bytes: mb(self.compile_memory_mb.max(1)),
            },
            net_grants: self.net_grants()?,
            outbound: OutboundLimits {
                connect_timeout: Duration::from_millis(self.outbound_connect_timeout_ms.max(1)),
                first_byte_timeout: Duration::from_millis(self.outbound_first_byte_timeout_ms.max(1)),
                max_response_bytes: mb(self.outbound_max_response_mb),
            },
            route_response_bytes: usize::try_from(mb(self.route_max_body_mb)).unwrap_or(usize::MAX),
            route_timeout: Duration::from_millis(self.route_timeout_ms.max(1)),
            gpu: crate::gpu::Gpu::start(self.gpu, self.gpu_limits(), self.compiler_exe.as_deref())?,
        })
    }

    /// Largest request body a plugin route accepts, bytes.
    pub fn route_body_bytes(&self) -> usize {
        usize::try_from(self.route_max_body_mb.saturating_mul(1 << 20)).unwrap_or(usize::MAX)
    }

    /// The operator's network grants: `plugin_network`, and the bundled
    /// partner plugin's (its provider's host and port, the download hosts,
    /// its routes, and the partner settings as its configuration).
    fn net_grants(&self) -> Result<Vec<NetGrant>, ConfigError> {
        let hosts = |field: &'static str, list: &[String]| {
            list.iter().map(|h| HostPattern::parse(h).map_err(|reason| ConfigError::Network { field, reason })).collect::<Result<Vec<_>, _>>()
        };
        let mut grants = Vec::new();
        for entry in &self.plugin_network {
            grants.push(NetGrant {
                plugin: PluginGrant::parse(&entry.plugin)?,
                outbound_hosts: hosts("plugin_network.outbound_hosts", &entry.outbound_hosts)?,
                routes: entry.routes,
                env: entry.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            });
        }
        let mut partner_hosts = hosts("partner_download_hosts", &self.partner_download_hosts)?;
        let mut env = vec![("KILN_PARTNER_TOKENS".to_string(), self.partner_tokens.join(","))];
        if let Some(url) = self.partner_base_url.as_deref().map(str::trim).filter(|u| !u.is_empty()) {
            partner_hosts.push(base_url_host(url)?);
            env.push(("KILN_PARTNER_BASE_URL".into(), url.trim_end_matches('/').to_string()));
        }
        if let Some(key) = &self.partner_api_key {
            env.push(("KILN_PARTNER_API_KEY".into(), key.clone()));
        }
        grants.push(NetGrant { plugin: PluginGrant::Bundled("partner".into()), outbound_hosts: partner_hosts, routes: true, env });
        Ok(grants)
    }
}

/// The `host:port` of a provider base URL (`http(s)://host[:port][/path]`).
fn base_url_host(url: &str) -> Result<HostPattern, ConfigError> {
    let bad = |reason: &str| ConfigError::Network { field: "partner_base_url", reason: format!("{url:?} {reason}") };
    let uri: http::Uri = url.parse().map_err(|_| bad("is not a URL"))?;
    let port = match uri.scheme_str() {
        Some("http") => uri.port_u16().unwrap_or(80),
        Some("https") => uri.port_u16().unwrap_or(443),
        _ => return Err(bad("must start with http:// or https://")),
    };
    if uri.query().is_some() {
        return Err(bad("must not have a query"));
    }
    let host = uri.host().ok_or_else(|| bad("has no host"))?;
    let host = if host.contains(':') && !host.starts_with('[') { format!("[{host}]") } else { host.to_string() };
    HostPattern::parse(&format!("{host}:{port}")).map_err(|reason| ConfigError::Network { field: "partner_base_url", reason })
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
        "max_workflow_values",
        "intake_memory_mb",
        "queued_parsed_mb",
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
        "max_queued_jobs_per_account",
        "max_running_jobs",
        "job_retention_s",
        "sweep_interval_s",
        "max_upload_mb",
        "max_event_streams",
        "max_event_streams_per_account",
        "download_redirect",
        "signed_url_ttl_s",
        "sse_keepalive_s",
        "trust_forwarded_headers",
        "front_end_root",
        "max_userdata_file_kb",
        "max_userdata_mb",
        "max_userdata_files",
        "max_settings_kb",
        "http_header_timeout_s",
        "http_idle_timeout_s",
        "http_body_timeout_s",
        "max_connections",
        "max_connections_per_ip",
        "mode",
        "admin_token",
        "credits_per_second",
        "credits_min_per_job",
        "default_tier",
        "job_log_kb",
        "partner_base_url",
        "partner_api_key",
        "partner_tokens",
        "partner_download_hosts",
        "outbound_connect_timeout_ms",
        "outbound_first_byte_timeout_ms",
        "outbound_max_response_mb",
        "route_max_body_mb",
        "route_timeout_ms",
        "gpu",
        "gpu_max_buffer_mb",
        "gpu_max_workgroups",
        "gpu_max_invocations",
        "gpu_loop_budget",
        "gpu_max_dispatch_iterations",
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
            "partner_tokens" | "partner_download_hosts" => {
                toml::Value::Array(value.split(',').map(str::trim).filter(|s| !s.is_empty()).map(|s| toml::Value::String(s.into())).collect())
            }
            "partner_base_url" | "partner_api_key" => toml::Value::String(value),
            "cache_dir" | "host" | "data_dir" | "token" | "mount_prefix" | "front_end_root" | "mode" | "admin_token" | "default_tier" | "gpu" => {
                toml::Value::String(value)
            }
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
    fn tiers_come_from_the_file_and_default_tier_must_name_one() {
        let table = toml::from_str::<toml::Table>(
            "default_tier = \"free\"\n[tiers.free]\nmax_running = 1\nmax_queued = 20\n[tiers.pro]\nmax_running = 0\nmax_queued = 5\n",
        )
        .unwrap();
        let config = Config::deserialize(toml::Value::Table(table)).unwrap();
        assert!(config.check_tiers().is_ok());
        let tiers = config.tiers();
        let free = crate::service::fair::OwnerLimits { max_running: 1, max_queued: 20 };
        assert_eq!(tiers.default, Some(free));
        assert_eq!(tiers.tiers["pro"].max_running, 1, "a tier runs at least one job");
        let unknown = Config { default_tier: Some("gold".into()), ..config.clone() };
        assert!(unknown.check_tiers().unwrap_err().contains("gold"));
        let bad = toml::from_str::<toml::Table>("[tiers.free]\nmax_running = 1\n").unwrap();
        assert!(Config::deserialize(toml::Value::Table(bad)).is_err(), "both limits are required");
    }

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
    fn per_account_shares_default_to_a_quarter_and_come_from_the_environment() {
        let defaults = Config::default();
        assert_eq!((defaults.queued_jobs_per_account(), defaults.event_streams_per_account()), (250, 2500));
        let tiny = Config { max_queued_jobs: 2, max_event_streams: 0, ..Config::default() };
        assert_eq!((tiny.queued_jobs_per_account(), tiny.event_streams_per_account()), (1, 1), "never 0");
        let mut table = toml::Table::new();
        let vars = [("KILN_MAX_QUEUED_JOBS_PER_ACCOUNT", "40"), ("KILN_MAX_EVENT_STREAMS_PER_ACCOUNT", "7")];
        apply_env(&mut table, vars.iter().map(|(k, v)| (k.to_string(), v.to_string()))).unwrap();
        let config = Config::deserialize(toml::Value::Table(table)).unwrap();
        assert_eq!((config.queued_jobs_per_account(), config.event_streams_per_account()), (40, 7));
        let options = crate::service::ServiceOptions::from_config(&config);
        assert_eq!((options.max_queued_per_account, options.max_streams_per_account), (40, 7));
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
        assert_eq!(config.runtime().unwrap().secret_plugins.len(), 3, "the two, and the bundled partner plugin");
        let old_style = Config { secret_plugins: vec!["partner".into()], ..Config::default() };
        let err = old_style.runtime().unwrap_err().to_string();
        assert!(err.contains("secret_plugins") && err.contains("`partner` looks like a plugin name") && err.contains("blake3:"), "{err}");
        // Not settable from a file: only the binary names itself.
        assert!(toml::from_str::<Config>("compiler_exe = '/bin/sh'").is_err());
    }

    #[test]
    fn partner_settings_become_the_partner_plugins_grant() {
        let mut table = toml::Table::new();
        let vars = [
            ("KILN_PARTNER_BASE_URL", "http://127.0.0.1:9999/"),
            ("KILN_PARTNER_API_KEY", "pk"),
            ("KILN_PARTNER_TOKENS", "t1, t2"),
            ("KILN_PARTNER_DOWNLOAD_HOSTS", "cdn.example.com,10.0.0.5:8080"),
        ];
        apply_env(&mut table, vars.iter().map(|(k, v)| (k.to_string(), v.to_string()))).unwrap();
        let config = Config::deserialize(toml::Value::Table(table)).unwrap();
        assert_eq!(config.partner_tokens, ["t1", "t2"]);
        let grants = config.runtime().unwrap().net_grants;
        let partner = grants.iter().find(|g| g.plugin == PluginGrant::Bundled("partner".into())).unwrap();
        let hosts: Vec<String> = partner.outbound_hosts.iter().map(|h| h.to_string()).collect();
        assert_eq!(hosts, ["cdn.example.com", "10.0.0.5:8080", "127.0.0.1:9999"]);
        assert!(partner.routes);
        assert!(partner.env.contains(&("KILN_PARTNER_BASE_URL".into(), "http://127.0.0.1:9999".into())));
        assert!(partner.env.contains(&("KILN_PARTNER_API_KEY".into(), "pk".into())));
        assert_eq!(base_url_host("https://api.freepik.com").unwrap().to_string(), "api.freepik.com:443");
        for bad in ["ftp://x", "x.com", "http://x.com/?a=1"] {
            assert!(base_url_host(bad).is_err(), "{bad}");
        }
        let unset = Config::default().runtime().unwrap().net_grants;
        let partner = unset.iter().find(|g| g.plugin == PluginGrant::Bundled("partner".into())).unwrap();
        assert!(partner.outbound_hosts.is_empty(), "no base URL: no host");
    }

    #[test]
    fn plugin_network_grants_name_plugins_by_directory_or_hash() {
        let dir = tempfile::tempdir().unwrap();
        let text = format!(
            "[[plugin_network]]\nplugin = \"{}\"\noutbound_hosts = [\"api.example.com\", \"10.0.0.7:8080\"]\nroutes = true\nenv = {{ K = \"v\" }}\n",
            dir.path().display()
        );
        let config: Config = toml::from_str(&text).unwrap();
        let grants = config.runtime().unwrap().net_grants;
        let grant = grants.iter().find(|g| matches!(g.plugin, PluginGrant::Dir(_))).unwrap();
        assert_eq!(grant.outbound_hosts.iter().map(|h| h.to_string()).collect::<Vec<_>>(), ["api.example.com", "10.0.0.7:8080"]);
        assert!(grant.routes);
        assert_eq!(grant.env, [("K".to_string(), "v".to_string())]);
        let by_name: Config = toml::from_str("[[plugin_network]]\nplugin = \"myplugin\"\n").unwrap();
        assert!(by_name.runtime().is_err(), "a bare name is refused");
        let bad_host: Config =
            toml::from_str(&format!("[[plugin_network]]\nplugin = \"{}\"\noutbound_hosts = [\"http://x\"]\n", dir.path().display())).unwrap();
        assert!(bad_host.runtime().unwrap_err().to_string().contains("plugin_network.outbound_hosts"));
        assert!(toml::from_str::<Config>("[[plugin_network]]\nplugin = \"/x\"\nsurprise = 1\n").is_err());
    }

    #[test]
    fn rejects_unknown_fields_and_bad_env() {
        assert!(toml::from_str::<Config>("surprise = 1").is_err());
        let mut table = toml::Table::new();
        assert!(apply_env(&mut table, [("KILN_NODE_LOG_KB".to_string(), "lots".to_string())].into_iter()).is_err());
    }
}
