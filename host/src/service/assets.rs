//! Asset records over blobs: uploads (deduplicated by hash), minting from a
//! known hash, lookups, deletion. A blob outlives its records until the
//! sweeper collects it; deleting a record never removes bytes another
//! record shares.
//!
//! Retention: an upload or mint may ask for `expires_in` seconds; without it
//! the record never expires. Re-referencing content (an upload of known
//! bytes, or a from-hash that returns the existing record) extends the
//! record's retention and adds its tags, never shortens or drops them.

use std::sync::Arc;

use parking_lot::Mutex;

use super::{Service, ServiceError};
use crate::store::{AssetRecord, BlobUpload, Micros, StoreError, blob_name, now_micros, parse_blob_name, wait};

/// The text fields of an upload.
#[derive(Debug, Default, Clone)]
pub struct UploadMeta {
    pub content_type: Option<String>,
    pub file_path: Option<String>,
    pub expected_hash: Option<String>,
    pub labels: AssetLabels,
}

/// Most tags one asset record holds: per request (checked at the API
/// edge) and merged over re-uploads of the same bytes.
pub const MAX_ASSET_TAGS: usize = 64;

/// What a caller may ask of an asset record besides its bytes (validated
/// at the API edge).
#[derive(Debug, Default, Clone)]
pub struct AssetLabels {
    pub tags: Vec<String>,
    /// Retention in seconds; `None`: the record never expires.
    pub expires_in: Option<u64>,
}

impl AssetLabels {
    fn deadline(&self, now: Micros) -> Option<Micros> {
        self.expires_in.map(|s| now.saturating_add(s as Micros * 1_000_000))
    }
}

/// An asset record and whether this call created it from new bytes.
pub struct NewAsset {
    pub asset: AssetRecord,
    pub created_new: bool,
}

impl Service {
    pub(super) fn visible(&self, owner: &str, asset: &AssetRecord) -> bool {
        asset.owner == owner
            && asset.expires_at.is_none_or(|e| e > now_micros())
            && parse_blob_name(&asset.hash).is_some_and(|h| self.blobs.presumed_present(&h))
    }

    /// Assets over `hash` the caller may mint from.
    async fn owned_with_hash(&self, owner: &str, hash: &str) -> Result<Vec<AssetRecord>, ServiceError> {
        Ok(self.meta.assets_with_hash(hash).await?.into_iter().filter(|a| self.visible(owner, a)).collect())
    }

    /// Starts receiving an upload's bytes.
    pub fn begin_upload(&self) -> Result<BlobUpload, ServiceError> {
        let mut upload = self.blobs.begin(self.opts.max_upload_bytes)?;
        upload.keep_free(self.opts.disk_floor.clone())?;
        Ok(upload)
    }

    /// Finishes an upload: checks `expected_hash`, stores the blob, and
    /// returns the caller's existing upload of the same bytes or a new record.
    /// Blocking (it syncs the blob; store calls wait, see `store::wait`).
    pub fn commit_upload(&self, owner: &str, upload: BlobUpload, meta: UploadMeta) -> Result<NewAsset, ServiceError> {
        let (digest, _) = upload.digest();
        let actual = blob_name(&digest);
        if let Some(expected) = &meta.expected_hash
            && !expected.eq_ignore_ascii_case(&actual)
        {
            return Err(ServiceError::HashMismatch { expected: expected.clone(), actual });
        }
        // Where hosts share the store, held there before it is stored (a
        // pass elsewhere then either deleted it first, and it is stored
        // again below, or keeps it) until its record is made.
        let claimant = format!("upload:{}", uuid::Uuid::new_v4());
        let held = wait(self.meta.hold_blobs(std::slice::from_ref(&actual), &claimant))?;
        let recorded = self.record_upload(owner, upload, meta);
        if held && let Err(e) = wait(self.meta.release_blobs(&claimant)) {
            tracing::warn!(error = %e, "cannot end an upload's hold: the retention sweep ends it once this host stops");
        }
        recorded
    }

    /// Stores an upload's blob and records it (see [`Service::commit_upload`]).
    fn record_upload(&self, owner: &str, upload: BlobUpload, meta: UploadMeta) -> Result<NewAsset, ServiceError> {
        let (digest, _) = upload.digest();
        let _gate = self.blob_claims.writing();
        // Claimed below; if the record is not made (or the commit fails
        // after its rename), the next pass frees it.
        self.blob_claims.may_be_garbage(digest);
        let (hash, size) = self.blobs.commit(upload)?;
        let name = blob_name(&hash);
        let known = wait(self.owned_with_hash(owner, &name))?;
        if let Some(existing) = known.iter().find(|a| a.job_id.is_none())
            && let Some(asset) = self.rereference(existing.clone(), &meta.labels)?
        {
            return Ok(NewAsset { asset, created_new: false });
        }
        let content_type = meta.content_type.filter(|c| !c.is_empty()).unwrap_or_else(|| "application/octet-stream".into());
        let asset = self.mint(owner, name, size, content_type, meta.file_path, meta.labels)?;
        Ok(NewAsset { asset, created_new: known.is_empty() })
    }

    /// Records (durably) a new upload-kind asset over a stored blob.
    fn mint(
        &self,
        owner: &str,
        hash: String,
        size_bytes: u64,
        content_type: String,
        file_path: Option<String>,
        labels: AssetLabels,
    ) -> Result<AssetRecord, ServiceError> {
        let now = now_micros();
        let asset = AssetRecord {
            id: uuid::Uuid::now_v7().to_string(),
            owner: owner.to_string(),
            hash,
            size_bytes,
            content_type,
            file_path,
            created_at: now,
            expires_at: labels.deadline(now),
            job_id: None,
            node_id: None,
            tags: labels.tags,
        };
        wait(self.meta.put_asset(&asset))?;
        wait(self.meta.flush())?;
        Ok(asset)
    }

    /// An existing upload record referenced again: its retention becomes
    /// the later of the two (never-expiring wins) and the new tags are
    /// added, from the record as stored (`MetaStore::change_asset`: a
    /// concurrent re-reference is merged, not overwritten). Written
    /// (durably) only if something changed; `None` when the record was
    /// deleted or expired meanwhile (a new one is minted then).
    fn rereference(&self, asset: AssetRecord, labels: &AssetLabels) -> Result<Option<AssetRecord>, ServiceError> {
        let now = now_micros();
        let (deadline, tags) = (labels.deadline(now), labels.tags.clone());
        // What the change last found, beyond the record: gone, a tag too
        // many, or whether it changed the record.
        let found: Arc<Mutex<Option<Result<bool, ServiceError>>>> = Arc::default();
        let change: crate::store::AssetChange = {
            let found = found.clone();
            Arc::new(move |stored: &AssetRecord| {
                *found.lock() = None;
                if stored.expires_at.is_some_and(|at| at <= now) {
                    *found.lock() = Some(Ok(false));
                    return None;
                }
                let mut asset = stored.clone();
                asset.expires_at = match (stored.expires_at, deadline) {
                    (Some(old), Some(new)) => Some(old.max(new)),
                    _ => None,
                };
                for tag in &tags {
                    if !asset.tags.contains(tag) {
                        if asset.tags.len() >= MAX_ASSET_TAGS {
                            *found.lock() = Some(Err(ServiceError::TooManyTags { asset: asset.id.clone(), max: MAX_ASSET_TAGS, tag: tag.clone() }));
                            return None;
                        }
                        asset.tags.push(tag.clone());
                    }
                }
                let changed = asset != *stored;
                *found.lock() = Some(Ok(changed));
                changed.then_some(asset)
            })
        };
        let stored = wait(self.meta.change_asset(&asset.id, change))?;
        let changed = match found.lock().take() {
            Some(Err(refused)) => return Err(refused),
            Some(Ok(changed)) => changed,
            // Gone before the change saw it.
            None => return Ok(None),
        };
        // (Expired when the change saw it: as gone.)
        let Some(stored) = stored.filter(|s| s.expires_at.is_none_or(|at| at > now)) else { return Ok(None) };
        if changed {
            wait(self.meta.flush())?;
        }
        Ok(Some(stored))
    }

    /// Whether the caller may mint an asset from `hash`.
    pub async fn has_blob(&self, owner: &str, hash: &str) -> Result<bool, ServiceError> {
        Ok(!self.owned_with_hash(owner, &hash.to_ascii_lowercase()).await?.is_empty())
    }

    /// Mints an asset over a blob the caller already has (200 when an
    /// identical upload record exists, else a new record). Blocking, like
    /// [`Service::commit_upload`].
    pub fn asset_from_hash(&self, owner: &str, hash: &str, file_path: Option<String>, labels: AssetLabels) -> Result<NewAsset, ServiceError> {
        let hash = hash.to_ascii_lowercase();
        // Where hosts share the store, held there first (the record read
        // below may be deleted on another host meanwhile) and checked still
        // stored, until the new record is made.
        let claimant = format!("upload:{}", uuid::Uuid::new_v4());
        let held = wait(self.meta.hold_blobs(std::slice::from_ref(&hash), &claimant))?;
        let minted = match crate::store::parse_blob_name(&hash) {
            Some(digest) if held && !self.blobs.stored(&digest)? => Err(ServiceError::BlobNotFound(hash.clone())),
            _ => self.mint_from_hash(owner, hash, file_path, labels),
        };
        if held && let Err(e) = wait(self.meta.release_blobs(&claimant)) {
            tracing::warn!(error = %e, "cannot end an upload's hold: the retention sweep ends it once this host stops");
        }
        minted
    }

    /// [`Service::asset_from_hash`] once its blob is held.
    fn mint_from_hash(&self, owner: &str, hash: String, file_path: Option<String>, labels: AssetLabels) -> Result<NewAsset, ServiceError> {
        let _gate = self.blob_claims.writing();
        let known = wait(self.owned_with_hash(owner, &hash))?;
        let Some(first) = known.first() else { return Err(ServiceError::BlobNotFound(hash)) };
        if let Some(same) = known.iter().find(|a| a.job_id.is_none() && (file_path.is_none() || a.file_path == file_path))
            && let Some(asset) = self.rereference(same.clone(), &labels)?
        {
            return Ok(NewAsset { asset, created_new: false });
        }
        let asset = self.mint(owner, hash.clone(), first.size_bytes, first.content_type.clone(), file_path.or_else(|| first.file_path.clone()), labels)?;
        Ok(NewAsset { asset, created_new: true })
    }

    /// An asset the caller owns.
    pub async fn asset(&self, owner: &str, id: &str) -> Result<AssetRecord, ServiceError> {
        match self.meta.get_asset(id).await? {
            Some(a) if self.visible(owner, &a) => Ok(a),
            _ => Err(ServiceError::NotFound),
        }
    }

    /// The asset a signed download link names: the signature is its
    /// authorization (checked by the caller), so it is found whoever owns it.
    pub async fn signed_asset(&self, id: &str) -> Result<AssetRecord, ServiceError> {
        match self.meta.get_asset(id).await? {
            Some(a) if self.visible(&a.owner, &a) => Ok(a),
            _ => Err(ServiceError::NotFound),
        }
    }

    /// An asset's bytes, opened (a blob store that keeps them elsewhere
    /// fetches them first, on the blocking pool).
    pub async fn asset_file(&self, asset: &AssetRecord) -> Result<std::fs::File, ServiceError> {
        let hash = parse_blob_name(&asset.hash).ok_or(ServiceError::NotFound)?;
        let blobs = self.blobs.clone();
        let file = tokio::task::spawn_blocking(move || blobs.open(&hash)).await.map_err(|e| StoreError::Backend(e.to_string()))??;
        file.ok_or(ServiceError::NotFound)
    }

    /// Deletes an asset record. Outputs of a job that is still retained are
    /// refused with [`ServiceError::AssetInUse`].
    pub async fn delete_asset(&self, owner: &str, id: &str) -> Result<(), ServiceError> {
        let asset = self.asset(owner, id).await?;
        if let Some(job_id) = &asset.job_id {
            let retained = match self.live_job(job_id) {
                Some(_) => true,
                None => self.meta.get_job(job_id).await?.is_some_and(|j| j.expires_at > now_micros()),
            };
            if retained {
                return Err(ServiceError::AssetInUse);
            }
        }
        self.delete_asset_record(&asset).await?;
        self.meta.flush().await?;
        Ok(())
    }
}
