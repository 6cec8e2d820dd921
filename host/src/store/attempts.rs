//! The attempt journal: a redo log of jobs entering `running`, so that the
//! attempt count survives a crash of the process without a flush of the
//! metadata store on every job start.
//!
//! Each entry is the job's running record as one JSON line, appended with a
//! single `write(2)` and no fsync: once written it is in the kernel's page
//! cache, which a crash of this process (a panic that aborts, SIGKILL, the
//! OOM killer) does not lose. A power loss can lose it, and then a job that
//! was running looks queued and runs again — which is what recovery does with
//! a running job anyway; only the count of attempts can fall short by one,
//! and a job cannot cut the power, so it cannot loop through that gap.
//!
//! The store replays the journal when it opens (see
//! `SledMeta::open`) and then empties it; while running, the journal is
//! emptied whenever it grows past [`COMPACT_BYTES`], right after a flush of
//! the store has made every entry in it redundant.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;

use parking_lot::Mutex;

use super::{JobRecord, StoreError};

/// The journal is emptied (after a flush) once it is this long.
pub const COMPACT_BYTES: u64 = 4 << 20;

/// An append-only file of running records.
pub struct AttemptJournal {
    /// The file and its length (tracked here: no `fstat` per append).
    file: Mutex<(File, u64)>,
}

impl AttemptJournal {
    /// Opens (creating) the journal at `path` and returns it with the records
    /// it holds, oldest first. A torn or unreadable line is skipped.
    pub fn open(path: &Path) -> Result<(AttemptJournal, Vec<JobRecord>), StoreError> {
        let file = File::options().read(true).append(true).create(true).open(path)?;
        let mut records = Vec::new();
        for line in BufReader::new(&file).split(b'\n') {
            if let Ok(record) = serde_json::from_slice::<JobRecord>(&line?) {
                records.push(record);
            }
        }
        let len = file.metadata()?.len();
        Ok((AttemptJournal { file: Mutex::new((file, len)) }, records))
    }

    /// Appends `job`. When the journal has grown past [`COMPACT_BYTES`],
    /// `flush` is called first (making every earlier entry redundant) and
    /// the journal is emptied.
    pub fn append(&self, job: &JobRecord, flush: impl FnOnce() -> Result<(), StoreError>) -> Result<(), StoreError> {
        let mut line = serde_json::to_vec(job).map_err(|e| StoreError::Backend(e.to_string()))?;
        line.push(b'\n');
        let mut guard = self.file.lock();
        let (file, len) = &mut *guard;
        if *len >= COMPACT_BYTES {
            flush()?;
            file.set_len(0)?;
            *len = 0;
        }
        // One write: O_APPEND puts it after every earlier entry.
        file.write_all(&line)?;
        *len += line.len() as u64;
        Ok(())
    }

    /// Empties the journal (its entries are durable elsewhere).
    pub fn clear(&self) -> Result<(), StoreError> {
        let mut guard = self.file.lock();
        guard.0.set_len(0)?;
        guard.1 = 0;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::JobStatus;

    fn running(id: &str, attempts: u32) -> JobRecord {
        JobRecord {
            id: id.into(),
            owner: "local".into(),
            status: JobStatus::Running,
            created_at: 1,
            started_at: Some(2),
            completed_at: None,
            updated_at: 2,
            expires_at: 100,
            seq: 1,
            attempts,
            inputs: vec![],
            outputs: vec![],
            error: None,
            progress: None,
            logs: None,
            queue_ms: Some(0),
            execution_ms: None,
            metadata: None,
            surface: "v2".into(),
        }
    }

    #[test]
    fn entries_come_back_in_order_and_a_torn_line_is_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("attempts.journal");
        {
            let (journal, old) = AttemptJournal::open(&path).unwrap();
            assert!(old.is_empty());
            journal.append(&running("a", 1), || Ok(())).unwrap();
            journal.append(&running("b", 2), || Ok(())).unwrap();
        }
        // A crash in the middle of a later entry (only a power loss can tear one).
        std::fs::OpenOptions::new().append(true).open(&path).unwrap().write_all(b"{\"id\":\"c\",\"own").unwrap();
        let (journal, records) = AttemptJournal::open(&path).unwrap();
        let seen: Vec<(&str, u32)> = records.iter().map(|r| (r.id.as_str(), r.attempts)).collect();
        assert_eq!(seen, [("a", 1), ("b", 2)]);
        journal.clear().unwrap();
        assert!(AttemptJournal::open(&path).unwrap().1.is_empty());
    }

    #[test]
    fn a_long_journal_is_emptied_after_a_flush() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("attempts.journal");
        let (journal, _) = AttemptJournal::open(&path).unwrap();
        let flushes = std::cell::Cell::new(0);
        let entry_len = serde_json::to_vec(&running("a", 1)).unwrap().len() as u64 + 1;
        let entries = COMPACT_BYTES / entry_len + 2;
        for _ in 0..entries {
            journal
                .append(&running("a", 1), || {
                    flushes.set(flushes.get() + 1);
                    Ok(())
                })
                .unwrap();
        }
        assert_eq!(flushes.get(), 1, "one compaction");
        let len = std::fs::metadata(&path).unwrap().len();
        assert!(len < COMPACT_BYTES, "emptied, then appended to: {len} bytes");
        // A failed flush keeps every entry (nothing is dropped unflushed).
        std::fs::OpenOptions::new().append(true).open(&path).unwrap().set_len(COMPACT_BYTES).unwrap();
        let (journal, _) = AttemptJournal::open(&path).unwrap();
        let refused = journal.append(&running("b", 1), || Err(StoreError::Backend("disk".into())));
        assert!(refused.is_err());
        assert_eq!(std::fs::metadata(&path).unwrap().len(), COMPACT_BYTES);
    }
}
