//! The one mapping from failures to the wire: `{"error": {"code",
//! "message", "details"}}` with the spec's codes and statuses. Unexpected
//! failures become `upstream_error` with a generic message; the cause is
//! logged, never sent.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value as Json, json};

use crate::service::ServiceError;

/// An error response.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    pub details: Option<Box<Json>>,
    pub retry_after_s: Option<u64>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { status, code, message: message.into(), details: None, retry_after_s: None }
    }
    pub fn invalid_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", message)
    }
    pub fn invalid_workflow(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_workflow", message)
    }
    pub fn not_found() -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", "Not found.")
    }
    pub fn forbidden(message: &str) -> ApiError {
        ApiError::new(StatusCode::FORBIDDEN, "forbidden", message)
    }

    pub fn unauthorized(message: &str) -> ApiError {
        ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
    }
    pub fn payload_too_large(limit: u64) -> ApiError {
        ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", format!("The request body exceeds {limit} bytes."))
    }
    /// A request body that stopped arriving (`http_body_timeout_s`).
    pub fn request_timeout(after: std::time::Duration) -> ApiError {
        ApiError::new(StatusCode::REQUEST_TIMEOUT, "request_timeout", format!("The request body stalled for {} s.", after.as_secs()))
    }
    /// A connection over `max_connections` or `max_connections_per_ip`.
    pub fn too_many_connections() -> ApiError {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "too_many_connections",
            "The server is at its connection limit: only health checks are answered now. Retry shortly.",
        )
        .retry_after(1)
    }
    pub fn internal(cause: &dyn std::fmt::Display) -> ApiError {
        tracing::error!(error = %cause, "request failed");
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "upstream_error", "The server could not complete the request.")
    }
    pub fn with_details(mut self, details: Json) -> ApiError {
        self.details = Some(Box::new(details));
        self
    }
    pub fn retry_after(mut self, seconds: u64) -> ApiError {
        self.retry_after_s = Some(seconds);
        self
    }
}

impl From<ServiceError> for ApiError {
    fn from(e: ServiceError) -> ApiError {
        use StatusCode as S;
        let message = e.to_string();
        match e {
            ServiceError::InvalidRequest(_) => ApiError::invalid_request(message),
            ServiceError::InvalidWorkflow { details, .. } => {
                let err = ApiError::invalid_workflow(message);
                match details {
                    Some(d) => err.with_details(d),
                    None => err,
                }
            }
            ServiceError::WorkflowFormatUi => ApiError::new(S::UNPROCESSABLE_ENTITY, "workflow_format_ui", message),
            ServiceError::MissingAsset(ids) => ApiError::new(S::UNPROCESSABLE_ENTITY, "missing_asset", message).with_details(json!({ "missing_ids": ids })),
            ServiceError::IdempotencyKeyReuse => ApiError::new(S::UNPROCESSABLE_ENTITY, "idempotency_key_reuse", message),
            ServiceError::QueueFull { retry_after_s } => ApiError::new(S::TOO_MANY_REQUESTS, "queue_full", message).retry_after(retry_after_s),
            ServiceError::NotFound => ApiError::not_found(),
            ServiceError::InsufficientCredits => ApiError::new(S::PAYMENT_REQUIRED, "insufficient_credits", message),
            ServiceError::InactiveSubscription => ApiError::new(S::TOO_MANY_REQUESTS, "inactive_subscription", message),
            ServiceError::AccountDisabled => ApiError::new(S::FORBIDDEN, "forbidden", "This account is disabled."),
            ServiceError::HashMismatch { .. } => ApiError::new(S::CONFLICT, "hash_mismatch", message),
            ServiceError::BlobNotFound(_) => ApiError::new(S::NOT_FOUND, "blob_not_found", message),
            ServiceError::AssetInUse => ApiError::new(S::CONFLICT, "asset_in_use", "The asset is in use and cannot be deleted."),
            ServiceError::PayloadTooLarge { limit_bytes } => ApiError::payload_too_large(limit_bytes),
            ServiceError::TooManyStreams => ApiError::new(S::TOO_MANY_REQUESTS, "too_many_streams", message).retry_after(5),
            ServiceError::DeploymentNotReady { retry_after_s } => {
                ApiError::new(S::TOO_MANY_REQUESTS, "deployment_not_ready", message).retry_after(retry_after_s)
            }
            ServiceError::DeploymentStopped => ApiError::new(S::UNPROCESSABLE_ENTITY, "deployment_stopped", message),
            ServiceError::Store(crate::store::StoreError::TooLarge { limit }) => ApiError::payload_too_large(limit),
            ServiceError::Store(cause) => ApiError::internal(&cause),
            ServiceError::Transition(bug) => ApiError::internal(&bug),
        }
    }
}

impl From<crate::accounts::AccountError> for ApiError {
    fn from(e: crate::accounts::AccountError) -> ApiError {
        use crate::accounts::AccountError as A;
        let message = e.to_string();
        match e {
            A::InvalidName | A::InvalidTier | A::Overflow => ApiError::invalid_request(message),
            A::NameTaken(_) => ApiError::new(StatusCode::CONFLICT, "name_taken", message),
            A::TooMany => ApiError::new(StatusCode::CONFLICT, "too_many_accounts", message),
            A::NotFound(_) => ApiError::new(StatusCode::NOT_FOUND, "not_found", message),
            A::Store(cause) => ApiError::internal(&cause),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({ "error": { "code": self.code, "message": self.message, "details": self.details } });
        let mut response = (self.status, axum::Json(body)).into_response();
        if let Some(s) = self.retry_after_s {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        response
    }
}
