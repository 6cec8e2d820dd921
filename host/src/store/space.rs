//! Free space on the data directory's filesystem: the floor below which
//! the host is not ready, and the part of it kept for the store's own
//! writes.
//!
//! Uploads and job outputs are the large writes, and they fail cleanly on a
//! full disk; the embedded store's own small writes do not (sled 0.34
//! refuses every write after one failed until it is reopened). So the large
//! writes stop while part of the floor is still free ([`DiskFloor::reserve`]):
//! uploads (new work, which readiness sends elsewhere) at half of it, the
//! outputs of jobs already accepted at a quarter; records, claims and the
//! commit log keep the rest.

use std::path::PathBuf;

use super::StoreError;

/// How often (bytes written) a staged upload checks the space left.
pub const CHECK_EVERY: u64 = 1 << 20;

/// The data directory and the free space its filesystem should keep
/// (`ready_min_free_mb`; 0: not checked).
#[derive(Debug, Clone, Default)]
pub struct DiskFloor {
    pub dir: PathBuf,
    pub min_free: u64,
}

impl DiskFloor {
    /// Bytes the filesystem has free now (`None`: not checked, or it
    /// cannot be read).
    pub fn free(&self) -> Option<u64> {
        match self.min_free {
            0 => None,
            _ => free_space(&self.dir),
        }
    }

    /// Refuses a large write of `more` bytes that would leave less than
    /// `kind`'s share of the floor free.
    pub fn reserve(&self, kind: LargeWrite, more: u64) -> Result<(), StoreError> {
        let kept = match kind {
            LargeWrite::Upload => self.min_free / 2,
            LargeWrite::Output => self.min_free / 4,
        };
        match self.free() {
            Some(free) if free < kept.saturating_add(more) => Err(StoreError::Io(std::io::Error::new(
                std::io::ErrorKind::StorageFull,
                format!("less than {} MiB would be left free on the data directory's filesystem (kept for the store's records)", kept >> 20),
            ))),
            _ => Ok(()),
        }
    }
}

/// Which large write asks for room.
#[derive(Debug, Clone, Copy)]
pub enum LargeWrite {
    /// A client's upload: stops at half the floor.
    Upload,
    /// A running job's output: stops at a quarter.
    Output,
}

/// Bytes an unprivileged process may still write on the filesystem of
/// `dir` (`None` when it cannot be read).
#[cfg(not(unix))]
fn free_space(_dir: &std::path::Path) -> Option<u64> {
    None
}

/// Bytes an unprivileged process may still write on the filesystem of
/// `dir` (`None` when it cannot be read).
#[cfg(unix)]
fn free_space(dir: &std::path::Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut stat = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `path` is a NUL-terminated string and `stat` is written by
    // the call before it is read (only when it succeeded).
    let stat = unsafe {
        if libc::statvfs(path.as_ptr(), stat.as_mut_ptr()) != 0 {
            return None;
        }
        stat.assume_init()
    };
    #[allow(clippy::useless_conversion)] // u64 on 64-bit Linux, narrower elsewhere
    Some(u64::from(stat.f_bavail).saturating_mul(u64::from(stat.f_frsize)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reserve_is_half_the_floor_and_off_without_one() {
        let dir = tempfile::tempdir().unwrap();
        let free = free_space(dir.path()).expect("statvfs reads a temporary directory");
        let floor = |min_free| DiskFloor { dir: dir.path().to_path_buf(), min_free };
        use LargeWrite::{Output, Upload};
        assert!(floor(0).free().is_none() && floor(0).reserve(Upload, u64::MAX).is_ok(), "no floor, no check");
        assert!(floor(1 << 20).reserve(Upload, 1 << 20).is_ok());
        // A write that would leave less than its share of the floor is
        // refused (1 GiB past what was free: other processes free space
        // between the two reads on a shared disk).
        let err = floor(1 << 20).reserve(Upload, free.saturating_add(1 << 30)).unwrap_err();
        assert!(matches!(&err, StoreError::Io(e) if e.kind() == std::io::ErrorKind::StorageFull), "{err}");
        // With a third of the floor free, uploads stop and outputs go on.
        let third = floor(free.saturating_mul(3));
        assert!(third.reserve(Upload, 0).is_err() && third.reserve(Output, 0).is_ok());
        assert!(floor(free.saturating_mul(5)).reserve(Output, 0).is_err(), "less free than a quarter of the floor");
        let gone = DiskFloor { dir: dir.path().join("missing"), min_free: 1 << 20 };
        assert!(gone.free().is_none() && gone.reserve(Upload, u64::MAX).is_ok(), "unknown free space does not refuse");
    }
}
