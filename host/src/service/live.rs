//! The in-memory side of jobs that have not finished: the current record,
//! the cancellation token of its run and the channel its event streams
//! subscribe to (from the bus, see `bus::JobChannel`).

use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use crate::store::{JobRecord, MetaStore, OutputRecord, ProgressSnapshot, StoreError};

/// Something an event stream relays.
#[derive(Debug, Clone)]
pub enum JobEvent {
    /// A status transition (or a queue-position change); the whole record.
    Status(Arc<JobRecord>),
    /// A progress snapshot (throttled).
    Progress(ProgressSnapshot),
    /// An output was committed.
    Output(OutputRecord),
    /// An intermediate image.
    Preview { node_id: String, content_type: String, data: Arc<Vec<u8>> },
}

/// Per-request data that is handed to the job's plugins and never stored
/// (its `Debug` prints no secret).
#[derive(Debug, Clone, Default)]
pub struct ExtraData {
    /// `api_key_svc_org`: read by the plugins granted it (see `plugins::secrets`).
    pub secrets: crate::plugins::JobSecrets,
    /// `extra_pnginfo` (the web UI's workflow, which SaveImage embeds in its
    /// PNGs so a saved image loads back as its workflow): metadata held for
    /// the run, not stored — a job re-run after a restart saves without it.
    /// Bounded by the request's size (`max_workflow_kb`).
    pub extra_pnginfo: Option<Arc<serde_json::Value>>,
}

/// A job that is queued or running.
pub struct LiveJob {
    pub record: Mutex<JobRecord>,
    /// The job's write turn: held from a change of `record` until the
    /// store has the changed record, so one job's store writes land in the
    /// order its changes were made (the record's own lock is never held
    /// across a store call).
    pub writes: tokio::sync::Mutex<()>,
    pub cancel: CancellationToken,
    pub events: Arc<dyn super::bus::JobChannel>,
    pub extra: ExtraData,
    /// Retention expired it while it ran: it ends `expired`, not `canceled`.
    pub expire_on_stop: std::sync::atomic::AtomicBool,
    /// When the last progress frame went out (throttling).
    pub last_progress: Mutex<Option<Instant>>,
    /// The latest preview, replayed to new streams.
    pub last_preview: Mutex<Option<JobEvent>>,
    /// The validated workflow and plan of a job submitted to this process,
    /// while the queued jobs' share of memory (`queued_parsed_mb`) allows
    /// (taken by the worker; otherwise, and after a restart, they are
    /// rebuilt from the store).
    pub prepared: Mutex<Option<Prepared>>,
    /// When the last preview went out (throttling).
    pub last_preview_at: Mutex<Option<Instant>>,
    /// Blobs this job's nodes wrote that no asset record names yet (kept
    /// from garbage collection).
    pub pending_blobs: Arc<Mutex<Vec<String>>>,
    /// The output asset records this run wrote (logged with its terminal record).
    pub output_assets: Mutex<Vec<crate::store::AssetRecord>>,
    /// Set (under the record's lock) when the run has ended and its terminal
    /// record is being made durable; the live record shows it only after that.
    pub finishing: std::sync::atomic::AtomicBool,
    /// The job's owner (never changes; read without the record's lock).
    pub owner: Arc<str>,
    /// The account the job is billed to (`None`: none): until it leaves
    /// the live set, it holds that account's minimum price (see
    /// `JobQueue::join`).
    pub billed: Option<Arc<str>>,
    /// Open (permits) once the job may start: a new submission holds it
    /// shut until its caller has its answer ([`StartGate`]).
    start_gate: tokio::sync::Semaphore,
}

/// Holds a newly queued job back from starting until dropped: the caller
/// that submitted it drops it once its answer is made, so a ComfyUI client
/// hears the prompt id before the prompt's messages (a client that learns
/// the id from the answer — `@stable-canvas/comfyui-client` does — misses
/// messages that come first).
pub struct StartGate(Arc<LiveJob>);

impl StartGate {
    /// Shuts `live`'s gate until the returned handle is dropped.
    pub(super) fn shut(live: &Arc<LiveJob>) -> StartGate {
        live.start_gate.forget_permits(usize::MAX);
        StartGate(live.clone())
    }
}

impl std::fmt::Debug for StartGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("StartGate").field(&self.0.owner).finish()
    }
}

impl Drop for StartGate {
    fn drop(&mut self) {
        self.0.start_gate.add_permits(tokio::sync::Semaphore::MAX_PERMITS);
    }
}

/// A queued job's plan and workflow text, and the memory they hold.
pub struct Prepared {
    /// The workflow's JSON text (the `prompt` nodes may read).
    pub text: std::sync::Arc<str>,
    pub plan: crate::workflow::Plan,
    /// The node classes the plan was made against.
    pub registry: std::sync::Arc<crate::plugins::NodeRegistry>,
    /// Their estimated size, taken from the queued jobs' share.
    pub _held: super::memory_gate::GatePermit,
}

impl LiveJob {
    pub fn new(record: JobRecord, extra: ExtraData, events: Arc<dyn super::bus::JobChannel>) -> LiveJob {
        LiveJob {
            owner: Arc::from(record.owner.as_str()),
            billed: None,
            record: Mutex::new(record),
            writes: tokio::sync::Mutex::new(()),
            cancel: CancellationToken::new(),
            events,
            extra,
            expire_on_stop: Default::default(),
            last_progress: Mutex::new(None),
            last_preview: Mutex::new(None),
            last_preview_at: Mutex::new(None),
            prepared: Mutex::new(None),
            pending_blobs: Arc::default(),
            output_assets: Mutex::new(Vec::new()),
            finishing: Default::default(),
            start_gate: tokio::sync::Semaphore::new(tokio::sync::Semaphore::MAX_PERMITS),
        }
    }

    /// The job, billed to `account`.
    pub fn billed_to(mut self, account: Option<Arc<str>>) -> LiveJob {
        self.billed = account;
        self
    }

    /// Returns once the job may start (see [`StartGate`]).
    pub async fn may_start(&self) {
        // Closed never: an error would only mean it is open.
        let _ = self.start_gate.acquire().await;
    }

    /// Lets `f` change the record and, when it says it did, writes it to
    /// `meta` in its write turn (see [`LiveJob::writes`]), so store writes
    /// of one job can never land out of order. Once the job is finishing nothing changes: its
    /// terminal record is being written (see the worker's `finish`).
    /// A change the store refuses is undone here too, still in the turn:
    /// the record shows what the store holds.
    pub async fn update(&self, meta: &dyn MetaStore, f: impl FnOnce(&mut JobRecord) -> bool) -> Result<JobRecord, StoreError> {
        let _turn = self.writes.lock().await;
        let (before, rec) = {
            let mut rec = self.record.lock();
            let before = rec.clone();
            if self.finishing.load(std::sync::atomic::Ordering::SeqCst) || !f(&mut rec) {
                return Ok(before);
            }
            (before, rec.clone())
        };
        if let Err(e) = meta.put_job(&rec).await {
            *self.record.lock() = before;
            return Err(e);
        }
        Ok(rec)
    }

    /// A copy of the current record.
    pub fn snapshot(&self) -> JobRecord {
        self.record.lock().clone()
    }

    /// Sends an event to the open streams (none open is fine).
    pub fn publish(&self, event: JobEvent) {
        self.events.publish(event);
    }

    /// Publishes the record as a status event.
    pub fn publish_status(&self) {
        let rec = Arc::new(self.snapshot());
        self.publish(JobEvent::Status(rec));
    }
}
