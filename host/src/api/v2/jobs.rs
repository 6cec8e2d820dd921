//! Job handlers: submit, get, list, workflow, cancel, health.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value as Json_, json};

use super::listing::list_query;
use super::{Segment, check_id, labels, wire};
use crate::api::Caller;
use crate::api::body::{body_error, json_object};
use crate::api::error::ApiError;
use crate::api::{AppState, Links};
use crate::service::{ExtraData, ServiceError, Submission};
use crate::store::JobStatus;

/// `GET /health`.
#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct Health {
    /// Always `healthy`.
    status: &'static str,
    version: &'static str,
    /// Node classes this server has.
    nodes: usize,
}

#[utoipa::path(get, path = "/health", operation_id = "health", tag = "service",
    description = "Liveness: cheap, no store access.",
    responses((status = 200, description = "The server answers.", body = Health)))]
pub async fn health(State(state): State<Arc<AppState>>) -> Json<Health> {
    Json(Health { status: "healthy", version: env!("CARGO_PKG_VERSION"), nodes: state.service.registry().definitions().count() })
}

/// `GET /ready`.
#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct Ready {
    /// `ready` or `not_ready`.
    status: &'static str,
    checks: ReadyChecks,
}

/// What readiness checked.
#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct ReadyChecks {
    /// `writable` or `not writable`.
    store: &'static str,
    queue: QueueCheck,
    nodes: usize,
    /// `ok`, `low`, `unknown` or `not checked`.
    disk: &'static str,
}

/// The queue against its bound.
#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct QueueCheck {
    queued: usize,
    max_queued: usize,
}

/// Readiness for load balancers: 200 `ready`, or 503 `not_ready` with
/// the check that failed (see `service::readiness`).
#[utoipa::path(get, path = "/ready", operation_id = "ready", tag = "service",
    description = "Readiness for load balancers: the store takes writes, the queue is below its bound, the disk has its reserve.",
    responses(
        (status = 200, description = "Ready.", body = Ready),
        (status = 503, description = "Not ready: `checks` names what failed.", body = Ready)))]
pub async fn ready(State(state): State<Arc<AppState>>) -> Response {
    let found = state.service.readiness().await;
    let body = Ready {
        status: if found.ready() { "ready" } else { "not_ready" },
        checks: ReadyChecks {
            store: if found.store_error.is_some() { "not writable" } else { "writable" },
            queue: QueueCheck { queued: found.queued, max_queued: found.max_queued },
            nodes: found.nodes,
            disk: found.disk(),
        },
    };
    let status = if found.ready() { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, Json(body)).into_response()
}

/// A submission over `max` bytes: a workflow over its size limit, named.
pub(super) fn workflow_too_large(max: usize) -> ApiError {
    ApiError::invalid_workflow(crate::workflow::ParseError::TooLarge { limit: max }.to_string())
}

fn check_extra_data(value: &Json_) -> Result<ExtraData, ApiError> {
    let map = value.as_object().ok_or_else(|| ApiError::invalid_request("`extra_data` must be an object."))?;
    let mut extra = ExtraData::default();
    for (k, v) in map {
        match (k.as_str(), v) {
            ("api_key_svc_org", Json_::String(s)) => extra.secrets = crate::plugins::JobSecrets::new(Some(s.clone())),
            ("api_key_svc_org", _) => return Err(ApiError::invalid_request("`extra_data.api_key_svc_org` must be a string.")),
            (other, _) => return Err(ApiError::invalid_request(format!("`extra_data` accepts only `api_key_svc_org`, not {other:?}."))),
        }
    }
    Ok(extra)
}

fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(value) = headers.get("idempotency-key") else { return Ok(None) };
    let key = value.to_str().map_err(|_| ApiError::invalid_request("Idempotency-Key must be printable ASCII."))?;
    if key.is_empty() || key.len() > 255 || !key.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        return Err(ApiError::invalid_request("Idempotency-Key must be 1-255 printable ASCII characters."));
    }
    Ok(Some(key.to_string()))
}

#[utoipa::path(post, path = "/jobs", operation_id = "submit_job", tag = "jobs",
    description = "Submits a workflow. With an `Idempotency-Key`, the first submission makes the job and any later one with the key answers 422 `idempotency_key_reuse`.",
    params(("Idempotency-Key" = Option<String>, Header, pattern = "^[!-~](?:[ -~]{0,253}[!-~])?$",
        description = "1-255 printable ASCII characters (no space at either end: HTTP trims them).")),
    request_body(content = crate::api::openapi::schemas::SubmitJob, content_type = "application/json",
        example = json!({"workflow": {
            "1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 0}},
            "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "kiln"}}}})),
    responses((status = 201, description = "Queued.", body = wire::JobView,
        links(
            ("GetJob" = (operation_id = "get_job", parameters(("id" = "$response.body#/id")))),
            ("GetJobWorkflow" = (operation_id = "get_job_workflow", parameters(("id" = "$response.body#/id")))),
            ("JobEvents" = (operation_id = "job_events", parameters(("id" = "$response.body#/id")))),
            ("CancelJob" = (operation_id = "cancel_job", parameters(("id" = "$response.body#/id"))))))))]
pub async fn submit(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    links: Links,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    // A used key is refused whatever else the request holds (spec: any
    // later request with the key is 422); the claim itself is atomic with
    // the job's record.
    let key = idempotency_key(&headers)?;
    if let Some(key) = &key {
        state.service.check_key(caller.owner(), key).await?;
    }
    // A submission over the size limit is a workflow over it (the
    // workflow is what makes a body large): `invalid_workflow` naming the
    // setting, as a workflow with too many nodes is.
    let limits = state.service.options().workflow_limits;
    let body = body.map_err(|e| match body_error(e, limits.max_bytes) {
        e if e.status == StatusCode::PAYLOAD_TOO_LARGE => workflow_too_large(limits.max_bytes),
        e => e,
    })?;
    let size = body.len();
    // Counted before it is parsed; parsed only once its memory fits.
    let admitted = state.service.admit_body(&body).await?;
    let mut body = json_object(Ok(body), limits.max_bytes)?;
    if body.contains_key("webhook_url") || body.contains_key("inputs") {
        return Err(ApiError::invalid_workflow("'webhook_url' and 'inputs' are reserved and not accepted."));
    }
    let workflow = match body.remove("workflow") {
        Some(w @ Json_::Object(_)) => w,
        _ => return Err(ApiError::invalid_workflow("Missing 'workflow' (API-format graph).")),
    };
    let metadata = body.get("metadata").filter(|m| !m.is_null()).map(labels::check_metadata).transpose()?;
    let extra = body.get("extra_data").filter(|m| !m.is_null()).map(check_extra_data).transpose()?.unwrap_or_default();
    let service = state.service.clone();
    let owner = caller.owner().to_string();
    let submission = Submission { extra, idempotency_key: key, metadata, deployment: caller.deployment_id(), ..Submission::v2(owner, workflow) };
    let (record, position) = crate::api::pool::admit(service, submission, size).await?.map(|a| (a.record, a.position)).map_err(ServiceError::from)?;
    drop(admitted);
    Ok((StatusCode::CREATED, Json(wire::job(&record, position, &links, false))).into_response())
}

/// Largest rendered job body kept for later polls.
const MAX_CACHED_BODY: usize = 64 << 10;

#[utoipa::path(get, path = "/jobs/{id}", operation_id = "get_job", tag = "jobs",
    params(("id" = String, Path, description = "The job's id (a UUID).")),
    responses((status = 200, description = "The job (with `logs` where the server shows them).", body = wire::JobView)))]
pub async fn get_job(State(state): State<Arc<AppState>>, caller: Caller, links: Links, Segment(id): Segment) -> Result<Response, ApiError> {
    check_id(&id)?;
    let (record, position) = state.service.get_shared(caller.owner(), &id).await?;
    // The one read that may show `logs` (serverless jobs only).
    let with_logs = state.service.shows_logs(&record);
    // Signed content URLs are signed afresh for every reading.
    if !record.status.is_terminal() || links.signs() {
        return Ok(Json(wire::job(&record, position, &links, with_logs)).into_response());
    }
    // Links differ by origin and by surface (a deployment's prefix).
    let cached = state
        .rendered
        .lock()
        .get(id.as_str())
        .filter(|(r, origin, _)| Arc::ptr_eq(r, &record) && origin.strip_prefix(links.origin.as_str()) == Some(links.v2()))
        .map(|(_, _, body)| body.clone());
    let body = match cached {
        Some(body) => body,
        None => {
            let body = Bytes::from(serde_json::to_vec(&wire::job(&record, position, &links, with_logs)).map_err(|e| ApiError::internal(&e))?);
            // Bodies with long logs are rendered per request, not kept.
            if body.len() <= MAX_CACHED_BODY {
                state.rendered.lock().put(id, (record, format!("{}{}", links.origin, links.v2()), body.clone()));
            }
            body
        }
    };
    Ok(([(axum::http::header::CONTENT_TYPE, "application/json")], body).into_response())
}

#[utoipa::path(get, path = "/jobs/{id}/workflow", operation_id = "get_job_workflow", tag = "jobs",
    params(("id" = String, Path, description = "The job's id (a UUID).")),
    responses((status = 200, description = "The workflow as submitted.", body = crate::api::openapi::schemas::WorkflowView)))]
pub async fn workflow(State(state): State<Arc<AppState>>, caller: Caller, Segment(id): Segment) -> Result<Json<Json_>, ApiError> {
    check_id(&id)?;
    let workflow = state.service.workflow(caller.owner(), &id).await?;
    Ok(Json(json!({ "workflow": workflow, "format": "api" })))
}

#[utoipa::path(post, path = "/jobs/{id}/cancel", operation_id = "cancel_job", tag = "jobs",
    description = "Cancels a queued or running job; a finished one is answered as it is.",
    params(("id" = String, Path, description = "The job's id (a UUID).")),
    responses((status = 200, description = "The job after the request.", body = wire::JobView)))]
pub async fn cancel(State(state): State<Arc<AppState>>, caller: Caller, links: Links, Segment(id): Segment) -> Result<Response, ApiError> {
    check_id(&id)?;
    let (service, owner) = (state.service.clone(), caller.owner().to_string());
    let (record, position) = crate::api::pool::on_pool(move || async move { service.cancel(&owner, &id).await }).await??;
    Ok(Json(wire::job(&record, position, &links, false)).into_response())
}

#[utoipa::path(get, path = "/jobs", operation_id = "list_jobs", tag = "jobs",
    description = "The caller's jobs, newest first. Unknown query parameters are ignored; a raw `;` or a `%` escape that is not two hex digits or not UTF-8 is 400.",
    params(
        ("limit" = Option<u32>, Query, minimum = 1, maximum = 100, description = "Page size (default 50)."),
        ("cursor" = Option<String>, Query, pattern = "^(?:[0-9a-fA-F]{2}){0,256}$",
            description = "`next_cursor` of the previous page (opaque: one this server did not issue is 400 `invalid_cursor`)."),
        ("status" = Option<Vec<JobStatus>>, Query, style = Form, explode = false, min_items = 1, description = "Statuses to list (comma-separated; an empty one is 400)."),
        ("metadata" = inline(Option<crate::api::openapi::schemas::MetadataFilters>), Query, style = DeepObject, explode,
            description = "`metadata[key]=value` filters: at most 3, each key once (else 400 `invalid_metadata_filter`).")),
    responses((status = 200, description = "A page of jobs.", body = JobPage)))]
pub async fn list(State(state): State<Arc<AppState>>, caller: Caller, links: Links, RawQuery(raw): RawQuery) -> Result<Response, ApiError> {
    let q = list_query(raw.as_deref())?;
    let (service, owner) = (state.service.clone(), caller.owner().to_string());
    let (jobs, next) = crate::api::pool::on_pool(move || async move { service.list(&owner, &q).await }).await??;
    let items: Vec<wire::JobView> = jobs
        .iter()
        .map(|j| {
            let position = (j.status == JobStatus::Queued).then(|| state.service.queue_position(&j.id)).flatten();
            wire::job(j, position, &links, false)
        })
        .collect();
    let next_cursor = next.map(|n| n.iter().map(|b| format!("{b:02x}")).collect());
    Ok(Json(JobPage { jobs: items, next_cursor }).into_response())
}

/// A page of `GET /jobs`.
#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct JobPage<'a> {
    jobs: Vec<wire::JobView<'a>>,
    /// Absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    next_cursor: Option<String>,
}
