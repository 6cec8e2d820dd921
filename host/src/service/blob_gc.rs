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

use std::collections::HashSet;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock, RwLockReadGuard};

use super::{Service, ServiceError};
use crate::store::blob_name;

/// How often a pass lists every blob.
pub const FULL_PASS_INTERVAL: Duration = Duration::from_secs(24 * 3600);

/// The gate and the candidates.
#[derive(Default)]
pub struct BlobClaims {
    gate: RwLock<()>,
    candidates: Mutex<HashSet<blake3::Hash>>,
    /// When the last full pass ran (`None`: none since start).
    last_full: Mutex<Option<Instant>>,
}

impl BlobClaims {
    /// Held while a blob is written and claimed.
    pub fn writing(&self) -> RwLockReadGuard<'_, ()> {
        self.gate.read()
    }

    /// `hash` may have lost its last claim (just written, or a record over
    /// it deleted): the next pass looks at it.
    pub fn may_be_garbage(&self, hash: blake3::Hash) {
        self.candidates.lock().insert(hash);
    }

    /// What the next pass checks: every candidate, or `None` when a full
    /// pass is due (then the candidates are dropped: the full pass sees
    /// every blob).
    fn take(&self, now: Instant) -> Option<Vec<blake3::Hash>> {
        let mut last_full = self.last_full.lock();
        let full = last_full.is_none_or(|at| now.duration_since(at) >= FULL_PASS_INTERVAL);
        let candidates = std::mem::take(&mut *self.candidates.lock());
        if full {
            *last_full = Some(now);
            return None;
        }
        Some(candidates.into_iter().collect())
    }
}

impl Service {
    /// Deletes asset record `asset` (not flushed) and notes its blob.
    pub(super) async fn delete_asset_record(&self, asset: &crate::store::AssetRecord) -> Result<(), ServiceError> {
        self.meta.delete_asset(asset).await?;
        if let Some(hash) = crate::store::parse_blob_name(&asset.hash) {
            self.blob_claims.may_be_garbage(hash);
        }
        Ok(())
    }

    /// One collection pass (synchronous: it holds the gate while it checks
    /// each blob). Returns how many blobs it deleted.
    pub(super) fn collect_blobs(&self) -> Result<usize, ServiceError> {
        let (hashes, full) = match self.blob_claims.take(Instant::now()) {
            Some(candidates) => (candidates, false),
            None => (self.blobs.list()?, true),
        };
        let mut deleted = 0;
        for hash in hashes {
            let name = blob_name(&hash);
            // Under the gate no upload or output can be between writing this
            // blob and claiming it: unclaimed now means garbage.
            let _gate = self.blob_claims.gate.write();
            let in_use = self.queue.live_jobs().iter().any(|l| l.pending_blobs.lock().contains(&name) || l.record.lock().inputs.iter().any(|i| i.hash == name));
            if in_use {
                // Claimed by a job that may end without a record over it.
                self.blob_claims.may_be_garbage(hash);
                continue;
            }
            // Read under the gate (a networked store holds up uploads for a
            // round trip per blob).
            if !crate::store::wait(self.meta.assets_with_hash(&name))?.is_empty() || !self.blobs.contains(&hash) {
                continue;
            }
            self.blobs.delete(&hash)?;
            deleted += 1;
        }
        if deleted > 0 {
            // Cached results may name files that are gone.
            self.executor.cache().clear();
            tracing::info!(deleted, full, "blobs collected");
        }
        Ok(deleted)
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
        assert_eq!(claims.take(start), None, "the first pass lists every blob");
        assert_eq!(claims.take(start), Some(vec![]), "its candidates went with it");
        claims.may_be_garbage(h);
        claims.may_be_garbage(h);
        assert_eq!(claims.take(start + Duration::from_secs(60)), Some(vec![h]), "each candidate once");
        assert_eq!(claims.take(start + FULL_PASS_INTERVAL), None);
    }
}
