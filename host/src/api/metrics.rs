//! `GET /metrics`: the server's Prometheus metrics (see
//! `service::metrics` for what they are). On the main port, at the host's
//! root like the admin API (never under the mount prefix: it describes the
//! whole host). Who may read them ([`authorize`]): with an operator token
//! (`admin_token`), the operator, through the admin API's one gate; without
//! one, nobody where there are accounts (404, as the admin API), and on a
//! self-hosted server whoever the Jobs API takes (its `token` as a Bearer
//! when one is set, else anyone).

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};

use super::AppState;
use super::error::ApiError;

/// The content type of the Prometheus text exposition.
const EXPOSITION: &str = "text/plain; version=0.0.4; charset=utf-8";

pub fn routes(state: Arc<AppState>) -> Router {
    Router::new().route("/metrics", axum::routing::get(render)).with_state(state)
}

/// Whether a request with `headers` may read the metrics (see the module docs).
fn authorize(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    if state.admin_token_hash.is_some() {
        return super::admin::authorize(state, headers);
    }
    if state.config.mode.has_accounts() {
        return Err(ApiError::not_found());
    }
    match (&state.token_hash, super::auth::bearer(headers)) {
        (None, _) => Ok(()),
        (Some(expected), Some(token)) if blake3::hash(token.as_bytes()) == *expected => Ok(()),
        (Some(_), Some(_)) => Err(ApiError::unauthorized("Invalid token.")),
        (Some(_), None) => Err(ApiError::unauthorized("Missing or malformed Authorization header.")),
    }
}

async fn render(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    if let Err(refused) = authorize(&state, &headers) {
        return refused.into_response();
    }
    ([(header::CONTENT_TYPE, EXPOSITION), (header::CACHE_CONTROL, "no-store")], state.service.render_metrics()).into_response()
}
