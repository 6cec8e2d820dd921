//! The ComfyUI compatibility API: ComfyUI's local-engine HTTP routes, under
//! `/api` and at the bare paths client libraries use ([`http`]), and its
//! WebSocket at `/ws` ([`ws`]), driving the same job service as `/api/v2`
//! (a prompt queued here is a job there, and the reverse). Normative:
//! `service-interface.md` section B; behaviour clients rely on:
//! `compat-protocol.md`.

mod http;
mod ws;

pub use http::ObjectInfoCache;

use std::sync::Arc;

use axum::Router;

use super::AppState;

/// The compatibility surface's routes, under the mount prefix.
pub fn routes(state: Arc<AppState>) -> Router {
    http::routes(state.clone()).merge(ws::routes(state))
}
