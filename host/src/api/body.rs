//! Reading request bodies, for every API surface: the one rule for a body
//! over its limit (413 `payload_too_large` naming the limit) or one that
//! cannot be read (400 `invalid_request`), JSON object bodies, and the parts
//! of multipart uploads (text fields, a file streamed into a new blob).

use axum::body::Bytes;
use axum::extract::Multipart;
use axum::extract::multipart::{Field, MultipartError, MultipartRejection};
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use serde_json::{Map, Value as Json};

use crate::api::error::ApiError;
use crate::service::{Service, ServiceError};
use crate::store::BlobUpload;

/// Longest text part of a multipart upload, bytes.
const MAX_TEXT_FIELD: usize = 4096;

/// A body read that failed with `status`: 413 naming `limit` when the body
/// was over it, else 400 with `message`.
fn unreadable(status: StatusCode, limit: u64, message: impl FnOnce() -> String) -> ApiError {
    if status == StatusCode::PAYLOAD_TOO_LARGE { ApiError::payload_too_large(limit) } else { ApiError::invalid_request(message()) }
}

/// The body's bytes, at most `limit` (the 400's message is the rejection's own).
pub fn bytes(body: Result<Bytes, BytesRejection>, limit: u64) -> Result<Bytes, ApiError> {
    body.map_err(|e| unreadable(e.status(), limit, || e.body_text()))
}

/// Maps a body-read failure (over `limit` bytes, broken stream) to the envelope.
pub fn body_error(e: BytesRejection, limit: usize) -> ApiError {
    unreadable(e.status(), limit as u64, || format!("Cannot read the request body: {}", e.body_text()))
}

/// A JSON object body of at most `limit` bytes (else 400 or 413).
pub fn json_object(body: Result<Bytes, BytesRejection>, limit: usize) -> Result<Map<String, Json>, ApiError> {
    let bytes = body.map_err(|e| body_error(e, limit))?;
    match serde_json::from_slice::<Json>(&bytes) {
        Ok(Json::Object(map)) => Ok(map),
        Ok(_) => Err(ApiError::invalid_request("The request body must be a JSON object.")),
        Err(e) => Err(ApiError::invalid_request(format!("The request body is not valid JSON: {e}"))),
    }
}

/// The body limit of an upload route: the largest upload
/// (`max_upload_bytes`) and 1 MiB for the multipart framing and text parts.
pub fn upload_body_limit(max_upload_bytes: u64) -> usize {
    usize::try_from(max_upload_bytes).unwrap_or(usize::MAX).saturating_add(1 << 20)
}

/// A multipart/form-data body (else 400).
pub fn multipart(multipart: Result<Multipart, MultipartRejection>) -> Result<Multipart, ApiError> {
    multipart.map_err(|e| ApiError::invalid_request(format!("Expected a multipart/form-data upload: {}", e.body_text())))
}

/// A multipart read that failed (over `limit` bytes, a broken body).
pub fn multipart_error(e: MultipartError, limit: u64) -> ApiError {
    unreadable(e.status(), limit, || format!("Bad multipart body: {}", e.body_text()))
}

/// The two named parts of a multipart body, each sent once and no other:
/// `first` (at most `first_max` bytes: a small text or JSON part) and
/// `second`, the whole body bounded by `limit`; `missing` is the answer
/// when one is absent.
pub async fn two_parts(
    multipart: Result<Multipart, MultipartRejection>,
    limit: u64,
    (first, first_max): (&str, usize),
    second: &str,
    missing: &str,
) -> Result<(Bytes, Bytes), ApiError> {
    let mut multipart = self::multipart(multipart)?;
    let (mut a, mut b) = (None, None);
    while let Some(field) = multipart.next_field().await.map_err(|e| multipart_error(e, limit))? {
        let name = field.name().unwrap_or("").to_string();
        let slot = match name.as_str() {
            n if n == first => &mut a,
            n if n == second => &mut b,
            other => return Err(ApiError::invalid_request(format!("Unknown part `{other}`: send `{first}` and `{second}`."))),
        };
        if slot.is_some() {
            return Err(ApiError::invalid_request(format!("Each of `{first}` and `{second}` is sent once.")));
        }
        let bytes = field.bytes().await.map_err(|e| multipart_error(e, limit))?;
        if name == first && bytes.len() > first_max {
            return Err(ApiError::invalid_request(format!("The `{first}` part is over {} KiB.", first_max >> 10)));
        }
        *slot = Some(bytes);
    }
    match (a, b) {
        (Some(a), Some(b)) => Ok((a, b)),
        _ => Err(ApiError::invalid_request(missing)),
    }
}

/// A text part of an upload, at most 4 KiB.
pub async fn text_field(field: Field<'_>, limit: u64) -> Result<String, ApiError> {
    let text = field.text().await.map_err(|e| multipart_error(e, limit))?;
    if text.len() > MAX_TEXT_FIELD {
        return Err(ApiError::invalid_request("A text field of the upload is too long."));
    }
    Ok(text)
}

/// Streams a file part into a new blob; the service's failures become
/// responses through `error` (each API surface has its own statuses).
pub async fn receive_file(service: &Service, mut field: Field<'_>, limit: u64, error: fn(ServiceError) -> ApiError) -> Result<BlobUpload, ApiError> {
    let mut upload = service.begin_upload().map_err(error)?;
    while let Some(chunk) = field.chunk().await.map_err(|e| multipart_error(e, limit))? {
        // Chunks are ≤ 64 KiB and land in the page cache; the fsync happens
        // once, when the upload is committed, off the reactor.
        upload.write(&chunk).map_err(|e| error(ServiceError::from(e)))?;
    }
    Ok(upload)
}
