//! The job service: the business logic both API surfaces drive.
//!
//! It owns the lifecycle of jobs (submit → queue → run → terminal →
//! expired), idempotency claims, asset records and the live event channels.
//! The metadata store is the source of truth; [`LiveJob`]s are the in-memory
//! view of jobs that have not finished, and their events are a live view of
//! the records. API layers only translate requests and responses.

mod assets;
mod backends;
mod blob_gc;
pub mod bus;
pub mod cluster;
pub mod compat;
pub mod deployments;
mod error;
pub mod fair;
mod finished;
mod follow;
pub mod intake;
pub mod job_files;
mod jobs;
mod live;
mod mask;
pub mod memory_gate;
pub mod metrics;
mod numbers;
mod options;
mod preview;
pub mod queue;
mod queue_counts;
mod readiness;
pub mod reencode;
mod retention;
mod runner;
pub mod streams;
mod threads;
pub mod user_files;
mod work_sharing;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use parking_lot::RwLock;
use tokio_util::sync::CancellationToken;

pub use assets::{AssetLabels, MAX_ASSET_TAGS, NewAsset, UploadMeta};
pub use backends::{Backends, s3_settings};
pub use cluster::ClusterBackends;
pub use error::ServiceError;
pub use intake::{Admitted, IDEMPOTENCY_TTL, OutputPolicy, Submission, SubmitError, Surface, intake_estimate};
pub use jobs::ListQuery;
pub use live::StartGate;
pub use live::{ExtraData, JobEvent, LiveJob};
pub use options::ServiceOptions;
pub use readiness::Readiness;
pub use streams::{EventStream, StreamGuard, StreamKind};

use crate::executor::Executor;
use crate::plugins::NodeRegistry;
use crate::store::{BlobStore, JobRecord, JobStatus, MetaStore};

/// The most records one filtered listing reads: a filter that few jobs
/// match returns a short page (with a cursor to go on from) rather than
/// reading an owner's whole history in one request.
pub const LIST_SCAN_BUDGET: usize = 10_000;

/// The job service.
pub struct Service {
    opts: ServiceOptions,
    meta: Arc<dyn MetaStore>,
    blobs: Arc<dyn BlobStore>,
    executor: Arc<Executor>,
    /// The node classes new work uses (installs swap them, see
    /// `plugins::live`).
    plugins: crate::plugins::LivePlugins,
    /// Jobs not yet finished, and those waiting (see `queue`).
    queue: queue::JobQueue,
    /// The limits of each scheduling key (tiers; see [`Service::set_tenant_limits`]).
    limits: RwLock<Arc<dyn fair::TenantLimits>>,
    /// Open SSE streams and WebSockets, per owner (see `streams`).
    streams: Arc<streams::StreamSlots>,
    shutdown: CancellationToken,
    /// The workers' threads, the branch runtime, the sweeper (see `threads`).
    threads: threads::Threads,
    /// Bumped by every submission and stream; the idle trimmer compares it.
    activity: AtomicU64,
    /// Recently finished or read finished jobs (see `finished`).
    finished: finished::FinishedJobs,
    /// The blob gate and the blobs the next collection pass checks (see
    /// `blob_gc`).
    blob_claims: Arc<blob_gc::BlobClaims>,
    /// Execution messages of every job and queue changes (the ComfyUI
    /// WebSocket's source).
    bus: Arc<dyn bus::ExecBus>,
    /// The compatibility API's own state (the index of ComfyUI-style
    /// uploads, history windows).
    compat: compat::CompatState,
    /// Submission numbers and ComfyUI priority counters (see `numbers`).
    numbers: numbers::Numbers,
    /// The accounts jobs belong to (cloud, serverless; empty self-hosted).
    accounts: Arc<crate::accounts::Accounts>,
    /// Web sign-in sessions (any mode that asks for a key).
    sessions: crate::accounts::sessions::Sessions,
    /// Serverless deployments and their loaded plugins.
    deployments: deployments::Deployments,
    /// Where the web frontend's user files are kept (the API layer applies
    /// `user_files`' rules over it per user).
    user_files: Arc<dyn crate::store::UserFileStore>,
    /// The secret download URLs are signed with (see `Backends`).
    signing_key: [u8; 32],
    /// Memory of submissions being parsed and uploads being decoded.
    intake: memory_gate::MemoryGate,
    /// Memory of queued jobs' parsed workflows and plans.
    queued_parsed: memory_gate::MemoryGate,
    /// Turns of the admissions a shared store checks (see `intake::enqueue`).
    admission_turns: intake::AdmissionTurns,
    /// This host's lease and notices, where hosts share the store (see
    /// `cluster`); `None` on an embedded store.
    cluster: Option<ClusterBackends>,
    /// Cancelled when this host lost its lease (see `cluster`).
    lease_lost: CancellationToken,
    /// The queue counts the WebSockets show, where hosts share the store
    /// (see `queue_counts`).
    queue_counts: Option<queue_counts::QueueCounts>,
    /// Which workers are busy, for taking other hosts' queued jobs (see
    /// `work_sharing`).
    sharing: work_sharing::WorkSharing,
    /// The last readiness check of the store (see `readiness`).
    ready_probe: readiness::Probe,
    /// What `GET /metrics` shows (see `metrics`).
    metrics: Arc<metrics::Metrics>,
}

impl Service {
    /// Opens the embedded backends under `data_dir` (acknowledged writes
    /// survive a power cut) and starts on them (see [`Service::start_on`]).
    pub async fn start(
        opts: ServiceOptions,
        data_dir: &Path,
        plugins: impl Into<crate::plugins::LivePlugins>,
        executor: Arc<Executor>,
    ) -> Result<Arc<Service>, ServiceError> {
        Service::start_on(opts, Backends::embedded(data_dir, crate::store::Durability::PowerLoss)?, plugins, executor).await
    }

    /// Recovers the jobs a crash or restart interrupted, loads the
    /// deployments, and starts the workers and the retention sweeper.
    pub async fn start_on(
        opts: ServiceOptions,
        backends: Backends,
        plugins: impl Into<crate::plugins::LivePlugins>,
        executor: Arc<Executor>,
    ) -> Result<Arc<Service>, ServiceError> {
        let Backends { meta, blobs, accounts, key_hasher, signing_key, sessions, deployments, user_files, waiting, bus, cluster } = backends;
        let mut plugins: crate::plugins::LivePlugins = plugins.into();
        if let Some(cluster) = &cluster {
            plugins.share(cluster.plugins.clone());
        }
        let sessions = crate::accounts::sessions::Sessions::new(sessions, opts.session_ttl_s);
        let accounts =
            Arc::new(crate::accounts::Accounts::open(accounts, key_hasher, opts.pricing).await.map_err(|e| crate::store::StoreError::Backend(e.to_string()))?);
        let deployments = deployments::Deployments::open(deployments).await?;
        let deployments = if cluster.is_some() { deployments.shared() } else { deployments };
        let threads = threads::Threads::new().map_err(crate::store::StoreError::from)?;
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
            plugins,
            queue: queue::JobQueue::new(waiting),
            limits: RwLock::new(limits),
            streams,
            shutdown: CancellationToken::new(),
            threads,
            blob_claims: Arc::default(),
            activity: AtomicU64::new(0),
            finished: Default::default(),
            bus,
            compat: compat::CompatState::default(),
            numbers: numbers::Numbers::new(cluster.as_ref().map(|c| c.numbers.clone())),
            accounts,
            sessions,
            deployments,
            user_files,
            signing_key,
            intake: memory_gate::MemoryGate::new(opts_intake, "intake_memory_mb"),
            queued_parsed: memory_gate::MemoryGate::new(opts_queued, "queued_parsed_mb"),
            admission_turns: Default::default(),
            queue_counts: cluster.is_some().then(Default::default),
            cluster,
            lease_lost: CancellationToken::new(),
            sharing: Default::default(),
            ready_probe: Default::default(),
            metrics: Arc::new(metrics::Metrics::new()),
        });
        let renewal = service.join_cluster().await?;
        let recovered = async {
            // The plugins every host has, before this host validates or
            // takes any job.
            service.plugins.follow_shared(None).await?;
            service.recover().await?;
            service.load_uploads().await
        };
        if let Err(e) = recovered.await {
            // Ends the lease's renewal (the other hosts take what it took).
            service.shutdown.cancel();
            return Err(e);
        }
        for (id, generation) in service.deployments.starting() {
            service.load_deployment(&id, generation);
        }
        service.cancel_orphaned_deployment_jobs().await;
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
        let tasks = [
            tokio::spawn(service.clone().sweeper_loop()),
            tokio::spawn(service.clone().cluster_loop()),
            tokio::spawn(service.clone().follow_accounts()),
            tokio::spawn(service.clone().follow_deployments()),
            tokio::spawn(service.clone().follow_plugins()),
            tokio::spawn(service.clone().count_queues()),
            tokio::spawn(service.clone().metrics_upkeep()),
        ];
        service.threads.keep(workers, tasks.into_iter().chain(renewal).collect());
        Ok(service)
    }

    /// Tells the workers and the periodic work to end, without waiting for
    /// them (what dropping a [`crate::server::Server`] does; see [`Service::shutdown`]).
    pub fn stop(&self) {
        self.shutdown.cancel();
    }

    /// Stops taking work: running jobs are interrupted and left `running` in
    /// the store, so the next start runs them again (see `recover`).
    pub async fn shutdown(&self) {
        self.shutdown.cancel();
        self.threads.join().await;
        let _ = self.meta.flush().await;
        // Its jobs are left as they stood: the other hosts take them now.
        if let Some(cluster) = &self.cluster
            && !self.lease_lost.is_cancelled()
            && let Err(e) = cluster.leases.release().await
        {
            tracing::warn!(error = %e, "cannot end this host's lease: the other hosts take its jobs when it lapses");
        }
        self.meta.close().await;
    }

    /// Whether [`Service::submit`] may now wait for a flush of the whole
    /// store instead of one log sync (see `MetaStore::writes_may_block`).
    pub fn submit_may_block(&self) -> bool {
        self.meta.writes_may_block()
    }

    /// The secret the APIs sign download URLs with (one per installation).
    pub fn signing_key(&self) -> [u8; 32] {
        self.signing_key
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

    /// The running limit of scheduling key `key` that holds across the
    /// hosts sharing the store, checked as a job starts
    /// (`MetaStore::start_admitted`): with accounts, a limit the operator
    /// gave the key — its account's tier (or the default tier), its
    /// deployment's own (or the default tier). `None` (each host's queue
    /// alone applies it) on an embedded store, without accounts, or for the
    /// global limit (no default tier), which is a host's number of workers.
    fn shared_running_limit(&self, key: &str) -> Option<usize> {
        if self.cluster.is_none() || !self.opts.mode.has_accounts() {
            return None;
        }
        // A deployment without limits of its own has the default tier's.
        let configured = match key.strip_prefix("deployment/") {
            Some(id) => self.deployments.has_own_limits(id) || self.opts.tiers.default.is_some(),
            None => self.opts.tiers.configured(self.accounts.tier(key).as_deref()).is_some(),
        };
        configured.then(|| self.limits_for(key).max_running)
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

    /// The account a job of `owner` on `deployment` is billed to, when
    /// that is an account (`None`: nothing is billed).
    pub(crate) fn billing(&self, owner: &str, deployment: Option<&str>) -> Option<Arc<str>> {
        self.accounts.get(&self.billed_owner(owner, deployment)).map(|a| Arc::from(a.id.as_str()))
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
    pub(crate) fn engine(&self, owner: &str, deployment: Option<&str>) -> Option<(Arc<NodeRegistry>, Arc<Executor>)> {
        match deployment {
            None => Some((self.plugins.registry_for(owner), self.executor.clone())),
            Some(id) => self.deployments.loaded(id).map(|l| (l.registry.clone(), l.executor.clone())),
        }
    }

    /// The node classes new work uses now: the host's plugins.
    pub fn registry(&self) -> Arc<NodeRegistry> {
        self.plugins.current()
    }

    /// The node classes `owner`'s new work uses: the host's plugins and,
    /// with accounts, its own.
    pub fn registry_for(&self, owner: &str) -> Arc<NodeRegistry> {
        self.plugins.registry_for(owner)
    }

    /// The plugins served, and installs (admin API).
    pub fn plugins(&self) -> &crate::plugins::LivePlugins {
        &self.plugins
    }

    /// The plugin runtime (plugin routes, see `api::proxy`).
    pub fn plugin_runtime(&self) -> &Arc<crate::plugins::PluginRuntime> {
        self.executor.runtime()
    }

    pub fn blobs(&self) -> &Arc<dyn BlobStore> {
        &self.blobs
    }

    /// The store of the web frontend's user files.
    pub fn user_file_store(&self) -> &Arc<dyn crate::store::UserFileStore> {
        &self.user_files
    }

    /// The accounts (cloud and serverless callers).
    pub fn accounts(&self) -> &Arc<crate::accounts::Accounts> {
        &self.accounts
    }

    /// The web sign-in sessions.
    pub fn sessions(&self) -> &crate::accounts::sessions::Sessions {
        &self.sessions
    }

    /// The tier of the account `owner` (`None`: no such account, e.g. the
    /// one owner of a self-hosted server).
    pub fn account_tier(&self, owner: &str) -> Option<String> {
        self.accounts.tier(owner)
    }

    /// Every account as operators are shown it, by name: where hosts share
    /// the store, as stored now (this host's copy of a balance can lag a
    /// charge made on another host); otherwise this host's copy, which is
    /// the store's.
    pub async fn accounts_shown(&self) -> Result<Vec<Arc<crate::accounts::Account>>, crate::accounts::AccountError> {
        match self.cluster {
            Some(_) => Ok(self.accounts.list_stored().await?.into_iter().map(Arc::new).collect()),
            None => Ok(self.accounts.list()),
        }
    }

    /// The account named `name` as operators are shown it (see
    /// [`Service::accounts_shown`]).
    pub async fn account_shown(&self, name: &str) -> Result<Arc<crate::accounts::Account>, crate::accounts::AccountError> {
        match self.cluster {
            Some(_) => Ok(Arc::new(self.accounts.by_name_stored(name).await?)),
            None => self.accounts.by_name(name).ok_or_else(|| crate::accounts::AccountError::NotFound(name.to_string())),
        }
    }

    /// Whether `owner` may start paid work (a positive balance; always for
    /// an owner that is no account). For the partner node: an account
    /// without funds → `InsufficientFundsError`.
    pub fn account_has_funds(&self, owner: &str) -> bool {
        self.accounts.has_funds(owner)
    }

    /// The execution-message bus (every job's messages, queue changes).
    pub fn bus(&self) -> &dyn bus::ExecBus {
        self.bus.as_ref()
    }

    /// The node each running job of `owner` started last, by job id.
    pub fn running_nodes(&self, owner: &str) -> Vec<(String, String)> {
        self.queue
            .live_jobs()
            .iter()
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
        // Where hosts share the store, announced to them too, whoever watches here.
        let elsewhere = self.queue_counts.as_ref().map_or(0, |counts| counts.changed_here(owner));
        if self.bus.watched() {
            let remaining = self.queue.remaining_of(owner) + elsewhere;
            self.bus.queue(Arc::from(owner), remaining);
        }
    }

    /// Tells `owner`'s listeners here its queue count when a job of its
    /// started (as ComfyUI does; the count is unchanged, so the other hosts
    /// are not told).
    fn publish_queue_here(&self, owner: &str) {
        if self.bus.watched() {
            let elsewhere = self.queue_counts.as_ref().map_or(0, |counts| counts.shown_elsewhere(owner));
            self.bus.queue(Arc::from(owner), self.queue.remaining_of(owner) + elsewhere);
        }
    }

    fn live_job(&self, id: &str) -> Option<Arc<LiveJob>> {
        self.queue.live(id)
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

    /// Ends what a disabled account still has going: its open SSE streams
    /// and WebSockets close at once, its queued jobs are canceled (never
    /// started, never charged) and its running ones are canceled as a
    /// client's cancel would (charged for what they ran). Returns the
    /// number of jobs canceled.
    pub async fn end_account_work(&self, owner: &str) -> usize {
        let streams = self.streams.close_owner(owner);
        // Its own jobs, and the demo jobs its public deployments bill to it.
        let mut jobs: Vec<_> = self.queue.live_jobs().into_iter().filter(|j| &*j.owner == owner || self.billed_account(&j.snapshot()) == owner).collect();
        // Queued ones first: canceling a running job frees its slot, and a
        // queued job of the same account must not start in it meanwhile.
        jobs.sort_by_cached_key(|j| j.record.lock().status != JobStatus::Queued);
        let mut canceled = 0;
        for job in jobs {
            let id = job.record.lock().id.clone();
            match self.cancel(&job.owner, &id).await {
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
        let watched = self.queue.queued_where(|job| job.events.watched());
        for job in watched {
            job.publish_status();
        }
    }
}
