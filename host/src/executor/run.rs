//! One run of a plan: cached results served, the rest scheduled and called,
//! events emitted, results dropped as soon as nothing will read them.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::scheduler::{Scheduler, may_start};
use super::{CacheKey, CachedResult, Event, Executor, RunContext, RunOutcome, RunStatus};
use crate::files::SavedFile;
use crate::plugins::node::HiddenInput;
use crate::plugins::runtime::CapturedLog;
use crate::plugins::{FailureKind, NodeFailure, NodeIo, NodeOutput, NodeSignal};
use crate::value::Value;
use crate::workflow::{Plan, PlannedInput, PlannedNode};

/// Per-run progress: the one source of the numbers every surface shows.
/// `overall` weighs nodes equally and a running node by the steps it
/// reported; it never goes back (parallel branches report in any order).
pub(super) struct Progress {
    total: usize,
    done: usize,
    running: HashMap<String, f64>,
    shown: f64,
}

impl Progress {
    fn overall(&mut self) -> f64 {
        let now = if self.total == 0 { 1.0 } else { ((self.done as f64 + self.running.values().sum::<f64>()) / self.total as f64).min(1.0) };
        self.shown = self.shown.max(now);
        self.shown
    }
}

/// A node's id, its result and how long it ran (ms).
type NodeResult = (String, Result<NodeOutput, NodeFailure>, f64);
type NodeCall = Pin<Box<dyn Future<Output = NodeResult> + Send>>;

/// The state of one run.
pub(super) struct Run<'a> {
    executor: &'a Executor,
    plan: &'a Plan,
    ctx: &'a RunContext,
    keys: HashMap<String, CacheKey>,
    /// Results that some node has yet to read.
    results: HashMap<String, Arc<CachedResult>>,
    /// Files of the output nodes, for the outcome.
    saved: HashMap<String, Vec<SavedFile>>,
    cached: Vec<String>,
    executed: Vec<String>,
    log: String,
    log_truncated: bool,
    progress: Arc<Mutex<Progress>>,
    /// The workflow text for `prompt` hidden inputs, rendered once.
    prompt_text: Arc<str>,
}

impl<'a> Run<'a> {
    pub(super) fn new(executor: &'a Executor, plan: &'a Plan, ctx: &'a RunContext) -> Run<'a> {
        let keys = executor.cache_keys(plan, ctx);
        let progress = Progress { total: plan.nodes.len(), done: 0, running: HashMap::new(), shown: 0.0 };
        Run {
            executor,
            plan,
            ctx,
            keys,
            results: HashMap::new(),
            saved: HashMap::new(),
            cached: Vec::new(),
            executed: Vec::new(),
            log: String::new(),
            log_truncated: false,
            progress: Arc::new(Mutex::new(progress)),
            prompt_text: ctx.prompt.clone(),
        }
    }

    fn emit(&self, event: Event) {
        (self.ctx.events)(event)
    }

    pub(super) async fn execute(mut self) -> RunOutcome {
        self.emit(Event::Started { job_id: self.ctx.job_id.clone() });
        self.serve_cached();
        let status = self.schedule().await;
        match &status {
            RunStatus::Succeeded => self.emit(Event::Succeeded { job_id: self.ctx.job_id.clone() }),
            RunStatus::Failed { node, class_type, failure } => self.emit(Event::Failed {
                job_id: self.ctx.job_id.clone(),
                node: node.clone(),
                class_type: class_type.clone(),
                failure: failure.clone(),
                executed: self.executed.clone(),
            }),
            RunStatus::Interrupted => {
                let node = self.progress.lock().running.keys().next().cloned();
                let class_type = node.as_ref().and_then(|id| self.plan.nodes.iter().find(|n| &n.id == id)).map(|n| n.class_type.clone());
                self.emit(Event::Interrupted { job_id: self.ctx.job_id.clone(), node, class_type, executed: self.executed.clone() })
            }
        }
        let outputs = self.plan.outputs.iter().filter_map(|id| self.saved.get(id).map(|files| (id.clone(), files.clone()))).collect();
        RunOutcome { status, outputs, cached: self.cached, executed: self.executed, log: self.log, log_truncated: self.log_truncated }
    }

    /// Takes the results the cache holds. A cached output node's files are
    /// taken over by this job first: one whose files are gone (collected
    /// since) is not a hit and runs again.
    fn serve_cached(&mut self) {
        let cache = &self.executor.cache;
        for node in &self.plan.nodes {
            let Some(key) = self.keys.get(&node.id) else { continue };
            let Some(hit) = cache.get(key) else { continue };
            if !hit.saved.iter().all(|f| self.ctx.outputs.adopt(f)) {
                cache.remove(key);
                continue;
            }
            if self.plan.outputs.contains(&node.id) {
                self.saved.insert(node.id.clone(), hit.saved.clone());
            }
            self.results.insert(node.id.clone(), hit);
            self.cached.push(node.id.clone());
        }
        let overall = {
            let mut p = self.progress.lock();
            p.done = self.cached.len();
            p.overall()
        };
        self.emit(Event::Cached { nodes: self.cached.clone(), overall });
        for id in &self.cached {
            if let Some(files) = self.saved.get(id) {
                let class_type = self.plan.node(id).map(|n| n.class_type.clone()).unwrap_or_default();
                self.emit(Event::Output { node: id.clone(), class_type, files: files.clone(), cached: true });
            }
        }
    }

    /// Starts nodes as they become ready and may start, and takes their
    /// results, until all ran, one failed or the run was cancelled.
    ///
    /// A node refused by the job's memory bound while other nodes ran beside
    /// it is not a verdict on the job: the others may have held what it
    /// needed. It runs again, alone, and the run goes on one node at a time;
    /// refused when alone, the job fails.
    async fn schedule(&mut self) -> RunStatus {
        let plan = self.plan;
        let mut sched = Scheduler::new(plan, |id| self.results.contains_key(id));
        let mut tasks: JoinSet<NodeResult> = JoinSet::new();
        let run_cancel = self.ctx.cancel.child_token();
        let budget = self.ctx.budget.clone();
        let mut running: HashSet<&str> = HashSet::new();
        let mut overlapped: HashSet<&str> = HashSet::new();
        let mut retried: HashSet<&str> = HashSet::new();
        let mut concurrency = self.executor.concurrency;
        let status = 'run: loop {
            let mut inline = None;
            while sched.has_ready() && may_start(tasks.len(), concurrency, budget.memory_in_use(), budget.limits().memory_bytes) {
                let Some(id) = sched.take_ready() else { break };
                let Some(node) = plan.node(id) else { continue };
                let call = match self.start(node, &run_cancel) {
                    Ok(call) => call,
                    Err(failure) => break 'run RunStatus::Failed { node: node.id.clone(), class_type: node.class_type.clone(), failure },
                };
                if !running.is_empty() {
                    overlapped.extend(running.iter().copied());
                    overlapped.insert(id);
                }
                running.insert(id);
                // A lone runnable node (a chain) runs in this task: handing it
                // to another worker thread and back costs more than most nodes.
                if tasks.is_empty() && !sched.has_ready() {
                    inline = Some(call);
                    break;
                }
                match &self.ctx.branches {
                    Some(runtime) => tasks.spawn_on(call, runtime),
                    None => tasks.spawn(call),
                };
            }
            let (id, result, elapsed_ms) = match next_result(inline, &mut tasks).await {
                Some(Ok(joined)) => joined,
                Some(Err(failed)) => break failed,
                None => break RunStatus::Succeeded,
            };
            let Some(node) = plan.node(&id) else { continue };
            let id = node.id.as_str();
            running.remove(id);
            match result {
                Ok(output) => {
                    self.completed(node, output, elapsed_ms, sched.is_unread(id));
                    for unread in sched.read_done(id) {
                        self.drop_result(unread);
                    }
                    sched.finished(id);
                }
                Err(failure) if failure.kind == FailureKind::JobOutOfMemory && overlapped.contains(id) && retried.insert(id) => {
                    tracing::debug!(node_id = id, "job memory refused a node running beside others: running it again alone");
                    self.progress.lock().running.remove(id);
                    concurrency = 1;
                    sched.requeue(id);
                }
                Err(failure) => {
                    append_log(&mut self.log, &mut self.log_truncated, id, &node.class_type, &failure.log);
                    break if failure.kind == FailureKind::Interrupted {
                        RunStatus::Interrupted
                    } else {
                        RunStatus::Failed { node: id.to_string(), class_type: node.class_type.clone(), failure }
                    };
                }
            }
        };
        // Stop whatever still runs (a failure elsewhere, or cancellation).
        run_cancel.cancel();
        while tasks.join_next().await.is_some() {}
        if self.ctx.cancel.is_cancelled() && matches!(status, RunStatus::Succeeded) {
            return RunStatus::Interrupted;
        }
        status
    }

    /// Prepares the call of `node`: its plugin, inputs and services.
    fn start(&mut self, node: &PlannedNode, cancel: &CancellationToken) -> Result<NodeCall, NodeFailure> {
        let failed = |message: String| NodeFailure { kind: FailureKind::Failed, message, log: Default::default() };
        // Validated against the same registry, so only a host bug gets here;
        // never skip a planned node and call the run a success.
        let Some((plugin, _)) = self.ctx.registry.get(&node.class_type) else {
            return Err(failed(format!("node class `{}` is not provided by any loaded plugin", node.class_type)));
        };
        // An API node spends money at a partner: not for an account
        // without funds (InsufficientFundsError on the compatibility API).
        let paid = self.ctx.registry.meta(&node.class_type).is_some_and(|m| m.api_node);
        if paid && self.ctx.funds.as_ref().is_some_and(|has_funds| !has_funds()) {
            let message = format!("`{}` is an API node and the account has no credits left", node.class_type);
            return Err(NodeFailure { kind: FailureKind::InsufficientFunds, message, log: Default::default() });
        }
        let inputs = self.resolve_inputs(node).map_err(failed)?;
        self.emit(Event::Executing { node: node.id.clone(), class_type: node.class_type.clone() });
        self.progress.lock().running.insert(node.id.clone(), 0.0);
        let io = self.node_io(&node.id);
        let (runtime, plugin, class, node_id, cancel) =
            (self.executor.runtime.clone(), plugin.clone(), node.class_type.clone(), node.id.clone(), cancel.clone());
        let span = tracing::info_span!("node", node_id = %node_id, class_type = %class);
        Ok(Box::pin(
            async move {
                let started = Instant::now();
                let result = runtime.execute(&plugin, &class, &inputs, io, &cancel).await;
                let elapsed_ms = started.elapsed().as_secs_f64() * 1e3;
                // In the node's span (inside the job's): the line names both.
                match &result {
                    Ok(_) => tracing::debug!(elapsed_ms, "node done"),
                    Err(f) if f.kind == FailureKind::Interrupted => tracing::debug!(elapsed_ms, "node interrupted"),
                    // Escaped (newlines as `\n`): a plugin's message cannot forge log lines.
                    Err(f) => tracing::info!(kind = ?f.kind, error = %f.message.escape_debug(), elapsed_ms, "node failed"),
                }
                (node_id, result, elapsed_ms)
            }
            .instrument(span),
        ))
    }

    /// Records a node that ran: its result (kept only if a node will read
    /// it), the cache, its files and the events.
    fn completed(&mut self, node: &PlannedNode, output: NodeOutput, elapsed_ms: f64, unread: bool) {
        let id = &node.id;
        append_log(&mut self.log, &mut self.log_truncated, id, &node.class_type, &output.log);
        let on_gpu = output.on_gpu;
        let result = Arc::new(CachedResult { values: output.values, saved: output.saved });
        if let Some(key) = self.keys.get(id) {
            self.executor.cache.put(*key, result.clone());
        }
        let is_output = self.plan.outputs.contains(id);
        if !result.saved.is_empty() || is_output {
            self.emit(Event::Output { node: id.clone(), class_type: node.class_type.clone(), files: result.saved.clone(), cached: false });
        }
        if is_output {
            self.saved.insert(id.clone(), result.saved.clone());
        }
        self.executed.push(id.clone());
        let (nodes_done, overall) = {
            let mut p = self.progress.lock();
            p.running.remove(id);
            p.done += 1;
            (p.done as u64, p.overall())
        };
        self.emit(Event::Executed { node: id.clone(), class_type: node.class_type.clone(), elapsed_ms, on_gpu, nodes_done });
        self.emit(Event::Progress { node: id.clone(), step: 1, steps: 1, overall });
        if unread {
            self.release(id, result);
        } else {
            self.results.insert(id.clone(), result);
        }
    }

    /// Drops a result no node will read again.
    fn drop_result(&mut self, id: &str) {
        if let Some(result) = self.results.remove(id) {
            self.release(id, result);
        }
    }

    /// Lets go of `result`: what the cache keeps is the cache's to bound
    /// from now on (its tensors no longer count against this job); the rest
    /// is freed with the last handle (a running reader may hold one).
    fn release(&self, id: &str, result: Arc<CachedResult>) {
        let adopted = self.keys.get(id).is_some_and(|k| self.executor.cache.holds(k, &result));
        if adopted {
            for value in &result.values {
                if let Value::Tensor(t) = value {
                    t.release_charge();
                }
            }
        }
    }

    fn resolve_inputs(&self, node: &PlannedNode) -> Result<Vec<(String, Value)>, String> {
        node.inputs
            .iter()
            .map(|(name, input)| {
                let value = match input {
                    PlannedInput::Const(v) => v.clone(),
                    PlannedInput::Link { node: up, output } => self
                        .results
                        .get(up)
                        .and_then(|r| r.values.get(*output as usize))
                        .cloned()
                        .ok_or_else(|| format!("input `{name}`: node {up} produced no output {output}"))?,
                    PlannedInput::Hidden(HiddenInput::Prompt) => Value::String(self.prompt_text.to_string()),
                    PlannedInput::Hidden(HiddenInput::ExtraPnginfo) => {
                        Value::String(self.ctx.extra_pnginfo.as_ref().map_or_else(|| "null".to_string(), |v| v.to_string()))
                    }
                    PlannedInput::Hidden(HiddenInput::UniqueId) => Value::String(node.id.clone()),
                };
                Ok((name.clone(), value))
            })
            .collect()
    }

    fn node_io(&self, node_id: &str) -> NodeIo {
        let (events, progress, node) = (self.ctx.events.clone(), self.progress.clone(), node_id.to_string());
        NodeIo {
            inputs: self.ctx.inputs.clone(),
            outputs: self.ctx.outputs.clone(),
            secrets: self.ctx.secrets.clone(),
            budget: self.ctx.budget.clone(),
            cache_key: self.keys.get(node_id).copied(),
            signals: Arc::new(move |signal| match signal {
                NodeSignal::Progress { step, steps } => {
                    let overall = {
                        let mut p = progress.lock();
                        p.running.insert(node.clone(), step as f64 / steps as f64);
                        p.overall()
                    };
                    events(Event::Progress { node: node.clone(), step, steps, overall });
                }
                NodeSignal::Preview(image) => events(Event::Preview { node: node.clone(), image }),
                NodeSignal::Text(text) => events(Event::Text { node: node.clone(), text }),
            }),
        }
    }
}

/// What a node call returned: the inline call's result (run here), or the
/// next task's to finish; `None` when nothing runs. A host bug that
/// panicked inside a node task fails this run only.
async fn next_result(inline: Option<NodeCall>, tasks: &mut JoinSet<NodeResult>) -> Option<Result<NodeResult, RunStatus>> {
    let joined: Result<_, String> = match inline {
        Some(call) => futures_util::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(call)).await.map_err(|_| "node call panicked".to_string()),
        None => tasks.join_next().await?.map_err(|e| e.to_string()),
    };
    Some(joined.map_err(|e| {
        tracing::error!(error = %e, "node task panicked");
        let failure = NodeFailure { kind: FailureKind::Crashed, message: "internal error while running a node".into(), log: Default::default() };
        RunStatus::Failed { node: String::new(), class_type: String::new(), failure }
    }))
}

fn append_log(log: &mut String, truncated: &mut bool, node: &str, class_type: &str, captured: &CapturedLog) {
    use std::fmt::Write;
    *truncated |= captured.truncated;
    for line in captured.text.lines() {
        let _ = writeln!(log, "[{node} {class_type}] {line}");
    }
}
