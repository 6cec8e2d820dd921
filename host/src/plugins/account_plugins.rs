//! Plugins an account installs for itself (cloud and serverless modes):
//! its `object_info`, validation and jobs see the host's plugins plus its
//! own, and no other account sees, runs or learns of them.
//!
//! Each account's view is a [`NodeRegistry`] of the host's plugins and its
//! own, rebuilt whole when either changes. A tenant grants nothing: its
//! plugins are identified by their folder, `<dir>/<account>/<name>`, which
//! no operator grant names unless the operator writes it, so a manifest
//! asking for the network or a secret is refused at load; the GPU is capped
//! off unless `account_plugin_gpu`; memory and time are capped by the
//! operator's node ceilings like any plugin's. The count per account is
//! bounded, each compile runs in the compiler child under its limits, an
//! account compiles one plugin at a time, and all accounts together at most
//! [`COMPILES`] (each child may take `compile_memory_mb`), so a compile bomb
//! holds one slot for at most `compile_timeout_s` and costs its own install.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::RwLock;

use super::identity::PluginId;
use super::live::{InstallError, Origin, PluginInfo, publish, settle, store, unstore};
use super::manifest::Manifest;
use super::registry::{NodeRegistry, RegistryError};
use super::runtime::{Plugin, PluginRuntime};
use crate::store::cluster::SharedPlugins;

/// Account installs compiling at once, across accounts.
pub const COMPILES: usize = 2;

/// The operator's bounds on account plugins.
#[derive(Debug, Clone, Copy)]
pub struct AccountQuota {
    /// Plugins one account may have installed.
    pub max_plugins: usize,
    /// Whether an account's plugin may use the GPU it asks for.
    pub gpu: bool,
}

/// Every account's own plugins and its view.
pub(super) struct AccountPlugins {
    runtime: Arc<PluginRuntime>,
    dir: PathBuf,
    quota: AccountQuota,
    /// Account → its plugins.
    own: RwLock<HashMap<String, Vec<Arc<Plugin>>>>,
    /// Account → the host's plugins plus its own.
    views: RwLock<HashMap<String, Arc<NodeRegistry>>>,
    /// Account → its change lock (one install or removal at a time each).
    turns: parking_lot::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Slots for compiles in progress (see [`COMPILES`]).
    compiles: tokio::sync::Semaphore,
}

/// The file in an account's folder naming the account.
pub(super) const OWNER_FILE: &str = "account";

impl AccountPlugins {
    /// Loads every account's plugins under `dir` on top of `base`. A plugin
    /// that no longer loads (or whose classes the host now provides) is
    /// left out with a warning: one tenant's plugin never stops a start.
    pub(super) async fn open(runtime: Arc<PluginRuntime>, dir: &Path, quota: AccountQuota, base: &NodeRegistry) -> Result<AccountPlugins, RegistryError> {
        let dir_err = |source| RegistryError::Dir { path: dir.to_path_buf(), source };
        std::fs::create_dir_all(dir).map_err(dir_err)?;
        let dir = dir.canonicalize().map_err(dir_err)?;
        let mut own: HashMap<String, Vec<Arc<Plugin>>> = HashMap::new();
        for account_dir in subdirs(&dir).map_err(dir_err)? {
            let Ok(owner) = std::fs::read_to_string(account_dir.join(OWNER_FILE)) else { continue };
            settle(&account_dir).map_err(dir_err)?;
            for plugin_dir in subdirs(&account_dir).map_err(dir_err)? {
                match load_stored(&runtime, &plugin_dir, quota).await {
                    Ok(plugin) => own.entry(owner.clone()).or_default().push(Arc::new(plugin)),
                    Err(e) => tracing::warn!(account = %owner, dir = %plugin_dir.display(), error = %e, "an account's plugin does not load; left out"),
                }
            }
        }
        let plugins = AccountPlugins {
            runtime,
            dir,
            quota,
            own: RwLock::new(own),
            views: RwLock::default(),
            turns: Default::default(),
            compiles: tokio::sync::Semaphore::new(COMPILES),
        };
        plugins.rebase(base);
        Ok(plugins)
    }

    /// `owner`'s view, when it has plugins of its own.
    pub(super) fn view(&self, owner: &str) -> Option<Arc<NodeRegistry>> {
        self.views.read().get(owner).cloned()
    }

    /// Every account's view, as it stands.
    pub(super) fn views(&self) -> HashMap<String, Arc<NodeRegistry>> {
        self.views.read().clone()
    }

    /// Builds every account's view again on a new host registry.
    pub(super) fn rebase(&self, base: &NodeRegistry) {
        let own = self.own.read();
        let views = own.iter().map(|(owner, plugins)| (owner.clone(), Arc::new(view_of(base, plugins, owner)))).collect();
        *self.views.write() = views;
    }

    /// `owner`'s own plugins.
    pub(super) fn list(&self, owner: &str) -> Vec<PluginInfo> {
        self.own.read().get(owner).map(|ps| ps.iter().map(|p| PluginInfo::of(p, true)).collect()).unwrap_or_default()
    }

    /// Plugins one account may have.
    pub(super) fn max_plugins(&self) -> usize {
        self.quota.max_plugins
    }

    /// The accounts with plugins of their own here.
    pub(super) fn owners(&self) -> Vec<String> {
        self.own.read().keys().cloned().collect()
    }

    /// The names of `owner`'s own plugins here.
    pub(super) fn names(&self, owner: &str) -> Vec<String> {
        self.own.read().get(owner).map(|ps| ps.iter().map(|p| p.manifest.name.clone()).collect()).unwrap_or_default()
    }

    /// `owner`'s change lock: one install or removal of its plugins at a
    /// time, and its plugins followed from the shared store in its turn.
    pub(super) fn turn(&self, owner: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.turns.lock().entry(owner.to_string()).or_default().clone()
    }

    /// The folder of `owner`'s plugins (a hash: account ids never name a path).
    pub(super) fn account_dir(&self, owner: &str) -> PathBuf {
        self.dir.join(&blake3::hash(owner.as_bytes()).to_hex()[..32])
    }

    /// Installs (or upgrades) `owner`'s plugin on top of `base`, in the
    /// account's turn ([`AccountPlugins::turn`] held). A caller's install
    /// is written to the `shared` store first, where there is one (which
    /// holds the account to its quota across hosts); one followed from it
    /// was.
    pub(super) async fn install_locked(
        &self,
        owner: &str,
        base: &NodeRegistry,
        (manifest_text, component): (&str, Vec<u8>),
        shared: Option<&dyn SharedPlugins>,
        origin: Origin,
    ) -> Result<PluginInfo, InstallError> {
        let mut manifest = Manifest::parse(manifest_text)?;
        let name = manifest.name.clone();
        if base.plugins().iter().any(|p| p.manifest.name == name) {
            return Err(InstallError::Fixed(name));
        }
        let others: Vec<Arc<Plugin>> =
            self.own.read().get(owner).map(|ps| ps.iter().filter(|p| p.manifest.name != name).cloned().collect()).unwrap_or_default();
        if matches!(origin, Origin::Caller) && others.len() >= self.quota.max_plugins {
            return Err(InstallError::Quota(self.quota.max_plugins));
        }
        cap(&mut manifest, self.quota);
        let account_dir = self.account_dir(owner);
        let target = account_dir.join(&name);
        let runtime = self.runtime.clone();
        let wasm = Arc::new(component);
        let slot = self.compiles.acquire().await.map_err(|e| InstallError::Io(std::io::Error::other(e.to_string())))?;
        let plugin = Arc::new(load_blocking(runtime, PluginId::Dir(target.clone()), manifest, wasm.clone()).await?);
        drop(slot);
        // Its classes must be new to the account's view.
        NodeRegistry::of(base.plugins().iter().cloned().chain(others.iter().cloned()).chain([plugin.clone()]))?;
        let mark = publish(shared, owner, (manifest_text, &plugin, &wasm), Some(self.quota.max_plugins), origin).await?;
        let (text, component_name) = (manifest_text.to_string(), plugin.manifest.component.clone());
        let owner_text = owner.to_string();
        tokio::task::spawn_blocking(move || {
            crate::atomic_file::write(&account_dir.join(OWNER_FILE), owner_text.as_bytes(), None)?;
            store(&account_dir, &target, (&text, &component_name, &wasm), mark.as_deref())
        })
        .await
        .map_err(|e| InstallError::Io(std::io::Error::other(e.to_string())))??;
        tracing::info!(account = %owner, plugin = %name, hash = %plugin.component_hash, "account plugin installed");
        let info = PluginInfo::of(&plugin, true);
        let mine: Vec<Arc<Plugin>> = others.into_iter().chain([plugin]).collect();
        let view = Arc::new(view_of(base, &mine, owner));
        self.own.write().insert(owner.to_string(), mine);
        self.views.write().insert(owner.to_string(), view);
        Ok(info)
    }

    /// Removes `owner`'s plugin `name` here, in the account's turn.
    pub(super) async fn remove_locked(&self, owner: &str, base: &NodeRegistry, name: &str) -> Result<(), InstallError> {
        let mine: Vec<Arc<Plugin>> = self.own.read().get(owner).cloned().unwrap_or_default();
        if !mine.iter().any(|p| p.manifest.name == name) {
            return Err(InstallError::NotFound(name.to_string()));
        }
        let (account_dir, name_owned) = (self.account_dir(owner), name.to_string());
        tokio::task::spawn_blocking(move || unstore(&account_dir, &name_owned)).await.map_err(|e| InstallError::Io(std::io::Error::other(e.to_string())))??;
        let rest: Vec<Arc<Plugin>> = mine.into_iter().filter(|p| p.manifest.name != name).collect();
        let mut own = self.own.write();
        let mut views = self.views.write();
        if rest.is_empty() {
            own.remove(owner);
            views.remove(owner);
        } else {
            views.insert(owner.to_string(), Arc::new(view_of(base, &rest, owner)));
            own.insert(owner.to_string(), rest);
        }
        tracing::info!(account = %owner, plugin = %name, "account plugin removed");
        Ok(())
    }
}

/// The operator's caps on what an account's manifest asks.
fn cap(manifest: &mut Manifest, quota: AccountQuota) {
    if !quota.gpu {
        manifest.capabilities.gpu = false;
    }
}

/// The host's plugins plus `own`, leaving out (with a warning) any of
/// `own` that no longer fits (the host now provides one of its classes).
fn view_of(base: &NodeRegistry, own: &[Arc<Plugin>], owner: &str) -> NodeRegistry {
    let mut fitting: Vec<Arc<Plugin>> = base.plugins().to_vec();
    for plugin in own {
        let candidate: Vec<Arc<Plugin>> = fitting.iter().cloned().chain([plugin.clone()]).collect();
        match NodeRegistry::of(candidate.iter().cloned()) {
            Ok(_) => fitting = candidate,
            Err(e) => tracing::warn!(account = %owner, plugin = %plugin.manifest.name, error = %e, "an account's plugin is left out of its view"),
        }
    }
    // Every member was just checked together.
    NodeRegistry::of(fitting).unwrap_or_default()
}

/// Loads a stored account plugin (its manifest capped again).
async fn load_stored(runtime: &Arc<PluginRuntime>, dir: &Path, quota: AccountQuota) -> Result<Plugin, InstallError> {
    let text = std::fs::read_to_string(dir.join("kiln-plugin.toml"))?;
    let mut manifest = Manifest::parse(&text)?;
    cap(&mut manifest, quota);
    let wasm = std::fs::read(dir.join(&manifest.component))?;
    load_blocking(runtime.clone(), PluginId::Dir(dir.to_path_buf()), manifest, Arc::new(wasm)).await
}

/// Compiles and loads a plugin on the blocking pool (the compile waits on
/// the compiler child).
pub(super) async fn load_blocking(runtime: Arc<PluginRuntime>, id: PluginId, manifest: Manifest, wasm: Arc<Vec<u8>>) -> Result<Plugin, InstallError> {
    let handle = tokio::runtime::Handle::current();
    let loaded = tokio::task::spawn_blocking(move || handle.block_on(runtime.load(id, manifest, &wasm)))
        .await
        .map_err(|e| InstallError::Io(std::io::Error::other(e.to_string())))?;
    Ok(loaded.map_err(RegistryError::from)?)
}

/// The folders in `dir` (not its staging leftovers: `settle` handles them).
pub(super) fn subdirs(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir() && !p.file_name().is_some_and(|n| n.to_string_lossy().starts_with('.')))
        .collect();
    out.sort();
    Ok(out)
}
