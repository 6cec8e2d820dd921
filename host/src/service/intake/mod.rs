//! Admission: the one path a submission takes, from either surface, to a
//! queued job, and every rule it meets on the way, each applied once:
//!
//! 1. before the body is parsed ([`Service::check_key`],
//!    [`Service::admit_body`]): a claimed Idempotency-Key is refused; the
//!    body's size and count of JSON values are checked on the bytes; its
//!    parse waits for room in the intake memory budget;
//! 2. once the handler has parsed the wire format into a [`Submission`]
//!    ([`Service::admit`]): the subscription (the hosted cloud runs
//!    compatibility prompts for an active subscription only), the UI
//!    format, the deployment serving it, asset references and named
//!    uploads (`assets`), parse and validation under the submission's
//!    [`OutputPolicy`] (`plan`), then funds, queue bounds, the id, the
//!    account's state, the key's own limits and the durable write with the
//!    idempotency claim (`enqueue`).
//!
//! Errors are typed ([`SubmitError`]); each surface maps them to its own
//! bodies (the Jobs API's envelope, ComfyUI's rejections).

mod assets;
mod enqueue;
mod plan;

use serde_json::Value as Json;

pub use assets::ASSET_TYPE;
pub(super) use enqueue::AdmissionTurns;
pub(super) use plan::plan;

use super::{ExtraData, Service, ServiceError, memory_gate};
use crate::store::{CompatFields, JobRecord, now_micros};
use crate::workflow::{Issue, JsonCost, ParseError, ValidationError};

/// How long an Idempotency-Key stays claimed.
pub const IDEMPOTENCY_TTL: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// The surface a submission came through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Surface {
    /// The Jobs API (`POST /api/v2/jobs`).
    V2,
    /// The ComfyUI compatibility API (`POST /api/prompt`).
    Compat,
}

impl Surface {
    /// The name stored on the job record.
    pub fn as_str(self) -> &'static str {
        match self {
            Surface::V2 => "v2",
            Surface::Compat => "compat",
        }
    }
}

/// What happens to output nodes that fail validation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputPolicy {
    /// Any failure refuses the job (the Jobs API).
    AllOrNothing,
    /// Failing outputs are dropped (and reported) as long as one remains;
    /// they leave the stored graph too (ComfyUI's `/prompt`).
    DropFailing,
}

/// A job submission, already parsed from the wire.
pub struct Submission {
    /// The API-format graph, verbatim (asset references unresolved).
    pub workflow: Json,
    pub extra: ExtraData,
    pub idempotency_key: Option<String>,
    pub metadata: Option<serde_json::Map<String, Json>>,
    pub owner: String,
    pub surface: Surface,
    /// What failing outputs do.
    pub outputs: OutputPolicy,
    /// Whether plain input names (`LoadImage`'s `image`: `name`,
    /// `sub/name`, `name [input]`) name the owner's ComfyUI-style uploads.
    pub named_uploads: bool,
    /// The job id the client chose (ComfyUI's `prompt_id`, a canonical
    /// UUID checked at the edge); `None`: a fresh one.
    pub id: Option<String>,
    /// Queue it ahead of every queued job (ComfyUI's `front`).
    pub front: bool,
    /// ComfyUI's queue fields (compatibility submissions).
    pub compat: Option<CompatFields>,
    /// The serverless deployment it was submitted to, if any.
    pub deployment: Option<String>,
}

impl Submission {
    /// A Jobs API submission of `workflow` by `owner` (all outputs must
    /// validate; nothing else set).
    pub fn v2(owner: impl Into<String>, workflow: Json) -> Submission {
        Submission {
            workflow,
            extra: ExtraData::default(),
            idempotency_key: None,
            metadata: None,
            owner: owner.into(),
            surface: Surface::V2,
            outputs: OutputPolicy::AllOrNothing,
            named_uploads: false,
            id: None,
            front: false,
            compat: None,
            deployment: None,
        }
    }

    /// A compatibility API prompt: failing outputs dropped, uploads found
    /// by name.
    pub fn compat(owner: impl Into<String>, workflow: Json, fields: CompatFields) -> Submission {
        Submission {
            surface: Surface::Compat,
            outputs: OutputPolicy::DropFailing,
            named_uploads: true,
            compat: Some(fields),
            ..Submission::v2(owner, workflow)
        }
    }
}

/// A queued job.
#[derive(Debug)]
pub struct Admitted {
    pub record: JobRecord,
    /// 1-based position among its owner's queued jobs.
    pub position: Option<usize>,
    /// Outputs dropped under [`OutputPolicy::DropFailing`], with why.
    pub dropped: Vec<Issue>,
    /// The job starts once this is dropped: a caller drops it when its
    /// answer is made (see `StartGate`).
    pub start: Option<crate::service::StartGate>,
}

/// Why a submission was not queued.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    /// The graph cannot be read (not an object, too large, a bad node).
    #[error(transparent)]
    Unreadable(ParseError),
    /// Validation: an unknown class, no output, or failing outputs.
    #[error(transparent)]
    Invalid(ValidationError),
    /// Any other rule (funds, a full queue, a taken id, a store failure).
    #[error(transparent)]
    Refused(#[from] ServiceError),
}

/// The Jobs API's view: parse and validation failures are
/// `invalid_workflow` (with `details.node_errors` per node).
impl From<SubmitError> for ServiceError {
    fn from(e: SubmitError) -> ServiceError {
        match e {
            SubmitError::Unreadable(ParseError::UiFormat) => ServiceError::WorkflowFormatUi,
            SubmitError::Unreadable(e) => ServiceError::InvalidWorkflow { message: e.to_string(), details: None },
            SubmitError::Invalid(e) => plan::invalid_workflow(e),
            SubmitError::Refused(e) => e,
        }
    }
}

/// What admitting a submission of this shape may hold at once: its parsed
/// tree, the validated graph's copies of its constants (at most as much
/// again), the body and its encoding for the store.
pub fn intake_estimate(cost: JsonCost) -> u64 {
    cost.tree_bytes().saturating_mul(2).saturating_add(cost.bytes.saturating_mul(2))
}

impl Service {
    /// Where `owner`'s Idempotency-Key `key` is claimed: each account has
    /// its own keys (one account's key never blocks, or reveals, another's).
    /// The one owner of a self-hosted server keeps the bare key (claims
    /// stored by earlier versions stay valid). Header values hold no `\n`.
    fn claim_key(&self, owner: &str, key: &str) -> String {
        if owner == self.opts.owner { key.to_string() } else { format!("{owner}\n{key}") }
    }

    /// Refuses an Idempotency-Key of `owner` that a live claim holds (a
    /// used key is refused whatever else the request holds; the claim
    /// itself is made atomically with the job's record).
    pub async fn check_key(&self, owner: &str, key: &str) -> Result<(), ServiceError> {
        match self.meta.get_claim(&self.claim_key(owner, key)).await? {
            Some(claim) if claim.expires_at > now_micros() => Err(ServiceError::IdempotencyKeyReuse),
            _ => Ok(()),
        }
    }

    /// Admits a submission's body to be parsed: checks its size and its
    /// count of JSON values (`max_workflow_kb`, `max_workflow_values`) on
    /// the bytes, then waits until the memory its parsing may take fits in
    /// the intake budget (`intake_memory_mb`). Parse and admit while the
    /// permit is held.
    pub async fn admit_body(&self, body: &[u8]) -> Result<memory_gate::GatePermit, ServiceError> {
        let cost = self.opts.workflow_limits.check_text(body).map_err(|e| ServiceError::InvalidWorkflow { message: e.to_string(), details: None })?;
        self.intake.enter(intake_estimate(cost)).await.map_err(|e| ServiceError::PayloadTooLarge { limit_bytes: e.total })
    }

    /// Applies every rule to a submission and queues its job: durable and
    /// queued when this returns. Validation runs on the calling thread (a
    /// large graph's caller runs this on the blocking pool).
    pub async fn admit(&self, mut sub: Submission) -> Result<Admitted, SubmitError> {
        if sub.surface == Surface::Compat {
            self.check_subscription(&sub)?;
        }
        if let Some(map) = sub.workflow.as_object()
            && crate::workflow::is_ui_format(map)
        {
            return Err(ServiceError::WorkflowFormatUi.into());
        }
        let registry = match &sub.deployment {
            None => self.registry_for(&sub.owner),
            Some(id) => self.deployment_serving(id)?.registry.clone(),
        };
        let (workflow, inputs) = self.resolve_inputs(&mut sub).await?;
        let (mut workflow, inputs) = (workflow, inputs);
        let files = super::job_files::JobInputs::new(&inputs, self.blobs.clone());
        let (plan, dropped) = plan(&workflow, &registry, &files, &self.opts.workflow_limits, sub.outputs)?;
        // The dropped outputs leave the stored graph: it is what the queue
        // and history show (`outputs_to_execute`: the ones that run), and
        // what a restart validates again, all or nothing.
        if let Some(nodes) = workflow.as_object_mut() {
            for output in dropped.iter().flat_map(|i| i.dependent_outputs.iter()) {
                nodes.shift_remove(output);
            }
        }
        let (record, position, start) = self.enqueue(sub, workflow, inputs, (plan, registry)).await?;
        Ok(Admitted { record, position: Some(position), dropped, start: Some(start) })
    }

    /// The hosted cloud runs workflows of the compatibility API only for an
    /// active subscription; the account's sockets hear why (the prompt id
    /// is the one asked for, or a fresh one no job will have).
    fn check_subscription(&self, sub: &Submission) -> Result<(), ServiceError> {
        if self.opts.mode != crate::config::Mode::Cloud || self.accounts.subscription_active(&sub.owner) {
            return Ok(());
        }
        let id = sub.id.clone().unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
        let body = super::bus::ExecBody::Failed {
            node: None,
            class_type: None,
            code: crate::codes::JobErrorCode::InactiveSubscription,
            message: ServiceError::InactiveSubscription.to_string(),
            executed: Vec::new(),
            at_ms: super::bus::now_ms(),
        };
        self.bus.job(&std::sync::Arc::from(id.as_str()), &std::sync::Arc::from(sub.owner.as_str()), body);
        Err(ServiceError::InactiveSubscription)
    }

    /// The submission's graph with its asset references resolved, and the
    /// files the job reads: those references, and (when asked) the uploads
    /// its nodes name.
    async fn resolve_inputs(&self, sub: &mut Submission) -> Result<(Json, Vec<crate::store::JobInput>), ServiceError> {
        let resolved = assets::resolve_assets(std::mem::take(&mut sub.workflow), self.meta.as_ref(), &sub.owner, now_micros()).await?;
        let mut inputs = resolved.inputs;
        if sub.named_uploads {
            let named = self.uploads_named_in(&sub.owner, &resolved.workflow, &inputs)?;
            inputs.extend(named);
        }
        Ok((resolved.workflow, inputs))
    }
}
