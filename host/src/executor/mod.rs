//! Running a validated workflow.
//!
//! The executor computes every planned node's cache key up front (keys depend
//! only on constants, file contents and upstream keys), reports the nodes the
//! cache already holds, then runs the rest in dependency order — independent
//! branches in parallel, up to the configured concurrency and while the job's
//! memory allows ([`scheduler`]) — each node on its own tokio task through the
//! plugin runtime ([`run`]). The first failure stops the run (ComfyUI's
//! behaviour); cancellation interrupts the running nodes at once.

pub mod cache;
pub mod events;
mod run;
pub mod scheduler;

use std::collections::HashMap;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tracing::Instrument;

pub use cache::{CacheKey, CachedResult, ResultCache};
pub use events::{Event, EventSink};

use crate::budget::JobBudget;
use crate::files::{InputFiles, OutputFiles, SavedFile};
use crate::plugins::node::HiddenInput;
use crate::plugins::{NodeFailure, NodeRegistry, PluginRuntime};
use crate::value::Value;
use crate::workflow::{Plan, PlannedInput};

/// Everything one run needs besides the plan.
pub struct RunContext {
    pub job_id: String,
    /// The node classes the plan was made against: the run looks every
    /// class up here, so a plugin installed, upgraded or removed while it
    /// runs changes nothing for it.
    pub registry: Arc<NodeRegistry>,
    /// The workflow's JSON text, for the `prompt` hidden input (the run
    /// holds the text, not a parsed tree).
    pub prompt: Arc<str>,
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
    /// What the job may consume (memory, saved files), shared by its nodes.
    pub budget: Arc<JobBudget>,
    /// Whose results these are: every cache key is salted with it, so a
    /// run is served only results computed for the same scope (an account;
    /// empty: the one owner of a self-hosted server or `kiln run`).
    pub cache_scope: String,
    /// Whether the job's account may still start an API node (one that
    /// spends money at a partner, `api_node` in its class's meta), asked
    /// before each such node starts; `None`: always (no accounts).
    pub funds: Option<FundsCheck>,
}

/// See [`RunContext::funds`].
pub type FundsCheck = Arc<dyn Fn() -> bool + Send + Sync>;

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

/// Runs plans (each against the registry in its [`RunContext`]), sharing
/// one result cache: keys hold the component hash, so versions of a plugin
/// never share results.
pub struct Executor {
    runtime: Arc<PluginRuntime>,
    cache: ResultCache,
    concurrency: usize,
}

impl Executor {
    /// An executor with a result cache of `cache_bytes` running up to
    /// `concurrency` nodes at once.
    pub fn new(runtime: Arc<PluginRuntime>, cache_bytes: u64, concurrency: usize) -> Executor {
        Executor { runtime, cache: ResultCache::new(cache_bytes), concurrency: concurrency.max(1) }
    }

    /// The plugin runtime it runs nodes on (plugin routes are served
    /// through it too).
    pub fn runtime(&self) -> &Arc<PluginRuntime> {
        &self.runtime
    }

    /// Node calls of one job that may run at once.
    pub fn concurrency(&self) -> usize {
        self.concurrency
    }

    /// The result cache.
    pub fn cache(&self) -> &ResultCache {
        &self.cache
    }

    /// Runs `plan` to completion, failure or cancellation.
    pub async fn run(&self, plan: &Plan, ctx: RunContext) -> RunOutcome {
        let span = tracing::info_span!("job", job_id = %ctx.job_id);
        run::Run::new(self, plan, &ctx).execute().instrument(span).await
    }

    /// The cache key of every planned node, in plan order. A node whose
    /// plugin reads secrets is keyed by them too (see `JobSecrets::cache_salt`),
    /// every node by the run's cache scope when it has one;
    /// a nondeterministic one by a fresh random value (see `plugins::determinism`).
    fn cache_keys(&self, plan: &Plan, ctx: &RunContext) -> HashMap<String, CacheKey> {
        let (files, secrets, scope) = (ctx.inputs.as_ref(), &ctx.secrets, ctx.cache_scope.as_str());
        let mut keys: HashMap<String, CacheKey> = HashMap::new();
        for node in &plan.nodes {
            let Some((plugin, def)) = ctx.registry.get(&node.class_type) else { continue };
            let mut key = cache::KeyBuilder::new(&node.class_type, &plugin.component_hash);
            if !scope.is_empty() {
                key.salt("cache_scope", scope);
            }
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
                    PlannedInput::Const(Value::String(s)) if def.reads_input_file(name) => {
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
}
