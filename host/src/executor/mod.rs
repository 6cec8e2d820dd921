//! Running a validated workflow.
//!
//! The executor computes every planned node's cache key up front (keys depend
//! only on constants, file contents and upstream keys), reports the nodes the
//! cache already holds, then runs the rest in dependency order — independent
//! branches in parallel, up to the configured concurrency — each node on its
//! own tokio task through the plugin runtime. The first failure stops the run
//! (ComfyUI's behaviour); cancellation interrupts the running nodes at once.

pub mod cache;
pub mod events;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

pub use cache::{CacheKey, CachedResult, ResultCache};
pub use events::{Event, EventSink};

use crate::files::{InputFiles, OutputFiles, SavedFile};
use crate::plugins::node::{ComboSource, HiddenInput, InputKind};
use crate::plugins::{FailureKind, NodeFailure, NodeIo, NodeRegistry, NodeSignal, PluginRuntime};
use crate::value::Value;
use crate::workflow::{Plan, PlannedInput};

/// Everything one run needs besides the plan.
pub struct RunContext {
    pub job_id: String,
    /// The workflow JSON, for the `prompt` hidden input.
    pub prompt: Arc<serde_json::Value>,
    /// `extra_data.extra_pnginfo`, for the `extra_pnginfo` hidden input.
    pub extra_pnginfo: Option<serde_json::Value>,
    pub inputs: Arc<dyn InputFiles>,
    pub outputs: Arc<dyn OutputFiles>,
    pub events: EventSink,
    pub cancel: CancellationToken,
    /// The request's secrets (`extra_data.api_key_svc_org`): held for the
    /// run only, never stored; each node reads what its plugin was granted.
    pub secrets: crate::plugins::JobSecrets,
    /// Where nodes of parallel branches run; `None`: the current runtime. (A
    /// lone runnable node always runs in the run's own task.)
    pub branches: Option<tokio::runtime::Handle>,
}

/// How a run ended.
#[derive(Debug, Clone)]
pub enum RunStatus {
    Succeeded,
    Failed { node: String, class_type: String, failure: NodeFailure },
    Interrupted,
}

/// The result of a run.
#[derive(Debug, Clone)]
pub struct RunOutcome {
    pub status: RunStatus,
    /// Files saved per output node, in plan order (cached ones included).
    pub outputs: Vec<(String, Vec<SavedFile>)>,
    /// Nodes served from the cache.
    pub cached: Vec<String>,
    /// Nodes that ran.
    pub executed: Vec<String>,
    /// The plugins' stdout and stderr, prefixed by node.
    pub log: String,
    /// A node's output was longer than its log and only its tail is in `log`.
    pub log_truncated: bool,
}

/// Runs plans against a registry of plugins, sharing one result cache.
pub struct Executor {
    runtime: Arc<PluginRuntime>,
    registry: Arc<NodeRegistry>,
    cache: ResultCache,
    concurrency: usize,
}

/// The distinct nodes whose outputs `id` reads.
fn upstreams<'p>(plan: &'p Plan, id: &str) -> Vec<&'p str> {
    let mut ups: Vec<&str> = plan
        .node(id)
        .map(|n| {
            n.inputs
                .iter()
                .filter_map(|(_, i)| match i {
                    PlannedInput::Link { node, .. } => Some(node.as_str()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    ups.sort_unstable();
    ups.dedup();
    ups
}

/// Per-run progress bookkeeping (host-computed progress).
struct Progress {
    total: usize,
    done: usize,
    running: HashMap<String, f64>,
}

impl Progress {
    fn overall(&self) -> f64 {
        if self.total == 0 {
            return 1.0;
        }
        ((self.done as f64 + self.running.values().sum::<f64>()) / self.total as f64).min(1.0)
    }
}

impl Executor {
    /// An executor with a result cache of `cache_bytes` running up to
    /// `concurrency` nodes at once.
    pub fn new(runtime: Arc<PluginRuntime>, registry: Arc<NodeRegistry>, cache_bytes: u64, concurrency: usize) -> Executor {
        Executor { runtime, registry, cache: ResultCache::new(cache_bytes), concurrency: concurrency.max(1) }
    }

    /// The node registry.
    pub fn registry(&self) -> &Arc<NodeRegistry> {
        &self.registry
    }

    /// The result cache.
    pub fn cache(&self) -> &ResultCache {
        &self.cache
    }

    /// Runs `plan` to completion, failure or cancellation.
    pub async fn run(&self, plan: &Plan, ctx: RunContext) -> RunOutcome {
        let span = tracing::info_span!("job", job_id = %ctx.job_id);
        self.run_inner(plan, ctx).instrument(span).await
    }

    async fn run_inner(&self, plan: &Plan, ctx: RunContext) -> RunOutcome {
        let emit = |e: Event| (ctx.events)(e);
        emit(Event::Started { job_id: ctx.job_id.clone() });
        let keys = self.cache_keys(plan, ctx.inputs.as_ref(), &ctx.secrets);
        let mut results: HashMap<String, Arc<CachedResult>> = HashMap::new();
        let mut cached = Vec::new();
        for node in &plan.nodes {
            if let Some(hit) = keys.get(&node.id).and_then(|k| self.cache.get(k)) {
                results.insert(node.id.clone(), hit);
                cached.push(node.id.clone());
            }
        }
        if !cached.is_empty() {
            emit(Event::Cached { nodes: cached.clone() });
        }
        for id in &cached {
            if plan.outputs.contains(id) {
                let node = plan.node(id).map(|n| n.class_type.clone()).unwrap_or_default();
                emit(Event::Output { node: id.clone(), class_type: node, files: results[id].saved.clone(), cached: true });
            }
        }

        // Dependency counts among the nodes that must run.
        let to_run: Vec<&str> = plan.nodes.iter().filter(|n| !results.contains_key(&n.id)).map(|n| n.id.as_str()).collect();
        let mut waiting: HashMap<&str, usize> = HashMap::new();
        let mut dependents: HashMap<&str, Vec<&str>> = HashMap::new();
        // How many nodes still have to read each result: a result nobody
        // will read again is dropped from the run (the cross-run cache keeps
        // its own bounded copy), so a long chain holds one tensor, not all.
        let mut readers: HashMap<&str, usize> = HashMap::new();
        for id in &to_run {
            let ups = upstreams(plan, id);
            for &up in &ups {
                *readers.entry(up).or_default() += 1;
            }
            let pending: Vec<&str> = ups.into_iter().filter(|up| !results.contains_key(*up)).collect();
            waiting.insert(id, pending.len());
            for up in pending {
                dependents.entry(up).or_default().push(id);
            }
        }
        let mut ready: Vec<&str> = to_run.iter().copied().filter(|id| waiting[id] == 0).collect();
        ready.reverse(); // pop() takes them in plan order
        let progress = Arc::new(Mutex::new(Progress { total: to_run.len(), done: 0, running: HashMap::new() }));
        let mut tasks: JoinSet<(String, Result<crate::plugins::NodeOutput, NodeFailure>, f64)> = JoinSet::new();
        let mut executed = Vec::new();
        let mut log = String::new();
        let mut log_truncated = false;
        let mut status = RunStatus::Succeeded;
        let run_cancel = ctx.cancel.child_token();

        'run: loop {
            let mut inline = None;
            while tasks.len() < self.concurrency
                && let Some(id) = ready.pop()
            {
                let Some(node) = plan.node(id) else { continue };
                let Some((plugin, _)) = self.registry.get(&node.class_type) else { continue };
                let inputs = match self.resolve_inputs(node, &results, &ctx) {
                    Ok(i) => i,
                    Err(message) => {
                        status = RunStatus::Failed {
                            node: node.id.clone(),
                            class_type: node.class_type.clone(),
                            failure: NodeFailure { kind: FailureKind::Failed, message, log: Default::default() },
                        };
                        break 'run;
                    }
                };
                for up in upstreams(plan, &node.id) {
                    let left = readers.get_mut(up).map(|n| {
                        *n -= 1;
                        *n
                    });
                    if left == Some(0) && !plan.outputs.iter().any(|o| o == up) {
                        results.remove(up);
                    }
                }
                emit(Event::Executing { node: node.id.clone(), class_type: node.class_type.clone() });
                progress.lock().running.insert(node.id.clone(), 0.0);
                let io = self.node_io(&node.id, keys.get(&node.id).copied(), &ctx, &progress);
                let (runtime, plugin, class, node_id, cancel) =
                    (self.runtime.clone(), plugin.clone(), node.class_type.clone(), node.id.clone(), run_cancel.clone());
                let span = tracing::info_span!("node", node_id = %node_id, class_type = %class);
                let call = async move {
                    let started = Instant::now();
                    let result = runtime.execute(&plugin, &class, &inputs, io, &cancel).await;
                    let elapsed_ms = started.elapsed().as_secs_f64() * 1e3;
                    // In the node's span (inside the job's): the line names both.
                    match &result {
                        Ok(_) => tracing::debug!(elapsed_ms, "node done"),
                        Err(f) if f.kind == FailureKind::Interrupted => tracing::debug!(elapsed_ms, "node interrupted"),
                        // Debug-quoted: a plugin's message cannot forge log lines.
                        Err(f) => tracing::info!(kind = ?f.kind, message = ?f.message, elapsed_ms, "node failed"),
                    }
                    (node_id, result, elapsed_ms)
                }
                .instrument(span);
                // A lone runnable node (a chain) runs in this task: handing it
                // to another worker thread and back costs more than most nodes.
                if tasks.is_empty() && ready.is_empty() {
                    inline = Some(call);
                    break;
                }
                match &ctx.branches {
                    Some(runtime) => tasks.spawn_on(call, runtime),
                    None => tasks.spawn(call),
                };
            }
            let joined: Result<_, String> = match inline {
                Some(call) => futures_util::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(call)).await.map_err(|_| "node call panicked".to_string()),
                None => match tasks.join_next().await {
                    Some(joined) => joined.map_err(|e| e.to_string()),
                    None => break,
                },
            };
            let (id, result, elapsed_ms) = match joined {
                Ok(r) => r,
                Err(e) => {
                    // A host bug panicked inside a node task: fail this run only.
                    tracing::error!(error = %e, "node task panicked");
                    status = RunStatus::Failed {
                        node: String::new(),
                        class_type: String::new(),
                        failure: NodeFailure { kind: FailureKind::Crashed, message: "internal error while running a node".into(), log: Default::default() },
                    };
                    break;
                }
            };
            let Some(node) = plan.node(&id) else { continue };
            match result {
                Ok(output) => {
                    append_log(&mut log, &mut log_truncated, &id, &node.class_type, &output.log);
                    let result = Arc::new(CachedResult { values: output.values, saved: output.saved });
                    if let Some(key) = keys.get(&id) {
                        self.cache.put(*key, result.clone());
                    }
                    if !result.saved.is_empty() || plan.outputs.contains(&id) {
                        emit(Event::Output { node: id.clone(), class_type: node.class_type.clone(), files: result.saved.clone(), cached: false });
                    }
                    results.insert(id.clone(), result);
                    executed.push(id.clone());
                    emit(Event::Executed { node: id.clone(), class_type: node.class_type.clone(), elapsed_ms });
                    let overall = {
                        let mut p = progress.lock();
                        p.running.remove(&id);
                        p.done += 1;
                        p.overall()
                    };
                    emit(Event::Progress { node: id.clone(), step: 1, steps: 1, overall });
                    for dep in dependents.get(id.as_str()).into_iter().flatten() {
                        if let Some(w) = waiting.get_mut(dep) {
                            *w -= 1;
                            if *w == 0 {
                                ready.push(dep);
                            }
                        }
                    }
                }
                Err(failure) => {
                    append_log(&mut log, &mut log_truncated, &id, &node.class_type, &failure.log);
                    status = if failure.kind == FailureKind::Interrupted {
                        RunStatus::Interrupted
                    } else {
                        RunStatus::Failed { node: id.clone(), class_type: node.class_type.clone(), failure }
                    };
                    break;
                }
            }
        }
        // Stop whatever still runs (a failure elsewhere, or cancellation).
        run_cancel.cancel();
        while tasks.join_next().await.is_some() {}
        if ctx.cancel.is_cancelled() && matches!(status, RunStatus::Succeeded) {
            status = RunStatus::Interrupted;
        }
        match &status {
            RunStatus::Succeeded => emit(Event::Succeeded { job_id: ctx.job_id.clone() }),
            RunStatus::Failed { node, class_type, failure } => {
                emit(Event::Failed { job_id: ctx.job_id.clone(), node: node.clone(), class_type: class_type.clone(), failure: failure.clone() })
            }
            RunStatus::Interrupted => {
                let node = progress.lock().running.keys().next().cloned();
                emit(Event::Interrupted { job_id: ctx.job_id.clone(), node })
            }
        }
        let outputs = plan.outputs.iter().filter_map(|id| results.get(id).map(|r| (id.clone(), r.saved.clone()))).collect();
        RunOutcome { status, outputs, cached, executed, log, log_truncated }
    }

    /// The cache key of every planned node, in plan order. A node whose
    /// plugin reads secrets is keyed by them too (see `JobSecrets::cache_salt`);
    /// a nondeterministic one by a fresh random value (see `plugins::determinism`).
    fn cache_keys(&self, plan: &Plan, files: &dyn InputFiles, secrets: &crate::plugins::JobSecrets) -> HashMap<String, CacheKey> {
        let mut keys: HashMap<String, CacheKey> = HashMap::new();
        for node in &plan.nodes {
            let Some((plugin, def)) = self.registry.get(&node.class_type) else { continue };
            let mut key = cache::KeyBuilder::new(&node.class_type, &plugin.component_hash);
            let granted = &plugin.manifest.capabilities.secrets;
            if !granted.is_empty() {
                key.salt("secrets", &secrets.cache_salt(granted));
            }
            // A fresh key per run: never served from the cache, nor is anything downstream.
            if !plugin.is_deterministic(&node.class_type) {
                key.salt("nondeterministic", &uuid::Uuid::new_v4().to_string());
            }
            let mut complete = true;
            for (name, input) in &node.inputs {
                match input {
                    PlannedInput::Const(Value::String(s)) if is_file_input(def, name) => {
                        key.constant(name, &Value::String(s.clone()));
                        key.file(name, files.content_hash(s));
                    }
                    PlannedInput::Const(v) => key.constant(name, v),
                    PlannedInput::Link { node: up, output } => match keys.get(up) {
                        Some(up_key) => key.link(name, up_key, *output),
                        None => complete = false,
                    },
                    PlannedInput::Hidden(HiddenInput::UniqueId) => key.salt(name, &node.id),
                    // The workflow text and PNG info are metadata: ComfyUI does
                    // not re-run a node because they changed.
                    PlannedInput::Hidden(_) => {}
                }
            }
            if complete {
                keys.insert(node.id.clone(), key.finish());
            }
        }
        keys
    }

    fn resolve_inputs(
        &self,
        node: &crate::workflow::PlannedNode,
        results: &HashMap<String, Arc<CachedResult>>,
        ctx: &RunContext,
    ) -> Result<Vec<(String, Value)>, String> {
        node.inputs
            .iter()
            .map(|(name, input)| {
                let value = match input {
                    PlannedInput::Const(v) => v.clone(),
                    PlannedInput::Link { node: up, output } => results
                        .get(up)
                        .and_then(|r| r.values.get(*output as usize))
                        .cloned()
                        .ok_or_else(|| format!("input `{name}`: node {up} produced no output {output}"))?,
                    PlannedInput::Hidden(HiddenInput::Prompt) => Value::String(ctx.prompt.to_string()),
                    PlannedInput::Hidden(HiddenInput::ExtraPnginfo) => {
                        Value::String(ctx.extra_pnginfo.as_ref().map_or_else(|| "null".to_string(), |v| v.to_string()))
                    }
                    PlannedInput::Hidden(HiddenInput::UniqueId) => Value::String(node.id.clone()),
                };
                Ok((name.clone(), value))
            })
            .collect()
    }

    fn node_io(&self, node_id: &str, cache_key: Option<CacheKey>, ctx: &RunContext, progress: &Arc<Mutex<Progress>>) -> NodeIo {
        let (events, progress, node) = (ctx.events.clone(), progress.clone(), node_id.to_string());
        NodeIo {
            inputs: ctx.inputs.clone(),
            outputs: ctx.outputs.clone(),
            secrets: ctx.secrets.clone(),
            cache_key,
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
            }),
        }
    }
}

/// Whether input `name` of `def` names an uploaded file.
fn is_file_input(def: &crate::plugins::NodeDef, name: &str) -> bool {
    def.required.iter().chain(&def.optional).any(|i| i.name == name && matches!(&i.kind, InputKind::Combo(c) if c.source == ComboSource::InputImages))
}

fn append_log(log: &mut String, truncated: &mut bool, node: &str, class_type: &str, captured: &crate::plugins::runtime::CapturedLog) {
    *truncated |= captured.truncated;
    for line in captured.text.lines() {
        log.push_str(&format!("[{node} {class_type}] {line}\n"));
    }
}
