//! Making a bundle (`kiln pack`): each workflow validated against the
//! host's plugins and the default inputs given, the plugins its classes
//! come from pinned by hash, the input files the workflows read included.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::{Bundle, BundleError, ComponentEntry, Descriptor, FileEntry, InputEntry, component_path, hash_of, input_path, manifest_path, workflow_path};
use crate::files::NamedInputs;
use crate::plugins::{NodeRegistry, Plugin, PluginId};
use crate::workflow::{InputValue, ValidationError, Workflow, WorkflowLimits, validate};

/// Which components' bytes go into the bundle (the others are referenced
/// by hash: a host runs the bundle only if it has those very components).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Include {
    /// Every plugin but kiln's bundled ones (which a host of the same
    /// kiln version has).
    #[default]
    Installed,
    /// Every plugin, the bundled ones too: runs on any kiln that speaks
    /// the components' contract.
    All,
    /// None: every component referenced by hash.
    None,
}

/// What `kiln pack` is told besides the workflows and inputs.
#[derive(Debug, Clone)]
pub struct PackOptions {
    pub name: String,
    pub version: String,
    pub include: Include,
    /// Inputs a caller may not replace (all others may be).
    pub fixed: BTreeSet<String>,
}

/// Why a bundle could not be made.
#[derive(Debug, thiserror::Error)]
pub enum PackError {
    #[error("workflow `{workflow}`: {error}")]
    Parse { workflow: String, error: crate::workflow::ParseError },
    #[error("workflow `{workflow}` is invalid: {error}")]
    Invalid { workflow: String, error: ValidationError },
    #[error("{0}")]
    Inputs(String),
    #[error("plugin `{plugin}`: {message}")]
    Component { plugin: String, message: String },
    #[error(transparent)]
    Bundle(#[from] BundleError),
}

/// Makes a bundle of `workflows` (name, API-format JSON), run against
/// `registry`'s classes with `inputs` (file name → bytes) as default input
/// files. Every input given must be read by some workflow.
pub fn pack(
    registry: &NodeRegistry,
    workflows: &[(String, serde_json::Value)],
    inputs: &BTreeMap<String, Arc<[u8]>>,
    options: &PackOptions,
    limits: &WorkflowLimits,
) -> Result<Bundle, PackError> {
    if let Some(bad) = inputs.keys().find(|n| !super::is_input_name(n)) {
        return Err(PackError::Inputs(format!("input name {bad:?}: a bundle's input files are named with 1-128 of A-Z a-z 0-9 _ - .")));
    }
    if let Some(unknown) = options.fixed.iter().find(|n| !inputs.contains_key(*n)) {
        return Err(PackError::Inputs(format!("--fixed {unknown}: no such input (give it with --input {unknown}=PATH)")));
    }
    let mut named = NamedInputs::new();
    for (name, bytes) in inputs {
        named.insert_bytes(name.clone(), bytes.clone());
    }
    let mut files: BTreeMap<String, Arc<[u8]>> = BTreeMap::new();
    let mut workflow_entries = BTreeMap::new();
    // Plugin name → (plugin, the classes of it used).
    let mut used: BTreeMap<String, (Arc<Plugin>, BTreeSet<String>)> = BTreeMap::new();
    let mut read_inputs = BTreeSet::new();
    for (name, json) in workflows {
        let json = json.get("prompt").filter(|p| p.is_object()).unwrap_or(json);
        let parsed = Workflow::from_json(json, limits).map_err(|error| PackError::Parse { workflow: name.clone(), error })?;
        match validate(&parsed, registry, &named) {
            Ok((_, issues)) if issues.is_empty() => {}
            Ok((_, issues)) => return Err(PackError::Invalid { workflow: name.clone(), error: ValidationError::OutputsFailed(issues) }),
            Err(error) => return Err(PackError::Invalid { workflow: name.clone(), error }),
        }
        for node in &parsed.nodes {
            let Some((plugin, def)) = node.class_type.as_deref().and_then(|c| registry.get(c)) else { continue };
            used.entry(plugin.manifest.name.clone()).or_insert_with(|| (plugin.clone(), BTreeSet::new())).1.insert(def.class_type.clone());
            for (input, value) in &node.inputs {
                if let InputValue::Const(serde_json::Value::String(file)) = value
                    && def.reads_input_file(input)
                {
                    read_inputs.insert(file.clone());
                }
            }
        }
        // Compact, and within the limits a run checks it against.
        let bytes: Arc<[u8]> = serde_json::to_vec(json).map_err(|e| PackError::Inputs(e.to_string()))?.into();
        limits.check_text(&bytes).map_err(|error| PackError::Parse { workflow: name.clone(), error })?;
        workflow_entries.insert(name.clone(), FileEntry { hash: hash_of(&bytes) });
        files.insert(workflow_path(name), bytes);
    }
    if let Some(unread) = inputs.keys().find(|n| !read_inputs.contains(*n)) {
        return Err(PackError::Inputs(format!("input `{unread}` is not read by any workflow")));
    }
    let mut input_entries = BTreeMap::new();
    for (name, bytes) in inputs {
        input_entries.insert(name.clone(), InputEntry { hash: hash_of(bytes), overridable: !options.fixed.contains(name) });
        files.insert(input_path(name), bytes.clone());
    }
    let mut components = Vec::new();
    for (name, (plugin, classes)) in used {
        let included = match options.include {
            Include::All => true,
            Include::None => false,
            Include::Installed => !matches!(plugin.id, PluginId::Bundled(_)),
        };
        if included {
            files.insert(component_path(&name), component_bytes(&plugin).map_err(|message| PackError::Component { plugin: name.clone(), message })?);
        }
        let manifest: Arc<[u8]> = Arc::from(plugin.manifest.text.as_bytes());
        components.push(ComponentEntry {
            plugin: name.clone(),
            version: plugin.manifest.version.clone(),
            component: crate::plugins::identity::hash_grant(&plugin.component_hash),
            manifest: hash_of(&manifest),
            included,
            classes: classes.into_iter().collect(),
        });
        files.insert(manifest_path(&name), manifest);
    }
    let descriptor = Descriptor {
        format: super::FORMAT,
        name: options.name.clone(),
        version: options.version.clone(),
        workflows: workflow_entries,
        inputs: input_entries,
        components,
    };
    Ok(Bundle::new(descriptor, files)?)
}

/// The component bytes `plugin` was loaded from, checked against its hash
/// (an installed plugin's file may have changed since it loaded).
fn component_bytes(plugin: &Plugin) -> Result<Arc<[u8]>, String> {
    let bytes: Arc<[u8]> = match &plugin.id {
        PluginId::Bundled(_) => crate::plugins::bundled::BUNDLED
            .iter()
            .find(|b| blake3::hash(b.wasm) == plugin.component_hash)
            .map(|b| Arc::from(b.wasm))
            .ok_or("its bundled component is not in this binary")?,
        PluginId::Dir(dir) => {
            let path = dir.join(&plugin.manifest.component);
            Arc::from(std::fs::read(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?)
        }
        PluginId::InBundle { bundle, .. } => {
            return Err(format!("it came from bundle blake3:{}; pack on a host that has the plugin installed", bundle.to_hex()));
        }
    };
    if blake3::hash(&bytes) != plugin.component_hash {
        return Err("its component file changed since it loaded; restart or reinstall it, then pack again".into());
    }
    Ok(bytes)
}
