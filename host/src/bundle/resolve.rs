//! A bundle's components as the node registry its runs use: exactly the
//! components it lists. Each is the host's own loaded plugin where both
//! the component's and the manifest's hashes match one (same code, same
//! manifest: the host's identity and grants apply), else the bundle's copy
//! loaded under the identity `bundle:<hash>/<plugin>` (only a
//! component-hash grant names it), else the bundle is refused, naming
//! every component it lacks.

use std::sync::Arc;

use super::{Bundle, BundleError, ComponentEntry, hash_of};
use crate::plugins::identity::hash_grant;
use crate::plugins::{Manifest, NodeRegistry, Plugin, PluginId, PluginRuntime};

/// The host's plugin that is this very component with this very manifest.
fn host_copy<'a>(host: &'a NodeRegistry, c: &ComponentEntry) -> Option<&'a Arc<Plugin>> {
    host.plugins().iter().find(|p| hash_grant(&p.component_hash) == c.component && hash_of(p.manifest.text.as_bytes()) == c.manifest)
}

/// The components of `bundle` that `host` does not have and the bundle
/// does not carry: `plugin version (blake3:…)` each (empty: it can run).
pub fn missing_components(bundle: &Bundle, host: &NodeRegistry) -> Vec<String> {
    bundle
        .descriptor()
        .components
        .iter()
        .filter(|c| !c.included && host_copy(host, c).is_none())
        .map(|c| format!("{} {} ({}): not on this host and not in the bundle", c.plugin, c.version, c.component))
        .collect()
}

/// The registry of `bundle`'s components (see the module docs), marked as
/// the bundle's. Components the bundle carries compile into the plugin
/// cache like any other.
pub async fn registry(bundle: &Bundle, host: &NodeRegistry, runtime: &PluginRuntime) -> Result<NodeRegistry, BundleError> {
    let missing = missing_components(bundle, host);
    if !missing.is_empty() {
        return Err(BundleError::Missing(missing));
    }
    let mut plugins = Vec::new();
    for c in &bundle.descriptor().components {
        if let Some(plugin) = host_copy(host, c) {
            plugins.push(plugin.clone());
            continue;
        }
        let load_error = |message: String| BundleError::Load { plugin: c.plugin.clone(), message };
        let manifest = Manifest::parse(bundle.manifest_text(&c.plugin)?).map_err(|e| load_error(e.to_string()))?;
        let wasm = bundle.component(&c.plugin).ok_or_else(|| BundleError::Missing(vec![c.plugin.clone()]))?;
        let id = PluginId::InBundle { bundle: Box::new(bundle.hash()), plugin: c.plugin.clone() };
        let plugin = runtime.load(id, manifest, wasm).await.map_err(|e| load_error(e.to_string()))?;
        if let Some(class) = c.classes.iter().find(|k| !plugin.definitions.iter().any(|d| &d.class_type == *k)) {
            return Err(load_error(format!("it defines no class `{class}`")));
        }
        plugins.push(Arc::new(plugin));
    }
    let registry = NodeRegistry::of(plugins).map_err(|e| BundleError::Load { plugin: bundle.descriptor().name.clone(), message: e.to_string() })?;
    Ok(registry.pinned_to(bundle.hash()))
}
