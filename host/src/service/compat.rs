//! What the ComfyUI compatibility routes (`api/compat/http`) need of the
//! service, on the same jobs and assets as `/api/v2`:
//!
//! - prompts with ComfyUI's queue fields (a client-chosen `prompt_id`,
//!   `number`, `front`) and ComfyUI's partial validation (the outputs that
//!   validate run; the others are reported and dropped);
//! - queue and history listings, queue `delete`/`clear`, interrupt;
//! - ComfyUI-style uploads: files named per type (`input`, `temp`) and
//!   subfolder, renamed `name (n).ext` on a collision, deduplicated by
//!   content; each is an asset (tag `comfy:<type>`, `file_path` the
//!   `subfolder/name`) in the blob store, so a prompt's `LoadImage` names it;
//! - the lookup of a `(type, subfolder, filename)` triple (`/view`);
//! - the compatibility API's status names.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use serde_json::Value as Json;

use super::job_files::JobInputs;
use super::{AssetLabels, ExtraData, Service, ServiceError, Submission, UploadMeta, submit};
use crate::codes::JobErrorCode;
use crate::store::{AssetRecord, BlobUpload, CompatFields, JobInput, JobRecord, JobStatus, blob_name, now_micros, parse_blob_name};
use crate::workflow::{Issue, ParseError, ValidationError, Workflow, validate};

/// The tag of an asset uploaded through `/api/upload/*`: `comfy:input`, `comfy:temp`.
const TAG_PREFIX: &str = "comfy:";
/// How many `name (n).ext` renamings an upload tries before giving up.
const MAX_RENAMES: u32 = 10_000;
/// Finished jobs the history (and an output's lookup by name) looks through.
pub const MAX_HISTORY: usize = 1000;
/// Jobs read per step when `/view` looks for an output by name.
const OUTPUT_SCAN_PAGE: usize = 64;

/// The compatibility API's state in the service.
#[derive(Default)]
pub struct CompatState {
    /// ComfyUI's priority counter, one per owner: every prompt request
    /// takes a number of its owner's (a server-wide counter would tell an
    /// account how many prompts the others sent). One entry per owner that
    /// sent a prompt (bounded by the accounts).
    counters: Mutex<HashMap<String, i64>>,
    /// Uploads by `(type, path)`, loaded from the asset records on first use.
    uploads: Mutex<Option<Uploads>>,
    /// Bumped by every upload (what `object_info` lists depends on it).
    generation: AtomicU64,
}

/// Uploaded files by owner, then `(type, "subfolder/name")`; the newest
/// record wins. Each account has its own names: one account's upload never
/// renames, replaces or reveals another's.
#[derive(Default)]
struct Uploads {
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
}

/// `subfolder/name` (just `name` without a subfolder).
pub fn join_path(subfolder: &str, name: &str) -> String {
    if subfolder.is_empty() { name.to_string() } else { format!("{subfolder}/{name}") }
}

/// A name as LoadImage gives it: `sub/name.png`, optionally annotated
/// `name.png [input]` (or `[temp]`, `[output]`) → (type, path).
fn annotated(name: &str) -> (&str, &str) {
    for kind in ["input", "temp", "output"] {
        if let Some(path) = name.strip_suffix(&format!(" [{kind}]") as &str) {
            return (kind, path);
        }
    }
    ("input", name)
}

/// A prompt from `POST /api/prompt`, parsed at the edge.
pub struct Prompt {
    pub workflow: Json,
    /// A canonical UUID (checked at the edge), or a fresh id.
    pub id: Option<String>,
    pub number: serde_json::Number,
    pub front: bool,
    pub client_id: Option<String>,
    pub extra: ExtraData,
    pub owner: String,
}

/// A queued prompt and the outputs that were dropped (`node_errors`).
pub struct PromptAccepted {
    pub record: JobRecord,
    pub dropped: Vec<Issue>,
}

/// Why a prompt was not queued.
#[derive(Debug)]
pub enum PromptRejection {
    /// The graph cannot be read (not an object, too large, a bad node).
    Parse(ParseError),
    /// Validation: an unknown class, no output, or every output failed.
    Invalid(ValidationError),
    /// Anything else (a full queue, a taken id, a store failure).
    Service(ServiceError),
}

impl From<ServiceError> for PromptRejection {
    fn from(e: ServiceError) -> PromptRejection {
        PromptRejection::Service(e)
    }
}

/// A job as ComfyUI's queue and history show it.
pub struct CompatJob {
    pub record: JobRecord,
    /// The graph as it runs (asset references resolved), as stored: JSON
    /// text rendered into a listing without being parsed (a tree of a
    /// large workflow costs many times its text).
    pub workflow: Box<serde_json::value::RawValue>,
    /// Output nodes of the graph (`outputs_to_execute`).
    pub outputs_to_execute: Vec<String>,
}

/// A blob upload as `std::io::Write` (an encoder writes into it).
struct UploadWriter<'a>(&'a mut BlobUpload);

impl std::io::Write for UploadWriter<'_> {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.0.write(data).map_err(std::io::Error::other)?;
        Ok(data.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A workflow's nodes as `(id, class_type)`, in document order; every
/// other value is skipped by the parser without being built.
struct NodeClasses(Vec<(String, Option<String>)>);

impl<'de> serde::Deserialize<'de> for NodeClasses {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<NodeClasses, D::Error> {
        #[derive(serde::Deserialize)]
        struct Node {
            class_type: Option<String>,
        }
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = NodeClasses;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a workflow object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<NodeClasses, A::Error> {
                let mut nodes = Vec::new();
                // Stored graphs were validated: each node is an object
                // whose `class_type` is a string.
                while let Some(id) = map.next_key::<String>()? {
                    let node: Node = map.next_value()?;
                    nodes.push((id, node.class_type));
                }
                Ok(NodeClasses(nodes))
            }
        }
        d.deserialize_map(Visit)
    }
}

/// One output file of a job, as ComfyUI names it.
pub struct CompatOutput {
    pub node_id: String,
    pub filename: String,
    pub subfolder: String,
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

/// The compatibility API's name of a job's status (`GET /api/job/{id}/status`):
/// a failure of the workflow itself (it did not validate, a node refused
/// its inputs) is `non_retryable_error`, a run cut off by a restart `lost`.
pub fn compat_status(record: &JobRecord) -> &'static str {
    match record.status {
        JobStatus::Queued => "queued_waiting",
        JobStatus::Running if record.progress.as_ref().is_none_or(|p| p.nodes_done == 0 && p.current_node.is_none()) => "preparing",
        JobStatus::Running => "executing",
        JobStatus::Canceling => "cancel_requested",
        JobStatus::Succeeded => "success",
        JobStatus::Canceled => "cancelled",
        JobStatus::Expired => "lost",
        JobStatus::Failed => match record.error.as_ref().map(|e| e.code) {
            Some(JobErrorCode::Interrupted) => "lost",
            Some(JobErrorCode::InvalidWorkflow | JobErrorCode::NodeExecutionError) => "non_retryable_error",
            _ => "error",
        },
    }
}

impl Service {
    /// The next number of `owner`'s ComfyUI priority counter (taken by
    /// every prompt request that parses, accepted or not).
    pub fn next_prompt_number(&self, owner: &str) -> i64 {
        let mut counters = self.compat.counters.lock();
        let counter = counters.entry(owner.to_string()).or_insert(0);
        let n = *counter;
        *counter += 1;
        n
    }

    /// Changes whenever what `object_info` lists may have changed.
    pub fn uploads_generation(&self) -> u64 {
        self.compat.generation.load(Ordering::SeqCst)
    }

    /// The upload index behind `guard`, loaded from the asset records on first use.
    fn loaded<'a>(&self, guard: &'a mut Option<Uploads>) -> Result<&'a mut Uploads, ServiceError> {
        if guard.is_none() {
            let mut uploads = Uploads::default();
            for asset in self.meta.assets_where(&|a| a.tags.iter().any(|t| t.starts_with(TAG_PREFIX)))? {
                uploads.add(asset);
            }
            *guard = Some(uploads);
        }
        guard.as_mut().ok_or(ServiceError::NotFound)
    }

    /// Runs `f` on the upload index.
    fn with_uploads<R>(&self, f: impl FnOnce(&mut Uploads) -> R) -> Result<R, ServiceError> {
        let mut guard = self.compat.uploads.lock();
        Ok(f(self.loaded(&mut guard)?))
    }

    fn usable(&self, owner: &str, asset: &AssetRecord) -> bool {
        asset.owner == owner && asset.expires_at.is_none_or(|e| e > now_micros())
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
    fn uploads_named_in(&self, owner: &str, workflow: &Json, taken: &[JobInput]) -> Result<Vec<JobInput>, ServiceError> {
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

    /// Validates and queues a prompt the ComfyUI way: outputs that fail
    /// validation are dropped (and reported) as long as one remains.
    pub fn submit_prompt(&self, mut prompt: Prompt) -> Result<PromptAccepted, PromptRejection> {
        // The hosted cloud runs workflows of this API only for an active
        // subscription; the account's sockets hear why (the prompt id is
        // the one asked for, or a fresh one no job will have).
        if self.opts.mode == crate::config::Mode::Cloud && !self.accounts.subscription_active(&prompt.owner) {
            let id = prompt.id.clone().unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
            let body = super::bus::ExecBody::Failed {
                node: None,
                class_type: None,
                code: JobErrorCode::InactiveSubscription,
                message: ServiceError::InactiveSubscription.to_string(),
                executed: Vec::new(),
                at_ms: super::bus::now_ms(),
            };
            self.bus.job(&std::sync::Arc::from(id.as_str()), &std::sync::Arc::from(prompt.owner.as_str()), body);
            return Err(ServiceError::InactiveSubscription.into());
        }
        if let Some(map) = prompt.workflow.as_object()
            && crate::workflow::is_ui_format(map)
        {
            return Err(ServiceError::WorkflowFormatUi.into());
        }
        let resolved = submit::resolve_assets(std::mem::take(&mut prompt.workflow), self.meta.as_ref(), &prompt.owner, now_micros())?;
        let mut inputs = resolved.inputs;
        let named = self.uploads_named_in(&prompt.owner, &resolved.workflow, &inputs)?;
        inputs.extend(named);
        let files = JobInputs::new(&inputs, self.blobs.clone());
        let parsed = Workflow::from_json(&resolved.workflow, &self.opts.workflow_limits).map_err(PromptRejection::Parse)?;
        let (plan, dropped) = validate(&parsed, &self.registry, &files).map_err(PromptRejection::Invalid)?;
        // The dropped outputs leave the stored graph: it is what the queue
        // and history show (`outputs_to_execute`: the ones that run), and
        // what a restart validates again, all or nothing.
        let mut workflow = resolved.workflow;
        if let Some(nodes) = workflow.as_object_mut() {
            for output in dropped.iter().flat_map(|i| i.dependent_outputs.iter()) {
                nodes.shift_remove(output);
            }
        }
        let sub = Submission {
            workflow: Json::Null,
            extra: prompt.extra,
            idempotency_key: None,
            metadata: None,
            owner: prompt.owner,
            surface: "compat",
            id: prompt.id,
            front: prompt.front,
            compat: Some(CompatFields { number: prompt.number, client_id: prompt.client_id }),
            deployment: None,
        };
        let (record, _) = self.enqueue(sub, workflow, inputs, plan)?;
        Ok(PromptAccepted { record, dropped })
    }

    /// Jobs queued or running (ComfyUI's `queue_remaining`).
    pub fn queue_remaining(&self, owner: &str) -> usize {
        self.live.read().values().filter(|j| &*j.owner == owner).count()
    }

    /// The output node ids of a graph, read from its JSON text (node ids
    /// and class names only: every other value is skipped unparsed).
    fn output_nodes(&self, workflow: &[u8]) -> Vec<String> {
        let Ok(nodes) = serde_json::from_slice::<NodeClasses>(workflow) else { return Vec::new() };
        nodes
            .0
            .into_iter()
            .filter(|(_, class)| class.as_deref().and_then(|c| self.registry.get(c)).is_some_and(|(_, def)| def.output_node))
            .map(|(id, _)| id)
            .collect()
    }

    /// A job with its stored workflow, for ComfyUI's queue and history
    /// (one at a time: a listing renders each as it goes).
    pub fn compat_job(&self, record: JobRecord) -> Result<CompatJob, ServiceError> {
        let bytes = self.meta.get_workflow_bytes(&record.id)?.unwrap_or_else(|| b"null".to_vec());
        let outputs_to_execute = self.output_nodes(&bytes);
        let text = String::from_utf8(bytes).map_err(|_| crate::store::StoreError::Corrupt(record.id.clone()))?;
        let workflow = serde_json::value::RawValue::from_string(text).map_err(|_| crate::store::StoreError::Corrupt(record.id.clone()))?;
        Ok(CompatJob { record, workflow, outputs_to_execute })
    }

    /// ComfyUI's queue of `owner`: (running, pending), pending in queue
    /// order; records only (see [`Service::compat_job`]).
    pub fn compat_queue(&self, owner: &str) -> (Vec<JobRecord>, Vec<JobRecord>) {
        let order: Vec<String> = self.queue.lock().ordered();
        let live: Vec<JobRecord> = self.live.read().values().filter(|j| &*j.owner == owner).map(|j| j.snapshot()).collect();
        let mut running: Vec<JobRecord> = live.iter().filter(|r| matches!(r.status, JobStatus::Running | JobStatus::Canceling)).cloned().collect();
        running.sort_by_key(|r| (r.started_at, r.seq));
        let mut queued: HashMap<&str, &JobRecord> = live.iter().filter(|r| r.status == JobStatus::Queued).map(|r| (r.id.as_str(), r)).collect();
        let pending: Vec<JobRecord> = order.iter().filter_map(|id| queued.remove(id.as_str()).cloned()).collect();
        (running, pending)
    }

    /// `owner`'s finished jobs (not expired), oldest first; at most
    /// [`MAX_HISTORY`], the newest ones; records only, without logs (see
    /// [`Service::compat_job`]).
    pub fn compat_history(&self, owner: &str) -> Result<Vec<JobRecord>, ServiceError> {
        let keep = |j: &JobRecord| j.status.is_terminal() && j.status != JobStatus::Expired;
        let page = self.meta.list_jobs(Some(owner), None, MAX_HISTORY, &keep)?;
        Ok(page.jobs.into_iter().rev().collect())
    }

    /// One finished job; `None` while it is queued or running (ComfyUI
    /// answers `{}` until its history is written) or when it is unknown.
    pub fn compat_history_item(&self, owner: &str, id: &str) -> Result<Option<CompatJob>, ServiceError> {
        match self.get(owner, id) {
            Ok((record, _)) if record.status.is_terminal() && record.status != JobStatus::Expired && self.live_job(&record.id).is_none() => {
                self.compat_job(record).map(Some)
            }
            Ok(_) | Err(ServiceError::NotFound) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// A job's output files with their subfolders (from the assets' paths).
    pub fn compat_outputs(&self, record: &JobRecord) -> Result<Vec<CompatOutput>, ServiceError> {
        let mut out = Vec::with_capacity(record.outputs.len());
        for o in &record.outputs {
            let path = self.meta.get_asset(&o.asset_id)?.and_then(|a| a.file_path).unwrap_or_else(|| o.name.clone());
            let subfolder = path.rsplit_once('/').map(|(sub, _)| sub.to_string()).unwrap_or_default();
            out.push(CompatOutput { node_id: o.node_id.clone(), filename: o.name.clone(), subfolder });
        }
        Ok(out)
    }

    /// Interrupts the running job `id` (a no-op when it is not running),
    /// or every running job.
    pub fn interrupt(&self, owner: &str, id: Option<&str>) -> Result<(), ServiceError> {
        let running: Vec<String> = self
            .live
            .read()
            .values()
            .map(|j| j.snapshot())
            .filter(|r| r.owner == owner && r.status == JobStatus::Running && id.is_none_or(|id| id == r.public_id()))
            .map(|r| r.id)
            .collect();
        for id in running {
            self.cancel_if_known(owner, &id)?;
        }
        Ok(())
    }

    /// Cancels jobs, pending or running (the spec's `POST /api/queue {delete}`).
    pub fn delete_from_queue(&self, owner: &str, ids: &[String]) -> Result<(), ServiceError> {
        for id in ids {
            let key = self.job_key(owner, id);
            if self.live_job(&key).is_some() {
                self.cancel_if_known(owner, &key)?;
            }
        }
        Ok(())
    }

    /// Cancels every pending job.
    pub fn clear_queue(&self, owner: &str) -> Result<(), ServiceError> {
        let queued: Vec<String> = self.queue.lock().ordered();
        for id in queued {
            self.cancel_if_known(owner, &id)?;
        }
        Ok(())
    }

    fn cancel_if_known(&self, owner: &str, id: &str) -> Result<(), ServiceError> {
        match self.cancel(owner, id) {
            Ok(_) | Err(ServiceError::NotFound) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Removes finished jobs from the history (`ids`, or with `None` all of
    /// the caller's): they end as `expired` now, their outputs dropped, as
    /// retention would. Queued and running jobs are left alone.
    pub fn delete_history(&self, owner: &str, ids: Option<&[String]>) -> Result<(), ServiceError> {
        let jobs: Vec<JobRecord> = match ids {
            Some(ids) => ids.iter().filter_map(|id| self.meta.get_job(&self.job_key(owner, id)).transpose()).collect::<Result<_, _>>()?,
            None => self.meta.all_jobs()?,
        };
        let targets: Vec<JobRecord> = jobs
            .into_iter()
            .filter(|j| j.owner == owner && j.status.is_terminal() && j.status != JobStatus::Expired && self.live_job(&j.id).is_none())
            .collect();
        if targets.is_empty() {
            return Ok(());
        }
        // As in a sweep: nothing older may be replayed over the deletions.
        self.meta.checkpoint()?;
        let now = now_micros();
        for mut job in targets {
            self.drop_outputs(&mut job)?;
            job.status = JobStatus::Expired;
            job.progress = None;
            job.updated_at = now;
            self.meta.put_job(&job)?;
            self.forget_finished(&job.id);
        }
        self.meta.flush()?;
        Ok(())
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
            match uploads.get(owner, &key.0, &key.1).filter(|a| self.usable(owner, a) && parse_blob_name(&a.hash).is_some_and(|h| self.blobs.contains(&h))) {
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
        if let Some(mut old) = replaced.filter(|old| old.id != asset.id) {
            old.tags.retain(|t| *t != tag);
            self.meta.put_asset(&old)?;
            self.meta.flush()?;
        }
        uploads.files.entry(owner.to_string()).or_default().insert((req.kind.clone(), path), asset);
        self.compat.generation.fetch_add(1, Ordering::SeqCst);
        Ok(name)
    }

    /// A mask upload: the mask's alpha applied onto the referenced image
    /// (`original`: type, subfolder, filename), stored like an upload.
    pub fn commit_compat_mask(&self, owner: &str, mask: &[u8], original: (&str, &str, &str), req: CompatUpload) -> Result<String, ServiceError> {
        let (kind, subfolder, filename) = original;
        let asset = self.compat_file(owner, kind, subfolder, filename)?;
        let hash = parse_blob_name(&asset.hash).ok_or(ServiceError::NotFound)?;
        let file = self.blobs.open(&hash)?.ok_or(ServiceError::NotFound)?;
        let composition = super::mask::Composition::open(std::io::BufReader::new(file), std::io::Cursor::new(mask)).map_err(ServiceError::InvalidRequest)?;
        // Its memory is taken from the intake budget before any pixel is
        // decoded (this runs on the blocking pool, where waiting is fine).
        let gate = tokio::runtime::Handle::try_current().map_err(|e| crate::store::StoreError::Backend(e.to_string()))?;
        let _held = gate.block_on(self.intake.enter(composition.memory())).map_err(|e| ServiceError::PayloadTooLarge { limit_bytes: e.total })?;
        let mut upload = self.begin_upload()?;
        composition.write(UploadWriter(&mut upload)).map_err(ServiceError::InvalidRequest)?;
        self.commit_compat_upload(owner, upload, req)
    }

    /// The asset behind a ComfyUI file reference: an upload (`input`,
    /// `temp`), else an output of one of the owner's latest [`MAX_HISTORY`]
    /// jobs (the newest with that subfolder and name); a
    /// `blake3:<hex>` filename names the bytes themselves.
    pub fn compat_file(&self, owner: &str, kind: &str, subfolder: &str, filename: &str) -> Result<AssetRecord, ServiceError> {
        if parse_blob_name(filename).is_some() {
            let hash = filename.to_ascii_lowercase();
            return self.meta.assets_with_hash(&hash)?.into_iter().find(|a| self.visible(owner, a)).ok_or(ServiceError::NotFound);
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
        let saved = |outputs: &mut dyn Iterator<Item = &crate::store::OutputRecord>| -> Result<Option<AssetRecord>, ServiceError> {
            for o in outputs.filter(|o| o.name == filename) {
                if let Some(asset) = self.meta.get_asset(&o.asset_id)?
                    && asset.file_path.as_deref() == Some(path.as_str())
                    && self.visible(owner, &asset)
                {
                    return Ok(Some(asset));
                }
            }
            Ok(None)
        };
        // (Only the outputs of the owner's live jobs are copied, not their records.)
        let live: Vec<Arc<super::LiveJob>> = self.live.read().values().filter(|j| &*j.owner == owner).cloned().collect();
        let running: Vec<crate::store::OutputRecord> =
            live.iter().flat_map(|j| j.record.lock().outputs.iter().filter(|o| o.name == filename).cloned().collect::<Vec<_>>()).collect();
        if let Some(asset) = saved(&mut running.iter())? {
            return Ok(asset);
        }
        let (mut cursor, mut looked) = (None, 0);
        while looked < MAX_HISTORY {
            let page = self.meta.list_jobs(Some(owner), cursor.as_deref(), OUTPUT_SCAN_PAGE.min(MAX_HISTORY - looked), &|_| true)?;
            looked += page.jobs.len();
            if let Some(asset) = saved(&mut page.jobs.iter().flat_map(|j| &j.outputs))? {
                return Ok(asset);
            }
            match page.next {
                Some(next) => cursor = Some(next),
                None => break,
            }
        }
        Err(ServiceError::NotFound)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_states_map_to_the_specs_status_values() {
        let with = |status: JobStatus, code: Option<JobErrorCode>| {
            let mut rec = JobRecord::queued_for_test("j", 0, 1);
            rec.status = status;
            rec.error = code.map(|code| crate::store::JobErrorRecord { code, message: String::new(), node_id: None, class_type: None, traceback: None });
            compat_status(&rec)
        };
        assert_eq!(with(JobStatus::Queued, None), "queued_waiting");
        assert_eq!(with(JobStatus::Running, None), "preparing", "no node started yet");
        assert_eq!(with(JobStatus::Canceling, None), "cancel_requested");
        assert_eq!(with(JobStatus::Succeeded, None), "success");
        assert_eq!(with(JobStatus::Canceled, None), "cancelled");
        // The workflow's own failure cannot succeed on a retry; a crash, a
        // timeout or a memory limit might; a restart cut the run off.
        assert_eq!(with(JobStatus::Failed, Some(JobErrorCode::InvalidWorkflow)), "non_retryable_error");
        assert_eq!(with(JobStatus::Failed, Some(JobErrorCode::NodeExecutionError)), "non_retryable_error");
        use JobErrorCode as C;
        for code in [C::NodeCrashed, C::NodeTimeout, C::NodeOutOfMemory, C::JobOutOfMemory, C::InternalError] {
            assert_eq!(with(JobStatus::Failed, Some(code)), "error", "{code}");
        }
        assert_eq!(with(JobStatus::Failed, Some(JobErrorCode::Interrupted)), "lost");
    }

    #[test]
    fn load_image_names_may_carry_their_type() {
        assert_eq!(annotated("a.png"), ("input", "a.png"));
        assert_eq!(annotated("sub/a.png [temp]"), ("temp", "sub/a.png"));
        assert_eq!(annotated("a.png [output]"), ("output", "a.png"));
        assert_eq!(join_path("", "a.png"), "a.png");
        assert_eq!(join_path("x/y", "a.png"), "x/y/a.png");
    }

    #[test]
    fn statuses_map_to_the_compat_names() {
        let mut r = JobRecord::queued_for_test("j", 0, 1);
        assert_eq!(compat_status(&r), "queued_waiting");
        r.status = JobStatus::Running;
        assert_eq!(compat_status(&r), "preparing");
        r.status = JobStatus::Canceling;
        assert_eq!(compat_status(&r), "cancel_requested");
        r.status = JobStatus::Succeeded;
        assert_eq!(compat_status(&r), "success");
        r.status = JobStatus::Canceled;
        assert_eq!(compat_status(&r), "cancelled");
        r.status = JobStatus::Failed;
        let fail = |code: JobErrorCode| crate::store::JobErrorRecord { code, message: String::new(), node_id: None, class_type: None, traceback: None };
        for (code, want) in [
            (JobErrorCode::Interrupted, "lost"),
            (JobErrorCode::InvalidWorkflow, "non_retryable_error"),
            (JobErrorCode::NodeExecutionError, "non_retryable_error"),
            (JobErrorCode::NodeTimeout, "error"),
        ] {
            r.error = Some(fail(code));
            assert_eq!(compat_status(&r), want, "{code}");
        }
    }
}
