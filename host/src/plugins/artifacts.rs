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
//! by this user and not writable by anyone else, and every artifact
//! (`KEY-2.cwasm`, wasmtime's bytes as they are) has a blake3 checksum beside
//! it (`KEY-2.cwasm.b3`) that is verified before deserializing. The artifact
//! is read into memory once, and those bytes are both hashed and loaded: it
//! is never mapped from its file, so a file truncated or rewritten in place
//! underneath a running host (by a person, a tool or a shared network
//! directory) costs at most a recompile, never a `SIGBUS` in the host.

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
    /// `hash`: the blake3 of `wasm`, which the caller has computed.
    pub fn load(&self, engine: &Engine, wasm: &[u8], hash: &blake3::Hash, compile: &CompileConfig) -> Result<(Component, bool), CompileError> {
        let path = self.dir.as_ref().map(|dir| {
            let mut key = Blake3Hasher(blake3::Hasher::new());
            key.0.update(hash.as_bytes());
            engine.precompile_compatibility_hash().hash(&mut key);
            // `-2`: this layout (checksum beside the file); a kiln that keeps
            // the checksum inside shares the directory without clobbering it.
            dir.join(format!("{}-2.cwasm", key.0.finalize().to_hex()))
        });
        if let Some(path) = &path
            && let Some(bytes) = verified(path)
        {
            // SAFETY: these bytes were written by `store` into a directory
            // only this user can write, and they match the checksum beside
            // them; they are in this process's memory, so nothing changes
            // them between the check and the load.
            match unsafe { Component::deserialize(engine, &bytes) } {
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

/// Where the checksum of the artifact at `path` is kept.
fn sum_path(path: &Path) -> PathBuf {
    path.with_extension("cwasm.b3")
}

/// The bytes of the artifact at `path`, read once, when its checksum is
/// beside it and matches them.
fn verified(path: &Path) -> Option<Vec<u8>> {
    let sum = std::fs::read(sum_path(path)).ok()?;
    if sum.len() != MAGIC.len() + 32 || &sum[..MAGIC.len()] != MAGIC {
        return None;
    }
    let bytes = std::fs::read(path).ok()?;
    (blake3::hash(&bytes).as_bytes()[..] == sum[MAGIC.len()..]).then_some(bytes)
}

/// Writes the artifact, then its checksum, each whole or not at all (a
/// crash between the two leaves an artifact without a matching checksum:
/// compiled again next time).
fn store(path: &Path, artifact: &[u8]) -> std::io::Result<()> {
    let mut sum = MAGIC.to_vec();
    sum.extend_from_slice(blake3::hash(artifact).as_bytes());
    write_whole(path, artifact)?;
    write_whole(&sum_path(path), &sum)
}

/// Writes `bytes` to `path` through a synced temporary file and a rename;
/// on failure (a full disk) the temporary file is removed.
fn write_whole(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().ok_or_else(|| std::io::Error::other("artifact path has no parent"))?;
    let (tmp, mut file) = tempfile_in(dir)?;
    let written = file.write_all(bytes).and_then(|()| file.sync_data());
    drop(file);
    let result = written.and_then(|()| std::fs::rename(&tmp, path));
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
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
    fn rejects_tampered_truncated_or_unsummed_artifacts() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.cwasm");
        store(&path, b"payload").unwrap();
        assert_eq!(verified(&path).as_deref(), Some(&b"payload"[..]));
        assert_eq!(std::fs::read(&path).unwrap(), b"payload", "wasmtime's bytes as they are");
        std::fs::write(&path, b"paylaod").unwrap();
        assert!(verified(&path).is_none(), "tampered");
        std::fs::write(&path, b"pay").unwrap();
        assert!(verified(&path).is_none(), "truncated");
        store(&path, b"payload").unwrap();
        std::fs::remove_file(sum_path(&path)).unwrap();
        assert!(verified(&path).is_none(), "no checksum beside it");
    }
}
