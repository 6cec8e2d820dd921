//! The Jobs API (`/api/v2`): routes and their handlers.

pub(crate) mod assets;
mod events;
mod jobs;
pub(crate) mod labels;
mod listing;
pub mod wire;

use std::sync::Arc;

use axum::Router;
use axum::response::IntoResponse;
use utoipa_axum::routes;

use super::AppState;
use super::body_limit::BodyLimit;
use super::error::ApiError;
use super::openapi::{self, Contract};

/// The Jobs API's routes at `base` (the mount prefix and `/api/v2`), each
/// mounted from its documentation (`api::openapi`), and the document
/// itself at `openapi.json`.
pub fn routes(base: &str, state: Arc<AppState>) -> Router {
    let upload_limit = crate::api::body::upload_body_limit(state.service.options().max_upload_bytes);
    // JSON bodies (a workflow, the largest) are bounded by the workflow
    // size limit; uploads have their own.
    let json_limit = state.service.options().workflow_limits.max_bytes;
    let mut contract = Contract::default();
    // A submission over the limit is a workflow over it (`jobs::submit`).
    let submit =
        BodyLimit::refusing(json_limit, |max| jobs::workflow_too_large(max).into_response()).on(contract.routes(base, [routes!(jobs::submit, jobs::list)]));
    let json = BodyLimit::new(json_limit).on(contract.routes(
        base,
        [
            routes!(jobs::health),
            routes!(jobs::ready),
            routes!(jobs::get_job),
            routes!(jobs::workflow),
            routes!(jobs::cancel),
            routes!(events::stream),
            routes!(assets::head_by_hash),
            routes!(assets::from_hash),
            routes!(assets::get_asset, assets::delete_asset),
            routes!(assets::content),
            routes!(assets::signed_content),
        ],
    ));
    let uploads = BodyLimit::new(upload_limit).on(contract.routes(base, [routes!(assets::upload)]));
    // An account's own plugins (a component and its manifest).
    let plugin_bytes = usize::try_from(state.config.max_account_plugin_mb.saturating_mul(1 << 20)).unwrap_or(usize::MAX);
    let plugins = BodyLimit::new(plugin_bytes).on(contract.routes(base, super::plugins::account_routes()));
    let document = contract.routes(base, [routes!(openapi::jobs_document)]);
    let authenticated = state.token_hash.is_some() || state.config.mode.has_accounts();
    let rendered = openapi::Rendered::new(&contract.document("kiln Jobs API", DESCRIPTION, base, authenticated));
    submit
        .merge(json)
        .merge(uploads)
        .merge(plugins)
        .merge(document.layer(axum::Extension(rendered)))
        .method_not_allowed_fallback(|| async { ApiError::new(crate::api::error::ApiCode::MethodNotAllowed, "Method not allowed.").into_response() })
        .with_state(state)
}

/// The Jobs API document's description.
const DESCRIPTION: &str = "Upload inputs, submit a node-graph workflow (ComfyUI API format), watch it run, fetch its outputs. \
Every error answers `{\"error\": {\"code\", \"message\", \"details\"}}`; each operation lists the codes it can answer.";

/// The one `{id}` or `{hash}` segment of a route. A segment that does not
/// decode (say `%FF`) names nothing: 404 in the envelope, not axum's
/// plain-text rejection.
pub struct Segment(pub String);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Segment {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, state: &S) -> Result<Segment, ApiError> {
        match axum::extract::Path::<String>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(segment)) => Ok(Segment(segment)),
            Err(_) => Err(ApiError::not_found()),
        }
    }
}

/// Job and asset ids are UUIDs; anything else cannot exist.
pub(in crate::api) fn check_id(id: &str) -> Result<(), ApiError> {
    uuid::Uuid::parse_str(id).map(|_| ()).map_err(|_| ApiError::not_found())
}
