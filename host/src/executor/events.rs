//! Execution events: the one source every API surface maps to its wire format.

use crate::files::SavedFile;
use crate::plugins::NodeFailure;
use crate::tensor::Tensor;

/// Something that happened while running a job, in order.
#[derive(Debug, Clone)]
pub enum Event {
    /// The run began.
    Started { job_id: String },
    /// These nodes are served from the result cache and will not run;
    /// `overall` is the run's progress with them done. Sent once per run,
    /// right after `Started`, even when no node is cached.
    Cached { nodes: Vec<String>, overall: f64 },
    /// A node began running.
    Executing { node: String, class_type: String },
    /// Progress of a node and of the whole run (`overall` in 0..=1, weighted
    /// by node count and by the steps nodes report; it never decreases).
    /// The executor is the one source of this number. Sent for the steps a
    /// node reports, and once more (`1/1`) after its `Executed`.
    Progress { node: String, step: u64, steps: u64, overall: f64 },
    /// An intermediate image from a node.
    Preview { node: String, image: Tensor },
    /// A line of progress text from a node (bounded by the host).
    Text { node: String, text: String },
    /// A node finished and saved files (output nodes; also sent for cached
    /// output nodes, with their earlier files).
    Output { node: String, class_type: String, files: Vec<SavedFile>, cached: bool },
    /// A node finished running; `on_gpu` when any of its work ran on the
    /// GPU. `nodes_done`: nodes done in the run with it (cached ones too).
    Executed { node: String, class_type: String, elapsed_ms: f64, on_gpu: bool, nodes_done: u64 },
    /// The whole run finished.
    Succeeded { job_id: String },
    /// A node failed; the run stopped. `executed`: the nodes that ran
    /// before, in order.
    Failed { job_id: String, node: String, class_type: String, failure: NodeFailure, executed: Vec<String> },
    /// The run was cancelled; `node` (of `class_type`) was running when it
    /// stopped. `executed`: the nodes that ran before, in order.
    Interrupted { job_id: String, node: Option<String>, class_type: Option<String>, executed: Vec<String> },
}

/// Receives events as they happen. Must not block.
pub type EventSink = std::sync::Arc<dyn Fn(Event) + Send + Sync>;
