//! Bundles: a deployment in one file that runs the same on any host.
//!
//! A bundle holds one or more workflows (API format), the plugin
//! components they use — pinned by blake3 — with their manifests, default
//! input files, and a descriptor (`bundle.json`: name, version, which
//! inputs a caller may override, and the hash of every other file). A
//! bundle's hash is the blake3 of its descriptor's bytes: every other file
//! is checked against the descriptor when the bundle is read, so that one
//! hash pins the whole.
//!
//! Embedders make one with [`crate::Engine::pack`], read one with
//! [`Bundle::read`] and run it with [`crate::Engine::run_bundle`];
//! `kiln pack`, `kiln inspect`, `kiln unpack` and `kiln run FILE.kiln` do
//! the same from the command line, and a serverless deployment can be
//! created from one.
//!
//! This module owns the format and its rules: `archive` reads and writes
//! the bytes (a gzip-compressed tar, bounded on read, reproducible on
//! write), `pack` makes a bundle from workflows and a host's plugins, and
//! `resolve` turns one into the node classes its runs use (each
//! component the host's own plugin where the hashes match, else the
//! bundle's copy, else refused, named).

mod archive;
mod pack;
mod resolve;

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

#[doc(hidden)]
pub use pack::pack;
pub use pack::{Include, PackError, PackOptions};
#[doc(hidden)]
pub use resolve::{missing_components, registry};

/// The descriptor format this host reads and writes.
pub const FORMAT: u32 = 1;
/// The descriptor's path in the archive.
pub const DESCRIPTOR: &str = "bundle.json";
/// Most workflows in one bundle.
pub const MAX_WORKFLOWS: usize = 64;
/// Most default input files in one bundle.
pub const MAX_INPUTS: usize = 256;
/// Most components in one bundle.
pub const MAX_COMPONENTS: usize = 64;
/// Largest descriptor.
const MAX_DESCRIPTOR: usize = 1 << 20;
/// Largest manifest (as the admin API's plugin installs).
const MAX_MANIFEST: usize = 64 << 10;

/// `bundle.json`: what a bundle holds, each file pinned by its hash.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Descriptor {
    /// [`FORMAT`].
    pub format: u32,
    /// 1-64 of `A-Z a-z 0-9 _ - .`.
    pub name: String,
    /// 1-64 printable characters.
    pub version: String,
    /// Workflow name → its file `workflows/<name>.json`.
    pub workflows: BTreeMap<String, FileEntry>,
    /// Input file name (as the workflows' image inputs name it) → its
    /// default, `inputs/<name>`.
    #[serde(default)]
    pub inputs: BTreeMap<String, InputEntry>,
    /// The plugins the workflows use, by name.
    pub components: Vec<ComponentEntry>,
}

/// A file of the bundle: its hash.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FileEntry {
    /// `blake3:<hex>` of its bytes.
    pub hash: String,
}

/// A default input file.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct InputEntry {
    /// `blake3:<hex>` of its bytes.
    pub hash: String,
    /// Whether a caller may give a file of their own in its place.
    pub overridable: bool,
}

/// One plugin the workflows use.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ComponentEntry {
    /// Its manifest's name; its files are `plugins/<plugin>/`.
    pub plugin: String,
    /// Its manifest's version.
    pub version: String,
    /// `blake3:<hex>` of the component (`.wasm`) bytes.
    pub component: String,
    /// `blake3:<hex>` of its manifest's text (always in the bundle).
    pub manifest: String,
    /// Whether the component's bytes are in the bundle
    /// (`plugins/<plugin>/component.wasm`); if not, the host must have
    /// this very component.
    pub included: bool,
    /// The node classes of it the workflows use.
    pub classes: Vec<String>,
}

/// Why a bundle was refused.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    #[error("the bundle is not readable: {0}")]
    Malformed(String),
    #[error("the bundle decompresses to over {limit} bytes (max_bundle_mb)")]
    TooLarge { limit: u64 },
    #[error("the bundle's descriptor is invalid: {0}")]
    Descriptor(String),
    #[error("the bundle's file `{path}` does not match its hash in bundle.json (damaged or altered)")]
    HashMismatch { path: String },
    #[error("this host cannot load the bundle's components: {}", .0.join("; "))]
    Missing(Vec<String>),
    #[error("the bundle's plugin `{plugin}` does not load here: {message}")]
    Load { plugin: String, message: String },
    #[error("the bundle has no workflow {0:?}")]
    NoWorkflow(String),
    #[error("the bundle has several workflows ({0}): name one (kiln run --workflow NAME)")]
    WhichWorkflow(String),
    #[error("cannot write the bundle: {0}")]
    Write(std::io::Error),
}

/// `blake3:<hex>` of `bytes`.
pub(crate) fn hash_of(bytes: &[u8]) -> String {
    crate::plugins::identity::hash_grant(&blake3::hash(bytes))
}

/// A bundle read and checked: every file is the one its descriptor pins.
#[derive(Clone)]
pub struct Bundle {
    descriptor: Descriptor,
    descriptor_bytes: Arc<[u8]>,
    hash: blake3::Hash,
    /// Every other file, by archive path.
    files: BTreeMap<String, Arc<[u8]>>,
}

impl std::fmt::Debug for Bundle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bundle").field("name", &self.descriptor.name).field("version", &self.descriptor.version).field("hash", &self.hash_string()).finish()
    }
}

fn workflow_path(name: &str) -> String {
    format!("workflows/{name}.json")
}
fn input_path(name: &str) -> String {
    format!("inputs/{name}")
}
fn manifest_path(plugin: &str) -> String {
    format!("plugins/{plugin}/kiln-plugin.toml")
}
fn component_path(plugin: &str) -> String {
    format!("plugins/{plugin}/component.wasm")
}

impl Bundle {
    /// Reads and checks a bundle's bytes; `max_bytes` bounds what they
    /// decompress to (`max_bundle_mb`).
    pub fn read(bytes: &[u8], max_bytes: u64) -> Result<Bundle, BundleError> {
        let mut files: BTreeMap<String, Arc<[u8]>> = archive::read(bytes, max_bytes)?.into_iter().map(|(p, b)| (p, Arc::from(b))).collect();
        let descriptor_bytes = files.remove(DESCRIPTOR).ok_or_else(|| BundleError::Malformed(format!("no {DESCRIPTOR}")))?;
        if descriptor_bytes.len() > MAX_DESCRIPTOR {
            return Err(BundleError::Descriptor(format!("over {} KiB", MAX_DESCRIPTOR >> 10)));
        }
        let descriptor: Descriptor = serde_json::from_slice(&descriptor_bytes).map_err(|e| BundleError::Descriptor(e.to_string()))?;
        check_descriptor(&descriptor)?;
        let bundle = Bundle { hash: blake3::hash(&descriptor_bytes), descriptor, descriptor_bytes, files };
        bundle.check_files()?;
        Ok(bundle)
    }

    /// A bundle of `descriptor` and `files` (made by [`pack`]).
    fn new(descriptor: Descriptor, files: BTreeMap<String, Arc<[u8]>>) -> Result<Bundle, BundleError> {
        check_descriptor(&descriptor)?;
        let descriptor_bytes: Arc<[u8]> = serde_json::to_vec_pretty(&descriptor).map_err(|e| BundleError::Descriptor(e.to_string()))?.into();
        let bundle = Bundle { hash: blake3::hash(&descriptor_bytes), descriptor, descriptor_bytes, files };
        bundle.check_files()?;
        Ok(bundle)
    }

    /// Each file the descriptor names is present with its hash; no other.
    fn check_files(&self) -> Result<(), BundleError> {
        let d = &self.descriptor;
        let mut expected: BTreeMap<String, &str> = BTreeMap::new();
        for (name, w) in &d.workflows {
            expected.insert(workflow_path(name), &w.hash);
        }
        for (name, i) in &d.inputs {
            expected.insert(input_path(name), &i.hash);
        }
        for c in &d.components {
            expected.insert(manifest_path(&c.plugin), &c.manifest);
            if c.included {
                expected.insert(component_path(&c.plugin), &c.component);
            }
        }
        if let Some(extra) = self.files.keys().find(|p| !expected.contains_key(*p)) {
            return Err(BundleError::Malformed(format!("{extra:?} is not in bundle.json")));
        }
        for (path, hash) in expected {
            let bytes = self.files.get(&path).ok_or_else(|| BundleError::Malformed(format!("`{path}`, named in bundle.json, is missing")))?;
            if hash_of(bytes) != hash {
                return Err(BundleError::HashMismatch { path });
            }
        }
        for c in &d.components {
            let manifest = self.manifest_text(&c.plugin)?;
            if manifest.len() > MAX_MANIFEST {
                return Err(BundleError::Descriptor(format!("the manifest of `{}` is over {} KiB", c.plugin, MAX_MANIFEST >> 10)));
            }
            let parsed = crate::plugins::Manifest::parse(manifest).map_err(|e| BundleError::Descriptor(format!("the manifest of `{}`: {e}", c.plugin)))?;
            if parsed.name != c.plugin || parsed.version != c.version {
                return Err(BundleError::Descriptor(format!("the manifest of `{}` names {} {}", c.plugin, parsed.name, parsed.version)));
            }
        }
        Ok(())
    }

    /// The bundle's bytes (the same for the same contents).
    pub fn to_bytes(&self) -> Result<Vec<u8>, BundleError> {
        let mut files: Vec<(String, &[u8])> = vec![(DESCRIPTOR.to_string(), &self.descriptor_bytes)];
        files.extend(self.files.iter().map(|(p, b)| (p.clone(), &b[..])));
        archive::write(&files)
    }

    /// blake3 of its descriptor: what pins the whole bundle.
    pub fn hash(&self) -> blake3::Hash {
        self.hash
    }

    /// `blake3:<hex>` of [`Bundle::hash`], as records show it.
    pub fn hash_string(&self) -> String {
        crate::plugins::identity::hash_grant(&self.hash)
    }

    pub fn descriptor(&self) -> &Descriptor {
        &self.descriptor
    }

    /// The workflow called `name`, or the only one when `name` is `None`;
    /// its text is checked against `limits` (size, value count) before it
    /// is parsed.
    pub fn workflow(&self, name: Option<&str>, limits: &crate::workflow::WorkflowLimits) -> Result<(String, serde_json::Value), BundleError> {
        let name = match name {
            Some(n) => n.to_string(),
            None if self.descriptor.workflows.len() == 1 => self.descriptor.workflows.keys().next().cloned().unwrap_or_default(),
            None => {
                let names: Vec<&str> = self.descriptor.workflows.keys().map(String::as_str).collect();
                return Err(BundleError::WhichWorkflow(names.join(", ")));
            }
        };
        let bytes = self.files.get(&workflow_path(&name)).ok_or_else(|| BundleError::NoWorkflow(name.clone()))?;
        limits.check_text(bytes).map_err(|e| BundleError::Descriptor(format!("workflow `{name}`: {e}")))?;
        let json = serde_json::from_slice(bytes).map_err(|e| BundleError::Descriptor(format!("workflow `{name}` is not JSON: {e}")))?;
        Ok((name, json))
    }

    /// The default input file `name`.
    pub fn input(&self, name: &str) -> Option<Arc<[u8]>> {
        self.files.get(&input_path(name)).cloned()
    }

    fn manifest_text(&self, plugin: &str) -> Result<&str, BundleError> {
        let bytes = self.files.get(&manifest_path(plugin)).ok_or_else(|| BundleError::Malformed(format!("no manifest for `{plugin}`")))?;
        std::str::from_utf8(bytes).map_err(|_| BundleError::Descriptor(format!("the manifest of `{plugin}` is not UTF-8")))
    }

    /// The largest component the bundle carries: its plugin and size.
    pub fn largest_component(&self) -> Option<(&str, usize)> {
        self.descriptor.components.iter().filter_map(|c| self.component(&c.plugin).map(|b| (c.plugin.as_str(), b.len()))).max_by_key(|(_, n)| *n)
    }

    fn component(&self, plugin: &str) -> Option<&Arc<[u8]>> {
        self.files.get(&component_path(plugin))
    }

    /// The descriptor as `kiln inspect` shows it: with the bundle's hash
    /// and each file's size.
    pub fn summary(&self) -> serde_json::Value {
        let mut value = serde_json::to_value(&self.descriptor).unwrap_or_default();
        if let Some(map) = value.as_object_mut() {
            map.insert("hash".into(), self.hash_string().into());
            let sizes: BTreeMap<&str, usize> = self.files.iter().map(|(p, b)| (p.as_str(), b.len())).collect();
            map.insert("files".into(), serde_json::to_value(sizes).unwrap_or_default());
        }
        value
    }

    /// Its files under `dir` as they are in the archive (`kiln unpack`);
    /// `dir` must not exist yet or be empty.
    pub fn unpack(&self, dir: &std::path::Path) -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        if std::fs::read_dir(dir)?.next().is_some() {
            return Err(std::io::Error::new(std::io::ErrorKind::AlreadyExists, format!("{} is not empty", dir.display())));
        }
        std::fs::write(dir.join(DESCRIPTOR), &self.descriptor_bytes)?;
        for (path, bytes) in &self.files {
            // Paths are checked names (see `check_descriptor`), one level
            // under a fixed folder: never absolute, never `..`.
            let target = dir.join(path);
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(target, bytes)?;
        }
        Ok(())
    }
}

/// A name that is one path segment: 1-`max` of `A-Z a-z 0-9 _ - .`, not
/// starting with `.`.
fn plain_name(name: &str, max: usize) -> bool {
    !name.is_empty() && name.len() <= max && !name.starts_with('.') && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b))
}

/// Whether `name` may name an input file of a bundle.
pub(crate) fn is_input_name(name: &str) -> bool {
    plain_name(name, 128)
}

/// `blake3:` and 64 lowercase hex digits (as kiln writes hashes).
fn is_hash(s: &str) -> bool {
    s.strip_prefix("blake3:").is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
}

fn check_descriptor(d: &Descriptor) -> Result<(), BundleError> {
    let bad = |m: String| Err(BundleError::Descriptor(m));
    let files = d.workflows.iter().map(|(n, w)| (n, &w.hash)).chain(d.inputs.iter().map(|(n, i)| (n, &i.hash)));
    if let Some((name, hash)) = files.into_iter().find(|(_, h)| !is_hash(h)) {
        return bad(format!("{name}: {hash:?} is not blake3:<64 lowercase hex digits>"));
    }
    if d.format != FORMAT {
        return bad(format!("format {} (this host reads format {FORMAT})", d.format));
    }
    if !plain_name(&d.name, 64) {
        return bad("name must be 1-64 of A-Z a-z 0-9 _ - . (not starting with .)".into());
    }
    if d.version.is_empty() || d.version.len() > 64 || d.version.chars().any(char::is_control) {
        return bad("version must be 1-64 printable characters".into());
    }
    if d.workflows.is_empty() || d.workflows.len() > MAX_WORKFLOWS {
        return bad(format!("a bundle holds 1-{MAX_WORKFLOWS} workflows"));
    }
    if let Some(name) = d.workflows.keys().find(|n| !plain_name(n, 64)) {
        return bad(format!("workflow name {name:?}: 1-64 of A-Z a-z 0-9 _ - ."));
    }
    if d.inputs.len() > MAX_INPUTS {
        return bad(format!("a bundle holds at most {MAX_INPUTS} input files"));
    }
    if let Some(name) = d.inputs.keys().find(|n| !is_input_name(n)) {
        return bad(format!("input name {name:?}: 1-128 of A-Z a-z 0-9 _ - ."));
    }
    if d.components.len() > MAX_COMPONENTS {
        return bad(format!("a bundle holds at most {MAX_COMPONENTS} components"));
    }
    let mut plugins = std::collections::HashSet::new();
    for c in &d.components {
        if !plain_name(&c.plugin, 64) || !plugins.insert(c.plugin.as_str()) {
            return bad(format!("component plugin name {:?} is invalid or repeated", c.plugin));
        }
        for hash in [&c.component, &c.manifest] {
            if !is_hash(hash) {
                return bad(format!("component `{}`: {hash:?} is not blake3:<64 lowercase hex digits>", c.plugin));
            }
        }
        if c.classes.len() > 4096 || c.classes.iter().any(|k| k.is_empty() || k.len() > 128) {
            return bad(format!("component `{}`: its class list is invalid", c.plugin));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
