//! kiln inside another Rust program: [`Engine`] runs ComfyUI API-format
//! workflows in-process, each node in its sandbox, with named input files,
//! an event stream and cancellation. (The HTTP service as a router to
//! mount is [`crate::server::Mounted`].)
//!
//! ```no_run
//! # async fn demo() -> Result<(), kiln::embed::EngineError> {
//! let engine = kiln::Engine::new(kiln::Config::default()).await?;
//! let workflow = serde_json::json!({
//!     "1": {"class_type": "EmptyImage", "inputs": {"width": 64, "height": 64, "batch_size": 1, "color": 0x3366cc}},
//!     "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
//!     "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "demo"}}
//! });
//! let outcome = engine.run(&workflow, kiln::embed::Run::new("out")).await?;
//! for (_, files) in &outcome.outputs {
//!     for file in files {
//!         println!("{}", file.path.display());
//!     }
//! }
//! # Ok(()) }
//! ```
//!
//! The engine is built from a [`Config`] (plugin folders, node memory and
//! time limits, GPU mode, the compiled-plugin cache): the same settings
//! `kiln run` reads. A run is validated whole first (every problem named);
//! then nodes run in dependency order, unchanged ones from the result
//! cache.

use std::path::PathBuf;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::config::Config;
#[doc(inline)]
pub use crate::executor::{Event, RunOutcome, RunStatus};
use crate::executor::{EventSink, Executor, RunContext};
#[doc(inline)]
pub use crate::files::SavedFile;
use crate::files::{DirOutputs, NamedInputs};
use crate::plugins::{NodeRegistry, PluginRuntime, RegistryError, RuntimeConfig};
use crate::workflow::{ParseError, ValidationError, Workflow, WorkflowLimits, validate};

/// Why an engine did not start or a run did not start.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The configuration does not make a plugin runtime.
    #[error("{0}")]
    Config(String),
    /// A plugin did not load.
    #[error(transparent)]
    Plugins(#[from] RegistryError),
    /// The workflow is not API-format JSON within the limits.
    #[error(transparent)]
    Workflow(#[from] ParseError),
    /// The workflow does not validate (each problem named).
    #[error("{0}")]
    Invalid(ValidationError),
    /// The bundle cannot run here (a component missing, a hash wrong) or
    /// the run's inputs are not ones it lets a caller give.
    #[error(transparent)]
    Bundle(#[from] crate::bundle::BundleError),
    /// An input the bundle does not let a caller replace, or does not have.
    #[error("{0}")]
    Input(String),
}

/// The plugin runtime `config` describes, and the bundled plugins plus
/// `config.plugin_dirs` loaded into it (the one loader: `kiln run`,
/// `kiln nodes`, the server and embedders).
pub(crate) async fn load_plugins(config: &Config) -> Result<(Arc<PluginRuntime>, Arc<NodeRegistry>), EngineError> {
    let settings = RuntimeConfig::from_config(config).map_err(|e| EngineError::Config(e.to_string()))?;
    let runtime = Arc::new(PluginRuntime::new(settings).map_err(|e| EngineError::Config(format!("{e:#}")))?);
    let registry = Arc::new(NodeRegistry::load_all(&runtime, &config.plugin_dirs).await?);
    // Compiling plugins (first start, or after a change) leaves tens of
    // MiB of freed compiler memory that the allocator keeps (see `memory`).
    let _ = tokio::task::spawn_blocking(crate::memory::release_free_memory).await;
    Ok((runtime, registry))
}

/// Workflows run in this process.
pub struct Engine {
    registry: Arc<NodeRegistry>,
    executor: Executor,
    config: Config,
    /// Recently run bundles' node classes, by bundle hash.
    bundles: parking_lot::Mutex<lru::LruCache<blake3::Hash, Arc<NodeRegistry>>>,
}

/// Bundles whose resolved components an [`Engine`] keeps.
const BUNDLES_KEPT: std::num::NonZeroUsize = match std::num::NonZeroUsize::new(8) {
    Some(n) => n,
    None => std::num::NonZeroUsize::MIN,
};

/// One run's inputs and hooks.
pub struct Run {
    inputs: NamedInputs,
    out: PathBuf,
    events: Option<EventSink>,
    cancel: CancellationToken,
}

impl Run {
    /// A run whose saved files go to `out` (previews to `out/temp`).
    pub fn new(out: impl Into<PathBuf>) -> Run {
        Run { inputs: NamedInputs::new(), out: out.into(), events: None, cancel: CancellationToken::new() }
    }
    /// Makes the file at `path` available to LoadImage-style nodes as `name`.
    pub fn input(mut self, name: impl Into<String>, path: impl Into<PathBuf>) -> Run {
        self.inputs.insert(name, path);
        self
    }
    /// Calls `f` with every event of the run (progress, previews, each
    /// node's start, result and time), in order, from the run's tasks.
    pub fn on_event(mut self, f: impl Fn(Event) + Send + Sync + 'static) -> Run {
        self.events = Some(Arc::new(f));
        self
    }
    /// Stops the run when `token` is cancelled (running nodes are
    /// interrupted; the outcome says `Interrupted`).
    pub fn cancel_with(mut self, token: CancellationToken) -> Run {
        self.cancel = token;
        self
    }
}

impl Engine {
    /// Builds the plugin runtime from `config` and loads the bundled
    /// plugins and `config.plugin_dirs` (compiling each once into the
    /// plugin cache).
    pub async fn new(config: Config) -> Result<Engine, EngineError> {
        let (runtime, registry) = load_plugins(&config).await?;
        let executor = Executor::new(runtime, config.result_cache_mb << 20, config.max_concurrency as usize);
        Ok(Engine { registry, executor, config, bundles: parking_lot::Mutex::new(lru::LruCache::new(BUNDLES_KEPT)) })
    }

    /// The node classes it runs (the host's own type; `kiln nodes`).
    #[doc(hidden)]
    pub fn registry(&self) -> &Arc<NodeRegistry> {
        &self.registry
    }

    /// Validates `workflow` (API format; a `/prompt` body's `prompt` is
    /// taken) against the engine's classes and `run`'s inputs.
    pub fn plan(&self, workflow: &serde_json::Value, run: &Run) -> Result<crate::workflow::Plan, EngineError> {
        plan(&self.registry, &self.config, workflow, run)
    }

    /// Makes a bundle of `workflows` (name, API-format JSON) as this
    /// engine runs them: their components pinned by hash, `inputs` (file
    /// name → bytes) as their default input files (see [`crate::bundle`]).
    pub fn pack(
        &self,
        workflows: &[(String, serde_json::Value)],
        inputs: &std::collections::BTreeMap<String, Arc<[u8]>>,
        options: &crate::bundle::PackOptions,
    ) -> Result<crate::bundle::Bundle, crate::bundle::PackError> {
        crate::bundle::pack(&self.registry, workflows, inputs, options, &WorkflowLimits::from_config(&self.config))
    }

    /// Runs workflow `workflow` of `bundle` (`None`: its only one) on the
    /// bundle's own components (see [`crate::bundle`]): the bundle's
    /// default input files, each replaced by the file `run` gives under
    /// its name where the bundle lets a caller do so.
    pub async fn run_bundle(&self, bundle: &crate::bundle::Bundle, workflow: Option<&str>, mut run: Run) -> Result<RunOutcome, EngineError> {
        let descriptor = bundle.descriptor();
        for name in run.inputs.names() {
            match descriptor.inputs.get(name) {
                Some(entry) if entry.overridable => {}
                Some(_) => return Err(EngineError::Input(format!("input `{name}` is fixed in this bundle"))),
                None => {
                    let names: Vec<&str> = descriptor.inputs.keys().map(String::as_str).collect();
                    return Err(EngineError::Input(format!("the bundle has no input `{name}` (its inputs: {})", names.join(", "))));
                }
            }
        }
        let given: std::collections::BTreeSet<String> = run.inputs.names().map(str::to_string).collect();
        for name in descriptor.inputs.keys().filter(|n| !given.contains(*n)) {
            if let Some(bytes) = bundle.input(name) {
                run.inputs.insert_bytes(name.clone(), bytes);
            }
        }
        let (_, json) = bundle.workflow(workflow, &WorkflowLimits::from_config(&self.config))?;
        let registry = self.bundle_registry(bundle).await?;
        self.run_on(registry, &json, run).await
    }

    /// The node classes of `bundle`'s runs: resolved once per bundle and
    /// kept for the next runs of it (the last [`BUNDLES_KEPT`]).
    async fn bundle_registry(&self, bundle: &crate::bundle::Bundle) -> Result<Arc<NodeRegistry>, EngineError> {
        if let Some(registry) = self.bundles.lock().get(&bundle.hash()) {
            return Ok(registry.clone());
        }
        let registry = Arc::new(crate::bundle::registry(bundle, &self.registry, self.executor.runtime()).await?);
        self.bundles.lock().put(bundle.hash(), registry.clone());
        Ok(registry)
    }

    /// Validates and runs `workflow`: its outcome (succeeded, the node that
    /// failed and why, or interrupted), with the files each output node saved.
    pub async fn run(&self, workflow: &serde_json::Value, run: Run) -> Result<RunOutcome, EngineError> {
        self.run_on(self.registry.clone(), workflow, run).await
    }

    async fn run_on(&self, registry: Arc<NodeRegistry>, workflow: &serde_json::Value, run: Run) -> Result<RunOutcome, EngineError> {
        let plan = plan(&registry, &self.config, workflow, &run)?;
        let workflow = workflow.get("prompt").filter(|p| p.is_object()).unwrap_or(workflow);
        let ctx = RunContext {
            job_id: uuid::Uuid::new_v4().to_string(),
            registry,
            prompt: Arc::from(workflow.to_string()),
            extra_pnginfo: None,
            inputs: Arc::new(run.inputs),
            outputs: Arc::new(DirOutputs::new(&run.out, run.out.join("temp"))),
            events: run.events.unwrap_or_else(|| Arc::new(|_| {})),
            cancel: run.cancel,
            secrets: Default::default(),
            branches: None,
            budget: crate::budget::JobBudget::new(crate::budget::JobLimits::from_config(&self.config)),
            cache_scope: String::new(),
            funds: None,
        };
        Ok(self.executor.run(&plan, ctx).await)
    }
}

/// Validates `workflow` (a `/prompt` body's `prompt` is taken) against
/// `registry`'s classes and `run`'s inputs.
fn plan(registry: &NodeRegistry, config: &Config, workflow: &serde_json::Value, run: &Run) -> Result<crate::workflow::Plan, EngineError> {
    let workflow = workflow.get("prompt").filter(|p| p.is_object()).unwrap_or(workflow);
    let parsed = Workflow::from_json(workflow, &WorkflowLimits::from_config(config))?;
    match validate(&parsed, registry, &run.inputs) {
        Ok((plan, issues)) if issues.is_empty() => Ok(plan),
        Ok((_, issues)) => Err(EngineError::Invalid(ValidationError::OutputsFailed(issues))),
        Err(e) => Err(EngineError::Invalid(e)),
    }
}
