//! Who a plugin is, as the operator controls it, and the grants that name it.
//!
//! A manifest's `name` is whatever the plugin's author wrote: two plugins may
//! claim the same one, so no policy may hang on it. A plugin's identity is
//! what the operator decides: the canonical path of the directory it was
//! installed into, or the hash of its component bytes (the code that would
//! run). Bundled plugins are `bundled:<name>`, an identity no directory can
//! have. Grants (`secret_plugins`) name a directory or a component hash,
//! never a name; [`PluginGrant::parse`] refuses anything else.

use std::fmt;
use std::path::{Path, PathBuf};

/// The prefix of a component-hash grant: `blake3:<64 hex digits>`.
pub const HASH_PREFIX: &str = "blake3:";

/// Where a loaded plugin came from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum PluginId {
    /// Embedded in the `kiln` binary (`host/src/plugins/bundled.rs`).
    Bundled(String),
    /// Loaded from this directory (canonical: symlinks and `..` resolved).
    Dir(PathBuf),
    /// Carried in the bundle whose hash this is (see `bundle`), under the
    /// plugin name the bundle lists. Only a component-hash grant names it.
    InBundle { bundle: Box<blake3::Hash>, plugin: String },
}

impl PluginId {
    /// The identity of the plugin installed in `dir`: its canonical path.
    pub fn dir(dir: &Path) -> std::io::Result<PluginId> {
        Ok(PluginId::Dir(dir.canonicalize()?))
    }
}

impl fmt::Display for PluginId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PluginId::Bundled(name) => write!(f, "bundled:{name}"),
            PluginId::Dir(path) => write!(f, "{}", path.display()),
            PluginId::InBundle { bundle, plugin } => write!(f, "bundle:{}/{plugin}", &bundle.to_hex()[..16]),
        }
    }
}

/// `blake3:<hex>` of a component's bytes, as grants write it.
pub fn hash_grant(component_hash: &blake3::Hash) -> String {
    format!("{HASH_PREFIX}{}", component_hash.to_hex())
}

/// One operator grant: the plugins it names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PluginGrant {
    /// The plugin installed in this directory (canonical path).
    Dir(PathBuf),
    /// Any plugin whose component has this blake3 hash.
    Hash(blake3::Hash),
    /// The bundled plugin of this name (kiln's own grants to its bundled
    /// plugins; never parsed from configuration).
    Bundled(String),
}

/// Why a grant entry was refused.
#[derive(Debug, thiserror::Error)]
pub enum GrantError {
    #[error(
        "`{0}` looks like a plugin name; plugins choose their own names, so a grant must name what the operator controls: \
         the plugin's directory (e.g. \"/srv/kiln/plugins/{0}\", or \"./{0}\" relative to the working directory) \
         or its component's hash (\"blake3:<hex>\", the blake3 of the .wasm file)"
    )]
    BareName(String),
    #[error("`{entry}` is not a valid component hash: expected \"blake3:\" and 64 hex digits")]
    BadHash { entry: String },
    #[error("plugin directory `{entry}` cannot be used: {source}")]
    Dir { entry: String, source: std::io::Error },
}

impl PluginGrant {
    /// Parses one entry: `blake3:<hex>`, or a path (anything with a `/`)
    /// to an existing directory. A bare word is refused: it could only be a
    /// manifest name, which any plugin can claim.
    pub fn parse(entry: &str) -> Result<PluginGrant, GrantError> {
        if let Some(hex) = entry.strip_prefix(HASH_PREFIX) {
            return blake3::Hash::from_hex(hex).map(PluginGrant::Hash).map_err(|_| GrantError::BadHash { entry: entry.to_string() });
        }
        if !entry.contains(std::path::MAIN_SEPARATOR) {
            return Err(GrantError::BareName(entry.to_string()));
        }
        let dir_err = |source| GrantError::Dir { entry: entry.to_string(), source };
        let canonical = Path::new(entry).canonicalize().map_err(dir_err)?;
        if !canonical.is_dir() {
            return Err(dir_err(std::io::Error::other("not a directory")));
        }
        Ok(PluginGrant::Dir(canonical))
    }

    /// Parses every entry, refusing the list at the first bad one.
    pub fn parse_all(entries: &[String]) -> Result<Vec<PluginGrant>, GrantError> {
        entries.iter().map(|e| PluginGrant::parse(e)).collect()
    }

    /// Whether this grant names the plugin `id` whose component hashes to `component_hash`.
    pub fn matches(&self, id: &PluginId, component_hash: &blake3::Hash) -> bool {
        match (self, id) {
            (PluginGrant::Hash(h), _) => h == component_hash,
            (PluginGrant::Dir(granted), PluginId::Dir(dir)) => granted == dir,
            (PluginGrant::Bundled(granted), PluginId::Bundled(name)) => granted == name,
            (PluginGrant::Dir(_), PluginId::Bundled(_) | PluginId::InBundle { .. })
            | (PluginGrant::Bundled(_), PluginId::Dir(_) | PluginId::InBundle { .. }) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_name_directories_or_hashes_never_names() {
        let dir = tempfile::tempdir().unwrap();
        let plugin = dir.path().join("partner");
        std::fs::create_dir(&plugin).unwrap();
        let id = PluginId::dir(&plugin).unwrap();
        let hash = blake3::hash(b"component");

        // A directory, written with a detour, is its canonical path.
        let detour = format!("{}/../partner", plugin.display());
        let by_dir = PluginGrant::parse(&detour).unwrap();
        assert!(by_dir.matches(&id, &blake3::hash(b"any bytes")));
        let other = dir.path().join("impostor");
        std::fs::create_dir(&other).unwrap();
        assert!(!by_dir.matches(&PluginId::dir(&other).unwrap(), &hash));
        assert!(!by_dir.matches(&PluginId::Bundled("partner".into()), &hash));

        let by_hash = PluginGrant::parse(&hash_grant(&hash)).unwrap();
        assert!(by_hash.matches(&PluginId::dir(&other).unwrap(), &hash));
        assert!(!by_hash.matches(&id, &blake3::hash(b"other component")));

        let err = PluginGrant::parse("partner").unwrap_err();
        assert!(matches!(err, GrantError::BareName(_)));
        assert!(err.to_string().contains("blake3:<hex>") && err.to_string().contains("./partner"), "{err}");
        assert!(matches!(PluginGrant::parse("blake3:abc"), Err(GrantError::BadHash { .. })));
        assert!(matches!(PluginGrant::parse(&format!("{}/missing", dir.path().display())), Err(GrantError::Dir { .. })));
        let file = dir.path().join("file");
        std::fs::write(&file, b"").unwrap();
        assert!(matches!(PluginGrant::parse(&file.display().to_string()), Err(GrantError::Dir { .. })));
        assert_eq!(PluginId::Bundled("core-image".into()).to_string(), "bundled:core-image");
    }
}
