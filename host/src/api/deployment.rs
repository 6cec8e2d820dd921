//! The deployment-scoped Jobs API: `{mount}/deployment/{id}/api/v2/...`,
//! and `{id}.{serverless_host}{mount}/api/v2/...` when `serverless_host` is
//! set (its links host-relative, without the deployment prefix).
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
pub async fn rewrite(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    let (method, started) = (request.method().clone(), std::time::Instant::now());
    match addressed(&state, request, next).await {
        Ok(response) => response,
        // Answered here, before the edge that counts every other request.
        Err(refused) => {
            let response = refused.into_response();
            state.service.metrics().http_request(&method, Some(REFUSED_ROUTE), response.status().as_u16(), started.elapsed());
            response
        }
    }
}

/// The route label of the requests a deployment prefix refuses itself
/// (unknown deployment, no Jobs API path, no credentials).
const REFUSED_ROUTE: &str = "/deployment/{id}/{*rest}";

/// [`rewrite`]'s work: the response of the routes behind it, or the
/// refusal of a deployment-scoped request.
async fn addressed(state: &AppState, request: Request, next: Next) -> Result<Response, ApiError> {
    let mount = state.config.mount_prefix.as_str();
    // `{id}.{serverless_host}/api/v2/...`: the path stays, links carry no prefix.
    if let Some(id) = subdomain(state, &request) {
        let base: Arc<str> = Arc::clone(&state.api_base);
        let path = request.uri().path();
        if path != &*base && !path.strip_prefix(&*base).is_some_and(|rest| rest.starts_with('/')) {
            return Err(ApiError::not_found());
        }
        return route(state, request, next, &id, None, base).await;
    }
    let prefix = format!("{mount}/deployment/");
    let Some(rest) = request.uri().path().strip_prefix(prefix.as_str()) else { return Ok(next.run(request).await) };
    let (id, tail) = rest.split_once('/').unwrap_or((rest, ""));
    if !(tail == "api/v2" || tail.starts_with("api/v2/")) {
        return Err(ApiError::not_found());
    }
    let (id, path) = (id.to_string(), format!("{mount}/{tail}"));
    let base: Arc<str> = format!("{mount}/deployment/{id}/api/v2").into();
    route(state, request, next, &id, Some(path), base).await
}

/// The deployment a request's host names as `{id}.{serverless_host}`
/// (one DNS label; the port ignored), when `serverless_host` is set.
fn subdomain(state: &AppState, request: &Request) -> Option<String> {
    let suffix = state.config.serverless_host.as_deref()?;
    let host = super::links::request_host(request.headers(), request.uri(), state.config.trust_forwarded_headers)?;
    let host = host.rsplit_once(':').filter(|(_, port)| port.bytes().all(|b| b.is_ascii_digit())).map_or(host, |(h, _)| h);
    let label = host.to_ascii_lowercase().strip_suffix(&suffix.to_ascii_lowercase())?.strip_suffix('.')?.to_string();
    (!label.is_empty() && !label.contains('.')).then_some(label)
}

/// Sends a request addressed to deployment `id` on to the Jobs API: its
/// path rewritten to `path` (`None`: kept), its links under `base`. An
/// unknown id is authenticated first: without credentials it answers as a
/// known one does (401), so ids cannot be probed.
async fn route(state: &AppState, mut request: Request, next: Next, id: &str, path: Option<String>, base: Arc<str>) -> Result<Response, ApiError> {
    let Some(record) = state.service.deployment(id) else {
        super::auth::authenticate(state, super::auth::bearer(request.headers()))?;
        return Err(ApiError::not_found());
    };
    let ctx = DeploymentCtx { id: id.to_string(), public_demo: record.spec.public_demo, owner: record.spec.owner.clone(), base };
    if let Some(path) = path {
        let uri = match request.uri().query() {
            Some(q) => format!("{path}?{q}"),
            None => path,
        };
        *request.uri_mut() = uri.parse::<Uri>().map_err(|_| ApiError::not_found())?;
    }
    request.extensions_mut().insert(ctx);
    Ok(next.run(request).await)
}

/// A request to a deployment that does not serve now: 429
/// `deployment_not_ready` (with `Retry-After`) or 422 `deployment_stopped`.
pub fn check_state(state: &AppState, request: &Request) -> Result<(), ApiError> {
    match request.extensions().get::<DeploymentCtx>() {
        Some(d) => state.service.deployment_serving(&d.id).map(|_| ()).map_err(ApiError::from),
        None => Ok(()),
    }
}
