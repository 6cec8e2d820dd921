//! The HTTP edge: routing, authentication, link building and the error
//! envelope. Handlers parse requests, call the [`Service`], and render its
//! records; no business logic lives here.

mod auth;
mod content;
pub mod error;
mod links;
pub mod signing;
pub mod v2;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::Request;
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

pub use links::Links;

use crate::config::Config;
use crate::service::Service;

/// What every handler can reach.
pub struct AppState {
    pub service: Arc<Service>,
    pub config: Config,
    /// blake3 of the bearer token, when one is configured.
    pub token_hash: Option<blake3::Hash>,
    pub signer: signing::Signer,
    /// `host:port` the server listens on (links fall back to it).
    pub local_authority: String,
    /// Cancelled when the server shuts down: open event streams end.
    pub closing: tokio_util::sync::CancellationToken,
    /// Rendered bodies of finished jobs, by (job id, origin): polling a
    /// finished job is the commonest request and its JSON never changes
    /// until expiry (which hands out a new record, so the entry goes stale
    /// by identity, not by time).
    pub rendered: parking_lot::Mutex<RenderedJobs>,
}

/// Rendered job bodies by (job id, origin): the record they were rendered
/// from (compared by identity) and the bytes.
pub type RenderedJobs = lru::LruCache<(String, String), (Arc<crate::store::JobRecord>, axum::body::Bytes)>;

impl AppState {
    pub fn new(service: Arc<Service>, mut config: Config, signer: signing::Signer, local: SocketAddr) -> Arc<AppState> {
        config.mount_prefix = normalize_prefix(&config.mount_prefix);
        let token_hash = config.token.as_deref().filter(|t| !t.is_empty()).map(|t| blake3::hash(t.as_bytes()));
        Arc::new(AppState {
            service,
            config,
            token_hash,
            signer,
            local_authority: local.to_string(),
            closing: Default::default(),
            rendered: parking_lot::Mutex::new(lru::LruCache::new(std::num::NonZeroUsize::new(4096).unwrap_or(std::num::NonZeroUsize::MIN))),
        })
    }

    /// The caller's account (one owner on a self-hosted server).
    pub fn owner(&self) -> &str {
        &self.service.options().owner
    }
}

/// `deployment/x/` → `/deployment/x`; empty stays empty.
fn normalize_prefix(prefix: &str) -> String {
    let trimmed = prefix.trim().trim_matches('/');
    if trimmed.is_empty() { String::new() } else { format!("/{trimmed}") }
}

/// The whole HTTP surface, mounted under the configured prefix.
pub fn router(state: Arc<AppState>) -> Router {
    let v2 = v2::routes(state.clone()).layer(axum::middleware::from_fn_with_state(state.clone(), auth::require_token));
    let api = Router::new().nest("/api/v2", v2);
    let prefix = state.config.mount_prefix.clone();
    let app = if prefix.is_empty() { api } else { Router::new().nest(&prefix, api) };
    app.fallback(|| async { error::ApiError::not_found().into_response() })
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(|_: Box<dyn std::any::Any + Send>| {
            error::ApiError::internal(&"a request handler panicked").into_response()
        }))
        .layer(axum::middleware::from_fn(request_id))
}

/// A request id: a random per-process prefix and a counter (unique without
/// a trip to the kernel's RNG on every request).
fn next_request_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static PREFIX: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let prefix = PREFIX.get_or_init(|| uuid::Uuid::new_v4().simple().to_string()[..12].to_string());
    format!("{prefix}-{:x}", COUNTER.fetch_add(1, Ordering::Relaxed))
}

/// Tags every response with `X-Comfy-Request-Id`.
async fn request_id(request: Request, next: Next) -> Response {
    let id = next_request_id();
    let span = tracing::debug_span!("request", request_id = %id, method = %request.method(), path = %request.uri().path());
    let mut response = tracing::Instrument::instrument(next.run(request), span).await;
    if let Ok(v) = HeaderValue::from_str(&id) {
        response.headers_mut().insert("x-comfy-request-id", v);
    }
    response
}

/// Serves `router` on `listener` until `shutdown` resolves, then lets
/// in-flight requests finish.
pub async fn serve(listener: tokio::net::TcpListener, router: Router, shutdown: impl std::future::Future<Output = ()> + Send + 'static) -> std::io::Result<()> {
    use axum::serve::ListenerExt;
    // Small writes (SSE frames, JSON replies) must not wait for Nagle.
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, router).with_graceful_shutdown(shutdown).await
}
