//! Serving a blob: whole (200), one byte range (206), or 416 when the range
//! cannot be satisfied. Several ranges are answered with the whole body,
//! which HTTP allows.
//!
//! Uploaded bytes are untrusted and the media type is the uploader's word:
//! only inert types are served as themselves (anything else, e.g. HTML or
//! SVG, goes out as `application/octet-stream`), never sniffed, and inside a
//! CSP sandbox, so an asset URL cannot run script on the API's origin.

use std::io::SeekFrom;
use std::ops::RangeInclusive;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use http_range_header::{EndPosition, RangeUnsatisfiableError, StartPosition, SyntacticallyCorrectRange};
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tokio_util::io::ReaderStream;

use super::error::{ApiCode, ApiError};

/// What to answer a `Range` request header with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RangeReply {
    /// 200, the whole body: no header, an empty body, several ranges, or a
    /// malformed header (ignored).
    Whole,
    /// 206, these bytes (within the body).
    Part(RangeInclusive<u64>),
    /// 416.
    Unsatisfiable,
}

/// The answer to Range header `header` over a body of `len` bytes: 416
/// only when no range of it can be served (RFC 9110 §15.5.17); a list of
/// ranges of which some can is answered whole.
pub(crate) fn range_reply(header: Option<&str>, len: u64) -> RangeReply {
    let Some(text) = header else { return RangeReply::Whole };
    // Nothing to slice in an empty body: serve it whole.
    if len == 0 {
        return RangeReply::Whole;
    }
    let parsed = match http_range_header::parse_range_header(text) {
        Ok(parsed) => parsed,
        // `bytes=-0` asks for none of the body (in a list, the parser
        // gives up before the others, which may be satisfiable: ignored).
        Err(RangeUnsatisfiableError::ZeroSuffix) if !text.contains(',') => return RangeReply::Unsatisfiable,
        // A malformed Range header is ignored (RFC 9110 §14.2).
        Err(_) => return RangeReply::Whole,
    };
    match parsed.validate(len) {
        Ok(ranges) if ranges.len() == 1 => RangeReply::Part(ranges[0].clone()),
        Ok(_) => RangeReply::Whole,
        // A suffix longer than the content asks for all of it (RFC 9110 §14.1.3).
        Err(RangeUnsatisfiableError::FileSuffixOutOfBounds) if parsed.ranges.len() == 1 => RangeReply::Part(0..=len - 1),
        // Reversed, or starting past the end (the parser clamps the end).
        Err(RangeUnsatisfiableError::RangeReversed) if !parsed.ranges.iter().any(|r| satisfiable(r, len)) => RangeReply::Unsatisfiable,
        Err(_) => RangeReply::Whole,
    }
}

/// Whether a range is valid and starts inside a body of `len` bytes
/// (RFC 9110 §14.1.1).
fn satisfiable(range: &SyntacticallyCorrectRange, len: u64) -> bool {
    match (range.start, range.end) {
        (StartPosition::Index(start), EndPosition::Index(end)) => start < len && start <= end,
        (StartPosition::Index(start), EndPosition::LastByte) => start < len,
        (StartPosition::FromLast(n), _) => n > 0,
    }
}

/// Streams `file` as `content_type`, honouring a `Range` request header.
pub async fn serve(file: std::fs::File, content_type: &str, etag: &str, request: &HeaderMap) -> Result<Response, ApiError> {
    let mut file = tokio::fs::File::from_std(file);
    let len = file.metadata().await.map_err(|e| ApiError::internal(&e))?.len();
    let range = match range_reply(request.get(header::RANGE).and_then(|v| v.to_str().ok()), len) {
        RangeReply::Whole => None,
        RangeReply::Part(range) => Some(range),
        RangeReply::Unsatisfiable => {
            let mut r = ApiError::new(ApiCode::RangeNotSatisfiable, format!("The range is outside the {len} bytes of the content.")).into_response();
            r.headers_mut().insert(header::CONTENT_RANGE, header_value(&format!("bytes */{len}")));
            return Ok(r);
        }
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
        .header(header::CONTENT_TYPE, header_value(safe_media_type(content_type)))
        .header(header::X_CONTENT_TYPE_OPTIONS, "nosniff")
        .header(header::CONTENT_SECURITY_POLICY, "sandbox; default-src 'none'")
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

/// `content_type` if it is a type browsers do not execute, else octet-stream.
pub fn safe_media_type(content_type: &str) -> &str {
    let essence = content_type.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    let inert = matches!(
        essence.as_str(),
        "image/png" | "image/jpeg" | "image/webp" | "image/gif" | "image/bmp" | "image/tiff" | "image/avif" | "text/plain" | "application/json"
    ) || ((essence.starts_with("video/") || essence.starts_with("audio/"))
        && essence.chars().all(|c| c.is_ascii_alphanumeric() || "/-+.".contains(c)));
    if inert { content_type } else { "application/octet-stream" }
}

fn header_value(s: &str) -> HeaderValue {
    HeaderValue::from_str(s).unwrap_or_else(|_| HeaderValue::from_static("application/octet-stream"))
}

#[cfg(test)]
mod tests {
    use super::{RangeReply, range_reply};

    #[test]
    fn ranges_are_refused_only_when_none_can_be_served() {
        let part = |a, b| RangeReply::Part(a..=b);
        assert_eq!(range_reply(Some("bytes=2-5"), 10), part(2, 5));
        assert_eq!(range_reply(Some("bytes=-20"), 10), part(0, 9));
        assert_eq!(range_reply(Some("bytes=5-3"), 10), RangeReply::Unsatisfiable);
        assert_eq!(range_reply(Some("bytes=10-"), 10), RangeReply::Unsatisfiable);
        assert_eq!(range_reply(Some("bytes=-0"), 10), RangeReply::Unsatisfiable);
        assert_eq!(range_reply(Some("bytes=20-30, 40-"), 10), RangeReply::Unsatisfiable);
        // One of the list can be served: not a 416 (answered whole).
        assert_eq!(range_reply(Some("bytes=0-1, 20-30"), 10), RangeReply::Whole);
        assert_eq!(range_reply(Some("bytes=-1,3645-3645"), 1), RangeReply::Whole);
        assert_eq!(range_reply(Some("bytes=0-1,-0"), 10), RangeReply::Whole);
        assert_eq!(range_reply(Some("bytes=0-1"), 0), RangeReply::Whole);
        assert_eq!(range_reply(Some("items=0-1"), 10), RangeReply::Whole);
    }

    #[test]
    fn only_inert_types_pass() {
        use super::safe_media_type as t;
        assert_eq!(t("image/png"), "image/png");
        assert_eq!(t("video/mp4"), "video/mp4");
        assert_eq!(t("text/plain; charset=utf-8"), "text/plain; charset=utf-8");
        for bad in ["text/html", "image/svg+xml", "application/xhtml+xml", "application/javascript", "TEXT/HTML", ""] {
            assert_eq!(t(bad), "application/octet-stream", "{bad}");
        }
    }
}
