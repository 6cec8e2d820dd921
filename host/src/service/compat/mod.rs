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
//! - the lookup of a `(type, subfolder, filename)` triple (`/view`).
//!
//! Prompts themselves go through the service's one intake (`intake`).

mod uploads;
mod window;

pub use window::WindowJob;

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;

use parking_lot::Mutex;

use uploads::Uploads;
pub use uploads::{CompatUpload, join_path};

use super::{LIST_SCAN_BUDGET, Service, ServiceError};
use crate::store::{JobRecord, JobStatus, now_micros};

/// Finished jobs the history (and an output's lookup by name) looks through.
pub const MAX_HISTORY: usize = 1000;
/// Most of an owner's unfinished jobs on other hosts a queue view shows.
pub const MAX_QUEUE_VIEW: usize = 10_000;

/// Most items of a listing whose workflows are read at once.
const LISTING_WORKFLOW_BATCH: usize = 64;
/// The bytes of workflows a listing reads at once (a workflow larger
/// than this is read alone).
const LISTING_WORKFLOW_BYTES: usize = 1 << 20;

/// The compatibility API's state in the service.
#[derive(Default)]
pub struct CompatState {
    /// Uploads by `(type, path)`, loaded from the asset records on first use.
    uploads: Mutex<Option<Uploads>>,
    /// Bumped by every upload (what `object_info` lists depends on it).
    generation: AtomicU64,
    /// Owners' history windows, kept between requests.
    windows: window::Windows,
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

impl Service {
    /// The next number of `owner`'s ComfyUI priority counter (taken by
    /// every prompt request that parses, accepted or not; see `numbers`).
    pub async fn next_prompt_number(&self, owner: &str) -> Result<i64, ServiceError> {
        Ok(self.numbers.next_prompt_number(owner).await?)
    }

    /// Jobs queued or running here (ComfyUI's `queue_remaining`, as the
    /// WebSocket's status messages count it).
    pub fn queue_remaining(&self, owner: &str) -> usize {
        self.queue.remaining_of(owner)
    }

    /// [`Service::queue_remaining`] with the jobs other hosts sharing the
    /// store hold (`GET /prompt`, a WebSocket's first status message); this
    /// host's alone if the store cannot answer. The other hosts' count is
    /// kept for the status messages of the owner's open streams (see
    /// `queue_counts`).
    pub async fn queue_remaining_everywhere(&self, owner: &str) -> usize {
        let here = self.queue.remaining_of(owner);
        let Some(counts) = &self.queue_counts else { return here };
        match self.meta.unfinished_count_elsewhere(owner).await {
            Ok(elsewhere) => {
                if self.open_streams_of(owner) > 0 {
                    counts.read(owner, elsewhere);
                }
                here + elsewhere
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot count the other hosts' jobs: counting this host's");
                here
            }
        }
    }

    /// The output node ids of a graph, read from its JSON text (node ids
    /// and class names only: every other value is skipped unparsed).
    fn output_nodes(&self, owner: &str, workflow: &[u8]) -> Vec<String> {
        let Ok(nodes) = serde_json::from_slice::<NodeClasses>(workflow) else { return Vec::new() };
        let registry = self.registry_for(owner);
        nodes
            .0
            .into_iter()
            .filter(|(_, class)| class.as_deref().and_then(|c| registry.get(c)).is_some_and(|(_, def)| def.output_node))
            .map(|(id, _)| id)
            .collect()
    }

    /// A job with its stored workflow, for ComfyUI's queue and history
    /// (one at a time: a listing renders each as it goes).
    pub async fn compat_job(&self, record: JobRecord) -> Result<CompatJob, ServiceError> {
        let bytes = self.meta.get_workflow_bytes(&record.id).await?;
        self.compat_job_with(record, bytes)
    }

    /// The next few of `records` (at least one while any are left) with
    /// their workflows, read at once within [`LISTING_WORKFLOW_BYTES`]: a
    /// listing renders these before it reads more.
    pub async fn compat_next_jobs(&self, records: &mut std::collections::VecDeque<JobRecord>) -> Result<Vec<CompatJob>, ServiceError> {
        if records.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<String> = records.iter().take(LISTING_WORKFLOW_BATCH).map(|r| r.id.clone()).collect();
        let workflows = self.meta.get_workflows_bytes(&ids, LISTING_WORKFLOW_BYTES).await?;
        if workflows.is_empty() {
            return Err(crate::store::StoreError::Backend("the store read none of the workflows asked".into()).into());
        }
        let mut jobs = Vec::with_capacity(workflows.len());
        for bytes in workflows {
            let Some(record) = records.pop_front() else { break };
            jobs.push(self.compat_job_with(record, bytes)?);
        }
        Ok(jobs)
    }

    /// A record with its stored workflow (`None`: `null`).
    fn compat_job_with(&self, record: JobRecord, bytes: Option<Vec<u8>>) -> Result<CompatJob, ServiceError> {
        let bytes = bytes.unwrap_or_else(|| b"null".to_vec());
        let outputs_to_execute = self.output_nodes(&record.owner, &bytes);
        let text = String::from_utf8(bytes).map_err(|_| crate::store::StoreError::Corrupt(record.id.clone()))?;
        let workflow = serde_json::value::RawValue::from_string(text).map_err(|_| crate::store::StoreError::Corrupt(record.id.clone()))?;
        Ok(CompatJob { record, workflow, outputs_to_execute })
    }

    /// ComfyUI's queue of `owner`: (running, pending), pending in queue
    /// order; records only (see [`Service::compat_job`]). Where hosts share
    /// the store, the jobs other hosts hold come too (read from the store,
    /// at most [`MAX_QUEUE_VIEW`]; this host's alone if it cannot answer):
    /// running ones by start, pending ones after this host's, in the order
    /// they were queued (each host runs its own in its own order).
    pub async fn compat_queue(&self, owner: &str) -> Result<(Vec<JobRecord>, Vec<JobRecord>), ServiceError> {
        let order: Vec<String> = self.queue.waiting().ordered();
        let live: Vec<JobRecord> = self.queue.live_jobs().iter().filter(|j| &*j.owner == owner).map(|j| j.snapshot()).collect();
        let mut running: Vec<JobRecord> = live.iter().filter(|r| matches!(r.status, JobStatus::Running | JobStatus::Canceling)).cloned().collect();
        let mut queued: HashMap<&str, &JobRecord> = live.iter().filter(|r| r.status == JobStatus::Queued).map(|r| (r.id.as_str(), r)).collect();
        let mut pending: Vec<JobRecord> = order.iter().filter_map(|id| queued.remove(id.as_str()).cloned()).collect();
        if self.cluster.is_some() {
            let here: std::collections::HashSet<&str> = live.iter().map(|r| r.id.as_str()).collect();
            let elsewhere = self.meta.unfinished_elsewhere(owner, MAX_QUEUE_VIEW).await.unwrap_or_else(|e| {
                tracing::warn!(error = %e, "cannot read the queue of the other hosts: showing this host's");
                Vec::new()
            });
            // (A job taken over by this host meanwhile shows once.)
            let mut elsewhere: Vec<JobRecord> = elsewhere.into_iter().filter(|r| !here.contains(r.id.as_str())).collect();
            elsewhere.sort_by_key(|r| (r.created_at, r.seq));
            for record in elsewhere {
                match record.status {
                    JobStatus::Queued => pending.push(record),
                    _ => running.push(record),
                }
            }
        }
        running.sort_by_key(|r| (r.started_at, r.seq));
        Ok((running, pending))
    }

    /// `owner`'s finished jobs (not expired), oldest first; at most
    /// [`MAX_HISTORY`], the newest ones; records only, without logs (see
    /// [`Service::compat_job`]).
    /// `newest`: only that many of the newest (read, not the whole window).
    pub async fn compat_history(&self, owner: &str, newest: Option<usize>) -> Result<Vec<JobRecord>, ServiceError> {
        let keep = |j: &JobRecord| j.status.is_terminal() && j.status != JobStatus::Expired;
        let want = newest.unwrap_or(MAX_HISTORY).min(MAX_HISTORY);
        // Page by page (each within the scan budget) until the history is
        // full or the owner's index ends.
        let (mut jobs, mut cursor) = (Vec::new(), None);
        while jobs.len() < want {
            let page = self.meta.list_jobs(Some(owner), cursor.as_deref(), want - jobs.len(), LIST_SCAN_BUDGET, &keep).await?;
            jobs.extend(page.jobs);
            match page.next {
                Some(next) => cursor = Some(next),
                None => break,
            }
        }
        Ok(jobs.into_iter().rev().collect())
    }

    /// One finished job; `None` while it is queued or running (ComfyUI
    /// answers `{}` until its history is written) or when it is unknown.
    pub async fn compat_history_item(&self, owner: &str, id: &str) -> Result<Option<CompatJob>, ServiceError> {
        match self.get(owner, id).await {
            Ok((record, _)) if record.status.is_terminal() && record.status != JobStatus::Expired && self.live_job(&record.id).is_none() => {
                self.compat_job(record).await.map(Some)
            }
            Ok(_) | Err(ServiceError::NotFound) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// A job's output files with their subfolders: from the records (no
    /// asset read), or, for records stored before they kept it, from the
    /// output assets' paths.
    pub async fn compat_outputs(&self, record: &JobRecord) -> Result<Vec<CompatOutput>, ServiceError> {
        let mut out = Vec::with_capacity(record.outputs.len());
        for o in &record.outputs {
            let subfolder = match &o.subfolder {
                Some(subfolder) => subfolder.clone(),
                None => {
                    let path = self.meta.get_asset(&o.asset_id).await?.and_then(|a| a.file_path).unwrap_or_else(|| o.name.clone());
                    path.rsplit_once('/').map(|(sub, _)| sub.to_string()).unwrap_or_default()
                }
            };
            out.push(CompatOutput { node_id: o.node_id.clone(), filename: o.name.clone(), subfolder });
        }
        Ok(out)
    }

    /// Interrupts the running job `id` (a no-op when it is not running),
    /// or every running job.
    pub async fn interrupt(&self, owner: &str, id: Option<&str>) -> Result<(), ServiceError> {
        let running: Vec<String> = self
            .compat_queue(owner)
            .await?
            .0
            .into_iter()
            .filter(|r| r.status == JobStatus::Running && id.is_none_or(|id| id == r.public_id()))
            .map(|r| r.id)
            .collect();
        for id in running {
            self.cancel_if_known(owner, &id).await?;
        }
        Ok(())
    }

    /// Cancels jobs, pending or running (the spec's `POST /api/queue {delete}`).
    pub async fn delete_from_queue(&self, owner: &str, ids: &[String]) -> Result<(), ServiceError> {
        for id in ids {
            let key = self.job_key(owner, id).await;
            // Another host's job: the cancel asks that host.
            if self.live_job(&key).is_some() || self.cluster.is_some() {
                self.cancel_if_known(owner, &key).await?;
            }
        }
        Ok(())
    }

    /// Cancels every pending job (where hosts share the store, on all).
    pub async fn clear_queue(&self, owner: &str) -> Result<(), ServiceError> {
        let queued: Vec<String> = match self.cluster {
            Some(_) => self.compat_queue(owner).await?.1.into_iter().map(|r| r.id).collect(),
            None => self.queue.waiting().ordered(),
        };
        for id in queued {
            self.cancel_if_known(owner, &id).await?;
        }
        Ok(())
    }

    async fn cancel_if_known(&self, owner: &str, id: &str) -> Result<(), ServiceError> {
        let result = match self.live_job(id) {
            // Another host's: asked, not waited for.
            None if self.cluster.is_some() => self.ask_to_cancel(owner, id).await,
            _ => self.cancel(owner, id).await.map(drop),
        };
        match result {
            Ok(_) | Err(ServiceError::NotFound) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Removes finished jobs from the history (`ids`, or with `None` all of
    /// the caller's): they end as `expired` now, their outputs dropped, as
    /// retention would. Queued and running jobs are left alone.
    pub async fn delete_history(&self, owner: &str, ids: Option<&[String]>) -> Result<(), ServiceError> {
        let in_history = |j: &JobRecord| j.owner == owner && j.status.is_terminal() && j.status != JobStatus::Expired && self.live_job(&j.id).is_none();
        let targets: Vec<JobRecord> = match ids {
            Some(ids) => {
                let mut targets = Vec::with_capacity(ids.len());
                for id in ids {
                    if let Some(job) = self.meta.get_job(&self.job_key(owner, id).await).await?
                        && in_history(&job)
                    {
                        targets.push(job);
                    }
                }
                targets
            }
            // The owner's whole history, a page at a time from the owner's
            // index (never a scan of every job); whole records re-read
            // (listings leave logs out).
            None => {
                let (mut ids, mut cursor) = (Vec::new(), None);
                loop {
                    let page = self.meta.list_jobs(Some(owner), cursor.as_deref(), MAX_HISTORY, LIST_SCAN_BUDGET, &in_history).await?;
                    ids.extend(page.jobs.into_iter().map(|j| j.id));
                    match page.next {
                        Some(next) => cursor = Some(next),
                        None => break,
                    }
                }
                let mut targets = Vec::with_capacity(ids.len());
                for id in &ids {
                    targets.extend(self.meta.get_job(id).await?);
                }
                targets
            }
        };
        if targets.is_empty() {
            return Ok(());
        }
        // As in a sweep: nothing older may be replayed over the deletions.
        self.meta.checkpoint().await?;
        let now = now_micros();
        for mut job in targets {
            self.drop_outputs(&mut job).await?;
            job.transition(JobStatus::Expired, now)?;
            job.progress = None;
            self.meta.put_job(&job).await?;
            self.finished.forget(&job.id);
        }
        self.meta.flush().await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::uploads::annotated;
    use super::*;

    #[test]
    fn load_image_names_may_carry_their_type() {
        assert_eq!(annotated("a.png"), ("input", "a.png"));
        assert_eq!(annotated("sub/a.png [temp]"), ("temp", "sub/a.png"));
        assert_eq!(annotated("a.png [output]"), ("output", "a.png"));
        assert_eq!(join_path("", "a.png"), "a.png");
        assert_eq!(join_path("x/y", "a.png"), "x/y/a.png");
    }
}
