//! The execution-message bus: what happens to every job, in order, for
//! surfaces that watch all of an account's jobs at once (the ComfyUI
//! WebSocket), and each job's own channel ([`JobChannel`]: the Jobs API's
//! event stream of one job).
//!
//! Messages are surface-neutral facts (a node started, a node's state
//! changed, a file was saved, the queue changed), published by the job
//! runner from the executor's events (`runner/`) and by the queue
//! (`mod.rs`), through the [`ExecBus`] trait. The embedded [`LocalBus`] is a
//! bounded `broadcast` of `Arc`s: publishing
//! never waits, and a subscriber that falls behind by more than
//! [`BUS_CAPACITY`] messages is told it lagged (the WebSocket then drops
//! that connection), so a slow reader never holds up a job or another
//! reader. Hosts sharing a store use [`SharedBus`] (`shared`): the same,
//! with what each host publishes also sent to the others.

mod previews;
mod shared;

use std::sync::Arc;

use tokio::sync::broadcast;

use serde::{Deserialize, Serialize};

use super::live::JobEvent;
use crate::files::SavedFile;

pub use shared::SharedBus;

/// Messages a subscriber may fall behind by before it lags.
pub const BUS_CAPACITY: usize = 4096;

/// One execution message.
#[derive(Debug, Serialize, Deserialize)]
pub struct ExecMessage {
    /// The job it is about (empty for queue changes).
    pub job_id: Arc<str>,
    /// Who may see it: the job's owner (for queue changes, the owner whose
    /// count it is); `None`: everyone.
    pub owner: Option<Arc<str>>,
    pub body: ExecBody,
    /// What a surface made of it, made by its first reader and shared by
    /// the others (every subscriber reads the same `Arc`).
    #[serde(skip)]
    pub rendered: Rendered,
}

impl ExecMessage {
    pub fn new(job_id: Arc<str>, owner: Option<Arc<str>>, body: ExecBody) -> ExecMessage {
        ExecMessage { job_id, owner, body, rendered: Rendered::default() }
    }
}

/// Renderings of one message, one per variant a surface asks for (the
/// ComfyUI WebSocket: with or without preview metadata), each of the
/// surface's own type: a frame is rendered once however many connections
/// send it.
#[derive(Default)]
pub struct Rendered([std::sync::OnceLock<Box<dyn std::any::Any + Send + Sync>>; 2]);

impl Rendered {
    /// Variant `variant` (0 or 1), made by `make` if no one made it yet;
    /// `None` for another variant, or where it was made as another type.
    pub fn get_or_make<T: Clone + Send + Sync + 'static>(&self, variant: usize, make: impl FnOnce() -> T) -> Option<T> {
        self.0.get(variant)?.get_or_init(|| Box::new(make())).downcast_ref::<T>().cloned()
    }
}

impl std::fmt::Debug for Rendered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Rendered")
    }
}

/// A node's state, as `progress_state` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum NodeRunState {
    Running,
    Finished,
    Error,
}

impl NodeRunState {
    pub fn as_str(self) -> &'static str {
        match self {
            NodeRunState::Running => "running",
            NodeRunState::Finished => "finished",
            NodeRunState::Error => "error",
        }
    }
}

/// What happened. Times are epoch milliseconds. (Serialized for other
/// hosts; previews travel as a notice of their own, see `shared`.)
#[derive(Debug, Serialize, Deserialize)]
pub enum ExecBody {
    /// The number of jobs queued or running changed.
    Queue { remaining: usize },
    /// The run began.
    Started { at_ms: i64 },
    /// These nodes are served from the cache (sent once per run, maybe empty).
    Cached { nodes: Vec<String>, at_ms: i64 },
    /// A node's state changed. Carries that node and the other nodes running
    /// now (`others`: id, value, max) — never the whole map, which grows with
    /// the graph: the official frontend replaces its map of a job's node
    /// states with each message, so every running node must be in each one.
    NodeState { node: String, value: f64, max: f64, state: NodeRunState, others: Vec<(String, f64, f64)> },
    /// A node began running; `None`: the job is over (sent last, after the
    /// terminal record is written and the queue change published).
    Executing { node: Option<String> },
    /// Steps a node reported (`value` of `max`).
    Progress { node: String, value: u64, max: u64 },
    /// A node's saved files (also for cached output nodes, with their
    /// earlier files).
    Output { node: String, files: Vec<SavedFile> },
    /// An intermediate image, encoded.
    #[serde(skip)]
    Preview {
        node: String,
        #[serde(skip)]
        content_type: &'static str,
        data: Arc<Vec<u8>>,
    },
    /// A line of progress text.
    Text { node: String, text: String },
    /// The run finished successfully.
    Succeeded { at_ms: i64 },
    /// The run failed: `code` is the JobError code (`node_out_of_memory`,
    /// `invalid_workflow`, …); `executed` the nodes that ran.
    Failed { node: Option<String>, class_type: Option<String>, code: crate::codes::JobErrorCode, message: String, executed: Vec<String>, at_ms: i64 },
    /// The run was stopped: `node` was running (and was stopped).
    Interrupted { node: Option<String>, class_type: Option<String>, executed: Vec<String>, at_ms: i64 },
}

/// The bus: publishing never waits; a subscriber gets every message
/// published after it subscribed, or is told it lagged. The embedded
/// [`LocalBus`] reaches this process's subscribers; a bus shared by several
/// hosts also delivers what other hosts publish.
pub trait ExecBus: Send + Sync {
    /// Sends `message` to every subscriber; never waits.
    fn publish(&self, message: Arc<ExecMessage>);
    /// Receives every message published from now on.
    fn subscribe(&self) -> broadcast::Receiver<Arc<ExecMessage>>;
    /// Whether anyone listens (publishers skip building messages otherwise).
    fn watched(&self) -> bool;
    /// The event channel of job `id`, whose run this process holds.
    fn job_channel(&self, id: &str) -> Arc<dyn JobChannel>;
    /// The events of job `id` when another process runs it, from now on;
    /// `None` when none does (on the embedded bus, never: one process runs
    /// every job).
    fn follow(&self, id: &str) -> Option<broadcast::Receiver<JobEvent>>;
    /// A stream here follows job `id` (its owner's, unfinished), which
    /// another process runs (a bus shared by several hosts has that host
    /// send its previews here; the embedded bus needs nothing).
    fn following(&self, _id: &str) {}
    /// A socket of `owner` listens here until the returned watch drops (a
    /// bus shared by several hosts has them send here the previews of the
    /// owner's jobs meanwhile; the embedded bus needs nothing).
    fn watch_owner(&self, _owner: &Arc<str>) -> OwnerWatch {
        OwnerWatch(None)
    }

    /// Publishes a message about job `job_id` of `owner`.
    fn job(&self, job_id: &Arc<str>, owner: &Arc<str>, body: ExecBody) {
        if self.watched() {
            self.publish(Arc::new(ExecMessage::new(job_id.clone(), Some(owner.clone()), body)));
        }
    }

    /// Publishes a change of `owner`'s queue (its jobs queued or running).
    fn queue(&self, owner: Arc<str>, remaining: usize) {
        if self.watched() {
            self.publish(Arc::new(ExecMessage::new(Arc::from(""), Some(owner), ExecBody::Queue { remaining })));
        }
    }
}

/// A socket's watch on its owner's jobs ([`ExecBus::watch_owner`]), ended
/// when dropped.
pub struct OwnerWatch(Option<Box<dyn FnOnce() + Send>>);

impl OwnerWatch {
    fn new(end: impl FnOnce() + Send + 'static) -> OwnerWatch {
        OwnerWatch(Some(Box::new(end)))
    }
}

impl Drop for OwnerWatch {
    fn drop(&mut self) {
        if let Some(end) = self.0.take() {
            end();
        }
    }
}

/// One job's events, to the streams open on it: held by the live job.
pub trait JobChannel: Send + Sync {
    /// Sends `event` to the job's open streams; never waits.
    fn publish(&self, event: JobEvent);
    /// Receives the job's events from now on.
    fn subscribe(&self) -> broadcast::Receiver<JobEvent>;
    /// Whether a stream is open on the job.
    fn watched(&self) -> bool;
    /// Another host runs the job now (it took the job from this one's
    /// queue): the streams open here hear it from that host from now on,
    /// `now` (its record as read then) first. On the embedded bus, never.
    fn moved(&self, _now: Option<Arc<crate::store::JobRecord>>) {}
}

/// A job's channel in one process: a small `broadcast` (a stream that
/// falls behind re-syncs from the record).
pub struct LocalJobChannel(broadcast::Sender<JobEvent>);

impl Default for LocalJobChannel {
    fn default() -> Self {
        LocalJobChannel(broadcast::channel(32).0)
    }
}

impl LocalJobChannel {
    /// The sender its streams hear.
    pub fn sender(&self) -> broadcast::Sender<JobEvent> {
        self.0.clone()
    }
}

impl JobChannel for LocalJobChannel {
    fn publish(&self, event: JobEvent) {
        // An error only says no stream is open.
        let _ = self.0.send(event);
    }

    fn subscribe(&self) -> broadcast::Receiver<JobEvent> {
        self.0.subscribe()
    }

    fn watched(&self) -> bool {
        self.0.receiver_count() > 0
    }
}

/// The bus of one process: a bounded `broadcast` channel.
pub struct LocalBus {
    tx: broadcast::Sender<Arc<ExecMessage>>,
}

impl Default for LocalBus {
    fn default() -> Self {
        LocalBus { tx: broadcast::channel(BUS_CAPACITY).0 }
    }
}

impl ExecBus for LocalBus {
    fn publish(&self, message: Arc<ExecMessage>) {
        // An error only says no one listens.
        let _ = self.tx.send(message);
    }

    fn subscribe(&self) -> broadcast::Receiver<Arc<ExecMessage>> {
        self.tx.subscribe()
    }

    fn watched(&self) -> bool {
        self.tx.receiver_count() > 0
    }

    fn job_channel(&self, _id: &str) -> Arc<dyn JobChannel> {
        Arc::new(LocalJobChannel::default())
    }

    fn follow(&self, _id: &str) -> Option<broadcast::Receiver<JobEvent>> {
        None
    }
}

/// Epoch milliseconds now.
pub fn now_ms() -> i64 {
    crate::store::now_micros() / 1000
}
