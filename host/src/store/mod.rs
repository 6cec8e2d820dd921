//! Durable state: job, asset and idempotency records ([`MetaStore`]), the
//! content-addressed blobs behind assets ([`BlobStore`]), accounts
//! ([`AccountStore`]), deployments ([`DeploymentStore`]) and the web
//! frontend's user files ([`UserFileStore`]).
//!
//! Each is a trait so a distributed backend can replace the embedded ones
//! ([`SledMeta`], [`DiskBlobs`], [`SledAccounts`], [`FileDeployments`],
//! [`DiskUserFiles`])
//! without touching the job service.

mod accounts;
mod blobs;
pub mod cluster;
mod commit_log;
#[cfg(test)]
pub(crate) mod contract;
#[cfg(test)]
pub(crate) mod contract_accounts;
#[cfg(test)]
pub(crate) mod contract_blobs;
mod deployments;
mod durability;
mod io_runtime;
pub mod postgres;
pub mod records;
pub mod s3;
mod sessions;
mod sled;
pub mod space;
mod status;
mod user_files;

pub use accounts::{AccountChange, AccountStore, CreditChange};
pub use blobs::{BlobUpload, DiskBlobs, StagedBlob};
pub use deployments::{DeploymentStore, FileDeployments};
pub use durability::Durability;
pub use records::*;
pub use sessions::{SessionRecord, SessionStore};
pub use sled::{ExportedJob, SledAccounts, SledMeta, SledSessions};
pub use status::IllegalTransition;
pub use user_files::{DiskUserFiles, Entry, FileInfo, MAX_DEPTH as MAX_USER_FILE_DEPTH, UserFileStore};

/// A storage failure.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("store i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("store backend: {0}")]
    Backend(String),
    /// A networked backend cannot be reached now (refused, lost, or
    /// restarting): the same call may succeed later.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    #[error("corrupt record under {0}")]
    Corrupt(String),
    #[error("the Idempotency-Key is already claimed")]
    KeyClaimed,
    #[error("upload exceeds {limit} bytes")]
    TooLarge { limit: u64 },
    /// The write is committed but could not be made durable: the outcome
    /// after a crash is unknown.
    #[error("committed but not flushed: {0}")]
    NotDurable(String),
    /// This host's lease on the job lapsed and another host holds it now:
    /// the write was refused (see [`cluster`]).
    #[error("another host holds this job now: {0}")]
    Fenced(String),
    /// A shared store refused a new job by the rules of its
    /// [`Admission`], or a job's start by its key's running limit
    /// ([`MetaStore::start_admitted`]): nothing was written.
    #[error("job not admitted: {0}")]
    Refused(Refusal),
}

/// Why a shared store refused a new job, or a job's start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("the billed account's balance does not cover the job beside its unfinished ones")]
    NoFunds,
    #[error("the billed account is disabled")]
    AccountDisabled,
    #[error("the job's scheduling key has as many jobs waiting as it may")]
    QueueFull,
    #[error("the service has as many jobs waiting as it may")]
    ServerQueueFull,
    #[error("the job's scheduling key runs as many jobs as it may")]
    RunningFull,
}

/// The rules a new job is admitted by across every host sharing a store,
/// checked in the transaction that writes it (see
/// [`MetaStore::submit_admitted`]).
#[derive(Debug, Clone, Copy)]
pub struct Admission<'a> {
    /// The account the job is billed to, which must exist, not be
    /// disabled, and hold a balance that covers the job beside its other
    /// unfinished jobs on every host (`None`: no account is billed).
    pub billed: Option<Billing<'a>>,
    /// The bound of the job's scheduling key (with accounts; `None`: none
    /// is checked here).
    pub key: Option<KeyBound<'a>>,
    /// The server's queue bound over all hosts.
    pub server: ServerBound,
}

/// The account a new job is billed to, and the prices its balance is held
/// against ([`crate::accounts::Pricing::admits`]).
#[derive(Debug, Clone, Copy)]
pub struct Billing<'a> {
    pub account: &'a str,
    pub pricing: crate::accounts::Pricing,
}

/// What a finished job's account pays ([`MetaStore::finish_job_charged`]).
#[derive(Debug, Clone, Copy)]
pub struct Charge<'a> {
    pub account: &'a str,
    pub amount: i64,
}

/// How [`MetaStore::finish_job_charged`] dealt with the charge.
#[derive(Debug)]
pub enum Charged {
    /// In the write that ended the job: the balance's change (`None`: the
    /// job had ended already, nothing charged).
    With(Option<CreditChange>),
    /// Not by this store: the caller charges through the account store.
    Apart,
}

/// How many jobs of one scheduling key may wait on all hosts.
#[derive(Debug, Clone, Copy)]
pub struct KeyBound<'a> {
    /// The job's scheduling key (`service::fair::sched_key`) …
    pub key: &'a str,
    /// … how many of its jobs may be waiting at once, on all hosts …
    pub max_queued: usize,
    /// … and the ids of those waiting on the admitting host besides the new
    /// one. The store counts the other hosts' waiting jobs and, of these,
    /// the ones already written: a job this host has started is no longer
    /// waiting, whatever its record says yet. Taken in the key's admission
    /// turn on this host, so no other admission of the key here runs
    /// between this list and the count. Exact: admissions of one key take
    /// turns on all hosts.
    pub waiting_here: &'a [String],
}

/// How many jobs may wait on all hosts together (`max_queued_jobs`). The
/// store counts the jobs waiting on the other hosts as committed; the
/// admitting host knows its own. Not exact: admissions on several hosts
/// at once may each see room for one more (the bound is exceeded by at
/// most the admissions in flight), since taking turns across every
/// submission of the service would make them wait on each other.
#[derive(Debug, Clone, Copy)]
pub struct ServerBound {
    pub max_queued: usize,
    /// Jobs waiting on the admitting host, the new one included.
    pub queued_here: usize,
}

/// Waits for a store call on a thread that may block: the blocking pool
/// (code that also writes or syncs files, and holds the blob gate across
/// the call), a job's execution thread. The embedded store answers at once;
/// a networked store's I/O is driven by the runtime it was opened on, never
/// by the waiting thread. Never call it on an async worker thread.
///
/// The call is polled outside tokio's cooperative budget: a job's execution
/// thread waits here from inside one poll of its runtime's task, so the
/// budget (128 polls of runtime resources per turn) would run out after as
/// many calls — a node saving 128 files — and a call polled past it waits
/// for a wake-up deferred until the task yields, which it never does while
/// it waits here.
pub fn wait<F: std::future::Future>(call: F) -> F::Output {
    may_block_here(|| pollster::block_on(tokio::task::unconstrained(call)))
}

thread_local! {
    static MAY_BLOCK: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` with this thread marked as one that may block (a blocking-pool
/// thread driving service work to its end): a backend's waits for the disk
/// run inline here rather than on yet another blocking thread.
pub fn may_block_here<T>(f: impl FnOnce() -> T) -> T {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            MAY_BLOCK.set(self.0);
        }
    }
    let _restore = Restore(MAY_BLOCK.replace(true));
    f()
}

/// Whether this thread is marked by [`may_block_here`].
pub fn may_block() -> bool {
    MAY_BLOCK.get()
}

/// A blob's name: `blake3:<64 lowercase hex>`.
pub fn blob_name(hash: &blake3::Hash) -> String {
    format!("blake3:{}", hash.to_hex())
}

/// Parses `blake3:<hex>` (hex in either case).
pub fn parse_blob_name(name: &str) -> Option<blake3::Hash> {
    let hex = name.strip_prefix("blake3:")?;
    blake3::Hash::from_hex(hex).ok()
}

/// Which jobs a listing keeps.
pub type JobFilter<'a> = dyn for<'r> Fn(&'r JobRecord) -> bool + Send + Sync + 'a;

/// A page of jobs, newest first.
pub struct JobPage {
    pub jobs: Vec<JobRecord>,
    /// Where the next page starts, if there is one.
    pub next: Option<Vec<u8>>,
}

/// Job, asset and idempotency records (the queue is the queued jobs).
#[async_trait::async_trait]
pub trait MetaStore: Send + Sync {
    /// Atomically: claims `claim` (if any; fails with [`StoreError::KeyClaimed`]
    /// when a live claim holds the key), records the job (queued: the queue
    /// is the queued jobs in `seq` order) and its workflow. Committed (visible, and ordered before
    /// every later write) when it returns; durable after
    /// [`MetaStore::sync_jobs`] or [`MetaStore::flush`]. A committed write
    /// whose durability is already known to be in doubt returns
    /// [`StoreError::NotDurable`].
    async fn submit(&self, job: &JobRecord, workflow: &serde_json::Value, claim: Option<&IdempotencyClaim>) -> Result<(), StoreError>;
    /// [`MetaStore::submit`], admitted by `admission` in the same atomic
    /// step ([`StoreError::Refused`]: nothing written). Where hosts share
    /// the store, the same step holds the job's input blobs while it is
    /// unfinished (see [`MetaStore::hold_blobs`]). A store that one
    /// process holds (the embedded one) leaves the rules to that process,
    /// which checks them in memory: the default only submits.
    async fn submit_admitted(
        &self,
        job: &JobRecord,
        workflow: &serde_json::Value,
        claim: Option<&IdempotencyClaim>,
        admission: Admission<'_>,
    ) -> Result<(), StoreError> {
        let _ = admission;
        self.submit(job, workflow, claim).await
    }
    /// Writes a job record (not flushed; see [`MetaStore::flush`]).
    async fn put_job(&self, job: &JobRecord) -> Result<(), StoreError>;
    /// Writes a job's start ([`MetaStore::put_job`] of its running record)
    /// if its scheduling key `key` runs fewer than `max_running` other jobs
    /// on all the hosts sharing the store, counting as running the key's
    /// older jobs refused so on other hosts (they start first), in one
    /// atomic step ([`Refusal::RunningFull`]: not started, and noted as
    /// waiting for a start). A store that one
    /// process holds leaves the limit to that process's queue: the default
    /// only writes.
    async fn start_admitted(&self, job: &JobRecord, key: &str, max_running: usize) -> Result<(), StoreError> {
        let _ = (key, max_running);
        self.put_job(job).await
    }
    async fn get_job(&self, id: &str) -> Result<Option<JobRecord>, StoreError>;
    /// The records of `ids` that exist, in the order of `ids` (a page of
    /// a listing read at once; a networked store answers in one round trip).
    async fn get_jobs(&self, ids: &[String]) -> Result<Vec<JobRecord>, StoreError> {
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            out.extend(self.get_job(id).await?);
        }
        Ok(out)
    }
    /// Up to `limit` of `owner`'s unfinished jobs (queued, running or
    /// canceling) that other hosts sharing the store hold, in `seq` order
    /// (a ComfyUI queue view spanning the hosts). None in a store one
    /// process holds (the default).
    async fn unfinished_elsewhere(&self, owner: &str, limit: usize) -> Result<Vec<JobRecord>, StoreError> {
        let _ = (owner, limit);
        Ok(Vec::new())
    }
    /// How many of `owner`'s unfinished jobs other hosts sharing the store
    /// hold (none in a store one process holds: the default).
    async fn unfinished_count_elsewhere(&self, owner: &str) -> Result<usize, StoreError> {
        let _ = owner;
        Ok(0)
    }
    /// Removes a job, its workflow and its index entry.
    async fn delete_job(&self, job: &JobRecord) -> Result<(), StoreError>;
    async fn get_workflow(&self, id: &str) -> Result<Option<serde_json::Value>, StoreError>;
    /// Jobs newest first (of `owner` only, when given: an index lookup,
    /// not a scan of everyone's), starting after `cursor`, keeping those
    /// `keep` accepts, reading at most `max_scanned` records: a page ends
    /// at `limit` jobs or at the budget, with `next` where it stopped
    /// either way (a page may be short, even empty, and still go on).
    /// Records come without their logs (no listing shows them;
    /// [`MetaStore::get_job`] has them).
    async fn list_jobs(
        &self,
        owner: Option<&str>,
        cursor: Option<&[u8]>,
        limit: usize,
        max_scanned: usize,
        keep: &JobFilter<'_>,
    ) -> Result<JobPage, StoreError>;
    /// A job's stored workflow as its JSON text (rendered into a listing
    /// without being parsed).
    async fn get_workflow_bytes(&self, id: &str) -> Result<Option<Vec<u8>>, StoreError>;
    /// The stored workflows of the first of `ids` (at least one when any
    /// are asked) whose sizes together stay within `budget` bytes (the last
    /// may pass it), in the order asked: a listing reads its items'
    /// workflows a few at a time (a networked store in one round trip),
    /// never holding much more than `budget`.
    async fn get_workflows_bytes(&self, ids: &[String], budget: usize) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        let mut out = Vec::new();
        let mut held = 0;
        for id in ids {
            if !out.is_empty() && held >= budget {
                break;
            }
            let workflow = self.get_workflow_bytes(id).await?;
            held += workflow.as_ref().map_or(0, Vec::len);
            out.push(workflow);
        }
        Ok(out)
    }
    /// The jobs queued, running or canceling (recovery at start).
    async fn unfinished_jobs(&self) -> Result<Vec<JobRecord>, StoreError>;
    /// A bound on the queue `seq` of every job ever submitted (new jobs
    /// follow it; it may skip ahead, never fall behind).
    async fn max_seq(&self) -> Result<u64, StoreError>;
    /// Jobs the retention sweeper has work on at `now`: those not expired
    /// whose `expires_at` has passed, and expired ones whose `expires_at`
    /// is at or before `purge_before`; at most `limit` of each, the oldest.
    async fn jobs_due(&self, now: Micros, purge_before: Micros, limit: usize) -> Result<Vec<JobRecord>, StoreError>;
    /// Records that an attempt of `job` began: its `running` record, with
    /// the attempts counted, already written with [`MetaStore::put_job`].
    /// When this returns the record survives a crash of this process, so a
    /// job that brings the server down is not retried forever; a power loss
    /// may lose it (the job then runs again). This default flushes; a
    /// backend may do it cheaper.
    async fn record_start(&self, job: &JobRecord) -> Result<(), StoreError> {
        let _ = job;
        self.flush().await
    }
    /// Makes the submissions, job starts and finished jobs recorded so far
    /// durable (a backend may do this cheaper than [`MetaStore::flush`]).
    async fn sync_jobs(&self) -> Result<(), StoreError> {
        self.flush().await
    }
    /// Writes a job's terminal record and makes it durable together with
    /// its output assets (written with [`MetaStore::put_asset`]). This
    /// default puts and flushes; a backend may do it cheaper.
    async fn finish_job(&self, job: &JobRecord, assets: &[AssetRecord]) -> Result<(), StoreError> {
        let _ = assets;
        self.put_job(job).await?;
        self.flush().await
    }
    /// [`MetaStore::finish_job`], and, in a store that keeps the accounts
    /// too (PostgreSQL), `charge` applied in the same transaction, only if
    /// this write ends the job (a retry after an unknown outcome charges
    /// nothing twice): so no one ever sees the job ended and its account
    /// not yet charged. The other hosts hear of the new balance after the
    /// commit (best effort: admissions and starts read the stored
    /// balance, not their copies). This default
    /// finishes and charges nothing
    /// ([`Charged::Apart`]: the caller charges through the account store).
    async fn finish_job_charged(&self, job: &JobRecord, assets: &[AssetRecord], charge: Charge<'_>) -> Result<Charged, StoreError> {
        let _ = charge;
        self.finish_job(job, assets).await.map(|()| Charged::Apart)
    }
    /// Makes everything durable in the store itself, so nothing written so
    /// far is replayed from a log after a crash. Called before deletions
    /// (a replayed older write must not bring a deleted record back).
    async fn checkpoint(&self) -> Result<(), StoreError> {
        self.flush().await
    }
    /// Whether job writes may now wait for a flush of the whole store (a
    /// checkpoint, a full log) rather than a single sync.
    fn writes_may_block(&self) -> bool {
        false
    }
    async fn put_asset(&self, asset: &AssetRecord) -> Result<(), StoreError>;
    /// Replaces the record of an asset that exists; `false`, and nothing
    /// written, when there is none (deleted meanwhile, through any host): a
    /// change to a record read earlier never brings a deleted one back.
    async fn update_asset(&self, asset: &AssetRecord) -> Result<bool, StoreError>;
    /// Changes asset `id` from its record as stored, atomically against
    /// every other write of it (through any host): `change` gets the
    /// stored record and returns the new one, or `None` to leave it, and is
    /// called again when another write came first. The record as stored
    /// after; `None` when there is none. (Two uploads of the same bytes
    /// merging their expiry and tags into one record must not lose either.)
    async fn change_asset(&self, id: &str, change: AssetChange) -> Result<Option<AssetRecord>, StoreError>;
    async fn get_asset(&self, id: &str) -> Result<Option<AssetRecord>, StoreError>;
    async fn delete_asset(&self, asset: &AssetRecord) -> Result<(), StoreError>;
    /// Deletes upload `asset` (read from [`MetaStore::uploads_due`]) only
    /// if the stored record is still an upload due at `now`; the record it
    /// deleted, as stored. An upload of the same bytes may have extended
    /// its expiry since it was listed (`update_asset`): that record,
    /// acknowledged to its uploader, stays.
    async fn delete_expired_upload(&self, asset: &AssetRecord, now: Micros) -> Result<Option<AssetRecord>, StoreError>;
    /// Assets over blob `hash`.
    async fn assets_with_hash(&self, hash: &str) -> Result<Vec<AssetRecord>, StoreError>;
    /// A job's output assets.
    async fn assets_of_job(&self, job_id: &str) -> Result<Vec<AssetRecord>, StoreError>;
    /// Uploads (assets of no job) whose `expires_at` is at or before `now`;
    /// at most `limit`, the oldest.
    async fn uploads_due(&self, now: Micros, limit: usize) -> Result<Vec<AssetRecord>, StoreError>;
    /// Assets with a tag that starts with `prefix`.
    async fn assets_tagged(&self, prefix: &str) -> Result<Vec<AssetRecord>, StoreError>;

    /// The live claim on `key`, if any.
    async fn get_claim(&self, key: &str) -> Result<Option<IdempotencyClaim>, StoreError>;
    /// Drops claims that expired before `now`; returns how many.
    async fn purge_claims(&self, now: Micros) -> Result<usize, StoreError>;

    /// Collects the store's own leftovers (the embedded store's record
    /// pieces that no record names after a crash), a bounded amount per
    /// call; how many. Called by each retention sweep.
    async fn tidy(&self) -> Result<usize, StoreError> {
        Ok(0)
    }

    /// Makes every write so far durable.
    async fn flush(&self) -> Result<(), StoreError>;

    /// Lets go of what the store holds outside this process (a database's
    /// connections) when the service stops; later calls may fail.
    async fn close(&self) {}

    /// Where hosts share the store: holds blobs `names` for `claimant` (a
    /// job's id while it is unfinished, or an upload's `upload:<uuid>`
    /// while this host lives) so that no host's collection pass deletes
    /// them (see `service::blob_gc`). Takes effect when it returns; a pass
    /// that had locked one of them ([`MetaStore::lock_blob`]) has finished
    /// by then, so the caller checks the blob is still there. Whether
    /// anything was held: `false` in a store one process holds, whose own
    /// gate orders its writes and passes (the default).
    async fn hold_blobs(&self, names: &[String], claimant: &str) -> Result<bool, StoreError> {
        let _ = (names, claimant);
        Ok(false)
    }
    /// Ends `claimant`'s holds (an upload recorded, or given up).
    async fn release_blobs(&self, claimant: &str) -> Result<(), StoreError> {
        let _ = claimant;
        Ok(())
    }
    /// Locks blob `name` against new holds until the lock is dropped (a
    /// collection pass checks and deletes it meanwhile), and says whether a
    /// live claimant holds it (or a hold is being written now: then nothing
    /// is locked, and nothing waits); `None` in a store one process holds
    /// (the default).
    async fn lock_blob(&self, name: &str) -> Result<Option<BlobLock>, StoreError> {
        let _ = name;
        Ok(None)
    }
    /// Removes the holds of claimants that ended (a finished or deleted
    /// job, an upload of a host no longer registered); how many.
    async fn prune_blob_holds(&self) -> Result<u64, StoreError> {
        Ok(0)
    }

    /// The right to run periodic work `name` (the retention sweep) now,
    /// held until the lease is dropped; `None` while another host sharing
    /// the store holds it. A store of one process grants it always.
    async fn periodic_lease(&self, name: &str) -> Result<Option<PeriodicLease>, StoreError> {
        let _ = name;
        Ok(Some(PeriodicLease(None)))
    }

    /// Writes a small marker and makes it durable: an error when the store
    /// cannot take writes now (a full disk, a read-only directory or
    /// database, a database that does not answer). What readiness checks.
    async fn check_writable(&self) -> Result<(), StoreError>;
    /// This installation's id: made once with the store and kept by it
    /// (hosts sharing the store share it). What an S3 bucket is marked
    /// with. A store that keeps none answers an error.
    async fn installation_id(&self) -> Result<String, StoreError> {
        Err(StoreError::Backend("this store keeps no installation id".into()))
    }

    /// A number that is different each time a finished job of `owner` has
    /// been written or deleted since it was last read: what a cached view
    /// of the owner's history compares before it is used (read it before
    /// the view is read). A store that cannot tell cheaply keeps this
    /// default, a new number every time, and nothing is served cached.
    async fn finished_changes(&self, _owner: &str) -> Result<u64, StoreError> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1 << 63);
        Ok(NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
    }
}

/// The name of the retention sweep's [`MetaStore::periodic_lease`].
pub const SWEEP_LEASE: &str = "retention sweep";

/// A granted [`MetaStore::periodic_lease`]: released when dropped (and by
/// the store when the holder dies).
pub struct PeriodicLease(pub Option<Box<dyn Send + Sync>>);

/// A blob locked by [`MetaStore::lock_blob`]: no new hold on it takes
/// effect until this is dropped.
pub struct BlobLock {
    /// Whether a live claimant held the blob when it was locked.
    pub held: bool,
    pub _lock: Box<dyn Send + Sync>,
}

/// A change [`MetaStore::change_asset`] makes from an asset's stored record.
pub type AssetChange = std::sync::Arc<dyn Fn(&AssetRecord) -> Option<AssetRecord> + Send + Sync>;

/// What a blob store holds ([`BlobStore::usage`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BlobUsage {
    pub bytes: u64,
    pub blobs: u64,
}

/// Content-addressed blobs. Calls may wait for a disk or a network:
/// callers run them on blocking threads. Readers get a local file
/// ([`BlobStore::open`]): a store that keeps blobs elsewhere
/// ([`s3::S3Blobs`]) reads them through a local cache.
pub trait BlobStore: Send + Sync {
    /// The bytes and the number of blobs stored now, by one walk of the
    /// store (a directory walk, a bucket listing): callers measure rarely.
    fn usage(&self) -> Result<BlobUsage, StoreError>;
    /// Stores `data`; returns its hash. Atomic and durable when it returns.
    fn put(&self, data: &[u8]) -> Result<blake3::Hash, StoreError>;
    /// Starts a streamed upload of at most `limit` bytes, staged locally.
    fn begin(&self, limit: u64) -> Result<BlobUpload, StoreError>;
    /// Stores a finished upload under its hash; its hash and size. Atomic
    /// and durable when it returns.
    fn commit(&self, upload: BlobUpload) -> Result<(blake3::Hash, u64), StoreError>;
    /// Whether the blob is stored; an error when the store cannot tell (a
    /// bucket not answering).
    fn contains(&self, hash: &blake3::Hash) -> Result<bool, StoreError>;
    /// [`BlobStore::contains`] as every host sharing the store sees it now
    /// (a remote store asks the remote, not its local cache).
    fn stored(&self, hash: &blake3::Hash) -> Result<bool, StoreError> {
        self.contains(hash)
    }
    /// Whether an asset record naming `hash` may be shown, answered
    /// without waiting for a network (callers may be on async threads):
    /// the file store checks its file (a crash can leave a record whose
    /// blob never landed); a remote store, whose blobs are written before
    /// their records and collected only once no record names them, trusts
    /// the record (a blob missing anyway reads as not found).
    fn presumed_present(&self, hash: &blake3::Hash) -> bool {
        self.contains(hash).unwrap_or(false)
    }
    /// The blob opened for reading (a local file: streaming, range reads);
    /// `None` when it is not stored.
    fn open(&self, hash: &blake3::Hash) -> Result<Option<std::fs::File>, StoreError>;
    fn delete(&self, hash: &blake3::Hash) -> Result<(), StoreError>;
    /// Every blob present (blob collection's full pass: at start and daily).
    fn list(&self) -> Result<Vec<blake3::Hash>, StoreError>;
}
