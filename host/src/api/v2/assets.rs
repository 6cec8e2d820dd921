//! Asset handlers: multipart upload, by-hash probe, from-hash, get, delete,
//! content (direct with ranges, or a 302 to a signed URL), signed content.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::multipart::MultipartRejection;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Multipart, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::Value as Json_;

use super::{Segment, check_id, wire};
use crate::api::Caller;
use crate::api::body::{self, json_object, multipart_error, text_field};
use crate::api::error::ApiError;
use crate::api::{AppState, Links, content};
use crate::service::{AssetLabels, NewAsset, UploadMeta};
use crate::store::{BlobUpload, now_micros, parse_blob_name};

fn created(asset: NewAsset, links: &Links) -> Response {
    let status = if asset.created_new { StatusCode::CREATED } else { StatusCode::OK };
    (status, Json(wire::asset(&asset.asset, links, Some(asset.created_new)))).into_response()
}

/// Retention a caller may ask for, in seconds (one minute to one week).
const EXPIRES_IN: std::ops::RangeInclusive<u64> = 60..=604_800;
/// Tags per asset, and characters and bytes per tag (a tag is part of an
/// index key: the bytes bound the store's index pages).
const MAX_TAGS: usize = crate::service::MAX_ASSET_TAGS;
const MAX_TAG_CHARS: usize = 128;
const MAX_TAG_BYTES: usize = 256;

fn expires_in(seconds: Option<u64>) -> Result<Option<u64>, ApiError> {
    match seconds {
        Some(s) if !EXPIRES_IN.contains(&s) => {
            Err(ApiError::invalid_request(format!("`expires_in` must be {} to {} seconds.", EXPIRES_IN.start(), EXPIRES_IN.end())))
        }
        s => Ok(s),
    }
}

fn add_tag(labels: &mut AssetLabels, tag: String) -> Result<(), ApiError> {
    if tag.is_empty() || tag.chars().count() > MAX_TAG_CHARS || tag.len() > MAX_TAG_BYTES || tag.chars().any(char::is_control) {
        return Err(ApiError::invalid_request(format!("A tag must be 1 to {MAX_TAG_CHARS} printable characters ({MAX_TAG_BYTES} bytes in UTF-8 at most).")));
    }
    if labels.tags.len() == MAX_TAGS {
        return Err(ApiError::invalid_request(format!("At most {MAX_TAGS} tags per asset.")));
    }
    if !labels.tags.contains(&tag) {
        labels.tags.push(tag);
    }
    Ok(())
}

/// A `file_path`: a non-empty relative path, no `..`, no NUL, at most 1024 bytes.
fn check_file_path(path: &str) -> Result<&str, ApiError> {
    let bad = path.is_empty() || path.len() > 1024 || path.starts_with(['/', '\\']) || path.split(['/', '\\']).any(|s| s == "..") || path.contains('\0');
    if bad {
        return Err(ApiError::invalid_request("`file_path` must be a non-empty relative path (at most 1024 bytes) without `..`."));
    }
    Ok(path)
}

pub async fn upload(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    links: Links,
    multipart: Result<Multipart, MultipartRejection>,
) -> Result<impl IntoResponse, ApiError> {
    let limit = state.service.options().max_upload_bytes;
    let mut multipart = body::multipart(multipart)?;
    let mut meta = UploadMeta::default();
    let mut file: Option<BlobUpload> = None;
    while let Some(field) = multipart.next_field().await.map_err(|e| multipart_error(e, limit))? {
        match field.name().unwrap_or("") {
            "file" => {
                if file.is_some() {
                    return Err(ApiError::invalid_request("Only one `file` part is allowed."));
                }
                file = Some(body::receive_file(&state.service, field, limit, ApiError::from).await?);
            }
            "content_type" => meta.content_type = Some(text_field(field, limit).await?),
            "file_path" => meta.file_path = Some(text_field(field, limit).await?),
            "expected_hash" => meta.expected_hash = Some(text_field(field, limit).await?),
            "tags" => {
                let tag = text_field(field, limit).await?;
                add_tag(&mut meta.labels, tag)?;
            }
            "expires_in" => {
                let text = text_field(field, limit).await?;
                let seconds = text.trim().parse::<u64>().map_err(|_| ApiError::invalid_request("`expires_in` must be a whole number of seconds."))?;
                meta.labels.expires_in = expires_in(Some(seconds))?;
            }
            _ => {
                // Unknown parts: read and ignore.
                text_field(field, limit).await?;
            }
        }
    }
    let file = file.ok_or_else(|| ApiError::invalid_request("The upload has no `file` part."))?;
    // Named by its own part (the SDK always sends one), not by the file
    // part's file name: an upload without it is refused (contract, scenario 29).
    check_file_path(meta.file_path.as_deref().ok_or_else(|| ApiError::invalid_request("The upload has no `file_path` part."))?)?;
    let service = state.service.clone();
    let owner = caller.owner().to_string();
    let asset = tokio::task::spawn_blocking(move || service.commit_upload(&owner, file, meta)).await.map_err(|e| ApiError::internal(&e))??;
    Ok(created(asset, &links))
}

pub async fn head_by_hash(State(state): State<Arc<AppState>>, caller: Caller, Segment(hash): Segment) -> Response {
    let known = parse_blob_name(&hash).is_some() && state.service.has_blob(caller.owner(), &hash).await.unwrap_or(false);
    if known { StatusCode::OK.into_response() } else { StatusCode::NOT_FOUND.into_response() }
}

pub async fn from_hash(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    links: Links,
    body: Result<Bytes, BytesRejection>,
) -> Result<impl IntoResponse, ApiError> {
    let body = json_object(body, state.service.options().workflow_limits.max_bytes)?;
    let hash = body.get("hash").and_then(Json_::as_str).ok_or_else(|| ApiError::invalid_request("`hash` (blake3:<hex>) is required."))?;
    if parse_blob_name(hash).is_none() {
        return Err(ApiError::invalid_request("`hash` must be blake3:<64 hex digits>."));
    }
    let file_path = match body.get("file_path") {
        None | Some(Json_::Null) => None,
        Some(Json_::String(s)) => Some(check_file_path(s)?.to_string()),
        Some(_) => return Err(ApiError::invalid_request("`file_path` must be a string.")),
    };
    let mut labels = AssetLabels::default();
    match body.get("tags") {
        None | Some(Json_::Null) => {}
        Some(Json_::Array(tags)) => {
            for tag in tags {
                let tag = tag.as_str().ok_or_else(|| ApiError::invalid_request("`tags` must be an array of strings."))?;
                add_tag(&mut labels, tag.to_string())?;
            }
        }
        Some(_) => return Err(ApiError::invalid_request("`tags` must be an array of strings.")),
    }
    labels.expires_in = match body.get("expires_in") {
        None | Some(Json_::Null) => None,
        Some(v) => expires_in(Some(v.as_u64().ok_or_else(|| ApiError::invalid_request("`expires_in` must be a whole number of seconds."))?))?,
    };
    let service = state.service.clone();
    let (owner, hash) = (caller.owner().to_string(), hash.to_string());
    let asset = tokio::task::spawn_blocking(move || service.asset_from_hash(&owner, &hash, file_path, labels)).await.map_err(|e| ApiError::internal(&e))??;
    Ok(created(asset, &links))
}

pub async fn get_asset(State(state): State<Arc<AppState>>, caller: Caller, links: Links, Segment(id): Segment) -> Result<Response, ApiError> {
    check_id(&id)?;
    Ok(Json(wire::asset(&state.service.asset(caller.owner(), &id).await?, &links, None)).into_response())
}

pub async fn delete_asset(State(state): State<Arc<AppState>>, caller: Caller, Segment(id): Segment) -> Result<StatusCode, ApiError> {
    check_id(&id)?;
    let (service, owner) = (state.service.clone(), caller.owner().to_string());
    crate::api::pool::on_pool(move || async move { service.delete_asset(&owner, &id).await }).await??;
    Ok(StatusCode::NO_CONTENT)
}

pub async fn content(State(state): State<Arc<AppState>>, caller: Caller, links: Links, Segment(id): Segment, headers: HeaderMap) -> Result<Response, ApiError> {
    check_id(&id)?;
    let asset = state.service.asset(caller.owner(), &id).await?;
    // Hosted (accounts), or when the operator asks: a fresh signed URL.
    if state.config.download_redirect || links.signs() {
        let expires = crate::api::signing::expiry(state.config.signed_url_ttl_s);
        let location = links.signed(&state.signer, &asset.id, expires);
        return Ok((StatusCode::FOUND, [(header::LOCATION, location)]).into_response());
    }
    let file = state.service.asset_file(&asset).await?;
    content::serve(file, &asset.content_type, &asset.hash, &headers).await
}

#[derive(serde::Deserialize)]
pub struct Signature {
    expires: i64,
    sig: String,
}

pub async fn signed_content(
    State(state): State<Arc<AppState>>,
    Segment(id): Segment,
    query: Result<Query<Signature>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let forbidden = || ApiError::forbidden("The download link is invalid or has expired.");
    let Query(sig) = query.map_err(|_| forbidden())?;
    if !state.signer.verify(&id, sig.expires, &sig.sig, now_micros() / 1_000_000) {
        return Err(forbidden());
    }
    let asset = state.service.signed_asset(&id).await?;
    let file = state.service.asset_file(&asset).await?;
    content::serve(file, &asset.content_type, &asset.hash, &headers).await
}
