//! Job workers: take the next queued job, run it through the executor, and
//! turn executor events into record updates and stream events.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::bus::{self, ExecBody, ExecBus, NodeRunState};
use super::job_files::{JobInputs, JobOutputs, media_type};
use super::{JobEvent, LiveJob, Service, submit};
use crate::codes::JobErrorCode;
use crate::executor::{Event, RunContext, RunOutcome, RunStatus};
use crate::plugins::FailureKind;
use crate::store::{AssetRecord, JobErrorRecord, JobLogRecord, JobRecord, JobStatus, Micros, OutputRecord, ProgressSnapshot, blob_name, now_micros};

/// Progress frames per job go out at most this often.
const PROGRESS_INTERVAL: Duration = Duration::from_millis(500);
/// Step progress of a job goes on the execution bus at most this often
/// (a node's last step always does).
const BUS_PROGRESS_INTERVAL: Duration = Duration::from_millis(100);
/// Preview frames per job go out at most this often.
const PREVIEW_INTERVAL: Duration = Duration::from_millis(250);

/// The JobError code of a node failure.
pub fn failure_code(kind: FailureKind) -> JobErrorCode {
    match kind {
        FailureKind::Timeout => JobErrorCode::NodeTimeout,
        FailureKind::OutOfMemory => JobErrorCode::NodeOutOfMemory,
        FailureKind::JobOutOfMemory => JobErrorCode::JobOutOfMemory,
        FailureKind::Crashed => JobErrorCode::NodeCrashed,
        FailureKind::InvalidOutput => JobErrorCode::NodeInvalidOutput,
        FailureKind::Failed => JobErrorCode::NodeExecutionError,
        FailureKind::Interrupted => JobErrorCode::Interrupted,
        FailureKind::InsufficientFunds => JobErrorCode::InsufficientFunds,
    }
}

impl Service {
    pub(super) async fn worker_loop(self: Arc<Self>) {
        loop {
            let next = tokio::select! {
                _ = self.shutdown.cancelled() => return,
                id = self.next_job() => id,
            };
            let (next, key) = next;
            let Some(live) = self.live_job(&next) else {
                self.queue.lock().done(&key);
                continue;
            };
            tokio::select! {
                _ = self.shutdown.cancelled() => {
                    // Leave the job `running` in the store: the next start re-runs it.
                    live.cancel.cancel();
                    return;
                }
                () = self.run_job(live.clone()) => {}
            }
            // The key may run another job now; this worker looks first, any
            // other idle one too.
            self.queue.lock().done(&key);
            self.queue_notify.notify_one();
        }
    }

    /// The next job to run, round-robin across scheduling keys (see
    /// `fair`), with its key.
    async fn next_job(&self) -> (String, String) {
        loop {
            // Registered before the queue is checked, so a push in between
            // still wakes this worker.
            let notified = self.queue_notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let limits = |key: &str| self.limits_for(key);
            if let Some(next) = self.queue.lock().pop(&limits) {
                self.queued.fetch_sub(1, Ordering::SeqCst);
                return next;
            }
            notified.await;
        }
    }

    async fn run_job(&self, live: Arc<LiveJob>) {
        let now = now_micros();
        // The running record goes to the store under the record's lock (so
        // a concurrent cancel's write cannot be overtaken); then, outside it
        // (it may wait for the disk when the log grows), the start is logged:
        // it survives a crash of the process before the run begins, so a job
        // that brings the server down cannot be retried forever, without a
        // flush on every job (see `MetaStore::record_start`).
        let (snapshot, written) = {
            let mut rec = live.record.lock();
            if rec.status != JobStatus::Queued {
                return; // canceled or expired while it waited
            }
            rec.status = JobStatus::Running;
            rec.started_at = Some(now);
            rec.updated_at = now;
            rec.queue_ms = Some((now - rec.created_at) / 1000);
            rec.attempts += 1;
            let written = self.meta.put_job(&rec);
            (rec.clone(), written)
        };
        if let Err(e) = written.and_then(|()| self.meta.record_start(&snapshot)) {
            tracing::error!(job_id = %snapshot.id, error = %e, "cannot record the running job");
        }
        tracing::debug!(job_id = %snapshot.id, attempt = snapshot.attempts, "job running");
        live.publish_status();
        self.publish_queue_positions();
        // Running jobs still count as remaining (as ComfyUI counts them).
        self.publish_queue(&snapshot.owner);

        // A job whose account ran out of credits while it waited does not
        // run (so a balance goes below zero by at most the jobs running when
        // it crossed zero): it fails, never executed, never charged. Else
        // the job's classes and executor: its deployment's, or the server's.
        let no_funds = self.opts.mode.has_accounts() && !self.accounts.has_funds(&self.billed_account(&snapshot));
        let engine = if no_funds {
            Err(JobErrorRecord {
                code: NO_CREDITS,
                message: "the account ran out of credits before the job started".into(),
                node_id: None,
                class_type: None,
                traceback: None,
            })
        } else {
            self.engine(snapshot.deployment.as_deref()).ok_or_else(|| JobErrorRecord {
                code: JobErrorCode::DeploymentStopped,
                message: "the job's deployment was stopped before the job could run".into(),
                node_id: None,
                class_type: None,
                traceback: None,
            })
        };
        let kept = live.prepared.lock().take().map(|p| (p.text, p.plan));
        let prepared = match (engine, kept) {
            (Err(e), _) => Err(e),
            (Ok((_, executor)), Some(kept)) => Ok((kept, executor)),
            (Ok((registry, executor)), None) => self.prepare(&snapshot, &registry).await.map(|p| (p, executor)),
        };
        let outcome = match prepared {
            Ok(((prompt, plan), executor)) => {
                let total = plan.nodes.len() as u64;
                live.record.lock().progress = Some(ProgressSnapshot {
                    value: 0.0,
                    nodes_done: 0,
                    nodes_total: total,
                    current_node: None,
                    current_node_class: None,
                    step: None,
                    steps: None,
                    message: None,
                });
                let ctx = RunContext {
                    job_id: snapshot.id.clone(),
                    prompt,
                    extra_pnginfo: live.extra.extra_pnginfo.as_deref().cloned(),
                    inputs: Arc::new(JobInputs::new(&snapshot.inputs, self.blobs.clone())),
                    outputs: Arc::new(JobOutputs::new(self.blobs.clone(), live.pending_blobs.clone(), self.blob_gate.clone())),
                    events: self.sink(live.clone()),
                    cancel: live.cancel.clone(),
                    secrets: live.extra.secrets.clone(),
                    branches: self.branches.lock().as_ref().map(|rt| rt.handle().clone()),
                    budget: crate::budget::JobBudget::new(self.opts.job_limits),
                    // With accounts, results are never shared between them.
                    cache_scope: if self.opts.mode.has_accounts() { snapshot.owner.clone() } else { String::new() },
                    funds: self.opts.mode.has_accounts().then(|| {
                        let (accounts, billed) = (self.accounts.clone(), self.billed_account(&snapshot));
                        Arc::new(move || accounts.has_funds(&billed)) as crate::executor::FundsCheck
                    }),
                };
                let run = std::panic::AssertUnwindSafe(executor.run(&plan, ctx));
                futures_util::FutureExt::catch_unwind(run).await.map_err(|_| NotRun {
                    error: JobErrorRecord {
                        code: JobErrorCode::InternalError,
                        message: "the job's execution failed unexpectedly".into(),
                        node_id: None,
                        class_type: None,
                        traceback: None,
                    },
                    output_lost: true,
                })
            }
            Err(error) => {
                // It never started: the bus still shows it start and fail.
                self.bus.job(&Arc::from(snapshot.id.as_str()), &Arc::from(snapshot.owner.as_str()), ExecBody::Started { at_ms: bus::now_ms() });
                Err(NotRun { error, output_lost: false })
            }
        };
        self.finish(&live, outcome).await;
    }

    /// Loads and re-validates the job's workflow (plugins may have changed
    /// since it was submitted, e.g. across a restart).
    /// A job's plan and workflow text from the store (a job submitted
    /// before a restart, or whose parsed form the queued jobs' share could
    /// not keep): counted, then parsed and validated within the intake
    /// budget like a submission; the run keeps the text and the plan, not
    /// the parsed tree.
    async fn prepare(&self, job: &JobRecord, registry: &crate::plugins::NodeRegistry) -> Result<(Arc<str>, crate::workflow::Plan), JobErrorRecord> {
        let error = |code: JobErrorCode, message: String| JobErrorRecord { code, message, node_id: None, class_type: None, traceback: None };
        let bytes = match self.meta.get_workflow_bytes(&job.id) {
            Ok(Some(b)) => b,
            Ok(None) => return Err(error(JobErrorCode::InternalError, "the job's workflow is missing from the store".into())),
            Err(e) => return Err(error(JobErrorCode::InternalError, format!("cannot read the job's workflow: {e}"))),
        };
        let cost = crate::workflow::cost::count_values(&bytes, u64::MAX).unwrap_or_default();
        let _parsing = self.intake.enter(super::intake_estimate(cost)).await.map_err(|e| error(JobErrorCode::InvalidWorkflow, e.to_string()))?;
        let workflow: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|e| error(JobErrorCode::InternalError, format!("the job's stored workflow is unreadable: {e}")))?;
        let inputs = JobInputs::new(&job.inputs, self.blobs.clone());
        let plan = match submit::check(&workflow, registry, &inputs, &self.opts.workflow_limits) {
            Ok((_, plan)) => plan,
            Err(e) => return Err(error(JobErrorCode::InvalidWorkflow, e.to_string())),
        };
        let text = String::from_utf8(bytes).map_err(|_| error(JobErrorCode::InternalError, "the job's stored workflow is not UTF-8".into()))?;
        Ok((Arc::from(text), plan))
    }

    /// The executor's event sink for one job.
    fn sink(&self, live: Arc<LiveJob>) -> crate::executor::EventSink {
        let sink = JobSink::new(self.meta.clone(), self.bus.clone(), live);
        Arc::new(move |event: Event| sink.handle(event))
    }

    /// Records how the run ended and retires the live job. The terminal
    /// record is made durable (sled, then a synced commit-log frame with the
    /// output assets) before anyone can see it: until then the live record
    /// keeps its running state — a poll, a listing or an event stream never
    /// shows a job done that a crash could undo — and, marked finishing, it
    /// takes no other write (a cancel arriving now changes nothing). The
    /// record's lock is not held across this write, so a poll does not wait
    /// for it.
    async fn finish(&self, live: &Arc<LiveJob>, outcome: Result<RunOutcome, NotRun>) {
        if let Err(NotRun { error, .. }) = &outcome {
            let (id, owner) = {
                let rec = live.record.lock();
                (Arc::from(rec.id.as_str()), Arc::from(rec.owner.as_str()))
            };
            let body = ExecBody::Failed {
                node: error.node_id.clone(),
                class_type: error.class_type.clone(),
                code: error.code,
                message: error.message.clone(),
                executed: Vec::new(),
                at_ms: bus::now_ms(),
            };
            self.bus.job(&id, &owner, body);
        }
        let terminal = {
            let rec = live.record.lock();
            live.finishing.store(true, Ordering::SeqCst);
            let mut terminal = rec.clone();
            end_record(&mut terminal, outcome, live.expire_on_stop.load(Ordering::SeqCst), now_micros(), self.opts.job_log_bytes);
            terminal
        };
        let terminal = Arc::new(terminal);
        let assets = std::mem::take(&mut *live.output_assets.lock());
        // On this thread: the execution runtime's threads are there for
        // blocking job work, and a hand-off to the blocking pool and back
        // cost ~100 µs per job here (BENCHMARKS.md, session 7).
        let durable = self.meta.finish_job(&terminal, &assets);
        if let Err(e) = &durable {
            // Ended either way: a store failure only means a restart may run it again.
            tracing::error!(job_id = %terminal.id, error = %e, "cannot record the finished job");
        }
        // Served from memory from now on (the sweeper forgets it when it
        // expires it; a live job is never expired under it).
        self.remember_finished(terminal.clone(), None);
        *live.record.lock() = (*terminal).clone();
        // The one line per job at `info` (queued and running are `debug`).
        tracing::info!(
            job_id = %terminal.id,
            status = terminal.status.as_str(),
            queue_ms = terminal.queue_ms,
            execution_ms = terminal.execution_ms,
            error = terminal.error.as_ref().map(|e| e.code.as_str()),
            "job finished"
        );
        live.publish(JobEvent::Status(terminal.clone()));
        self.live.write().remove(&terminal.id);
        // On the bus, after the record is written: the queue changed, and
        // the job is over.
        self.publish_queue(&terminal.owner);
        self.bus.job(&Arc::from(terminal.id.as_str()), &Arc::from(terminal.owner.as_str()), ExecBody::Executing { node: None });
        // Its account pays for the time it executed (a job that never
        // started costs nothing). After it is shown finished, before this
        // worker takes its next job (which checks the balance).
        if self.opts.mode.has_accounts()
            && let Some(ms) = terminal.execution_ms
            && terminal.error.as_ref().is_none_or(|e| e.code != NO_CREDITS)
        {
            let billed = self.billed_account(&terminal);
            let balance = self.accounts.charge(&billed, u64::try_from(ms).unwrap_or(0));
            tracing::debug!(job_id = %terminal.id, owner = %terminal.owner, %billed, execution_ms = ms, ?balance, "job charged");
        }
    }
}

/// The JobError code of a job whose account had no credits left when its
/// turn came.
const NO_CREDITS: JobErrorCode = JobErrorCode::InsufficientCredits;

/// Turns one job's executor events into record updates, Jobs API stream
/// events and execution messages on the bus. Every method runs on the
/// executor's thread and must not block.
struct JobSink {
    meta: Arc<dyn crate::store::MetaStore>,
    bus: Arc<ExecBus>,
    live: Arc<LiveJob>,
    job_id: Arc<str>,
    owner: Arc<str>,
    /// What the bus's messages need to know of the run so far.
    run: Mutex<RunTrack>,
}

/// The run as the execution messages describe it.
#[derive(Default)]
struct RunTrack {
    /// Class of each node that started.
    classes: HashMap<String, String>,
    /// Nodes that ran, in order.
    executed: Vec<String>,
    /// Nodes running now, with their last step progress (value, max).
    running: HashMap<String, (f64, f64)>,
    /// When step progress last went on the bus.
    last_progress: Option<Instant>,
}

impl JobSink {
    fn new(meta: Arc<dyn crate::store::MetaStore>, bus: Arc<ExecBus>, live: Arc<LiveJob>) -> JobSink {
        let (job_id, owner) = {
            let rec = live.record.lock();
            (Arc::from(rec.id.as_str()), Arc::from(rec.owner.as_str()))
        };
        JobSink { meta, bus, live, job_id, owner, run: Mutex::new(RunTrack::default()) }
    }

    fn handle(&self, event: Event) {
        match event {
            Event::Started { .. } => self.started(),
            Event::Cached { nodes, overall } => self.cached(nodes, overall),
            Event::Executing { node, class_type } => self.executing(node, class_type),
            Event::Progress { node, step, steps, overall } => self.progress(node, step, steps, overall),
            Event::Executed { node, .. } => self.executed(node),
            Event::Output { node, files, .. } => self.output(node, files),
            Event::Preview { node, image } => self.preview(node, &image),
            Event::Text { node, text } => self.publish(ExecBody::Text { node, text }),
            Event::Succeeded { .. } => self.publish(ExecBody::Succeeded { at_ms: bus::now_ms() }),
            Event::Failed { node, class_type, failure, .. } => self.failed(node, class_type, &failure),
            Event::Interrupted { node, .. } => self.interrupted(node),
        }
    }

    fn publish(&self, body: ExecBody) {
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
        {
            let mut run = self.run.lock();
            run.running.insert(node.clone(), (0.0, 1.0));
            run.classes.insert(node.clone(), class_type.clone());
        }
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

    fn executed(&self, node: String) {
        {
            let mut run = self.run.lock();
            run.running.remove(&node);
            run.executed.push(node.clone());
        }
        self.node_state(&node, 1.0, 1.0, NodeRunState::Finished);
        update_progress(
            &self.live,
            |p| {
                p.nodes_done += 1;
                (p.step, p.steps) = (None, None);
            },
            false,
        );
    }

    /// Output files become asset records (and outputs of the live record);
    /// on the bus, a cached output node is also finished.
    fn output(&self, node: String, files: Vec<crate::files::SavedFile>) {
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
            if let Err(e) = self.meta.put_asset(&asset) {
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
        let cached = !self.run.lock().running.contains_key(&node);
        if !files.is_empty() {
            self.publish(ExecBody::Output { node: node.clone(), files });
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
        if due && let Some(png) = super::preview::encode(image) {
            let data = Arc::new(png);
            self.publish(ExecBody::Preview { node: node.clone(), content_type: "image/png", data: data.clone() });
            let event = JobEvent::Preview { node_id: node, content_type: "image/png".into(), data };
            *live.last_preview.lock() = Some(event.clone());
            live.publish(event);
        }
    }

    fn failed(&self, node: String, class_type: String, failure: &crate::plugins::NodeFailure) {
        let executed = self.run.lock().executed.clone();
        let (node, class_type) = (Some(node).filter(|n| !n.is_empty()), Some(class_type).filter(|c| !c.is_empty()));
        let body = ExecBody::Failed { node, class_type, code: failure_code(failure.kind), message: failure.message.clone(), executed, at_ms: bus::now_ms() };
        self.publish(body);
    }

    fn interrupted(&self, node: Option<String>) {
        let (class_type, executed) = {
            let run = self.run.lock();
            (node.as_ref().and_then(|n| run.classes.get(n).cloned()), run.executed.clone())
        };
        self.publish(ExecBody::Interrupted { node, class_type, executed, at_ms: bus::now_ms() });
    }
}

/// A job that did not run to an outcome: it could not be prepared, or the
/// host failed mid-run (`output_lost`: what its nodes printed is gone).
struct NotRun {
    error: JobErrorRecord,
    output_lost: bool,
}

/// Sets the terminal state of a job record from how its run ended.
fn end_record(rec: &mut JobRecord, outcome: Result<RunOutcome, NotRun>, expired: bool, now: Micros, log_limit: usize) {
    let canceling = rec.status == JobStatus::Canceling;
    match outcome {
        Ok(outcome) => {
            match outcome.status {
                RunStatus::Succeeded => {
                    rec.status = JobStatus::Succeeded;
                    if let Some(p) = rec.progress.as_mut() {
                        (p.value, p.nodes_done, p.step, p.steps) = (1.0, p.nodes_total, None, None);
                    }
                }
                RunStatus::Failed { node, class_type, failure } => {
                    rec.status = JobStatus::Failed;
                    rec.error = Some(JobErrorRecord {
                        code: failure_code(failure.kind),
                        message: failure.message,
                        node_id: Some(node),
                        class_type: Some(class_type),
                        traceback: None,
                    });
                }
                RunStatus::Interrupted => rec.status = JobStatus::Canceled,
            }
            rec.logs = Some(log_record(outcome.log, outcome.log_truncated, now, log_limit));
        }
        Err(NotRun { error, output_lost }) => {
            rec.status = JobStatus::Failed;
            // An empty log: nothing ran, or what ran was lost (shed).
            rec.logs = Some(JobLogRecord { text: String::new(), truncated: output_lost, captured_at: now });
            rec.error = Some(error);
        }
    }
    // A cancel request wins over however the run ended (canceling →
    // canceled is the only way out), and retention over both.
    if canceling {
        rec.status = JobStatus::Canceled;
        rec.error = None;
    }
    if expired {
        rec.status = JobStatus::Expired;
    }
    rec.completed_at = Some(now);
    rec.updated_at = now;
    rec.execution_ms = rec.started_at.map(|s| (now - s) / 1000);
}

/// The job log: the tail of the plugins' output when it is longer than
/// `limit` bytes; `truncated` when any of it was shed (here or in a node's
/// own log).
fn log_record(mut text: String, node_truncated: bool, now: Micros, limit: usize) -> JobLogRecord {
    let cut = text.len() > limit;
    if cut {
        let mut at = text.len() - limit;
        while !text.is_char_boundary(at) {
            at += 1;
        }
        text.drain(..at);
    }
    JobLogRecord { text, truncated: cut || node_truncated, captured_at: now }
}

/// Applies `f` to the job's progress and sends a frame unless one went out
/// less than [`PROGRESS_INTERVAL`] ago. `value` is the executor's; this only
/// keeps it within the spec's 0..=1.
fn update_progress(live: &LiveJob, f: impl FnOnce(&mut ProgressSnapshot), force: bool) {
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
        LiveJob::new(record, ExtraData::default())
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

    #[test]
    fn long_logs_keep_their_tail() {
        const LIMIT: usize = 1 << 20;
        let text = format!("{}end", "x".repeat(LIMIT + 10));
        let log = log_record(text, false, 7, LIMIT);
        assert!(log.truncated && log.text.len() == LIMIT && log.text.ends_with("end"));
        let short = log_record("ok".into(), false, 7, LIMIT);
        assert!(!short.truncated && short.text == "ok");
        assert!(log_record("ok".into(), true, 7, LIMIT).truncated, "a node's own log was cut");
        // A multi-byte character on the cut is dropped whole.
        let cut = log_record("é".repeat(10), false, 7, 5);
        assert!(cut.truncated && cut.text == "éé", "{:?}", cut.text);
        // A limit of 0 sheds everything: truncated with empty text.
        let shed = log_record("abc".into(), false, 7, 0);
        assert!(shed.truncated && shed.text.is_empty());
    }
}
