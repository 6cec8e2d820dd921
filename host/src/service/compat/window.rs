//! ComfyUI's history window of an owner (its newest [`MAX_HISTORY`]
//! finished jobs, not expired) as short records, kept per owner between
//! requests: `/history` with an `offset` and `/api/jobs` page, count and
//! sort on it and read only their page's full records, instead of
//! decoding the whole window on every request (the frontend asks after
//! every job). A kept window is used only while the store's
//! [`MetaStore::finished_changes`](crate::store::MetaStore::finished_changes)
//! stamp for the owner is the one it was read under (the stamp is read
//! first, so a change during the read makes the next request read again).
//! At most [`OWNERS`] windows are kept (least recently used dropped).

use std::sync::Arc;

use super::MAX_HISTORY;
use crate::service::{LIST_SCAN_BUDGET, Service, ServiceError};
use crate::store::{JobRecord, JobStatus};

/// Owners whose windows are kept.
const OWNERS: usize = 32;

/// A job of the window: its record without what no listing of it shows
/// (inputs, metadata, progress, logs, traceback, every output but the
/// first), and how many outputs it has. What a kept window holds is then
/// a few hundred bytes a job, whatever its submission carried.
#[derive(Clone, Debug)]
pub struct WindowJob {
    pub record: JobRecord,
    pub outputs_count: usize,
}

impl WindowJob {
    fn new(mut record: JobRecord) -> WindowJob {
        let outputs_count = record.outputs.len();
        record.outputs.truncate(1);
        record.inputs = Vec::new();
        record.metadata = None;
        record.progress = None;
        record.logs = None;
        if let Some(error) = &mut record.error {
            error.traceback = None;
        }
        WindowJob { record, outputs_count }
    }
}

/// A kept window: the stamp it was read under, its jobs oldest first.
type Kept = (u64, Arc<Vec<WindowJob>>);

/// The kept windows by owner.
pub struct Windows(parking_lot::Mutex<lru::LruCache<String, Kept>>);

impl Default for Windows {
    fn default() -> Windows {
        Windows(parking_lot::Mutex::new(lru::LruCache::new(std::num::NonZeroUsize::new(OWNERS).unwrap_or(std::num::NonZeroUsize::MIN))))
    }
}

impl Service {
    /// `owner`'s history window, oldest first (see the module docs).
    pub async fn compat_window(&self, owner: &str) -> Result<Arc<Vec<WindowJob>>, ServiceError> {
        let stamp = self.meta.finished_changes(owner).await?;
        if let Some((kept, jobs)) = self.compat.windows.0.lock().get(owner)
            && *kept == stamp
        {
            return Ok(jobs.clone());
        }
        let keep = |j: &JobRecord| j.status.is_terminal() && j.status != JobStatus::Expired;
        let (mut jobs, mut cursor) = (Vec::new(), None);
        while jobs.len() < MAX_HISTORY {
            let page = self.meta.list_jobs(Some(owner), cursor.as_deref(), MAX_HISTORY - jobs.len(), LIST_SCAN_BUDGET, &keep).await?;
            jobs.extend(page.jobs.into_iter().map(WindowJob::new));
            match page.next {
                Some(next) => cursor = Some(next),
                None => break,
            }
        }
        jobs.reverse();
        let jobs = Arc::new(jobs);
        self.compat.windows.0.lock().put(owner.to_string(), (stamp, jobs.clone()));
        Ok(jobs)
    }

    /// The full records (without logs) of `jobs`, a page of a window, that
    /// are still in the history (one may have left it since).
    pub async fn compat_window_records(&self, jobs: &[WindowJob]) -> Result<Vec<JobRecord>, ServiceError> {
        let ids: Vec<String> = jobs.iter().map(|j| j.record.id.clone()).collect();
        let mut records = self.meta.get_jobs(&ids).await?;
        records.retain(|r| r.status.is_terminal() && r.status != JobStatus::Expired);
        for record in &mut records {
            record.logs = None;
        }
        Ok(records)
    }
}
