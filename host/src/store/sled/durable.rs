//! sled's flush made as durable as [`Durability`] asks.
//!
//! sled 0.34's `flush` writes its log out with `sync_file_range` (no device
//! cache flush; its background flusher adds an `fsync` every 200 ms) and
//! never syncs the files it keeps pages over 128 KiB in (`blobs/`). For a
//! power cut, [`DurableFlush::flush`] follows sled's flush with an
//! `fdatasync` of its log file (the same inode, through a descriptor of our
//! own) and of every blob file not synced at its current length (files
//! older versions left: kiln's records no longer reach sled's blob size,
//! see [`super::chunked`]). A failed sync is never retried: every later
//! flush fails until a restart. What is
//! acknowledged through sled rather than the commit log — assets, accounts,
//! sessions — and the checkpoint after which the commit log's frames
//! (submissions and their idempotency claims, finished jobs) are dropped go
//! through here.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

use super::backend;
use crate::store::StoreError;
use crate::store::durability::Durability;

/// sled's log file inside the store's directory.
const DB_FILE: &str = "db";
/// sled's directory of large values.
const BLOBS_DIR: &str = "blobs";

/// Flushes a sled database; cheap to clone (the trees' stores share one).
#[derive(Clone)]
pub(crate) struct DurableFlush {
    db: sled::Db,
    /// `None`: sled's flush is enough (a temporary database, or
    /// [`Durability::OsCrash`]).
    files: Option<Arc<Files>>,
}

struct Files {
    db: File,
    blobs: PathBuf,
    /// The blob files synced so far that still exist, by name (sled's log
    /// sequence number), with the length they had when synced; one sync of
    /// them at a time. sled writes a blob in several writes during the
    /// insert, so a flush running meanwhile can sync part of one: a length
    /// that changed since means the file is synced again.
    synced_blobs: Mutex<HashMap<u64, u64>>,
    /// A sync failed (with this kind of error): see [`Files::sync`].
    failed: Mutex<Option<std::io::ErrorKind>>,
    /// Tests make the next sync fail as a device error would.
    #[cfg(test)]
    fail_next_sync: std::sync::atomic::AtomicBool,
}

impl DurableFlush {
    /// For the database sled opened in `dir`. The directory itself is
    /// synced once here, so the files made in it when the store opened
    /// (sled's, the commit log) keep their names across a crash.
    pub(crate) fn open(db: sled::Db, dir: &Path, durability: Durability) -> Result<DurableFlush, StoreError> {
        crate::atomic_file::sync_dir(dir)?;
        if !durability.flushes_cache() {
            return Ok(DurableFlush { db, files: None });
        }
        let files = Files {
            db: File::open(dir.join(DB_FILE))?,
            blobs: dir.join(BLOBS_DIR),
            synced_blobs: Mutex::default(),
            failed: Mutex::default(),
            #[cfg(test)]
            fail_next_sync: Default::default(),
        };
        Ok(DurableFlush { db, files: Some(Arc::new(files)) })
    }

    /// A temporary database's: sled's flush only.
    pub(crate) fn temporary(db: sled::Db) -> DurableFlush {
        DurableFlush { db, files: None }
    }

    /// Makes every write to the database so far durable.
    pub(crate) fn flush(&self) -> Result<(), StoreError> {
        self.db.flush().map_err(backend)?;
        match &self.files {
            Some(files) => files.sync(),
            None => Ok(()),
        }
    }
}

impl Files {
    /// Syncs the blob files not synced at their length (before the log,
    /// whose pointers to them must not be durable first), then the log.
    /// After a sync fails nothing is synced again: the kernel may have
    /// dropped the pages it could not write and report a retry clean, so
    /// every later flush fails until the server restarts and reads what
    /// the disk really holds.
    fn sync(&self) -> Result<(), StoreError> {
        if let Some(kind) = *self.failed.lock() {
            return Err(std::io::Error::new(kind, "an earlier sync of the metadata store failed: restart the server").into());
        }
        let synced = self.sync_blobs().and_then(|()| self.sync_file(&self.db));
        if let Err(StoreError::Io(e)) = &synced {
            tracing::error!(error = %e, "a sync of the metadata store failed: every write is refused until the server restarts");
        }
        synced
    }

    /// `file.sync_data()`; a failure is remembered (see [`Files::sync`]).
    fn sync_file(&self, file: &File) -> Result<(), StoreError> {
        #[cfg(test)]
        let synced = match self.fail_next_sync.swap(false, std::sync::atomic::Ordering::Relaxed) {
            true => Err(std::io::Error::from_raw_os_error(libc::EIO)),
            false => file.sync_data(),
        };
        #[cfg(not(test))]
        let synced = file.sync_data();
        synced.map_err(|e| {
            *self.failed.lock() = Some(e.kind());
            e.into()
        })
    }

    fn sync_blobs(&self) -> Result<(), StoreError> {
        let mut synced = self.synced_blobs.lock();
        let mut present = HashMap::with_capacity(synced.len());
        let mut new = false;
        let entries = match std::fs::read_dir(&self.blobs) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        for entry in entries {
            let entry = entry?;
            // sled names each blob by its log sequence number.
            let Some(lsn) = entry.file_name().to_str().and_then(|n| n.parse::<u64>().ok()) else { continue };
            let file = match File::open(entry.path()) {
                Ok(file) => file,
                // Collected by sled since the listing: nothing to keep.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e.into()),
            };
            // The length before the sync: the sync covers at least it.
            let len = file.metadata()?.len();
            if synced.get(&lsn) != Some(&len) {
                self.sync_file(&file)?;
                new |= !synced.contains_key(&lsn);
            }
            present.insert(lsn, len);
        }
        if new {
            self.sync_file(&File::open(&self.blobs)?)?;
        }
        *synced = present;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A failed sync is not retried: every later flush fails, though the
    /// disk would now take it.
    #[test]
    fn a_failed_sync_fails_every_later_flush() {
        let dir = tempfile::tempdir().unwrap();
        let db = sled::Config::new().path(dir.path()).open().unwrap();
        let durable = DurableFlush::open(db.clone(), dir.path(), Durability::PowerLoss).unwrap();
        db.insert(b"k", b"v").unwrap();
        durable.flush().unwrap();
        let files = durable.files.as_ref().unwrap();
        files.fail_next_sync.store(true, std::sync::atomic::Ordering::Relaxed);
        db.insert(b"k", b"w").unwrap();
        assert!(durable.flush().is_err());
        let again = durable.flush().unwrap_err().to_string();
        assert!(again.contains("restart the server"), "{again}");
        // Without a cache flush nothing is remembered (sled's own flush only).
        let other = tempfile::tempdir().unwrap();
        let db = sled::Config::new().path(other.path()).open().unwrap();
        assert!(DurableFlush::open(db, other.path(), Durability::OsCrash).unwrap().flush().is_ok());
    }
}
