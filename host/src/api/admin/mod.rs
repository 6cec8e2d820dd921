//! The admin API under `/admin/`: the operator's routes (accounts; the
//! deployments of serverless hosting; plugins installed into the running host). It exists only when an operator
//! token (`admin_token`) is configured — otherwise every `/admin/` path
//! answers 404 like any unknown path — and every route passes [`authorize`],
//! the one gate: the operator token as `Authorization: Bearer` opens it, no
//! or a wrong token answers 401 `unauthorized`, an account's key 403
//! `forbidden`. It is mounted at the host's root, never under the mount
//! prefix (it administers the whole host).

mod accounts;
mod deployments;

use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::AppState;
use super::auth::bearer;
use super::body_limit::BodyLimit;
use super::error::ApiError;
use super::openapi::Contract;

/// The admin routes, each behind [`authorize`]; none without an operator token.
/// Largest admin request body.
pub const MAX_BODY: usize = 64 << 10;

pub fn routes(state: Arc<AppState>) -> Router {
    if state.admin_token_hash.is_none() {
        return Router::new();
    }
    // Operator input: small objects with known fields; plugins (a
    // component) and bundles have their own bounds.
    let mb = |n: u64| usize::try_from(n.saturating_mul(1 << 20)).unwrap_or(usize::MAX);
    // A bundle upload: the file plus its multipart framing and spec part.
    let bundle_bytes = mb(state.config.max_bundle_mb).saturating_add(MAX_BODY + (1 << 20));
    let mut contract = Contract::default();
    let accounts = BodyLimit::new(MAX_BODY).on(contract.routes("", accounts::routes()));
    let deployments = deployments::routes(&mut contract, bundle_bytes);
    let plugins = super::plugins::admin_routes(&mut contract, mb(state.config.max_plugin_mb));
    let document = contract.routes("", [utoipa_axum::routes!(super::openapi::admin_document)]);
    let rendered = super::openapi::Rendered::new(&contract.document("kiln admin API", DESCRIPTION, "/", true));
    accounts
        .merge(deployments)
        .merge(plugins)
        .merge(document.layer(axum::Extension(rendered)))
        // Every admin area's routes join here, behind the one gate.
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), gate))
        .with_state(state)
}

/// The admin document's description.
const DESCRIPTION: &str = "The operator's API: accounts, serverless deployments, plugins installed into the running host. \
Every route needs the operator token (`admin_token`) as `Authorization: Bearer`.";

/// Whether a request with `headers` is the operator's (see the module docs).
pub fn authorize(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(expected) = &state.admin_token_hash else { return Err(ApiError::not_found()) };
    let account_key = |key: Option<&str>| key.is_some_and(|k| state.service.accounts().authenticate(k).is_some());
    match bearer(headers) {
        Some(token) if blake3::hash(token.as_bytes()) == *expected => Ok(()),
        given if account_key(given) || account_key(headers.get("x-api-key").and_then(|v| v.to_str().ok()).map(str::trim)) => {
            Err(ApiError::forbidden("Account keys cannot use the admin API."))
        }
        None => Err(ApiError::unauthorized("The admin API needs the operator token (Authorization: Bearer).")),
        Some(_) => Err(ApiError::unauthorized("Invalid operator token.")),
    }
}

/// [`authorize`] as a route layer.
async fn gate(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    match authorize(&state, request.headers()) {
        Ok(()) => next.run(request).await,
        Err(e) => e.into_response(),
    }
}
