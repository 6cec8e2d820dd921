//! The one mapping from failures to the wire: `{"error": {"code",
//! "message", "details"}}` with the spec's codes and statuses. Unexpected
//! failures become `upstream_error` with a generic message; the cause is
//! logged, never sent.
//!
//! Every code an API error can carry is an [`ApiCode`], and its status and
//! wire name come from one table ([`ApiCode::parts`]). A surface may answer
//! with another status than the code's own (the compatibility API's 400
//! for the Jobs API's 422), never with another code name.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value as Json, json};

use crate::service::ServiceError;

crate::codes::code_table! {
    /// The code of an API error (`error.code` of the envelope; the `error`
    /// of the plugin routes' `{error, message}`). Jobs API codes:
    /// service-interface.md ("Jobs API error envelope codes") and
    /// v2-contract.md 9; the others are kiln's, for what the spec does not
    /// name.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub enum ApiCode {
        InvalidRequest => (StatusCode::BAD_REQUEST, "invalid_request"),
        InvalidCursor => (StatusCode::BAD_REQUEST, "invalid_cursor"),
        InvalidMetadataFilter => (StatusCode::BAD_REQUEST, "invalid_metadata_filter"),
        Unauthorized => (StatusCode::UNAUTHORIZED, "unauthorized"),
        InsufficientCredits => (StatusCode::PAYMENT_REQUIRED, "insufficient_credits"),
        Forbidden => (StatusCode::FORBIDDEN, "forbidden"),
        NotFound => (StatusCode::NOT_FOUND, "not_found"),
        BlobNotFound => (StatusCode::NOT_FOUND, "blob_not_found"),
        MethodNotAllowed => (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed"),
        /// A request body that stopped arriving.
        RequestTimeout => (StatusCode::REQUEST_TIMEOUT, "request_timeout"),
        HashMismatch => (StatusCode::CONFLICT, "hash_mismatch"),
        AssetInUse => (StatusCode::CONFLICT, "asset_in_use"),
        /// The asset an upload's bytes name already has its most tags.
        TooManyTags => (StatusCode::CONFLICT, "too_many_tags"),
        NameTaken => (StatusCode::CONFLICT, "name_taken"),
        TooManyAccounts => (StatusCode::CONFLICT, "too_many_accounts"),
        /// An account at its `max_plugins_per_account`.
        TooManyPlugins => (StatusCode::CONFLICT, "too_many_plugins"),
        DeploymentExists => (StatusCode::CONFLICT, "deployment_exists"),
        /// A user file that already exists (compatibility `/userdata`).
        Conflict => (StatusCode::CONFLICT, "conflict"),
        PayloadTooLarge => (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large"),
        RangeNotSatisfiable => (StatusCode::RANGE_NOT_SATISFIABLE, "range_not_satisfiable"),
        InvalidWorkflow => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_workflow"),
        WorkflowFormatUi => (StatusCode::UNPROCESSABLE_ENTITY, "workflow_format_ui"),
        MissingAsset => (StatusCode::UNPROCESSABLE_ENTITY, "missing_asset"),
        IdempotencyKeyReuse => (StatusCode::UNPROCESSABLE_ENTITY, "idempotency_key_reuse"),
        DeploymentStopped => (StatusCode::UNPROCESSABLE_ENTITY, "deployment_stopped"),
        /// A plugin the host would not load (compile failure, an import its
        /// manifest does not declare, a class or route already taken).
        PluginRefused => (StatusCode::UNPROCESSABLE_ENTITY, "plugin_refused"),
        /// A bundle that is damaged or altered (a file not matching its
        /// hash), or whose components the host cannot load (each named).
        BundleRefused => (StatusCode::UNPROCESSABLE_ENTITY, "bundle_refused"),
        MetadataInvalid => (StatusCode::UNPROCESSABLE_ENTITY, "metadata_invalid"),
        QueueFull => (StatusCode::TOO_MANY_REQUESTS, "queue_full"),
        DeploymentNotReady => (StatusCode::TOO_MANY_REQUESTS, "deployment_not_ready"),
        TooManyStreams => (StatusCode::TOO_MANY_REQUESTS, "too_many_streams"),
        /// The compatibility API's 429 (service-interface.md: "Subscription inactive").
        InactiveSubscription => (StatusCode::TOO_MANY_REQUESTS, "inactive_subscription"),
        /// Any unexpected failure: a generic message, the cause only logged.
        UpstreamError => (StatusCode::INTERNAL_SERVER_ERROR, "upstream_error"),
        /// A plugin route whose call failed (plugin routes only).
        InternalError => (StatusCode::INTERNAL_SERVER_ERROR, "internal_error"),
        /// A connection over the server's connection limits.
        TooManyConnections => (StatusCode::SERVICE_UNAVAILABLE, "too_many_connections"),
        /// A plugin route past its time limit (plugin routes only).
        Timeout => (StatusCode::GATEWAY_TIMEOUT, "timeout"),
        /// The server's disk is full (an upload's bytes), or the
        /// compatibility `/userdata` store is.
        StorageFull => (StatusCode::INSUFFICIENT_STORAGE, "storage_full"),
    }
    /// The code's HTTP status and wire name.
    fn parts -> (StatusCode, &'static str);
}

impl ApiCode {
    /// The code's own HTTP status.
    pub const fn status(self) -> StatusCode {
        self.parts().0
    }
    /// The wire name (`error.code`).
    pub const fn as_str(self) -> &'static str {
        self.parts().1
    }
}

impl std::fmt::Display for ApiCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An error response.
#[derive(Debug)]
pub struct ApiError {
    /// The code's status unless a surface answers otherwise.
    pub status: StatusCode,
    pub code: ApiCode,
    pub message: String,
    pub details: Option<Box<Json>>,
    pub retry_after_s: Option<u64>,
}

impl ApiError {
    /// An error with `code`, answered with the code's status.
    pub fn new(code: ApiCode, message: impl Into<String>) -> ApiError {
        ApiError { status: code.status(), code, message: message.into(), details: None, retry_after_s: None }
    }
    pub fn invalid_request(message: impl Into<String>) -> ApiError {
        ApiError::new(ApiCode::InvalidRequest, message)
    }
    pub fn invalid_workflow(message: impl Into<String>) -> ApiError {
        ApiError::new(ApiCode::InvalidWorkflow, message)
    }
    pub fn not_found() -> ApiError {
        ApiError::new(ApiCode::NotFound, "Not found.")
    }
    pub fn forbidden(message: &str) -> ApiError {
        ApiError::new(ApiCode::Forbidden, message)
    }

    pub fn unauthorized(message: &str) -> ApiError {
        ApiError::new(ApiCode::Unauthorized, message)
    }
    pub fn payload_too_large(limit: u64) -> ApiError {
        ApiError::new(ApiCode::PayloadTooLarge, format!("The request body exceeds {limit} bytes."))
    }
    /// A request body that stopped arriving (`http_body_timeout_s`).
    pub fn request_timeout(after: std::time::Duration) -> ApiError {
        ApiError::new(ApiCode::RequestTimeout, format!("The request body stalled for {} s.", after.as_secs()))
    }
    /// A connection over `max_connections` or `max_connections_per_ip`.
    pub fn too_many_connections() -> ApiError {
        ApiError::new(ApiCode::TooManyConnections, "The server is at its connection limit: only health checks are answered now. Retry shortly.").retry_after(1)
    }
    /// The disk (or a quota) is full: 507 `storage_full`, the cause logged.
    pub fn storage_full(cause: &dyn std::fmt::Display) -> ApiError {
        tracing::error!(error = %cause, "request failed: no space left to store it");
        ApiError::new(ApiCode::StorageFull, "The server has no space left to store this. Try again later.")
    }
    pub fn internal(cause: &dyn std::fmt::Display) -> ApiError {
        tracing::error!(error = %cause, "request failed");
        ApiError::new(ApiCode::UpstreamError, "The server could not complete the request.")
    }
    /// A file the server could not write or read: 507 `storage_full` when
    /// the disk or a quota is full, else 500 `upstream_error` (the cause
    /// logged, never sent).
    pub fn io(cause: &std::io::Error) -> ApiError {
        match disk_full(cause) {
            true => ApiError::storage_full(cause),
            false => ApiError::internal(cause),
        }
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
        use ApiCode as C;
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
            ServiceError::WorkflowFormatUi => ApiError::new(C::WorkflowFormatUi, message),
            ServiceError::MissingAsset(ids) => ApiError::new(C::MissingAsset, message).with_details(json!({ "missing_ids": ids })),
            ServiceError::IdempotencyKeyReuse => ApiError::new(C::IdempotencyKeyReuse, message),
            ServiceError::QueueFull { retry_after_s } => ApiError::new(C::QueueFull, message).retry_after(retry_after_s),
            ServiceError::NotFound => ApiError::not_found(),
            ServiceError::InsufficientCredits => ApiError::new(C::InsufficientCredits, message),
            ServiceError::InactiveSubscription => ApiError::new(C::InactiveSubscription, message),
            ServiceError::AccountDisabled => ApiError::forbidden("This account is disabled."),
            ServiceError::HashMismatch { .. } => ApiError::new(C::HashMismatch, message),
            ServiceError::BlobNotFound(_) => ApiError::new(C::BlobNotFound, message),
            ServiceError::AssetInUse => ApiError::new(C::AssetInUse, "The asset is in use and cannot be deleted."),
            ServiceError::TooManyTags { .. } => ApiError::new(C::TooManyTags, message),
            ServiceError::PayloadTooLarge { limit_bytes } => ApiError::payload_too_large(limit_bytes),
            ServiceError::TooManyStreams => ApiError::new(C::TooManyStreams, message).retry_after(5),
            ServiceError::DeploymentNotReady { retry_after_s } => ApiError::new(C::DeploymentNotReady, message).retry_after(retry_after_s),
            ServiceError::DeploymentStopped => ApiError::new(C::DeploymentStopped, message),
            ServiceError::Store(crate::store::StoreError::TooLarge { limit }) => ApiError::payload_too_large(limit),
            ServiceError::Store(crate::store::StoreError::Io(cause)) => ApiError::io(&cause),
            ServiceError::Store(cause) => ApiError::internal(&cause),
            ServiceError::Transition(bug) => ApiError::internal(&bug),
        }
    }
}

/// Whether an I/O error says the disk or a quota is full.
fn disk_full(e: &std::io::Error) -> bool {
    matches!(e.kind(), std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded)
}

impl From<crate::accounts::AccountError> for ApiError {
    fn from(e: crate::accounts::AccountError) -> ApiError {
        use crate::accounts::AccountError as A;
        let message = e.to_string();
        match e {
            A::InvalidName | A::InvalidTier | A::Overflow => ApiError::invalid_request(message),
            A::NameTaken(_) => ApiError::new(ApiCode::NameTaken, message),
            A::TooMany => ApiError::new(ApiCode::TooManyAccounts, message),
            A::NotFound(_) => ApiError::new(ApiCode::NotFound, message),
            A::Store(cause) => ApiError::internal(&cause),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({ "error": { "code": self.code.as_str(), "message": self.message, "details": self.details } });
        let mut response = (self.status, axum::Json(body)).into_response();
        if let Some(s) = self.retry_after_s {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The status and the JSON body of an error's response.
    async fn rendered(err: ApiError) -> (StatusCode, Option<u64>, Json) {
        let response = err.into_response();
        let status = response.status();
        let retry = response.headers().get(header::RETRY_AFTER).map(|v| v.to_str().unwrap().parse().unwrap());
        assert_eq!(response.headers().get(header::CONTENT_TYPE).unwrap(), "application/json");
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
        (status, retry, serde_json::from_slice(&bytes).unwrap())
    }

    #[test]
    fn every_code_has_one_snake_case_name_and_an_error_status() {
        let mut seen = std::collections::HashSet::new();
        for &code in ApiCode::ALL {
            let name = code.as_str();
            assert!(!name.is_empty() && name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'), "{name}");
            assert!(seen.insert(name), "{name} twice");
            // The name leads back to the code: the round trip.
            assert_eq!(ApiCode::ALL.iter().find(|c| c.as_str() == name), Some(&code));
            assert!(code.status().is_client_error() || code.status().is_server_error(), "{name}: {}", code.status());
            assert_eq!(code.to_string(), name);
        }
    }

    /// service-interface.md's table of Jobs API codes, and the codes
    /// v2-contract.md 9 adds, each with its status.
    #[test]
    fn codes_have_the_specs_statuses() {
        let spec: &[(&str, u16)] = &[
            ("invalid_workflow", 422),
            ("workflow_format_ui", 422),
            ("missing_asset", 422),
            ("idempotency_key_reuse", 422),
            ("hash_mismatch", 409),
            ("blob_not_found", 404),
            ("queue_full", 429),
            ("insufficient_credits", 402),
            ("not_found", 404),
            ("unauthorized", 401),
            ("forbidden", 403),
            ("deployment_not_ready", 429),
            ("deployment_stopped", 422),
            ("upstream_error", 500),
            ("invalid_request", 400),
            ("asset_in_use", 409),
            ("too_many_streams", 429),
            ("payload_too_large", 413),
            ("metadata_invalid", 422),
            ("invalid_metadata_filter", 400),
            ("invalid_cursor", 400),
        ];
        for &(name, status) in spec {
            let code = ApiCode::ALL.iter().find(|c| c.as_str() == name).unwrap_or_else(|| panic!("no code {name}"));
            assert_eq!(code.status().as_u16(), status, "{name}");
        }
    }

    /// Every code answers `{"error": {"code", "message", "details"}}` and
    /// nothing else, with the code's status.
    #[tokio::test]
    async fn every_code_answers_the_envelope() {
        for &code in ApiCode::ALL {
            let (status, retry, body) = rendered(ApiError::new(code, "human text")).await;
            assert_eq!(status, code.status(), "{code}");
            assert_eq!(retry, None);
            assert_eq!(body, json!({ "error": { "code": code.as_str(), "message": "human text", "details": null } }), "{code}");
        }
        let err = ApiError::new(ApiCode::QueueFull, "full").with_details(json!({ "depth": 3 })).retry_after(7);
        let (status, retry, body) = rendered(err).await;
        assert_eq!((status, retry), (StatusCode::TOO_MANY_REQUESTS, Some(7)));
        assert_eq!(body, json!({ "error": { "code": "queue_full", "message": "full", "details": { "depth": 3 } } }));
    }

    #[tokio::test]
    async fn service_errors_map_to_their_codes() {
        use crate::store::StoreError;
        let cases: Vec<(ServiceError, ApiCode, Option<u64>)> = vec![
            (ServiceError::InvalidRequest("bad".into()), ApiCode::InvalidRequest, None),
            (ServiceError::InvalidWorkflow { message: "bad".into(), details: None }, ApiCode::InvalidWorkflow, None),
            (ServiceError::WorkflowFormatUi, ApiCode::WorkflowFormatUi, None),
            (ServiceError::MissingAsset(vec!["a".into()]), ApiCode::MissingAsset, None),
            (ServiceError::IdempotencyKeyReuse, ApiCode::IdempotencyKeyReuse, None),
            (ServiceError::QueueFull { retry_after_s: 3 }, ApiCode::QueueFull, Some(3)),
            (ServiceError::NotFound, ApiCode::NotFound, None),
            (ServiceError::InsufficientCredits, ApiCode::InsufficientCredits, None),
            (ServiceError::InactiveSubscription, ApiCode::InactiveSubscription, None),
            (ServiceError::AccountDisabled, ApiCode::Forbidden, None),
            (ServiceError::HashMismatch { expected: "a".into(), actual: "b".into() }, ApiCode::HashMismatch, None),
            (ServiceError::BlobNotFound("h".into()), ApiCode::BlobNotFound, None),
            (ServiceError::AssetInUse, ApiCode::AssetInUse, None),
            (ServiceError::TooManyTags { asset: "a".into(), max: 64, tag: "t".into() }, ApiCode::TooManyTags, None),
            (ServiceError::PayloadTooLarge { limit_bytes: 8 }, ApiCode::PayloadTooLarge, None),
            (ServiceError::TooManyStreams, ApiCode::TooManyStreams, Some(5)),
            (ServiceError::DeploymentNotReady { retry_after_s: 2 }, ApiCode::DeploymentNotReady, Some(2)),
            (ServiceError::DeploymentStopped, ApiCode::DeploymentStopped, None),
            (ServiceError::Store(StoreError::TooLarge { limit: 8 }), ApiCode::PayloadTooLarge, None),
            (ServiceError::Store(StoreError::Backend("/secret/path".into())), ApiCode::UpstreamError, None),
            (ServiceError::Store(StoreError::Io(std::io::Error::new(std::io::ErrorKind::StorageFull, "/secret/path"))), ApiCode::StorageFull, None),
            (ServiceError::Store(StoreError::Io(std::io::Error::new(std::io::ErrorKind::QuotaExceeded, "/secret/path"))), ApiCode::StorageFull, None),
            (ServiceError::Store(StoreError::Io(std::io::Error::new(std::io::ErrorKind::ReadOnlyFilesystem, "/secret/path"))), ApiCode::UpstreamError, None),
        ];
        for (e, code, retry_after) in cases {
            let what = format!("{e:?}");
            let err = ApiError::from(e);
            assert_eq!((err.code, err.status, err.retry_after_s), (code, code.status(), retry_after), "{what}");
            let (_, _, body) = rendered(err).await;
            assert_eq!(body["error"]["code"], code.as_str(), "{what}");
            assert!(!body.to_string().contains("secret"), "{body}");
        }
        for (kind, code) in [(std::io::ErrorKind::StorageFull, ApiCode::StorageFull), (std::io::ErrorKind::PermissionDenied, ApiCode::UpstreamError)] {
            let (_, _, body) = rendered(ApiError::io(&std::io::Error::new(kind, "/secret/path"))).await;
            assert_eq!(body["error"]["code"], code.as_str(), "{kind:?}");
            assert!(!body.to_string().contains("secret"), "{body}");
        }
        let missing = ApiError::from(ServiceError::MissingAsset(vec!["a".into()]));
        assert_eq!(missing.details.as_deref(), Some(&json!({ "missing_ids": ["a"] })));
    }

    #[test]
    fn account_errors_map_to_their_codes() {
        use crate::accounts::AccountError as A;
        let cases = [
            (A::InvalidName, ApiCode::InvalidRequest),
            (A::InvalidTier, ApiCode::InvalidRequest),
            (A::Overflow, ApiCode::InvalidRequest),
            (A::NameTaken("a".into()), ApiCode::NameTaken),
            (A::TooMany, ApiCode::TooManyAccounts),
            (A::NotFound("a".into()), ApiCode::NotFound),
            (A::Store("disk".into()), ApiCode::UpstreamError),
        ];
        for (e, code) in cases {
            let what = format!("{e:?}");
            let err = ApiError::from(e);
            assert_eq!((err.code, err.status), (code, code.status()), "{what}");
        }
    }
}
