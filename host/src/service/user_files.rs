//! What the web frontend keeps on the server for its user: settings (one
//! JSON object) and user data files (saved workflows, subgraphs, templates
//! state), kept in a [`UserFileStore`] (embedded: `<data_dir>/users/<user>/`
//! — `comfy.settings.json` and `files/` — each write replacing a file
//! whole, so a crash leaves the old or the new file, never half of one).
//! This owns the rules: paths are relative, `/`-separated, and refused when
//! any part is empty, `.`, `..`, starts with `.` (temporary files do), or
//! holds `\` or a NUL; sizes, file count and depth are bounded by
//! [`UserFileLimits`].

use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::Mutex;
use serde_json::{Map, Value as Json};

pub use crate::store::FileInfo;
use crate::store::{Entry, MAX_USER_FILE_DEPTH as MAX_DEPTH, StoreError, UserFileStore};

/// The one user of a self-hosted server (ComfyUI's single-user mode).
pub const DEFAULT_USER: &str = "default";
/// Longest relative path accepted, bytes.
const MAX_PATH_BYTES: usize = 1024;

/// Bounds on what a user may keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UserFileLimits {
    /// Largest file.
    pub file_bytes: u64,
    /// All files together.
    pub total_bytes: u64,
    /// Most files (also bounds a listing).
    pub max_files: usize,
    /// Largest settings document (serialized).
    pub settings_bytes: usize,
}

/// Why a user-data request failed.
#[derive(Debug, thiserror::Error)]
pub enum UserFilesError {
    #[error("invalid user data path: {0}")]
    InvalidPath(String),
    #[error("no such user data file or directory")]
    NotFound,
    #[error("the file already exists")]
    Exists,
    #[error("the file is larger than the {limit}-byte limit")]
    TooLarge { limit: u64 },
    #[error("the user's files would exceed {what}")]
    Full { what: String },
    #[error("settings must be a JSON object: {0}")]
    BadSettings(String),
    #[error("user data store: {0}")]
    Store(#[from] StoreError),
}

/// One user's files.
pub struct UserFiles {
    store: Arc<dyn UserFileStore>,
    user: String,
    limits: UserFileLimits,
    /// Serializes writes and holds the settings once read.
    settings: Mutex<Option<Map<String, Json>>>,
}

impl UserFiles {
    /// The files of `user` (`DEFAULT_USER`, or an account's id: letters,
    /// digits and `_`, never a name of the client's choosing) in `store`.
    pub fn new(store: Arc<dyn UserFileStore>, user: &str, limits: UserFileLimits) -> UserFiles {
        UserFiles { store, user: user.to_string(), limits, settings: Mutex::new(None) }
    }

    pub fn limits(&self) -> UserFileLimits {
        self.limits
    }

    /// All settings (`{}` before any is written).
    pub fn settings(&self) -> Result<Map<String, Json>, UserFilesError> {
        let mut cached = self.settings.lock();
        Ok(self.loaded(&mut cached)?.clone())
    }

    /// One setting (`None` when unset).
    pub fn setting(&self, id: &str) -> Result<Option<Json>, UserFilesError> {
        let mut cached = self.settings.lock();
        Ok(self.loaded(&mut cached)?.get(id).cloned())
    }

    /// Sets the given settings (others kept) and writes them down.
    pub fn update_settings(&self, values: Map<String, Json>) -> Result<(), UserFilesError> {
        let mut cached = self.settings.lock();
        let mut next = self.loaded(&mut cached)?.clone();
        next.extend(values);
        let bytes = serde_json::to_vec_pretty(&next).map_err(|e| UserFilesError::BadSettings(e.to_string()))?;
        if bytes.len() > self.limits.settings_bytes {
            return Err(UserFilesError::TooLarge { limit: self.limits.settings_bytes as u64 });
        }
        self.store.put_settings(&self.user, &bytes)?;
        *cached = Some(next);
        Ok(())
    }

    fn loaded<'a>(&self, cached: &'a mut Option<Map<String, Json>>) -> Result<&'a mut Map<String, Json>, UserFilesError> {
        if cached.is_none() {
            let map = match self.store.settings(&self.user)?.map(|bytes| serde_json::from_slice::<Json>(&bytes)) {
                None => Map::new(),
                Some(Ok(Json::Object(map))) => map,
                // A damaged file starts over rather than locking the UI out.
                Some(_) => {
                    tracing::warn!(user = %self.user, "settings are not a JSON object; starting from none");
                    Map::new()
                }
            };
            *cached = Some(map);
        }
        Ok(cached.get_or_insert_with(Map::new))
    }

    /// The files under directory `dir` (`""`: all), recursing when asked,
    /// sorted by path; at most `max_files` entries.
    pub fn list(&self, dir: &str, recurse: bool) -> Result<Vec<FileInfo>, UserFilesError> {
        let base = if dir.trim_matches('/').is_empty() { PathBuf::new() } else { checked(dir)? };
        let mut out = self.store.list(&self.user, &base, recurse, self.limits.max_files)?.ok_or(UserFilesError::NotFound)?;
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }

    /// A file's bytes (bounded by the file limit: nothing larger is written).
    pub fn read(&self, path: &str) -> Result<Vec<u8>, UserFilesError> {
        self.store.read(&self.user, &checked(path)?)?.ok_or(UserFilesError::NotFound)
    }

    /// Writes `bytes` to `path` (its directories created); an existing
    /// file is replaced only with `overwrite`.
    pub fn write(&self, path: &str, bytes: &[u8], overwrite: bool) -> Result<FileInfo, UserFilesError> {
        let rel = checked(path)?;
        if bytes.len() as u64 > self.limits.file_bytes {
            return Err(UserFilesError::TooLarge { limit: self.limits.file_bytes });
        }
        let _guard = self.settings.lock();
        let old = match self.store.entry(&self.user, &rel)? {
            Entry::Directory => return Err(UserFilesError::InvalidPath(format!("{path} is a directory"))),
            Entry::File { .. } if !overwrite => return Err(UserFilesError::Exists),
            Entry::File { size } => Some(size),
            Entry::Missing => None,
        };
        let (count, total) = self.usage()?;
        if old.is_none() && count >= self.limits.max_files {
            return Err(UserFilesError::Full { what: format!("{} files", self.limits.max_files) });
        }
        if total - old.unwrap_or(0) + bytes.len() as u64 > self.limits.total_bytes {
            return Err(UserFilesError::Full { what: format!("{} bytes", self.limits.total_bytes) });
        }
        Ok(self.store.put(&self.user, &rel, bytes)?)
    }

    /// Deletes a file.
    pub fn delete(&self, path: &str) -> Result<(), UserFilesError> {
        let rel = checked(path)?;
        let _guard = self.settings.lock();
        match self.store.entry(&self.user, &rel)? {
            Entry::File { .. } if self.store.delete(&self.user, &rel)? => Ok(()),
            _ => Err(UserFilesError::NotFound),
        }
    }

    /// Renames a file; an existing destination is replaced only with
    /// `overwrite`.
    pub fn rename(&self, from: &str, to: &str, overwrite: bool) -> Result<FileInfo, UserFilesError> {
        let (src, dest) = (checked(from)?, checked(to)?);
        let _guard = self.settings.lock();
        if !matches!(self.store.entry(&self.user, &src)?, Entry::File { .. }) {
            return Err(UserFilesError::NotFound);
        }
        match self.store.entry(&self.user, &dest)? {
            Entry::Directory => return Err(UserFilesError::InvalidPath(format!("{to} is a directory"))),
            Entry::File { .. } if !overwrite => return Err(UserFilesError::Exists),
            _ => {}
        }
        Ok(self.store.rename(&self.user, &src, &dest)?)
    }

    /// `(files, bytes)` kept now.
    fn usage(&self) -> Result<(usize, u64), UserFilesError> {
        let all = self.store.list(&self.user, &PathBuf::new(), true, usize::MAX)?.unwrap_or_default();
        Ok((all.len(), all.iter().map(|f| f.size).sum()))
    }
}

/// `path` checked and made relative (see the module doc).
fn checked(path: &str) -> Result<PathBuf, UserFilesError> {
    let bad = |why: &str| Err(UserFilesError::InvalidPath(format!("{why}: {:?}", path.chars().take(64).collect::<String>())));
    if path.is_empty() || path.len() > MAX_PATH_BYTES {
        return bad("empty or too long");
    }
    let parts: Vec<&str> = path.trim_end_matches('/').split('/').collect();
    if parts.len() > MAX_DEPTH {
        return bad("too deep");
    }
    let mut out = PathBuf::new();
    for part in parts {
        if part.is_empty() || part.starts_with('.') || part.contains(['\\', '\0']) || part.len() > 255 {
            return bad("not a plain relative path");
        }
        out.push(part);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::store::DiskUserFiles;

    fn files(dir: &Path) -> UserFiles {
        let store = Arc::new(DiskUserFiles::new(dir.join("users")));
        UserFiles::new(store, DEFAULT_USER, UserFileLimits { file_bytes: 100, total_bytes: 250, max_files: 3, settings_bytes: 200 })
    }

    #[test]
    fn settings_persist_and_are_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let store = files(dir.path());
        assert!(store.settings().unwrap().is_empty());
        store.update_settings(Map::from_iter([("Comfy.A".to_string(), Json::from(1))])).unwrap();
        store.update_settings(Map::from_iter([("Comfy.B".to_string(), Json::from("x"))])).unwrap();
        let reopened = files(dir.path());
        assert_eq!(reopened.setting("Comfy.A").unwrap(), Some(Json::from(1)));
        assert_eq!(reopened.settings().unwrap().len(), 2);
        let big = Map::from_iter([("Comfy.C".to_string(), Json::from("y".repeat(300)))]);
        assert!(matches!(reopened.update_settings(big), Err(UserFilesError::TooLarge { .. })));
        assert_eq!(files(dir.path()).settings().unwrap().len(), 2);
    }

    #[test]
    fn files_are_bounded_and_paths_checked() {
        let dir = tempfile::tempdir().unwrap();
        let store = files(dir.path());
        for bad in ["", "../x", "a/../../x", "/etc/passwd", "a//b", ".hidden", "a\\b", "a/./b"] {
            assert!(matches!(store.write(bad, b"x", true), Err(UserFilesError::InvalidPath(_))), "{bad}");
            assert!(matches!(store.read(bad), Err(UserFilesError::InvalidPath(_))), "{bad}");
        }
        store.write("workflows/a.json", b"{}", false).unwrap();
        assert!(matches!(store.write("workflows/a.json", b"{}", false), Err(UserFilesError::Exists)));
        assert!(matches!(store.write("b", &[0; 101], true), Err(UserFilesError::TooLarge { limit: 100 })));
        store.write("b", &[0; 100], true).unwrap();
        store.write("c", &[0; 100], true).unwrap();
        // A path through a file names nothing.
        assert!(matches!(store.read("b/x"), Err(UserFilesError::NotFound)));
        assert!(matches!(store.rename("b/x", "y", false), Err(UserFilesError::NotFound)));
        assert!(matches!(store.delete("b/x"), Err(UserFilesError::NotFound)));
        assert!(matches!(store.write("d", b"x", true), Err(UserFilesError::Full { .. })));
        assert!(matches!(store.write("workflows/a.json", &[0; 100], true), Err(UserFilesError::Full { .. })), "100 + 100 + 100 > 250");
        store.write("c", &[0; 50], true).unwrap();
        let listed: Vec<String> = store.list("", true).unwrap().into_iter().map(|f| f.path).collect();
        assert_eq!(listed, ["b", "c", "workflows/a.json"]);
        assert_eq!(store.list("", false).unwrap().len(), 2);
        assert!(matches!(store.list("nothing", true), Err(UserFilesError::NotFound)));
        let moved = store.rename("workflows/a.json", "workflows/sub/b.json", false).unwrap();
        assert_eq!(moved.path, "workflows/sub/b.json");
        assert_eq!(store.read("workflows/sub/b.json").unwrap(), b"{}");
        assert!(matches!(store.rename("b", "c", false), Err(UserFilesError::Exists)));
        store.delete("b").unwrap();
        assert!(matches!(store.read("b"), Err(UserFilesError::NotFound)));
    }

    #[test]
    fn moves_and_deletes_leave_no_empty_directories() {
        let dir = tempfile::tempdir().unwrap();
        let store = files(dir.path());
        store.write("a.json", b"{}", false).unwrap();
        store.write("keep/x.json", b"{}", false).unwrap();
        let mut at = "a.json".to_string();
        for i in 0..20 {
            let next = format!("d{i}/e{i}/f{i}/a.json");
            store.rename(&at, &next, false).unwrap();
            at = next;
        }
        store.rename(&at, "keep/a.json", false).unwrap();
        let files_dir = dir.path().join("users/default/files");
        let mut dirs = Vec::new();
        for entry in walkdir(&files_dir) {
            if entry.is_dir() {
                dirs.push(entry.strip_prefix(&files_dir).unwrap().to_path_buf());
            }
        }
        assert_eq!(dirs, [PathBuf::from("keep")], "only the directory that holds files is left");
        store.delete("keep/a.json").unwrap();
        store.delete("keep/x.json").unwrap();
        assert!(files_dir.is_dir(), "the user's own directory stays");
        assert_eq!(std::fs::read_dir(&files_dir).unwrap().count(), 0);
    }

    fn walkdir(dir: &Path) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                out.extend(walkdir(&path));
            }
            out.push(path);
        }
        out
    }
}
