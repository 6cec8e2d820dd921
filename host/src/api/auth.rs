//! Who a request comes from, as a [`Caller`] the handlers extract.
//!
//! Self-hosted: with a configured token, every `/api/v2` request except
//! health, CORS preflight and signed downloads must carry `Authorization:
//! Bearer <token>` (scheme case-insensitive, token compared as hashes), and
//! every request of the compatibility API's HTTP routes (`/api/prompt`,
//! `/prompt`, ...) `X-API-Key: <token>`; without a token everything is
//! open. Every caller is the one owner.
//!
//! Cloud and serverless: the same routes need an account's key — `Bearer`
//! on `/api/v2`, `X-API-Key` or `?token=` on the compatibility API — and the
//! caller is that account (a disabled one: 403). The WebSocket (`/ws`,
//! `/api/ws`) checks its own `?token=` through [`authenticate`].
//!
//! In either mode, when a key is asked for, a browser signed in through
//! `/login` is let through by its session cookie instead (`api::session`
//! finds it, checked for CSRF, before these checks run).

use std::sync::Arc;

use axum::extract::{FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{Method, header};

use super::AppState;
use super::deployment::{DeploymentCtx, demo_owner};
use super::error::ApiError;

/// The account a request acts for: the `owner` of what it creates and
/// the only owner whose jobs, assets and messages it sees.
#[derive(Clone, Debug)]
pub struct Caller {
    owner: Arc<str>,
    /// The deployment the request was addressed to (its prefix).
    deployment: Option<DeploymentCtx>,
}

impl Caller {
    pub fn new(owner: Arc<str>) -> Caller {
        Caller { owner, deployment: None }
    }

    /// The id of the deployment the request was addressed to.
    pub fn deployment_id(&self) -> Option<String> {
        self.deployment.as_ref().map(|d| d.id.clone())
    }

    pub fn owner(&self) -> &str {
        &self.owner
    }

    pub fn owner_arc(&self) -> Arc<str> {
        self.owner.clone()
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = ApiError;

    /// The caller the edge authenticated; a route that needs one on a
    /// request the edge let through without one answers 401.
    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Caller, ApiError> {
        parts.extensions.get::<Caller>().cloned().ok_or_else(|| ApiError::unauthorized("This route needs an API key."))
    }
}

/// The caller a key names, with accounts: 401 for no or an unknown key,
/// 403 `forbidden` for a disabled account. Without accounts (self-hosted)
/// the one owner, when the key matches the token (or none is set).
pub fn authenticate(state: &AppState, key: Option<&str>) -> Result<Caller, ApiError> {
    if !state.config.mode.has_accounts() {
        return match (&state.token_hash, key) {
            (None, _) => Ok(state.default_caller.clone()),
            (Some(expected), Some(key)) if blake3::hash(key.as_bytes()) == *expected => Ok(state.default_caller.clone()),
            (Some(_), Some(_)) => Err(ApiError::unauthorized("Invalid API key.")),
            (Some(_), None) => Err(ApiError::unauthorized("Missing API key.")),
        };
    }
    let key = key.ok_or_else(|| ApiError::unauthorized("Missing API key."))?;
    match state.service.accounts().authenticate_id(key) {
        None => Err(ApiError::unauthorized("Invalid API key.")),
        Some((_, account)) if account.disabled => Err(ApiError::forbidden("This account is disabled.")),
        Some((id, _)) => Ok(Caller::new(id)),
    }
}

/// The bearer token of `Authorization: Bearer <token>` (scheme
/// case-insensitive).
pub fn bearer(headers: &axum::http::HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim())
}

/// The `token` query parameter (keys need no percent-decoding; one that
/// does is simply not a key).
pub fn query_token(uri: &axum::http::Uri) -> Option<&str> {
    uri.query()?.split('&').find_map(|pair| pair.strip_prefix("token="))
}

/// Authenticates `request` (see the module docs) and attaches its
/// [`Caller`]; public paths and other routes pass without one.
pub fn check(state: &AppState, request: &mut Request) -> Result<(), ApiError> {
    let Some(deployment) = request.extensions().get::<DeploymentCtx>().cloned() else { return check_host(state, request) };
    // A public demo deployment takes callers without credentials: they
    // share its demo identity.
    if deployment.public_demo {
        let caller = Caller { owner: Arc::from(demo_owner(&deployment.id)), deployment: Some(deployment) };
        request.extensions_mut().insert(caller);
        return Ok(());
    }
    check_host(state, request)?;
    // (Public paths pass without a caller.)
    let Some(caller) = request.extensions_mut().remove::<Caller>() else { return Ok(()) };
    // A deployment serves its owner's account only.
    if *caller.owner != *deployment.owner {
        return Err(ApiError::forbidden("This deployment belongs to another account."));
    }
    request.extensions_mut().insert(Caller { deployment: Some(deployment), ..caller });
    Ok(())
}

/// [`check`] of a request to the host's own APIs (or a deployment's, whose
/// path was rewritten onto them).
fn check_host(state: &AppState, request: &mut Request) -> Result<(), ApiError> {
    if !state.config.mode.has_accounts() {
        check_self_hosted(state, request)?;
        request.extensions_mut().insert(state.default_caller.clone());
        return Ok(());
    }
    if request.method() == Method::OPTIONS {
        return Ok(());
    }
    let key = match request.uri().path().strip_prefix(&*state.api_base) {
        Some(path) if path.is_empty() || path.starts_with('/') => {
            if is_public(path) {
                return Ok(());
            }
            bearer(request.headers())
        }
        _ => {
            let path = request.uri().path();
            let path = path.strip_prefix(state.config.mount_prefix.as_str()).unwrap_or(path);
            if !is_compat(path) {
                return Ok(());
            }
            request.headers().get("x-api-key").and_then(|v| v.to_str().ok()).map(str::trim).or_else(|| query_token(request.uri()))
        }
    };
    let caller = match (key, request.extensions().get::<super::session::SessionOwner>()) {
        (None, Some(session)) => session_caller(state, session.0.clone())?,
        _ => authenticate(state, key)?,
    };
    request.extensions_mut().insert(caller);
    Ok(())
}

/// The caller a signed-in session names: with accounts, its account (401
/// when it is gone, 403 when it was disabled since); else the one owner.
pub fn session_caller(state: &AppState, owner: Arc<str>) -> Result<Caller, ApiError> {
    if !state.config.mode.has_accounts() {
        return Ok(state.default_caller.clone());
    }
    match state.service.accounts().get(&owner) {
        None => Err(ApiError::unauthorized("The signed-in account no longer exists.")),
        Some(account) if account.disabled => Err(ApiError::forbidden("This account is disabled.")),
        Some(_) => Ok(Caller::new(owner)),
    }
}

/// Whether a request goes where a signed-in session can matter: the Jobs
/// API (a deployment's too), the compatibility API's routes, and the
/// frontend's page itself (which sends a stranger to `/login`; `/ws`
/// and `/login` look the session up themselves). The
/// frontend's scripts, styles and other files do not, so a page load does
/// not look its session up for each of them.
pub fn may_use_session(state: &AppState, request: &Request) -> bool {
    if request.extensions().get::<DeploymentCtx>().is_some() {
        return true;
    }
    let path = request.uri().path();
    if path.strip_prefix(&*state.api_base).is_some_and(|rest| rest.is_empty() || rest.starts_with('/')) {
        return true;
    }
    let path = path.strip_prefix(state.config.mount_prefix.as_str()).unwrap_or(path);
    is_compat(path) || matches!(path, "" | "/" | "/index.html")
}

/// The Jobs API's operations that need no token: operation id (as the
/// published document names it) and path, relative to the Jobs API's
/// mount point (a trailing `/`: every path under it). The one list: the
/// check below and the document's security both read it.
pub const PUBLIC_OPERATIONS: &[(&str, &str)] =
    &[("health", "/health"), ("ready", "/ready"), ("openapi", "/openapi.json"), ("signed_asset_content", "/signed/")];

/// Whether `path` (relative to the Jobs API's mount point) needs no token.
fn is_public(path: &str) -> bool {
    PUBLIC_OPERATIONS.iter().any(|(_, public)| if public.ends_with('/') { path.starts_with(public) } else { path == *public })
}

/// Self-hosted: whether `request` may proceed: always without a configured
/// token; otherwise outside the Jobs API, for CORS preflights and public
/// paths, or with the right bearer token.
fn check_self_hosted(state: &AppState, request: &Request) -> Result<(), ApiError> {
    let Some(expected) = &state.token_hash else { return Ok(()) };
    // A browser signed in with the token.
    if request.extensions().get::<super::session::SessionOwner>().is_some() {
        return Ok(());
    }
    // A public demo deployment takes callers without credentials.
    if request.extensions().get::<super::deployment::DeploymentCtx>().is_some_and(|d| d.public_demo) {
        return Ok(());
    }
    let Some(path) = request.uri().path().strip_prefix(&*state.api_base) else { return check_api_key(state, request, expected) };
    if !(path.is_empty() || path.starts_with('/')) || request.method() == Method::OPTIONS || is_public(path) {
        return Ok(());
    }
    match bearer(request.headers()) {
        None => Err(ApiError::unauthorized("Missing or malformed Authorization header.")),
        Some(token) if blake3::hash(token.as_bytes()) == *expected => Ok(()),
        Some(_) => Err(ApiError::unauthorized("Invalid token.")),
    }
}

/// The first segments of the compatibility API's HTTP routes (each also
/// under `/api`; `job` and `jobs` only there).
const COMPAT_ROUTES: [&str; 23] = [
    "prompt",
    "queue",
    "interrupt",
    "history",
    "object_info",
    "upload",
    "view",
    "system_stats",
    "features",
    "extensions",
    "embeddings",
    "free",
    "models",
    "users",
    "settings",
    "userdata",
    "i18n",
    "experiment",
    "workflow_templates",
    "global_subgraphs",
    "node_replacements",
    "view_metadata",
    "internal",
];

/// Whether `path` (below the mount prefix) is one of the compatibility
/// API's HTTP routes (the WebSocket is not: it checks its own `?token=`).
fn is_compat(path: &str) -> bool {
    let (under_api, rest) = match path.strip_prefix("/api/") {
        Some(rest) => (true, rest),
        None => (false, path.strip_prefix('/').unwrap_or(path)),
    };
    let first = rest.split('/').next().unwrap_or("");
    COMPAT_ROUTES.contains(&first) || (under_api && (first == "job" || first == "jobs"))
}

/// The compatibility API's HTTP routes: `X-API-Key` (CORS preflights and
/// the WebSocket, which has its own check, pass).
fn check_api_key(state: &AppState, request: &Request, expected: &blake3::Hash) -> Result<(), ApiError> {
    let path = request.uri().path();
    let path = path.strip_prefix(state.config.mount_prefix.as_str()).unwrap_or(path);
    if request.method() == Method::OPTIONS || !is_compat(path) {
        return Ok(());
    }
    match request.headers().get("x-api-key").and_then(|v| v.to_str().ok()).map(str::trim) {
        None => Err(ApiError::unauthorized("Missing X-API-Key header.")),
        Some(key) if blake3::hash(key.as_bytes()) == *expected => Ok(()),
        Some(_) => Err(ApiError::unauthorized("Invalid API key.")),
    }
}

#[cfg(test)]
mod tests {
    use super::{bearer, is_compat, query_token};

    #[test]
    fn keys_are_read_from_the_bearer_header_and_the_token_parameter() {
        let uri = |s: &str| s.parse::<axum::http::Uri>().unwrap();
        assert_eq!(query_token(&uri("/ws?clientId=x&token=kiln_abc")), Some("kiln_abc"));
        assert_eq!(query_token(&uri("/api/queue?token=k&x=1")), Some("k"));
        assert_eq!(query_token(&uri("/api/queue?xtoken=k")), None);
        assert_eq!(query_token(&uri("/api/queue")), None);
        let mut headers = axum::http::HeaderMap::new();
        assert_eq!(bearer(&headers), None);
        headers.insert("authorization", "bEaReR  kiln_k ".parse().unwrap());
        assert_eq!(bearer(&headers), Some("kiln_k"));
        headers.insert("authorization", "Basic a2lsbg==".parse().unwrap());
        assert_eq!(bearer(&headers), None);
    }

    #[test]
    fn compat_routes_are_recognised_in_both_forms() {
        for yes in [
            "/settings/x",
            "/api/users",
            "/api/prompt",
            "/prompt",
            "/history/x",
            "/api/jobs",
            "/api/jobs/x/cancel",
            "/api/job/x/status",
            "/upload/image",
            "/view",
        ] {
            assert!(is_compat(yes), "{yes}");
        }
        for no in ["/ws", "/api/ws", "/jobs", "/job/x/status", "/", "/no-such-route", "/api/v3/x", "/promptx"] {
            assert!(!is_compat(no), "{no}");
        }
    }
}
