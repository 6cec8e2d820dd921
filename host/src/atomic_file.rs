//! Replacing a small file whole: the bytes go to a temporary file in the
//! same directory (`.NAME.tmp`), which is synced and renamed over the
//! target, and the directory synced, so a crash leaves the old file or the new one, never
//! half of one, and a file that was replaced stays replaced. The one home
//! of that rule for kiln's own files (secrets, the deployments file, the
//! web frontend's user files), and of creating a directory whose entry
//! survives a power cut ([`create_dir_all`]).

use std::io::Write;
use std::path::Path;

/// Replaces `path` with `bytes` (creating its directory); `mode`: the new
/// file's Unix permission bits (default: the process umask's).
pub fn write(path: &Path, bytes: &[u8], mode: Option<u32>) -> std::io::Result<()> {
    // A bare file name's parent is the empty path: the working directory.
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    create_dir_all(dir)?;
    // One temporary name per target (writers of one file are serialized by
    // their owners), so what a crash left is reused, not piled up; a dot
    // name: listings of the directory skip it.
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp"));
    let result = (|| {
        let mut options = std::fs::File::options();
        options.write(true).create(true).truncate(true);
        #[cfg(unix)]
        if let Some(mode) = mode {
            std::os::unix::fs::OpenOptionsExt::mode(&mut options, mode);
        }
        #[cfg(not(unix))]
        let _ = mode;
        let mut file = options.open(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
        return result;
    }
    sync_dir(dir)
}

/// Makes the entries of `dir` (files created, renamed or removed in it)
/// survive a crash.
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// Creates `dir` and whatever ancestors it lacks, syncing the parent of
/// each one created so its entry survives a power cut (a file synced into
/// a directory whose own entry was lost is lost with it).
pub fn create_dir_all(dir: &Path) -> std::io::Result<()> {
    let mut missing = Vec::new();
    let mut at = dir;
    while !at.as_os_str().is_empty() && !at.is_dir() {
        missing.push(at);
        match at.parent() {
            Some(parent) => at = parent,
            None => break,
        }
    }
    for created in missing.into_iter().rev() {
        match std::fs::create_dir(created) {
            Ok(()) => {}
            // Made by another writer meanwhile, whose sync of the parent may
            // not have happened yet: synced here too.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && created.is_dir() => {}
            Err(e) => return Err(e),
        }
        let parent = created.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        sync_dir(parent)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_file_is_replaced_whole_and_no_temporary_file_stays() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub").join("f.json");
        super::write(&path, b"one", None).unwrap();
        super::write(&path, b"two", Some(0o600)).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        let names: Vec<_> = std::fs::read_dir(path.parent().unwrap()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, vec![std::ffi::OsString::from("f.json")]);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        }
        // A target that cannot be replaced (a directory) leaves nothing behind.
        assert!(super::write(dir.path().join("sub").as_path(), b"x", None).is_err());
        assert_eq!(std::fs::read_dir(path.parent().unwrap()).unwrap().count(), 1);
    }
}
