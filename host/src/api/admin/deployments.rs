//! Admin routes of serverless deployments: create, list, show, stop, start.
//! The service owns the rules (`service::deployments`); these handlers
//! parse and render (the admin gate in `admin/mod.rs` checked the token).
//! A deployment is created from a JSON body (its spec), or from a bundle:
//! a multipart body of `deployment` (the same JSON) and `bundle` (the
//! file), bounded by `max_bundle_mb`; a bundle that is damaged or needs
//! components this host lacks is 422 `bundle_refused`, naming them.

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::extract::FromRequest;
use axum::extract::Multipart;
use axum::extract::Request;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use utoipa_axum::routes;

use crate::api::AppState;
use crate::api::body;
use crate::api::body_limit::BodyLimit;
use crate::api::error::{ApiCode, ApiError};
use crate::api::openapi::Contract;
use crate::api::v2::Segment;
use crate::service::deployments::{DeploymentError, DeploymentRecord, DeploymentSpec};

/// The routes; creation's body (a bundle) up to `bundle_bytes`, the
/// others' up to the admin API's [`super::MAX_BODY`].
pub fn routes(contract: &mut Contract, bundle_bytes: usize) -> Router<Arc<AppState>> {
    let create_routes = BodyLimit::new(bundle_bytes).on(contract.routes("", [routes!(create)]));
    BodyLimit::new(super::MAX_BODY).on(contract.routes("", [routes!(list), routes!(get_one), routes!(stop), routes!(start)])).merge(create_routes)
}

/// A deployment: its spec's fields, its state (`service::deployments`),
/// and `api_base`, the Jobs API path it serves at.
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
struct DeploymentView {
    id: String,
    /// The owning account's id (with accounts), else the owner's name.
    owner: String,
    public_demo: bool,
    plugin_dirs: Vec<String>,
    /// The owner's limits for this deployment, when set.
    #[schema(value_type = Option<Object>)]
    limits: Option<serde_json::Value>,
    /// The bundle it runs (`hash`, `name`, `version`, `workflows`, `components`), when created from one.
    #[schema(value_type = Option<Object>)]
    bundle: Option<serde_json::Value>,
    /// `starting`, `ready`, `stopped` or `failed`.
    state: String,
    /// Why its plugins failed to load (state `failed`).
    error: Option<String>,
    /// Microseconds since the Unix epoch.
    created_at: i64,
    updated_at: i64,
    api_base: String,
}

/// `GET /admin/deployments`.
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
struct DeploymentList {
    deployments: Vec<DeploymentView>,
}

fn error(e: DeploymentError) -> ApiError {
    match e {
        DeploymentError::Invalid(m) => ApiError::invalid_request(m),
        DeploymentError::Exists(_) => ApiError::new(ApiCode::DeploymentExists, e.to_string()),
        DeploymentError::NotFound(_) => ApiError::not_found(),
        DeploymentError::Store(e) => ApiError::from(crate::service::ServiceError::Store(e)),
        DeploymentError::Bundle(e) => ApiError::new(ApiCode::BundleRefused, e.to_string()),
    }
}

/// A deployment as the admin API shows it: its record and its prefix.
fn view(state: &AppState, record: &DeploymentRecord) -> serde_json::Value {
    let mut value = serde_json::to_value(record).unwrap_or_default();
    if let Some(map) = value.as_object_mut() {
        map.insert("api_base".into(), format!("{}/deployment/{}/api/v2", state.config.mount_prefix, record.spec.id).into());
    }
    value
}

#[utoipa::path(post, path = "/admin/deployments", operation_id = "create_deployment", tag = "deployments",
    description = "Creates a deployment from its spec (JSON), or from a bundle (multipart: `deployment`, the same JSON; `bundle`, the file).",
    request_body(content(("application/json"), ("multipart/form-data"))),
    responses((status = 201, description = "Created.", body = DeploymentView)))]
async fn create(State(state): State<Arc<AppState>>, request: Request) -> Result<Response, ApiError> {
    let is_multipart = request.headers().get(axum::http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(|v| v.starts_with("multipart/"));
    let (spec, bundle) = if is_multipart {
        let limit = state.config.max_bundle_mb.saturating_mul(1 << 20);
        let missing = "A deployment from a bundle is two parts: `deployment` (its JSON) and `bundle` (the file).";
        let (spec, bundle) = body::two_parts(Multipart::from_request(request, &()).await, limit, ("deployment", super::MAX_BODY), "bundle", missing).await?;
        (spec, Some(bundle))
    } else {
        // A JSON spec is an admin body like the others: at most `MAX_BODY`
        // (the route's own limit is a bundle's), refused by its declared
        // length before it is read, or cut while read.
        let declared = request.headers().get(axum::http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > super::MAX_BODY as u64) {
            return Err(ApiError::payload_too_large(super::MAX_BODY as u64));
        }
        let bytes = axum::body::to_bytes(request.into_body(), super::MAX_BODY).await.map_err(|_| ApiError::payload_too_large(super::MAX_BODY as u64))?;
        (bytes, None)
    };
    let mut spec: DeploymentSpec = serde_json::from_slice(&spec).map_err(|e| ApiError::invalid_request(format!("Invalid deployment: {e}")))?;
    // With accounts, the owner is an account (named by name or id): its id
    // is what jobs and billing use.
    if state.config.mode.has_accounts() {
        let accounts = state.service.accounts();
        let account = accounts.by_name(&spec.owner).or_else(|| accounts.get(&spec.owner));
        spec.owner = account.ok_or_else(|| ApiError::invalid_request(format!("No account {:?} to own the deployment.", spec.owner)))?.id.clone();
    }
    let service = state.service.clone();
    let record = crate::api::pool::on_pool(move || async move { service.create_deployment(spec, bundle.as_deref()).await }).await?.map_err(error)?;
    Ok((StatusCode::CREATED, Json(view(&state, &record))).into_response())
}

#[utoipa::path(get, path = "/admin/deployments", operation_id = "list_deployments", tag = "deployments",
    responses((status = 200, description = "Every deployment.", body = DeploymentList)))]
async fn list(State(state): State<Arc<AppState>>) -> Result<Response, ApiError> {
    let all: Vec<serde_json::Value> = state.service.deployments().iter().map(|d| view(&state, d)).collect();
    Ok(Json(serde_json::json!({ "deployments": all })).into_response())
}

#[utoipa::path(get, path = "/admin/deployments/{id}", operation_id = "show_deployment", tag = "deployments", params(("id" = String, Path, description = "The deployment's id.")),
    responses((status = 200, description = "The deployment.", body = DeploymentView)))]
async fn get_one(State(state): State<Arc<AppState>>, Segment(id): Segment) -> Result<Response, ApiError> {
    let record = state.service.deployment(&id).ok_or_else(ApiError::not_found)?;
    Ok(Json(view(&state, &record)).into_response())
}

#[utoipa::path(post, path = "/admin/deployments/{id}/stop", operation_id = "stop_deployment", tag = "deployments", params(("id" = String, Path, description = "The deployment's id.")),
    responses((status = 200, description = "The deployment, stopped.", body = DeploymentView)))]
async fn stop(State(state): State<Arc<AppState>>, Segment(id): Segment) -> Result<Response, ApiError> {
    let service = state.service.clone();
    let record = crate::api::pool::on_pool(move || async move { service.stop_deployment(&id).await }).await?.map_err(error)?;
    Ok(Json(view(&state, &record)).into_response())
}

#[utoipa::path(post, path = "/admin/deployments/{id}/start", operation_id = "start_deployment", tag = "deployments", params(("id" = String, Path, description = "The deployment's id.")),
    responses((status = 200, description = "The deployment, started.", body = DeploymentView)))]
async fn start(State(state): State<Arc<AppState>>, Segment(id): Segment) -> Result<Response, ApiError> {
    let service = state.service.clone();
    let record = crate::api::pool::on_pool(move || async move { service.start_deployment(&id).await }).await?.map_err(error)?;
    Ok(Json(view(&state, &record)).into_response())
}
