//! The one typed configuration of kiln.
//!
//! Sources, later ones winning: built-in defaults, a TOML file (`--config`),
//! `KILN_*` environment variables, command-line flags. Every field documents
//! its default and what it trades off.
//!
//! It is plain data: the settings as the operator writes them, and a few
//! values derived from them alone. The limits and settings other modules
//! run with are built from it where they are used
//! ([`RuntimeConfig::from_config`](crate::plugins::RuntimeConfig::from_config),
//! [`WorkflowLimits::from_config`](crate::workflow::WorkflowLimits::from_config),
//! [`JobLimits::from_config`](crate::budget::JobLimits::from_config),
//! [`ServiceOptions::from_config`](crate::service::ServiceOptions::from_config)).
//!
//! - this file: the [`Config`] struct and the plain types of its fields;
//! - `defaults`: the built-in default of every setting;
//! - `load`: reading the TOML file and the `KILN_*` variables.

mod defaults;
mod load;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use load::ConfigError;

use crate::gpu::GpuMode;

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
    /// `job_out_of_memory` naming this limit. Default 4096.
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
    /// Readiness (`GET /api/v2/ready`) answers 503 while the filesystem of
    /// `data_dir` has less free space than this, MiB, so a load balancer
    /// stops sending work before writes fail (then 507 `storage_full`).
    /// Default 256; 0 turns the check off. `KILN_READY_MIN_FREE_MB`.
    pub ready_min_free_mb: u64,
    /// What an acknowledged write to the embedded store survives:
    /// `power_loss` (the default: `fdatasync` before a job, asset, claim
    /// or account change is acknowledged, concurrent ones sharing a flush)
    /// or `os_crash` (the pages are written out without a device cache
    /// flush: kill -9 loses nothing, a kernel crash can lose the last
    /// 200 ms of uploads, cancellations and account changes, a power cut on a disk with a
    /// volatile write cache anything recent). `KILN_DURABILITY`.
    pub durability: crate::store::Durability,
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
    /// Largest plugin an operator installs through the admin API (its
    /// manifest and component). Default 64 MiB.
    pub max_plugin_mb: u64,
    /// Largest bundle, decompressed: what `kiln run`, `kiln inspect` and a
    /// deployment created from a bundle (`POST /admin/deployments`) read.
    /// Default 256 MiB.
    pub max_bundle_mb: u64,
    /// With accounts: the plugins one account may install for itself
    /// (`/api/v2/plugins`); 0 turns account plugins off. Default 10.
    pub max_plugins_per_account: usize,
    /// With accounts: the largest plugin an account installs. Default 32 MiB.
    pub max_account_plugin_mb: u64,
    /// With accounts: whether an account's plugin gets the GPU its manifest
    /// asks for (`capabilities.gpu`); otherwise it computes on the CPU.
    /// Default false.
    pub account_plugin_gpu: bool,
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
    /// Lifetime of a web sign-in session (`/login`; servers that ask for a
    /// key). Default 43200 s (12 hours). `KILN_SESSION_TTL_S`.
    pub session_ttl_s: u64,
    /// Silence after which an event stream sends a keepalive comment.
    /// Default 15 s (clients give up after 45 s).
    pub sse_keepalive_s: u64,
    /// Build absolute URLs from `X-Forwarded-Proto`/`X-Forwarded-Host`
    /// (only behind a trusted proxy). Default false.
    pub trust_forwarded_headers: bool,
    /// The host whose subdomains are deployments: a request to
    /// `{deployment id}.{serverless_host}` reaches that deployment's Jobs
    /// API at `/api/v2` (as `/deployment/{id}/api/v2` does), its links
    /// without a prefix. The `Host` header decides (`X-Forwarded-Host` with
    /// `trust_forwarded_headers`). `KILN_SERVERLESS_HOST`. Default: none.
    pub serverless_host: Option<String>,
    /// Where jobs, assets, claims, accounts and sign-in sessions live:
    /// `embedded` (the default: sled under the data directory) or
    /// `postgres` (the database `database_url` names, which several hosts
    /// may share as one service; blobs stay under the data directory
    /// unless `blob_store = "s3"`). `KILN_STORE`.
    pub store: StoreKind,
    /// The PostgreSQL database of `store = "postgres"` (`postgres://…`).
    /// `KILN_DATABASE_URL`.
    pub database_url: Option<String>,
    /// Most connections this host opens to that database (idle ones close
    /// after a minute). `KILN_DATABASE_MAX_CONNECTIONS`. Default: 16.
    pub database_max_connections: u32,
    /// Where asset bytes live: `fs` (the default: files under the data
    /// directory) or `s3` (the bucket `s3_bucket`, shared by the hosts
    /// that name it; read through a local cache). `KILN_BLOB_STORE`.
    pub blob_store: BlobStoreKind,
    /// The S3-compatible service's URL (`http://127.0.0.1:8333`); none:
    /// AWS S3 in `s3_region`. Credentials: the standard `AWS_ACCESS_KEY_ID`,
    /// `AWS_SECRET_ACCESS_KEY` (and `AWS_SESSION_TOKEN`, or the instance's
    /// role). `KILN_S3_ENDPOINT`.
    pub s3_endpoint: Option<String>,
    /// The bucket of `blob_store = "s3"`, created when missing.
    /// `KILN_S3_BUCKET`.
    pub s3_bucket: Option<String>,
    /// The bucket's region. `KILN_S3_REGION`. Default `us-east-1`.
    pub s3_region: String,
    /// Most MiB of blobs the local cache of `blob_store = "s3"` keeps under
    /// the data directory (least recently used go first).
    /// `KILN_BLOB_CACHE_MB`. Default 10240.
    pub blob_cache_mb: u64,
    /// This host's name among the hosts sharing a `postgres` store (logs,
    /// `kiln doctor`; each start adds a nonce of its own). A start ends the
    /// earlier starts of its id and takes their jobs at once, so two
    /// running processes must never share one. `KILN_HOST_ID`. Default: a
    /// random id per start (a restart then takes its jobs back once their
    /// lease, `lease_s`, lapses).
    pub host_id: Option<String>,
    /// How long a host's hold on its jobs lasts without a renewal: a host
    /// that dies loses its jobs to the others this long after its last
    /// heartbeat, and a host that cannot renew for this long stops.
    /// `KILN_LEASE_S`. Default 30.
    pub lease_s: u64,
    /// How often a host renews its lease, takes over lapsed hosts' jobs
    /// and looks for cancel requests it missed (at most half of
    /// `lease_s`). `KILN_HEARTBEAT_S`. Default 10.
    pub heartbeat_s: u64,
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

    // --- Deployment kinds, accounts, credits ---
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

    // --- Tiers of per-account limits, job logs ---
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

    // --- Plugin network capabilities and the bundled partner proxy ---
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

    // --- Logs (see `logging`) ---
    /// `"text"` (the default): one human-readable line per event; `"json"`:
    /// one JSON object per line, the event's fields at its top level and
    /// the spans it happened in (a run's `job_id` and `owner`, a node's
    /// `node_id` and `class_type`) under `span` and `spans`.
    /// `KILN_LOG_FORMAT`. (`KILN_LOG` picks what is logged.)
    pub log_format: crate::logging::LogFormat,

    // --- GPU compute (see `gpu`) ---
    /// `"auto"` (the default): use a GPU adapter when there is one — host
    /// kernels run on it when it is a real GPU and the tensor is large
    /// enough, or when their input is already on the device; `"off"`: never;
    /// `"required"`: fail start-up without an adapter (Mesa's software
    /// Vulkan counts) and run every host kernel that has a GPU version on it.
    /// `KILN_GPU`.
    pub gpu: GpuMode,
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
    /// Most idle device memory kept for reuse (freed tensors' buffers, by
    /// size class), MiB. Default 1024.
    pub gpu_pool_mb: u64,
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

/// Where the service keeps its records (`store`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StoreKind {
    /// sled under the data directory.
    #[default]
    Embedded,
    /// PostgreSQL at `database_url`.
    Postgres,
}

/// Where asset bytes live (`blob_store`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BlobStoreKind {
    /// Files under the data directory.
    #[default]
    Fs,
    /// An S3-compatible bucket.
    S3,
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

impl Config {
    /// The compiled-component cache directory in effect.
    pub fn artifact_dir(&self) -> Option<PathBuf> {
        self.cache_dir.clone().or_else(|| {
            std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
                .map(|d| d.join("kiln"))
        })
    }

    /// This host's id among the hosts sharing the store: `host_id`, or a
    /// random one.
    pub fn host_id(&self) -> String {
        self.host_id.clone().unwrap_or_else(|| format!("kiln-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]))
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

    /// `store = "postgres"` needs a `postgres://` `database_url`;
    /// `blob_store = "s3"` a valid `s3_bucket`.
    pub fn check_store(&self) -> Result<(), String> {
        match (self.store, self.database_url.as_deref()) {
            (StoreKind::Embedded, _) => Ok::<(), String>(()),
            (StoreKind::Postgres, Some(url)) if url.starts_with("postgres://") || url.starts_with("postgresql://") => Ok(()),
            (StoreKind::Postgres, Some(_)) => Err("database_url must be a postgres:// URL".into()),
            (StoreKind::Postgres, None) => Err("store = \"postgres\" needs database_url (KILN_DATABASE_URL)".into()),
        }?;
        if self.database_max_connections < 2 {
            // One of them listens for the other hosts' notices for good.
            return Err("database_max_connections must be at least 2".into());
        }
        if let Some(id) = self.host_id.as_deref()
            && (id.is_empty() || id.len() > 64 || !id.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)))
        {
            return Err(format!("host_id `{id}` must be 1 to 64 letters, digits, `-`, `_` or `.`"));
        }
        if self.heartbeat_s == 0 || self.lease_s < 2 * self.heartbeat_s {
            return Err(format!("heartbeat_s ({}) must be at least 1 and at most half of lease_s ({})", self.heartbeat_s, self.lease_s));
        }
        if self.blob_store == BlobStoreKind::S3 {
            match self.s3_bucket.as_deref() {
                None | Some("") => return Err("blob_store = \"s3\" needs s3_bucket (KILN_S3_BUCKET)".into()),
                Some(b) if !valid_bucket_name(b) => {
                    return Err(format!("s3_bucket `{b}` is not a bucket name (3 to 63 lowercase letters, digits, `-` and `.`)"));
                }
                Some(_) => {}
            }
            if let Some(e) = self.s3_endpoint.as_deref().filter(|e| !(e.starts_with("http://") || e.starts_with("https://"))) {
                return Err(format!("s3_endpoint `{e}` must be an http:// or https:// URL"));
            }
        }
        Ok(())
    }

    /// `serverless_host`, when set: a DNS name (letters, digits, `-`, `.`).
    pub fn check_serverless_host(&self) -> Result<(), String> {
        match &self.serverless_host {
            Some(h) if h.is_empty() || h.starts_with('.') || !h.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.') => {
                Err(format!("serverless_host {h:?} is not a host name"))
            }
            _ => Ok(()),
        }
    }

    /// `default_tier` must name a configured tier.
    pub fn check_tiers(&self) -> Result<(), String> {
        match &self.default_tier {
            Some(d) if !self.tiers.contains_key(d) => Err(format!("default_tier {d:?} is not one of the configured [tiers.NAME]")),
            _ => Ok(()),
        }
    }

    /// Largest request body a plugin route accepts, bytes.
    pub fn route_body_bytes(&self) -> usize {
        usize::try_from(self.route_max_body_mb.saturating_mul(1 << 20)).unwrap_or(usize::MAX)
    }
}

/// An S3 bucket name: 3 to 63 lowercase letters, digits, `-` and `.`,
/// starting and ending with a letter or digit.
fn valid_bucket_name(name: &str) -> bool {
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    (3..=63).contains(&name.len())
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        && edge(name.chars().next())
        && edge(name.chars().last())
}
