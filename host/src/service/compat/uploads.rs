//! ComfyUI-style uploads: files named per type (`input`, `temp`) and
//! subfolder, renamed `name (n).ext` on a collision, deduplicated by
//! content. Each is an asset (tag `comfy:<type>`, `file_path` the
//! `subfolder/name`) in the blob store, indexed by `(type, path)` per owner
//! so a prompt's `LoadImage` can name it, and `/view` can find it (or a
//! job's output) by its `(type, subfolder, filename)`.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use serde_json::Value as Json;

use super::MAX_HISTORY;
use crate::service::reencode::{Conversion, Converted, Decoding};
use crate::service::{AssetLabels, Service, ServiceError, UploadMeta};
use crate::store::{AssetRecord, BlobUpload, JobInput, blob_name, now_micros, parse_blob_name, wait};

/// The tag of an asset uploaded through `/api/upload/*`: `comfy:input`, `comfy:temp`.
const TAG_PREFIX: &str = "comfy:";
/// How many `name (n).ext` renamings an upload tries before giving up.
const MAX_RENAMES: u32 = 10_000;
/// Jobs read per step when `/view` looks for an output by name.
const OUTPUT_SCAN_PAGE: usize = 64;

/// Uploaded files by owner, then `(type, "subfolder/name")`; the newest
/// record wins. Each account has its own names: one account's upload never
/// renames, replaces or reveals another's.
#[derive(Default)]
pub(super) struct Uploads {
    files: HashMap<String, HashMap<(String, String), AssetRecord>>,
}

impl Uploads {
    fn add(&mut self, asset: AssetRecord) {
        let Some(path) = asset.file_path.clone() else { return };
        let files = self.files.entry(asset.owner.clone()).or_default();
        for kind in asset.tags.iter().filter_map(|t| t.strip_prefix(TAG_PREFIX)) {
            let key = (kind.to_string(), path.clone());
            if files.get(&key).is_none_or(|old| old.created_at <= asset.created_at) {
                files.insert(key, asset.clone());
            }
        }
    }

    /// `owner`'s upload of `kind` at `path`.
    fn get(&self, owner: &str, kind: &str, path: &str) -> Option<&AssetRecord> {
        self.files.get(owner)?.get(&(kind.to_string(), path.to_string()))
    }

    /// Drops the names record `asset` holds (looked up by its own tags and
    /// path, not by scanning the owner's names); whether it held any.
    fn remove(&mut self, asset: &AssetRecord) -> bool {
        let (Some(path), Some(files)) = (&asset.file_path, self.files.get_mut(&asset.owner)) else { return false };
        let mut removed = false;
        for kind in asset.tags.iter().filter_map(|t| t.strip_prefix(TAG_PREFIX)) {
            let key = (kind.to_string(), path.clone());
            if files.get(&key).is_some_and(|held| held.id == asset.id) {
                files.remove(&key);
                removed = true;
            }
        }
        if files.is_empty() {
            self.files.remove(&asset.owner);
        }
        removed
    }
}

/// `subfolder/name` (just `name` without a subfolder).
pub fn join_path(subfolder: &str, name: &str) -> String {
    if subfolder.is_empty() { name.to_string() } else { format!("{subfolder}/{name}") }
}

/// A name as LoadImage gives it: `sub/name.png`, optionally annotated
/// `name.png [input]` (or `[temp]`, `[output]`) → (type, path).
pub(super) fn annotated(name: &str) -> (&str, &str) {
    for kind in ["input", "temp", "output"] {
        if let Some(path) = name.strip_suffix(&format!(" [{kind}]") as &str) {
            return (kind, path);
        }
    }
    ("input", name)
}

/// A blob upload as `std::io::Write` (an encoder writes into it).
/// Writes into an upload, keeping the store's own error (a full disk is
/// 507, not a bad request) for the caller.
struct UploadWriter<'a>(&'a mut BlobUpload, Option<crate::store::StoreError>);

impl std::io::Write for UploadWriter<'_> {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        if let Err(e) = self.0.write(data) {
            let message = e.to_string();
            self.1 = Some(e);
            return Err(std::io::Error::other(message));
        }
        Ok(data.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A ComfyUI-style upload.
pub struct CompatUpload {
    /// `input` or `temp` (checked at the edge).
    pub kind: String,
    /// A relative folder (checked at the edge), or empty.
    pub subfolder: String,
    /// A plain file name (checked at the edge).
    pub filename: String,
    pub overwrite: bool,
    pub content_type: String,
}

impl Service {
    /// Changes whenever what `object_info` lists may have changed.
    pub fn uploads_generation(&self) -> u64 {
        self.compat.generation.load(Ordering::SeqCst)
    }

    /// Loads the upload index from the asset records (at start: no
    /// request waits for it).
    pub(in crate::service) async fn load_uploads(&self) -> Result<(), ServiceError> {
        let mut uploads = Uploads::default();
        for asset in self.meta.assets_tagged(TAG_PREFIX).await? {
            uploads.add(asset);
        }
        *self.compat.uploads.lock() = Some(uploads);
        Ok(())
    }

    /// The upload index behind `guard` (loaded at start).
    fn loaded<'a>(&self, guard: &'a mut Option<Uploads>) -> Result<&'a mut Uploads, ServiceError> {
        guard.as_mut().ok_or_else(|| crate::store::StoreError::Backend("the upload index is not loaded".into()).into())
    }

    /// Runs `f` on the upload index.
    fn with_uploads<R>(&self, f: impl FnOnce(&mut Uploads) -> R) -> Result<R, ServiceError> {
        let mut guard = self.compat.uploads.lock();
        Ok(f(self.loaded(&mut guard)?))
    }

    fn usable(&self, owner: &str, asset: &AssetRecord) -> bool {
        asset.owner == owner && asset.expires_at.is_none_or(|e| e > now_micros())
    }

    /// A deleted asset record (any path: the Jobs API, expiry) leaves the
    /// upload index at once.
    pub(in crate::service) fn forget_upload(&self, asset: &AssetRecord) {
        if !asset.tags.iter().any(|t| t.starts_with(TAG_PREFIX)) {
            return;
        }
        let removed = self.compat.uploads.lock().as_mut().is_some_and(|u| u.remove(asset));
        if removed {
            self.compat.generation.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// The uploaded files of type `input`, as inputs a job can read.
    pub fn input_uploads(&self, owner: &str) -> Result<Vec<JobInput>, ServiceError> {
        self.with_uploads(|u| {
            let mut out: Vec<JobInput> = u
                .files
                .get(owner)
                .into_iter()
                .flatten()
                .filter(|((kind, _), a)| kind == "input" && self.usable(owner, a))
                .map(|((_, path), a)| JobInput { name: path.clone(), hash: a.hash.clone() })
                .collect();
            out.sort_by(|a, b| a.name.cmp(&b.name));
            out
        })
    }

    /// The uploads a workflow names in its nodes' inputs (`LoadImage`'s
    /// `image`: `name`, `sub/name` or `name [input]`), as job inputs under
    /// the name the node gives. Only the nodes' own input values are looked
    /// at (no recursion into the client's JSON).
    pub(in crate::service) fn uploads_named_in(&self, owner: &str, workflow: &Json, taken: &[JobInput]) -> Result<Vec<JobInput>, ServiceError> {
        let Some(nodes) = workflow.as_object() else { return Ok(Vec::new()) };
        self.with_uploads(|u| {
            let mut out: Vec<JobInput> = Vec::new();
            for node in nodes.values() {
                let Some(inputs) = node.get("inputs").and_then(Json::as_object) else { continue };
                for name in inputs.values().filter_map(Json::as_str) {
                    if taken.iter().chain(out.iter()).any(|i| i.name == name) {
                        continue;
                    }
                    let (kind, path) = annotated(name);
                    if let Some(asset) = u.get(owner, kind, path).filter(|a| self.usable(owner, a)) {
                        out.push(JobInput { name: name.to_string(), hash: asset.hash.clone() });
                    }
                }
            }
            out
        })
    }

    /// Stores a ComfyUI-style upload and returns its final name: the name
    /// asked for when it is free or holds the same bytes (then nothing new
    /// is written), with `overwrite` the new bytes under it, else the first
    /// free `stem (n).ext`.
    pub fn commit_compat_upload(&self, owner: &str, upload: BlobUpload, req: CompatUpload) -> Result<String, ServiceError> {
        let (digest, _) = upload.digest();
        let hash = blob_name(&digest);
        let (stem, ext) = match req.filename.rsplit_once('.') {
            Some((stem, ext)) if !stem.is_empty() => (stem.to_string(), format!(".{ext}")),
            _ => (req.filename.clone(), String::new()),
        };
        // The index stays locked while the name is chosen and recorded, so
        // two uploads never take one name.
        let mut guard = self.compat.uploads.lock();
        let uploads = self.loaded(&mut guard)?;
        let mut chosen = None;
        let mut replaced = None;
        for n in 0..=MAX_RENAMES {
            let name = if n == 0 { req.filename.clone() } else { format!("{stem} ({n}){ext}") };
            let key = (req.kind.clone(), join_path(&req.subfolder, &name));
            match uploads
                .get(owner, &key.0, &key.1)
                .filter(|a| self.usable(owner, a) && parse_blob_name(&a.hash).is_some_and(|h| self.blobs.presumed_present(&h)))
            {
                Some(a) if a.hash == hash => return Ok(name),
                Some(a) if n == 0 && req.overwrite => {
                    replaced = Some(a.clone());
                    chosen = Some(name);
                    break;
                }
                Some(_) => continue,
                None => {
                    chosen = Some(name);
                    break;
                }
            }
        }
        let name = chosen.ok_or_else(|| ServiceError::InvalidRequest("too many files with this name".into()))?;
        let path = join_path(&req.subfolder, &name);
        let tag = format!("{TAG_PREFIX}{}", req.kind);
        let meta = UploadMeta { content_type: Some(req.content_type), file_path: Some(path.clone()), expected_hash: None, labels: AssetLabels::default() };
        let first = self.commit_upload(owner, upload, meta)?;
        let labels = AssetLabels { tags: vec![tag.clone()], expires_in: None };
        let asset = self.asset_from_hash(owner, &first.asset.hash, Some(path.clone()), labels)?.asset;
        // Overwritten: the old record no longer names this file (its bytes
        // stay while anything else refers to them). The record now naming
        // it may be an older one (bytes uploaded under this name before),
        // so the index is set, not merged by age.
        // (One deleted meanwhile, through any host, stays deleted.)
        if let Some(old) = replaced.filter(|old| old.id != asset.id) {
            // From the record as stored (a concurrent change to it stays).
            let untag = tag.clone();
            let change: crate::store::AssetChange = std::sync::Arc::new(move |stored: &AssetRecord| {
                stored.tags.contains(&untag).then(|| AssetRecord { tags: stored.tags.iter().filter(|t| **t != untag).cloned().collect(), ..stored.clone() })
            });
            if wait(self.meta.change_asset(&old.id, change))?.is_some() {
                wait(self.meta.flush())?;
            }
        }
        uploads.files.entry(owner.to_string()).or_default().insert((req.kind.clone(), path), asset);
        self.compat.generation.fetch_add(1, Ordering::SeqCst);
        Ok(name)
    }

    /// A mask upload: the mask's alpha applied onto the referenced image
    /// (`original`: type, subfolder, filename), stored like an upload.
    pub fn commit_compat_mask(&self, owner: &str, mask: &[u8], original: (&str, &str, &str), req: CompatUpload) -> Result<String, ServiceError> {
        let (kind, subfolder, filename) = original;
        // On the blocking pool, where waiting is fine.
        let runtime = tokio::runtime::Handle::try_current().map_err(|e| crate::store::StoreError::Backend(e.to_string()))?;
        let asset = runtime.block_on(self.compat_file(owner, kind, subfolder, filename))?;
        let hash = parse_blob_name(&asset.hash).ok_or(ServiceError::NotFound)?;
        let file = self.blobs.open(&hash)?.ok_or(ServiceError::NotFound)?;
        let composition =
            crate::service::mask::Composition::open(std::io::BufReader::new(file), std::io::Cursor::new(mask)).map_err(ServiceError::InvalidRequest)?;
        // Its memory is taken from the intake budget before any pixel is
        // decoded.
        let _held = runtime.block_on(self.intake.enter(composition.memory())).map_err(|e| ServiceError::PayloadTooLarge { limit_bytes: e.total })?;
        let mut upload = self.begin_upload()?;
        let mut writer = UploadWriter(&mut upload, None);
        if let Err(e) = composition.write(&mut writer) {
            return Err(writer.1.take().map_or(ServiceError::InvalidRequest(e), ServiceError::from));
        }
        self.commit_compat_upload(owner, upload, req)
    }

    /// A ComfyUI file (`file`: type, subfolder, filename) converted as
    /// `/view`'s `preview` or `channel` asks, with its media type. The
    /// decode's memory is taken from the intake budget before any pixel is
    /// decoded. On the blocking pool.
    pub fn compat_converted(&self, owner: &str, file: (&str, &str, &str), conversion: Conversion) -> Result<Converted, ServiceError> {
        let (kind, subfolder, filename) = file;
        let runtime = tokio::runtime::Handle::try_current().map_err(|e| crate::store::StoreError::Backend(e.to_string()))?;
        let asset = runtime.block_on(self.compat_file(owner, kind, subfolder, filename))?;
        let hash = parse_blob_name(&asset.hash).ok_or(ServiceError::NotFound)?;
        let file = self.blobs.open(&hash)?.ok_or(ServiceError::NotFound)?;
        let decoding = Decoding::open(std::io::BufReader::new(file)).map_err(|e| ServiceError::InvalidRequest(format!("cannot convert `{filename}`: {e}")))?;
        let _held = runtime.block_on(self.intake.enter(decoding.memory())).map_err(|e| ServiceError::InvalidRequest(e.to_string()))?;
        decoding.convert(conversion).map_err(|e| ServiceError::InvalidRequest(format!("cannot convert `{filename}`: {e}")))
    }

    /// The asset behind a ComfyUI file reference: an upload (`input`,
    /// `temp`), else an output of one of the owner's latest [`MAX_HISTORY`]
    /// jobs (the newest with that subfolder and name); a
    /// `blake3:<hex>` filename names the bytes themselves.
    pub async fn compat_file(&self, owner: &str, kind: &str, subfolder: &str, filename: &str) -> Result<AssetRecord, ServiceError> {
        if parse_blob_name(filename).is_some() {
            let hash = filename.to_ascii_lowercase();
            return self.meta.assets_with_hash(&hash).await?.into_iter().find(|a| self.visible(owner, a)).ok_or(ServiceError::NotFound);
        }
        let path = join_path(subfolder, filename);
        if kind != "output" {
            let upload = self.with_uploads(|u| u.get(owner, kind, &path).cloned())?;
            if let Some(asset) = upload.filter(|a| self.visible(owner, a)) {
                return Ok(asset);
            }
            if kind == "input" {
                return Err(ServiceError::NotFound);
            }
        }
        // The owner's running jobs first (an output is announced — ComfyUI's
        // `executed` — before its job's terminal record is stored), then its
        // latest jobs, newest first, a page at a time, and at most
        // MAX_HISTORY of them whatever the name: a name no job saved (the
        // client chooses it) must not cost a scan of every record.
        // (Only the outputs of the owner's live jobs are copied, not their records.)
        let live: Vec<std::sync::Arc<crate::service::LiveJob>> = self.queue.live_jobs().into_iter().filter(|j| &*j.owner == owner).collect();
        let running: Vec<crate::store::OutputRecord> =
            live.iter().flat_map(|j| j.record.lock().outputs.iter().filter(|o| o.name == filename).cloned().collect::<Vec<_>>()).collect();
        if let Some(asset) = self.saved_output(owner, &path, running.iter()).await? {
            return Ok(asset);
        }
        let (mut cursor, mut looked) = (None, 0);
        while looked < MAX_HISTORY {
            let page = self.meta.list_jobs(Some(owner), cursor.as_deref(), OUTPUT_SCAN_PAGE.min(MAX_HISTORY - looked), usize::MAX, &|_| true).await?;
            looked += page.jobs.len();
            let named = page.jobs.iter().flat_map(|j| &j.outputs).filter(|o| o.name == filename);
            if let Some(asset) = self.saved_output(owner, &path, named).await? {
                return Ok(asset);
            }
            match page.next {
                Some(next) => cursor = Some(next),
                None => break,
            }
        }
        Err(ServiceError::NotFound)
    }

    /// The first of these outputs (named as asked) whose asset the owner
    /// can read under `path`.
    async fn saved_output(
        &self,
        owner: &str,
        path: &str,
        outputs: impl Iterator<Item = &crate::store::OutputRecord>,
    ) -> Result<Option<AssetRecord>, ServiceError> {
        let ids: Vec<&str> = outputs.map(|o| o.asset_id.as_str()).collect();
        for id in ids {
            if let Some(asset) = self.meta.get_asset(id).await?
                && asset.file_path.as_deref() == Some(path)
                && self.visible(owner, &asset)
            {
                return Ok(Some(asset));
            }
        }
        Ok(None)
    }
}
