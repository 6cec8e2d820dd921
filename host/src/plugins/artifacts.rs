//! On-disk cache of compiled components.
//!
//! Compiling a component takes seconds (done by `compile`, in a child
//! process under limits); loading a compiled artifact takes under a
//! millisecond. Artifacts are keyed by the blake3 of the component and
//! the engine's compatibility hash, so a new wasmtime or a changed engine
//! configuration never loads a stale artifact.
//!
//! Deserializing is `unsafe` in wasmtime: the bytes become executable code.
//! So the cache only loads what kiln itself wrote: the directory must be owned
//! by this user and not writable by anyone else, and every artifact carries a
//! blake3 checksum of its payload that is verified before deserializing.

use std::hash::{Hash, Hasher};
use std::io::Write;
use std::path::{Path, PathBuf};

use wasmtime::Engine;
use wasmtime::component::Component;

use super::compile::{CompileConfig, CompileError};

const MAGIC: &[u8; 8] = b"KILNCW01";

/// A directory of compiled components (or none: compile every time).
pub struct ArtifactCache {
    dir: Option<PathBuf>,
}

/// Feeds `std::hash::Hash` data into blake3.
struct Blake3Hasher(blake3::Hasher);
impl Hasher for Blake3Hasher {
    fn finish(&self) -> u64 {
        0
    }
    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
}

impl ArtifactCache {
    /// A cache in `dir`, created with owner-only permissions. An unusable
    /// directory disables the cache with a warning.
    pub fn new(dir: Option<PathBuf>) -> ArtifactCache {
        let dir = dir.and_then(|d| match prepare_dir(&d) {
            Ok(()) => Some(d),
            Err(e) => {
                tracing::warn!(dir = %d.display(), error = %e, "compiled-component cache disabled");
                None
            }
        });
        ArtifactCache { dir }
    }

    /// The component for `wasm`, from the cache when a valid artifact exists,
    /// else compiled as `compile` says (in a child process under limits,
    /// see `compile`) and stored. Returns whether it came from the cache.
    pub fn load(&self, engine: &Engine, wasm: &[u8], compile: &CompileConfig) -> Result<(Component, bool), CompileError> {
        let path = self.dir.as_ref().map(|dir| {
            let mut key = Blake3Hasher(blake3::Hasher::new());
            key.0.update(blake3::hash(wasm).as_bytes());
            engine.precompile_compatibility_hash().hash(&mut key);
            dir.join(format!("{}.cwasm", key.0.finalize().to_hex()))
        });
        if let Some(path) = &path
            && let Some(payload) = read_verified(path)
        {
            // SAFETY: the payload was written by `store` below into a directory
            // only this user can write, and its checksum matches.
            match unsafe { Component::deserialize(engine, &payload) } {
                Ok(component) => return Ok((component, true)),
                Err(e) => tracing::warn!(path = %path.display(), error = %e, "discarding unusable artifact"),
            }
        }
        let artifact = compile.precompile(engine, wasm, self.dir.as_deref())?;
        // SAFETY: these bytes were produced by `precompile_component` just
        // now: in this process, or by this user's `kiln compile-component`
        // into a fresh directory only this user can write (see `compile`).
        // Loading checks that they were compiled with this engine's settings
        // (and that the component fits the instance pool's limits).
        let component = unsafe { Component::deserialize(engine, &artifact) }.map_err(|e| CompileError::Unloadable(format!("{e:#}")))?;
        // Stored once it loaded: an artifact the engine refuses is not kept.
        if let Some(path) = &path
            && let Err(e) = store(path, &artifact)
        {
            tracing::warn!(path = %path.display(), error = %e, "could not write compiled component");
        }
        Ok((component, false))
    }
}

fn prepare_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let meta = std::fs::metadata(dir)?;
        // SAFETY: geteuid has no preconditions.
        let uid = unsafe { libc_geteuid() };
        if meta.uid() != uid {
            return Err(std::io::Error::other("cache directory is owned by another user"));
        }
        if meta.mode() & 0o022 != 0 {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        }
    }
    Ok(())
}

#[cfg(unix)]
unsafe extern "C" {
    #[link_name = "geteuid"]
    fn libc_geteuid() -> u32;
}

fn read_verified(path: &Path) -> Option<Vec<u8>> {
    let bytes = std::fs::read(path).ok()?;
    if bytes.len() < MAGIC.len() + 32 || &bytes[..MAGIC.len()] != MAGIC {
        return None;
    }
    let (sum, payload) = bytes[MAGIC.len()..].split_at(32);
    (blake3::hash(payload).as_bytes() == sum).then(|| payload.to_vec())
}

fn store(path: &Path, artifact: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().ok_or_else(|| std::io::Error::other("artifact path has no parent"))?;
    let mut tmp = tempfile_in(dir)?;
    tmp.1.write_all(MAGIC)?;
    tmp.1.write_all(blake3::hash(artifact).as_bytes())?;
    tmp.1.write_all(artifact)?;
    tmp.1.sync_data()?;
    std::fs::rename(&tmp.0, path)
}

fn tempfile_in(dir: &Path) -> std::io::Result<(PathBuf, std::fs::File)> {
    let path = dir.join(format!(".{}.tmp", uuid::Uuid::new_v4()));
    let file = std::fs::OpenOptions::new().write(true).create_new(true).open(&path)?;
    Ok((path, file))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_tampered_or_truncated_artifacts() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.cwasm");
        store(&path, b"payload").unwrap();
        assert_eq!(read_verified(&path).unwrap(), b"payload");
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        assert!(read_verified(&path).is_none());
        std::fs::write(&path, &bytes[..10]).unwrap();
        assert!(read_verified(&path).is_none());
    }
}
