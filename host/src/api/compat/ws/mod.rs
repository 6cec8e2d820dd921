//! ComfyUI's WebSocket at `/ws` (and `/api/ws`): `status` with the session
//! id on connect, the answer to a first-frame `feature_flags`, queue
//! changes, and the execution messages of every job of the caller's account
//! (`clientId` is not used for routing: every connection of the owner gets
//! every job's messages; clients filter on `prompt_id`), with previews and
//! progress text as binary frames.
//!
//! Each connection has a bounded outgoing buffer: a client that falls
//! behind past it (or past the bus's capacity) is disconnected, never waited
//! for, so it cannot hold up a job or another connection.

mod connection;
pub(super) mod render;

use std::sync::Arc;

use axum::Router;
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::api::AppState;
use crate::api::error::ApiError;

/// Frames a connection may have waiting to be written before it is dropped.
pub const SOCKET_BUFFER_FRAMES: usize = 1024;
/// Bytes a connection may have waiting to be written before it is dropped.
pub const SOCKET_BUFFER_BYTES: usize = 16 << 20;
/// Longest `clientId` taken as the session id (a longer one gets a fresh id).
const MAX_CLIENT_ID: usize = 128;
/// Largest frame a client may send (only a `feature_flags` frame is read).
const MAX_CLIENT_FRAME: usize = 64 << 10;
/// The read buffer each connection allocates up front (tungstenite's
/// default is 128 KiB, which made 1000 idle sockets cost 130 MiB; a client
/// sends one small frame, and a larger one still assembles, up to
/// [`MAX_CLIENT_FRAME`]).
const READ_BUFFER: usize = 4 << 10;

/// The query of `/ws`.
#[derive(serde::Deserialize)]
pub struct WsQuery {
    #[serde(rename = "clientId")]
    client_id: Option<String>,
    token: Option<String>,
}

/// The `/ws` routes, under the mount prefix.
pub fn routes(state: Arc<AppState>) -> Router {
    let prefix = state.config.mount_prefix.clone();
    Router::new().route(&format!("{prefix}/ws"), get(upgrade)).route(&format!("{prefix}/api/ws"), get(upgrade)).with_state(state)
}

/// The server's feature flags (ComfyUI's `GET /features`, and the answer
/// to a client's `feature_flags`). No `supports_progress_text_metadata`:
/// TEXT frames use the plain layout.
pub fn server_features(state: &AppState) -> serde_json::Value {
    serde_json::json!({
        "supports_preview_metadata": true,
        "max_upload_size": state.service.options().max_upload_bytes,
    })
}

async fn upgrade(
    State(state): State<Arc<AppState>>,
    Query(query): Query<WsQuery>,
    headers: axum::http::HeaderMap,
    uri: axum::http::Uri,
    ws: WebSocketUpgrade,
) -> Response {
    // `?token=` (or an `X-API-Key` header) names the caller: the token of a
    // self-hosted server that has one, an account's key with accounts (the
    // edge leaves the WebSocket to this check). Without one, a signed-in
    // browser's session cookie, from the server's own origin only (a
    // socket can queue and interrupt).
    let key = query.token.as_deref().or_else(|| headers.get("x-api-key").and_then(|v| v.to_str().ok()).map(str::trim));
    let session = match crate::api::session::resolve(&state, &headers, &uri, true).await {
        Ok(session) => session,
        Err(e) => return e.into_response(),
    };
    let signed_in = session.map(|s| crate::api::auth::session_caller(&state, s.0));
    let caller = match signed_in.unwrap_or_else(|| crate::api::auth::authenticate(&state, key)) {
        Ok(caller) => caller,
        Err(e) if key.is_none() => return ApiError { message: "Missing token: connect with ?token=<token>.".into(), ..e }.into_response(),
        Err(e) => return e.into_response(),
    };
    let sid = query.client_id.filter(|c| !c.is_empty() && c.len() <= MAX_CLIENT_ID).unwrap_or_else(|| uuid::Uuid::new_v4().simple().to_string());
    let owner = caller.owner_arc();
    // A connection holds an event-stream slot (server-wide and per account).
    let slot = match state.service.open_socket(&owner) {
        Ok(slot) => slot,
        Err(e) => return ApiError::from(e).into_response(),
    };
    ws.max_message_size(MAX_CLIENT_FRAME)
        .max_frame_size(MAX_CLIENT_FRAME)
        .read_buffer_size(READ_BUFFER)
        // Each frame goes out as it is sent (the outbox is the buffer).
        .write_buffer_size(0)
        .on_upgrade(move |socket| connection::run(socket, state, owner, sid, slot))
}
