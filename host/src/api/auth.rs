//! Self-hosted authentication: with a configured token, every `/api/v2`
//! request except health, CORS preflight and signed downloads must carry
//! `Authorization: Bearer <token>` (scheme case-insensitive, token compared
//! in constant time).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::AppState;
use super::error::ApiError;

/// Paths under the Jobs API that need no token.
/// (`path` is relative to the Jobs API's mount point.)
fn is_public(path: &str) -> bool {
    path == "/health" || path.starts_with("/signed/")
}

pub async fn require_token(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    state.service.touch();
    let Some(expected) = &state.token_hash else { return next.run(request).await };
    if request.method() == Method::OPTIONS || is_public(request.uri().path()) {
        return next.run(request).await;
    }
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim());
    match given {
        None => ApiError::unauthorized("Missing or malformed Authorization header.").into_response(),
        Some(token) if blake3::hash(token.as_bytes()) == *expected => next.run(request).await,
        Some(_) => ApiError::unauthorized("Invalid token.").into_response(),
    }
}
