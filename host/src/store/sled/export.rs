//! Everything the embedded store holds, read out in key order a page at a
//! time, for `kiln migrate` (see `crate::migrate`): jobs with their
//! workflows, assets and idempotency claims. Nothing here writes. A page
//! holds at most its count of records and about [`PAGE_BYTES`] (one
//! record at least, however large).

use std::ops::Bound;

use super::{SledMeta, backend, decode};
use crate::store::{AssetRecord, IdempotencyClaim, JobRecord, StoreError};

/// The bytes of records (and workflows) one page holds, about.
pub const PAGE_BYTES: usize = 32 << 20;

/// A job as stored, with its workflow's bytes (JSON) when kept.
pub struct ExportedJob {
    pub job: JobRecord,
    pub workflow: Option<Vec<u8>>,
}

impl SledMeta {
    /// Up to `limit` jobs whose ids follow `after` (`""`: from the first).
    pub fn export_jobs(&self, after: &str, limit: usize) -> Result<Vec<ExportedJob>, StoreError> {
        let sled = &self.0;
        let mut jobs = Vec::new();
        let mut bytes_held = 0;
        for (key, bytes) in page(sled.jobs.range_after(start(after)), limit)? {
            if !jobs.is_empty() && bytes_held >= PAGE_BYTES {
                break;
            }
            let job: JobRecord = decode(&key, &bytes)?;
            let workflow = sled.workflows.get(&key)?.map(|w| w.to_vec());
            bytes_held += bytes.len() + workflow.as_ref().map_or(0, Vec::len);
            jobs.push(ExportedJob { job, workflow });
        }
        Ok(jobs)
    }

    /// Up to `limit` assets whose ids follow `after`.
    pub fn export_assets(&self, after: &str, limit: usize) -> Result<Vec<AssetRecord>, StoreError> {
        page(self.0.assets.range_after(start(after)), limit)?.iter().map(|(key, bytes)| decode(key, bytes)).collect()
    }

    /// Up to `limit` idempotency claims whose keys follow `after`.
    pub fn export_claims(&self, after: &str, limit: usize) -> Result<Vec<IdempotencyClaim>, StoreError> {
        let claims = self.0.claims.range::<&[u8], _>((start(after), Bound::Unbounded)).map(|e| e.map_err(backend));
        page(claims, limit)?.iter().map(|(key, bytes)| decode(key, bytes)).collect()
    }
}

/// A key and its value.
type Entry = (Vec<u8>, Vec<u8>);

/// Where a page after key `after` starts (`""`: the first key).
fn start(after: &str) -> Bound<&[u8]> {
    if after.is_empty() { Bound::Unbounded } else { Bound::Excluded(after.as_bytes()) }
}

/// Up to `limit` of `entries` (a tree's, in key order), about
/// [`PAGE_BYTES`] at most.
fn page(entries_in: impl Iterator<Item = Result<(sled::IVec, sled::IVec), StoreError>>, limit: usize) -> Result<Vec<Entry>, StoreError> {
    let mut entries = Vec::new();
    let mut bytes_held = 0;
    for entry in entries_in.take(limit) {
        if !entries.is_empty() && bytes_held >= PAGE_BYTES {
            break;
        }
        let (k, v) = entry?;
        bytes_held += k.len() + v.len();
        entries.push((k.to_vec(), v.to_vec()));
    }
    Ok(entries)
}
