//! What the web frontend keeps on the server for its user: settings (one
//! JSON object) and user data files (saved workflows, subgraphs, templates
//! state), under `<data_dir>/users/<user>/` — `comfy.settings.json` and
//! `files/`. Every write goes to a temporary file in the same directory,
//! is synced and renamed over the target, so a crash leaves the old or the
//! new file, never half of one. Paths are relative, `/`-separated, and
//! refused when any part is empty, `.`, `..`, starts with `.` (temporary
//! files do), or holds `\` or a NUL; sizes, file count and depth are
//! bounded by [`UserFileLimits`].

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use parking_lot::Mutex;
use serde_json::{Map, Value as Json};

/// The one user of a self-hosted server (ComfyUI's single-user mode).
pub const DEFAULT_USER: &str = "default";
/// Longest relative path accepted, bytes.
const MAX_PATH_BYTES: usize = 1024;
/// Deepest relative path accepted, in parts.
const MAX_DEPTH: usize = 16;

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
    #[error("user data I/O failed: {0}")]
    Io(#[from] std::io::Error),
}

/// One listed file.
#[derive(Debug, Clone, PartialEq)]
pub struct FileInfo {
    /// Relative to the listed directory, `/`-separated.
    pub path: String,
    pub size: u64,
    /// Milliseconds since the epoch.
    pub modified_ms: i64,
    /// Milliseconds since the epoch (the modification time where the file
    /// system keeps no creation time).
    pub created_ms: i64,
}

/// The user files of one data directory.
pub struct UserFiles {
    root: PathBuf,
    limits: UserFileLimits,
    /// Serializes writes and holds the settings once read.
    settings: Mutex<Option<Map<String, Json>>>,
}

impl UserFiles {
    /// Files under `<data_dir>/users/default` (created on first write).
    pub fn new(data_dir: &Path, limits: UserFileLimits) -> UserFiles {
        UserFiles::for_user(data_dir, DEFAULT_USER, limits)
    }

    /// Files under `<data_dir>/users/<user>` (an account's id: letters,
    /// digits and `_`, never a path of the client's choosing).
    pub fn for_user(data_dir: &Path, user: &str, limits: UserFileLimits) -> UserFiles {
        UserFiles { root: data_dir.join("users").join(user), limits, settings: Mutex::new(None) }
    }

    pub fn limits(&self) -> UserFileLimits {
        self.limits
    }

    fn settings_path(&self) -> PathBuf {
        self.root.join("comfy.settings.json")
    }

    fn files_dir(&self) -> PathBuf {
        self.root.join("files")
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
        write_atomic(&self.settings_path(), &bytes)?;
        *cached = Some(next);
        Ok(())
    }

    fn loaded<'a>(&self, cached: &'a mut Option<Map<String, Json>>) -> Result<&'a mut Map<String, Json>, UserFilesError> {
        if cached.is_none() {
            let map = match std::fs::read(self.settings_path()) {
                Ok(bytes) => match serde_json::from_slice::<Json>(&bytes) {
                    Ok(Json::Object(map)) => map,
                    // A damaged file starts over rather than locking the UI out.
                    _ => {
                        tracing::warn!(path = %self.settings_path().display(), "settings file is not a JSON object; starting from none");
                        Map::new()
                    }
                },
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Map::new(),
                Err(e) => return Err(e.into()),
            };
            *cached = Some(map);
        }
        Ok(cached.get_or_insert_with(Map::new))
    }

    /// The files under directory `dir` (`""`: all), recursing when asked,
    /// sorted by path; at most `max_files` entries.
    pub fn list(&self, dir: &str, recurse: bool) -> Result<Vec<FileInfo>, UserFilesError> {
        let base = if dir.trim_matches('/').is_empty() { self.files_dir() } else { self.files_dir().join(checked(dir)?) };
        if !base.is_dir() {
            return Err(UserFilesError::NotFound);
        }
        let mut out = Vec::new();
        walk(&base, "", recurse, 0, self.limits.max_files, &mut out)?;
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }

    /// A file's bytes (bounded by the file limit: nothing larger is written).
    pub fn read(&self, path: &str) -> Result<Vec<u8>, UserFilesError> {
        let full = self.files_dir().join(checked(path)?);
        match std::fs::metadata(&full) {
            Ok(m) if m.is_file() => {}
            Ok(_) => return Err(UserFilesError::NotFound),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(UserFilesError::NotFound),
            Err(e) => return Err(e.into()),
        }
        Ok(std::fs::read(full)?)
    }

    /// Writes `bytes` to `path` (its directories created); an existing
    /// file is replaced only with `overwrite`.
    pub fn write(&self, path: &str, bytes: &[u8], overwrite: bool) -> Result<FileInfo, UserFilesError> {
        let rel = checked(path)?;
        if bytes.len() as u64 > self.limits.file_bytes {
            return Err(UserFilesError::TooLarge { limit: self.limits.file_bytes });
        }
        let _guard = self.settings.lock();
        let full = self.files_dir().join(&rel);
        let old = match std::fs::metadata(&full) {
            Ok(m) if m.is_dir() => return Err(UserFilesError::InvalidPath(format!("{path} is a directory"))),
            Ok(_) if !overwrite => return Err(UserFilesError::Exists),
            Ok(m) => Some(m.len()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(e.into()),
        };
        let (count, total) = self.usage()?;
        if old.is_none() && count >= self.limits.max_files {
            return Err(UserFilesError::Full { what: format!("{} files", self.limits.max_files) });
        }
        if total - old.unwrap_or(0) + bytes.len() as u64 > self.limits.total_bytes {
            return Err(UserFilesError::Full { what: format!("{} bytes", self.limits.total_bytes) });
        }
        if let Some(parent) = full.parent() {
            std::fs::create_dir_all(parent)?;
        }
        write_atomic(&full, bytes)?;
        info(&full, path_string(&rel))
    }

    /// Deletes a file.
    pub fn delete(&self, path: &str) -> Result<(), UserFilesError> {
        let full = self.files_dir().join(checked(path)?);
        let _guard = self.settings.lock();
        match std::fs::metadata(&full) {
            Ok(m) if m.is_file() => {
                std::fs::remove_file(&full)?;
                self.remove_empty_parents(&full);
                Ok(())
            }
            Ok(_) => Err(UserFilesError::NotFound),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(UserFilesError::NotFound),
            Err(e) => Err(e.into()),
        }
    }

    /// Renames a file; an existing destination is replaced only with
    /// `overwrite`.
    pub fn rename(&self, from: &str, to: &str, overwrite: bool) -> Result<FileInfo, UserFilesError> {
        let (src, dest) = (self.files_dir().join(checked(from)?), checked(to)?);
        let dest_full = self.files_dir().join(&dest);
        let _guard = self.settings.lock();
        if !src.is_file() {
            return Err(UserFilesError::NotFound);
        }
        match std::fs::metadata(&dest_full) {
            Ok(m) if m.is_dir() => return Err(UserFilesError::InvalidPath(format!("{to} is a directory"))),
            Ok(_) if !overwrite => return Err(UserFilesError::Exists),
            _ => {}
        }
        if let Some(parent) = dest_full.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::rename(&src, &dest_full)?;
        self.remove_empty_parents(&src);
        info(&dest_full, path_string(&dest))
    }

    /// Removes the directories above `path` (a file just moved or deleted)
    /// that are now empty, up to the user's `files/` directory, which
    /// stays. Left behind, they were never counted yet walked by every
    /// write: 150 moves made 2,250 of them under a 5-file limit. With them
    /// removed every directory holds a file, so the walk is bounded by
    /// `max_userdata_files` × `MAX_DEPTH` entries. (A directory that still
    /// holds anything is kept: `remove_dir` refuses it.)
    fn remove_empty_parents(&self, path: &Path) {
        let root = self.files_dir();
        let mut dir = path.parent();
        while let Some(d) = dir {
            if d == root || !d.starts_with(&root) || std::fs::remove_dir(d).is_err() {
                return;
            }
            dir = d.parent();
        }
    }

    /// `(files, bytes)` kept now.
    fn usage(&self) -> Result<(usize, u64), UserFilesError> {
        let mut all = Vec::new();
        let dir = self.files_dir();
        if dir.is_dir() {
            walk(&dir, "", true, 0, usize::MAX, &mut all)?;
        }
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

fn path_string(rel: &Path) -> String {
    rel.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect::<Vec<_>>().join("/")
}

fn info(full: &Path, path: String) -> Result<FileInfo, UserFilesError> {
    let meta = std::fs::metadata(full)?;
    let ms = |t: std::io::Result<std::time::SystemTime>| t.ok().and_then(|t| t.duration_since(UNIX_EPOCH).ok()).map(|d| d.as_millis() as i64);
    let modified_ms = ms(meta.modified()).unwrap_or(0);
    Ok(FileInfo { path, size: meta.len(), modified_ms, created_ms: ms(meta.created()).unwrap_or(modified_ms) })
}

fn walk(dir: &Path, prefix: &str, recurse: bool, depth: usize, max: usize, out: &mut Vec<FileInfo>) -> Result<(), UserFilesError> {
    for entry in std::fs::read_dir(dir)? {
        if out.len() >= max {
            return Ok(());
        }
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        let rel = if prefix.is_empty() { name } else { format!("{prefix}/{name}") };
        let kind = entry.file_type()?;
        if kind.is_dir() {
            if recurse && depth + 1 < MAX_DEPTH {
                walk(&entry.path(), &rel, recurse, depth + 1, max, out)?;
            }
        } else if kind.is_file() {
            out.push(info(&entry.path(), rel)?);
        }
    }
    Ok(())
}

/// Writes `bytes` to `path` through a synced temporary file in the same
/// directory, renamed over it.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".tmp-{}", uuid::Uuid::new_v4().simple()));
    let result = (|| {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(dir: &Path) -> UserFiles {
        UserFiles::new(dir, UserFileLimits { file_bytes: 100, total_bytes: 250, max_files: 3, settings_bytes: 200 })
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
