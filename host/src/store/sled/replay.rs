//! The commit log's entries as the sled store writes them, and their
//! replay when the store opens: each applied only where sled's record is
//! older, then the unfinished jobs' set follows each logged job.

use serde::Deserialize;

use super::{Sled, backend, encode};
use crate::store::{AssetRecord, IdempotencyClaim, JobRecord, JobStatus, StoreError};

/// A commit log entry (as [`Entry`] reads it back) assembled from fields
/// already encoded as JSON — mostly the bytes just written to sled — so a
/// record is not encoded twice. Kinds and names are plain identifiers.
pub(super) fn entry(kind: &str, fields: &[(&str, &[u8])]) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + kind.len() + fields.iter().map(|(n, v)| n.len() + v.len() + 4).sum::<usize>());
    out.extend_from_slice(b"{\"kind\":\"");
    out.extend_from_slice(kind.as_bytes());
    out.push(b'"');
    for (name, json) in fields {
        out.extend_from_slice(b",\"");
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b"\":");
        out.extend_from_slice(json);
    }
    out.push(b'}');
    out
}

/// A commit log entry, as read back.
#[derive(Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum Entry {
    Submitted { job: JobRecord, workflow: serde_json::Value, claim: Option<IdempotencyClaim> },
    Started { job: JobRecord },
    Finished { job: JobRecord, assets: Vec<AssetRecord> },
}

impl Sled {
    /// Applies the commit log's entries that did not reach sled before a
    /// crash, in order, each only where sled's record is older; then flushes
    /// sled and starts a new log cycle. A submission is applied when the job
    /// is missing; a start when the stored job is queued or running with
    /// fewer attempts; a finish when the stored job has not ended. The
    /// unfinished jobs' set (saved at the last checkpoint) then follows
    /// each logged job's stored record.
    pub(super) fn replay(&self, entries: Vec<Vec<u8>>) -> Result<(), StoreError> {
        let mut logged = Vec::new();
        for bytes in &entries {
            let Ok(entry) = serde_json::from_slice::<Entry>(bytes) else {
                tracing::warn!("skipping an unreadable commit log entry");
                continue;
            };
            match entry {
                Entry::Submitted { job, workflow, claim } => {
                    logged.push(job.id.clone());
                    if self.get_job(&job.id)?.is_none() {
                        tracing::info!(job_id = %job.id, "submission recovered from the commit log");
                        if let Some(claim) = claim {
                            self.index.new_claim(&claim)?;
                            self.claims.insert(claim.key.as_bytes(), encode(&claim)?).map_err(backend)?;
                        }
                        self.write_submission(&job, &encode(&job)?, &encode(&workflow)?)?;
                    }
                }
                Entry::Started { job } => {
                    let Some(stored) = self.get_job(&job.id)? else { continue };
                    let behind = matches!(stored.status, JobStatus::Queued | JobStatus::Running) && job.attempts > stored.attempts;
                    if behind {
                        tracing::info!(job_id = %job.id, attempt = job.attempts, "job start recovered from the commit log");
                        self.put_job(&job)?;
                    }
                }
                Entry::Finished { job, assets } => {
                    logged.push(job.id.clone());
                    let Some(stored) = self.get_job(&job.id)? else { continue };
                    if !stored.status.is_terminal() {
                        tracing::info!(job_id = %job.id, status = job.status.as_str(), "finished job recovered from the commit log");
                        for asset in &assets {
                            self.put_asset(asset)?;
                        }
                        self.put_job(&job)?;
                    }
                }
            }
        }
        for id in logged {
            match self.get_job(&id)? {
                Some(job) => self.index.settle(&job),
                None => self.index.settle_gone(&id),
            }
        }
        self.log.checkpoint(|| self.checkpoint_flush())
    }
}
