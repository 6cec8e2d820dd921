//! The user-file store: what the web frontend keeps on the server for each
//! user — a settings document and a tree of small files — as storage only
//! (the rules over paths, sizes and counts are `service::user_files`'s).
//! The embedded [`DiskUserFiles`] keeps `<root>/<user>/comfy.settings.json`
//! and `<root>/<user>/files/…`, each write replacing a file whole
//! (`atomic_file`); `postgres::PgUserFiles` keeps them in the database.

use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use super::StoreError;

/// One stored file.
#[derive(Debug, Clone, PartialEq)]
pub struct FileInfo {
    /// Relative to the listed directory, `/`-separated.
    pub path: String,
    pub size: u64,
    /// Milliseconds since the epoch.
    pub modified_ms: i64,
    /// Milliseconds since the epoch (the modification time where the store
    /// keeps no creation time).
    pub created_ms: i64,
}

/// What a path names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    Missing,
    File { size: u64 },
    Directory,
}

/// Users' settings and files. Paths come checked (relative, no part empty,
/// `.`, `..` or starting with `.`, at most `MAX_DEPTH` parts). Calls may
/// wait for a disk or a network: they run on the blocking pool.
pub trait UserFileStore: Send + Sync {
    /// The settings document as written (`None`: never written).
    fn settings(&self, user: &str) -> Result<Option<Vec<u8>>, StoreError>;
    fn put_settings(&self, user: &str, bytes: &[u8]) -> Result<(), StoreError>;
    /// What `path` names.
    fn entry(&self, user: &str, path: &Path) -> Result<Entry, StoreError>;
    /// The files under directory `dir` (empty: all), recursing when asked,
    /// at most `max`, in no order; `None` when `dir` is no directory.
    fn list(&self, user: &str, dir: &Path, recurse: bool, max: usize) -> Result<Option<Vec<FileInfo>>, StoreError>;
    /// A file's bytes (`None`: no such file).
    fn read(&self, user: &str, path: &Path) -> Result<Option<Vec<u8>>, StoreError>;
    /// Writes a file whole (its directories made as needed).
    fn put(&self, user: &str, path: &Path, bytes: &[u8]) -> Result<FileInfo, StoreError>;
    /// Removes a file; whether there was one.
    fn delete(&self, user: &str, path: &Path) -> Result<bool, StoreError>;
    /// Moves a file over whatever `to` holds.
    fn rename(&self, user: &str, from: &Path, to: &Path) -> Result<FileInfo, StoreError>;
}

/// Deepest directory a listing descends to.
pub const MAX_DEPTH: usize = 16;

/// User files in a directory.
pub struct DiskUserFiles {
    root: PathBuf,
}

impl DiskUserFiles {
    /// Users' files under `root` (created on first write).
    pub fn new(root: impl Into<PathBuf>) -> DiskUserFiles {
        DiskUserFiles { root: root.into() }
    }

    fn files_dir(&self, user: &str) -> PathBuf {
        self.root.join(user).join("files")
    }

    /// Removes the directories above `path` (a file just moved or deleted)
    /// that are now empty, up to the user's `files/` directory, which
    /// stays. Left behind, they were never counted yet walked by every
    /// write: 150 moves made 2,250 of them under a 5-file limit. With them
    /// removed every directory holds a file, so a walk is bounded by the
    /// file limit × [`MAX_DEPTH`] entries. (A directory that still holds
    /// anything is kept: `remove_dir` refuses it.)
    fn remove_empty_parents(&self, user: &str, path: &Path) {
        let root = self.files_dir(user);
        let mut dir = path.parent();
        while let Some(d) = dir {
            if d == root || !d.starts_with(&root) || std::fs::remove_dir(d).is_err() {
                return;
            }
            dir = d.parent();
        }
    }
}

impl UserFileStore for DiskUserFiles {
    fn settings(&self, user: &str) -> Result<Option<Vec<u8>>, StoreError> {
        read_if_file(&self.root.join(user).join("comfy.settings.json"))
    }

    fn put_settings(&self, user: &str, bytes: &[u8]) -> Result<(), StoreError> {
        Ok(crate::atomic_file::write(&self.root.join(user).join("comfy.settings.json"), bytes, None)?)
    }

    fn entry(&self, user: &str, path: &Path) -> Result<Entry, StoreError> {
        match std::fs::metadata(self.files_dir(user).join(path)) {
            Ok(m) if m.is_dir() => Ok(Entry::Directory),
            Ok(m) => Ok(Entry::File { size: m.len() }),
            // A part of the path that is a file names nothing either.
            Err(e) if matches!(e.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory) => Ok(Entry::Missing),
            Err(e) => Err(e.into()),
        }
    }

    fn list(&self, user: &str, dir: &Path, recurse: bool, max: usize) -> Result<Option<Vec<FileInfo>>, StoreError> {
        let base = self.files_dir(user).join(dir);
        if !base.is_dir() {
            return Ok(None);
        }
        let mut out = Vec::new();
        walk(&base, "", recurse, 0, max, &mut out)?;
        Ok(Some(out))
    }

    fn read(&self, user: &str, path: &Path) -> Result<Option<Vec<u8>>, StoreError> {
        read_if_file(&self.files_dir(user).join(path))
    }

    fn put(&self, user: &str, path: &Path, bytes: &[u8]) -> Result<FileInfo, StoreError> {
        let full = self.files_dir(user).join(path);
        crate::atomic_file::write(&full, bytes, None)?;
        info(&full, path_string(path))
    }

    fn delete(&self, user: &str, path: &Path) -> Result<bool, StoreError> {
        let full = self.files_dir(user).join(path);
        match std::fs::remove_file(&full) {
            Ok(()) => {
                self.remove_empty_parents(user, &full);
                Ok(true)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    fn rename(&self, user: &str, from: &Path, to: &Path) -> Result<FileInfo, StoreError> {
        let (src, dest) = (self.files_dir(user).join(from), self.files_dir(user).join(to));
        if let Some(parent) = dest.parent() {
            crate::atomic_file::create_dir_all(parent)?;
        }
        std::fs::rename(&src, &dest)?;
        // Both names durable: the file is under one of them after a crash.
        for dir in [dest.parent(), src.parent()].into_iter().flatten() {
            crate::atomic_file::sync_dir(dir)?;
        }
        self.remove_empty_parents(user, &src);
        info(&dest, path_string(to))
    }
}

/// A regular file's bytes; `None` when `path` is missing or no file.
fn read_if_file(path: &Path) -> Result<Option<Vec<u8>>, StoreError> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() => Ok(Some(std::fs::read(path)?)),
        Ok(_) => Ok(None),
        Err(e) if matches!(e.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// `rel` as a `/`-separated string.
pub(crate) fn path_string(rel: &Path) -> String {
    rel.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect::<Vec<_>>().join("/")
}

fn info(full: &Path, path: String) -> Result<FileInfo, StoreError> {
    let meta = std::fs::metadata(full)?;
    let ms = |t: std::io::Result<std::time::SystemTime>| t.ok().and_then(|t| t.duration_since(UNIX_EPOCH).ok()).map(|d| d.as_millis() as i64);
    let modified_ms = ms(meta.modified()).unwrap_or(0);
    Ok(FileInfo { path, size: meta.len(), modified_ms, created_ms: ms(meta.created()).unwrap_or(modified_ms) })
}

/// Recursion bounded by [`MAX_DEPTH`], never by client input.
fn walk(dir: &Path, prefix: &str, recurse: bool, depth: usize, max: usize, out: &mut Vec<FileInfo>) -> Result<(), StoreError> {
    for entry in std::fs::read_dir(dir)? {
        if out.len() >= max {
            return Ok(());
        }
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        // Temporary files of writes in progress.
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

#[cfg(test)]
pub(crate) mod tests {
    use std::path::Path;

    use super::*;

    /// What every [`UserFileStore`] does, as a file system would.
    pub(crate) fn contract(store: &dyn UserFileStore) {
        let p = Path::new;
        assert_eq!(store.settings("u").unwrap(), None);
        store.put_settings("u", b"{\"a\": 1}").unwrap();
        assert_eq!(store.settings("u").unwrap().as_deref(), Some(&b"{\"a\": 1}"[..]));
        assert_eq!(store.settings("other").unwrap(), None, "per user");

        assert_eq!(store.entry("u", p("w/a.json")).unwrap(), Entry::Missing);
        assert_eq!(store.list("u", p("w"), true, 100).unwrap(), None);
        let written = store.put("u", p("w/a.json"), b"{}").unwrap();
        assert_eq!((written.path.as_str(), written.size), ("w/a.json", 2));
        store.put("u", p("w/deep/b.json"), b"[1]").unwrap();
        store.put("u", p("top.txt"), b"t").unwrap();
        assert_eq!(store.entry("u", p("w/a.json")).unwrap(), Entry::File { size: 2 });
        assert_eq!(store.entry("u", p("w")).unwrap(), Entry::Directory);
        assert_eq!(store.entry("u", p("w/a.json/x")).unwrap(), Entry::Missing, "a path through a file names nothing");
        assert_eq!(store.entry("other", p("w")).unwrap(), Entry::Missing, "per user");
        assert_eq!(store.read("u", p("w/deep/b.json")).unwrap().as_deref(), Some(&b"[1]"[..]));
        assert_eq!(store.read("u", p("w")).unwrap(), None, "a directory has no bytes");
        assert!(store.put("u", p("w/a.json/x"), b"x").is_err(), "no file under a file");
        assert!(store.put("u", p("w/deep"), b"x").is_err(), "no file over a directory");

        let names = |dir: &str, recurse: bool| {
            let mut all: Vec<String> = store.list("u", p(dir), recurse, 100).unwrap().unwrap().into_iter().map(|f| f.path).collect();
            all.sort();
            all
        };
        assert_eq!(names("", true), ["top.txt", "w/a.json", "w/deep/b.json"]);
        assert_eq!(names("", false), ["top.txt"]);
        assert_eq!(names("w", true), ["a.json", "deep/b.json"]);
        assert_eq!(names("w", false), ["a.json"]);
        assert_eq!(store.list("u", p(""), true, 2).unwrap().unwrap().len(), 2, "at most max");
        store.put("u", p("日本/a/b.json"), b"x").unwrap();
        assert_eq!(store.list("u", p("日本"), false, 100).unwrap(), Some(vec![]), "only deeper files: none directly in it");
        assert!(store.delete("u", p("日本/a/b.json")).unwrap());

        store.put("u", p("w/a.json"), b"{\"v\": 2}").unwrap();
        assert_eq!(store.entry("u", p("w/a.json")).unwrap(), Entry::File { size: 8 }, "replaced whole");
        let moved = store.rename("u", p("w/deep/b.json"), p("w/a.json")).unwrap();
        assert_eq!((moved.path.as_str(), moved.size), ("w/a.json", 3), "moved over the old file");
        assert_eq!(store.entry("u", p("w/deep")).unwrap(), Entry::Missing, "no directory is left empty");
        assert!(store.rename("u", p("nothing"), p("x")).is_err());
        assert!(store.delete("u", p("w/a.json")).unwrap());
        assert!(!store.delete("u", p("w/a.json")).unwrap());
        assert_eq!(store.list("u", p("w"), true, 100).unwrap(), None, "its last file gone, the directory is too");
    }

    #[test]
    fn the_disk_store_keeps_the_contract() {
        let dir = tempfile::tempdir().unwrap();
        contract(&DiskUserFiles::new(dir.path().join("users")));
    }
}
