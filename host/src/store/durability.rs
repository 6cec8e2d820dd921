//! How far the embedded store's acknowledged writes are made durable: the
//! one place that decides which system call a sync of the commit log or of
//! sled's files is.
//!
//! `sync_file_range` writes the pages to the device and waits for them but
//! issues no cache flush and writes no metadata: the commit log (whose file
//! is zero-filled ahead and made durable with `fdatasync` when it grows)
//! survives a kernel crash that way, sled's log — which grows by appending
//! — only as of sled's own `fsync`, every 200 ms. Nothing survives a power
//! cut on a disk with a volatile write cache without the flush that
//! `fdatasync` adds (what PostgreSQL does before acknowledging a commit by
//! default).

use std::fs::File;
use std::os::fd::AsRawFd;

use serde::{Deserialize, Serialize};

/// What an acknowledged write survives (`durability` in the configuration).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Durability {
    /// A power cut: every sync is an `fdatasync` (a cache flush on the
    /// device), shared by the writes waiting for it (group commit).
    #[default]
    PowerLoss,
    /// kill -9: syncs write the pages out (`sync_file_range`) without a
    /// cache flush. A kernel crash keeps the jobs (their commit log) but
    /// may lose what went through sled alone — uploads, cancellations,
    /// deletions, accounts, sign-ins — in the last 200 ms; a power cut on a
    /// disk with a volatile write cache may lose any of it.
    OsCrash,
}

impl Durability {
    /// Makes `[from, to)` of `file` (and, for a power cut, whatever the
    /// file's size needs) durable as far as this level promises.
    pub(crate) fn sync_range(self, file: &File, from: u64, to: u64) -> std::io::Result<()> {
        if to <= from {
            return Ok(());
        }
        match self {
            Durability::PowerLoss => file.sync_data(),
            Durability::OsCrash => write_out(file, from, to),
        }
    }

    /// Whether syncs flush the device's cache.
    pub(crate) fn flushes_cache(self) -> bool {
        self == Durability::PowerLoss
    }
}

/// Pushes `[from, to)` of `file` to the device and waits for it.
fn write_out(file: &File, from: u64, to: u64) -> std::io::Result<()> {
    let flags = libc::SYNC_FILE_RANGE_WAIT_BEFORE | libc::SYNC_FILE_RANGE_WRITE | libc::SYNC_FILE_RANGE_WAIT_AFTER;
    let (offset, len) = (libc::off64_t::try_from(from), libc::off64_t::try_from(to - from));
    let (Ok(offset), Ok(len)) = (offset, len) else { return file.sync_data() };
    // SAFETY: a plain syscall on an open descriptor; no memory is passed.
    let rc = unsafe { libc::sync_file_range(file.as_raw_fd(), offset, len, flags) };
    match rc {
        0 => Ok(()),
        _ => match std::io::Error::last_os_error() {
            // Not every system has it: a full sync promises more.
            e if e.raw_os_error() == Some(libc::ENOSYS) => file.sync_data(),
            e => Err(e),
        },
    }
}
