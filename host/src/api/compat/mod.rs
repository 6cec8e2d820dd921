//! The ComfyUI compatibility API: ComfyUI's local-engine HTTP routes, under
//! `/api` and at the bare paths client libraries use ([`http`]), and its
//! WebSocket at `/ws` ([`ws`]), driving the same job service as `/api/v2`
//! (a prompt queued here is a job there, and the reverse). Normative:
//! `service-interface.md` section B; behaviour clients rely on:
//! `compat-protocol.md`.

mod http;
mod ws;

pub use http::ObjectInfoCache;
pub use http::frontend::{FRONT_END_VERSION, Frontend, FrontendError};

use std::sync::Arc;

use axum::Router;

use super::AppState;

/// The compatibility surface's routes, under the mount prefix.
pub fn routes(state: Arc<AppState>) -> Router {
    http::routes(state.clone()).merge(ws::routes(state))
}

/// What no route answers: a file of the web frontend when one is served
/// (`GET`/`HEAD` under the mount prefix), else the API's 404. On a server
/// that asks for a key, the frontend's page itself sends a browser that is
/// not signed in to `/login` (its scripts and styles stay public: they
/// are the published frontend, the same for everyone).
pub async fn static_file(state: Arc<AppState>, request: axum::extract::Request) -> axum::response::Response {
    use axum::response::IntoResponse;
    let not_found = || super::error::ApiError::not_found().into_response();
    let Some(frontend) = &state.frontend else { return not_found() };
    if !matches!(*request.method(), axum::http::Method::GET | axum::http::Method::HEAD) {
        return not_found();
    }
    let path = request.uri().path().to_string();
    match path.strip_prefix(state.config.mount_prefix.as_str()) {
        Some("" | "/" | "/index.html") if super::session::offered(&state) && request.extensions().get::<super::session::SessionOwner>().is_none() => {
            let login = format!("{}/login", state.config.mount_prefix);
            (axum::http::StatusCode::SEE_OTHER, [(axum::http::header::LOCATION, login)]).into_response()
        }
        Some(rest) if rest.is_empty() || rest.starts_with('/') => frontend.file(rest, request).await,
        _ => not_found(),
    }
}
