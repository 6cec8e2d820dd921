//! `GET /api/view?filename=&subfolder=&type=`: the spec's 302 to a signed,
//! expiring URL of the file's bytes (the Jobs API's signed asset route,
//! which needs no credentials). `type` is `output` (default), `input` or
//! `temp`; a filename may carry ComfyUI's ` [type]` annotation, or be a
//! `blake3:<hex>` content hash. Nothing here touches a path: names are
//! looked up among the caller's uploads and job outputs, and a name or
//! subfolder that tries to climb (`..`, a leading `/`) is refused with 400.
//! With `preview` (`webp;90`, `jpeg;50`…) or `channel` (`rgb`, `a`) the
//! file is converted as ComfyUI does (`service::reencode` says how) and
//! served here, 200 with the converted bytes, `Content-Disposition`
//! naming the file and `nosniff`; `channel=rgba` (the default) is the
//! stored bytes, by the redirect. Other parameters (`rand`, `clientId`)
//! are ignored.

use crate::api::pool::on_pool;
use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::api::Caller;
use crate::api::error::ApiError;
use crate::api::{AppState, Links};
use crate::service::reencode::{Conversion, Converted};

#[derive(serde::Deserialize)]
pub struct ViewQuery {
    filename: Option<String>,
    subfolder: Option<String>,
    #[serde(rename = "type")]
    kind: Option<String>,
    preview: Option<String>,
    channel: Option<String>,
}

/// A name or folder that stays where it is put: no `..` segment, no
/// leading separator, no NUL or control character, at most 1024 bytes.
fn contained(path: &str) -> bool {
    path.len() <= 1024 && !path.starts_with(['/', '\\']) && !path.split(['/', '\\']).any(|s| s == "..") && !path.chars().any(char::is_control)
}

/// `(type, subfolder, filename)` of a view request, or why not.
fn parse(q: &ViewQuery) -> Result<(String, String, String), ApiError> {
    let filename = q.filename.as_deref().filter(|f| !f.is_empty()).ok_or_else(ApiError::not_found)?;
    let mut kind = q.kind.clone().unwrap_or_else(|| "output".into());
    let mut name = filename;
    for annotated in ["input", "output", "temp"] {
        if let Some(stripped) = name.strip_suffix(&format!(" [{annotated}]") as &str) {
            name = stripped;
            kind = annotated.into();
        }
    }
    if !contained(name) {
        return Err(ApiError::invalid_request("`filename` must not leave its folder."));
    }
    // ComfyUI uses the base name only.
    let name = name.rsplit(['/', '\\']).next().unwrap_or(name).to_string();
    if !matches!(kind.as_str(), "output" | "input" | "temp") {
        return Err(ApiError::invalid_request("`type` must be output, input or temp."));
    }
    let subfolder = q.subfolder.clone().unwrap_or_default();
    if !contained(&subfolder) {
        return Err(ApiError::invalid_request("`subfolder` must not leave its folder."));
    }
    Ok((kind, subfolder.trim_end_matches(['/', '\\']).to_string(), name))
}

pub async fn view(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    links: Links,
    query: Result<Query<ViewQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = query.map_err(|_| ApiError::invalid_request("Bad query string."))?;
    let (kind, subfolder, filename) = parse(&q)?;
    let (service, owner) = (state.service.clone(), caller.owner().to_string());
    if let Some(conversion) = Conversion::parse(q.preview.as_deref(), q.channel.as_deref()) {
        let name = filename.clone();
        let converted = super::blocking(move || service.compat_converted(&owner, (&kind, &subfolder, &filename), conversion)).await?;
        return Ok(converted_response(converted, &name));
    }
    let asset = on_pool(move || async move { service.compat_file(&owner, &kind, &subfolder, &filename).await }).await?.map_err(super::compat_error)?;
    let expires = crate::api::signing::expiry(state.config.signed_url_ttl_s);
    let sig = state.signer.sign(&asset.id, expires);
    let location = links.absolute(&format!("{}/signed/assets/{}?expires={expires}&sig={sig}", links.v2(), asset.id));
    Ok((StatusCode::FOUND, [(header::LOCATION, location)]).into_response())
}

/// A conversion's bytes as ComfyUI serves them.
fn converted_response(converted: Converted, name: &str) -> Response {
    let disposition = format!("filename=\"{}\"", name.replace(['"', '\\'], "_"));
    let headers = [
        (header::CONTENT_TYPE, converted.content_type.to_string()),
        (header::CONTENT_DISPOSITION, disposition),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff".to_string()),
        (header::CACHE_CONTROL, "private, no-cache".to_string()),
    ];
    (headers, converted.bytes).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(filename: Option<&str>, subfolder: Option<&str>, kind: Option<&str>) -> Result<(String, String, String), u16> {
        let q =
            ViewQuery { filename: filename.map(Into::into), subfolder: subfolder.map(Into::into), kind: kind.map(Into::into), preview: None, channel: None };
        parse(&q).map_err(|e| e.status.as_u16())
    }

    #[test]
    fn view_requests_cannot_climb() {
        assert_eq!(q(Some("a.png"), None, None), Ok(("output".into(), String::new(), "a.png".into())));
        assert_eq!(q(Some("a.png [input]"), Some("x/"), None), Ok(("input".into(), "x".into(), "a.png".into())));
        assert_eq!(q(Some("sub/a.png"), None, Some("temp")), Ok(("temp".into(), String::new(), "a.png".into())));
        assert_eq!(q(None, None, None), Err(404));
        assert_eq!(q(Some("../x.png"), None, None), Err(400));
        assert_eq!(q(Some("/etc/passwd"), None, None), Err(400));
        assert_eq!(q(Some("a.png"), Some("../.."), None), Err(400));
        assert_eq!(q(Some("a.png"), Some("/abs"), None), Err(400));
        assert_eq!(q(Some("a.png"), None, Some("bogus")), Err(400));
        assert_eq!(q(Some("a\0.png"), None, None), Err(400));
    }
}
