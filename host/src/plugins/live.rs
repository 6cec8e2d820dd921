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

/// The host's current plugins, and where installed ones live.
pub struct LivePlugins {
    /// The plugins it started with: never replaced or removed here.
    fixed: Vec<Arc<Plugin>>,
    installs: Option<Installs>,
    current: RwLock<Arc<NodeRegistry>>,
    /// Accounts' own plugins (cloud and serverless modes).
    accounts: Option<AccountPlugins>,
    /// Bumped by every change, an account's included (caches of
    /// `object_info` compare it).
    generation: AtomicU64,
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
struct Installs {
    runtime: Arc<PluginRuntime>,
    /// Canonical: an installed plugin's identity is `dir/<name>`.
    dir: PathBuf,
    /// One change at a time (each builds on the registry before it).
    changing: tokio::sync::Mutex<()>,
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

impl From<Arc<NodeRegistry>> for LivePlugins {
    /// A set that never changes (no installs).
    fn from(registry: Arc<NodeRegistry>) -> LivePlugins {
        LivePlugins { fixed: registry.plugins().to_vec(), installs: None, current: RwLock::new(registry), accounts: None, generation: AtomicU64::new(0) }
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
        })
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
        let info = accounts.install(owner, &base, manifest_text, component).await?;
        self.after_account_change(accounts, &base);
        Ok(info)
    }

    /// Removes `owner`'s own plugin `name`.
    pub async fn remove_for(&self, owner: &str, name: &str) -> Result<(), InstallError> {
        let accounts = self.accounts.as_ref().ok_or(InstallError::Disabled)?;
        let base = self.current();
        accounts.remove(owner, &base, name).await?;
        self.after_account_change(accounts, &base);
        Ok(())
    }

    /// An account's view was built on `base`: if the host's plugins changed
    /// meanwhile, every view is built again on the new ones.
    fn after_account_change(&self, accounts: &AccountPlugins, base: &Arc<NodeRegistry>) {
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
        let manifest = Manifest::parse(manifest_text)?;
        let name = manifest.name.clone();
        if self.fixed.iter().any(|p| p.manifest.name == name) {
            return Err(InstallError::Fixed(name));
        }
        let _turn = installs.changing.lock().await;
        let target = installs.dir.join(&name);
        let id = PluginId::Dir(target.clone());
        let wasm = Arc::new(component);
        let plugin = Arc::new(load_blocking(installs.runtime.clone(), id, manifest, wasm.clone()).await?);
        let others = self.current().plugins().iter().filter(|p| p.manifest.name != name).cloned().collect::<Vec<_>>();
        let registry = NodeRegistry::of(others.into_iter().chain([plugin.clone()]))?;
        let text = manifest_text.to_string();
        let component_name = plugin.manifest.component.clone();
        let dir = installs.dir.clone();
        tokio::task::spawn_blocking(move || store(&dir, &target, &text, &component_name, &wasm))
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

/// Writes the plugin into `target` (a folder of `dir`): staged, synced,
/// then renamed over the old version.
pub(super) fn store(dir: &Path, target: &Path, manifest: &str, component_name: &str, wasm: &[u8]) -> std::io::Result<()> {
    let staging = dir.join(format!("{STAGING}{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir(&staging)?;
    let written = (|| {
        crate::atomic_file::write(&staging.join("kiln-plugin.toml"), manifest.as_bytes(), None)?;
        crate::atomic_file::write(&staging.join(component_name), wasm, None)
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
        store(dir.path(), &target, "v1", "p.wasm", b"one").unwrap();
        store(dir.path(), &target, "v2", "p.wasm", b"two").unwrap();
        assert_eq!(files(dir.path()), ["p"], "no staged or replaced folder stays");
        assert_eq!(std::fs::read_to_string(target.join("kiln-plugin.toml")).unwrap(), "v2");
        assert_eq!(std::fs::read(target.join("p.wasm")).unwrap(), b"two");
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
