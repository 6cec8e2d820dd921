//! `GET /api/object_info` and `/api/object_info/{class}`: the node
//! definitions of the loaded plugins in ComfyUI's shape
//! (`crate::object_info`), LoadImage's `image` combo listing the uploaded
//! input images at request time. The whole listing is rendered once per
//! change of the uploads or the plugins (an install) and kept with its gzip
//! form and an `ETag` (the body's hash): a
//! matching `If-None-Match` gets 304, `Accept-Encoding: gzip` the
//! compressed bytes.

use std::io::Write;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value as Json};

use crate::api::AppState;
use crate::api::Caller;
use crate::api::error::ApiError;
use crate::api::v2::Segment;
use crate::service::job_files::JobInputs;

/// The rendered listing and the generations (uploads, plugins) it was
/// rendered at.
pub struct Rendered {
    generation: (u64, u64),
    etag: HeaderValue,
    json: Bytes,
    gzip: Bytes,
}

/// The last rendered listing of each recent caller (LoadImage lists the
/// caller's own uploads).
pub struct ObjectInfoCache(parking_lot::Mutex<lru::LruCache<String, Arc<Rendered>>>);

impl Default for ObjectInfoCache {
    fn default() -> Self {
        ObjectInfoCache(parking_lot::Mutex::new(lru::LruCache::new(std::num::NonZeroUsize::new(64).unwrap_or(std::num::NonZeroUsize::MIN))))
    }
}

/// What LoadImage can list: the caller's uploaded input files.
fn uploads(state: &AppState, owner: &str) -> Result<JobInputs, ApiError> {
    let inputs = state.service.input_uploads(owner).map_err(super::compat_error)?;
    Ok(JobInputs::new(&inputs, state.service.blobs().clone()))
}

/// `GET /internal/files/{type}`: the names of the caller's uploaded input
/// files, sorted (the frontend refreshes LoadImage's list with it after an
/// upload); outputs and temporary files are not listed by folder (`[]`).
pub async fn files(State(state): State<Arc<AppState>>, caller: Caller, Path(kind): Path<String>) -> Result<axum::Json<Json>, ApiError> {
    match kind.as_str() {
        "input" => {
            let mut names: Vec<String> = state.service.input_uploads(caller.owner()).map_err(super::compat_error)?.into_iter().map(|i| i.name).collect();
            names.sort();
            names.dedup();
            Ok(axum::Json(Json::from(names)))
        }
        "output" | "temp" => Ok(axum::Json(Json::Array(Vec::new()))),
        _ => Err(ApiError::invalid_request("Invalid directory type")),
    }
}

fn render(state: &AppState, owner: &str, generation: (u64, u64)) -> Result<Rendered, ApiError> {
    let files = uploads(state, owner)?;
    let registry = state.service.registry_for(owner);
    let mut all = Map::new();
    for def in registry.definitions() {
        all.insert(def.class_type.clone(), crate::object_info::node_info(def, registry.meta(&def.class_type), &files));
    }
    let json = serde_json::to_vec(&Json::Object(all)).map_err(|e| ApiError::internal(&e))?;
    let mut gz = flate2::write::GzEncoder::new(Vec::with_capacity(json.len() / 4), flate2::Compression::default());
    gz.write_all(&json).map_err(|e| ApiError::internal(&e))?;
    let gzip = gz.finish().map_err(|e| ApiError::internal(&e))?;
    let etag = HeaderValue::from_str(&format!("\"{}\"", &blake3::hash(&json).to_hex()[..32])).map_err(|e| ApiError::internal(&e))?;
    Ok(Rendered { generation, etag, json: json.into(), gzip: gzip.into() })
}

/// `owner`'s current listing (rendered again when an upload happened since).
fn current(state: &AppState, owner: &str) -> Result<Arc<Rendered>, ApiError> {
    // The plugins' generation first: a listing rendered after an install
    // never carries the generation from before it.
    let plugins = state.service.plugins().generation();
    let generation = (state.service.uploads_generation(), plugins);
    if let Some(r) = state.object_info.0.lock().get(owner).filter(|r| r.generation == generation) {
        return Ok(r.clone());
    }
    let rendered = Arc::new(render(state, owner, generation)?);
    state.object_info.0.lock().put(owner.to_string(), rendered.clone());
    Ok(rendered)
}

/// Whether the client takes gzip (a `gzip` coding not refused with `q=0`).
fn accepts_gzip(headers: &HeaderMap) -> bool {
    headers.get_all(header::ACCEPT_ENCODING).iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(',')).any(|coding| {
        let mut parts = coding.split(';').map(str::trim);
        let name = parts.next().unwrap_or("");
        let refused = parts.any(|p| p.strip_prefix("q=").is_some_and(|q| q.parse::<f32>().is_ok_and(|q| q <= 0.0)));
        (name.eq_ignore_ascii_case("gzip") || name == "*") && !refused
    })
}

fn matches_etag(headers: &HeaderMap, etag: &HeaderValue) -> bool {
    let Some(given) = headers.get(header::IF_NONE_MATCH).and_then(|v| v.to_str().ok()) else { return false };
    let ours = etag.to_str().unwrap_or("");
    given.split(',').map(str::trim).any(|t| t == "*" || t == ours || t.strip_prefix("W/") == Some(ours))
}

pub async fn all(State(state): State<Arc<AppState>>, caller: Caller, headers: HeaderMap) -> Result<Response, ApiError> {
    let st = state.clone();
    let rendered = tokio::task::spawn_blocking(move || current(&st, caller.owner())).await.map_err(|e| ApiError::internal(&e))??;
    let mut builder = Response::builder().header(header::ETAG, rendered.etag.clone()).header(header::VARY, "Accept-Encoding");
    if matches_etag(&headers, &rendered.etag) {
        return builder.status(StatusCode::NOT_MODIFIED).body(Body::empty()).map_err(|e| ApiError::internal(&e));
    }
    builder = builder.header(header::CONTENT_TYPE, "application/json; charset=utf-8");
    let body = if accepts_gzip(&headers) {
        builder = builder.header(header::CONTENT_ENCODING, "gzip");
        rendered.gzip.clone()
    } else {
        rendered.json.clone()
    };
    builder.body(Body::from(body)).map_err(|e| ApiError::internal(&e))
}

/// One class, or `{}` (200) for a class that does not exist, as ComfyUI answers.
pub async fn one(State(state): State<Arc<AppState>>, caller: Caller, Segment(class): Segment) -> Result<Response, ApiError> {
    let mut out = Map::new();
    let registry = state.service.registry_for(caller.owner());
    if let Some((_, def)) = registry.get(&class) {
        let files = uploads(&state, caller.owner())?;
        out.insert(def.class_type.clone(), crate::object_info::node_info(def, registry.meta(&class), &files));
    }
    Ok(axum::Json(Json::Object(out)).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gzip_is_taken_unless_refused() {
        let h = |v: &str| {
            let mut m = HeaderMap::new();
            m.insert(header::ACCEPT_ENCODING, HeaderValue::from_str(v).unwrap());
            m
        };
        assert!(accepts_gzip(&h("gzip, deflate, br")));
        assert!(accepts_gzip(&h("br;q=1.0, GZIP;q=0.5")));
        assert!(!accepts_gzip(&h("gzip;q=0")));
        assert!(!accepts_gzip(&h("deflate")));
        assert!(!accepts_gzip(&HeaderMap::new()));
    }
}
