//! What the job service refuses, as types. The API edge maps each variant
//! to its wire code and status (`api::error`).

use crate::store::StoreError;

/// A refused or failed service operation.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// Malformed request (400 `invalid_request`).
    #[error("{0}")]
    InvalidRequest(String),
    /// The workflow cannot run (422 `invalid_workflow`); `details` per node.
    #[error("{message}")]
    InvalidWorkflow { message: String, details: Option<serde_json::Value> },
    /// A UI-format workflow (422 `workflow_format_ui`).
    #[error("this is a UI-format workflow (with `nodes` and `links`); submit the API format")]
    WorkflowFormatUi,
    /// `core/ASSET` references that are malformed, unknown or not the caller's.
    #[error("asset reference(s) not found: {}", .0.join(", "))]
    MissingAsset(Vec<String>),
    #[error("this Idempotency-Key was already used; poll or list your jobs instead of resubmitting")]
    IdempotencyKeyReuse,
    #[error("the queue is full; retry after {retry_after_s} s")]
    QueueFull { retry_after_s: u64 },
    #[error("not found")]
    NotFound,
    /// The caller's account's balance does not cover one more job beside
    /// its unfinished ones (402 `insufficient_credits`).
    #[error("the account's credits do not cover another job beside its unfinished ones; add credits, or wait for those to end, and submit again")]
    InsufficientCredits,
    /// The caller's subscription is inactive: the cloud's compatibility API
    /// runs no workflow (429).
    #[error("the account's subscription is not active")]
    InactiveSubscription,
    /// The caller's account was disabled (403 `forbidden`).
    #[error("this account is disabled")]
    AccountDisabled,
    #[error("the uploaded bytes hash to {actual}, not the expected {expected}")]
    HashMismatch { expected: String, actual: String },
    #[error("no blob with hash {0}")]
    BlobNotFound(String),
    #[error("the asset is an output of a retained job and cannot be deleted")]
    AssetInUse,
    /// An upload or from-hash naming an asset (its bytes already stored)
    /// that has `MAX_ASSET_TAGS` tags, with a tag it lacks (409 `too_many_tags`).
    #[error("asset {asset} already has {max} tags, the most an asset may have: it keeps them, and {tag:?} is not added")]
    TooManyTags { asset: String, max: usize, tag: String },
    #[error("the upload exceeds {limit_bytes} bytes")]
    PayloadTooLarge { limit_bytes: u64 },
    #[error("too many event streams are open; retry later")]
    TooManyStreams,
    /// The deployment's plugins are still loading (429 `deployment_not_ready`).
    #[error("the deployment is starting (its plugins are loading); retry after {retry_after_s} s")]
    DeploymentNotReady { retry_after_s: u64 },
    /// The deployment was stopped, or failed to load (422 `deployment_stopped`).
    #[error("the deployment is stopped; an operator must start it")]
    DeploymentStopped,
    /// A status change the job state machine refuses: a bug (500).
    #[error(transparent)]
    Transition(#[from] crate::store::IllegalTransition),
    /// Anything unexpected (500 `upstream_error`, never detailed on the wire).
    #[error("storage failure: {0}")]
    Store(#[from] StoreError),
}
