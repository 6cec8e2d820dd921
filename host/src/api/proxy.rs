//! Plugin routes (`/proxy/...`): the request, its body bounded
//! (`route_max_body_mb`, 413 beyond, a declared length before the body is
//! read: `body_limit`), goes to the plugin whose manifest
//! declares the longest matching prefix and the operator granted routes;
//! the plugin's response is returned as it gave it. Failures of the call
//! itself answer in the proxy routes' shape `{error, message}`, with no
//! internal detail: 504 past the plugin's time limit, 500 otherwise; 404
//! when no plugin serves the path. Authentication is the plugin's (kiln's
//! own token does not apply to `/proxy/`).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};

use super::AppState;
use super::error::ApiCode;

/// Response headers about the connection or the framing, which a plugin
/// does not set (the server frames the collected body itself).
const HOP_BY_HOP: &[&str] = &["connection", "keep-alive", "transfer-encoding", "content-length", "te", "trailer", "upgrade", "proxy-connection"];

/// `{error, message}` with the code's status.
fn proxy_error(code: ApiCode, message: &str) -> Response {
    (code.status(), axum::Json(serde_json::json!({ "error": code.as_str(), "message": message }))).into_response()
}

/// A request body over `max` bytes: 413 in the proxy routes' shape.
pub fn too_large(max: usize) -> Response {
    proxy_error(ApiCode::PayloadTooLarge, &format!("The request body exceeds {max} bytes."))
}

/// Whether a body read failed on its length limit (not a broken or stalled body).
fn is_length_limit(e: &axum::Error) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cause {
        if c.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        cause = c.source();
    }
    false
}

/// Serves one request of a plugin route.
pub async fn serve(State(state): State<Arc<AppState>>, request: Request) -> Response {
    let full = request.uri().path();
    let path = full.strip_prefix(state.config.mount_prefix.as_str()).unwrap_or(full);
    let Some(plugin) = state.service.registry().route(path).cloned() else {
        return proxy_error(ApiCode::NotFound, "No route matches this path.");
    };
    let path_and_query = match request.uri().query() {
        Some(q) => format!("{path}?{q}"),
        None => path.to_string(),
    };
    let (parts, body) = request.into_parts();
    // A declared length over the limit was refused before this (`router`);
    // this cuts a body longer than it declared, or sent without a length.
    let body = match axum::body::to_bytes(body, state.config.route_body_bytes()).await {
        Ok(body) => body,
        Err(e) if is_length_limit(&e) => return too_large(state.config.route_body_bytes()),
        Err(_) => return proxy_error(ApiCode::InvalidRequest, "The request body could not be read."),
    };
    let uri = format!("http://{}{path_and_query}", state.local_authority);
    let mut builder = http::Request::builder().method(parts.method).uri(uri);
    for (name, value) in &parts.headers {
        builder = builder.header(name, value);
    }
    let Ok(forwarded) = builder.body(body) else {
        return proxy_error(ApiCode::InvalidRequest, "The request cannot be forwarded.");
    };
    let cancel = tokio_util::sync::CancellationToken::new();
    // Dropped with the handler when the client goes away: the call stops.
    let _stop = cancel.clone().drop_guard();
    match state.service.plugin_runtime().serve_route(&plugin, forwarded, &cancel).await {
        Ok(response) => {
            let (mut parts, body) = response.into_parts();
            // The body is whole: framing is the server's, not the plugin's.
            for name in HOP_BY_HOP {
                parts.headers.remove(*name);
            }
            Response::from_parts(parts, Body::from(body))
        }
        Err(e) if e.is_timeout() => {
            tracing::warn!(plugin = %plugin.manifest.name, error = %e, "plugin route timed out");
            proxy_error(ApiCode::Timeout, "The request took too long.")
        }
        Err(e) => {
            tracing::warn!(plugin = %plugin.manifest.name, error = %e, "plugin route failed");
            proxy_error(ApiCode::InternalError, "The request could not be completed.")
        }
    }
}
