//! Blob collection: deleting blobs that no asset record and no live job
//! names. A blob may become garbage only when one is written (an upload,
//! a node's output: its record may never be made) or an asset record is
//! deleted; each such blob is noted as a candidate, and a pass checks the
//! candidates alone, keeping those still in use for the next pass. What a
//! crash left unnoted (a blob written, the process gone before its record)
//! is found by a full pass over every stored blob, at the first pass after
//! start and every [`FULL_PASS_INTERVAL`] after.
//!
//! The gate: held shared while a blob is written and claimed (recorded as
//! an asset, or listed among a live job's pending outputs), exclusively by
//! a pass while it checks and deletes one, so a pass never deletes a blob
//! between its write and its claim.
//!
//! Where hosts share the store, another host's writes are not behind this
//! gate: each host also holds, in the store, the blobs its jobs and uploads
//! need before any record names them (`MetaStore::hold_blobs`: a job's
//! inputs and outputs, an upload while it is recorded), and a pass locks
//! each blob there while it checks and deletes it (`MetaStore::lock_blob`).
//! A hold that lands after a pass deleted its blob is followed by its
//! writer's check that the blob is there (stored again if not).
//!
//! Also the store's size for `/metrics` (`kiln_blob_store_bytes`): one
//! walk of the store ([`BlobStore::usage`](crate::store::BlobStore::usage))
//! at the first sweep and then at most every [`USAGE_EVERY`], by the host
//! that sweeps.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock, RwLockReadGuard};

use super::{Service, ServiceError};
use crate::store::blob_name;

/// How often a pass lists every blob.
pub const FULL_PASS_INTERVAL: Duration = Duration::from_secs(24 * 3600);
/// How often the blob store's size is measured.
pub const USAGE_EVERY: Duration = Duration::from_secs(600);
/// Most candidates kept: past it they are dropped and the next pass is a
/// full one (passes that keep failing must not grow the set for ever).
const MAX_CANDIDATES: usize = 1 << 20;

/// The gate and the candidates.
#[derive(Default)]
pub struct BlobClaims {
    gate: RwLock<()>,
    candidates: Mutex<HashSet<blake3::Hash>>,
    /// When the last full pass ended (`None`: none since start, or one is
    /// due at once).
    last_full: Mutex<Option<Instant>>,
    /// The store's size at its last measurement, and when that was.
    usage: Mutex<Option<(crate::store::BlobUsage, Instant)>>,
}

/// What a pass checks.
enum Pass {
    /// Every stored blob.
    Full,
    Candidates(Vec<blake3::Hash>),
}

impl BlobClaims {
    /// Held while a blob is written and claimed.
    pub fn writing(&self) -> RwLockReadGuard<'_, ()> {
        self.gate.read()
    }

    /// `hash` may have lost its last claim (just written, or a record over
    /// it deleted): the next pass looks at it.
    pub fn may_be_garbage(&self, hash: blake3::Hash) {
        let mut candidates = self.candidates.lock();
        if candidates.len() >= MAX_CANDIDATES {
            candidates.clear();
            *self.last_full.lock() = None;
        }
        candidates.insert(hash);
    }

    /// What the next pass checks: every candidate, or every blob when a
    /// full pass is due (the candidates are then dropped: it sees them all).
    fn take(&self, now: Instant) -> Pass {
        let full = self.last_full.lock().is_none_or(|at| now.duration_since(at) >= FULL_PASS_INTERVAL);
        let candidates = std::mem::take(&mut *self.candidates.lock());
        if full { Pass::Full } else { Pass::Candidates(candidates.into_iter().collect()) }
    }

    /// A full pass ended at `now` (one that failed is due again at once).
    fn full_pass_done(&self, now: Instant) {
        *self.last_full.lock() = Some(now);
    }
}

impl Service {
    /// Measures the blob store's size if it was never measured or
    /// [`USAGE_EVERY`] has passed (a failure is logged: the figure is
    /// only reported, never acted on).
    pub(super) fn measure_blobs(&self) {
        let now = Instant::now();
        if self.blob_claims.usage.lock().is_some_and(|(_, at)| now.duration_since(at) < USAGE_EVERY) {
            return;
        }
        if let Err(e) = self.measure_blob_store() {
            tracing::warn!(error = %e, "cannot measure the blob store");
        }
    }

    /// Measures the blob store now (the sweep does so at most every
    /// [`USAGE_EVERY`]) and keeps the figure for `/metrics`. Blocking: one
    /// walk of the store.
    pub fn measure_blob_store(&self) -> Result<crate::store::BlobUsage, ServiceError> {
        let usage = self.blobs.usage()?;
        *self.blob_claims.usage.lock() = Some((usage, Instant::now()));
        Ok(usage)
    }

    /// The blob store's size at its last measurement, if any.
    pub fn blob_usage(&self) -> Option<crate::store::BlobUsage> {
        self.blob_claims.usage.lock().map(|(usage, _)| usage)
    }

    /// Deletes asset record `asset` (not flushed), takes it out of the
    /// compat upload index and notes its blob.
    pub(super) async fn delete_asset_record(&self, asset: &crate::store::AssetRecord) -> Result<(), ServiceError> {
        self.meta.delete_asset(asset).await?;
        self.forget_asset_record(asset);
        Ok(())
    }

    /// What follows the deletion of asset record `asset`: out of the
    /// compat upload index, its blob a candidate for collection.
    pub(super) fn forget_asset_record(&self, asset: &crate::store::AssetRecord) {
        self.forget_upload(asset);
        if let Some(hash) = crate::store::parse_blob_name(&asset.hash) {
            self.blob_claims.may_be_garbage(hash);
        }
    }

    /// One collection pass (synchronous: it holds the gate while it checks
    /// each blob). Returns how many blobs it deleted. On an error the blobs
    /// it had not checked are noted again (a full pass is due again).
    pub(super) fn collect_blobs(&self) -> Result<usize, ServiceError> {
        let started = Instant::now();
        let (hashes, full) = match self.blob_claims.take(started) {
            Pass::Full => (self.blobs.list()?, true),
            Pass::Candidates(candidates) => (candidates, false),
        };
        let mut deleted = 0;
        for (i, hash) in hashes.iter().enumerate() {
            match self.collect_blob(hash) {
                Ok(true) => deleted += 1,
                Ok(false) => {}
                Err(e) => {
                    if !full {
                        hashes[i..].iter().for_each(|h| self.blob_claims.may_be_garbage(*h));
                    }
                    return Err(e);
                }
            }
        }
        if full {
            self.blob_claims.full_pass_done(started);
        }
        if deleted > 0 {
            // Cached results may name files that are gone.
            self.executor.cache().clear();
            tracing::info!(deleted, full, "blobs collected");
        }
        Ok(deleted)
    }

    /// Deletes `hash` if nothing claims it; whether it did. A blob a live
    /// job claims is noted again (the job may end without a record over it).
    fn collect_blob(&self, hash: &blake3::Hash) -> Result<bool, ServiceError> {
        let name = blob_name(hash);
        // Where hosts share the store: no new hold takes effect until this
        // pass is done with the blob (taken before the gate, never waiting,
        // so this host's writes never wait on the database behind it).
        let lock = crate::store::wait(self.meta.lock_blob(&name))?;
        // Under the gate no upload or output can be between writing this
        // blob and claiming it: unclaimed now means garbage.
        let _gate = self.blob_claims.gate.write();
        let in_use = self.queue.live_jobs().iter().any(|l| l.pending_blobs.lock().contains(&name) || l.record.lock().inputs.iter().any(|i| i.hash == name));
        if in_use || lock.as_ref().is_some_and(|l| l.held) {
            self.blob_claims.may_be_garbage(*hash);
            return Ok(false);
        }
        // Read under the gate (a networked store holds up uploads for a
        // round trip per blob).
        if !crate::store::wait(self.meta.assets_with_hash(&name))?.is_empty() || !self.blobs.contains(hash)? {
            return Ok(false);
        }
        self.blobs.delete(hash)?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_pass_and_then_one_a_day_are_full() {
        let claims = BlobClaims::default();
        let start = Instant::now();
        let h = blake3::hash(b"x");
        claims.may_be_garbage(h);
        assert!(matches!(claims.take(start), Pass::Full), "the first pass lists every blob");
        assert!(matches!(claims.take(start), Pass::Full), "and is due until one ends");
        claims.full_pass_done(start);
        assert!(matches!(claims.take(start), Pass::Candidates(c) if c.is_empty()), "its candidates went with it");
        claims.may_be_garbage(h);
        claims.may_be_garbage(h);
        assert!(matches!(claims.take(start + Duration::from_secs(60)), Pass::Candidates(c) if c == [h]), "each candidate once");
        assert!(matches!(claims.take(start + FULL_PASS_INTERVAL), Pass::Full));
    }
}
