//! Loading plugins and calling their nodes under limits.
//!
//! One `Engine` and one `Linker` serve every plugin; each plugin keeps an
//! `InstancePre` (imports resolved once), and every node call gets a fresh
//! `Store`: nothing survives between calls or tenants, and a trap only poisons
//! a store that is about to be dropped.
//!
//! What a call ends with is in `outcome`; the conversion of its values
//! and the classification of its traps in `call_values`.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use wasmtime::component::{HasSelf, Linker};
use wasmtime::{Engine, Store};

use super::artifacts::ArtifactCache;
use super::bindings::{Plugin as PluginWorld, PluginPre, node};
use super::call_values::{Outcome, check_outputs, classify_trap, failure, from_wit, to_wit};
use super::compile::CompileError;
use super::deadlines::Deadlines;
use super::determinism::{GuestWorld, seed_from_inputs, seed_from_key};
use super::engine::{Allocator, PoolSizing, build_engine, spawn_epoch_ticker};
use super::identity::{PluginId, hash_grant};
pub use super::log_pipe::CapturedLog;
use super::manifest::{EffectiveLimits, Manifest};
use super::network::{OutboundPolicy, PluginNet};
use super::outcome::{FailureKind, LoadError, NodeFailure, NodeOutput};
use super::settings::RuntimeConfig;
use super::state::{NodeIo, NodeState, StopState, StoreLimits};
use crate::value::Value;
use wasmtime_wasi_http::p2::bindings::ProxyPre;

pub use node::NodeDef;

/// A loaded plugin: its identity, manifest, node definitions and
/// pre-linked component.
pub struct Plugin {
    /// Who it is, as the operator controls it (never its manifest name).
    pub id: PluginId,
    pub manifest: Manifest,
    /// blake3 of the component bytes.
    pub component_hash: blake3::Hash,
    pub definitions: Vec<NodeDef>,
    pub limits: EffectiveLimits,
    /// Whether the compiled component came from the on-disk cache.
    pub from_cache: bool,
    /// Its network capabilities, as granted.
    pub net: PluginNet,
    /// What its `node-meta` export says about its classes (empty without one).
    pub meta: Vec<super::meta::ClassMeta>,
    pre: PluginPre<NodeState>,
    /// Its `wasi:http/incoming-handler`, when it serves routes.
    pub(super) proxy: Option<ProxyPre<NodeState>>,
}

impl Plugin {
    /// Whether calls of `class_type` get virtual clocks and seeded
    /// randomness, so that their results may be cached (see `determinism`).
    pub fn is_deterministic(&self, class_type: &str) -> bool {
        self.manifest.is_deterministic(class_type)
    }

    /// `name (identity)`, for messages.
    pub fn label(&self) -> String {
        label(&self.manifest, &self.id)
    }
}

fn label(manifest: &Manifest, id: &PluginId) -> String {
    format!("{} ({id})", manifest.name)
}

/// The plugin runtime: engine, linker, instance permits and artifact cache.
pub struct PluginRuntime {
    engine: Engine,
    linker: Linker<NodeState>,
    permits: Arc<Semaphore>,
    pub(super) config: RuntimeConfig,
    artifacts: ArtifactCache,
    allocator: Allocator,
    deadlines: Arc<Deadlines>,
}

/// Limits for a plugin's `definitions` call at load.
const DEFINITIONS_LIMITS: EffectiveLimits = EffectiveLimits { memory_bytes: 64 << 20, timeout: Duration::from_secs(10) };

/// What a plugin's `definitions` call sees: virtual clocks, a fixed seed.
const DEFINITIONS_WORLD: GuestWorld = GuestWorld::Virtual([0; 32]);

impl PluginRuntime {
    /// Builds the engine, linker and epoch ticker.
    pub fn new(config: RuntimeConfig) -> Result<PluginRuntime, wasmtime::Error> {
        // One extra slot so loading a plugin never waits behind running nodes.
        let slots = config.max_concurrency.max(1) + 1;
        let (engine, allocator) = build_engine(
            PoolSizing {
                instances: slots,
                max_memory_bytes: config.limits.max_memory_bytes,
                decommit_batch: config.decommit_batch,
                keep_resident_bytes: config.keep_resident_bytes,
            },
            config.perf_map,
        )?;
        let deadlines = Arc::new(Deadlines::default());
        spawn_epoch_ticker(&engine, deadlines.clone()).map_err(wasmtime::Error::from)?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker)?;
        PluginWorld::add_to_linker::<_, HasSelf<_>>(&mut linker, |s| s)?;
        let artifacts = ArtifactCache::new(config.artifact_dir.clone());
        tracing::debug!(?allocator, slots, "plugin runtime ready");
        Ok(PluginRuntime { engine, linker, permits: Arc::new(Semaphore::new(slots as usize)), config, artifacts, allocator, deadlines })
    }

    /// The allocator in use.
    pub fn allocator(&self) -> Allocator {
        self.allocator
    }

    /// Compiles (or loads from cache), links and describes the plugin `id`.
    pub async fn load(&self, id: PluginId, manifest: Manifest, wasm: &[u8]) -> Result<Plugin, LoadError> {
        let plugin = label(&manifest, &id);
        let component_hash = blake3::hash(wasm);
        if let Some(secret) = manifest.capabilities.secrets.first()
            && !self.config.secret_plugins.iter().any(|grant| grant.matches(&id, &component_hash))
        {
            return Err(LoadError::SecretNotGranted { plugin, secret: secret.clone(), hash_grant: hash_grant(&component_hash) });
        }
        let (component, from_cache) = self.artifacts.load(&self.engine, wasm, &component_hash, &self.config.compile).map_err(|source| match source {
            CompileError::Invalid(message) => LoadError::Compile { plugin: plugin.clone(), message },
            reason => LoadError::Component { plugin: plugin.clone(), reason },
        })?;
        let caps = &manifest.capabilities;
        let net = PluginNet::resolve(&self.config.net_grants, &id, &component_hash, &caps.outbound_hosts, &caps.routes)
            .map_err(|capability| LoadError::NetworkNotGranted { plugin: plugin.clone(), capability, hash_grant: hash_grant(&component_hash) })?;
        for (name, _) in component.component_type().imports(&self.engine) {
            manifest.check_import(name).map_err(|refusal| LoadError::Import { plugin: plugin.clone(), refusal })?;
        }
        let instance_pre = self.linker.instantiate_pre(&component).map_err(|e| LoadError::Compile { plugin: plugin.clone(), message: format!("{e:#}") })?;
        let proxy = match caps.routes.is_empty() {
            true => None,
            false => Some(ProxyPre::new(instance_pre.clone()).map_err(|e| LoadError::NoHttpHandler { plugin: plugin.clone(), message: format!("{e:#}") })?),
        };
        // Absent from components built against 0.1.0 / 0.1.1.
        let meta_pre = super::meta::MetaPre::new(instance_pre.clone()).ok();
        let pre = PluginPre::new(instance_pre).map_err(|e| LoadError::Compile { plugin: plugin.clone(), message: format!("{e:#}") })?;
        if !caps.outbound_hosts.is_empty() && net.allowed.is_empty() {
            tracing::warn!(plugin = %plugin, "the plugin asks for outbound hosts, but the operator granted it none: its requests will be refused");
        }
        let limits = manifest.effective_limits(&self.config.limits);
        // The load-time calls (definitions, meta): no inputs, no GPU.
        let load_setup = || CallSetup {
            limits: DEFINITIONS_LIMITS,
            io: None,
            guest_world: DEFINITIONS_WORLD,
            name: manifest.name.as_str().into(),
            net: net.clone(),
            gpu: false,
        };
        let setup = load_setup();
        let definitions = self
            .call(setup, &CancellationToken::new(), |store| {
                let pre = pre.clone();
                Box::pin(async move {
                    let world = pre.instantiate_async(&mut *store).await?;
                    world.kiln_plugin_node().call_definitions(store).await
                })
            })
            .await
            .map_err(|failure| LoadError::Definitions { plugin: plugin.clone(), failure })?
            .0;
        super::registry::check_definitions(&definitions).map_err(|reason| LoadError::InvalidDefinition { plugin: plugin.clone(), reason })?;
        let meta = match meta_pre {
            None => Vec::new(),
            Some(meta_pre) => {
                let setup = load_setup();
                self.call(setup, &CancellationToken::new(), |store| {
                    Box::pin(async move {
                        let world = meta_pre.instantiate_async(&mut *store).await?;
                        world.kiln_plugin_node_meta().call_describe(store).await
                    })
                })
                .await
                .map_err(|failure| LoadError::Meta { plugin: plugin.clone(), failure })?
                .0
            }
        };
        super::meta::check(&meta, &definitions).map_err(|reason| LoadError::InvalidDefinition { plugin: plugin.clone(), reason })?;
        manifest.check_nondeterministic(&definitions).map_err(|source| LoadError::Manifest { plugin, source })?;
        Ok(Plugin { id, manifest, component_hash, definitions, limits, from_cache, net, meta, pre, proxy })
    }

    /// Runs node `class_type` of `plugin` with `inputs`.
    ///
    /// The call gets a fresh store with the plugin's memory ceiling, yields to
    /// tokio at every epoch tick, fails with `timeout` past the plugin's time
    /// limit and with `interrupted` as soon as `cancel` fires. A
    /// deterministic class sees virtual clocks and randomness seeded from
    /// `io.cache_key` (or, without one, from its class and inputs).
    pub async fn execute(
        &self,
        plugin: &Plugin,
        class_type: &str,
        inputs: &[(String, Value)],
        io: NodeIo,
        cancel: &CancellationToken,
    ) -> Result<NodeOutput, NodeFailure> {
        let def = plugin
            .definitions
            .iter()
            .find(|d| d.class_type == class_type)
            .ok_or_else(|| failure(FailureKind::Failed, format!("plugin has no node class `{class_type}`"), CapturedLog::default()))?;
        // The node sees only the secrets its plugin was granted; what it
        // prints or reports has their values taken out.
        let secrets = io.secrets.restricted_to(&plugin.manifest.capabilities.secrets);
        let io = NodeIo { secrets: secrets.clone(), ..io };
        let mut result = self.execute_granted(plugin, def, class_type, inputs, io, cancel).await;
        if !secrets.is_empty() {
            match &mut result {
                Ok(output) => secrets.redact(&mut output.log.text),
                Err(failure) => {
                    secrets.redact(&mut failure.message);
                    secrets.redact(&mut failure.log.text);
                }
            }
        }
        result
    }

    async fn execute_granted(
        &self,
        plugin: &Plugin,
        def: &node::NodeDef,
        class_type: &str,
        inputs: &[(String, Value)],
        io: NodeIo,
        cancel: &CancellationToken,
    ) -> Result<NodeOutput, NodeFailure> {
        let guest_world = match plugin.is_deterministic(class_type) {
            true => GuestWorld::Virtual(io.cache_key.as_ref().map_or_else(|| seed_from_inputs(class_type, inputs), seed_from_key)),
            false => GuestWorld::Real,
        };
        let class = class_type.to_string();
        let inputs = inputs.to_vec();
        let pre = plugin.pre.clone();
        let setup = CallSetup {
            limits: plugin.limits,
            io: Some(io),
            guest_world,
            name: plugin.manifest.name.as_str().into(),
            net: plugin.net.clone(),
            gpu: plugin.manifest.capabilities.gpu,
        };
        let (result, mut called) = self
            .call(setup, cancel, move |store| {
                Box::pin(async move {
                    let world = pre.instantiate_async(&mut *store).await?;
                    let wit_inputs = inputs
                        .into_iter()
                        .map(|(name, value)| Ok(node::Input { name, value: to_wit(value, store.data_mut())? }))
                        .collect::<wasmtime::Result<Vec<_>>>()?;
                    world.kiln_plugin_node().call_execute(store, &class, &wit_inputs).await
                })
            })
            .await?;
        let state = called.store.data_mut();
        let log = state.log.contents();
        // The job's memory ran out under this node: that is the failure,
        // whatever the node made of the refusal.
        if let Some(oom) = state.job_out_of_memory.take() {
            return Err(failure(FailureKind::JobOutOfMemory, oom, log));
        }
        if let (Err(_), Some(message)) = (&result, state.insufficient_funds.take()) {
            return Err(failure(FailureKind::InsufficientFunds, message, log));
        }
        let values = match result {
            Err(node::NodeError::InvalidInput(m)) => return Err(failure(FailureKind::Failed, format!("invalid input: {m}"), log)),
            // A refusal the node passed on is its failure, said once.
            Err(node::NodeError::Failed(m)) => {
                let (kind, message) = match state.over_budget.take() {
                    Some(b) if m.contains(&b) => (FailureKind::InvalidOutput, m),
                    Some(b) => (FailureKind::InvalidOutput, format!("{b} ({m})")),
                    None => (FailureKind::Failed, m),
                };
                return Err(failure(kind, message, log));
            }
            Ok(values) => values,
        };
        if let Some(budget) = state.over_budget.take() {
            return Err(failure(FailureKind::InvalidOutput, budget, log));
        }
        let values = from_wit(values, state).map_err(|m| failure(FailureKind::InvalidOutput, m, log.clone()))?;
        check_outputs(def, &values).map_err(|m| failure(FailureKind::InvalidOutput, m, log.clone()))?;
        Ok(NodeOutput { values, saved: std::mem::take(&mut state.saved), log, on_gpu: state.gpu.ran })
    }

    /// Runs `f` (which instantiates the plugin) in a fresh store under the limits.
    pub(super) async fn call<R: Send + 'static>(
        &self,
        setup: CallSetup,
        cancel: &CancellationToken,
        f: impl for<'a> FnOnce(&'a mut Store<NodeState>) -> std::pin::Pin<Box<dyn std::future::Future<Output = wasmtime::Result<R>> + Send + 'a>> + Send,
    ) -> Result<(R, Called), NodeFailure> {
        let CallSetup { limits, io, guest_world, name, net, gpu } = setup;
        // Held until the store (and with it the pool slot) is dropped: see `Called`.
        let permit = self
            .permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| failure(FailureKind::Crashed, "plugin runtime is shutting down".into(), CapturedLog::default()))?;
        let store_limits = StoreLimits {
            memory_bytes: limits.memory_bytes,
            tensor_bytes: self.config.tensor_budget_bytes,
            file_bytes: self.config.file_budget_bytes,
            max_files: self.config.max_files,
            log_bytes: self.config.log_bytes,
        };
        let deadline_at = std::time::Instant::now() + limits.timeout;
        let outbound = OutboundPolicy::new(name, net.allowed.clone(), self.config.outbound);
        let mut state = NodeState::new(store_limits, io, guest_world, StopState::new(cancel.clone(), deadline_at), outbound, &net.env);
        state.gpu.gpu = self.config.gpu.clone();
        state.gpu.granted = gpu;
        let mut store = Store::new(&self.engine, state);
        store.limiter(|s| &mut s.memory);
        // wasmtime caps what one guest→host call may transfer (128 MiB by
        // default), which refused a 4096² RGB image (201 MB). A guest cannot
        // pass more than its own linear memory, and the tensor and file
        // budgets bound what it keeps, so the node's memory ceiling is the cap.
        store.set_hostcall_fuel(usize::try_from(limits.memory_bytes).unwrap_or(usize::MAX));
        store.set_epoch_deadline(1);
        store.epoch_deadline_async_yield_and_update(1);

        let outcome = {
            let run = f(&mut store);
            // Fired by the epoch ticker (see `deadlines`), not a tokio timer.
            let deadline = self.deadlines.arm(deadline_at);
            tokio::select! {
                biased;
                _ = cancel.cancelled() => Outcome::Cancelled,
                _ = deadline.expired() => Outcome::TimedOut,
                r = run => match r {
                    Ok(v) => Outcome::Done(v),
                    Err(e) => Outcome::Trapped(e),
                },
            }
        };
        let log = store.data().log.contents();
        match outcome {
            Outcome::Done(v) => Ok((v, Called { store, _permit: permit })),
            Outcome::Cancelled => Err(failure(FailureKind::Interrupted, "interrupted".into(), log)),
            Outcome::TimedOut => Err(failure(FailureKind::Timeout, format!("node exceeded its time limit of {:?}", limits.timeout), log)),
            Outcome::Trapped(e) => Err(classify_trap(&e, store.data(), limits, log)),
        }
    }
}

/// What a call runs with besides its code.
pub(super) struct CallSetup {
    pub(super) limits: EffectiveLimits,
    pub(super) io: Option<NodeIo>,
    pub(super) guest_world: GuestWorld,
    /// The plugin's manifest name (for the logs of refused requests).
    pub(super) name: Arc<str>,
    pub(super) net: PluginNet,
    /// The plugin's manifest asks for the GPU (`capabilities.gpu`).
    pub(super) gpu: bool,
}

/// A finished call's store with the pool permit it was instantiated under.
/// Fields drop in order: the store (releasing its instance slot) before the
/// permit, so no more instances are ever live than the pool has slots (a
/// permit released first let another call instantiate into a full pool and
/// fail with "maximum concurrent limit … reached").
pub(super) struct Called {
    store: Store<NodeState>,
    _permit: tokio::sync::OwnedSemaphorePermit,
}
