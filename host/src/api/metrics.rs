//! `GET /metrics`: the server's Prometheus metrics (see
//! `service::metrics` for what they are). On the main port, at the host's
//! root like the admin API (never under the mount prefix: it describes the
//! whole host). Open when no operator token (`admin_token`) is configured;
//! otherwise it needs that token as `Authorization: Bearer`, through the
//! admin API's one gate.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};

use super::AppState;

/// The content type of the Prometheus text exposition.
const EXPOSITION: &str = "text/plain; version=0.0.4; charset=utf-8";

pub fn routes(state: Arc<AppState>) -> Router {
    Router::new().route("/metrics", axum::routing::get(render)).with_state(state)
}

async fn render(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    if state.admin_token_hash.is_some()
        && let Err(refused) = super::admin::authorize(&state, &headers)
    {
        return refused.into_response();
    }
    ([(header::CONTENT_TYPE, EXPOSITION), (header::CACHE_CONTROL, "no-store")], state.service.render_metrics()).into_response()
}
