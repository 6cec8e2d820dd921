//! The Jobs API (`/api/v2`): routes and their handlers.

mod assets;
mod events;
mod jobs;
pub mod wire;

use std::sync::Arc;

use axum::Router;
use axum::response::IntoResponse;
use axum::routing::{get, head, post};

use super::AppState;
use super::body_limit::BodyLimit;
use super::error::ApiError;

/// The Jobs API's routes at `base` (the mount prefix and `/api/v2`).
pub fn routes(base: &str, state: Arc<AppState>) -> Router {
    let upload_limit = crate::api::body::upload_body_limit(state.service.options().max_upload_bytes);
    // JSON bodies (a workflow, the largest) are bounded by the workflow
    // size limit; uploads have their own.
    let json_limit = state.service.options().workflow_limits.max_bytes;
    let at = |path: &str| format!("{base}{path}");
    // A submission over the limit is a workflow over it (`jobs::submit`).
    let submit = BodyLimit::refusing(json_limit, |max| jobs::workflow_too_large(max).into_response())
        .on(Router::new().route(&at("/jobs"), post(jobs::submit).get(jobs::list)));
    let json = BodyLimit::new(json_limit).on(Router::new()
        .route(&at("/health"), get(jobs::health))
        .route(&at("/ready"), get(jobs::ready))
        .route(&at("/jobs/{id}"), get(jobs::get_job))
        .route(&at("/jobs/{id}/workflow"), get(jobs::workflow))
        .route(&at("/jobs/{id}/cancel"), post(jobs::cancel))
        .route(&at("/jobs/{id}/events"), get(events::stream))
        .route(&at("/assets/by-hash/{hash}"), head(assets::head_by_hash))
        .route(&at("/assets/from-hash"), post(assets::from_hash))
        .route(&at("/assets/{id}"), get(assets::get_asset).delete(assets::delete_asset))
        .route(&at("/assets/{id}/content"), get(assets::content))
        .route(&at("/signed/assets/{id}"), get(assets::signed_content)));
    let uploads = BodyLimit::new(upload_limit).on(Router::new().route(&at("/assets"), post(assets::upload)));
    // An account's own plugins (a component and its manifest).
    let plugin_bytes = usize::try_from(state.config.max_account_plugin_mb.saturating_mul(1 << 20)).unwrap_or(usize::MAX);
    let plugins = super::plugins::account_routes(base, plugin_bytes);
    submit
        .merge(json)
        .merge(uploads)
        .merge(plugins)
        .method_not_allowed_fallback(|| async { ApiError::new(crate::api::error::ApiCode::MethodNotAllowed, "Method not allowed.").into_response() })
        .with_state(state)
}

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
