//! The deployment-scoped Jobs API: `{mount}/deployment/{id}/api/v2/...`.
//!
//! A request under a deployment's prefix is checked against the
//! deployment's state (404 unknown — after authentication, so a caller
//! without credentials cannot tell an unknown id from a known one — 429
//! `deployment_not_ready` with
//! `Retry-After` while its plugins load, 422 `deployment_stopped` after a
//! stop or a failed load), then rewritten to the server's own Jobs API path
//! with a [`DeploymentCtx`] attached: its links carry the prefix (see
//! `links`), its submissions run on the deployment's plugins, and on a
//! public demo deployment it needs no credentials and acts as the shared
//! demo identity. The compatibility API stays at the host level.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::Uri;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::AppState;
use super::error::ApiError;

/// The deployment a request was addressed to.
#[derive(Debug, Clone)]
pub struct DeploymentCtx {
    pub id: String,
    pub public_demo: bool,
    /// The account that owns it.
    pub owner: String,
    /// `{mount}/deployment/{id}/api/v2`: the base of its links.
    pub base: Arc<str>,
}

pub use crate::service::deployments::demo_owner;

/// Rewrites a deployment-scoped request onto the Jobs API (see the module
/// doc); other requests pass unchanged. The deployment's state is checked
/// after authentication (`check_state`, from the edge), so a caller without
/// credentials learns nothing of it.
pub async fn rewrite(State(state): State<Arc<AppState>>, mut request: Request, next: Next) -> Response {
    let prefix = format!("{}/deployment/", state.config.mount_prefix);
    let Some(rest) = request.uri().path().strip_prefix(prefix.as_str()) else { return next.run(request).await };
    let (id, tail) = rest.split_once('/').unwrap_or((rest, ""));
    if !(tail == "api/v2" || tail.starts_with("api/v2/")) {
        return ApiError::not_found().into_response();
    }
    let record = match state.service.deployment(id) {
        Some(record) => record,
        // Authenticated first: without credentials an unknown id answers
        // as a known one does (401), so ids cannot be probed.
        None => {
            return match super::auth::authenticate(&state, super::auth::bearer(request.headers())) {
                Err(e) => e.into_response(),
                Ok(_) => ApiError::not_found().into_response(),
            };
        }
    };
    let ctx = DeploymentCtx {
        id: id.to_string(),
        public_demo: record.spec.public_demo,
        owner: record.spec.owner.clone(),
        base: format!("{}/deployment/{id}/api/v2", state.config.mount_prefix).into(),
    };
    let path = format!("{}/{tail}", state.config.mount_prefix);
    let uri = match request.uri().query() {
        Some(q) => format!("{path}?{q}"),
        None => path,
    };
    match uri.parse::<Uri>() {
        Ok(uri) => *request.uri_mut() = uri,
        Err(_) => return ApiError::not_found().into_response(),
    }
    request.extensions_mut().insert(ctx);
    next.run(request).await
}

/// A request to a deployment that does not serve now: 429
/// `deployment_not_ready` (with `Retry-After`) or 422 `deployment_stopped`.
pub fn check_state(state: &AppState, request: &Request) -> Result<(), ApiError> {
    match request.extensions().get::<DeploymentCtx>() {
        Some(d) => state.service.deployment_serving(&d.id).map(|_| ()).map_err(ApiError::from),
        None => Ok(()),
    }
}
