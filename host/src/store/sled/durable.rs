//! sled's flush made as durable as [`Durability`] asks.
//!
//! sled 0.34's `flush` writes its log out with `sync_file_range` (no device
//! cache flush; its background flusher adds an `fsync` every 200 ms) and
//! never syncs the files it keeps values over ~128 KiB in (`blobs/`). For a
//! power cut, [`DurableFlush::flush`] follows sled's flush with an
//! `fdatasync` of its log file (the same inode, through a descriptor of our
//! own) and of every blob file not synced at its current length. What is
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
        let files = Files { db: File::open(dir.join(DB_FILE))?, blobs: dir.join(BLOBS_DIR), synced_blobs: Mutex::default() };
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
    fn sync(&self) -> Result<(), StoreError> {
        self.db.sync_data()?;
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
                file.sync_data()?;
                new |= !synced.contains_key(&lsn);
            }
            present.insert(lsn, len);
        }
        if new {
            File::open(&self.blobs)?.sync_all()?;
        }
        *synced = present;
        Ok(())
    }
}
