//! The plugin set a running host serves: the plugins it started with
//! (bundled and `--plugins` folders, fixed for its life) plus the plugins
//! an operator installs into it (admin API), kept under
//! `<data dir>/plugins/<name>/` and loaded again at every start; with
//! accounts, each account's own plugins on top (see `account_plugins`).
//!
//! A change never edits a registry in place: install, upgrade and remove
//! build a whole new [`NodeRegistry`] (every rule of `registry` applied:
//! unique plugin names, classes and routes) and swap it in. Whoever holds
//! the old one (a running job, see `executor::RunContext`) keeps using its
//! components until it lets go. A plugin is compiled and checked before
//! anything is written or swapped, so a failed install leaves no trace; its
//! files are staged beside the final folder and renamed into place, so a
//! crash leaves the old version or the new one, never half of one.
//!
//! Where hosts share a store, an install or removal through this host is
//! written there first (after its compile and checks here) and the other
//! hosts follow it (see `shared`); a plugin kept here that every host has
//! carries a mark of its revision.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::RwLock;

use super::account_plugins::{AccountPlugins, AccountQuota, load_blocking};
use super::identity::PluginId;
use super::manifest::{Manifest, ManifestError};
use super::outcome::LoadError;
use super::registry::{NodeRegistry, RegistryError};
use super::runtime::{Plugin, PluginRuntime};
use crate::store::StoreError;
use crate::store::cluster::{OPERATOR_SCOPE, Publish, Published, SharedPlugin, SharedPlugins};

/// The folder of a data directory where the operator's installed plugins
/// are kept.
pub const INSTALLS_DIR: &str = "plugins";
/// The folder of a data directory where accounts' own plugins are kept.
pub const ACCOUNT_INSTALLS_DIR: &str = "account-plugins";

/// The host's current plugins, and where installed ones live.
pub struct LivePlugins {
    /// The plugins it started with: never replaced or removed here.
    pub(super) fixed: Vec<Arc<Plugin>>,
    pub(super) installs: Option<Installs>,
    current: RwLock<Arc<NodeRegistry>>,
    /// Accounts' own plugins (cloud and serverless modes).
    pub(super) accounts: Option<AccountPlugins>,
    /// Bumped by every change, an account's included (caches of
    /// `object_info` compare it).
    generation: AtomicU64,
    /// Where hosts share a store: the plugins installed into all of them.
    pub(super) shared: Option<Arc<dyn SharedPlugins>>,
    /// Revisions followed from the shared store that did not load here,
    /// by scope and name (not tried again until they change).
    pub(super) refused: parking_lot::Mutex<std::collections::HashMap<(String, String), String>>,
    /// Scopes to follow again soon (see [`LivePlugins::take_pending`]).
    pub(super) pending: parking_lot::Mutex<std::collections::BTreeSet<String>>,
}

/// The components a host has at one moment: its plugins, and each
/// account's view (its own on top). Whether it can run a job on exactly
/// the components the job was validated against asks this.
#[derive(Clone)]
pub struct Holdings {
    host: Arc<NodeRegistry>,
    accounts: std::collections::HashMap<String, Arc<NodeRegistry>>,
}

impl Holdings {
    /// Whether `owner`'s work here has each of `components` (plugin name →
    /// `blake3:<hex>`).
    pub fn has(&self, owner: &str, components: &std::collections::BTreeMap<String, String>) -> bool {
        self.accounts.get(owner).unwrap_or(&self.host).has_components(components)
    }

    /// `blake3:<hex>` of every component held, for any owner.
    pub fn hashes(&self) -> Vec<String> {
        let mut all: Vec<String> = std::iter::once(&self.host).chain(self.accounts.values()).flat_map(|r| r.component_hashes()).collect();
        all.sort_unstable();
        all.dedup();
        all
    }
}

/// Where installed plugins are kept and how they are loaded.
pub(super) struct Installs {
    runtime: Arc<PluginRuntime>,
    /// Canonical: an installed plugin's identity is `dir/<name>`.
    pub(super) dir: PathBuf,
    /// One change at a time (each builds on the registry before it).
    pub(super) changing: tokio::sync::Mutex<()>,
}

/// Where an install comes from.
#[derive(Debug, Clone)]
pub(super) enum Origin {
    /// A caller of this host: written to the shared store, where there is
    /// one, before it is kept here.
    Caller,
    /// Followed from the shared store: kept here, marked with this revision.
    Shared(String),
}

/// Why a plugin was not installed or removed.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error("this server installs no plugins")]
    Disabled,
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error("plugin `{0}` came with the server (bundled or a plugin folder): it cannot be replaced or removed while it runs")]
    Fixed(String),
    #[error("no installed plugin is named `{0}`")]
    NotFound(String),
    #[error("an account may have at most {0} plugins installed: remove one first")]
    Quota(usize),
    /// Compile, load or registry rules (a class or route taken).
    #[error(transparent)]
    Refused(#[from] RegistryError),
    #[error("cannot store the plugin: {0}")]
    Io(#[from] std::io::Error),
    /// The store the hosts share did not take it.
    #[error(transparent)]
    Shared(#[from] StoreError),
}

/// One plugin as listed.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PluginInfo {
    pub name: String,
    pub version: String,
    /// `blake3:<hex>` of its component.
    pub hash: String,
    pub classes: Vec<String>,
    /// Installed into the running host (else it came with the server).
    pub installed: bool,
    /// What one node call of it may use, after the operator's ceilings.
    pub memory_mb: u64,
    pub timeout_ms: u64,
    /// Whether it gets the GPU (asked for, and not capped off).
    pub gpu: bool,
}

impl PluginInfo {
    pub(super) fn of(plugin: &Plugin, installed: bool) -> PluginInfo {
        PluginInfo {
            name: plugin.manifest.name.clone(),
            version: plugin.manifest.version.clone(),
            hash: format!("blake3:{}", plugin.component_hash.to_hex()),
            classes: plugin.definitions.iter().map(|d| d.class_type.clone()).collect(),
            installed,
            memory_mb: plugin.limits.memory_bytes >> 20,
            timeout_ms: u64::try_from(plugin.limits.timeout.as_millis()).unwrap_or(u64::MAX),
            gpu: plugin.manifest.capabilities.gpu,
        }
    }
}

/// A staged folder, and the leftover of a replaced one.
const STAGING: &str = ".staging-";
const REPLACED: &str = ".old-";
/// The file in a plugin's folder holding its shared revision (see
/// [`SharedPlugin::revision`]): every host sharing the store has it.
const SHARED_MARK: &str = ".shared";

/// The shared revision of the plugin kept in `dir`, if it is marked.
pub(super) fn mark_of(dir: &Path) -> Option<String> {
    std::fs::read_to_string(dir.join(SHARED_MARK)).ok()
}

/// Marks the plugin kept in `dir` as shared at `revision`.
pub(super) fn mark(dir: &Path, revision: &str) -> std::io::Result<()> {
    crate::atomic_file::write(&dir.join(SHARED_MARK), revision.as_bytes(), None)
}

/// Writes a plugin `plugin` (from `manifest_text` and `wasm`) of `scope`
/// that a caller of this host installs to the shared store, if any; an
/// install followed from it was written already. The revision to mark it
/// with when kept here, if shared.
pub(super) async fn publish(
    shared: Option<&dyn SharedPlugins>,
    scope: &str,
    (manifest_text, plugin, wasm): (&str, &Plugin, &[u8]),
    limit: Option<usize>,
    origin: Origin,
) -> Result<Option<String>, InstallError> {
    let shared = match (origin, shared) {
        (Origin::Shared(revision), _) => return Ok(Some(revision)),
        (Origin::Caller, None) => return Ok(None),
        (Origin::Caller, Some(shared)) => shared,
    };
    let record = SharedPlugin {
        scope: scope.to_string(),
        name: plugin.manifest.name.clone(),
        manifest: manifest_text.to_string(),
        component: plugin.component_hash.to_hex().to_string(),
    };
    match shared.publish(&record, wasm, Publish { limit, replace: true }).await? {
        Published::Done | Published::Present => Ok(Some(record.revision())),
        Published::Full => Err(InstallError::Quota(limit.unwrap_or_default())),
    }
}

impl From<Arc<NodeRegistry>> for LivePlugins {
    /// A set that never changes (no installs).
    fn from(registry: Arc<NodeRegistry>) -> LivePlugins {
        LivePlugins {
            fixed: registry.plugins().to_vec(),
            installs: None,
            current: RwLock::new(registry),
            accounts: None,
            generation: AtomicU64::new(0),
            shared: None,
            refused: Default::default(),
            pending: Default::default(),
        }
    }
}

impl LivePlugins {
    /// The `fixed` plugins plus every plugin installed under `dir`
    /// (created when missing; what a crash left half-moved is settled
    /// first), and, given `accounts` (their folder and quota), every
    /// account's own plugins.
    pub async fn open(
        runtime: Arc<PluginRuntime>,
        fixed: Arc<NodeRegistry>,
        dir: &Path,
        accounts: Option<(&Path, AccountQuota)>,
    ) -> Result<LivePlugins, RegistryError> {
        let dir_err = |source| RegistryError::Dir { path: dir.to_path_buf(), source };
        std::fs::create_dir_all(dir).map_err(dir_err)?;
        let dir = dir.canonicalize().map_err(dir_err)?;
        settle(&dir).map_err(dir_err)?;
        let mut registry = NodeRegistry::of(fixed.plugins().iter().cloned())?;
        for plugin_dir in super::account_plugins::subdirs(&dir).map_err(dir_err)? {
            registry.load_dir(&runtime, &plugin_dir).await?;
        }
        let accounts = match accounts {
            Some((accounts_dir, quota)) => Some(AccountPlugins::open(runtime.clone(), accounts_dir, quota, &registry).await?),
            None => None,
        };
        Ok(LivePlugins {
            fixed: fixed.plugins().to_vec(),
            installs: Some(Installs { runtime, dir, changing: tokio::sync::Mutex::new(()) }),
            current: RwLock::new(Arc::new(registry)),
            accounts,
            generation: AtomicU64::new(0),
            shared: None,
            refused: Default::default(),
            pending: Default::default(),
        })
    }

    /// Installs through this host go to `store` too, for every host sharing
    /// it; what others install there is followed (`follow_shared`).
    pub fn share(&mut self, store: Arc<dyn SharedPlugins>) {
        self.shared = Some(store);
    }

    /// The scopes to follow again from the shared store: where a change
    /// through this host may have reached the store but not this host (it
    /// failed here after the store's write, or the store's answer was
    /// lost), or a followed change could not be kept here.
    pub fn take_pending(&self) -> Vec<String> {
        std::mem::take(&mut *self.pending.lock()).into_iter().collect()
    }

    /// `done`, a change of `scope` through this host; one that failed after
    /// it may have been written to the shared store is followed again.
    fn after_change<T>(&self, scope: &str, done: Result<T, InstallError>) -> Result<T, InstallError> {
        if self.shared.is_some() && matches!(done, Err(InstallError::Io(_) | InstallError::Shared(_))) {
            self.pending.lock().insert(scope.to_string());
        }
        done
    }

    /// The registry new work uses: the host's plugins.
    pub fn current(&self) -> Arc<NodeRegistry> {
        self.current.read().clone()
    }

    /// The registry `owner`'s new work uses: the host's plugins, plus its
    /// own when it installed some.
    pub fn registry_for(&self, owner: &str) -> Arc<NodeRegistry> {
        self.accounts.as_ref().and_then(|a| a.view(owner)).unwrap_or_else(|| self.current())
    }

    /// The components this host has now, as a snapshot (see [`Holdings`]).
    pub fn holdings(&self) -> Holdings {
        Holdings { host: self.current(), accounts: self.accounts.as_ref().map(AccountPlugins::views).unwrap_or_default() }
    }

    /// `owner`'s own plugins.
    pub fn list_for(&self, owner: &str) -> Result<Vec<PluginInfo>, InstallError> {
        Ok(self.accounts.as_ref().ok_or(InstallError::Disabled)?.list(owner))
    }

    /// Installs (or upgrades) a plugin of `owner`'s own: seen by its work only.
    pub async fn install_for(&self, owner: &str, manifest_text: &str, component: Vec<u8>) -> Result<PluginInfo, InstallError> {
        let accounts = self.accounts.as_ref().ok_or(InstallError::Disabled)?;
        let base = self.current();
        let turn = accounts.turn(owner);
        let _turn = turn.lock().await;
        let installed = accounts.install_locked(owner, &base, (manifest_text, component), self.shared.as_deref(), Origin::Caller).await;
        let info = self.after_change(owner, installed)?;
        self.after_account_change(accounts, &base);
        Ok(info)
    }

    /// Removes `owner`'s own plugin `name`.
    pub async fn remove_for(&self, owner: &str, name: &str) -> Result<(), InstallError> {
        let accounts = self.accounts.as_ref().ok_or(InstallError::Disabled)?;
        let base = self.current();
        let turn = accounts.turn(owner);
        let _turn = turn.lock().await;
        let removed = async {
            let withdrawn = match &self.shared {
                Some(shared) => shared.withdraw(owner, name).await?,
                None => false,
            };
            match accounts.remove_locked(owner, &base, name).await {
                Err(InstallError::NotFound(_)) if withdrawn => Ok(()),
                done => done,
            }
        };
        let removed = removed.await;
        self.after_change(owner, removed)?;
        self.after_account_change(accounts, &base);
        Ok(())
    }

    /// An account's view was built on `base`: if the host's plugins changed
    /// meanwhile, every view is built again on the new ones.
    pub(super) fn after_account_change(&self, accounts: &AccountPlugins, base: &Arc<NodeRegistry>) {
        let current = self.current();
        if !Arc::ptr_eq(base, &current) {
            accounts.rebase(&current);
        }
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Changes so far (0 at start).
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Every plugin served now, in load order.
    pub fn list(&self) -> Vec<PluginInfo> {
        self.current().plugins().iter().map(|p| PluginInfo::of(p, self.is_installed(p))).collect()
    }

    fn is_installed(&self, plugin: &Arc<Plugin>) -> bool {
        !self.fixed.iter().any(|f| Arc::ptr_eq(f, plugin))
    }

    /// Installs (or upgrades: the same name) the plugin of `manifest_text`
    /// and `component`; compiled and checked first, under the runtime's
    /// compile limits, off the async threads.
    pub async fn install(&self, manifest_text: &str, component: Vec<u8>) -> Result<PluginInfo, InstallError> {
        let installs = self.installs.as_ref().ok_or(InstallError::Disabled)?;
        let _turn = installs.changing.lock().await;
        let installed = self.install_locked(installs, manifest_text, component, Origin::Caller).await;
        self.after_change(OPERATOR_SCOPE, installed)
    }

    /// [`LivePlugins::install`] in its turn (`installs.changing` held).
    pub(super) async fn install_locked(
        &self,
        installs: &Installs,
        manifest_text: &str,
        component: Vec<u8>,
        origin: Origin,
    ) -> Result<PluginInfo, InstallError> {
        let manifest = Manifest::parse(manifest_text)?;
        let name = manifest.name.clone();
        if self.fixed.iter().any(|p| p.manifest.name == name) {
            return Err(InstallError::Fixed(name));
        }
        let target = installs.dir.join(&name);
        let id = PluginId::Dir(target.clone());
        let wasm = Arc::new(component);
        let plugin = Arc::new(load_blocking(installs.runtime.clone(), id, manifest, wasm.clone()).await?);
        let others = self.current().plugins().iter().filter(|p| p.manifest.name != name).cloned().collect::<Vec<_>>();
        let registry = NodeRegistry::of(others.into_iter().chain([plugin.clone()]))?;
        let shared = publish(self.shared.as_deref(), OPERATOR_SCOPE, (manifest_text, &plugin, &wasm), None, origin).await?;
        let text = manifest_text.to_string();
        let component_name = plugin.manifest.component.clone();
        let dir = installs.dir.clone();
        tokio::task::spawn_blocking(move || store(&dir, &target, (&text, &component_name, &wasm), shared.as_deref()))
            .await
            .map_err(|e| InstallError::Io(std::io::Error::other(e.to_string())))??;
        tracing::info!(plugin = %name, version = %plugin.manifest.version, hash = %plugin.component_hash, "plugin installed");
        let info = PluginInfo::of(&plugin, true);
        self.swap(registry);
        Ok(info)
    }

    /// Removes the installed plugin `name`: new work no longer sees it.
    pub async fn remove(&self, name: &str) -> Result<(), InstallError> {
        let installs = self.installs.as_ref().ok_or(InstallError::Disabled)?;
        if self.fixed.iter().any(|p| p.manifest.name == name) {
            return Err(InstallError::Fixed(name.to_string()));
        }
        let _turn = installs.changing.lock().await;
        let removed = async {
            let withdrawn = match &self.shared {
                Some(shared) => shared.withdraw(OPERATOR_SCOPE, name).await?,
                None => false,
            };
            match self.remove_locked(installs, name).await {
                Err(InstallError::NotFound(_)) if withdrawn => Ok(()),
                done => done,
            }
        };
        let removed = removed.await;
        self.after_change(OPERATOR_SCOPE, removed)
    }

    /// [`LivePlugins::remove`] here, in its turn (`installs.changing` held).
    pub(super) async fn remove_locked(&self, installs: &Installs, name: &str) -> Result<(), InstallError> {
        let current = self.current();
        if !current.plugins().iter().any(|p| p.manifest.name == name) {
            return Err(InstallError::NotFound(name.to_string()));
        }
        let registry = NodeRegistry::of(current.plugins().iter().filter(|p| p.manifest.name != name).cloned())?;
        let (dir, name_owned) = (installs.dir.clone(), name.to_string());
        tokio::task::spawn_blocking(move || unstore(&dir, &name_owned)).await.map_err(|e| InstallError::Io(std::io::Error::other(e.to_string())))??;
        tracing::info!(plugin = %name, "plugin removed");
        self.swap(registry);
        Ok(())
    }

    fn swap(&self, registry: NodeRegistry) {
        let registry = Arc::new(registry);
        *self.current.write() = registry.clone();
        if let Some(accounts) = &self.accounts {
            accounts.rebase(&registry);
        }
        self.generation.fetch_add(1, Ordering::AcqRel);
    }
}

impl From<LoadError> for InstallError {
    fn from(e: LoadError) -> InstallError {
        InstallError::Refused(e.into())
    }
}

/// Writes the plugin (its manifest's text, its component's file name and
/// bytes) into `target` (a folder of `dir`), marked with its `shared`
/// revision if it has one: staged, synced, then renamed over the old
/// version.
pub(super) fn store(dir: &Path, target: &Path, (manifest, component_name, wasm): (&str, &str, &[u8]), shared: Option<&str>) -> std::io::Result<()> {
    let staging = dir.join(format!("{STAGING}{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir(&staging)?;
    let written = (|| {
        crate::atomic_file::write(&staging.join("kiln-plugin.toml"), manifest.as_bytes(), None)?;
        crate::atomic_file::write(&staging.join(component_name), wasm, None)?;
        shared.map_or(Ok(()), |revision| mark(&staging, revision))
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_dir_all(&staging);
        return Err(e);
    }
    let name = target.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let replaced = dir.join(format!("{REPLACED}{name}"));
    if target.exists() {
        std::fs::rename(target, &replaced)?;
    }
    std::fs::rename(&staging, target)?;
    crate::atomic_file::sync_dir(dir)?;
    if replaced.exists() {
        std::fs::remove_dir_all(&replaced)?;
    }
    Ok(())
}

/// Moves the folder of `name` aside, then deletes it.
pub(super) fn unstore(dir: &Path, name: &str) -> std::io::Result<()> {
    let removed = dir.join(format!("{REPLACED}{name}"));
    std::fs::rename(dir.join(name), &removed)?;
    crate::atomic_file::sync_dir(dir)?;
    std::fs::remove_dir_all(&removed)
}

/// Settles what a crash left in `dir`: staged folders are dropped; a
/// replaced folder comes back if its successor never got into place.
pub(super) fn settle(dir: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let Some(file) = path.file_name().and_then(|n| n.to_str()).map(str::to_string) else { continue };
        if file.starts_with(STAGING) {
            std::fs::remove_dir_all(&path)?;
        } else if let Some(name) = file.strip_prefix(REPLACED) {
            let target = dir.join(name);
            if target.exists() { std::fs::remove_dir_all(&path)? } else { std::fs::rename(&path, &target)? }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        names
    }

    /// A host has a job's components when each named plugin is there with
    /// that very component, for the job's owner (an account's own view, or
    /// the host's plugins).
    #[test]
    fn holdings_answer_by_plugin_name_and_component_for_the_owner() {
        let host = crate::test_support::registry().clone();
        let core = host.plugins().iter().find(|p| p.manifest.name == "core-image").expect("core-image is bundled");
        let hash = super::super::identity::hash_grant(&core.component_hash);
        let named = |pairs: &[(&str, &str)]| pairs.iter().map(|(n, h)| (n.to_string(), h.to_string())).collect::<std::collections::BTreeMap<_, _>>();
        let empty = Arc::new(NodeRegistry::default());
        let holdings = Holdings { host, accounts: [("bare".to_string(), empty)].into() };
        assert!(holdings.has("anyone", &named(&[("core-image", &hash)])));
        assert!(holdings.has("anyone", &named(&[])));
        assert!(!holdings.has("anyone", &named(&[("core-image", "blake3:00")])), "another build");
        assert!(!holdings.has("anyone", &named(&[("renamed", &hash)])), "the same component under another name");
        assert!(!holdings.has("bare", &named(&[("core-image", &hash)])), "an account's view is its own");
        assert!(holdings.hashes().contains(&hash));
    }

    #[test]
    fn an_upgrade_replaces_the_folder_whole_and_a_removal_takes_it_away() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("p");
        store(dir.path(), &target, ("v1", "p.wasm", b"one"), None).unwrap();
        store(dir.path(), &target, ("v2", "p.wasm", b"two"), Some("r2")).unwrap();
        assert_eq!(files(dir.path()), ["p"], "no staged or replaced folder stays");
        assert_eq!(std::fs::read_to_string(target.join("kiln-plugin.toml")).unwrap(), "v2");
        assert_eq!(std::fs::read(target.join("p.wasm")).unwrap(), b"two");
        assert_eq!(mark_of(&target).as_deref(), Some("r2"), "the new version's mark");
        unstore(dir.path(), "p").unwrap();
        assert!(files(dir.path()).is_empty());
    }

    /// What a crash can leave at each step of `store`, and what `settle`
    /// makes of it: the old version or the new one, whole.
    #[test]
    fn settle_keeps_the_old_version_or_the_new_one_never_a_half() {
        let dir = tempfile::tempdir().unwrap();
        let write = |folder: &str, version: &str| {
            std::fs::create_dir_all(dir.path().join(folder)).unwrap();
            std::fs::write(dir.path().join(folder).join("kiln-plugin.toml"), version).unwrap();
        };
        let version = |folder: &str| std::fs::read_to_string(dir.path().join(folder).join("kiln-plugin.toml")).unwrap();
        // Crashed while staging: the staged copy goes, the old one stays.
        write("a", "old");
        write(".staging-1", "new");
        // Crashed between moving the old version aside and moving the new in.
        write(".old-b", "old");
        write(".staging-2", "new");
        // Crashed after the new version was in place, before the old one was deleted.
        write("c", "new");
        write(".old-c", "old");
        settle(dir.path()).unwrap();
        assert_eq!(files(dir.path()), ["a", "b", "c"]);
        assert_eq!((version("a"), version("b"), version("c")), ("old".into(), "old".into(), "new".into()));
    }
}
