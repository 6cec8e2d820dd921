//! What the web frontend keeps per user, in the data directory (see
//! [`UserFiles`](crate::service::user_files::UserFiles)): `/api/settings`
//! (`GET` all, `GET`/`POST` one by id, `POST` several) and `/api/userdata`
//! (a listing with `dir`, `recurse`, `split`, `full_info`; `GET`, `POST`,
//! `DELETE` a file; `POST /api/userdata/{file}/move/{dest}`), with
//! ComfyUI's bodies and statuses (a missing directory or file is 404, an
//! existing one without `overwrite` 409).

use std::collections::HashMap;
use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value as Json_, json};

use crate::api::AppState;
use crate::api::Caller;
use crate::api::error::{ApiCode, ApiError};
use crate::service::user_files::{FileInfo, UserFilesError};

type Params = Query<HashMap<String, String>>;

fn flag(params: &HashMap<String, String>, name: &str) -> bool {
    params.get(name).is_some_and(|v| v.eq_ignore_ascii_case("true"))
}

/// The one mapping of user-file failures to statuses.
fn error(e: UserFilesError) -> ApiError {
    match e {
        UserFilesError::InvalidPath(_) | UserFilesError::BadSettings(_) => ApiError::invalid_request(e.to_string()),
        UserFilesError::NotFound => ApiError::not_found(),
        UserFilesError::Exists => ApiError::new(ApiCode::Conflict, "File already exists"),
        UserFilesError::TooLarge { limit } => ApiError::payload_too_large(limit),
        UserFilesError::Full { .. } => ApiError::new(ApiCode::StorageFull, e.to_string()),
        UserFilesError::Store(e) => ApiError::from(crate::service::ServiceError::Store(e)),
    }
}

/// Runs blocking file work off the reactor.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T, UserFilesError> + Send + 'static) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| ApiError::internal(&e))?.map_err(error)
}

fn info_json(info: &FileInfo) -> Json_ {
    json!({ "path": info.path, "size": info.size, "modified": info.modified_ms, "created": info.created_ms })
}

pub async fn settings(State(state): State<Arc<AppState>>, caller: Caller) -> Result<Json<Map<String, Json_>>, ApiError> {
    Ok(Json(blocking(move || state.files_of(&caller).settings()).await?))
}

pub async fn setting(State(state): State<Arc<AppState>>, caller: Caller, Path(id): Path<String>) -> Result<Json<Json_>, ApiError> {
    Ok(Json(blocking(move || state.files_of(&caller).setting(&id)).await?.unwrap_or(Json_::Null)))
}

/// `POST /api/settings`: a JSON object of settings, merged into the stored ones.
pub async fn set_many(State(state): State<Arc<AppState>>, caller: Caller, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let values = crate::api::body::json_object(body, state.user_files.limits().settings_bytes)?;
    blocking(move || state.files_of(&caller).update_settings(values)).await?;
    Ok(super::empty_ok())
}

/// `POST /api/settings/{id}`: the body is the setting's JSON value.
pub async fn set_one(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let limit = state.user_files.limits().settings_bytes;
    let bytes = crate::api::body::bytes(body, limit as u64)?;
    let value: Json_ = serde_json::from_slice(&bytes).map_err(|e| ApiError::invalid_request(format!("The setting is not valid JSON: {e}")))?;
    if id.is_empty() || id.len() > 256 {
        return Err(ApiError::invalid_request("A setting id is 1 to 256 bytes."));
    }
    blocking(move || state.files_of(&caller).update_settings(Map::from_iter([(id, value)]))).await?;
    Ok(super::empty_ok())
}

/// `GET /api/userdata?dir=...`: relative paths, `[path, part...]` with
/// `split`, or file descriptions with `full_info`.
pub async fn list(State(state): State<Arc<AppState>>, caller: Caller, Query(params): Params) -> Result<Json<Json_>, ApiError> {
    let Some(dir) = params.get("dir").filter(|d| !d.is_empty()).cloned() else {
        return Err(ApiError::invalid_request("Directory not provided"));
    };
    let recurse = flag(&params, "recurse");
    let files = blocking(move || state.files_of(&caller).list(&dir, recurse)).await?;
    let (full, split) = (flag(&params, "full_info"), flag(&params, "split"));
    Ok(Json(Json_::Array(
        files
            .iter()
            .map(|f| match (full, split) {
                (true, _) => info_json(f),
                (false, true) => Json_::Array(std::iter::once(f.path.as_str()).chain(f.path.split('/')).map(Json_::from).collect()),
                (false, false) => Json_::from(f.path.as_str()),
            })
            .collect(),
    )))
}

pub async fn read(State(state): State<Arc<AppState>>, caller: Caller, Path(file): Path<String>) -> Result<Response, ApiError> {
    let name = file.rsplit('/').next().unwrap_or("file").replace(['"', '\\'], "_");
    let bytes = blocking(move || state.files_of(&caller).read(&file)).await?;
    let mut response = bytes.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(if name.ends_with(".json") { "application/json" } else { "application/octet-stream" }));
    if let Ok(v) = HeaderValue::try_from(format!("attachment; filename=\"{name}\"")) {
        headers.insert(header::CONTENT_DISPOSITION, v);
    }
    Ok(response)
}

/// `POST /api/userdata/{file}?overwrite=&full_info=`: the raw body is the
/// file (`overwrite` defaults to true, as in ComfyUI).
pub async fn write(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(file): Path<String>,
    Query(params): Params,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Json_>, ApiError> {
    let limit = state.user_files.limits().file_bytes;
    let bytes = crate::api::body::bytes(body, limit)?;
    let overwrite = params.get("overwrite").is_none_or(|v| !v.eq_ignore_ascii_case("false"));
    let info = blocking(move || state.files_of(&caller).write(&file, &bytes, overwrite)).await?;
    Ok(Json(if flag(&params, "full_info") { info_json(&info) } else { Json_::from(info.path) }))
}

pub async fn delete(State(state): State<Arc<AppState>>, caller: Caller, Path(file): Path<String>) -> Result<Response, ApiError> {
    blocking(move || state.files_of(&caller).delete(&file)).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `POST /api/userdata/{file}/move/{dest}?overwrite=&full_info=`.
pub async fn rename(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path((file, dest)): Path<(String, String)>,
    Query(params): Params,
) -> Result<Json<Json_>, ApiError> {
    let overwrite = params.get("overwrite").is_none_or(|v| !v.eq_ignore_ascii_case("false"));
    let info = blocking(move || state.files_of(&caller).rename(&file, &dest, overwrite)).await?;
    Ok(Json(if flag(&params, "full_info") { info_json(&info) } else { Json_::from(info.path) }))
}
