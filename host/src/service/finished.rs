//! Recently finished jobs' records, kept so that polling a finished job
//! reads no store: their records change only at expiry. A record read from
//! the store is cached only if nothing was forgotten since the read began
//! (a generation counter), so a write that raced the read (an expiry) is
//! never hidden behind a stale copy.

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::store::JobRecord;

/// Records with a longer log are served from the store, not kept in
/// memory (a log may be up to 1 MiB; the cache holds [`CAPACITY`] records).
pub const MAX_CACHED_LOG_BYTES: usize = 64 << 10;
/// Most records kept.
const CAPACITY: NonZeroUsize = NonZeroUsize::new(4096).expect("non-zero");

/// The cache.
pub struct FinishedJobs {
    records: Mutex<lru::LruCache<String, Arc<JobRecord>>>,
    /// Bumped by every [`FinishedJobs::forget`].
    generation: AtomicU64,
}

impl Default for FinishedJobs {
    fn default() -> Self {
        FinishedJobs { records: Mutex::new(lru::LruCache::new(CAPACITY)), generation: AtomicU64::new(0) }
    }
}

impl FinishedJobs {
    pub fn get(&self, id: &str) -> Option<Arc<JobRecord>> {
        self.records.lock().get(id).cloned()
    }

    /// Taken before a store read whose result may be remembered.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// Drops a record (after a store write).
    pub fn forget(&self, id: &str) {
        let mut records = self.records.lock();
        records.pop(id);
        self.generation.fetch_add(1, Ordering::SeqCst);
    }

    /// Keeps a finished record, unless its log is long or (`read_at`: the
    /// generation before it was read from the store) a forget happened since.
    pub fn remember(&self, record: Arc<JobRecord>, read_at: Option<u64>) {
        if record.logs.as_ref().is_some_and(|l| l.text.len() > MAX_CACHED_LOG_BYTES) {
            return;
        }
        let mut records = self.records.lock();
        if read_at.is_none_or(|g| g == self.generation.load(Ordering::SeqCst)) {
            records.put(record.id.clone(), record);
        }
    }
}
