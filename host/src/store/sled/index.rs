//! The sled store's secondary indexes for the periodic work (recovery, the
//! retention sweep, the upload index), so none of it reads every record:
//!
//! - `jobs_expiring` (expires_at ‖ id → id): jobs not yet expired;
//! - `jobs_expired` (expires_at ‖ id → id): expired jobs, until purged;
//! - `assets_by_job` (job id ‖ 0 ‖ asset id → empty): a job's outputs;
//! - `uploads_expiring` (expires_at ‖ asset id → id): uploads (assets of
//!   no job) with an expiry;
//! - `assets_by_tag` (tag ‖ 0 ‖ asset id → empty);
//! - `claims_expiring` (expires_at ‖ Idempotency-Key → key): claims, so
//!   the purge reads the expired ones only.
//!
//! Times are big-endian microseconds (records' times are positive), so a
//! range up to a time is a prefix of the tree. A record's new entries are
//! written before it and its stale ones removed after it (a job's expiry
//! never changes; an asset's expiry and tags may), so after a crash an
//! entry may be stale, never missing: readers check each record they
//! read through an index. `info` keeps a bound on the queue `seq`s
//! submitted and the indexes' version: a store written before them is
//! indexed once when it opens.
//!
//! The jobs queued, running or canceling are a set in memory, not a tree
//! (a tree would cost two more writes on every job's path): `info` holds
//! it as of the last checkpoint, and every submission and finish since is
//! in the commit log, which the store replays when it opens. An entry is
//! removed from the set only after its record's write, so a checkpoint's
//! snapshot that lacks a job is followed by a flush that has its record.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use sled::Tree;

use super::chunked::Chunked;

use super::{backend, decode};
use crate::store::{AssetRecord, IdempotencyClaim, JobRecord, JobStatus, Micros, StoreError};

/// The version of the indexes a store holds (`info`'s `indexes` key): 1
/// without `claims_expiring`.
const VERSION: u8 = 2;

pub(super) struct Indexes {
    unfinished: Mutex<HashSet<String>>,
    pub(super) expiring: Tree,
    expired: Tree,
    by_job: Tree,
    pub(super) uploads_expiring: Tree,
    by_tag: Tree,
    pub(super) claims_expiring: Tree,
    pub(super) info: Tree,
    /// `store_info` again, for the saved unfinished set: one value that
    /// grows with the queue, so stored in pieces.
    saved: Chunked,
    /// The sequence bound `info` holds (see [`Indexes::submitted`]).
    reserved: AtomicU64,
}

/// Queue sequences reserved by one write of the bound.
const SEQ_BLOCK: u64 = 1024;

fn is_unfinished(job: &JobRecord) -> bool {
    matches!(job.status, JobStatus::Queued | JobStatus::Running | JobStatus::Canceling)
}

fn time_id(at: Micros, id: &str) -> Vec<u8> {
    let mut k = at.to_be_bytes().to_vec();
    k.extend_from_slice(id.as_bytes());
    k
}

fn pair(first: &str, id: &str) -> Vec<u8> {
    let mut k = first.as_bytes().to_vec();
    k.push(0);
    k.extend_from_slice(id.as_bytes());
    k
}

/// Which time index an entry is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TimeIndex {
    JobsExpiring,
    JobsExpired,
    UploadsExpiring,
    ClaimsExpiring,
}

/// An entry of a time index: the record's id and the time it is filed at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct TimeEntry {
    pub index: TimeIndex,
    pub at: Micros,
    pub id: String,
}

impl TimeEntry {
    /// Whether the stored job `job` (`None`: none) files this entry. One it
    /// does not is stale (a crash between a record's write and the removal
    /// of its old entry, or between a record's deletion and its entries').
    pub fn matches_job(&self, job: Option<&JobRecord>) -> bool {
        let expected = |j: &JobRecord| if j.status == JobStatus::Expired { TimeIndex::JobsExpired } else { TimeIndex::JobsExpiring };
        job.is_some_and(|j| j.expires_at == self.at && expected(j) == self.index)
    }

    /// Whether the stored asset `asset` (`None`: none) files this entry.
    pub fn matches_upload(&self, asset: Option<&AssetRecord>) -> bool {
        asset.is_some_and(|a| a.job_id.is_none() && a.expires_at == Some(self.at))
    }
}

/// The entries in `tree` whose key starts with a time at or before `until`,
/// oldest first, at most `limit`.
fn entries_until(tree: &Tree, index: TimeIndex, until: Micros, limit: usize) -> Result<Vec<TimeEntry>, StoreError> {
    let end = until.saturating_add(1).to_be_bytes();
    let mut entries = Vec::new();
    for item in tree.range(..end.as_slice()).take(limit) {
        let (key, id) = item.map_err(backend)?;
        let at = key.get(..8).and_then(|b| <[u8; 8]>::try_from(b).ok()).map_or(0, Micros::from_be_bytes);
        entries.push(TimeEntry { index, at, id: String::from_utf8_lossy(&id).into_owned() });
    }
    Ok(entries)
}

/// The ids after `prefix ‖ 0` in the keys of `tree` that start with it.
fn ids_under(tree: &Tree, prefix: &str) -> Result<Vec<String>, StoreError> {
    let mut start = prefix.as_bytes().to_vec();
    start.push(0);
    let mut ids = Vec::new();
    for item in tree.scan_prefix(&start) {
        let (key, _) = item.map_err(backend)?;
        ids.push(String::from_utf8_lossy(&key[start.len()..]).into_owned());
    }
    Ok(ids)
}

impl Indexes {
    pub(super) fn open(db: &sled::Db) -> Result<Indexes, StoreError> {
        let tree = |name: &str| db.open_tree(name).map_err(backend);
        Ok(Indexes {
            unfinished: Mutex::new(HashSet::new()),
            expiring: tree("jobs_expiring")?,
            expired: tree("jobs_expired")?,
            by_job: tree("assets_by_job")?,
            uploads_expiring: tree("uploads_expiring")?,
            by_tag: tree("assets_by_tag")?,
            claims_expiring: tree("claims_expiring")?,
            info: tree("store_info")?,
            saved: Chunked::open(db, "store_info", 5)?,
            reserved: AtomicU64::new(0),
        })
    }

    /// Indexes every record of a store written before these indexes, or
    /// before their latest version (once; then the version is recorded).
    pub(super) fn build_once(&self, jobs: &Chunked, assets: &Chunked, claims: &Tree) -> Result<(), StoreError> {
        let version = self.info.get(b"indexes").map_err(backend)?.and_then(|v| v.first().copied()).unwrap_or(0);
        if version == 0 {
            self.build_records(jobs, assets)?;
        } else if let Some(bytes) = self.saved.get(b"unfinished")? {
            let ids: Vec<String> = decode(b"unfinished", &bytes)?;
            self.unfinished.lock().extend(ids);
        }
        if version < 2 {
            for item in claims.iter() {
                let (k, v) = item.map_err(backend)?;
                match decode::<IdempotencyClaim>(&k, &v) {
                    Ok(claim) => self.new_claim(&claim)?,
                    // Unreadable: due at once, so the purge drops it (as the
                    // scan that the index replaced did).
                    Err(_) => drop(self.claims_expiring.insert(time_id(0, &String::from_utf8_lossy(&k)), k.as_ref()).map_err(backend)?),
                }
            }
        }
        if version != VERSION {
            self.info.insert(b"indexes", &[VERSION]).map_err(backend)?;
        }
        Ok(())
    }

    /// The job and asset entries of a store written before any index.
    fn build_records(&self, jobs: &Chunked, assets: &Chunked) -> Result<(), StoreError> {
        let (mut job_count, mut asset_count) = (0, 0);
        for item in jobs.iter() {
            let (k, v) = item?;
            let Ok(job) = decode::<JobRecord>(&k, &v) else { continue };
            self.new_job(&job)?;
            self.submitted(job.seq)?;
            job_count += 1;
        }
        for item in assets.iter() {
            let (k, v) = item?;
            let Ok(asset) = decode::<AssetRecord>(&k, &v) else { continue };
            self.before_asset(&asset)?;
            asset_count += 1;
        }
        self.save_unfinished()?;
        if job_count + asset_count > 0 {
            tracing::info!(jobs = job_count, assets = asset_count, "indexed the store's records for recovery and retention");
        }
        Ok(())
    }

    /// Entries a new job record needs (written before it: sled keeps a
    /// prefix of its writes, so a record that survives a crash has them).
    /// Its later writes change them only when it finishes or expires (no
    /// status leads back to unfinished, and its expiry never changes), so
    /// a job's path costs three index writes in all.
    pub(super) fn new_job(&self, job: &JobRecord) -> Result<(), StoreError> {
        if is_unfinished(job) {
            self.unfinished.lock().insert(job.id.clone());
        }
        let tree = if job.status == JobStatus::Expired { &self.expired } else { &self.expiring };
        tree.insert(time_id(job.expires_at, &job.id), job.id.as_bytes()).map_err(backend)?;
        Ok(())
    }

    /// Entries a job record about to be written over its earlier version
    /// gains (before it): an expired job's.
    pub(super) fn before_job(&self, job: &JobRecord) -> Result<(), StoreError> {
        if job.status == JobStatus::Expired {
            self.expired.insert(time_id(job.expires_at, &job.id), job.id.as_bytes()).map_err(backend)?;
        }
        Ok(())
    }

    /// Entries a job record just written no longer has (removed after it: a
    /// stale entry left by a crash only costs its reader a record read).
    pub(super) fn after_job(&self, job: &JobRecord) -> Result<(), StoreError> {
        if job.status.is_terminal() {
            self.unfinished.lock().remove(&job.id);
        }
        if job.status == JobStatus::Expired {
            self.expiring.remove(time_id(job.expires_at, &job.id)).map_err(backend)?;
        }
        Ok(())
    }

    /// A job record was deleted.
    pub(super) fn forget_job(&self, job: &JobRecord) -> Result<(), StoreError> {
        self.unfinished.lock().remove(&job.id);
        let key = time_id(job.expires_at, &job.id);
        self.expiring.remove(&key).map_err(backend)?;
        self.expired.remove(&key).map_err(backend)?;
        Ok(())
    }

    /// A job with queue sequence `seq` was submitted.
    /// Written only when `seq` reaches the end of the block reserved so
    /// far: the store records a bound on the sequence numbers in use, one
    /// write per [`SEQ_BLOCK`] submissions (a restart skips the rest of the
    /// block, as a database sequence's cache does).
    pub(super) fn submitted(&self, seq: u64) -> Result<(), StoreError> {
        if seq < self.reserved.load(Ordering::Acquire) {
            return Ok(());
        }
        let mut reserved = 0;
        self.info
            .fetch_and_update(b"max_seq", |old| {
                let old = old.and_then(|b| <[u8; 8]>::try_from(b).ok()).map_or(0, u64::from_be_bytes);
                reserved = old.max(seq.saturating_add(SEQ_BLOCK));
                Some(reserved.to_be_bytes().to_vec())
            })
            .map_err(backend)?;
        self.reserved.fetch_max(reserved, Ordering::AcqRel);
        Ok(())
    }

    /// A bound on the queue sequences submitted so far (new jobs follow it).
    pub(super) fn max_seq(&self) -> Result<u64, StoreError> {
        Ok(self.info.get(b"max_seq").map_err(backend)?.and_then(|b| <[u8; 8]>::try_from(b.as_ref()).ok()).map_or(0, u64::from_be_bytes))
    }

    /// Entries an asset record about to be written needs (before it).
    pub(super) fn before_asset(&self, asset: &AssetRecord) -> Result<(), StoreError> {
        if let Some(job) = &asset.job_id {
            self.by_job.insert(pair(job, &asset.id), &[][..]).map_err(backend)?;
        } else if let Some(at) = asset.expires_at {
            self.uploads_expiring.insert(time_id(at, &asset.id), asset.id.as_bytes()).map_err(backend)?;
        }
        for tag in &asset.tags {
            self.by_tag.insert(pair(tag, &asset.id), &[][..]).map_err(backend)?;
        }
        Ok(())
    }

    /// Entries of `old` that the asset just written over it no longer has
    /// (after it).
    pub(super) fn after_asset(&self, old: &AssetRecord, asset: &AssetRecord) -> Result<(), StoreError> {
        if old.expires_at != asset.expires_at
            && let Some(at) = old.expires_at
        {
            self.uploads_expiring.remove(time_id(at, &old.id)).map_err(backend)?;
        }
        for tag in old.tags.iter().filter(|t| !asset.tags.contains(t)) {
            self.by_tag.remove(pair(tag, &old.id)).map_err(backend)?;
        }
        Ok(())
    }

    /// An asset record was deleted.
    pub(super) fn forget_asset(&self, asset: &AssetRecord) -> Result<(), StoreError> {
        if let Some(job) = &asset.job_id {
            self.by_job.remove(pair(job, &asset.id)).map_err(backend)?;
        }
        if let Some(at) = asset.expires_at {
            self.uploads_expiring.remove(time_id(at, &asset.id)).map_err(backend)?;
        }
        for tag in &asset.tags {
            self.by_tag.remove(pair(tag, &asset.id)).map_err(backend)?;
        }
        Ok(())
    }

    /// Ids of the jobs queued, running or canceling.
    pub(super) fn unfinished(&self) -> Vec<String> {
        self.unfinished.lock().iter().cloned().collect()
    }

    /// Puts a job's entry in the unfinished set as its stored record says
    /// (replay: the record may be newer than the saved set).
    pub(super) fn settle(&self, job: &JobRecord) {
        let mut set = self.unfinished.lock();
        if is_unfinished(job) {
            set.insert(job.id.clone());
        } else {
            set.remove(&job.id);
        }
    }

    /// A logged job that has no record (deleted since).
    pub(super) fn settle_gone(&self, id: &str) {
        self.unfinished.lock().remove(id);
    }

    /// Writes the unfinished set into `info` (before a checkpoint's flush),
    /// with the time it was taken.
    pub(super) fn save_unfinished(&self) -> Result<(), StoreError> {
        let at = crate::store::now_micros();
        let ids = self.unfinished();
        let bytes = serde_json::to_vec(&ids).map_err(|e| StoreError::Backend(e.to_string()))?;
        self.info.insert(b"unfinished_at", &at.to_be_bytes()).map_err(backend)?;
        self.saved.put(b"unfinished", &bytes)?;
        Ok(())
    }

    /// The tree the unfinished set is saved in.
    pub(super) fn saved(&self) -> &Chunked {
        &self.saved
    }

    /// When the saved unfinished set was taken, if it was.
    pub(super) fn saved_at(&self) -> Result<Option<Micros>, StoreError> {
        Ok(self.info.get(b"unfinished_at").map_err(backend)?.and_then(|b| <[u8; 8]>::try_from(b.as_ref()).ok()).map(Micros::from_be_bytes))
    }

    /// Indexes a job again from its stored record (a job created about
    /// when, or after, the set was saved: its submission may have reached
    /// sled and missed both the saved set and the commit log, or it was
    /// written by an older version of kiln).
    pub(super) fn reindex(&self, job: &JobRecord) -> Result<(), StoreError> {
        self.settle(job);
        let key = time_id(job.expires_at, &job.id);
        if job.status == JobStatus::Expired {
            self.expired.insert(&key, job.id.as_bytes()).map_err(backend)?;
            self.expiring.remove(&key).map_err(backend)?;
        } else {
            self.expiring.insert(&key, job.id.as_bytes()).map_err(backend)?;
        }
        Ok(())
    }

    /// Ids of jobs due for the sweeper at `now`: not expired with
    /// `expires_at` ≤ `now`, and expired with `expires_at` ≤ `purge_before`;
    /// at most `limit` of each, oldest first.
    pub(super) fn jobs_due(&self, now: Micros, purge_before: Micros, limit: usize) -> Result<Vec<TimeEntry>, StoreError> {
        let mut entries = entries_until(&self.expiring, TimeIndex::JobsExpiring, now, limit)?;
        entries.extend(entries_until(&self.expired, TimeIndex::JobsExpired, purge_before, limit)?);
        Ok(entries)
    }

    /// Entries of the uploads whose expiry is at or before `now` (at most `limit`).
    pub(super) fn uploads_due(&self, now: Micros, limit: usize) -> Result<Vec<TimeEntry>, StoreError> {
        entries_until(&self.uploads_expiring, TimeIndex::UploadsExpiring, now, limit)
    }

    /// The entry a claim about to be written needs (before it).
    pub(super) fn new_claim(&self, claim: &IdempotencyClaim) -> Result<(), StoreError> {
        self.claims_expiring.insert(time_id(claim.expires_at, &claim.key), claim.key.as_bytes()).map_err(backend)?;
        Ok(())
    }

    /// Takes back the entry of a claim that was not written.
    pub(super) fn drop_claim(&self, claim: &IdempotencyClaim) -> Result<(), StoreError> {
        self.claims_expiring.remove(time_id(claim.expires_at, &claim.key)).map_err(backend)?;
        Ok(())
    }

    /// Entries of the claims whose expiry is at or before `now`.
    pub(super) fn claims_due(&self, now: Micros) -> Result<Vec<TimeEntry>, StoreError> {
        entries_until(&self.claims_expiring, TimeIndex::ClaimsExpiring, now, usize::MAX)
    }

    fn tree(&self, index: TimeIndex) -> &Tree {
        match index {
            TimeIndex::JobsExpiring => &self.expiring,
            TimeIndex::JobsExpired => &self.expired,
            TimeIndex::UploadsExpiring => &self.uploads_expiring,
            TimeIndex::ClaimsExpiring => &self.claims_expiring,
        }
    }

    /// Removes an entry: stale (see [`TimeEntry::matches_job`]), or its
    /// record is gone.
    pub(super) fn drop_stale(&self, entry: &TimeEntry) -> Result<(), StoreError> {
        self.tree(entry.index).remove(time_id(entry.at, &entry.id)).map_err(backend)?;
        Ok(())
    }

    /// Puts back an entry removed as stale whose record, read again, files
    /// it after all (its writer put the entry, then the record, between the
    /// first read and the removal).
    pub(super) fn restore(&self, entry: &TimeEntry) -> Result<(), StoreError> {
        self.tree(entry.index).insert(time_id(entry.at, &entry.id), entry.id.as_bytes()).map_err(backend)?;
        Ok(())
    }

    /// Ids of a job's output assets.
    pub(super) fn assets_of_job(&self, job_id: &str) -> Result<Vec<String>, StoreError> {
        ids_under(&self.by_job, job_id)
    }

    /// Ids of the assets carrying a tag that starts with `prefix` (an id
    /// follows the key's last 0 byte: ids hold none, tags may).
    pub(super) fn tagged(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        let mut ids = Vec::new();
        for item in self.by_tag.scan_prefix(prefix.as_bytes()) {
            let (key, _) = item.map_err(backend)?;
            if let Some(at) = key.iter().rposition(|b| *b == 0) {
                ids.push(String::from_utf8_lossy(&key[at + 1..]).into_owned());
            }
        }
        ids.sort_unstable();
        ids.dedup();
        Ok(ids)
    }
}
