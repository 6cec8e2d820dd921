//! The node registry: which plugin provides each node class.
//!
//! Built at start-up from the bundled plugins and the plugin directories,
//! and built anew when a plugin is installed or removed in a running host
//! (see `live`); `object_info` and validation read node definitions from here.
//! Plugin names and class names are unique: a plugin claiming a name or a
//! class already taken (a bundled one's included) is refused, so no plugin
//! can pass for another in logs, errors or `object_info`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::bindings::node;
use super::identity::PluginId;
use super::manifest::Manifest;
use super::outcome::LoadError;
use super::runtime::{NodeDef, Plugin, PluginRuntime};

/// Every loaded node class, by class name.
#[derive(Default)]
pub struct NodeRegistry {
    plugins: Vec<Arc<Plugin>>,
    classes: HashMap<String, (usize, usize)>,
    order: Vec<String>,
    /// The bundle whose components these are, when built from one.
    bundle: Option<blake3::Hash>,
}

/// Why the registry refused a plugin.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error("node class `{class}` of plugin `{plugin}` is already provided by plugin `{existing}`")]
    DuplicateClass { class: String, plugin: String, existing: String },
    #[error(
        "plugin {plugin} is named `{name}`, the name of plugin {existing}; \
         plugin names must be unique (bundled plugins' included): rename one or remove it"
    )]
    DuplicateName { name: String, plugin: PluginId, existing: PluginId },
    #[error("route `{route}` of plugin `{plugin}` overlaps a route of plugin `{existing}`")]
    RouteTaken { route: String, plugin: String, existing: String },
    #[error("cannot read plugin directory {path}: {source}")]
    Dir { path: PathBuf, source: std::io::Error },
}

impl NodeRegistry {
    /// An empty registry.
    pub fn new() -> NodeRegistry {
        NodeRegistry::default()
    }

    /// Adds a loaded plugin; refuses it whole if its name or any class
    /// name is taken.
    pub fn add(&mut self, plugin: Plugin) -> Result<(), RegistryError> {
        tracing::info!(plugin = %plugin.manifest.name, id = %plugin.id, version = %plugin.manifest.version, nodes = plugin.definitions.len(), cached = plugin.from_cache, "plugin loaded");
        self.add_shared(Arc::new(plugin))
    }

    /// A registry of `plugins` (already loaded, perhaps serving in another
    /// registry), under the same rules as [`NodeRegistry::add`].
    pub fn of(plugins: impl IntoIterator<Item = Arc<Plugin>>) -> Result<NodeRegistry, RegistryError> {
        let mut registry = NodeRegistry::new();
        for plugin in plugins {
            registry.add_shared(plugin)?;
        }
        Ok(registry)
    }

    fn add_shared(&mut self, plugin: Arc<Plugin>) -> Result<(), RegistryError> {
        if let Some(existing) = self.plugins.iter().find(|p| p.manifest.name == plugin.manifest.name) {
            return Err(RegistryError::DuplicateName { name: plugin.manifest.name.clone(), plugin: plugin.id.clone(), existing: existing.id.clone() });
        }
        for route in &plugin.net.routes {
            if let Some(existing) = self.plugins.iter().find(|p| p.net.routes.iter().any(|r| r.starts_with(route.as_str()) || route.starts_with(r.as_str()))) {
                return Err(RegistryError::RouteTaken { route: route.clone(), plugin: plugin.manifest.name.clone(), existing: existing.manifest.name.clone() });
            }
        }
        for def in &plugin.definitions {
            if let Some(&(p, _)) = self.classes.get(&def.class_type) {
                return Err(RegistryError::DuplicateClass {
                    class: def.class_type.clone(),
                    plugin: plugin.manifest.name.clone(),
                    existing: self.plugins[p].manifest.name.clone(),
                });
            }
        }
        let index = self.plugins.len();
        for (d, def) in plugin.definitions.iter().enumerate() {
            self.classes.insert(def.class_type.clone(), (index, d));
            self.order.push(def.class_type.clone());
        }
        self.plugins.push(plugin);
        Ok(())
    }

    /// The plugin and definition of `class_type`.
    pub fn get(&self, class_type: &str) -> Option<(&Arc<Plugin>, &NodeDef)> {
        let &(p, d) = self.classes.get(class_type)?;
        let plugin = &self.plugins[p];
        Some((plugin, &plugin.definitions[d]))
    }

    /// All definitions in load order.
    pub fn definitions(&self) -> impl Iterator<Item = &NodeDef> {
        self.order.iter().filter_map(|c| self.get(c).map(|(_, d)| d))
    }

    /// What the plugin of `class_type` says about it beyond its definition.
    pub fn meta(&self, class_type: &str) -> Option<&super::meta::ClassMeta> {
        let (plugin, _) = self.get(class_type)?;
        plugin.meta.iter().find(|m| m.class_type == class_type)
    }

    /// The plugin serving `path` (below the mount prefix), by route prefix
    /// (prefixes never overlap, see `add`).
    pub fn route(&self, path: &str) -> Option<&Arc<Plugin>> {
        self.plugins.iter().find(|p| p.net.routes.iter().any(|r| path.starts_with(r.as_str())))
    }

    /// Plugin name → `blake3:<hex>` of the component of each plugin
    /// providing one of `classes`.
    pub fn components_of<'a>(&self, classes: impl Iterator<Item = &'a str>) -> std::collections::BTreeMap<String, String> {
        classes.filter_map(|c| self.get(c)).map(|(plugin, _)| (plugin.manifest.name.clone(), super::identity::hash_grant(&plugin.component_hash))).collect()
    }

    /// Whether this registry has each of `components` (plugin name →
    /// `blake3:<hex>`, as [`NodeRegistry::components_of`] gives them): a
    /// plugin of that name with that very component.
    pub fn has_components(&self, components: &std::collections::BTreeMap<String, String>) -> bool {
        components.iter().all(|(name, hash)| self.plugins.iter().any(|p| &p.manifest.name == name && &super::identity::hash_grant(&p.component_hash) == hash))
    }

    /// `blake3:<hex>` of every component this registry loads.
    pub fn component_hashes(&self) -> impl Iterator<Item = String> + '_ {
        self.plugins.iter().map(|p| super::identity::hash_grant(&p.component_hash))
    }

    /// The bundle this registry runs (its plugins are exactly the
    /// bundle's components; see `bundle::resolve`).
    pub fn bundle(&self) -> Option<&blake3::Hash> {
        self.bundle.as_ref()
    }

    /// Marks this registry as made of bundle `hash`'s components.
    pub(crate) fn pinned_to(mut self, hash: blake3::Hash) -> NodeRegistry {
        self.bundle = Some(hash);
        self
    }

    /// The loaded plugins.
    pub fn plugins(&self) -> &[Arc<Plugin>] {
        &self.plugins
    }

    /// Loads the plugin whose manifest is `dir/kiln-plugin.toml`; its
    /// identity is `dir`, canonicalized.
    pub async fn load_dir(&mut self, runtime: &PluginRuntime, dir: &Path) -> Result<(), RegistryError> {
        let manifest_path = dir.join("kiln-plugin.toml");
        let plugin_name = dir.display().to_string();
        let io_err = |path: &Path, source| LoadError::Io { plugin: plugin_name.clone(), path: path.to_path_buf(), source };
        let id = PluginId::dir(dir).map_err(|e| io_err(dir, e))?;
        let text = std::fs::read_to_string(&manifest_path).map_err(|e| io_err(&manifest_path, e))?;
        let manifest = Manifest::parse(&text).map_err(|source| LoadError::Manifest { plugin: plugin_name.clone(), source })?;
        let wasm_path = dir.join(&manifest.component);
        let wasm = std::fs::read(&wasm_path).map_err(|e| io_err(&wasm_path, e))?;
        let plugin = runtime.load(id, manifest, &wasm).await?;
        self.add(plugin)
    }

    /// Loads every plugin under `root`: `root` itself if it holds a manifest,
    /// else each subdirectory that does, in name order.
    pub async fn load_plugin_root(&mut self, runtime: &PluginRuntime, root: &Path) -> Result<(), RegistryError> {
        if root.join("kiln-plugin.toml").is_file() {
            return self.load_dir(runtime, root).await;
        }
        let dir_err = |source| RegistryError::Dir { path: root.to_path_buf(), source };
        let mut dirs = Vec::new();
        for entry in std::fs::read_dir(root).map_err(dir_err)? {
            let path = entry.map_err(dir_err)?.path();
            if path.join("kiln-plugin.toml").is_file() {
                dirs.push(path);
            }
        }
        dirs.sort();
        for dir in dirs {
            self.load_dir(runtime, &dir).await?;
        }
        Ok(())
    }
}

/// Checks what a plugin says about its nodes before anything relies on it.
pub(crate) fn check_definitions(defs: &[NodeDef]) -> Result<(), String> {
    let mut seen = std::collections::HashSet::new();
    for def in defs {
        let name_ok = !def.class_type.is_empty() && def.class_type.len() <= 128 && def.class_type.chars().all(|c| c.is_alphanumeric() || "_-. +()".contains(c));
        if !name_ok {
            return Err(format!("class name {:?} is empty, too long or has odd characters", def.class_type));
        }
        if !seen.insert(def.class_type.as_str()) {
            return Err(format!("class `{}` is defined twice", def.class_type));
        }
        let mut inputs = std::collections::HashSet::new();
        for input in def.required.iter().chain(&def.optional) {
            if input.name.is_empty() || !inputs.insert(input.name.as_str()) {
                return Err(format!("class `{}` has an empty or repeated input name `{}`", def.class_type, input.name));
            }
            if let node::InputKind::Combo(c) = &input.kind
                && c.source == node::ComboSource::Fixed
                && c.choices.is_empty()
            {
                return Err(format!("class `{}` input `{}` is a combo with no choices", def.class_type, input.name));
            }
        }
        let hidden_names = def.hidden.iter().map(|h| hidden_name(*h));
        for name in hidden_names {
            if !inputs.insert(name) {
                return Err(format!("class `{}` has a visible input named like hidden input `{name}`", def.class_type));
            }
        }
    }
    Ok(())
}

/// The ComfyUI name of a hidden input.
pub fn hidden_name(h: node::HiddenInput) -> &'static str {
    match h {
        node::HiddenInput::Prompt => "prompt",
        node::HiddenInput::ExtraPnginfo => "extra_pnginfo",
        node::HiddenInput::UniqueId => "unique_id",
    }
}

impl NodeRegistry {
    /// Loads the bundled plugins, then every plugin under `plugin_dirs`.
    pub async fn load_all(runtime: &PluginRuntime, plugin_dirs: &[PathBuf]) -> Result<NodeRegistry, RegistryError> {
        let mut registry = NodeRegistry::new();
        for bundled in super::bundled::BUNDLED {
            let manifest = Manifest::parse(bundled.manifest).map_err(|source| LoadError::Manifest { plugin: "bundled".into(), source })?;
            let id = PluginId::Bundled(manifest.name.clone());
            let plugin = runtime.load(id, manifest, bundled.wasm).await?;
            registry.add(plugin)?;
        }
        for dir in plugin_dirs {
            registry.load_plugin_root(runtime, dir).await?;
        }
        Ok(registry)
    }
}
