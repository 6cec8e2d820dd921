//! The admin API (`{mount}/admin/...`): operator operations, opened only by
//! the operator token (config `admin_token`, `KILN_ADMIN_TOKEN`) as
//! `Authorization: Bearer <token>`. Without a configured token the admin API
//! is off (404). Any other credential — an account's key included — is 403
//! `forbidden`; none at all is 401 `unauthorized`.

mod deployments;

use std::sync::Arc;

use axum::Router;
use axum::http::{HeaderMap, header};
use axum::routing::{get, post};

use super::AppState;
use super::error::ApiError;

/// The admin routes under the mount prefix.
pub fn routes(state: Arc<AppState>) -> Router {
    let at = |path: &str| format!("{}/admin{path}", state.config.mount_prefix);
    Router::new()
        .route(&at("/deployments"), post(deployments::create).get(deployments::list))
        .route(&at("/deployments/{id}"), get(deployments::get))
        .route(&at("/deployments/{id}/stop"), post(deployments::stop))
        .route(&at("/deployments/{id}/start"), post(deployments::start))
        .with_state(state)
}

/// Whether the request carries the operator token (the one gate of every
/// admin handler). Hashes are compared, so the comparison takes the same
/// time whatever the given token shares with the real one.
pub fn check_admin(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(expected) = state.config.admin_token.as_deref().filter(|t| !t.is_empty()) else { return Err(ApiError::not_found()) };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim());
    match given {
        None => Err(ApiError::unauthorized("The admin API needs the operator token: Authorization: Bearer <token>.")),
        Some(token) if blake3::hash(token.as_bytes()) == blake3::hash(expected.as_bytes()) => Ok(()),
        Some(_) => Err(ApiError::forbidden("Only the operator token opens the admin API.")),
    }
}
