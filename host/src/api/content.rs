//! Serving a blob: whole (200), one byte range (206), or 416 when the range
//! cannot be satisfied. Several ranges are answered with the whole body,
//! which HTTP allows.

use std::io::SeekFrom;
use std::path::Path;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use http_range_header::RangeUnsatisfiableError;
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tokio_util::io::ReaderStream;

use super::error::ApiError;

/// Streams `path` as `content_type`, honouring a `Range` request header.
pub async fn serve(path: &Path, content_type: &str, etag: &str, request: &HeaderMap) -> Result<Response, ApiError> {
    let mut file = tokio::fs::File::open(path).await.map_err(|e| ApiError::internal(&e))?;
    let len = file.metadata().await.map_err(|e| ApiError::internal(&e))?.len();
    let range = match request.get(header::RANGE).and_then(|v| v.to_str().ok()) {
        // Nothing to slice in an empty body: serve it whole.
        _ if len == 0 => None,
        None => None,
        Some(text) => match http_range_header::parse_range_header(text).and_then(|r| r.validate(len)) {
            Ok(ranges) if ranges.len() == 1 => Some(ranges[0].clone()),
            Ok(_) => None,
            Err(RangeUnsatisfiableError::RangeReversed | RangeUnsatisfiableError::ZeroSuffix) if text.trim_start().starts_with("bytes=") => {
                let mut r =
                    ApiError::new(StatusCode::RANGE_NOT_SATISFIABLE, "range_not_satisfiable", format!("The range is outside the {len} bytes of the content."))
                        .into_response();
                r.headers_mut().insert(header::CONTENT_RANGE, header_value(&format!("bytes */{len}")));
                return Ok(r);
            }
            // A malformed Range header is ignored (RFC 9110 §14.2).
            Err(_) => None,
        },
    };
    let (status, start, count) = match &range {
        Some(r) => (StatusCode::PARTIAL_CONTENT, *r.start(), r.end() - r.start() + 1),
        None => (StatusCode::OK, 0, len),
    };
    if start > 0 {
        file.seek(SeekFrom::Start(start)).await.map_err(|e| ApiError::internal(&e))?;
    }
    let body = Body::from_stream(ReaderStream::with_capacity(file.take(count), 64 * 1024));
    let mut response = Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, header_value(content_type))
        .header(header::CONTENT_LENGTH, count)
        .header(header::ACCEPT_RANGES, "bytes")
        .header(header::ETAG, header_value(&format!("\"{etag}\"")))
        .body(body)
        .map_err(|e| ApiError::internal(&e))?;
    if let Some(r) = range {
        response.headers_mut().insert(header::CONTENT_RANGE, header_value(&format!("bytes {}-{}/{len}", r.start(), r.end())));
    }
    Ok(response)
}

fn header_value(s: &str) -> HeaderValue {
    HeaderValue::from_str(s).unwrap_or_else(|_| HeaderValue::from_static("application/octet-stream"))
}
