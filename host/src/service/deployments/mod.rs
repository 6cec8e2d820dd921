//! Serverless deployments: a named set of plugins plus limits,
//! owned by an account, served under `/deployment/{id}/api/v2`.
//!
//! A deployment's plugins are the bundled ones plus its `plugin_dirs`, or
//! exactly the components of the bundle it was created from (see
//! `bundle`): the bundle is checked whole and its components matched
//! against the host's when it is created, kept in the deployment store by
//! hash, and resolved again at each load, so a restart serves the very
//! same components; its record shows the bundle's hash.
//!
//! This module owns a deployment's record, its state machine
//! (`starting` → `ready`, `failed`; `stop` → `stopped`; `start` →
//! `starting` again), its records (kept in a [`DeploymentStore`]; embedded:
//! one JSON file in the data directory) and its loaded plugins: each deployment has a node
//! registry of its own — the bundled plugins plus its `plugin_dirs`, loaded
//! in the background while it is `starting` — so its jobs validate and run
//! against exactly those classes, and one deployment's plugins are never
//! visible to another's jobs or to the host's. The service's operations on
//! deployments (create, stop, start) and the loading of their plugins are
//! `serving`'s.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::RwLock;
use serde::{Deserialize, Serialize};

use super::fair::OwnerLimits;
use crate::bundle::{Bundle, BundleError};
use crate::executor::Executor;
use crate::plugins::NodeRegistry;
use crate::store::{DeploymentStore, Micros, StoreError, now_micros};

/// Longest deployment id (a DNS label's longest: an id is also the
/// subdomain of `serverless_host`).
pub const MAX_ID_LEN: usize = 63;
/// Most deployments one server keeps.
pub const MAX_DEPLOYMENTS: usize = 1000;
/// Most plugin directories of one deployment.
pub const MAX_PLUGIN_DIRS: usize = 32;
/// Result cache of one deployment's executor (each deployment has its own:
/// results never cross deployments).
const DEPLOYMENT_CACHE_BYTES: u64 = 64 << 20;

/// Where a deployment is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeploymentState {
    /// Its plugins compile or load: requests get 429 `deployment_not_ready`.
    Starting,
    /// Serving.
    Ready,
    /// Stopped by the operator: requests get 422 `deployment_stopped`.
    Stopped,
    /// Its plugins failed to load (see `error`): as stopped until an
    /// operator starts it again.
    Failed,
}

/// What the operator asks for when creating a deployment.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DeploymentSpec {
    pub id: String,
    /// The account that owns it (and is billed for its public-demo jobs).
    pub owner: String,
    /// Plugin directories (on the server) loaded for it, besides the
    /// bundled plugins.
    #[serde(default)]
    pub plugin_dirs: Vec<PathBuf>,
    /// Callers need no credentials; they share one demo identity, and the
    /// logs of its jobs are stored but never shown.
    #[serde(default)]
    pub public_demo: bool,
    /// Its jobs' limits (running at once, waiting); default: the server's.
    #[serde(default)]
    pub limits: Option<OwnerLimits>,
}

/// The bundle a deployment was created from, as its record shows it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct BundleRecord {
    /// `blake3:<hex>` of the bundle's descriptor: what pins it whole.
    pub hash: String,
    pub name: String,
    pub version: String,
    /// Its workflows' names.
    pub workflows: Vec<String>,
    /// Plugin name → `blake3:<hex>` of its component.
    pub components: std::collections::BTreeMap<String, String>,
}

impl BundleRecord {
    fn of(bundle: &Bundle) -> BundleRecord {
        let d = bundle.descriptor();
        BundleRecord {
            hash: bundle.hash_string(),
            name: d.name.clone(),
            version: d.version.clone(),
            workflows: d.workflows.keys().cloned().collect(),
            components: d.components.iter().map(|c| (c.plugin.clone(), c.component.clone())).collect(),
        }
    }
}

/// A deployment as stored and shown.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DeploymentRecord {
    #[serde(flatten)]
    pub spec: DeploymentSpec,
    /// The bundle it runs, when created from one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bundle: Option<BundleRecord>,
    pub state: DeploymentState,
    /// Why its plugins failed to load (state `failed`).
    #[serde(default)]
    pub error: Option<String>,
    pub created_at: Micros,
    pub updated_at: Micros,
}

/// Why a deployment operation was refused.
#[derive(Debug, thiserror::Error)]
pub enum DeploymentError {
    #[error("{0}")]
    Invalid(String),
    #[error("a deployment with id {0:?} already exists")]
    Exists(String),
    #[error("no deployment {0:?}")]
    NotFound(String),
    #[error(transparent)]
    Bundle(#[from] BundleError),
    #[error("deployment store: {0}")]
    Store(#[from] StoreError),
}

/// A deployment's loaded plugins and the executor of its jobs.
pub struct Loaded {
    pub registry: Arc<NodeRegistry>,
    pub executor: Arc<Executor>,
}

struct Entry {
    record: DeploymentRecord,
    loaded: Option<Arc<Loaded>>,
    /// Bumped by each start and stop: a load that finishes after a newer
    /// one began (or after a stop) is dropped.
    generation: u64,
    /// Known from the store (read at the start, or followed from another
    /// host), not created here: only such an entry goes when the store no
    /// longer has it (one created here is in the store once written).
    from_store: bool,
}

/// Every deployment of the server.
pub struct Deployments {
    pub(super) store: Arc<dyn DeploymentStore>,
    entries: RwLock<HashMap<String, Entry>>,
    /// Serializes writes of records (each writes the latest state).
    save: tokio::sync::Mutex<()>,
    /// Hosts share the store: it holds what operators asked (created,
    /// started, stopped), and a load's outcome stays the loading host's.
    shared: bool,
}

/// What following another host's change did here (see
/// [`Deployments::reconcile`]).
#[derive(Debug, PartialEq, Eq)]
pub enum Reconciled {
    Unchanged,
    /// Its plugins are to load here, as this generation.
    Load(u64),
    /// Stopped here (or gone): its queued jobs here are to be canceled.
    Stopped,
}

impl Deployments {
    /// The deployments in `store`. Those that were serving start again
    /// (`starting`).
    pub async fn open(store: Arc<dyn DeploymentStore>) -> Result<Deployments, DeploymentError> {
        let mut entries = HashMap::new();
        for record in store.all().await? {
            let mut record = parse(record)?;
            if record.state == DeploymentState::Ready {
                record.state = DeploymentState::Starting;
            }
            entries.insert(record.spec.id.clone(), Entry { record, loaded: None, generation: 0, from_store: true });
        }
        Ok(Deployments { store, entries: RwLock::new(entries), save: tokio::sync::Mutex::new(()), shared: false })
    }

    /// These deployments where hosts share the store (see
    /// [`Deployments::reconcile`]).
    pub fn shared(mut self) -> Deployments {
        self.shared = true;
        self
    }

    /// Follows what operators did through other hosts to deployments
    /// `ids` (`None`: every one), in the write turn (so a change this host
    /// makes meanwhile is never undone by a read from before it): what each
    /// did here ([`Deployments::reconcile`]).
    pub async fn follow(&self, ids: Option<Vec<String>>) -> Result<Vec<(String, Reconciled)>, DeploymentError> {
        let _turn = self.save.lock().await;
        let stored = match ids {
            None => {
                let mut all = self.stored_all().await?;
                let gone = self.absent_from(&all);
                all.extend(gone.into_iter().map(|id| (id, None)));
                all
            }
            Some(ids) => {
                let mut stored = Vec::with_capacity(ids.len());
                for id in ids {
                    let record = self.stored(&id).await?;
                    stored.push((id, record));
                }
                stored
            }
        };
        Ok(stored.into_iter().map(|(id, record)| (id.clone(), self.reconcile(&id, record))).collect())
    }

    /// Deployment `id` as the store holds it now.
    async fn stored(&self, id: &str) -> Result<Option<DeploymentRecord>, DeploymentError> {
        self.store.get(id).await?.map(parse).transpose()
    }

    /// Every deployment as the store holds it now, by id.
    async fn stored_all(&self) -> Result<Vec<(String, Option<DeploymentRecord>)>, DeploymentError> {
        let all = self.store.all().await?;
        all.into_iter().map(|json| parse(json).map(|r| (r.spec.id.clone(), Some(r)))).collect()
    }

    /// The ids this host knows from the store that `stored` does not name.
    fn absent_from(&self, stored: &[(String, Option<DeploymentRecord>)]) -> Vec<String> {
        let named: std::collections::HashSet<&str> = stored.iter().map(|(id, _)| id.as_str()).collect();
        self.entries.read().iter().filter(|(id, e)| e.from_store && !named.contains(id.as_str())).map(|(id, _)| id.clone()).collect()
    }

    /// Follows what an operator did to deployment `id` through another
    /// host, `stored` being its record now (`None`: gone), without writing:
    /// a deployment new here, or started there while stopped or failed
    /// here, loads here; one stopped there (or gone, if this host knew it
    /// from the store) stops here. Anything else stands (a load's outcome
    /// is each host's own).
    fn reconcile(&self, id: &str, stored: Option<DeploymentRecord>) -> Reconciled {
        let mut entries = self.entries.write();
        let running = |r: &DeploymentRecord| r.state != DeploymentState::Stopped;
        match (entries.get_mut(id), stored) {
            (None, None) => Reconciled::Unchanged,
            // (One created here and not yet written stays.)
            (Some(e), None) if !e.from_store => Reconciled::Unchanged,
            (Some(_), None) => {
                entries.remove(id);
                Reconciled::Stopped
            }
            (None, Some(mut record)) => {
                if entries.len() >= MAX_DEPLOYMENTS {
                    tracing::error!(deployment = id, "another host made a deployment past this host's {MAX_DEPLOYMENTS}: not served here");
                    return Reconciled::Unchanged;
                }
                let load = running(&record);
                if load {
                    record.state = DeploymentState::Starting;
                    record.error = None;
                }
                entries.insert(id.to_string(), Entry { record, loaded: None, generation: 0, from_store: true });
                if load { Reconciled::Load(0) } else { Reconciled::Unchanged }
            }
            (Some(e), Some(record)) => match (running(&record), e.record.state) {
                (false, DeploymentState::Stopped) => Reconciled::Unchanged,
                (false, _) => {
                    e.record.state = DeploymentState::Stopped;
                    e.loaded = None;
                    e.generation += 1;
                    e.record.updated_at = record.updated_at;
                    Reconciled::Stopped
                }
                (true, DeploymentState::Stopped | DeploymentState::Failed) if record.state == DeploymentState::Starting => {
                    e.record.state = DeploymentState::Starting;
                    e.record.error = None;
                    e.generation += 1;
                    e.record.updated_at = record.updated_at;
                    Reconciled::Load(e.generation)
                }
                (true, _) => Reconciled::Unchanged,
            },
        }
    }

    /// Ids of deployments that must load their plugins now (after `open`).
    pub fn starting(&self) -> Vec<(String, u64)> {
        self.entries.read().values().filter(|e| e.record.state == DeploymentState::Starting).map(|e| (e.record.spec.id.clone(), e.generation)).collect()
    }

    pub fn get(&self, id: &str) -> Option<DeploymentRecord> {
        self.entries.read().get(id).map(|e| e.record.clone())
    }

    /// All deployments, by id.
    pub fn list(&self) -> Vec<DeploymentRecord> {
        let mut all: Vec<DeploymentRecord> = self.entries.read().values().map(|e| e.record.clone()).collect();
        all.sort_by(|a, b| a.spec.id.cmp(&b.spec.id));
        all
    }

    /// The loaded plugins of a ready deployment.
    pub fn loaded(&self, id: &str) -> Option<Arc<Loaded>> {
        self.entries.read().get(id).filter(|e| e.record.state == DeploymentState::Ready).and_then(|e| e.loaded.clone())
    }

    /// The limits of a deployment's jobs: none may start unless it is ready.
    pub fn limits(&self, id: &str, fallback: OwnerLimits) -> OwnerLimits {
        match self.entries.read().get(id) {
            Some(e) if e.record.state == DeploymentState::Ready => e.record.spec.limits.unwrap_or(fallback),
            Some(e) => OwnerLimits { max_running: 0, ..e.record.spec.limits.unwrap_or(fallback) },
            None => OwnerLimits { max_running: 0, max_queued: 0 },
        }
    }

    /// Whether deployment `id`'s spec sets its own limits (they then hold
    /// on every host sharing the store, see `Service::shared_running_limit`).
    pub fn has_own_limits(&self, id: &str) -> bool {
        self.entries.read().get(id).is_some_and(|e| e.record.spec.limits.is_some())
    }

    /// Records a new deployment, `starting`; returns it and the load's
    /// generation.
    pub async fn create(&self, spec: DeploymentSpec, bundle: Option<BundleRecord>) -> Result<(DeploymentRecord, u64), DeploymentError> {
        check_spec(&spec, bundle.is_some())?;
        let now = now_micros();
        let record = DeploymentRecord { spec, bundle, state: DeploymentState::Starting, error: None, created_at: now, updated_at: now };
        let _turn = self.save.lock().await;
        {
            let mut entries = self.entries.write();
            if entries.contains_key(&record.spec.id) {
                return Err(DeploymentError::Exists(record.spec.id.clone()));
            }
            if entries.len() >= MAX_DEPLOYMENTS {
                return Err(DeploymentError::Invalid(format!("this server keeps at most {MAX_DEPLOYMENTS} deployments")));
            }
            entries.insert(record.spec.id.clone(), Entry { record: record.clone(), loaded: None, generation: 0, from_store: false });
        }
        if let Err(e) = self.write(&record.spec.id).await {
            self.entries.write().remove(&record.spec.id);
            // The write may have reached the store before it failed.
            if let Err(undo) = self.store.delete(&record.spec.id).await {
                tracing::error!(deployment = %record.spec.id, error = %undo, "cannot take back a deployment whose creation failed");
            }
            return Err(e);
        }
        Ok((record, 0))
    }

    /// Stops a deployment: its plugins are released (running jobs keep
    /// theirs until they end).
    pub async fn stop(&self, id: &str) -> Result<DeploymentRecord, DeploymentError> {
        let record = self
            .transition(id, |e| {
                e.record.state = DeploymentState::Stopped;
                e.loaded = None;
                e.generation += 1;
            })
            .await?;
        Ok(record.0)
    }

    /// Starts a stopped or failed deployment again (`starting`); a
    /// deployment already starting or ready is left as it is. Returns the
    /// generation of the load to run, if one must.
    pub async fn start(&self, id: &str) -> Result<(DeploymentRecord, Option<u64>), DeploymentError> {
        let mut load = None;
        let (record, _) = self
            .transition(id, |e| {
                if matches!(e.record.state, DeploymentState::Stopped | DeploymentState::Failed) {
                    e.record.state = DeploymentState::Starting;
                    e.record.error = None;
                    e.generation += 1;
                    load = Some(e.generation);
                }
            })
            .await?;
        Ok((record, load))
    }

    /// Ends a load of generation `generation`: ready with its plugins, or
    /// failed. A load overtaken by a stop or a newer start changes nothing.
    pub async fn finish_load(&self, id: &str, generation: u64, result: Result<Loaded, String>) -> Result<(), DeploymentError> {
        let _turn = self.save.lock().await;
        let changed = {
            let mut entries = self.entries.write();
            let Some(e) = entries.get_mut(id) else { return Ok(()) };
            if e.generation != generation || e.record.state != DeploymentState::Starting {
                false
            } else {
                match result {
                    Ok(loaded) => {
                        e.record.state = DeploymentState::Ready;
                        e.loaded = Some(Arc::new(loaded));
                    }
                    Err(message) => {
                        e.record.state = DeploymentState::Failed;
                        e.record.error = Some(message);
                    }
                }
                e.record.updated_at = now_micros();
                true
            }
        };
        // Where hosts share the store it keeps what operators asked only.
        if changed && !self.shared { self.write(id).await } else { Ok(()) }
    }

    async fn transition(&self, id: &str, f: impl FnOnce(&mut Entry)) -> Result<(DeploymentRecord, u64), DeploymentError> {
        let _turn = self.save.lock().await;
        let out = {
            let mut entries = self.entries.write();
            let e = entries.get_mut(id).ok_or_else(|| DeploymentError::NotFound(id.to_string()))?;
            f(e);
            e.record.updated_at = now_micros();
            (e.record.clone(), e.generation)
        };
        self.write(id).await?;
        Ok(out)
    }

    /// Writes deployment `id`'s record as it is now. Called in the write
    /// turn (`save`), taken before the change it writes: changes are
    /// stored in the order they were made, and a follower's read of the
    /// store (also in the turn) never sees a record older than this host's.
    async fn write(&self, id: &str) -> Result<(), DeploymentError> {
        let Some(record) = self.get(id) else { return Ok(()) };
        let json = serde_json::to_value(&record).map_err(|e| DeploymentError::Invalid(e.to_string()))?;
        Ok(self.store.put(id, &json).await?)
    }
}

/// A stored record.
fn parse(json: serde_json::Value) -> Result<DeploymentRecord, DeploymentError> {
    serde_json::from_value(json).map_err(|e| DeploymentError::Invalid(format!("a stored deployment is not readable: {e}")))
}

/// Ids are 1–63 of `[a-z0-9-]`, not starting or ending with `-` (one path
/// segment, one DNS label); a deployment from a bundle has no
/// `plugin_dirs`.
fn check_spec(spec: &DeploymentSpec, from_bundle: bool) -> Result<(), DeploymentError> {
    if from_bundle && !spec.plugin_dirs.is_empty() {
        return Err(DeploymentError::Invalid("a deployment from a bundle runs the bundle's components only: give no plugin_dirs".into()));
    }
    let id_ok = !spec.id.is_empty()
        && spec.id.len() <= MAX_ID_LEN
        && spec.id.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !spec.id.starts_with('-')
        && !spec.id.ends_with('-');
    if !id_ok {
        return Err(DeploymentError::Invalid(format!("deployment id must be 1-{MAX_ID_LEN} characters of a-z 0-9 - (not starting or ending with -)")));
    }
    if spec.owner.is_empty() || spec.owner.len() > 256 {
        return Err(DeploymentError::Invalid("owner must be 1-256 bytes".into()));
    }
    if spec.plugin_dirs.len() > MAX_PLUGIN_DIRS {
        return Err(DeploymentError::Invalid(format!("a deployment has at most {MAX_PLUGIN_DIRS} plugin directories")));
    }
    if spec.plugin_dirs.iter().any(|d| d.as_os_str().is_empty() || d.as_os_str().len() > 4096) {
        return Err(DeploymentError::Invalid("each plugin directory must be a path of 1-4096 bytes".into()));
    }
    if let Some(l) = spec.limits
        && l.max_running == 0
    {
        return Err(DeploymentError::Invalid("limits.max_running must be at least 1".into()));
    }
    Ok(())
}

/// The demo identity every caller of public demo deployment `id` shares
/// (no account is named so: account names have no `/`).
pub fn demo_owner(id: &str) -> String {
    format!("demo/{id}")
}

/// Seconds a caller is told to wait while a deployment starts.
pub const NOT_READY_RETRY_S: u64 = 2;

impl From<DeploymentError> for super::ServiceError {
    fn from(e: DeploymentError) -> super::ServiceError {
        match e {
            DeploymentError::NotFound(_) => super::ServiceError::NotFound,
            DeploymentError::Store(e) => super::ServiceError::Store(e),
            e => super::ServiceError::InvalidRequest(e.to_string()),
        }
    }
}

mod serving;
pub use serving::{PluginSource, load};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::FileDeployments;

    fn spec(id: &str) -> DeploymentSpec {
        DeploymentSpec { id: id.into(), owner: "acme".into(), plugin_dirs: vec![], public_demo: false, limits: None }
    }

    impl Deployments {
        async fn create_plain(&self, spec: DeploymentSpec) -> Result<(DeploymentRecord, u64), DeploymentError> {
            self.create(spec, None).await
        }
    }

    const FALLBACK: OwnerLimits = OwnerLimits { max_running: 4, max_queued: 40 };

    fn memory() -> Arc<dyn DeploymentStore> {
        Arc::new(FileDeployments::open(None).unwrap())
    }

    #[tokio::test]
    async fn ids_are_checked_and_unique() {
        let d = Deployments::open(memory()).await.unwrap();
        for bad in ["", "Upper", "a/b", "-x", "x-", &"x".repeat(64)] {
            assert!(matches!(d.create_plain(spec(bad)).await, Err(DeploymentError::Invalid(_))), "{bad}");
        }
        d.create_plain(spec("demo-1")).await.unwrap();
        assert!(matches!(d.create_plain(spec("demo-1")).await, Err(DeploymentError::Exists(_))));
        assert!(matches!(d.stop("nope").await, Err(DeploymentError::NotFound(_))));
    }

    #[tokio::test]
    async fn states_move_and_stale_loads_are_dropped() {
        let d = Deployments::open(memory()).await.unwrap();
        let (rec, generation) = d.create_plain(spec("a")).await.unwrap();
        assert_eq!(rec.state, DeploymentState::Starting);
        assert_eq!(d.limits("a", FALLBACK).max_running, 0, "no job starts before it is ready");
        d.stop("a").await.unwrap();
        // The load that began before the stop finishes after it: ignored.
        d.finish_load("a", generation, Err("late".into())).await.unwrap();
        assert_eq!(d.get("a").unwrap().state, DeploymentState::Stopped);
        let (rec, load) = d.start("a").await.unwrap();
        assert_eq!((rec.state, load), (DeploymentState::Starting, Some(generation + 2)));
        assert_eq!(d.start("a").await.unwrap().1, None, "already starting");
        d.finish_load("a", generation + 2, Err("bad plugin".into())).await.unwrap();
        let rec = d.get("a").unwrap();
        assert_eq!((rec.state, rec.error.as_deref()), (DeploymentState::Failed, Some("bad plugin")));
        assert!(d.loaded("a").is_none());
    }

    /// What another host's operator did, followed here without writing;
    /// a load's outcome stays this host's where hosts share the store.
    #[tokio::test]
    async fn changes_made_through_another_host_are_followed() {
        let store = memory();
        let (here, there) = (Deployments::open(store.clone()).await.unwrap().shared(), Deployments::open(store.clone()).await.unwrap().shared());
        let (_, generation) = there.create_plain(spec("a")).await.unwrap();
        let stored = || async { here.stored("a").await.unwrap() };
        assert_eq!(here.reconcile("a", stored().await), Reconciled::Load(0), "made there: loads here");
        assert_eq!(here.get("a").unwrap().state, DeploymentState::Starting);
        // Loads finish on each host; neither outcome is written.
        there.finish_load("a", generation, Err("not there".into())).await.unwrap();
        assert_eq!(stored().await.unwrap().state, DeploymentState::Starting);
        assert_eq!(here.reconcile("a", stored().await), Reconciled::Unchanged);
        there.stop("a").await.unwrap();
        assert_eq!(here.reconcile("a", stored().await), Reconciled::Stopped);
        assert_eq!(here.get("a").unwrap().state, DeploymentState::Stopped);
        assert_eq!(here.reconcile("a", stored().await), Reconciled::Unchanged, "once");
        there.start("a").await.unwrap();
        assert_eq!(here.reconcile("a", stored().await), Reconciled::Load(2), "started there: loads here again");
        // A creation taken back there: gone here too; one made here and
        // not yet seen in the store stays.
        assert_eq!(here.reconcile("a", None), Reconciled::Stopped);
        assert!(here.get("a").is_none());
        assert_eq!(there.reconcile("a", None), Reconciled::Unchanged);
        assert!(there.get("a").is_some());
        assert_eq!(here.absent_from(&[]), Vec::<String>::new());
        there.create_plain(spec("b")).await.unwrap();
        let all = here.stored_all().await.unwrap();
        assert_eq!(all.iter().map(|(id, _)| id.as_str()).collect::<Vec<_>>(), ["a", "b"]);
        // A store alone (embedded) keeps each load's outcome.
        let alone = Deployments::open(memory()).await.unwrap();
        let (_, generation) = alone.create_plain(spec("c")).await.unwrap();
        alone.finish_load("c", generation, Err("bad".into())).await.unwrap();
        assert_eq!(alone.stored("c").await.unwrap().unwrap().state, DeploymentState::Failed);
    }

    #[tokio::test]
    async fn deployments_survive_a_reopen_and_serving_ones_start_again() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("deployments.json");
        {
            let d = Deployments::open(Arc::new(FileDeployments::open(Some(file.clone())).unwrap())).await.unwrap();
            d.create_plain(spec("keep")).await.unwrap();
            d.create_plain(DeploymentSpec { public_demo: true, limits: Some(FALLBACK), ..spec("off") }).await.unwrap();
            d.stop("off").await.unwrap();
        }
        let d = Deployments::open(Arc::new(FileDeployments::open(Some(file)).unwrap())).await.unwrap();
        assert_eq!(d.list().len(), 2);
        let off = d.get("off").unwrap();
        assert!(off.spec.public_demo && off.state == DeploymentState::Stopped && off.spec.limits == Some(FALLBACK));
        assert_eq!(d.starting().into_iter().map(|(id, _)| id).collect::<Vec<_>>(), ["keep"]);
    }
}
