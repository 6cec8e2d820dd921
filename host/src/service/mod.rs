//! The job service: the business logic both API surfaces drive.
//!
//! It owns the lifecycle of jobs (submit → queue → run → terminal →
//! expired), idempotency claims, asset records and the live event channels.
//! The metadata store is the source of truth; [`LiveJob`]s are the in-memory
//! view of jobs that have not finished, and their events are a live view of
//! the records. API layers only translate requests and responses.

mod assets;
pub mod bus;
pub mod compat;
pub mod deployments;
mod error;
pub mod fair;
pub mod job_files;
mod live;
mod mask;
pub mod memory_gate;
mod preview;
mod retention;
pub mod streams;
pub mod submit;
pub mod user_files;
mod worker;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use tokio::sync::{Notify, broadcast};
use tokio_util::sync::CancellationToken;

pub use assets::{AssetLabels, NewAsset, UploadMeta};
pub use error::ServiceError;
pub use live::{ExtraData, JobEvent, LiveJob};
pub use streams::{StreamGuard, StreamKind};

use crate::config::Config;
use crate::executor::Executor;
use crate::plugins::NodeRegistry;
use crate::store::{BlobStore, DiskBlobs, IdempotencyClaim, JobInput, JobRecord, JobStatus, MetaStore, Micros, SledMeta, now_micros};

/// Idempotency keys are single-use for this long.
pub const IDEMPOTENCY_TTL: Duration = Duration::from_secs(24 * 3600);

/// Finished records with a longer log are served from the store, not kept
/// in memory (a log may be up to 1 MiB; the cache holds 4096 records).
pub const MAX_CACHED_LOG_BYTES: usize = 64 << 10;

/// The service's limits and policies (from [`Config`]).
#[derive(Debug, Clone)]
pub struct ServiceOptions {
    pub max_queued_jobs: usize,
    pub max_running_jobs: usize,
    pub retention: Duration,
    pub sweep_interval: Duration,
    pub max_upload_bytes: u64,
    pub max_event_streams: usize,
    /// With accounts: the most jobs one scheduling key may have waiting,
    /// whatever its tier (config `max_queued_jobs_per_account`).
    pub max_queued_per_account: usize,
    /// With accounts: the most streams one owner may hold open (config
    /// `max_event_streams_per_account`).
    pub max_streams_per_account: usize,
    pub owner: String,
    /// Bounds on a submitted workflow.
    pub workflow_limits: crate::workflow::WorkflowLimits,
    /// What each job may consume while it runs.
    pub job_limits: crate::budget::JobLimits,
    /// Whether `GET /jobs/{id}` shows the job's captured log. The spec gives
    /// `logs` to serverless jobs only: on in serverless mode; other modes
    /// capture and store them all the same and leave them out of reads
    /// (except a deployment's jobs: [`Service::shows_logs`]).
    pub logs_on_read: bool,
    /// The deployment kind: with accounts, each job's owner is
    /// an account, charged when its job ends; the result cache is per owner.
    pub mode: crate::config::Mode,
    /// What a job costs its account.
    pub pricing: crate::accounts::Pricing,
    /// Named tiers and the default tier (see `fair`).
    pub tiers: fair::Tiers,
    /// The tail of a job's stdout + stderr kept as its log, bytes.
    pub job_log_bytes: usize,
    /// Memory submissions being parsed and uploads being decoded may hold
    /// at once, bytes (`intake_memory_mb`).
    pub intake_memory_bytes: u64,
    /// Memory queued jobs may hold as parsed workflows, bytes (`queued_parsed_mb`).
    pub queued_parsed_bytes: u64,
}

impl ServiceOptions {
    /// The limits of a key with no tier of its own: the default tier, else
    /// the global ones.
    pub fn global_limits(&self) -> fair::OwnerLimits {
        self.tiers.resolve(None, fair::OwnerLimits { max_running: self.max_running_jobs, max_queued: self.max_queued_jobs })
    }

    pub fn from_config(config: &Config) -> ServiceOptions {
        ServiceOptions {
            max_queued_jobs: config.max_queued_jobs,
            max_running_jobs: config.max_running_jobs.max(1),
            retention: Duration::from_secs(config.job_retention_s.max(1)),
            sweep_interval: Duration::from_secs(config.sweep_interval_s.max(1)),
            max_upload_bytes: config.max_upload_mb.saturating_mul(1 << 20),
            max_event_streams: config.max_event_streams,
            max_queued_per_account: config.queued_jobs_per_account(),
            max_streams_per_account: config.event_streams_per_account(),
            owner: "local".into(),
            workflow_limits: crate::workflow::WorkflowLimits::from_config(config),
            job_limits: crate::budget::JobLimits::from_config(config),
            logs_on_read: config.mode == crate::config::Mode::Serverless,
            mode: config.mode,
            pricing: crate::accounts::Pricing { credits_per_second: config.credits_per_second, min_per_job: config.credits_min_per_job },
            tiers: fair::Tiers::from_config(config),
            job_log_bytes: (config.job_log_kb as usize).saturating_mul(1024),
            intake_memory_bytes: config.intake_memory_mb.saturating_mul(1 << 20),
            queued_parsed_bytes: config.queued_parsed_mb.saturating_mul(1 << 20),
        }
    }
}

/// 429 `queue_full` for a key (or the server) with these limits: retry
/// after about the time a queue this deep takes to drain, 1 to 60 s.
fn queue_full(limits: fair::OwnerLimits) -> ServiceError {
    let per_job = (limits.max_queued / limits.max_running.max(1)).max(1);
    ServiceError::QueueFull { retry_after_s: (per_job as u64 / 100).clamp(1, 60) }
}

/// What admitting a submission of this shape may hold at once: its parsed
/// tree, the validated graph's copies of its constants (at most as much
/// again), the body and its encoding for the store.
pub fn intake_estimate(cost: crate::workflow::JsonCost) -> u64 {
    cost.tree_bytes().saturating_mul(2).saturating_add(cost.bytes.saturating_mul(2))
}

/// A job submission, already parsed from the wire.
pub struct Submission {
    /// The API-format graph, verbatim (asset references unresolved).
    pub workflow: serde_json::Value,
    pub extra: ExtraData,
    pub idempotency_key: Option<String>,
    pub metadata: Option<serde_json::Map<String, serde_json::Value>>,
    pub owner: String,
    /// `v2` or `compat`.
    pub surface: &'static str,
    /// The job id the client chose (ComfyUI's `prompt_id`, a canonical
    /// UUID checked at the edge); `None`: a fresh one.
    pub id: Option<String>,
    /// Queue it ahead of every queued job (ComfyUI's `front`).
    pub front: bool,
    /// ComfyUI's queue fields (compatibility submissions).
    pub compat: Option<crate::store::CompatFields>,
    /// The serverless deployment it was submitted to, if any.
    pub deployment: Option<String>,
}

/// Filters of a job listing.
#[derive(Default)]
pub struct ListQuery {
    pub cursor: Option<Vec<u8>>,
    pub limit: usize,
    pub statuses: Vec<JobStatus>,
    pub metadata: Vec<(String, String)>,
}

/// An open event stream: the snapshot to send first, then live events.
pub struct EventStream {
    pub snapshot: JobRecord,
    pub queue_position: Option<usize>,
    pub progress: Option<crate::store::ProgressSnapshot>,
    pub preview: Option<JobEvent>,
    /// `None` when the job had already finished.
    pub events: Option<broadcast::Receiver<JobEvent>>,
    /// Holds the stream's slot; its `closed` signal ends the stream.
    pub guard: StreamGuard,
}

/// The job service.
pub struct Service {
    opts: ServiceOptions,
    meta: Arc<dyn MetaStore>,
    blobs: Arc<dyn BlobStore>,
    executor: Arc<Executor>,
    registry: Arc<NodeRegistry>,
    live: RwLock<HashMap<String, Arc<LiveJob>>>,
    /// Queued jobs per scheduling key, served round-robin (see `fair`).
    queue: Mutex<fair::FairQueue>,
    /// The limits of each scheduling key (tiers; see [`Service::set_tenant_limits`]).
    limits: RwLock<Arc<dyn fair::TenantLimits>>,
    queued: AtomicUsize,
    queue_notify: Notify,
    seq: AtomicU64,
    /// Open SSE streams and WebSockets, per owner (see `streams`).
    streams: Arc<streams::StreamSlots>,
    shutdown: CancellationToken,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// Bumped by every submission and stream; the idle trimmer compares it.
    activity: AtomicU64,
    /// Recently finished or read finished jobs (their records change only
    /// at expiry); records with long logs are not kept (see
    /// [`MAX_CACHED_LOG_BYTES`]).
    finished: Mutex<lru::LruCache<String, Arc<JobRecord>>>,
    /// Bumped by every [`Service::forget_finished`]: a record read from the
    /// store before a forget may be stale and is not cached.
    finished_gen: AtomicU64,
    /// Held shared while a blob is written and claimed (recorded as an
    /// asset, or listed among a live job's pending outputs), exclusively by
    /// garbage collection while it checks and deletes one.
    blob_gate: Arc<RwLock<()>>,
    /// Jobs execute on threads of their own, so nodes that compute (even
    /// ones that only yield at epoch ticks) never starve the HTTP reactor:
    /// one per running job, each its own single-threaded runtime, so
    /// waking a worker wakes no other thread (a multi-threaded runtime woke
    /// a sibling to look for work it never had).
    workers: Mutex<Vec<std::thread::JoinHandle<()>>>,
    /// Where a job's parallel branches run, on every core (a chain runs on
    /// its worker's thread).
    branches: Mutex<Option<tokio::runtime::Runtime>>,
    /// Execution messages of every job and queue changes (the ComfyUI
    /// WebSocket's source).
    bus: Arc<bus::ExecBus>,
    /// The compatibility API's own state (its queue counter, the index of
    /// ComfyUI-style uploads).
    compat: compat::CompatState,
    /// The accounts jobs belong to (cloud, serverless; empty self-hosted).
    accounts: Arc<crate::accounts::Accounts>,
    /// Serverless deployments and their loaded plugins.
    deployments: deployments::Deployments,
    /// Memory of submissions being parsed and uploads being decoded.
    intake: memory_gate::MemoryGate,
    /// Memory of queued jobs' parsed workflows and plans.
    queued_parsed: memory_gate::MemoryGate,
}

impl Drop for Service {
    fn drop(&mut self) {
        if let Some(rt) = self.branches.get_mut().take() {
            rt.shutdown_background();
        }
    }
}

impl Service {
    /// Opens the stores under `data_dir`, recovers jobs interrupted by a crash
    /// or restart, and starts the workers and the retention sweeper.
    pub async fn start(opts: ServiceOptions, data_dir: &Path, registry: Arc<NodeRegistry>, executor: Arc<Executor>) -> Result<Arc<Service>, ServiceError> {
        std::fs::create_dir_all(data_dir).map_err(crate::store::StoreError::from)?;
        let sled = SledMeta::open(&data_dir.join("meta"))?;
        let hasher = crate::accounts::KeyHasher::load_or_create(data_dir).map_err(crate::store::StoreError::from)?;
        let accounts =
            crate::accounts::Accounts::open(sled.open_tree("accounts")?, hasher, opts.pricing).map_err(|e| crate::store::StoreError::Backend(e.to_string()))?;
        let meta: Arc<dyn MetaStore> = Arc::new(sled);
        let blobs: Arc<dyn BlobStore> = Arc::new(DiskBlobs::open(data_dir.join("blobs"))?);
        let deployments = deployments::Deployments::open(Some(data_dir.join("deployments.json"))).map_err(|e| ServiceError::InvalidRequest(e.to_string()))?;
        Service::start_with_accounts(opts, (meta, blobs), Arc::new(accounts), deployments, registry, executor)
    }

    /// [`Service::start`] on given stores (another backend, or a test
    /// double), with an empty account store kept in memory.
    pub fn start_with_stores(
        opts: ServiceOptions,
        meta: Arc<dyn MetaStore>,
        blobs: Arc<dyn BlobStore>,
        registry: Arc<NodeRegistry>,
        executor: Arc<Executor>,
    ) -> Result<Arc<Service>, ServiceError> {
        let accounts = crate::accounts::Accounts::in_memory(opts.pricing).map_err(|e| crate::store::StoreError::Backend(e.to_string()))?;
        let deployments = deployments::Deployments::open(None).map_err(|e| ServiceError::InvalidRequest(e.to_string()))?;
        Service::start_with_accounts(opts, (meta, blobs), Arc::new(accounts), deployments, registry, executor)
    }

    /// [`Service::start_with_stores`] with a given account store.
    pub fn start_with_accounts(
        opts: ServiceOptions,
        (meta, blobs): (Arc<dyn MetaStore>, Arc<dyn BlobStore>),
        accounts: Arc<crate::accounts::Accounts>,
        deployments: deployments::Deployments,
        registry: Arc<NodeRegistry>,
        executor: Arc<Executor>,
    ) -> Result<Arc<Service>, ServiceError> {
        let branches = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(std::thread::available_parallelism().map_or(2, |n| n.get()))
            .thread_name("kiln-branch")
            .enable_all()
            .build()
            .map_err(crate::store::StoreError::from)?;
        // A key's limits: its account's tier (or the default tier).
        let limits: Arc<dyn fair::TenantLimits> = {
            let (accounts, tiers, global) = (accounts.clone(), opts.tiers.clone(), opts.global_limits());
            Arc::new(move |key: &str| tiers.resolve(accounts.tier(key).as_deref(), global))
        };
        let (opts_intake, opts_queued) = (opts.intake_memory_bytes, opts.queued_parsed_bytes);
        let streams = Arc::new(streams::StreamSlots::new(opts.max_event_streams, opts.mode.has_accounts().then_some(opts.max_streams_per_account)));
        let service = Arc::new(Service {
            opts,
            meta,
            blobs,
            executor,
            registry,
            live: RwLock::new(HashMap::new()),
            queue: Mutex::new(fair::FairQueue::default()),
            limits: RwLock::new(limits),
            queued: AtomicUsize::new(0),
            queue_notify: Notify::new(),
            seq: AtomicU64::new(1),
            streams,
            shutdown: CancellationToken::new(),
            tasks: Mutex::new(Vec::new()),
            workers: Mutex::new(Vec::new()),
            branches: Mutex::new(Some(branches)),
            blob_gate: Arc::default(),
            activity: AtomicU64::new(0),
            finished: Mutex::new(lru::LruCache::new(std::num::NonZeroUsize::new(4096).unwrap_or(std::num::NonZeroUsize::MIN))),
            finished_gen: AtomicU64::new(0),
            bus: Arc::default(),
            compat: compat::CompatState::default(),
            accounts,
            deployments,
            intake: memory_gate::MemoryGate::new(opts_intake, "intake_memory_mb"),
            queued_parsed: memory_gate::MemoryGate::new(opts_queued, "queued_parsed_mb"),
        });
        service.recover()?;
        for (id, generation) in service.deployments.starting() {
            service.load_deployment(&id, generation);
        }
        service.cancel_orphaned_deployment_jobs();
        let mut workers = Vec::new();
        for i in 0..service.opts.max_running_jobs {
            let worker = service.clone();
            let thread = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .and_then(|runtime| std::thread::Builder::new().name(format!("kiln-exec-{i}")).spawn(move || runtime.block_on(worker.worker_loop())));
            match thread {
                Ok(thread) => workers.push(thread),
                Err(e) => {
                    // The workers already started stop (they hold the service).
                    service.shutdown.cancel();
                    return Err(crate::store::StoreError::from(e).into());
                }
            }
        }
        *service.workers.lock() = workers;
        *service.tasks.lock() = vec![tokio::spawn(service.clone().sweeper_loop())];
        Ok(service)
    }

    /// Stops taking work: running jobs are interrupted and left `running` in
    /// the store, so the next start runs them again (see `recover`).
    pub async fn shutdown(&self) {
        self.shutdown.cancel();
        let tasks = std::mem::take(&mut *self.tasks.lock());
        for t in tasks {
            let _ = t.await;
        }
        // Each worker returns at its job's next yield (within an epoch tick).
        let workers = std::mem::take(&mut *self.workers.lock());
        let _ = tokio::task::spawn_blocking(move || workers.into_iter().for_each(|w| drop(w.join()))).await;
        if let Some(rt) = self.branches.lock().take() {
            rt.shutdown_background();
        }
        let _ = self.meta.flush();
    }

    /// Whether [`Service::submit`] may now wait for a flush of the whole
    /// store instead of one log sync (see `MetaStore::writes_may_block`).
    pub fn submit_may_block(&self) -> bool {
        self.meta.writes_may_block()
    }

    pub fn options(&self) -> &ServiceOptions {
        &self.opts
    }

    /// Replaces how a scheduling key's limits are found (accounts feed
    /// their tier here: `|key| tiers.resolve(tier_of(key), global)`).
    pub fn set_tenant_limits(&self, limits: Arc<dyn fair::TenantLimits>) {
        *self.limits.write() = limits;
    }

    /// The limits of scheduling key `key`: a deployment's own (none of its
    /// jobs starts until it is ready), else the tenant lookup's.
    ///
    /// With accounts, no key may keep more than `max_queued_per_account`
    /// jobs waiting whatever its tier: the server-wide `max_queued_jobs` is
    /// shared, and one account filling it would lock every other out.
    pub fn limits_for(&self, key: &str) -> fair::OwnerLimits {
        let mut limits = match key.strip_prefix("deployment/") {
            Some(id) => self.deployments.limits(id, self.opts.global_limits()),
            None => self.limits.read().limits(key),
        };
        if self.opts.mode.has_accounts() {
            limits.max_queued = limits.max_queued.min(self.opts.max_queued_per_account);
        }
        limits
    }

    /// Whether a read of this job shows its `logs` (the spec: jobs run on
    /// the serverless platform — a serverless server's, or a deployment's —
    /// except on a public demo, which stores the log and withholds it).
    pub fn shows_logs(&self, job: &JobRecord) -> bool {
        (self.opts.logs_on_read || job.deployment.is_some()) && !job.logs_withheld
    }

    /// The account a job's execution is billed to: a public demo job's
    /// deployment owner, else the job's owner.
    pub fn billed_account(&self, job: &JobRecord) -> String {
        self.billed_owner(&job.owner, job.deployment.as_deref())
    }

    /// [`Service::billed_account`] of a job of `owner` on `deployment`.
    fn billed_owner(&self, owner: &str, deployment: Option<&str>) -> String {
        match deployment.and_then(|d| self.deployments.get(d)) {
            Some(d) if owner == deployments::demo_owner(&d.spec.id) => d.spec.owner,
            _ => owner.to_string(),
        }
    }

    /// The node classes and executor of a job: its deployment's (`None`
    /// when that deployment no longer serves), else the server's.
    pub(crate) fn engine(&self, deployment: Option<&str>) -> Option<(Arc<NodeRegistry>, Arc<Executor>)> {
        match deployment {
            None => Some((self.registry.clone(), self.executor.clone())),
            Some(id) => self.deployments.loaded(id).map(|l| (l.registry.clone(), l.executor.clone())),
        }
    }

    pub fn registry(&self) -> &Arc<NodeRegistry> {
        &self.registry
    }

    /// The plugin runtime (plugin routes, see `api::proxy`).
    pub fn plugin_runtime(&self) -> &Arc<crate::plugins::PluginRuntime> {
        self.executor.runtime()
    }

    pub fn blobs(&self) -> &Arc<dyn BlobStore> {
        &self.blobs
    }

    /// The account store (cloud and serverless callers).
    pub fn accounts(&self) -> &Arc<crate::accounts::Accounts> {
        &self.accounts
    }

    /// The tier of the account `owner` (`None`: no such account, e.g. the
    /// one owner of a self-hosted server).
    pub fn account_tier(&self, owner: &str) -> Option<String> {
        self.accounts.tier(owner)
    }

    /// Whether `owner` may start paid work (a positive balance; always for
    /// an owner that is no account). For the partner node: an account
    /// without funds → `InsufficientFundsError`.
    pub fn account_has_funds(&self, owner: &str) -> bool {
        self.accounts.has_funds(owner)
    }

    /// The execution-message bus (every job's messages, queue changes).
    pub fn bus(&self) -> &bus::ExecBus {
        &self.bus
    }

    /// The node each running job of `owner` started last, by job id.
    pub fn running_nodes(&self, owner: &str) -> Vec<(String, String)> {
        let live: Vec<Arc<LiveJob>> = self.live.read().values().cloned().collect();
        live.iter()
            .filter_map(|job| {
                let rec = job.record.lock();
                let node = rec.progress.as_ref().and_then(|p| p.current_node.clone());
                (rec.owner == owner && rec.status == JobStatus::Running).then_some(node).flatten().map(|n| (rec.id.clone(), n))
            })
            .collect()
    }

    /// Tells `owner`'s listeners how many of its jobs remain (queued or
    /// running): each account hears only its own count.
    fn publish_queue(&self, owner: &str) {
        if self.bus.watched() {
            let remaining = self.live.read().values().filter(|j| &*j.owner == owner).count();
            self.bus.queue(Arc::from(owner), remaining);
        }
    }

    fn live_job(&self, id: &str) -> Option<Arc<LiveJob>> {
        self.live.read().get(id).cloned()
    }

    /// Where `owner`'s Idempotency-Key `key` is claimed: each account has
    /// its own keys (one account's key never blocks, or reveals, another's).
    /// The one owner of a self-hosted server keeps the bare key (claims
    /// stored by earlier versions stay valid). Header values hold no `\n`.
    fn claim_key(&self, owner: &str, key: &str) -> String {
        if owner == self.opts.owner { key.to_string() } else { format!("{owner}\n{key}") }
    }

    /// Refuses an Idempotency-Key of `owner` that a live claim holds.
    pub fn check_key(&self, owner: &str, key: &str) -> Result<(), ServiceError> {
        match self.meta.get_claim(&self.claim_key(owner, key))? {
            Some(claim) if claim.expires_at > now_micros() => Err(ServiceError::IdempotencyKeyReuse),
            _ => Ok(()),
        }
    }

    /// Admits a submission's body to be parsed: checks its size and its
    /// count of JSON values (`max_workflow_kb`, `max_workflow_values`) on
    /// the bytes, then waits until the memory its parsing may take fits in
    /// the intake budget (`intake_memory_mb`). Parse and submit while the
    /// permit is held.
    pub async fn admit_body(&self, body: &[u8]) -> Result<memory_gate::GatePermit, ServiceError> {
        let cost = self.opts.workflow_limits.check_text(body).map_err(|e| ServiceError::InvalidWorkflow { message: e.to_string(), details: None })?;
        self.intake.enter(intake_estimate(cost)).await.map_err(|e| ServiceError::PayloadTooLarge { limit_bytes: e.total })
    }

    /// Bytes queued jobs hold now as parsed workflows and plans (estimated;
    /// at most `queued_parsed_mb`).
    pub fn queued_parsed_held(&self) -> u64 {
        self.queued_parsed.total() - self.queued_parsed.available()
    }

    /// The budget for decodes of uploads (shared with submissions).
    pub fn intake_gate(&self) -> &memory_gate::MemoryGate {
        &self.intake
    }

    /// Validates and records a job; it is durable and queued when this returns.
    pub fn submit(&self, mut sub: Submission) -> Result<(JobRecord, Option<usize>), ServiceError> {
        let now = now_micros();
        // A key that is already claimed is refused before anything else is
        // looked at (the claim itself happens atomically with the record).
        if let Some(key) = &sub.idempotency_key {
            self.check_key(&sub.owner, key)?;
        }
        if let Some(map) = sub.workflow.as_object()
            && crate::workflow::is_ui_format(map)
        {
            return Err(ServiceError::WorkflowFormatUi);
        }
        let registry = match &sub.deployment {
            None => self.registry.clone(),
            Some(id) => self.deployment_serving(id)?.registry.clone(),
        };
        let resolved = submit::resolve_assets(std::mem::take(&mut sub.workflow), self.meta.as_ref(), &sub.owner, now)?;
        let inputs = job_files::JobInputs::new(&resolved.inputs, self.blobs.clone());
        let (_, plan) = submit::check(&resolved.workflow, &registry, &inputs, &self.opts.workflow_limits)?;
        self.enqueue(sub, resolved.workflow, resolved.inputs, plan)
    }

    /// Records a validated job (`workflow` resolved, `plan` its plan); it
    /// is durable and queued when this returns.
    fn enqueue(
        &self,
        sub: Submission,
        workflow: serde_json::Value,
        inputs: Vec<JobInput>,
        plan: crate::workflow::Plan,
    ) -> Result<(JobRecord, Option<usize>), ServiceError> {
        let now = now_micros();
        self.activity.fetch_add(1, Ordering::Relaxed);
        // An account without credits submits nothing (no claim is made, so
        // its Idempotency-Key stays free).
        if !self.accounts.has_funds(&self.billed_owner(&sub.owner, sub.deployment.as_deref())) {
            return Err(ServiceError::InsufficientCredits);
        }
        // Reserve a queue slot; a full queue releases everything (no claim).
        let key = fair::sched_key(&sub.owner, sub.deployment.as_deref());
        let limits = self.limits_for(&key);
        if self.queued.fetch_add(1, Ordering::SeqCst) >= self.opts.max_queued_jobs {
            self.queued.fetch_sub(1, Ordering::SeqCst);
            return Err(queue_full(fair::OwnerLimits { max_running: self.opts.max_running_jobs, max_queued: self.opts.max_queued_jobs }));
        }
        let id = match &sub.id {
            None => uuid::Uuid::now_v7().to_string(),
            Some(chosen) => match self.key_for_chosen_id(&sub.owner, chosen) {
                Ok(key) => key,
                Err(e) => {
                    self.queued.fetch_sub(1, Ordering::SeqCst);
                    return Err(e);
                }
            },
        };
        let record = JobRecord {
            id: id.clone(),
            owner: sub.owner.clone(),
            status: JobStatus::Queued,
            created_at: now,
            started_at: None,
            completed_at: None,
            updated_at: now,
            expires_at: now + self.opts.retention.as_micros() as Micros,
            seq: self.seq.fetch_add(1, Ordering::SeqCst),
            attempts: 0,
            inputs,
            outputs: Vec::new(),
            error: None,
            progress: None,
            logs: None,
            queue_ms: None,
            execution_ms: None,
            metadata: sub.metadata,
            surface: sub.surface.to_string(),
            logs_withheld: sub.deployment.as_deref().and_then(|d| self.deployments.get(d)).is_some_and(|d| d.spec.public_demo),
            deployment: sub.deployment.clone(),
            had_extra_data: !sub.extra.secrets.is_empty(),
            compat: sub.compat,
        };
        let claim = sub.idempotency_key.as_ref().map(|key| IdempotencyClaim {
            key: self.claim_key(&sub.owner, key),
            owner: sub.owner.clone(),
            job_id: Some(id.clone()),
            claimed_at: now,
            expires_at: now + IDEMPOTENCY_TTL.as_micros() as Micros,
        });
        // The job is queued and a worker woken before the submission is
        // written: waking a thread takes longer than the writes (about
        // 60 vs 35 µs here), so the worker usually starts as soon as they
        // are done. It cannot start earlier: the writes happen under the
        // job record's lock, which the worker takes first — also what puts
        // the submission before the job's start in the commit log. No one
        // else can see the job yet (its id is unknown until the 201; the
        // store does not list it).
        let live = Arc::new(LiveJob::new(record.clone(), sub.extra));
        let (written, position) = {
            let mut locked = live.record.lock();
            {
                let mut jobs = self.live.write();
                if jobs.contains_key(&id) {
                    drop(jobs);
                    self.queued.fetch_sub(1, Ordering::SeqCst);
                    return Err(ServiceError::InvalidRequest(format!("a job with id {} already exists", crate::store::public_job_id(&id))));
                }
                jobs.insert(id.clone(), live.clone());
            }
            // An account disabled meanwhile queues nothing, nor is billed
            // for a demo job (checked after the job joined the live set: a
            // disable either sees it there and cancels it, or is seen here).
            if self.accounts.is_disabled(&sub.owner) || self.accounts.is_disabled(&self.billed_owner(&sub.owner, sub.deployment.as_deref())) {
                self.live.write().remove(&id);
                self.queued.fetch_sub(1, Ordering::SeqCst);
                return Err(ServiceError::AccountDisabled);
            }
            let pushed = self.queue.lock().push(&key, &sub.owner, id.clone(), sub.front, limits.max_queued);
            let Ok(position) = pushed else {
                self.live.write().remove(&id);
                self.queued.fetch_sub(1, Ordering::SeqCst);
                return Err(queue_full(limits));
            };
            self.queue_notify.notify_one();
            // Before the worker can start it (it waits for this lock), so
            // the queue change precedes the job's own messages.
            self.publish_queue(&sub.owner);
            let written = self.meta.submit(&locked, &workflow, claim.as_ref());
            match &written {
                // Committed (durable or not): the job exists, so it runs.
                // Kept parsed for the worker while the queued jobs' share
                // allows; otherwise dropped here and parsed again at start.
                // The plan holds at most the tree's constants; the text is
                // what nodes read as `prompt`.
                Ok(()) | Err(crate::store::StoreError::NotDurable(_)) => {
                    let held = crate::workflow::cost::of_value(&workflow).tree_bytes();
                    if let Some(permit) = self.queued_parsed.try_enter(held) {
                        let text = std::sync::Arc::from(workflow.to_string());
                        *live.prepared.lock() = Some(live::Prepared { text, plan, _held: permit });
                    }
                }
                // Not written: a worker that took it finds it no longer queued.
                Err(_) => locked.status = JobStatus::Canceled,
            }
            (written, position)
        };
        match written {
            Ok(()) => {}
            // The caller hears 500 (outcome unknown); the key stays claimed.
            Err(e @ crate::store::StoreError::NotDurable(_)) => {
                tracing::warn!(job_id = %id, error = %e, "job queued, but its submission may not be durable");
                return Err(e.into());
            }
            Err(e) => {
                self.withdraw(&id);
                return Err(match e {
                    crate::store::StoreError::KeyClaimed => ServiceError::IdempotencyKeyReuse,
                    e => e.into(),
                });
            }
        }
        tracing::debug!(job_id = %id, "job queued");
        // A worker may run the job while the submission is made durable.
        // Nothing it does can be seen as done before that: its terminal
        // record is logged after the submission and synced with everything
        // before it, and a crash before this sync loses the submission and
        // everything after it together (the caller, who got no 201, submits
        // again). The 201 waits for the sync.
        match self.meta.sync_jobs() {
            Ok(()) => Ok((record, Some(position))),
            Err(e) => Err(crate::store::StoreError::NotDurable(e.to_string()).into()),
        }
    }

    /// The store key of a new job of `owner` with the client-chosen id
    /// `chosen`: the id itself, or, when another owner's job holds it, the
    /// owner-scoped key (`store::scoped_job_key`), so the answer is the one
    /// an unused id gets. The owner's own job under either is a reuse (400;
    /// checked again, atomically, when the job joins the live set).
    fn key_for_chosen_id(&self, owner: &str, chosen: &str) -> Result<String, ServiceError> {
        let exists = || ServiceError::InvalidRequest(format!("a job with id {chosen} already exists"));
        let scoped = crate::store::scoped_job_key(owner, chosen);
        match self.owner_at(chosen)? {
            Some(holder) if holder == owner => Err(exists()),
            _ if self.owner_at(&scoped)?.is_some() => Err(exists()),
            Some(_) => Ok(scoped),
            None => Ok(chosen.to_string()),
        }
    }

    /// The owner of the job stored under `key`, if any.
    fn owner_at(&self, key: &str) -> Result<Option<String>, ServiceError> {
        if let Some(live) = self.live_job(key) {
            return Ok(Some(live.owner.to_string()));
        }
        Ok(self.meta.get_job(key)?.map(|r| r.owner))
    }

    /// The store key of the job `owner` knows as `id` (see
    /// `store::scoped_job_key`); `id` itself when it names none of theirs.
    pub(crate) fn job_key(&self, owner: &str, id: &str) -> String {
        self.get_shared(owner, id).map_or_else(|_| id.to_string(), |(r, _)| r.id.clone())
    }

    /// Takes back a job whose submission was not written (already marked
    /// so that a worker that took it meanwhile skips it).
    fn withdraw(&self, id: &str) {
        let removed = self.queue.lock().remove(id);
        if removed {
            self.queued.fetch_sub(1, Ordering::SeqCst);
        }
        let removed = self.live.write().remove(id);
        if let Some(job) = removed {
            self.publish_queue(&job.owner);
        }
    }

    /// 1-based position of a queued job among its owner's queued jobs (see
    /// [`fair::FairQueue::position`]).
    pub fn queue_position(&self, id: &str) -> Option<usize> {
        self.queue.lock().position(id)
    }

    /// The current record of a job the caller owns.
    pub fn get(&self, owner: &str, id: &str) -> Result<(JobRecord, Option<usize>), ServiceError> {
        self.get_shared(owner, id).map(|(r, p)| ((*r).clone(), p))
    }

    /// [`Service::get`] without copying: finished records are served from an
    /// in-memory cache (they only change again at expiry).
    /// `id` is the id the owner knows: a job stored under its owner-scoped
    /// key (another owner's job held the id) is found by it too.
    pub fn get_shared(&self, owner: &str, id: &str) -> Result<(Arc<JobRecord>, Option<usize>), ServiceError> {
        let record = match self.record_at(id)? {
            Some(r) if r.owner == owner => r,
            _ => match self.record_at(&crate::store::scoped_job_key(owner, id))? {
                Some(r) if r.owner == owner => r,
                _ => return Err(ServiceError::NotFound),
            },
        };
        let position = if record.status == JobStatus::Queued { self.queue_position(&record.id) } else { None };
        Ok((record, position))
    }

    /// The record stored under the key `id` (live, cached or stored),
    /// whoever owns it.
    fn record_at(&self, id: &str) -> Result<Option<Arc<JobRecord>>, ServiceError> {
        let record = match self.live_job(id) {
            Some(live) => Arc::new(live.snapshot()),
            None => {
                let cached = self.finished.lock().get(id).cloned();
                match cached {
                    Some(r) => r,
                    None => {
                        let generation = self.finished_gen.load(Ordering::SeqCst);
                        let Some(r) = self.meta.get_job(id)? else { return Ok(None) };
                        let r = Arc::new(r);
                        if r.status.is_terminal() && self.live_job(id).is_none() {
                            self.remember_finished(r.clone(), Some(generation));
                        }
                        r
                    }
                }
            }
        };
        Ok(Some(record))
    }

    /// Drops a record from the finished-jobs cache (after a store write).
    fn forget_finished(&self, id: &str) {
        let mut cache = self.finished.lock();
        cache.pop(id);
        self.finished_gen.fetch_add(1, Ordering::SeqCst);
    }

    /// Caches a finished record, unless its log is long or (`read_at`: the
    /// generation before it was read from the store) a forget happened since.
    fn remember_finished(&self, record: Arc<JobRecord>, read_at: Option<u64>) {
        if record.logs.as_ref().is_some_and(|l| l.text.len() > MAX_CACHED_LOG_BYTES) {
            return;
        }
        let mut cache = self.finished.lock();
        if read_at.is_none_or(|g| g == self.finished_gen.load(Ordering::SeqCst)) {
            cache.put(record.id.clone(), record);
        }
    }

    /// The executed (resolved) workflow of a job.
    pub fn workflow(&self, owner: &str, id: &str) -> Result<serde_json::Value, ServiceError> {
        let (record, _) = self.get_shared(owner, id)?;
        self.meta.get_workflow(&record.id)?.ok_or(ServiceError::NotFound)
    }

    /// Cancels a job: a queued one at once, a running one by interrupting its
    /// node (`canceling` until it has stopped); a finished one is unchanged.
    pub fn cancel(&self, owner: &str, id: &str) -> Result<(JobRecord, Option<usize>), ServiceError> {
        let key = self.job_key(owner, id);
        let id = key.as_str();
        let Some(live) = self.live_job(id) else { return self.get(owner, id) };
        let current = live.snapshot();
        if current.owner != owner {
            return Err(ServiceError::NotFound);
        }
        match current.status {
            JobStatus::Queued => self.stop_queued(&live, JobStatus::Canceled).map(|r| (r, None)),
            JobStatus::Running => {
                // (A job already finishing ends as it ran: the cancel changes nothing.)
                let rec = live.update(self.meta.as_ref(), |rec| {
                    let running = rec.status == JobStatus::Running;
                    if running {
                        rec.status = JobStatus::Canceling;
                        rec.updated_at = now_micros();
                    }
                    running
                })?;
                if rec.status != JobStatus::Canceling {
                    return Ok((rec, None));
                }
                self.meta.flush()?;
                live.publish_status();
                live.cancel.cancel();
                Ok((rec, None))
            }
            _ => Ok((current, None)),
        }
    }

    /// Ends a job that has not started with `status` (canceled or expired).
    /// A worker that took it meanwhile sees the status and skips it.
    fn stop_queued(&self, live: &Arc<LiveJob>, status: JobStatus) -> Result<JobRecord, ServiceError> {
        let id = live.record.lock().id.clone();
        let removed = self.queue.lock().remove(&id);
        if removed {
            self.queued.fetch_sub(1, Ordering::SeqCst);
        }
        let mut stopped = false;
        let rec = live.update(self.meta.as_ref(), |rec| {
            if rec.status == JobStatus::Queued {
                let now = now_micros();
                rec.status = status;
                rec.completed_at = Some(now);
                rec.updated_at = now;
                // Its time in the queue is known now; it never executed.
                rec.queue_ms = Some((now - rec.created_at) / 1000);
                stopped = true;
            }
            stopped
        })?;
        if !stopped {
            // A worker started it first: cancel it as a running job.
            return if status == JobStatus::Canceled { self.cancel(&rec.owner, &id).map(|(r, _)| r) } else { Ok(rec) };
        }
        self.meta.flush()?;
        live.publish_status();
        self.live.write().remove(&id);
        self.publish_queue_positions();
        self.publish_queue(&rec.owner);
        Ok(rec)
    }

    /// Jobs newest first.
    pub fn list(&self, owner: &str, q: &ListQuery) -> Result<(Vec<JobRecord>, Option<Vec<u8>>), ServiceError> {
        let keep = |job: &JobRecord| {
            job.owner == owner
                && (q.statuses.is_empty() || q.statuses.contains(&self.live_job(&job.id).map_or(job.status, |l| l.record.lock().status)))
                && q.metadata.iter().all(|(k, v)| job.metadata.as_ref().and_then(|m| m.get(k)).and_then(|x| x.as_str()) == Some(v.as_str()))
        };
        let page = self.meta.list_jobs(Some(owner), q.cursor.as_deref(), q.limit, &keep)?;
        let jobs = page.jobs.into_iter().map(|j| self.live_job(&j.id).map_or(j, |l| l.snapshot())).collect();
        Ok((jobs, page.next))
    }

    /// Opens an event stream on a job (bounded by `max_event_streams`, and
    /// per account by `max_event_streams_per_account`).
    pub fn open_stream(&self, owner: &str, id: &str) -> Result<EventStream, ServiceError> {
        let guard = self.streams.open(owner, StreamKind::Events)?;
        let key = self.job_key(owner, id);
        let id = key.as_str();
        self.activity.fetch_add(1, Ordering::Relaxed);
        if let Some(live) = self.live_job(id) {
            // Subscribe before the snapshot so nothing falls between them.
            let events = live.events.subscribe();
            let snapshot = live.snapshot();
            if snapshot.owner != owner {
                return Err(ServiceError::NotFound);
            }
            let queue_position = if snapshot.status == JobStatus::Queued { self.queue_position(id) } else { None };
            let progress = if snapshot.status == JobStatus::Running { snapshot.progress.clone() } else { None };
            let preview = live.last_preview.lock().clone();
            return Ok(EventStream { snapshot, queue_position, progress, preview, events: Some(events), guard });
        }
        let (snapshot, _) = self.get(owner, id)?;
        Ok(EventStream { snapshot, queue_position: None, progress: None, preview: None, events: None, guard })
    }

    /// Notes that a request arrived (the idle memory trimmer waits for a
    /// quiet interval).
    pub fn touch(&self) {
        self.activity.fetch_add(1, Ordering::Relaxed);
    }

    /// Takes a stream slot for a compatibility WebSocket of `owner` (the
    /// same bounds as event streams); the connection ends when its guard's
    /// `closed` signal fires.
    pub fn open_socket(&self, owner: &str) -> Result<StreamGuard, ServiceError> {
        self.activity.fetch_add(1, Ordering::Relaxed);
        self.streams.open(owner, StreamKind::Socket)
    }

    /// Open SSE event streams (WebSockets, which stay open while idle, are
    /// not counted here).
    pub fn open_streams(&self) -> usize {
        self.streams.open_events()
    }

    /// Open streams (SSE and WebSockets) of `owner`.
    pub fn open_streams_of(&self, owner: &str) -> usize {
        self.streams.open_of(owner)
    }

    /// Ends what a disabled account still has going: its open SSE streams
    /// and WebSockets close at once, its queued jobs are canceled (never
    /// started, never charged) and its running ones are canceled as a
    /// client's cancel would (charged for what they ran). Returns the
    /// number of jobs canceled.
    pub fn end_account_work(&self, owner: &str) -> usize {
        let streams = self.streams.close_owner(owner);
        // Its own jobs, and the demo jobs its public deployments bill to it.
        let jobs: Vec<Arc<LiveJob>> = self.live.read().values().cloned().collect();
        let jobs = jobs.into_iter().filter(|j| &*j.owner == owner || self.billed_account(&j.snapshot()) == owner);
        let mut canceled = 0;
        for job in jobs {
            let id = job.record.lock().id.clone();
            match self.cancel(&job.owner, &id) {
                Ok(_) => canceled += 1,
                Err(e) => tracing::error!(job_id = %id, error = %e, "cannot cancel a job of a disabled account"),
            }
        }
        tracing::info!(account = owner, streams, jobs = canceled, "disabled account's streams closed and jobs canceled");
        canceled
    }

    /// Tells streams of queued jobs their new positions. (Locks are released
    /// before publishing, which takes each job's record lock.)
    fn publish_queue_positions(&self) {
        let watched: Vec<Arc<LiveJob>> = {
            let live = self.live.read();
            let queue = self.queue.lock().ordered();
            queue.iter().filter_map(|id| live.get(id)).filter(|job| job.events.receiver_count() > 0).cloned().collect()
        };
        for job in watched {
            job.publish_status();
        }
    }
}
