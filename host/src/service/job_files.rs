//! A job's files as its nodes see them: inputs are blobs named by the asset
//! references the workflow made; outputs are written straight into the blob
//! store under ComfyUI-style names counted per job.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::blob_gc::BlobClaims;
use crate::files::{FileError, FileKind, InputFiles, MAX_INPUT_BYTES, OutputFiles, SavedFile, check_extension, is_image_name, output_name, split_prefix};
use crate::store::space::{DiskFloor, LargeWrite};
use crate::store::{BlobStore, JobInput, MetaStore, StoreError, blob_name, parse_blob_name};

/// Input files of one job: name → blob.
pub struct JobInputs {
    files: Vec<(String, blake3::Hash)>,
    blobs: Arc<dyn BlobStore>,
}

impl JobInputs {
    pub fn new(inputs: &[JobInput], blobs: Arc<dyn BlobStore>) -> JobInputs {
        let files = inputs.iter().filter_map(|i| Some((i.name.clone(), parse_blob_name(&i.hash)?))).collect();
        JobInputs { files, blobs }
    }

    fn hash(&self, name: &str) -> Option<&blake3::Hash> {
        self.files.iter().find(|(n, _)| n == name).map(|(_, h)| h)
    }
}

impl InputFiles for JobInputs {
    fn read(&self, name: &str) -> Result<Vec<u8>, FileError> {
        use std::io::Read;
        let not_found = || FileError::NotFound(name.to_string());
        let hash = self.hash(name).ok_or_else(not_found)?;
        let mut file = self.blobs.open(hash).map_err(store_io)?.ok_or_else(not_found)?;
        let size = file.metadata()?.len();
        if size > MAX_INPUT_BYTES {
            return Err(FileError::TooLarge { name: name.to_string(), size, limit: MAX_INPUT_BYTES });
        }
        // A blob never changes once stored: its size is the read's size.
        let mut bytes = Vec::with_capacity(size as usize);
        file.read_to_end(&mut bytes)?;
        Ok(bytes)
    }
    fn contains(&self, name: &str) -> bool {
        self.hash(name).is_some_and(|h| {
            self.blobs.contains(h).unwrap_or_else(|e| {
                tracing::warn!(error = %e, "cannot tell whether a job file's blob is stored");
                false
            })
        })
    }
    fn content_hash(&self, name: &str) -> Option<blake3::Hash> {
        self.hash(name).copied()
    }
    fn image_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.files.iter().map(|(n, _)| n.clone()).filter(|n| is_image_name(n)).collect();
        names.sort();
        names
    }
}

/// Output files of one job, stored as blobs.
pub struct JobOutputs {
    blobs: Arc<dyn BlobStore>,
    counters: Mutex<HashMap<(FileKind, String, String), u64>>,
    /// Blobs written and not yet named by an asset record.
    pending: Arc<Mutex<Vec<String>>>,
    /// The service's blob gate and collection candidates (see `blob_gc`).
    claims: Arc<BlobClaims>,
    /// The store that holds the job's blobs where hosts share it, and the
    /// job's id (the holds' claimant).
    holds: (Arc<dyn MetaStore>, String),
    /// The free space an output must leave on the data directory's disk.
    floor: DiskFloor,
}

/// How long an output's hold is tried while the store is unreachable
/// before the output fails.
const HOLD_RETRY: Duration = Duration::from_secs(30);

impl JobOutputs {
    pub fn new(
        blobs: Arc<dyn BlobStore>,
        pending: Arc<Mutex<Vec<String>>>,
        claims: Arc<BlobClaims>,
        holds: (Arc<dyn MetaStore>, String),
        floor: DiskFloor,
    ) -> JobOutputs {
        JobOutputs { blobs, counters: Mutex::new(HashMap::new()), pending, claims, holds, floor }
    }

    /// Holds blob `hash` for the job where hosts share the store (see
    /// `blob_gc`), trying again while the store is unreachable; whether it
    /// is stored now: a pass on another host may have deleted it before the
    /// hold took effect, and then it is stored again from `data` (if given).
    fn hold(&self, hash: &blake3::Hash, data: Option<&[u8]>) -> Result<bool, StoreError> {
        let (meta, job) = (&self.holds.0, self.holds.1.as_str());
        let names = [blob_name(hash)];
        let (deadline, mut delay) = (Instant::now() + HOLD_RETRY, Duration::from_millis(100));
        let held = loop {
            match crate::store::wait(meta.hold_blobs(&names, job)) {
                Ok(held) => break held,
                Err(StoreError::Unavailable(e)) if Instant::now() < deadline => {
                    tracing::warn!(job_id = job, error = %e, "the store is unavailable; the output's hold is tried again");
                    std::thread::sleep(delay);
                    delay = (delay * 2).min(Duration::from_secs(2));
                }
                Err(e) => return Err(e),
            }
        };
        if !held || self.blobs.stored(hash)? {
            return Ok(true);
        }
        let Some(data) = data else { return Ok(false) };
        self.blobs.put(data)?;
        Ok(true)
    }
}

impl OutputFiles for JobOutputs {
    fn save(&self, kind: FileKind, prefix: &str, extension: &str, data: &[u8]) -> Result<SavedFile, FileError> {
        check_extension(extension)?;
        let (sub, base) = split_prefix(prefix)?;
        let subfolder = sub.to_string_lossy().replace('\\', "/");
        let counter = {
            let mut counters = self.counters.lock();
            let c = counters.entry((kind, subfolder.clone(), base.clone())).or_insert(0);
            *c += 1;
            *c
        };
        // Written and listed as pending under the gate, so a collection pass
        // sees it either absent or claimed, never unnamed.
        let hash = {
            let _gate = self.claims.writing();
            let stored = self.floor.reserve(LargeWrite::Output, data.len() as u64).and_then(|()| self.blobs.put(data));
            let hash = stored.map_err(store_io)?;
            self.pending.lock().push(blob_name(&hash));
            // The job may end without a record over it.
            self.claims.may_be_garbage(hash);
            hash
        };
        self.hold(&hash, Some(data)).map_err(store_io)?;
        // Named by its hash: no local path to report (see `SavedFile::path`).
        Ok(SavedFile { filename: output_name(&base, counter, extension), subfolder, kind, size: data.len() as u64, path: Default::default(), hash: Some(hash) })
    }

    /// Claims a cached output's blob for this job under the gate, as a save
    /// does: a collection pass either ran before (the blob is gone: not a
    /// hit) or sees it pending, so the asset record made for it never names
    /// a deleted blob.
    fn adopt(&self, file: &SavedFile) -> bool {
        let Some(hash) = file.hash else { return false };
        // Held first where hosts share the store: a pass elsewhere then
        // either deleted it already (seen below) or keeps it.
        match self.hold(&hash, None) {
            Ok(true) => {}
            Ok(false) => return false,
            Err(e) => {
                tracing::warn!(error = %e, "cannot hold a cached output's blob: the node runs again");
                return false;
            }
        }
        let _gate = self.claims.writing();
        // Not known to be stored: not a hit (the node runs again).
        if !self.blobs.contains(&hash).unwrap_or(false) {
            return false;
        }
        self.pending.lock().push(blob_name(&hash));
        true
    }
}

/// The media type of a file name, and the Output `type` it belongs to.
pub fn media_type(name: &str) -> (&'static str, &'static str) {
    let ext = name.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase()).unwrap_or_default();
    match ext.as_str() {
        "png" => ("image/png", "image"),
        "jpg" | "jpeg" => ("image/jpeg", "image"),
        "webp" => ("image/webp", "image"),
        "gif" => ("image/gif", "image"),
        "bmp" => ("image/bmp", "image"),
        "tif" | "tiff" => ("image/tiff", "image"),
        "mp4" => ("video/mp4", "video"),
        "webm" => ("video/webm", "video"),
        "wav" => ("audio/wav", "audio"),
        "flac" => ("audio/flac", "audio"),
        "mp3" => ("audio/mpeg", "audio"),
        "txt" => ("text/plain", "text"),
        "json" => ("application/json", "file"),
        "latent" => ("application/octet-stream", "latent"),
        _ => ("application/octet-stream", "file"),
    }
}

/// A store error as a file error; an I/O error keeps its kind (a full disk
/// stays `StorageFull`).
fn store_io(e: crate::store::StoreError) -> FileError {
    match e {
        crate::store::StoreError::Io(io) => FileError::Io(io),
        other => FileError::Io(std::io::Error::other(other.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::DiskBlobs;

    #[test]
    fn a_cached_output_is_adopted_only_while_its_blob_exists() {
        let dir = tempfile::tempdir().unwrap();
        let blobs: Arc<dyn BlobStore> = Arc::new(DiskBlobs::open(dir.path()).unwrap());
        let pending = Arc::new(Mutex::new(Vec::new()));
        let meta: Arc<dyn MetaStore> = Arc::new(crate::store::SledMeta::open(&dir.path().join("meta")).unwrap());
        let holds = |job: &str| (meta.clone(), job.to_string());
        let first = JobOutputs::new(blobs.clone(), Arc::new(Mutex::new(Vec::new())), Arc::default(), holds("j1"), DiskFloor::default());
        let saved = first.save(FileKind::Output, "kiln", "png", b"pixels").unwrap();
        // A later job served this file from the result cache claims its blob.
        let later = JobOutputs::new(blobs.clone(), pending.clone(), Arc::default(), holds("j2"), DiskFloor::default());
        assert!(later.adopt(&saved));
        assert_eq!(*pending.lock(), [blob_name(&saved.hash.unwrap())], "pending: the collector keeps it");
        // Collected in between: not adopted, so no record will name it.
        blobs.delete(&saved.hash.unwrap()).unwrap();
        pending.lock().clear();
        assert!(!later.adopt(&saved));
        assert!(pending.lock().is_empty());
        assert!(!later.adopt(&SavedFile { hash: None, ..saved }), "a file without a hash is not a blob");
    }

    /// Where hosts share the store, an output whose blob a pass on another
    /// host deleted before the job's hold took effect is stored again; a
    /// cached one is not adopted.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_held_output_deleted_before_its_hold_is_stored_again() {
        use crate::store::cluster::HostLeases;
        let Some(db) = crate::store::postgres::test_db::fresh().await else { return };
        let host = db.as_host("a");
        crate::store::postgres::PgHosts::new(host.clone(), "a").register(std::time::Duration::from_secs(60)).await.unwrap();
        let meta: Arc<dyn MetaStore> = Arc::new(crate::store::postgres::PgMeta::new(host));
        let dir = tempfile::tempdir().unwrap();
        let blobs: Arc<dyn BlobStore> = Arc::new(DiskBlobs::open(dir.path()).unwrap());
        let job = crate::store::JobRecord::queued_for_test("j", 5, 1);
        meta.submit(&job, &serde_json::json!({}), None).await.unwrap();
        let outputs = JobOutputs::new(blobs.clone(), Arc::default(), Arc::default(), (meta.clone(), "j".into()), DiskFloor::default());
        tokio::task::spawn_blocking(move || {
            let hash = blobs.put(b"output").unwrap();
            blobs.delete(&hash).unwrap();
            assert!(!outputs.hold(&hash, None).unwrap(), "a cached output's blob gone: not stored");
            assert!(outputs.hold(&hash, Some(b"output")).unwrap());
            assert!(blobs.contains(&hash).unwrap(), "stored again from the bytes at hand");
        })
        .await
        .unwrap();
        assert!(meta.lock_blob(&blob_name(&blake3::hash(b"output"))).await.unwrap().unwrap().held, "held for the job");
    }
}
