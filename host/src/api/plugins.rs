//! Plugins installed into a running host. The operator's, under the admin
//! gate: `POST /admin/plugins` installs or upgrades one (multipart:
//! `manifest`, the manifest's TOML text; `component`, the `.wasm`) and
//! answers 201 `{name, version, hash, classes}`; `GET /admin/plugins` lists
//! them; `DELETE /admin/plugins/{name}` removes an installed one (204);
//! bodies bounded by `max_plugin_mb`. An account's own (cloud and
//! serverless modes), with its key: the same three under
//! `/api/v2/plugins`, seen by that account only, bodies bounded by
//! `max_account_plugin_mb`. Where hosts share a store, an install or
//! removal through any host is every host's. The rules live in
//! `plugins::live`, `plugins::account_plugins` and `plugins::shared`.

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::extract::multipart::MultipartRejection;
use axum::extract::{Multipart, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::api::AppState;
use crate::api::Caller;
use crate::api::body;
use crate::api::body_limit::BodyLimit;
use crate::api::error::{ApiCode, ApiError};
use crate::api::v2::Segment;
use crate::plugins::{InstallError, PluginInfo};

/// Largest manifest text.
const MAX_MANIFEST: usize = 64 << 10;

/// The operator's routes, with a body limit of `max_bytes`.
pub fn admin_routes(contract: &mut crate::api::openapi::Contract, max_bytes: usize) -> Router<Arc<AppState>> {
    BodyLimit::new(max_bytes).on(contract.routes("", [utoipa_axum::routes!(install, list), utoipa_axum::routes!(remove)]))
}

/// An account's routes (under the Jobs API, documented in its contract).
pub fn account_routes() -> [utoipa_axum::router::UtoipaMethodRouter<Arc<AppState>>; 2] {
    [utoipa_axum::routes!(install_own, list_own), utoipa_axum::routes!(remove_own)]
}

fn error(e: InstallError) -> ApiError {
    match e {
        InstallError::Disabled | InstallError::NotFound(_) => ApiError::new(ApiCode::NotFound, e.to_string()),
        InstallError::Manifest(_) => ApiError::invalid_request(e.to_string()),
        InstallError::Fixed(_) => ApiError::new(ApiCode::Conflict, e.to_string()),
        InstallError::Quota(_) => ApiError::new(ApiCode::TooManyPlugins, e.to_string()),
        InstallError::Refused(_) => ApiError::new(ApiCode::PluginRefused, e.to_string()),
        InstallError::Io(e) => ApiError::io(&e),
        InstallError::Shared(e) => crate::service::ServiceError::Store(e).into(),
    }
}

/// The two parts of an install: the manifest's text and the component.
async fn read_plugin(multipart: Result<Multipart, MultipartRejection>, limit: u64) -> Result<(String, Vec<u8>), ApiError> {
    let missing = "A plugin is two parts: `manifest` (its kiln-plugin.toml) and `component` (its .wasm).";
    let (manifest, component) = body::two_parts(multipart, limit, ("manifest", MAX_MANIFEST), "component", missing).await?;
    let manifest = String::from_utf8(manifest.to_vec()).map_err(|_| ApiError::invalid_request("The manifest is not UTF-8 text."))?;
    Ok((manifest, component.to_vec()))
}

fn created(info: PluginInfo) -> Response {
    (StatusCode::CREATED, Json(serde_json::json!({"name": info.name, "version": info.version, "hash": info.hash, "classes": info.classes}))).into_response()
}

#[utoipa::path(post, path = "/admin/plugins", operation_id = "install_host_plugin", tag = "plugins",
    description = "Installs or upgrades a plugin for every caller of this host (of every host, where hosts share a store).",
    request_body(content = inline(crate::api::openapi::schemas::PluginUpload), content_type = "multipart/form-data"),
    responses((status = 201, description = "Installed.", body = crate::api::openapi::schemas::PluginView)))]
async fn install(State(state): State<Arc<AppState>>, multipart: Result<Multipart, MultipartRejection>) -> Result<Response, ApiError> {
    let (manifest, component) = read_plugin(multipart, state.config.max_plugin_mb.saturating_mul(1 << 20)).await?;
    let service = state.service.clone();
    let info = crate::api::pool::on_pool(move || async move { service.plugins().install(&manifest, component).await }).await?.map_err(error)?;
    Ok(created(info))
}

#[utoipa::path(get, path = "/admin/plugins", operation_id = "list_host_plugins", tag = "plugins",
    responses((status = 200, description = "`{plugins: [...]}`.", body = inline(PluginList))))]
async fn list(State(state): State<Arc<AppState>>) -> Json<serde_json::Value> {
    Json(serde_json::json!({ "plugins": state.service.plugins().list() }))
}

#[utoipa::path(delete, path = "/admin/plugins/{name}", operation_id = "remove_host_plugin", tag = "plugins",
    params(("name" = String, Path, description = "The plugin's name.")),
    responses((status = 204, description = "Removed.")))]
async fn remove(State(state): State<Arc<AppState>>, Segment(name): Segment) -> Result<StatusCode, ApiError> {
    let service = state.service.clone();
    crate::api::pool::on_pool(move || async move { service.plugins().remove(&name).await }).await?.map_err(error)?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /plugins`.
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
struct PluginList {
    plugins: Vec<crate::api::openapi::schemas::PluginView>,
}

/// An account's plugins exist only on a host with accounts; elsewhere (and
/// for a deployment's caller) the routes answer as unknown ones.
fn own_plugins(state: &AppState, caller: &Caller) -> Result<(), ApiError> {
    if state.config.mode.has_accounts() && caller.deployment_id().is_none() { Ok(()) } else { Err(ApiError::not_found()) }
}

#[utoipa::path(post, path = "/plugins", operation_id = "install_plugin", tag = "plugins",
    description = "Installs or upgrades one of the caller's own plugins (hosts with accounts; elsewhere 404).",
    request_body(content = inline(crate::api::openapi::schemas::PluginUpload), content_type = "multipart/form-data"),
    responses((status = 201, description = "Installed.", body = crate::api::openapi::schemas::PluginView)))]
async fn install_own(State(state): State<Arc<AppState>>, caller: Caller, multipart: Result<Multipart, MultipartRejection>) -> Result<Response, ApiError> {
    own_plugins(&state, &caller)?;
    let (manifest, component) = read_plugin(multipart, state.config.max_account_plugin_mb.saturating_mul(1 << 20)).await?;
    let (service, owner) = (state.service.clone(), caller.owner().to_string());
    let info = crate::api::pool::on_pool(move || async move { service.plugins().install_for(&owner, &manifest, component).await }).await?.map_err(error)?;
    Ok(created(info))
}

#[utoipa::path(get, path = "/plugins", operation_id = "list_plugins", tag = "plugins",
    description = "The caller's own plugins (hosts with accounts; elsewhere 404).",
    responses((status = 200, description = "`{plugins: [...]}`.", body = inline(PluginList))))]
async fn list_own(State(state): State<Arc<AppState>>, caller: Caller) -> Result<Json<serde_json::Value>, ApiError> {
    own_plugins(&state, &caller)?;
    Ok(Json(serde_json::json!({ "plugins": state.service.plugins().list_for(caller.owner()).map_err(error)? })))
}

#[utoipa::path(delete, path = "/plugins/{name}", operation_id = "remove_plugin", tag = "plugins",
    params(("name" = String, Path, description = "The plugin's name.")),
    responses((status = 204, description = "Removed.")))]
async fn remove_own(State(state): State<Arc<AppState>>, caller: Caller, Segment(name): Segment) -> Result<StatusCode, ApiError> {
    own_plugins(&state, &caller)?;
    let (service, owner) = (state.service.clone(), caller.owner().to_string());
    crate::api::pool::on_pool(move || async move { service.plugins().remove_for(&owner, &name).await }).await?.map_err(error)?;
    Ok(StatusCode::NO_CONTENT)
}
