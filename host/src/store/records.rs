//! The records kiln persists: jobs, assets, idempotency claims, queue
//! entries and accounts. They are plain data (serde JSON in the metadata store), shaped
//! for the store rather than the wire; `api::v2::wire` renders them.

use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

pub use super::status::JobStatus;
use crate::codes::JobErrorCode;

/// Microseconds since the Unix epoch (UTC).
pub type Micros = i64;

/// Now, in [`Micros`].
pub fn now_micros() -> Micros {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_micros() as i64)
}

/// A progress snapshot (complete; re-syncs a client on its own).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ProgressSnapshot {
    pub value: f64,
    pub nodes_done: u64,
    pub nodes_total: u64,
    pub current_node: Option<String>,
    pub current_node_class: Option<String>,
    pub step: Option<u64>,
    pub steps: Option<u64>,
    pub message: Option<String>,
}

/// Why a job failed (`job.error`). `code` is stored as its wire name; a
/// name this build does not know loads as `internal_error` (`crate::codes`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = JobError)]
pub struct JobErrorRecord {
    pub code: JobErrorCode,
    pub message: String,
    pub node_id: Option<String>,
    pub class_type: Option<String>,
    pub traceback: Option<String>,
}

/// The captured plugin output of a finished job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobLogRecord {
    pub text: String,
    pub truncated: bool,
    pub captured_at: Micros,
}

/// One committed output of a job (an asset).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutputRecord {
    pub node_id: String,
    pub name: String,
    /// `image`, `video`, `audio`, `text`, `file` or `latent`.
    pub kind: String,
    pub content_type: String,
    pub size_bytes: u64,
    pub asset_id: String,
    /// `blake3:<hex>`.
    pub hash: String,
    /// The subfolder the node saved it in (ComfyUI's `subfolder`; empty:
    /// none). `None` on records stored before it was kept here: read from
    /// the output asset's `file_path` then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subfolder: Option<String>,
}

/// An input file of a job: the name nodes see and the blob behind it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobInput {
    pub name: String,
    pub hash: String,
}

/// A job as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobRecord {
    pub id: String,
    /// The caller that submitted it (assets it references must be theirs).
    pub owner: String,
    pub status: JobStatus,
    pub created_at: Micros,
    pub started_at: Option<Micros>,
    pub completed_at: Option<Micros>,
    pub updated_at: Micros,
    pub expires_at: Micros,
    /// Position in the queue order (smaller runs first).
    pub seq: u64,
    /// How many times execution began (a restart during a run re-queues once).
    pub attempts: u32,
    pub inputs: Vec<JobInput>,
    pub outputs: Vec<OutputRecord>,
    pub error: Option<JobErrorRecord>,
    pub progress: Option<ProgressSnapshot>,
    pub logs: Option<JobLogRecord>,
    pub queue_ms: Option<i64>,
    pub execution_ms: Option<i64>,
    /// Label map given at submission (`metadata`).
    #[serde(default)]
    pub metadata: Option<serde_json::Map<String, Json>>,
    /// Which API surface submitted it (`v2` or `compat`).
    #[serde(default)]
    pub surface: String,
    /// It was submitted with `extra_data` (which is never stored): it cannot
    /// run again after a restart.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub had_extra_data: bool,
    /// It was submitted with `extra_pnginfo`, which its host holds in
    /// memory alone (see `ExtraData`): where hosts share a store, it stays
    /// on that host while it waits.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pnginfo_held: bool,
    /// ComfyUI's queue fields, for jobs queued through the compatibility
    /// API (`POST /api/prompt`); other jobs show their `seq` as number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compat: Option<CompatFields>,
    /// The serverless deployment it was submitted to: its
    /// scheduling key and allowed node classes are the deployment's, and
    /// its `logs` are shown on read (unless the deployment is a public demo).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deployment: Option<String>,
    /// Ran on a public demo deployment: its log is stored, never shown.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub logs_withheld: bool,
    /// The components it was validated against when submitted, then those
    /// its run used (the same unless this host's plugins changed between):
    /// plugin name → `blake3:<hex>` of the component; what reproduces it.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub components: std::collections::BTreeMap<String, String>,
    /// `blake3:<hex>` of the bundle whose components it ran (a job of a
    /// deployment created from a bundle), set with `components`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bundle: Option<String>,
}

/// The store key of a job whose client-chosen id `id` another owner's job
/// already holds: `{id}~{16 hex digits of blake3(owner)}`. Client-chosen ids
/// are unique per owner, not per server: the second owner's job is stored
/// under this key, and answers to its owner as `id` everywhere
/// ([`public_job_id`]). No client can name the key itself (ids on the wire
/// are UUIDs), and no answer shows it, so an owner never learns that
/// another chose the same id.
pub fn scoped_job_key(owner: &str, id: &str) -> String {
    format!("{id}~{}", &blake3::hash(owner.as_bytes()).to_hex()[..16])
}

/// Whether `key` is a job's store key: a UUID, or a UUID scoped to its
/// owner ([`scoped_job_key`]: `~` and 16 lowercase hex digits).
pub fn is_job_key(key: &str) -> bool {
    let (id, scope) = match key.split_once('~') {
        Some((id, scope)) => (id, Some(scope)),
        None => (key, None),
    };
    uuid::Uuid::parse_str(id).is_ok() && scope.is_none_or(|s| s.len() == 16 && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
}

/// The id a job (store key `key`) is known by on the wire: the key without
/// its owner scope ([`scoped_job_key`]).
pub fn public_job_id(key: &str) -> &str {
    key.split_once('~').map_or(key, |(id, _)| id)
}

/// The scheduling key of a job of `owner` (in `deployment`, if any): the
/// deployment's (`deployment/ID`), whose limits are the deployment's, else
/// its owner's. Queues, limits and fair turns go by it.
pub fn sched_key(owner: &str, deployment: Option<&str>) -> String {
    match deployment {
        Some(d) => format!("deployment/{d}"),
        None => owner.to_string(),
    }
}

impl JobRecord {
    /// Its scheduling key (see [`sched_key`]).
    pub fn sched_key(&self) -> String {
        sched_key(&self.owner, self.deployment.as_deref())
    }

    /// The id its owner knows the job by (see [`public_job_id`]).
    pub fn public_id(&self) -> &str {
        public_job_id(&self.id)
    }

    /// The component hashes a host must have to take this job over from
    /// another (see `store::cluster::Runnable`): its recorded components,
    /// except for the job of a deployment made from a bundle, which pins
    /// them already (a host runs that deployment with exactly those or not
    /// at all).
    pub fn takeover_needs(&self) -> Vec<String> {
        if self.bundle.is_some() { Vec::new() } else { self.components.values().cloned().collect() }
    }

    /// Whether another host may take it from its host's queue: not when
    /// its host holds something of it in memory alone (its `extra_data`).
    pub fn movable(&self) -> bool {
        !self.had_extra_data && !self.pnginfo_held
    }
}

/// What `POST /api/prompt` gave a job besides its workflow.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompatFields {
    /// The queue priority ComfyUI echoes (an integer from the counter, or
    /// the client's own number, kept as given: `5` or `7.5`).
    pub number: serde_json::Number,
    /// The submitting client's session id (`client_id`), if it gave one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_id: Option<String>,
}

/// One account (cloud and serverless servers; see `accounts`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Account {
    /// `acct_` and 32 hex digits: the `owner` of its jobs and assets.
    pub id: String,
    /// Unique, chosen by the operator: letters, digits, `-`, `_`, `.`.
    pub name: String,
    /// Its API keys, as hex of their keyed hashes (never the keys).
    pub key_hashes: Vec<String>,
    /// Balance in credits; may go negative by what running jobs cost beyond
    /// the minimum price each held (`accounts::Pricing::admits`).
    pub credits: i64,
    /// The tier's name (its limits are the scheduler's business).
    pub tier: String,
    /// Whether its subscription is active (the cloud's compatibility API
    /// runs workflows only then).
    pub subscription_active: bool,
    /// A disabled account's keys answer 403.
    pub disabled: bool,
    pub created_at: Micros,
}

#[cfg(test)]
impl JobRecord {
    /// A queued job with nothing in it, for unit tests.
    pub fn queued_for_test(id: &str, created: Micros, seq: u64) -> JobRecord {
        JobRecord {
            id: id.into(),
            owner: "local".into(),
            status: JobStatus::Queued,
            created_at: created,
            started_at: None,
            completed_at: None,
            updated_at: created,
            expires_at: created + 1_000,
            seq,
            attempts: 0,
            inputs: vec![],
            outputs: vec![],
            error: None,
            progress: None,
            logs: None,
            queue_ms: None,
            execution_ms: None,
            metadata: None,
            surface: "v2".into(),
            had_extra_data: false,
            pnginfo_held: false,
            compat: None,
            deployment: None,
            logs_withheld: false,
            components: Default::default(),
            bundle: None,
        }
    }
}

/// An asset: a UUID-named record over a content-addressed blob.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AssetRecord {
    pub id: String,
    pub owner: String,
    /// `blake3:<hex>`.
    pub hash: String,
    pub size_bytes: u64,
    pub content_type: String,
    pub file_path: Option<String>,
    pub created_at: Micros,
    /// Retention deadline of the record (outputs: their job's); `None` never expires.
    pub expires_at: Option<Micros>,
    /// The job that produced it (outputs only).
    pub job_id: Option<String>,
    /// The node that produced it (outputs only).
    #[serde(default)]
    pub node_id: Option<String>,
    /// The caller's labels (uploads and mints).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
}

/// An Idempotency-Key claim.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IdempotencyClaim {
    pub key: String,
    pub owner: String,
    pub job_id: Option<String>,
    pub claimed_at: Micros,
    pub expires_at: Micros,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scoped_key_is_a_job_key_and_answers_by_its_id() {
        let id = "0190d0b4-0000-7000-8000-000000000001";
        let scoped = scoped_job_key("alice", id);
        assert!(is_job_key(id) && is_job_key(&scoped));
        assert_eq!(public_job_id(&scoped), id);
        for bad in ["", "x", &format!("{id}~"), &format!("{id}~zzzzzzzzzzzzzzzz"), &format!("{id}~0123"), "~0123456789abcdef"] {
            assert!(!is_job_key(bad), "{bad}");
        }
    }
}
