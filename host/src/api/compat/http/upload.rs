//! `POST /api/upload/image` and `/api/upload/mask`: multipart `image`
//! (the file, with a file name), `type` (`input` default, or `temp`),
//! `subfolder`, `overwrite` (`true`/`1`); a mask adds `original_ref` (JSON
//! `{filename, subfolder?, type?}`, `type` defaulting to `output`) and is
//! stored flat (its `subfolder` is ignored, as the spec says) as the
//! original image with its alpha replaced by the mask's. Both answer
//! `{name, subfolder, type}`. The bytes become an asset in the blob store
//! (see `service::compat`), so `/api/v2/assets` and a prompt's LoadImage
//! see the same file.

use std::sync::Arc;

use axum::Json;
use axum::extract::multipart::MultipartRejection;
use axum::extract::{Multipart, State};
use serde_json::{Value as Json_, json};

use super::blocking;
use crate::api::AppState;
use crate::api::Caller;
use crate::api::body::{self, multipart_error, text_field};
use crate::api::error::ApiError;
use crate::service::compat::CompatUpload;
use crate::service::job_files::media_type;
use crate::store::BlobUpload;

/// The parts of an upload.
#[derive(Default)]
struct Form {
    file: Option<BlobUpload>,
    /// The mask's bytes (kept in memory: they are decoded).
    mask: Option<Vec<u8>>,
    filename: Option<String>,
    kind: Option<String>,
    subfolder: Option<String>,
    overwrite: bool,
    original_ref: Option<String>,
}

/// A plain file name: no separator, no `..`, no control character, 1–255 bytes.
fn file_name(name: &str) -> Result<String, ApiError> {
    let ok = !name.is_empty() && name.len() <= 255 && name != "." && name != ".." && !name.contains(['/', '\\']) && !name.chars().any(char::is_control);
    if ok { Ok(name.to_string()) } else { Err(ApiError::invalid_request("The file name must be a plain name (no folders, at most 255 bytes).")) }
}

/// A relative folder that does not climb: no `..`, no leading separator.
fn subfolder(folder: &str) -> Result<String, ApiError> {
    let folder = folder.trim_matches(['/', '\\']);
    let bad = folder.len() > 1024 || folder.split(['/', '\\']).any(|s| s == ".." || s == ".") || folder.chars().any(char::is_control) || folder.contains("//");
    if bad { Err(ApiError::invalid_request("`subfolder` must be a relative folder without `..`.")) } else { Ok(folder.replace('\\', "/")) }
}

async fn read_form(state: &AppState, multipart: Result<Multipart, MultipartRejection>, mask: bool) -> Result<Form, ApiError> {
    let limit = state.service.options().max_upload_bytes;
    let mut multipart = body::multipart(multipart)?;
    let mut form = Form::default();
    while let Some(field) = multipart.next_field().await.map_err(|e| multipart_error(e, limit))? {
        match field.name().unwrap_or("") {
            "image" => {
                if form.file.is_some() || form.mask.is_some() {
                    return Err(ApiError::invalid_request("Only one `image` part is allowed."));
                }
                form.filename = Some(file_name(field.file_name().unwrap_or(""))?);
                if mask {
                    form.mask = Some(field.bytes().await.map_err(|e| multipart_error(e, limit))?.to_vec());
                } else {
                    form.file = Some(body::receive_file(&state.service, field, limit, super::compat_error).await?);
                }
            }
            "type" => form.kind = Some(text_field(field, limit).await?),
            "subfolder" => form.subfolder = Some(text_field(field, limit).await?),
            "overwrite" => form.overwrite = matches!(text_field(field, limit).await?.trim(), "true" | "1"),
            "original_ref" => form.original_ref = Some(text_field(field, limit).await?),
            _ => {
                text_field(field, limit).await?;
            }
        }
    }
    Ok(form)
}

/// The upload's type: `input` (default) or `temp`.
fn kind(kind: Option<String>) -> Result<String, ApiError> {
    match kind.as_deref().map(str::trim) {
        None | Some("") | Some("input") => Ok("input".into()),
        Some("temp") => Ok("temp".into()),
        Some(_) => Err(ApiError::invalid_request("`type` must be input or temp.")),
    }
}

pub async fn image(State(state): State<Arc<AppState>>, caller: Caller, multipart: Result<Multipart, MultipartRejection>) -> Result<Json<Json_>, ApiError> {
    let form = read_form(&state, multipart, false).await?;
    let (Some(file), Some(filename)) = (form.file, form.filename) else { return Err(ApiError::invalid_request("The upload has no `image` file part.")) };
    let req = CompatUpload {
        kind: kind(form.kind)?,
        subfolder: subfolder(form.subfolder.as_deref().unwrap_or(""))?,
        content_type: media_type(&filename).0.to_string(),
        filename,
        overwrite: form.overwrite,
    };
    let (kind, sub) = (req.kind.clone(), req.subfolder.clone());
    let (service, owner) = (state.service.clone(), caller.owner().to_string());
    let name = blocking(move || service.commit_compat_upload(&owner, file, req)).await?;
    Ok(Json(json!({ "name": name, "subfolder": sub, "type": kind })))
}

pub async fn mask(State(state): State<Arc<AppState>>, caller: Caller, multipart: Result<Multipart, MultipartRejection>) -> Result<Json<Json_>, ApiError> {
    let form = read_form(&state, multipart, true).await?;
    let (Some(mask), Some(filename)) = (form.mask, form.filename) else { return Err(ApiError::invalid_request("The upload has no `image` file part.")) };
    let original: Json_ = form
        .original_ref
        .as_deref()
        .and_then(|r| serde_json::from_str(r).ok())
        .ok_or_else(|| ApiError::invalid_request("`original_ref` must be JSON {filename, subfolder, type}."))?;
    let field = |k: &str| original.get(k).and_then(Json_::as_str).map(str::to_string);
    let mut original_name = field("filename").ok_or_else(|| ApiError::invalid_request("`original_ref.filename` is required."))?;
    let mut original_kind = field("type").unwrap_or_else(|| "output".into());
    for annotated in ["input", "output", "temp"] {
        if let Some(stripped) = original_name.strip_suffix(&format!(" [{annotated}]") as &str) {
            original_name = stripped.to_string();
            original_kind = annotated.into();
        }
    }
    let original_name = file_name(&original_name)?;
    let original_sub = subfolder(&field("subfolder").unwrap_or_default())?;
    if !matches!(original_kind.as_str(), "input" | "output" | "temp") {
        return Err(ApiError::invalid_request("`original_ref.type` must be input, output or temp."));
    }
    let req = CompatUpload { kind: kind(form.kind)?, subfolder: String::new(), content_type: "image/png".into(), filename, overwrite: form.overwrite };
    let kind = req.kind.clone();
    let (service, owner) = (state.service.clone(), caller.owner().to_string());
    let name = blocking(move || service.commit_compat_mask(&owner, &mask, (&original_kind, &original_sub, &original_name), req)).await?;
    Ok(Json(json!({ "name": name, "subfolder": "", "type": kind })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_folders_stay_inside() {
        assert!(file_name("a (1).png").is_ok());
        for bad in ["", "..", "a/b.png", "a\\b.png", "x\n.png"] {
            assert!(file_name(bad).is_err(), "{bad:?}");
        }
        assert_eq!(subfolder("clipspace/").unwrap(), "clipspace");
        assert_eq!(subfolder("").unwrap(), "");
        for bad in ["../x", "a/../b", "a//b", "./a"] {
            assert!(subfolder(bad).is_err(), "{bad:?}");
        }
    }
}
