//! [`SledMeta`]: the async [`MetaStore`] over the synchronous [`Sled`]
//! store — where each call runs (inline, or on the blocking pool when it may
//! wait for the disk and the caller is on the request runtime).

use std::path::Path;
use std::sync::Arc;

use super::{Sled, SledMeta, backend};
use crate::store::durability::Durability;
use crate::store::{AssetRecord, IdempotencyClaim, JobFilter, JobPage, JobRecord, MetaStore, Micros, StoreError};

/// Whether this thread runs a multi-thread runtime's tasks (the request
/// runtime's workers), where waiting for the disk goes to the blocking
/// pool; a thread marked as one that may block (`store::may_block_here`:
/// the blocking pool driving service work) waits inline.
fn on_request_runtime() -> bool {
    use tokio::runtime::{Handle, RuntimeFlavor};
    !crate::store::may_block() && Handle::try_current().is_ok_and(|h| h.runtime_flavor() == RuntimeFlavor::MultiThread)
}

impl SledMeta {
    /// Opens (creating) the store in `dir`, replaying its commit log;
    /// acknowledged writes survive a power cut.
    pub fn open(dir: &Path) -> Result<SledMeta, StoreError> {
        SledMeta::open_with(dir, Durability::PowerLoss)
    }

    /// Opens (creating) the store in `dir`, replaying its commit log;
    /// acknowledged writes are as durable as `durability` says.
    pub fn open_with(dir: &Path, durability: Durability) -> Result<SledMeta, StoreError> {
        Sled::open(dir, durability).map(|sled| SledMeta(Arc::new(sled)))
    }

    /// The account store, in this store's database beside the jobs.
    pub fn accounts(&self) -> Result<super::SledAccounts, StoreError> {
        super::SledAccounts::new(&self.0.db, self.0.durable.clone())
    }

    /// The web sign-in sessions, in the same database.
    pub fn sessions(&self) -> Result<super::SledSessions, StoreError> {
        let tree = self.0.db.open_tree("sessions").map_err(backend)?;
        Ok(super::SledSessions::new(tree, self.0.durable.clone()))
    }

    /// Runs `f`, which may wait for the disk: inline on a current-thread
    /// runtime (kiln's job execution runtimes, there for blocking job work:
    /// a hand-off and back costs ~100 µs a job), on the blocking pool
    /// otherwise (the request runtime's threads must not wait for a disk).
    async fn blocking<T: Send + 'static>(&self, f: impl FnOnce(&Sled) -> Result<T, StoreError> + Send + 'static) -> Result<T, StoreError> {
        if on_request_runtime() {
            let sled = self.0.clone();
            return tokio::task::spawn_blocking(move || f(&sled)).await.map_err(|e| StoreError::Backend(format!("store task: {e}")))?;
        }
        f(&self.0)
    }
}

#[async_trait::async_trait]
impl MetaStore for SledMeta {
    async fn submit(&self, job: &JobRecord, workflow: &serde_json::Value, claim: Option<&IdempotencyClaim>) -> Result<(), StoreError> {
        self.0.submit(job, workflow, claim)
    }
    async fn put_job(&self, job: &JobRecord) -> Result<(), StoreError> {
        self.0.put_job(job)
    }
    async fn get_job(&self, id: &str) -> Result<Option<JobRecord>, StoreError> {
        self.0.get_job(id)
    }
    async fn delete_job(&self, job: &JobRecord) -> Result<(), StoreError> {
        self.0.delete_job(job)
    }
    async fn get_workflow(&self, id: &str) -> Result<Option<serde_json::Value>, StoreError> {
        self.0.get_workflow(id)
    }
    async fn get_workflow_bytes(&self, id: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.0.get_workflow_bytes(id)
    }
    async fn list_jobs(
        &self,
        owner: Option<&str>,
        cursor: Option<&[u8]>,
        limit: usize,
        max_scanned: usize,
        keep: &JobFilter<'_>,
    ) -> Result<JobPage, StoreError> {
        self.0.list_jobs(owner, cursor, limit, max_scanned, keep)
    }
    async fn unfinished_jobs(&self) -> Result<Vec<JobRecord>, StoreError> {
        self.blocking(|sled| sled.unfinished_jobs()).await
    }
    async fn max_seq(&self) -> Result<u64, StoreError> {
        self.0.index.max_seq()
    }
    async fn jobs_due(&self, now: Micros, purge_before: Micros, limit: usize) -> Result<Vec<JobRecord>, StoreError> {
        self.blocking(move |sled| sled.jobs_due(now, purge_before, limit)).await
    }
    async fn record_start(&self, job: &JobRecord) -> Result<(), StoreError> {
        self.0.record_start(job)
    }
    /// A request worker syncs inline while syncs are quick (a hand-off to
    /// another thread and back costs more than a quick sync on a small
    /// machine: BENCHMARKS.md, "commit log syncs off the request workers
    /// when the disk is slow"); once one was slow, or while a checkpoint
    /// holds the log (a flush of the whole store), the log's sync thread
    /// runs them, shared with the other requests waiting, so no worker
    /// waits for the disk. A job's thread, which may block, syncs inline.
    async fn sync_jobs(&self) -> Result<(), StoreError> {
        if on_request_runtime() && (self.0.log.sync_may_wait() || self.0.writes_may_block()) {
            return self.0.syncer.sync().await;
        }
        self.0.sync_jobs()
    }
    fn writes_may_block(&self) -> bool {
        self.0.writes_may_block()
    }
    async fn finish_job(&self, job: &JobRecord, assets: &[AssetRecord]) -> Result<(), StoreError> {
        if !on_request_runtime() {
            // A job's own thread (the usual caller): no copy for the pool.
            return self.0.finish_job(job, assets);
        }
        let (job, assets) = (job.clone(), assets.to_vec());
        self.blocking(move |sled| sled.finish_job(&job, &assets)).await
    }
    async fn checkpoint(&self) -> Result<(), StoreError> {
        self.blocking(|sled| sled.checkpoint()).await
    }
    async fn put_asset(&self, asset: &AssetRecord) -> Result<(), StoreError> {
        self.0.put_asset(asset)
    }
    async fn update_asset(&self, asset: &AssetRecord) -> Result<bool, StoreError> {
        self.0.update_asset(asset)
    }
    async fn change_asset(&self, id: &str, change: crate::store::AssetChange) -> Result<Option<AssetRecord>, StoreError> {
        self.0.change_asset(id, &*change)
    }
    async fn get_asset(&self, id: &str) -> Result<Option<AssetRecord>, StoreError> {
        self.0.get_asset(id)
    }
    async fn delete_asset(&self, asset: &AssetRecord) -> Result<(), StoreError> {
        self.0.delete_asset(asset)
    }
    async fn delete_expired_upload(&self, asset: &AssetRecord, now: Micros) -> Result<Option<AssetRecord>, StoreError> {
        self.0.delete_expired_upload(asset, now)
    }
    async fn assets_with_hash(&self, hash: &str) -> Result<Vec<AssetRecord>, StoreError> {
        self.0.assets_with_hash(hash)
    }
    async fn assets_of_job(&self, job_id: &str) -> Result<Vec<AssetRecord>, StoreError> {
        self.0.assets_of_job(job_id)
    }
    async fn uploads_due(&self, now: Micros, limit: usize) -> Result<Vec<AssetRecord>, StoreError> {
        self.blocking(move |sled| sled.uploads_due(now, limit)).await
    }
    async fn assets_tagged(&self, prefix: &str) -> Result<Vec<AssetRecord>, StoreError> {
        let prefix = prefix.to_string();
        self.blocking(move |sled| sled.assets_tagged(&prefix)).await
    }
    async fn get_claim(&self, key: &str) -> Result<Option<IdempotencyClaim>, StoreError> {
        self.0.get_claim(key)
    }
    async fn purge_claims(&self, now: Micros) -> Result<usize, StoreError> {
        self.0.purge_claims(now)
    }
    async fn tidy(&self) -> Result<usize, StoreError> {
        self.blocking(|sled| sled.tidy()).await
    }
    async fn flush(&self) -> Result<(), StoreError> {
        self.blocking(|sled| sled.flush()).await
    }
    async fn finished_changes(&self, owner: &str) -> Result<u64, StoreError> {
        Ok(self.0.finished_changes(owner))
    }

    async fn check_writable(&self) -> Result<(), StoreError> {
        self.blocking(|sled| sled.check_writable()).await
    }

    async fn installation_id(&self) -> Result<String, StoreError> {
        self.0.installation_id()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A call that may wait for the disk leaves a request worker for the
    /// blocking pool, and runs where it is on a thread marked as one that
    /// may block (no second hop from the pool to the pool).
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn disk_waits_leave_request_workers_and_stay_on_blocking_threads() {
        let dir = tempfile::tempdir().unwrap();
        let meta = Arc::new(SledMeta::open(dir.path()).unwrap());
        let here = std::thread::current().id();
        let ran = meta.blocking(|_| Ok(std::thread::current().id())).await.unwrap();
        assert_ne!(ran, here, "off the request worker");
        let runtime = tokio::runtime::Handle::current();
        let (on_pool, ran) = tokio::task::spawn_blocking(move || {
            crate::store::may_block_here(|| (std::thread::current().id(), runtime.block_on(meta.blocking(|_| Ok(std::thread::current().id()))).unwrap()))
        })
        .await
        .unwrap();
        assert_eq!(ran, on_pool, "inline on the marked pool thread");
        assert!(!crate::store::may_block(), "the mark ends with its call");
    }
}
