//! The plugin set a running host serves: the plugins it started with
//! (bundled and `--plugins` folders, fixed for its life) plus the plugins
//! an operator installs into it (admin API), kept under
//! `<data dir>/plugins/<name>/` and loaded again at every start.
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
    /// Bumped by every change (caches of `object_info` compare it).
    generation: AtomicU64,
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
    /// Installed through the admin API (else it came with the server).
    pub installed: bool,
}

impl PluginInfo {
    fn of(plugin: &Plugin, installed: bool) -> PluginInfo {
        PluginInfo {
            name: plugin.manifest.name.clone(),
            version: plugin.manifest.version.clone(),
            hash: format!("blake3:{}", plugin.component_hash.to_hex()),
            classes: plugin.definitions.iter().map(|d| d.class_type.clone()).collect(),
            installed,
        }
    }
}

/// A staged folder, and the leftover of a replaced one.
const STAGING: &str = ".staging-";
const REPLACED: &str = ".old-";

impl From<Arc<NodeRegistry>> for LivePlugins {
    /// A set that never changes (no installs).
    fn from(registry: Arc<NodeRegistry>) -> LivePlugins {
        LivePlugins { fixed: registry.plugins().to_vec(), installs: None, current: RwLock::new(registry), generation: AtomicU64::new(0) }
    }
}

impl LivePlugins {
    /// The `fixed` plugins plus every plugin installed under `dir`
    /// (created when missing; what a crash left half-moved is settled first).
    pub async fn open(runtime: Arc<PluginRuntime>, fixed: Arc<NodeRegistry>, dir: &Path) -> Result<LivePlugins, RegistryError> {
        let dir_err = |source| RegistryError::Dir { path: dir.to_path_buf(), source };
        std::fs::create_dir_all(dir).map_err(dir_err)?;
        let dir = dir.canonicalize().map_err(dir_err)?;
        settle(&dir).map_err(dir_err)?;
        let mut registry = NodeRegistry::of(fixed.plugins().iter().cloned())?;
        let mut names: Vec<PathBuf> = std::fs::read_dir(&dir).map_err(dir_err)?.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.is_dir()).collect();
        names.sort();
        for plugin_dir in names {
            registry.load_dir(&runtime, &plugin_dir).await?;
        }
        Ok(LivePlugins {
            fixed: fixed.plugins().to_vec(),
            installs: Some(Installs { runtime, dir, changing: tokio::sync::Mutex::new(()) }),
            current: RwLock::new(Arc::new(registry)),
            generation: AtomicU64::new(0),
        })
    }

    /// The registry new work uses.
    pub fn current(&self) -> Arc<NodeRegistry> {
        self.current.read().clone()
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
        let runtime = installs.runtime.clone();
        let wasm = Arc::new(component);
        let loading = wasm.clone();
        let handle = tokio::runtime::Handle::current();
        let plugin = tokio::task::spawn_blocking(move || handle.block_on(runtime.load(id, manifest, &loading)))
            .await
            .map_err(|e| InstallError::Io(std::io::Error::other(e.to_string())))?
            .map_err(RegistryError::from)?;
        let plugin = Arc::new(plugin);
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
        *self.current.write() = Arc::new(registry);
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
fn store(dir: &Path, target: &Path, manifest: &str, component_name: &str, wasm: &[u8]) -> std::io::Result<()> {
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
fn unstore(dir: &Path, name: &str) -> std::io::Result<()> {
    let removed = dir.join(format!("{REPLACED}{name}"));
    std::fs::rename(dir.join(name), &removed)?;
    crate::atomic_file::sync_dir(dir)?;
    std::fs::remove_dir_all(&removed)
}

/// Settles what a crash left in `dir`: staged folders are dropped; a
/// replaced folder comes back if its successor never got into place.
fn settle(dir: &Path) -> std::io::Result<()> {
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
