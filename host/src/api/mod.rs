//! The HTTP edge: routing, authentication, link building and the error
//! envelope. Handlers parse requests, call the [`Service`], and render its
//! records; no business logic lives here.

pub mod admin;
pub mod auth;
pub mod body;
pub mod body_limit;
pub mod compat;
mod content;
pub mod deployment;
pub mod error;
mod links;
pub mod listener;
mod metrics;
pub(crate) mod openapi;
mod plugins;
pub mod pool;
#[cfg(test)]
mod proptests;
pub mod proxy;
pub mod session;
pub mod signing;
pub mod statuses;
pub mod v2;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

pub use auth::Caller;
pub use links::Links;

use crate::config::Config;
use crate::service::Service;

/// What every handler can reach.
pub struct AppState {
    pub service: Arc<Service>,
    pub config: Config,
    /// blake3 of the bearer token, when one is configured.
    pub token_hash: Option<blake3::Hash>,
    pub signer: Arc<signing::Signer>,
    /// Path of the Jobs API: the mount prefix and `/api/v2`.
    pub api_base: Arc<str>,
    /// `host:port` the server listens on (links fall back to it).
    pub local_authority: String,
    /// Cancelled when the server shuts down: open event streams end.
    pub closing: tokio_util::sync::CancellationToken,
    /// Rendered bodies of finished jobs, by job id: polling a finished job
    /// is the commonest request and its JSON never changes until expiry
    /// (which hands out a new record, so the entry goes stale by identity,
    /// not by time). Links in it depend on the request's origin, so that is
    /// kept and compared too.
    pub rendered: parking_lot::Mutex<RenderedJobs>,
    /// The compatibility API's rendered `object_info` listing.
    pub object_info: compat::ObjectInfoCache,
    /// The web frontend's settings and files of the one user (without accounts).
    pub user_files: Arc<crate::service::user_files::UserFiles>,
    /// Each account's own frontend files (cloud, serverless), by account id.
    pub account_files: parking_lot::Mutex<std::collections::HashMap<Arc<str>, Arc<crate::service::user_files::UserFiles>>>,
    /// The web frontend served at `/`, when `front_end_root` is set.
    pub frontend: Option<compat::Frontend>,
    /// Every caller of a server without accounts: its one owner.
    pub default_caller: Caller,
    /// blake3 of the operator token (`admin_token`): the admin API is
    /// there only when one is set.
    pub admin_token_hash: Option<blake3::Hash>,
}

/// Rendered job bodies by job id: the record they were rendered from
/// (compared by identity), the origin their links use, and the bytes.
pub type RenderedJobs = lru::LruCache<String, (Arc<crate::store::JobRecord>, String, axum::body::Bytes)>;

impl AppState {
    pub fn new(service: Arc<Service>, mut config: Config, signer: signing::Signer, local: SocketAddr, frontend: Option<compat::Frontend>) -> Arc<AppState> {
        config.mount_prefix = normalize_prefix(&config.mount_prefix);
        let token_hash = config.token.as_deref().filter(|t| !t.is_empty()).map(|t| blake3::hash(t.as_bytes()));
        let user_files = Arc::new(crate::service::user_files::UserFiles::new(
            service.user_file_store().clone(),
            crate::service::user_files::DEFAULT_USER,
            user_file_limits(&config),
        ));
        let default_caller = Caller::new(Arc::from(service.options().owner.as_str()));
        let admin_token_hash = config.admin_token.as_deref().filter(|t| !t.is_empty()).map(|t| blake3::hash(t.as_bytes()));
        Arc::new(AppState {
            default_caller,
            admin_token_hash,
            user_files,
            account_files: Default::default(),
            frontend,
            api_base: format!("{}/api/v2", config.mount_prefix).into(),
            service,
            config,
            token_hash,
            signer: Arc::new(signer),
            local_authority: local.to_string(),
            closing: Default::default(),
            rendered: parking_lot::Mutex::new(lru::LruCache::new(std::num::NonZeroUsize::new(4096).unwrap_or(std::num::NonZeroUsize::MIN))),
            object_info: Default::default(),
        })
    }
}

impl AppState {
    /// The frontend files of `caller`: the one user's without accounts,
    /// else the account's own (embedded: `<data_dir>/users/<account id>`).
    pub fn files_of(&self, caller: &Caller) -> Arc<crate::service::user_files::UserFiles> {
        if !self.config.mode.has_accounts() {
            return self.user_files.clone();
        }
        let owner = caller.owner_arc();
        let mut all = self.account_files.lock();
        all.entry(owner.clone())
            .or_insert_with(|| {
                Arc::new(crate::service::user_files::UserFiles::new(self.service.user_file_store().clone(), &owner, user_file_limits(&self.config)))
            })
            .clone()
    }
}

/// What the frontend's user may keep (`/api/userdata`, `/api/settings`).
fn user_file_limits(config: &Config) -> crate::service::user_files::UserFileLimits {
    crate::service::user_files::UserFileLimits {
        file_bytes: config.max_userdata_file_kb.saturating_mul(1024),
        total_bytes: config.max_userdata_mb.saturating_mul(1 << 20),
        max_files: config.max_userdata_files,
        settings_bytes: config.max_settings_kb.saturating_mul(1024),
    }
}

/// `deployment/x/` → `/deployment/x`; empty stays empty.
fn normalize_prefix(prefix: &str) -> String {
    let trimmed = prefix.trim().trim_matches('/');
    if trimmed.is_empty() { String::new() } else { format!("/{trimmed}") }
}

/// A mount prefix must be a plain path: letters, digits and `-._~/`. (It
/// becomes part of every route pattern, where `{…}` would be a parameter
/// and the token check would no longer recognise the API's paths.)
pub fn check_mount_prefix(prefix: &str) -> Result<(), String> {
    match prefix.chars().find(|c| !(c.is_ascii_alphanumeric() || "-._~/".contains(*c))) {
        None => Ok(()),
        Some(c) => Err(format!("mount_prefix {prefix:?} may contain only letters, digits and - . _ ~ / (found {c:?})")),
    }
}

/// The whole HTTP surface, mounted under the configured prefix. Routes are
/// registered with their full paths (one lookup per request, no nesting).
pub fn router(state: Arc<AppState>) -> Router {
    let inner = v2::routes(&state.api_base, state.clone())
        .merge(compat::routes(state.clone()))
        .merge(admin::routes(state.clone()))
        .merge(metrics::routes(state.clone()))
        .merge(session::routes(state.clone()))
        .merge(
            body_limit::BodyLimit::refusing(state.config.route_body_bytes(), proxy::too_large)
                .on(Router::new().route(&format!("{}/proxy/{{*rest}}", state.config.mount_prefix), axum::routing::any(proxy::serve)))
                .with_state(state.clone()),
        )
        .fallback({
            let state = state.clone();
            move |request| compat::static_file(state.clone(), request)
        })
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(panic_response))
        .layer(axum::middleware::from_fn_with_state(state.clone(), edge));
    // Deployment-scoped paths are rewritten onto the Jobs API before the
    // routes above (and their token check) see them.
    Router::new().fallback_service(inner).layer(axum::middleware::from_fn_with_state(state, deployment::rewrite))
}

/// A handler that panicked: the generic 500 envelope — the panic's message
/// (host internals) goes to the log, never on the wire.
fn panic_response(_: Box<dyn std::any::Any + Send>) -> axum::response::Response {
    error::ApiError::internal(&"a request handler panicked").into_response()
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

/// What every request passes through: it is counted as activity (the idle
/// memory trimmer waits for quiet), checked for the token (the Jobs API
/// and the compatibility routes, see `auth`),
/// traced, counted and timed by the route it matched (`/metrics`), and its
/// response tagged with `X-Comfy-Request-Id`.
async fn edge(State(state): State<Arc<AppState>>, mut request: Request, next: Next) -> Response {
    let started = std::time::Instant::now();
    let method = request.method().clone();
    let route = request.extensions().get::<axum::extract::MatchedPath>().map(|p| p.as_str().to_owned());
    let id = next_request_id();
    state.service.touch();
    // A signed-in browser's session (checked for CSRF) stands in for a key
    // where one can matter.
    let session = match auth::may_use_session(&state, &request) {
        true => session::resolve(&state, request.headers(), request.uri(), session::unsafe_method(request.method())).await,
        false => Ok(None),
    };
    let checked = match session {
        Ok(owner) => {
            if let Some(owner) = owner {
                request.extensions_mut().insert(owner);
            }
            auth::check(&state, &mut request)
        }
        Err(e) => Err(e),
    };
    let mut response = match checked.and_then(|()| deployment::check_state(&state, &request)) {
        Ok(()) => {
            let span = tracing::debug_span!("request", request_id = %id, method = %request.method(), path = %request.uri().path());
            tracing::Instrument::instrument(next.run(request), span).await
        }
        Err(e) => e.into_response(),
    };
    if let Ok(v) = HeaderValue::try_from(id) {
        response.headers_mut().insert("x-comfy-request-id", v);
    }
    state.service.metrics().http_request(&method, route.as_deref(), response.status().as_u16(), started.elapsed());
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn boom() -> &'static str {
        panic!("internal detail: /secret/path")
    }

    #[tokio::test]
    async fn a_panicking_handler_answers_the_generic_500_envelope() {
        let app = axum::Router::new()
            .route("/boom", axum::routing::get(|| async { std::hint::black_box(boom()) }))
            .layer(tower_http::catch_panic::CatchPanicLayer::custom(panic_response));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/boom", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        let resp = reqwest::get(&url).await.unwrap();
        assert_eq!(resp.status(), 500);
        let body = resp.text().await.unwrap();
        let json: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(json["error"]["code"], "upstream_error", "{body}");
        assert!(json["error"]["message"].is_string() && json["error"].get("details").is_some(), "{body}");
        assert!(!body.contains("secret") && !body.contains("panicked at"), "{body}");
        // The server carries on.
        assert_eq!(reqwest::get(&url).await.unwrap().status(), 500);
    }

    #[test]
    fn mount_prefixes_are_plain_paths() {
        assert_eq!(normalize_prefix(" deployment/x/ "), "/deployment/x");
        assert_eq!(normalize_prefix("/"), "");
        for ok in ["", "/deployment/x", "a-b_c.d~e"] {
            assert!(check_mount_prefix(ok).is_ok(), "{ok}");
        }
        for bad in ["/{tenant}", "/a b", "/x?y", "/%2e", "/*rest"] {
            assert!(check_mount_prefix(bad).is_err(), "{bad}");
        }
    }
}
