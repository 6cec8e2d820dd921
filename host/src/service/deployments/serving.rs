//! The service's deployment operations: creating a deployment (from a
//! bundle too: checked, its components matched, kept by hash), stopping
//! and starting one, and loading its plugins in the background — from its
//! directories, or from its bundle read back and checked again.

use std::path::PathBuf;
use std::sync::Arc;

use super::{BundleRecord, DEPLOYMENT_CACHE_BYTES, DeploymentError, DeploymentRecord, DeploymentSpec, DeploymentState, Loaded, NOT_READY_RETRY_S, check_spec};
use crate::bundle::{Bundle, BundleError};
use crate::executor::Executor;
use crate::plugins::{NodeRegistry, PluginRuntime};
use crate::service::{Service, ServiceError};
use crate::store::DeploymentStore;

/// Where a deployment's plugins come from.
pub enum PluginSource {
    /// The bundled plugins and these directories.
    Dirs(Vec<PathBuf>),
    /// Exactly this bundle's components, matched against `host`'s plugins.
    Bundle { bundle: Box<Bundle>, host: Arc<NodeRegistry> },
}

/// Where deployment `record`'s plugins come from: its directories, or its
/// bundle read back from `store` and checked again.
async fn plugin_source(record: &DeploymentRecord, store: &dyn DeploymentStore, host: Arc<NodeRegistry>, max_bundle: u64) -> Result<PluginSource, String> {
    let Some(b) = &record.bundle else { return Ok(PluginSource::Dirs(record.spec.plugin_dirs.clone())) };
    let hex = b.hash.strip_prefix("blake3:").unwrap_or_default();
    let bytes = store.bundle(hex).await.map_err(|e| e.to_string())?.ok_or_else(|| format!("its bundle {} is not in the deployment store", b.hash))?;
    let bundle = Bundle::read(&bytes, max_bundle).map_err(|e| e.to_string())?;
    if bundle.hash_string() != b.hash {
        return Err(format!("its stored bundle is not {}", b.hash));
    }
    Ok(PluginSource::Bundle { bundle: Box::new(bundle), host })
}

/// Loads a deployment's plugins.
pub async fn load(runtime: Arc<PluginRuntime>, source: PluginSource, concurrency: usize) -> Result<Loaded, String> {
    let registry = match source {
        PluginSource::Dirs(dirs) => NodeRegistry::load_all(&runtime, &dirs).await.map_err(|e| e.to_string())?,
        PluginSource::Bundle { bundle, host } => crate::bundle::registry(&bundle, &host, &runtime).await.map_err(|e| e.to_string())?,
    };
    let executor = Arc::new(Executor::new(runtime, DEPLOYMENT_CACHE_BYTES, concurrency));
    Ok(Loaded { registry: Arc::new(registry), executor })
}

/// One bundle read, checked and resolved at a time: creations (see
/// [`Service::create_deployment`]) and loads.
static BUNDLE_TURN: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);

impl Service {
    /// A deployment, if it exists.
    pub fn deployment(&self, id: &str) -> Option<DeploymentRecord> {
        self.deployments.get(id)
    }

    /// Every deployment.
    pub fn deployments(&self) -> Vec<DeploymentRecord> {
        self.deployments.list()
    }

    /// The loaded plugins of a deployment that serves; otherwise why not
    /// (404, 429 `deployment_not_ready`, 422 `deployment_stopped`).
    pub fn deployment_serving(&self, id: &str) -> Result<Arc<Loaded>, ServiceError> {
        match self.deployments.get(id).map(|d| d.state) {
            None => Err(ServiceError::NotFound),
            Some(DeploymentState::Starting) => Err(ServiceError::DeploymentNotReady { retry_after_s: NOT_READY_RETRY_S }),
            Some(DeploymentState::Stopped | DeploymentState::Failed) => Err(ServiceError::DeploymentStopped),
            Some(DeploymentState::Ready) => self.deployments.loaded(id).ok_or(ServiceError::DeploymentNotReady { retry_after_s: NOT_READY_RETRY_S }),
        }
    }

    /// Creates a deployment — from `bundle` (its bytes) if given — and
    /// starts loading its plugins. A bundle is checked whole first, and
    /// refused when a component it only references is not on this host
    /// (each named); it is kept by hash before the record is written.
    pub async fn create_deployment(self: &Arc<Self>, spec: DeploymentSpec, bundle: Option<&[u8]>) -> Result<DeploymentRecord, DeploymentError> {
        let Some(bytes) = bundle else {
            let (record, generation) = self.deployments.create(spec, None).await?;
            self.load_deployment(&record.spec.id, generation);
            return Ok(record);
        };
        // One bundle read at a time (each holds up to twice its size while
        // it is checked). A bundle kept for a creation that then fails stays:
        // bundles are kept by hash, and another host's deployment (same
        // database) may use the same one.
        let _one = BUNDLE_TURN.acquire().await.map_err(|_| DeploymentError::Invalid("the server is stopping".into()))?;
        check_spec(&spec, true)?;
        if self.deployments.get(&spec.id).is_some() {
            return Err(DeploymentError::Exists(spec.id));
        }
        let parsed = Bundle::read(bytes, self.opts.max_bundle_bytes)?;
        if let Some((plugin, size)) = parsed.largest_component().filter(|(_, size)| *size as u64 > self.opts.max_plugin_bytes) {
            return Err(DeploymentError::Invalid(format!(
                "the bundle's component `{plugin}` is {size} bytes, over max_plugin_mb ({} bytes)",
                self.opts.max_plugin_bytes
            )));
        }
        let missing = crate::bundle::missing_components(&parsed, &self.registry());
        if !missing.is_empty() {
            return Err(BundleError::Missing(missing).into());
        }
        self.deployments.store.put_bundle(&parsed.hash().to_hex(), bytes).await?;
        let (record, generation) = self.deployments.create(spec, Some(BundleRecord::of(&parsed))).await?;
        self.load_deployment(&record.spec.id, generation);
        Ok(record)
    }

    /// Stops a deployment: its queued jobs are canceled; running ones end
    /// as they run.
    pub async fn stop_deployment(&self, id: &str) -> Result<DeploymentRecord, DeploymentError> {
        let record = self.deployments.stop(id).await?;
        self.cancel_queued_of_deployment(id).await;
        tracing::info!(deployment = id, "deployment stopped");
        Ok(record)
    }

    /// Cancels the queued jobs this host holds of deployment `id` (stopped).
    pub(in crate::service) async fn cancel_queued_of_deployment(&self, id: &str) {
        let queued = self.queue.live_where(|j| {
            let r = j.record.lock();
            r.deployment.as_deref() == Some(id) && r.status == crate::store::JobStatus::Queued
        });
        for job in queued {
            if let Err(e) = self.stop_queued(&job, crate::store::JobStatus::Canceled).await {
                tracing::error!(deployment = id, error = %e, "cannot cancel a queued job of a stopped deployment");
            }
        }
    }

    /// Cancels recovered queued jobs of deployments that are stopped or
    /// gone (a crash between a stop and its cancels leaves them): as the
    /// stop would have. A failed deployment's jobs wait for its restart.
    pub(in crate::service) async fn cancel_orphaned_deployment_jobs(&self) {
        let orphaned = self.queue.live_where(|j| {
            let r = j.record.lock();
            r.status == crate::store::JobStatus::Queued
                && r.deployment.as_deref().is_some_and(|d| self.deployments.get(d).is_none_or(|d| d.state == DeploymentState::Stopped))
        });
        for job in orphaned {
            if let Err(e) = self.stop_queued(&job, crate::store::JobStatus::Canceled).await {
                tracing::error!(error = %e, "cannot cancel a queued job of a stopped deployment");
            }
        }
    }

    /// Starts a stopped (or failed) deployment again.
    pub async fn start_deployment(self: &Arc<Self>, id: &str) -> Result<DeploymentRecord, DeploymentError> {
        let (record, load) = self.deployments.start(id).await?;
        if let Some(generation) = load {
            self.load_deployment(id, generation);
        }
        Ok(record)
    }

    /// Loads a deployment's plugins in the background; when they are
    /// loaded it is ready and its queued jobs may start.
    pub(in crate::service) fn load_deployment(self: &Arc<Self>, id: &str, generation: u64) {
        let Some(record) = self.deployments.get(id) else { return };
        let (runtime, host, max_bundle) = (self.executor.runtime().clone(), self.registry(), self.opts.max_bundle_bytes);
        let store = self.deployments.store.clone();
        let concurrency = self.executor.concurrency();
        let id = id.to_string();
        let service = self.clone();
        let handle = tokio::runtime::Handle::current();
        tokio::spawn(async move {
            // One bundle at a time is read, checked and resolved (each holds
            // up to twice its size meanwhile); the turn is waited for here,
            // so loads waiting for it hold no blocking thread.
            let turn = match record.bundle {
                Some(_) => BUNDLE_TURN.acquire().await.ok(),
                None => None,
            };
            // On a blocking thread: reading and compiling plugins blocks,
            // and must not hold up the HTTP reactor's threads.
            let loaded = tokio::task::spawn_blocking(move || {
                let started = std::time::Instant::now();
                let result = crate::store::may_block_here(|| {
                    handle.block_on(async {
                        let source = plugin_source(&record, store.as_ref(), host, max_bundle).await?;
                        load(runtime, source, concurrency).await
                    })
                });
                drop(turn);
                match &result {
                    Ok(_) => tracing::info!(deployment = %id, ms = started.elapsed().as_millis() as u64, "deployment ready"),
                    Err(e) => tracing::error!(deployment = %id, error = %e, "deployment's plugins failed to load"),
                }
                if let Err(e) = handle.block_on(service.deployments.finish_load(&id, generation, result)) {
                    tracing::error!(deployment = %id, error = %e, "cannot save the deployment's state");
                }
                // Its queued jobs may run now.
                service.queue.waiting().limits_changed();
            })
            .await;
            if let Err(e) = loaded {
                tracing::error!(error = %e, "a deployment's load stopped");
            }
        });
    }
}
