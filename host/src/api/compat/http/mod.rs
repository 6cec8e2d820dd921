//! ComfyUI's HTTP routes, each at `/api/x` and at the bare `/x` client
//! libraries use (`/api/jobs*` and `/api/job/*` only under `/api`), under
//! the mount prefix. Handlers are thin: parse the request, call the
//! [`Service`](crate::service::Service) (the same one `/api/v2` drives),
//! render ComfyUI's shapes. Failures go through [`compat_error`] to the
//! API's one envelope with the compatibility API's statuses (400 invalid,
//! 401, 404, 429, 500); `POST /api/prompt`'s validation failures and
//! `/api/jobs`' errors have ComfyUI's own bodies.

pub mod frontend;
mod history;
mod jobs;
mod object_info;
mod prompt;
mod queue;
mod streamed;
mod system;
mod upload;
mod userdata;
mod view;

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Map, Value as Json, json};

use crate::api::AppState;
use crate::api::body_limit::BodyLimit;
use crate::api::error::ApiError;
use crate::service::ServiceError;
use crate::store::JobRecord;

pub use object_info::ObjectInfoCache;

/// The HTTP routes of the compatibility API.
pub fn routes(state: Arc<AppState>) -> Router {
    let prefix = state.config.mount_prefix.clone();
    let upload_limit = crate::api::body::upload_body_limit(state.service.options().max_upload_bytes);
    let json_limit = state.service.options().workflow_limits.max_bytes.max(state.user_files.limits().settings_bytes);
    let userdata_limit = usize::try_from(state.user_files.limits().file_bytes).unwrap_or(usize::MAX);
    let mut json = Router::new();
    let mut uploads = Router::new();
    let mut userdata = Router::new();
    for base in [format!("{prefix}/api"), prefix.clone()] {
        let at = |path: &str| format!("{base}{path}");
        uploads = uploads.route(&at("/upload/image"), post(upload::image)).route(&at("/upload/mask"), post(upload::mask));
        userdata = userdata.route(&at("/userdata/{file}"), get(userdata::read).post(userdata::write).delete(userdata::delete));
        json = json
            .route(&at("/object_info"), get(object_info::all))
            .route(&at("/object_info/{class}"), get(object_info::one))
            .route(&at("/prompt"), get(prompt::remaining).post(prompt::submit))
            .route(&at("/view"), get(view::view))
            .route(&at("/queue"), get(queue::list).post(queue::edit))
            .route(&at("/interrupt"), post(queue::interrupt))
            .route(&at("/history"), get(history::list).post(history::edit))
            .route(&at("/history/{id}"), get(history::one))
            .route(&at("/system_stats"), get(system::stats))
            .route(&at("/features"), get(system::features))
            .route(&at("/extensions"), get(system::empty_list))
            .route(&at("/embeddings"), get(system::empty_list))
            .route(&at("/models"), get(system::empty_list))
            .route(&at("/users"), get(system::users))
            .route(&at("/settings"), get(userdata::settings).post(userdata::set_many))
            .route(&at("/settings/{id}"), get(userdata::setting).post(userdata::set_one))
            .route(&at("/userdata"), get(userdata::list))
            .route(&at("/userdata/{file}/move/{dest}"), post(userdata::rename))
            .route(&at("/i18n"), get(system::empty_object))
            .route(&at("/experiment/models"), get(system::empty_list))
            .route(&at("/workflow_templates"), get(system::empty_object))
            .route(&at("/global_subgraphs"), get(system::empty_object))
            .route(&at("/node_replacements"), get(system::empty_object))
            .route(&at("/view_metadata/{folder}"), get(system::no_metadata))
            .route(&at("/internal/files/{kind}"), get(object_info::files))
            .route(&at("/free"), post(system::free));
    }
    let api = |path: &str| format!("{prefix}/api{path}");
    json = json
        .route(&api("/job/{id}/status"), get(prompt::status))
        .route(&api("/jobs"), get(jobs::list))
        .route(&api("/jobs/cancel"), post(jobs::cancel_many))
        .route(&api("/jobs/{id}"), get(jobs::detail))
        .route(&api("/jobs/{id}/cancel"), post(jobs::cancel));
    BodyLimit::new(json_limit).on(json).merge(BodyLimit::new(upload_limit).on(uploads)).merge(BodyLimit::new(userdata_limit).on(userdata)).with_state(state)
}

/// The one mapping of service failures on these routes: the envelope, with
/// the compatibility API's 400 where the Jobs API answers 422.
pub(super) fn compat_error(e: ServiceError) -> ApiError {
    let mut err = ApiError::from(e);
    if err.status == StatusCode::UNPROCESSABLE_ENTITY {
        err.status = StatusCode::BAD_REQUEST;
    }
    err
}

/// Waits for an async service call inside [`blocking`] work (on the
/// blocking pool, where waiting is fine; never on the reactor).
pub(super) fn block<F: std::future::Future>(call: F) -> F::Output {
    crate::store::may_block_here(|| tokio::runtime::Handle::current().block_on(call))
}

/// Runs blocking service work (store writes, fsyncs) off the reactor.
pub(super) async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T, ServiceError> + Send + 'static) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| ApiError::internal(&e))?.map_err(compat_error)
}

/// A JSON body of at most `limit` bytes: `None` when it is empty, not JSON
/// or not an object (ComfyUI's queue and interrupt routes then act on their
/// defaults).
pub(super) fn optional_object(body: Result<Bytes, BytesRejection>, limit: usize) -> Result<Option<Map<String, Json>>, ApiError> {
    let bytes = body.map_err(|e| crate::api::body::body_error(e, limit))?;
    Ok(match serde_json::from_slice::<Json>(&bytes) {
        Ok(Json::Object(map)) => Some(map),
        _ => None,
    })
}

/// A list of prompt ids from a body field (`delete`): strings only, each
/// bounded (the body limit bounds how many).
/// The body of `POST /queue` and `POST /history`: `{"delete": [ids]}`
/// and/or `{"clear": true}` (an empty body is neither).
pub(super) fn delete_or_clear(state: &AppState, body: Result<Bytes, BytesRejection>) -> Result<(Vec<String>, bool), ApiError> {
    let body = optional_object(body, state.service.options().workflow_limits.max_bytes)?.unwrap_or_default();
    let delete = id_list(body.get("delete"))?;
    let clear = body.get("clear").and_then(Json::as_bool).unwrap_or(false);
    Ok((delete, clear))
}

pub(super) fn id_list(value: Option<&Json>) -> Result<Vec<String>, ApiError> {
    match value {
        None | Some(Json::Null) => Ok(Vec::new()),
        Some(Json::Array(items)) => items
            .iter()
            .map(|v| {
                v.as_str().filter(|s| s.len() <= 128).map(str::to_string).ok_or_else(|| ApiError::invalid_request("`delete` must be a list of prompt ids."))
            })
            .collect(),
        Some(_) => Err(ApiError::invalid_request("`delete` must be a list of prompt ids.")),
    }
}

/// `200` with an empty body (ComfyUI's answer to queue edits and interrupts).
pub(super) fn empty_ok() -> Response {
    StatusCode::OK.into_response()
}

/// Epoch milliseconds of a record time.
pub(super) fn millis(micros: i64) -> i64 {
    micros / 1000
}

/// A job's queue number: the one `POST /api/prompt` gave it, else its
/// queue sequence (jobs from `/api/v2`).
pub(super) fn number(record: &JobRecord) -> Json {
    match &record.compat {
        Some(c) => Json::Number(c.number.clone()),
        None => json!(record.seq),
    }
}

/// ComfyUI's queue and history tuple: `[number, prompt_id, prompt,
/// extra_data, outputs_to_execute]` (no sensitive data: `extra_data` holds
/// only the client id and the creation time). The prompt is the stored
/// workflow's text, written as it is.
#[derive(serde::Serialize)]
pub(super) struct QueueItem<'a>(Json, &'a str, &'a serde_json::value::RawValue, pub(super) Map<String, Json>, &'a [String]);

pub(super) fn queue_item(job: &crate::service::compat::CompatJob) -> QueueItem<'_> {
    let r = &job.record;
    let mut extra = Map::new();
    if let Some(client) = r.compat.as_ref().and_then(|c| c.client_id.clone()) {
        extra.insert("client_id".into(), Json::String(client));
    }
    extra.insert("create_time".into(), json!(millis(r.created_at)));
    QueueItem(number(r), r.public_id(), &job.workflow, extra, &job.outputs_to_execute)
}
