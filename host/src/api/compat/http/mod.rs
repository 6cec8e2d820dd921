//! ComfyUI's HTTP routes (each at `/api/x` and `/x`).

use std::sync::Arc;

use axum::Router;

use crate::api::AppState;

/// The HTTP routes of the compatibility API.
pub fn routes(state: Arc<AppState>) -> Router {
    Router::new().with_state(state)
}
