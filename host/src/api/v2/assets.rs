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
pub const EXPIRES_IN: std::ops::RangeInclusive<u64> = 60..=604_800;
/// Tags per asset, and characters per tag (a tag is part of an index key:
/// 64 characters are at most 256 bytes, which bounds the store's index
/// pages).
const MAX_TAGS: usize = crate::service::MAX_ASSET_TAGS;
pub const MAX_TAG_CHARS: usize = 64;
/// Characters of a `file_path`.
pub const MAX_FILE_PATH_CHARS: usize = 1024;
/// Characters of an upload's `content_type`.
pub const MAX_MEDIA_TYPE_CHARS: usize = 255;

/// A whole number of seconds: an integer, or a number with no fraction
/// (`600.0` is 600, as JSON Schema's `integer` has it); `None` otherwise.
fn whole_seconds(value: &Json_) -> Option<u64> {
    value.as_u64().or_else(|| value.as_f64().filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f <= u64::MAX as f64).map(|f| f as u64))
}

fn expires_in(seconds: Option<u64>) -> Result<Option<u64>, ApiError> {
    match seconds {
        Some(s) if !EXPIRES_IN.contains(&s) => {
            Err(ApiError::invalid_request(format!("`expires_in` must be {} to {} seconds.", EXPIRES_IN.start(), EXPIRES_IN.end())))
        }
        s => Ok(s),
    }
}

fn add_tag(labels: &mut AssetLabels, tag: String) -> Result<(), ApiError> {
    if tag.is_empty() || tag.chars().count() > MAX_TAG_CHARS || tag.chars().any(char::is_control) {
        return Err(ApiError::invalid_request(format!("A tag must be 1 to {MAX_TAG_CHARS} characters without control characters.")));
    }
    if labels.tags.len() == MAX_TAGS {
        return Err(ApiError::invalid_request(format!("At most {MAX_TAGS} tags per asset.")));
    }
    if !labels.tags.contains(&tag) {
        labels.tags.push(tag);
    }
    Ok(())
}

/// A `file_path`: a non-empty relative path, no `..`, no NUL, at most
/// [`MAX_FILE_PATH_CHARS`] characters (the document's pattern:
/// `api::openapi::schemas::file_path`).
fn check_file_path(path: &str) -> Result<&str, ApiError> {
    let bad = path.is_empty()
        || path.chars().count() > MAX_FILE_PATH_CHARS
        || path.starts_with(['/', '\\'])
        || path.split(['/', '\\']).any(|s| s == "..")
        || path.contains('\0');
    if bad {
        return Err(ApiError::invalid_request(format!(
            "`file_path` must be a non-empty relative path (at most {MAX_FILE_PATH_CHARS} characters) without `..`."
        )));
    }
    Ok(path)
}

/// An upload's `content_type`: empty (octet-stream), or `type/subtype` of
/// RFC 6838 name characters, parameters after `;` in printable ASCII (the
/// document's pattern: `api::openapi::schemas::media_type`).
fn check_media_type(text: &str) -> Result<(), ApiError> {
    let name =
        |s: &str| s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric()) && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$&^_.+-".contains(&b));
    let (essence, params) = text.split_once(';').unwrap_or((text, ""));
    let ok = text.is_empty()
        || (text.chars().count() <= MAX_MEDIA_TYPE_CHARS
            && essence.split_once('/').is_some_and(|(t, s)| name(t) && name(s))
            && params.bytes().all(|b| (0x20..0x7f).contains(&b)));
    if ok { Ok(()) } else { Err(ApiError::invalid_request("`content_type` must be a media type (type/subtype).")) }
}

#[utoipa::path(post, path = "/assets", operation_id = "upload_asset", tag = "assets",
    description = "Uploads a file. Bytes already stored (by hash) make a new record without a second copy (200, `created_new: false`).",
    request_body(content = inline(crate::api::openapi::schemas::Upload), content_type = "multipart/form-data"),
    responses(
        (status = 201, description = "Stored.", body = wire::AssetView, links(
            ("GetAsset" = (operation_id = "get_asset", parameters(("id" = "$response.body#/id")))),
            ("AssetContent" = (operation_id = "asset_content", parameters(("id" = "$response.body#/id")))),
            ("DeleteAsset" = (operation_id = "delete_asset", parameters(("id" = "$response.body#/id")))))),
        (status = 200, description = "The bytes were already stored.", body = wire::AssetView, links(
            ("GetAsset" = (operation_id = "get_asset", parameters(("id" = "$response.body#/id")))),
            ("AssetContent" = (operation_id = "asset_content", parameters(("id" = "$response.body#/id")))),
            ("DeleteAsset" = (operation_id = "delete_asset", parameters(("id" = "$response.body#/id"))))))))]
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
            "content_type" => {
                let text = text_field(field, limit).await?;
                check_media_type(&text)?;
                meta.content_type = Some(text);
            }
            "file_path" => meta.file_path = Some(text_field(field, limit).await?),
            "expected_hash" => meta.expected_hash = Some(text_field(field, limit).await?),
            "tags" => {
                let tag = text_field(field, limit).await?;
                add_tag(&mut meta.labels, tag)?;
            }
            "expires_in" => {
                let text = text_field(field, limit).await?;
                let text = text.trim();
                let seconds = text
                    .parse::<u64>()
                    .ok()
                    .or_else(|| serde_json::from_str::<Json_>(text).ok().as_ref().and_then(whole_seconds))
                    .ok_or_else(|| ApiError::invalid_request("`expires_in` must be a whole number of seconds."))?;
                meta.labels.expires_in = expires_in(Some(seconds))?;
            }
            other => {
                return Err(ApiError::invalid_request(format!(
                    "Unknown part {other:?}: an upload has `file`, `file_path`, `content_type`, `expected_hash`, `tags` and `expires_in`."
                )));
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

#[utoipa::path(head, path = "/assets/by-hash/{hash}", operation_id = "asset_by_hash", tag = "assets",
    description = "Whether the caller may use bytes with this hash (`blake3:<hex>`) without uploading them.",
    params(("hash" = String, Path, description = "`blake3:<64 hex digits>`.")),
    responses((status = 200, description = "Known."), (status = 404, description = "Unknown (no body).")))]
pub async fn head_by_hash(State(state): State<Arc<AppState>>, caller: Caller, Segment(hash): Segment) -> Response {
    let known = parse_blob_name(&hash).is_some() && state.service.has_blob(caller.owner(), &hash).await.unwrap_or(false);
    if known { StatusCode::OK.into_response() } else { StatusCode::NOT_FOUND.into_response() }
}

#[utoipa::path(post, path = "/assets/from-hash", operation_id = "asset_from_hash", tag = "assets",
    request_body(content = crate::api::openapi::schemas::FromHash, content_type = "application/json"),
    responses(
        (status = 201, description = "A new record.", body = wire::AssetView, links(
            ("GetAsset" = (operation_id = "get_asset", parameters(("id" = "$response.body#/id")))),
            ("AssetContent" = (operation_id = "asset_content", parameters(("id" = "$response.body#/id")))),
            ("DeleteAsset" = (operation_id = "delete_asset", parameters(("id" = "$response.body#/id")))))),
        (status = 200, description = "The caller's record for these bytes.", body = wire::AssetView, links(
            ("GetAsset" = (operation_id = "get_asset", parameters(("id" = "$response.body#/id")))),
            ("AssetContent" = (operation_id = "asset_content", parameters(("id" = "$response.body#/id")))),
            ("DeleteAsset" = (operation_id = "delete_asset", parameters(("id" = "$response.body#/id"))))))))]
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
        Some(v) => expires_in(Some(whole_seconds(v).ok_or_else(|| ApiError::invalid_request("`expires_in` must be a whole number of seconds."))?))?,
    };
    let service = state.service.clone();
    let (owner, hash) = (caller.owner().to_string(), hash.to_string());
    let asset = tokio::task::spawn_blocking(move || service.asset_from_hash(&owner, &hash, file_path, labels)).await.map_err(|e| ApiError::internal(&e))??;
    Ok(created(asset, &links))
}

#[utoipa::path(get, path = "/assets/{id}", operation_id = "get_asset", tag = "assets",
    params(("id" = String, Path, description = "The asset's id (a UUID).")),
    responses((status = 200, description = "The asset.", body = wire::AssetView)))]
pub async fn get_asset(State(state): State<Arc<AppState>>, caller: Caller, links: Links, Segment(id): Segment) -> Result<Response, ApiError> {
    check_id(&id)?;
    Ok(Json(wire::asset(&state.service.asset(caller.owner(), &id).await?, &links, None)).into_response())
}

#[utoipa::path(delete, path = "/assets/{id}", operation_id = "delete_asset", tag = "assets",
    description = "Deletes an asset: any upload; a job's output only once its job is gone (409 `asset_in_use` while it is kept).",
    params(("id" = String, Path, description = "The asset's id (a UUID).")),
    responses((status = 204, description = "Deleted.")))]
pub async fn delete_asset(State(state): State<Arc<AppState>>, caller: Caller, Segment(id): Segment) -> Result<StatusCode, ApiError> {
    check_id(&id)?;
    let (service, owner) = (state.service.clone(), caller.owner().to_string());
    crate::api::pool::on_pool(move || async move { service.delete_asset(&owner, &id).await }).await??;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(get, path = "/assets/{id}/content", operation_id = "asset_content", tag = "assets",
    description = "The bytes, honouring one `Range`; on hosts with accounts (or `download_redirect`) a 302 to a signed URL instead.",
    params(("id" = String, Path, description = "The asset's id (a UUID)."), ("Range" = Option<String>, Header, description = "One byte range.")),
    responses(
        (status = 200, description = "The bytes.", content_type = "*/*", body = Vec<u8>,
            headers(("ETag" = String, description = "The content hash, quoted."), ("Accept-Ranges" = String))),
        (status = 206, description = "The requested range.", content_type = "*/*", body = Vec<u8>,
            headers(("Content-Range" = String), ("ETag" = String))),
        (status = 302, description = "Download from the signed URL.", headers(("Location" = String, description = "A signed URL, valid for `signed_url_ttl_s`.")))))]
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

#[utoipa::path(get, path = "/signed/assets/{id}", operation_id = "signed_asset_content", tag = "assets",
    description = "The bytes behind a signed URL (no credentials: the signature is the permission).",
    params(("id" = String, Path, description = "The asset's id (a UUID)."),
        ("expires" = i64, Query, description = "Unix seconds the signature is good until."),
        ("sig" = String, Query, description = "The signature."),
        ("Range" = Option<String>, Header, description = "One byte range.")),
    responses((status = 200, description = "The bytes.", content_type = "*/*", body = Vec<u8>,
            headers(("ETag" = String, description = "The content hash, quoted."), ("Accept-Ranges" = String))),
        (status = 206, description = "The requested range.", content_type = "*/*", body = Vec<u8>,
            headers(("Content-Range" = String), ("ETag" = String)))))]
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
