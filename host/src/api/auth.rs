//! Self-hosted authentication: with a configured token, every `/api/v2`
//! request except health, CORS preflight and signed downloads must carry
//! `Authorization: Bearer <token>` (scheme case-insensitive, token compared
//! in constant time), and every request of the compatibility API's HTTP
//! routes (`/api/prompt`, `/prompt`, ...) `X-API-Key: <token>`. The WebSocket (`/ws`, `/api/ws`) checks its own
//! `?token=`. Without a token everything is open.

use axum::extract::Request;
use axum::http::{Method, header};

use super::AppState;
use super::error::ApiError;

/// Paths under the Jobs API that need no token.
/// (`path` is relative to the Jobs API's mount point.)
fn is_public(path: &str) -> bool {
    path == "/health" || path.starts_with("/signed/")
}

/// Whether `request` may proceed: always without a configured token;
/// otherwise outside the Jobs API, for CORS preflights and public paths, or
/// with the right bearer token.
pub fn check(state: &AppState, request: &Request) -> Result<(), ApiError> {
    let Some(expected) = &state.token_hash else { return Ok(()) };
    // A public demo deployment takes callers without credentials.
    if request.extensions().get::<super::deployment::DeploymentCtx>().is_some_and(|d| d.public_demo) {
        return Ok(());
    }
    let Some(path) = request.uri().path().strip_prefix(&*state.api_base) else { return check_api_key(state, request, expected) };
    if !(path.is_empty() || path.starts_with('/')) || request.method() == Method::OPTIONS || is_public(path) {
        return Ok(());
    }
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim());
    match given {
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
    use super::is_compat;

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
