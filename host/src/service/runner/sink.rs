//! The event sink of a running job: turns the executor's events into
//! record updates (progress, outputs as assets), Jobs API stream events and
//! execution messages on the bus. The numbers (overall progress, nodes
//! done) are the executor's; this keeps only what the bus's messages need
//! of the run so far.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::outcome::failure_code;
use crate::executor::Event;
use crate::service::bus::{self, ExecBody, ExecBus, NodeRunState};
use crate::service::job_files::media_type;
use crate::service::metrics::class_label;
use crate::service::{JobEvent, LiveJob};
use crate::store::{AssetRecord, OutputRecord, ProgressSnapshot, blob_name, now_micros};

/// Progress frames per job go out at most this often.
pub(super) const PROGRESS_INTERVAL: Duration = Duration::from_millis(500);
/// Step progress of a job goes on the execution bus at most this often
/// (a node's last step always does).
const BUS_PROGRESS_INTERVAL: Duration = Duration::from_millis(100);
/// Preview frames per job go out at most this often.
const PREVIEW_INTERVAL: Duration = Duration::from_millis(250);

/// Turns one job's executor events into record updates, Jobs API stream
/// events and execution messages on the bus. Every method runs on the
/// executor's thread and must not block.
pub(super) struct JobSink {
    meta: Arc<dyn crate::store::MetaStore>,
    bus: Arc<dyn ExecBus>,
    live: Arc<LiveJob>,
    job_id: Arc<str>,
    owner: Arc<str>,
    /// What the bus's messages need to know of the run so far.
    run: Mutex<RunTrack>,
    /// The node the last `Executing` on the bus named (see [`JobSink::publish`]).
    said: Mutex<Option<String>>,
    /// Where node times and failures are counted, and the host's own node
    /// classes (the only ones counted by name).
    metrics: Arc<crate::service::metrics::Metrics>,
    host_classes: Arc<crate::plugins::NodeRegistry>,
}

/// What the bus has been told of the run (the run's own state — nodes
/// done, executed, classes — comes with the executor's events).
#[derive(Default)]
struct RunTrack {
    /// Nodes running now, with the step progress last published (value, max).
    running: HashMap<String, (f64, f64)>,
    /// When step progress last went on the bus.
    last_progress: Option<Instant>,
}

impl JobSink {
    pub(super) fn new(
        meta: Arc<dyn crate::store::MetaStore>,
        bus: Arc<dyn ExecBus>,
        live: Arc<LiveJob>,
        (metrics, host_classes): (Arc<crate::service::metrics::Metrics>, Arc<crate::plugins::NodeRegistry>),
    ) -> JobSink {
        let (job_id, owner) = {
            let rec = live.record.lock();
            (Arc::from(rec.id.as_str()), Arc::from(rec.owner.as_str()))
        };
        JobSink { meta, bus, live, job_id, owner, run: Mutex::new(RunTrack::default()), said: Mutex::new(None), metrics, host_classes }
    }

    pub(super) fn handle(&self, event: Event) {
        match event {
            Event::Started { .. } => self.started(),
            Event::Cached { nodes, overall } => self.cached(nodes, overall),
            Event::Executing { node, class_type } => self.executing(node, class_type),
            Event::Progress { node, step, steps, overall } => self.progress(node, step, steps, overall),
            Event::Executed { node, class_type, elapsed_ms, on_gpu, nodes_done } => {
                self.metrics.node_ran(class_label(&self.host_classes, &class_type), on_gpu, elapsed_ms);
                self.executed(node, nodes_done)
            }
            Event::Output { node, files, cached, .. } => self.output(node, files, cached),
            Event::Preview { node, image } => self.preview(node, &image),
            Event::Text { node, text } => self.publish(ExecBody::Text { node, text }),
            Event::Succeeded { .. } => self.publish(ExecBody::Succeeded { at_ms: bus::now_ms() }),
            Event::Failed { node, class_type, failure, executed, .. } => self.failed(node, class_type, &failure, executed),
            Event::Interrupted { node, class_type, executed, .. } => self.publish(ExecBody::Interrupted { node, class_type, executed, at_ms: bus::now_ms() }),
        }
    }

    /// Puts a message on the bus, in the order ComfyUI could have sent it:
    /// ComfyUI runs one node at a time and its clients take `executing` as
    /// "the node now running", attributing what follows to it, while kiln
    /// runs branches in parallel. So a node's progress, output, preview or
    /// text whose node the last `executing` did not name is preceded by an
    /// `executing` naming it (the lock keeps the pair together across the
    /// branches' threads). Cached outputs go out as ComfyUI sends them,
    /// without (see `output`).
    fn publish(&self, body: ExecBody) {
        let mut said = self.said.lock();
        match &body {
            ExecBody::Executing { node } => said.clone_from(node),
            ExecBody::Progress { node, .. } | ExecBody::Output { node, .. } | ExecBody::Preview { node, .. } | ExecBody::Text { node, .. }
                if said.as_deref() != Some(node.as_str()) =>
            {
                self.bus.job(&self.job_id, &self.owner, ExecBody::Executing { node: Some(node.clone()) });
                *said = Some(node.clone());
            }
            _ => {}
        }
        self.bus.job(&self.job_id, &self.owner, body);
    }

    fn started(&self) {
        self.publish(ExecBody::Started { at_ms: bus::now_ms() });
    }

    // The executor owns the numbers (`overall`); a node counts as done once
    // it executed.
    fn cached(&self, nodes: Vec<String>, overall: f64) {
        update_progress(
            &self.live,
            |p| {
                p.nodes_done = nodes.len() as u64;
                p.value = overall;
            },
            false,
        );
        self.publish(ExecBody::Cached { nodes, at_ms: bus::now_ms() });
    }

    fn executing(&self, node: String, class_type: String) {
        self.run.lock().running.insert(node.clone(), (0.0, 1.0));
        self.node_state(&node, 0.0, 1.0, NodeRunState::Running);
        self.publish(ExecBody::Executing { node: Some(node.clone()) });
        update_progress(
            &self.live,
            |p| {
                p.current_node = Some(node);
                p.current_node_class = Some(class_type);
                (p.step, p.steps, p.message) = (None, None, None);
            },
            false,
        );
    }

    fn progress(&self, node: String, step: u64, steps: u64, overall: f64) {
        // Steps a running node reported go on the bus (at most every
        // BUS_PROGRESS_INTERVAL, the last step always); the executor's own
        // `1/1` after a node executed does not, nor does a node's single
        // step (its start and finish say as much).
        let due = {
            let mut run = self.run.lock();
            let due = steps > 1 && run.running.contains_key(&node) && (step >= steps || run.last_progress.is_none_or(|t| t.elapsed() >= BUS_PROGRESS_INTERVAL));
            if due {
                run.last_progress = Some(Instant::now());
                run.running.insert(node.clone(), (step as f64, steps as f64));
            }
            due
        };
        if due {
            self.publish(ExecBody::Progress { node: node.clone(), value: step, max: steps });
            self.node_state(&node, step as f64, steps as f64, NodeRunState::Running);
        }
        update_progress(
            &self.live,
            |p| {
                p.message = Some(format!("{} {step}/{steps}", p.current_node_class.as_deref().unwrap_or(&node)));
                (p.step, p.steps, p.value) = (Some(step), Some(steps), overall);
            },
            false,
        );
    }

    fn executed(&self, node: String, nodes_done: u64) {
        self.run.lock().running.remove(&node);
        self.node_state(&node, 1.0, 1.0, NodeRunState::Finished);
        update_progress(
            &self.live,
            |p| {
                p.nodes_done = nodes_done;
                (p.step, p.steps) = (None, None);
            },
            false,
        );
    }

    /// Output files become asset records (and outputs of the live record);
    /// on the bus, a cached output node is also finished.
    fn output(&self, node: String, files: Vec<crate::files::SavedFile>, cached: bool) {
        let now = now_micros();
        let live = &self.live;
        let expires_at = live.record.lock().expires_at;
        for file in &files {
            let Some(hash) = file.hash else { continue };
            let name = file.filename.clone();
            let (content_type, kind) = media_type(&name);
            let file_path = if file.subfolder.is_empty() { name.clone() } else { format!("{}/{}", file.subfolder, name) };
            let asset = AssetRecord {
                id: uuid::Uuid::now_v7().to_string(),
                owner: self.owner.to_string(),
                hash: blob_name(&hash),
                size_bytes: file.size,
                content_type: content_type.into(),
                file_path: Some(file_path),
                created_at: now,
                expires_at: Some(expires_at),
                job_id: Some(self.job_id.to_string()),
                node_id: Some(node.clone()),
                tags: Vec::new(),
            };
            // Written before the output is shown (a client may fetch it at
            // once); the sink is synchronous, on the job's execution thread.
            if let Err(e) = crate::store::wait(self.meta.put_asset(&asset)) {
                tracing::error!(error = %e, "cannot record an output asset");
                continue;
            }
            live.output_assets.lock().push(asset.clone());
            let output = OutputRecord {
                node_id: node.clone(),
                name,
                kind: kind.into(),
                content_type: content_type.into(),
                size_bytes: file.size,
                asset_id: asset.id,
                hash: asset.hash,
                subfolder: Some(file.subfolder.clone()),
            };
            // On the live record only: it reaches the store with the
            // terminal record (an interrupted run's outputs are dropped at
            // the next start anyway).
            {
                let mut rec = live.record.lock();
                rec.outputs.push(output.clone());
                rec.updated_at = now;
            }
            live.publish(JobEvent::Output(output));
        }
        if !files.is_empty() {
            let body = ExecBody::Output { node: node.clone(), files };
            if cached {
                // As ComfyUI reports a cached output node: `executed`
                // after `execution_cached`, with no `executing` of its own.
                self.bus.job(&self.job_id, &self.owner, body);
            } else {
                self.publish(body);
            }
        }
        if cached {
            self.node_state(&node, 1.0, 1.0, NodeRunState::Finished);
        }
    }

    /// Publishes `node`'s new state with the other nodes running now.
    fn node_state(&self, node: &str, value: f64, max: f64, state: NodeRunState) {
        // Nothing to build when no socket listens (the common case for a
        // Jobs API server): this runs twice per node.
        if !self.bus.watched() {
            return;
        }
        let others = self.run.lock().running.iter().filter(|(id, _)| id.as_str() != node).map(|(id, &(v, m))| (id.clone(), v, m)).collect();
        self.publish(ExecBody::NodeState { node: node.to_string(), value, max, state, others });
    }

    fn preview(&self, node: String, image: &crate::tensor::Tensor) {
        // At most one preview per PREVIEW_INTERVAL is encoded (≤ 512 px,
        // fast compression) and sent; the rest are dropped.
        let live = &self.live;
        let due = {
            let mut last = live.last_preview_at.lock();
            let due = last.is_none_or(|t| t.elapsed() >= PREVIEW_INTERVAL);
            if due {
                *last = Some(Instant::now());
            }
            due
        };
        if due && let Some(png) = crate::service::preview::encode(image) {
            let data = Arc::new(png);
            self.publish(ExecBody::Preview { node: node.clone(), content_type: "image/png", data: data.clone() });
            let event = JobEvent::Preview { node_id: node, content_type: "image/png".into(), data };
            *live.last_preview.lock() = Some(event.clone());
            live.publish(event);
        }
    }

    fn failed(&self, node: String, class_type: String, failure: &crate::plugins::NodeFailure, executed: Vec<String>) {
        if !class_type.is_empty() {
            self.metrics.node_failed(class_label(&self.host_classes, &class_type), failure_code(failure.kind));
        }
        let (node, class_type) = (Some(node).filter(|n| !n.is_empty()), Some(class_type).filter(|c| !c.is_empty()));
        let body = ExecBody::Failed { node, class_type, code: failure_code(failure.kind), message: failure.message.clone(), executed, at_ms: bus::now_ms() };
        self.publish(body);
    }
}

/// Applies `f` to the job's progress and sends a frame unless one went out
/// less than [`PROGRESS_INTERVAL`] ago. `value` is the executor's; this only
/// keeps it within the spec's 0..=1.
pub(super) fn update_progress(live: &LiveJob, f: impl FnOnce(&mut ProgressSnapshot), force: bool) {
    let snapshot = {
        let mut rec = live.record.lock();
        let Some(p) = rec.progress.as_mut() else { return };
        f(p);
        p.value = p.value.clamp(0.0, 1.0);
        p.clone()
    };
    let mut last = live.last_progress.lock();
    if force || last.is_none_or(|t| t.elapsed() >= PROGRESS_INTERVAL) {
        *last = Some(Instant::now());
        drop(last);
        live.publish(JobEvent::Progress(snapshot));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::ExtraData;
    use crate::store::{JobRecord, JobStatus};

    fn running_job(nodes: u64) -> LiveJob {
        let record = JobRecord {
            status: JobStatus::Running,
            started_at: Some(0),
            attempts: 1,
            progress: Some(ProgressSnapshot {
                value: 0.0,
                nodes_done: 0,
                nodes_total: nodes,
                current_node: None,
                current_node_class: None,
                step: None,
                steps: None,
                message: None,
            }),
            ..JobRecord::queued_for_test("j", 0, 1)
        };
        LiveJob::new(record, ExtraData::default(), Arc::new(crate::service::bus::LocalJobChannel::default()))
    }

    /// ComfyUI's order, checked on a run of two parallel branches: every
    /// node-scoped message follows an `executing` naming its node, with no
    /// other `executing` in between.
    #[test]
    fn node_messages_follow_an_executing_naming_their_node() {
        let bus = Arc::new(crate::service::bus::LocalBus::default());
        let mut rx = bus.subscribe();
        let dir = tempfile::tempdir().unwrap();
        let meta: Arc<dyn crate::store::MetaStore> = Arc::new(crate::store::SledMeta::open(dir.path()).unwrap());
        let sink = JobSink::new(meta, bus.clone(), Arc::new(running_job(4)), (Default::default(), Arc::new(crate::plugins::NodeRegistry::new())));
        let text = |node: &str| Event::Text { node: node.into(), text: format!("from {node}") };
        for event in [
            Event::Executing { node: "2".into(), class_type: "A".into() },
            Event::Executing { node: "9".into(), class_type: "B".into() },
            text("2"),
            text("2"),
            text("9"),
            Event::Executing { node: "5".into(), class_type: "C".into() },
            text("9"),
        ] {
            sink.handle(event);
        }
        let mut said: Option<String> = None;
        let mut order = Vec::new();
        while let Ok(message) = rx.try_recv() {
            match &message.body {
                ExecBody::Executing { node } => {
                    said.clone_from(node);
                    order.push(format!("executing {}", node.as_deref().unwrap_or("-")));
                }
                ExecBody::Text { node, .. } => {
                    assert_eq!(said.as_deref(), Some(node.as_str()), "text of {node} after executing {said:?}");
                    order.push(format!("text {node}"));
                }
                _ => {}
            }
        }
        assert_eq!(order, ["executing 2", "executing 9", "executing 2", "text 2", "text 2", "executing 9", "text 9", "executing 5", "executing 9", "text 9"]);
    }

    fn value(live: &LiveJob) -> f64 {
        live.record.lock().progress.as_ref().unwrap().value
    }

    #[test]
    fn progress_takes_the_executors_value_and_frames_are_throttled() {
        let live = running_job(4);
        let mut frames = live.events.subscribe();
        update_progress(&live, |p| p.current_node = Some("1".into()), false);
        update_progress(&live, |p| (p.step, p.steps, p.value) = (Some(1), Some(4), 0.0625), false);
        assert_eq!(value(&live), 0.0625);
        update_progress(&live, |p| p.nodes_done = 1, false);
        assert_eq!(value(&live), 0.0625, "counting a node done changes no value: the executor sends it");
        update_progress(&live, |p| p.value = 7.0, false);
        assert_eq!(value(&live), 1.0, "kept within 0..=1");
        // The record always holds the latest snapshot; frames went out for
        // the first update only (the rest came within the interval).
        let mut sent = Vec::new();
        while let Ok(JobEvent::Progress(p)) = frames.try_recv() {
            sent.push(p.value);
        }
        assert_eq!(sent, [0.0]);
        // A forced update goes out at once; an unforced one after the interval.
        update_progress(&live, |p| p.value = 0.75, true);
        std::thread::sleep(PROGRESS_INTERVAL + Duration::from_millis(50));
        update_progress(&live, |p| p.value = 0.875, false);
        let sent: Vec<f64> = std::iter::from_fn(|| match frames.try_recv() {
            Ok(JobEvent::Progress(p)) => Some(p.value),
            _ => None,
        })
        .collect();
        assert_eq!(sent, [0.75, 0.875]);
    }
}
