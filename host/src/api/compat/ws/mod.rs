//! ComfyUI's WebSocket at `/ws`: status on connect, execution messages of
//! every prompt of the caller's account, binary preview frames.

use std::sync::Arc;

use axum::Router;

use crate::api::AppState;

/// The `/ws` route.
pub fn routes(state: Arc<AppState>) -> Router {
    Router::new().with_state(state)
}
