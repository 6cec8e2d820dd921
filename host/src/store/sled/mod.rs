//! The embedded metadata store on sled.
//!
//! Trees: `jobs` (id → JSON), `workflows` (id → JSON), `jobs_by_time`
//! (created µs big-endian ‖ id → id, for newest-first listing),
//! `jobs_by_owner` (owner ‖ 0 ‖ the same key → id, for one owner's
//! listing: an index range, however many jobs other owners have), `assets`
//! (id → JSON), `asset_hashes`
//! (hash ‖ 0 ‖ id → empty, for dedup and blob reference counts) and
//! `claims` (Idempotency-Key → JSON); the account store opens `accounts`
//! (see `crate::accounts`); the indexes of the periodic work are in
//! [`index`]. Beside them, in the same directory,
//! the commit log ([`super::commit_log`]) makes submissions, job starts and
//! finished jobs durable without a sled flush; it is replayed when the store
//! opens. Everything else is made durable by sled's flush. There is no
//! queue tree: the queue is the queued jobs in `seq` order, rebuilt from
//! the job records when the service starts.

mod accounts;
mod chunked;
mod durable;
mod export;
mod index;
mod meta;
mod replay;
mod sessions;
mod syncer;

use std::path::Path;
use std::sync::Arc;

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::commit_log::CommitLog;
use super::durability::Durability;
use super::{AssetRecord, IdempotencyClaim, JobFilter, JobPage, JobRecord, JobStatus, Micros, StoreError};
use chunked::Chunked;
use durable::DurableFlush;
use index::Indexes;
use replay::entry;

pub use accounts::SledAccounts;
pub use export::ExportedJob;
pub use sessions::SledSessions;

/// sled-backed [`MetaStore`](crate::store::MetaStore): the synchronous store ([`Sled`]) behind the
/// async trait; what may wait for the disk (a log sync, a flush, a scan)
/// runs on tokio's blocking pool, the rest inline (sled reads and unsynced
/// writes take microseconds).
pub struct SledMeta(Arc<Sled>);

struct Sled {
    db: sled::Db,
    jobs: Chunked,
    workflows: Chunked,
    by_time: sled::Tree,
    by_owner: sled::Tree,
    assets: Chunked,
    hashes: sled::Tree,
    claims: sled::Tree,
    index: Indexes,
    log: Arc<CommitLog>,
    /// Runs log syncs for the request runtime's workers.
    syncer: syncer::Syncer,
    /// sled's flush, as durable as the store was opened with.
    durable: DurableFlush,
    /// Collects record pieces no record names (see `chunked`).
    pieces: chunked::PieceSweep,
    /// The accounts tree as `Chunked` (the account store has its own).
    accounts: Chunked,
    /// Per owner, a count of writes and deletions of its finished jobs
    /// (`MetaStore::finished_changes`), bumped after each is done; one
    /// entry per owner that has finished a job since the store opened.
    finished_changes: parking_lot::Mutex<std::collections::HashMap<Box<str>, u64>>,
}

/// How long before the saved unfinished set a job's creation time may lie
/// and its submission still miss the set (its record is written right
/// after its creation time is taken; this covers a thread descheduled in
/// between).
const RESCAN_MARGIN: Micros = 60_000_000;

/// How far past its time an index entry that its record does not file
/// must be before it is taken for stale (see [`Sled::jobs_due`]).
const STALE_AFTER: Micros = 60_000_000;

/// The commit log's file inside the store's directory.
const LOG_FILE: &str = "commit.log";
/// Where earlier versions journaled job starts (unsynced); removed on open.
const OLD_JOURNAL_FILE: &str = "attempts.journal";

/// sled's I/O errors keep their kind (a full disk is `StorageFull`).
fn backend(e: sled::Error) -> StoreError {
    match e {
        sled::Error::Io(e) => StoreError::Io(e),
        e => StoreError::Backend(e.to_string()),
    }
}

fn encode<T: Serialize>(v: &T) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(v).map_err(|e| StoreError::Backend(e.to_string()))
}

fn decode<T: DeserializeOwned>(key: &[u8], bytes: &[u8]) -> Result<T, StoreError> {
    serde_json::from_slice(bytes).map_err(|_| StoreError::Corrupt(String::from_utf8_lossy(key).into_owned()))
}

fn time_key(job: &JobRecord) -> Vec<u8> {
    let mut k = job.created_at.to_be_bytes().to_vec();
    k.extend_from_slice(job.id.as_bytes());
    k
}

fn owner_key(job: &JobRecord) -> Vec<u8> {
    let mut k = owner_prefix(&job.owner);
    k.extend_from_slice(&time_key(job));
    k
}

fn owner_prefix(owner: &str) -> Vec<u8> {
    let mut k = owner.as_bytes().to_vec();
    k.push(0);
    k
}

fn hash_key(hash: &str, id: &str) -> Vec<u8> {
    let mut k = hash.as_bytes().to_vec();
    k.push(0);
    k.extend_from_slice(id.as_bytes());
    k
}

impl Sled {
    fn open(dir: &Path, durability: Durability) -> Result<Sled, StoreError> {
        // sled's background flusher lets go of the directory's lock a moment
        // after the previous handle is dropped (an in-process restart); a
        // lock held longer means another kiln uses this data directory.
        let config = sled::Config::new().path(dir).flush_every_ms(Some(200)).cache_capacity(16 << 20);
        // Its entry durable before anything is synced inside it.
        crate::atomic_file::create_dir_all(dir)?;
        // sled reports a held lock as an `Other` I/O error with this text.
        let locked = |e: &std::io::Error| e.kind() == std::io::ErrorKind::WouldBlock || e.to_string().starts_with("could not acquire lock");
        let mut attempt = 0;
        let db = loop {
            match config.open() {
                Ok(db) => break db,
                Err(sled::Error::Io(e)) if locked(&e) && attempt < 100 => {
                    attempt += 1;
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                Err(sled::Error::Io(e)) if locked(&e) => {
                    return Err(StoreError::Backend(format!("{} is in use by another process", dir.display())));
                }
                Err(e) => return Err(backend(e)),
            }
        };
        let tree = |name: &str| db.open_tree(name).map_err(backend);
        let (log, entries) = CommitLog::open(&dir.join(LOG_FILE), durability)?;
        let log = Arc::new(log);
        let syncer = syncer::Syncer::start(log.clone())?;
        let durable = DurableFlush::open(db.clone(), dir, durability)?;
        let meta = Sled {
            jobs: Chunked::open(&db, "jobs", 1)?,
            workflows: Chunked::open(&db, "workflows", 2)?,
            by_time: tree("jobs_by_time")?,
            by_owner: tree("jobs_by_owner")?,
            assets: Chunked::open(&db, "assets", 3)?,
            hashes: tree("asset_hashes")?,
            claims: tree("claims")?,
            index: Indexes::open(&db)?,
            log,
            syncer,
            durable,
            pieces: Default::default(),
            accounts: Chunked::open(&db, "accounts", 4)?,
            finished_changes: Default::default(),
            db,
        };
        meta.split_long_records()?;
        meta.index_owners()?;
        meta.index.build_once(&meta.jobs, &meta.assets, &meta.claims)?;
        meta.reindex_recent()?;
        meta.replay(entries)?;
        let _ = std::fs::remove_file(dir.join(OLD_JOURNAL_FILE));
        // Written by earlier versions, never read: the queue comes from the job records.
        let _ = meta.db.drop_tree("queue");
        Ok(meta)
    }

    /// The installation's id, made (and flushed) at its first ask.
    fn installation_id(&self) -> Result<String, StoreError> {
        const KEY: &[u8] = b"installation_id";
        let made = uuid::Uuid::new_v4().to_string();
        let id = match self.db.compare_and_swap(KEY, None::<&[u8]>, Some(made.as_bytes())).map_err(backend)? {
            Ok(()) => {
                self.flush()?;
                made
            }
            Err(taken) => {
                String::from_utf8(taken.current.map(|v| v.to_vec()).unwrap_or_default()).map_err(|_| StoreError::Corrupt("installation_id".into()))?
            }
        };
        Ok(id)
    }

    /// Splits the records a version before [`chunked`] stored whole (once,
    /// then flushed): until then sled may write the pages holding them to
    /// its unsynced blob files.
    fn split_long_records(&self) -> Result<(), StoreError> {
        const DONE: &[u8] = b"records_split";
        if self.db.get(DONE).map_err(backend)?.is_some() {
            return Ok(());
        }
        let mut split = 0;
        for tree in [&self.jobs, &self.workflows, &self.assets, &self.accounts] {
            split += tree.split_long_values()?;
        }
        if split > 0 {
            tracing::info!(records = split, "stored the store's long records in pieces");
        }
        self.db.insert(DONE, &[1]).map_err(backend)?;
        self.flush()
    }

    /// Builds the owner index of a store written before it existed (once:
    /// the index is empty while jobs exist), then flushes it.
    fn index_owners(&self) -> Result<(), StoreError> {
        if !self.by_owner.is_empty() || self.jobs.is_empty() {
            return Ok(());
        }
        let mut count = 0;
        for item in self.jobs.iter() {
            let (k, v) = item?;
            let Ok(job) = decode::<JobRecord>(&k, &v) else { continue };
            self.by_owner.insert(owner_key(&job), job.id.as_bytes()).map_err(backend)?;
            count += 1;
        }
        tracing::info!(jobs = count, "indexed the store's jobs by owner");
        self.flush()?;
        Ok(())
    }

    /// Indexes again the jobs created since a little before the unfinished
    /// set was last saved (`RESCAN_MARGIN`): a submission whose record a
    /// checkpoint's flush (or sled's background flush) made durable after
    /// the set was taken, but whose log frame was lost, is in neither.
    fn reindex_recent(&self) -> Result<(), StoreError> {
        let Some(saved_at) = self.index.saved_at()? else { return Ok(()) };
        let from = saved_at.saturating_sub(RESCAN_MARGIN).to_be_bytes();
        let mut count = 0;
        for item in self.by_time.range(from.as_slice()..) {
            let (_, id) = item.map_err(backend)?;
            if let Some(job) = self.get_job(&String::from_utf8_lossy(&id))? {
                self.index.reindex(&job)?;
                count += 1;
            }
        }
        tracing::debug!(jobs = count, "re-indexed the jobs created since the last checkpoint");
        Ok(())
    }

    /// A checkpoint's flush: the unfinished jobs' set is saved with it
    /// (see `index`), then everything is made durable.
    fn checkpoint_flush(&self) -> Result<(), StoreError> {
        self.index.save_unfinished()?;
        self.flush()
    }

    fn append(&self, entry: &[u8], sync: bool) -> Result<(), StoreError> {
        self.log.append(entry, sync, || self.checkpoint_flush())
    }

    /// Writes a submission's workflow and time index, then the
    /// job record: sled keeps a prefix of its writes, so a job record that
    /// survives a crash has everything written before it.
    fn write_submission(&self, job: &JobRecord, job_bytes: &[u8], wf_bytes: &[u8]) -> Result<(), StoreError> {
        self.workflows.put(job.id.as_bytes(), wf_bytes)?;
        self.by_time.insert(time_key(job), job.id.as_bytes()).map_err(backend)?;
        self.by_owner.insert(owner_key(job), job.id.as_bytes()).map_err(backend)?;
        self.index.submitted(job.seq)?;
        self.index.new_job(job)?;
        self.jobs.put(job.id.as_bytes(), job_bytes)?;
        self.finished_changed(job);
        Ok(())
    }

    /// Claims `claim.key` unless a live claim holds it; returns the bytes
    /// written.
    fn take_claim(&self, claim: &IdempotencyClaim) -> Result<Vec<u8>, StoreError> {
        let bytes = encode(claim)?;
        // Its expiry entry first (a claim that survives a crash has it).
        self.index.new_claim(claim)?;
        loop {
            let current = self.claims.get(claim.key.as_bytes()).map_err(backend)?;
            if let Some(existing) = &current {
                let existing = serde_json::from_slice::<IdempotencyClaim>(existing).ok();
                if existing.as_ref().is_none_or(|c| c.expires_at > claim.claimed_at) {
                    // The entry goes unless it is the holder's own too.
                    if existing.is_some_and(|c| c.expires_at != claim.expires_at) {
                        self.index.drop_claim(claim)?;
                    }
                    return Err(StoreError::KeyClaimed);
                }
            }
            // Another submission may have changed the key since the read.
            if self.claims.compare_and_swap(claim.key.as_bytes(), current, Some(bytes.as_slice())).map_err(backend)?.is_ok() {
                return Ok(bytes);
            }
        }
    }
}

impl Sled {
    /// Without a sled transaction: sled seals and writes its log buffer
    /// twice for every multi-tree transaction (through its I/O pool, which
    /// wakes all its threads), and the commit log already makes the
    /// submission atomic after a crash. The claim is taken first with a
    /// compare-and-swap (two submissions with one key cannot both win); the
    /// job record is written last, so — sled keeping a prefix of its writes —
    /// a job that survives a crash has its workflow and index entries,
    /// and one that does not is re-applied whole from the log (replay applies
    /// a submission when the job is missing).
    fn submit(&self, job: &JobRecord, workflow: &serde_json::Value, claim: Option<&IdempotencyClaim>) -> Result<(), StoreError> {
        let job_bytes = encode(job)?;
        let wf_bytes = encode(workflow)?;
        let claimed = match claim {
            Some(claim) => Some(self.take_claim(claim)?),
            None => None,
        };
        if let Err(e) = self.write_submission(job, &job_bytes, &wf_bytes) {
            // Undo what can be undone, so the key is free again.
            let _ = self.jobs.remove(job.id.as_bytes());
            self.finished_changed(job);
            let _ = self.by_time.remove(time_key(job));
            let _ = self.by_owner.remove(owner_key(job));
            let _ = self.workflows.remove(job.id.as_bytes());
            let _ = self.index.forget_job(job);
            if let (Some(claim), Some(bytes)) = (claim, claimed) {
                let _ = self.claims.compare_and_swap(claim.key.as_bytes(), Some(bytes), None::<&[u8]>);
                let _ = self.index.drop_claim(claim);
            }
            return Err(e);
        }
        // Logged before anything can start the job, so its start and finish
        // follow it in the log; synced by `sync_jobs`. The writes above are
        // done either way: a failure here leaves the outcome unknown.
        let logged = entry("submitted", &[("job", &job_bytes), ("workflow", &wf_bytes), ("claim", claimed.as_deref().unwrap_or(b"null"))]);
        self.append(&logged, false).map_err(|e| StoreError::NotDurable(e.to_string()))
    }

    fn put_job(&self, job: &JobRecord) -> Result<(), StoreError> {
        self.index.before_job(job)?;
        self.jobs.put(job.id.as_bytes(), &encode(job)?)?;
        self.finished_changed(job);
        self.index.after_job(job)
    }

    /// Counts a write or deletion of `job` when it is finished (see
    /// `finished_changes`), after the write.
    fn finished_changed(&self, job: &JobRecord) {
        if job.status.is_terminal() {
            *self.finished_changes.lock().entry(job.owner.as_str().into()).or_default() += 1;
        }
    }

    fn finished_changes(&self, owner: &str) -> u64 {
        self.finished_changes.lock().get(owner).copied().unwrap_or(0)
    }

    fn get_job(&self, id: &str) -> Result<Option<JobRecord>, StoreError> {
        self.jobs.get(id.as_bytes())?.map(|b| decode(id.as_bytes(), &b)).transpose()
    }

    fn delete_job(&self, job: &JobRecord) -> Result<(), StoreError> {
        self.jobs.remove(job.id.as_bytes())?;
        self.finished_changed(job);
        self.workflows.remove(job.id.as_bytes())?;
        self.by_time.remove(time_key(job)).map_err(backend)?;
        self.by_owner.remove(owner_key(job)).map_err(backend)?;
        self.index.forget_job(job)
    }

    fn get_workflow(&self, id: &str) -> Result<Option<serde_json::Value>, StoreError> {
        self.workflows.get(id.as_bytes())?.map(|b| decode(id.as_bytes(), &b)).transpose()
    }

    fn get_workflow_bytes(&self, id: &str) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.workflows.get(id.as_bytes())?.map(|b| b.to_vec()))
    }

    fn list_jobs(&self, owner: Option<&str>, cursor: Option<&[u8]>, limit: usize, max_scanned: usize, keep: &JobFilter<'_>) -> Result<JobPage, StoreError> {
        // One owner's jobs are a range of the owner index (its keys end
        // with the time key, which is the cursor either way).
        let (tree, prefix) = match owner {
            Some(owner) => (&self.by_owner, owner_prefix(owner)),
            None => (&self.by_time, Vec::new()),
        };
        let iter = match cursor {
            Some(c) => tree.range(prefix.clone()..[prefix.as_slice(), c].concat()),
            None => tree.scan_prefix(&prefix),
        };
        let mut jobs = Vec::new();
        let mut next = None;
        let mut scanned = 0;
        for item in iter.rev() {
            let (_, id) = item.map_err(backend)?;
            let Some(mut job) = self.get_job(&String::from_utf8_lossy(&id))? else { continue };
            let at = time_key(&job);
            if owner.is_none_or(|o| o == job.owner) && keep(&job) {
                if jobs.len() == limit {
                    next = Some(time_key(&jobs[limit - 1]));
                    break;
                }
                // Listings never show logs (up to `job_log_kb` each): dropped
                // as each record is read.
                job.logs = None;
                jobs.push(job);
            }
            scanned += 1;
            if scanned >= max_scanned {
                // The budget is spent: the next page goes on after this one.
                next = Some(at);
                break;
            }
        }
        Ok(JobPage { jobs, next })
    }

    /// Every job (the tests' view of the queue).
    #[cfg(test)]
    fn all_jobs(&self) -> Result<Vec<JobRecord>, StoreError> {
        self.jobs
            .iter()
            .map(|item| {
                let (k, v) = item?;
                decode(&k, &v)
            })
            .collect()
    }

    /// The records of `ids` that `keep` accepts (an index entry may be
    /// stale: the record says).
    fn jobs_of(&self, ids: Vec<String>, keep: impl Fn(&JobRecord) -> bool) -> Result<Vec<JobRecord>, StoreError> {
        let mut out = Vec::new();
        for id in ids {
            out.extend(self.get_job(&id)?.filter(&keep));
        }
        Ok(out)
    }

    /// The asset records of `ids` that `keep` accepts.
    fn assets_of(&self, ids: Vec<String>, keep: impl Fn(&AssetRecord) -> bool) -> Result<Vec<AssetRecord>, StoreError> {
        let mut out = Vec::new();
        for id in ids {
            out.extend(self.get_asset(&id)?.filter(&keep));
        }
        Ok(out)
    }

    fn unfinished_jobs(&self) -> Result<Vec<JobRecord>, StoreError> {
        self.jobs_of(self.index.unfinished(), |j| matches!(j.status, JobStatus::Queued | JobStatus::Running | JobStatus::Canceling))
    }

    /// Entries that name no record, or a record filed elsewhere, are
    /// removed as they are met once [`STALE_AFTER`] old (a crash left them;
    /// a record's new entries are written just before it, so one that old
    /// without its record is stale), so the batch is not spent on them at
    /// every sweep.
    fn jobs_due(&self, now: Micros, purge_before: Micros, limit: usize) -> Result<Vec<JobRecord>, StoreError> {
        let due = |j: &JobRecord| if j.status == JobStatus::Expired { j.expires_at <= purge_before } else { j.expires_at <= now };
        let mut out = Vec::new();
        for entry in self.index.jobs_due(now, purge_before, limit)? {
            let job = self.get_job(&entry.id)?;
            if entry.matches_job(job.as_ref()) {
                out.extend(job.filter(due));
            } else if entry.at < now.saturating_sub(STALE_AFTER) {
                self.index.drop_stale(&entry)?;
                if entry.matches_job(self.get_job(&entry.id)?.as_ref()) {
                    self.index.restore(&entry)?;
                }
            }
        }
        Ok(out)
    }

    /// Logged without a sync: the frame is in the kernel's page cache once
    /// written, which a crash of this process does not lose, so a job that
    /// brings the server down is counted. A power loss can lose it (and the
    /// job runs again, one attempt short).
    fn record_start(&self, job: &JobRecord) -> Result<(), StoreError> {
        self.append(&entry("started", &[("job", &encode(job)?)]), false)
    }

    fn sync_jobs(&self) -> Result<(), StoreError> {
        self.log.sync()
    }

    fn writes_may_block(&self) -> bool {
        self.log.may_block()
    }

    /// The record into sled (unflushed), then one synced log frame with the
    /// same bytes and the output assets.
    fn finish_job(&self, job: &JobRecord, assets: &[AssetRecord]) -> Result<(), StoreError> {
        let job_bytes = encode(job)?;
        self.index.before_job(job)?;
        self.jobs.put(job.id.as_bytes(), &job_bytes)?;
        self.finished_changed(job);
        self.index.after_job(job)?;
        self.append(&entry("finished", &[("job", &job_bytes), ("assets", &encode(&assets)?)]), true)
    }

    fn checkpoint(&self) -> Result<(), StoreError> {
        self.log.checkpoint(|| self.checkpoint_flush())
    }

    fn put_asset(&self, asset: &AssetRecord) -> Result<(), StoreError> {
        self.hashes.insert(hash_key(&asset.hash, &asset.id), &[][..]).map_err(backend)?;
        self.index.before_asset(asset)?;
        let old = self.assets.insert(asset.id.as_bytes(), &encode(asset)?)?;
        match old.map(|b| decode::<AssetRecord>(asset.id.as_bytes(), &b)) {
            Some(Ok(old)) => {
                self.index.after_asset(&old, asset)?;
                // A concurrent write of the same asset may have removed an
                // entry the record now stored needs: put them back.
                match self.get_asset(&asset.id)? {
                    Some(current) => self.index.before_asset(&current),
                    None => Ok(()),
                }
            }
            _ => Ok(()),
        }
    }

    /// [`MetaStore::update_asset`]: [`Sled::change_asset`] to `asset`.
    fn update_asset(&self, asset: &AssetRecord) -> Result<bool, StoreError> {
        Ok(self.change_asset(&asset.id, &|_| Some(asset.clone()))?.is_some())
    }

    /// [`MetaStore::change_asset`]: the record swapped only for the one
    /// read (a deletion or another write meanwhile: read again).
    fn change_asset(&self, id: &str, change: &(dyn Fn(&AssetRecord) -> Option<AssetRecord> + Send + Sync)) -> Result<Option<AssetRecord>, StoreError> {
        let key = id.as_bytes();
        loop {
            let Some((current, value)) = self.assets.get_stored(key)? else { return Ok(None) };
            let old: AssetRecord = decode(key, &value)?;
            let Some(asset) = change(&old) else { return Ok(Some(old)) };
            let new = encode(&asset)?;
            self.hashes.insert(hash_key(&asset.hash, &asset.id), &[][..]).map_err(backend)?;
            self.index.before_asset(&asset)?;
            match self.assets.compare_and_swap(key, Some(current), Some(&new))? {
                true => {
                    self.index.after_asset(&old, &asset)?;
                    // A concurrent write of the same asset may have removed
                    // an entry the record now stored needs: put them back.
                    if let Some(current) = self.get_asset(id)? {
                        self.index.before_asset(&current)?;
                    }
                    return Ok(Some(asset));
                }
                false if self.assets.get(key)?.is_none() => {
                    // Deleted meanwhile: the entries made for it go too.
                    self.hashes.remove(hash_key(&asset.hash, &asset.id)).map_err(backend)?;
                    self.index.forget_asset(&asset)?;
                    return Ok(None);
                }
                false => {}
            }
        }
    }

    fn get_asset(&self, id: &str) -> Result<Option<AssetRecord>, StoreError> {
        self.assets.get(id.as_bytes())?.map(|b| decode(id.as_bytes(), &b)).transpose()
    }

    fn delete_asset(&self, asset: &AssetRecord) -> Result<(), StoreError> {
        self.assets.remove(asset.id.as_bytes())?;
        self.hashes.remove(hash_key(&asset.hash, &asset.id)).map_err(backend)?;
        self.index.forget_asset(asset)
    }

    /// [`MetaStore::delete_expired_upload`]: removed by a swap from the
    /// record read, so a write since (a longer expiry) wins.
    fn delete_expired_upload(&self, asset: &AssetRecord, now: Micros) -> Result<Option<AssetRecord>, StoreError> {
        let id = asset.id.as_bytes();
        loop {
            let Some((current, value)) = self.assets.get_stored(id)? else { return Ok(None) };
            let stored: AssetRecord = decode(id, &value)?;
            if stored.job_id.is_some() || stored.expires_at.is_none_or(|at| at > now) {
                return Ok(None);
            }
            if self.assets.compare_and_swap(id, Some(current), None)? {
                self.hashes.remove(hash_key(&stored.hash, &stored.id)).map_err(backend)?;
                self.index.forget_asset(&stored)?;
                return Ok(Some(stored));
            }
        }
    }

    fn assets_with_hash(&self, hash: &str) -> Result<Vec<AssetRecord>, StoreError> {
        let mut prefix = hash.as_bytes().to_vec();
        prefix.push(0);
        let mut out = Vec::new();
        for item in self.hashes.scan_prefix(&prefix) {
            let (key, _) = item.map_err(backend)?;
            let id = String::from_utf8_lossy(&key[prefix.len()..]).into_owned();
            if let Some(asset) = self.get_asset(&id)? {
                out.push(asset);
            }
        }
        Ok(out)
    }

    fn assets_of_job(&self, job_id: &str) -> Result<Vec<AssetRecord>, StoreError> {
        self.assets_of(self.index.assets_of_job(job_id)?, |a| a.job_id.as_deref() == Some(job_id))
    }

    /// Stale entries are removed as in [`Sled::jobs_due`].
    fn uploads_due(&self, now: Micros, limit: usize) -> Result<Vec<AssetRecord>, StoreError> {
        let mut out = Vec::new();
        for entry in self.index.uploads_due(now, limit)? {
            let asset = self.get_asset(&entry.id)?;
            if entry.matches_upload(asset.as_ref()) {
                out.extend(asset);
            } else if entry.at < now.saturating_sub(STALE_AFTER) {
                self.index.drop_stale(&entry)?;
                if entry.matches_upload(self.get_asset(&entry.id)?.as_ref()) {
                    self.index.restore(&entry)?;
                }
            }
        }
        Ok(out)
    }

    fn assets_tagged(&self, prefix: &str) -> Result<Vec<AssetRecord>, StoreError> {
        self.assets_of(self.index.tagged(prefix)?, |a| a.tags.iter().any(|t| t.starts_with(prefix)))
    }

    fn get_claim(&self, key: &str) -> Result<Option<IdempotencyClaim>, StoreError> {
        self.claims.get(key.as_bytes()).map_err(backend)?.map(|b| decode(key.as_bytes(), &b)).transpose()
    }

    /// Reads the expired claims only (through `claims_expiring`). A claim
    /// taken again since its entry was written has an entry of its own and
    /// is left; one whose bytes changed under the purge is left too (the
    /// compare-and-swap refuses).
    /// A stretch of the record pieces no record names, collected.
    fn tidy(&self) -> Result<usize, StoreError> {
        const PIECES_PER_PASS: usize = 10_000;
        let removed = self.pieces.pass(&[&self.jobs, &self.workflows, &self.assets, &self.accounts, self.index.saved()], PIECES_PER_PASS)?;
        if removed > 0 {
            tracing::info!(pieces = removed, "collected record pieces no record names");
        }
        Ok(removed)
    }

    fn purge_claims(&self, now: Micros) -> Result<usize, StoreError> {
        let mut purged = 0;
        for entry in self.index.claims_due(now)? {
            if let Some(bytes) = self.claims.get(entry.id.as_bytes()).map_err(backend)? {
                let expired_here = serde_json::from_slice::<IdempotencyClaim>(&bytes).map_or(true, |c| c.expires_at == entry.at);
                if expired_here && self.claims.compare_and_swap(entry.id.as_bytes(), Some(bytes), None::<&[u8]>).map_err(backend)?.is_ok() {
                    purged += 1;
                }
            }
            self.index.drop_stale(&entry)?;
        }
        Ok(purged)
    }

    fn flush(&self) -> Result<(), StoreError> {
        self.durable.flush()
    }

    /// Writes the readiness marker (`store_info`'s `ready_probe`: the time)
    /// and flushes it.
    fn check_writable(&self) -> Result<(), StoreError> {
        self.index.info.insert(b"ready_probe", &crate::store::now_micros().to_be_bytes()).map_err(backend)?;
        self.flush()
    }
}

#[cfg(test)]
mod tests;
