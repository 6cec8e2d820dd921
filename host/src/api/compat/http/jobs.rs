//! The local engine's unified jobs API (only under `/api`), which the
//! official frontend's queue and history panels read: `GET /api/jobs`
//! (`status` filter of `pending, in_progress, completed, failed,
//! cancelled`, `sort_by` `created_at`|`execution_duration`, `sort_order`,
//! `limit`, `offset`), `GET /api/jobs/{id}` (finished jobs add `outputs`,
//! `execution_status`, `workflow`), `POST /api/jobs/{id}/cancel` and
//! `POST /api/jobs/cancel` (`{job_ids}`), each answering `{cancelled}`.
//! Errors here are ComfyUI's `{"error": "<text>"}`.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value as Json_, json};

use super::{blocking, millis, number};
use crate::api::AppState;
use crate::api::Caller;
use crate::api::error::ApiError;
use crate::api::statuses;
use crate::api::v2::Segment;
use crate::service::{Service, ServiceError};
use crate::store::{JobRecord, JobStatus};

const STATUSES: [&str; 5] = statuses::COMFY_JOBS_LIST;

fn error(status: StatusCode, message: &str) -> Response {
    (status, Json(json!({ "error": message }))).into_response()
}

/// The list form of a job (keys whose value would be null are left out);
/// a finished job's first output is its `preview_output`. `outputs_count`:
/// how many outputs it has (a window's short record keeps only the first).
fn summary(service: &Service, record: &JobRecord, outputs_count: usize) -> Result<Map<String, Json_>, ServiceError> {
    let mut out = short(record);
    out.insert("outputs_count".into(), json!(outputs_count));
    if record.status.is_terminal()
        && let (Some(file), Some(rec)) = (super::block(service.compat_outputs(record))?.into_iter().next(), record.outputs.first())
    {
        let media = super::history::group(&rec.kind);
        out.insert(
            "preview_output".into(),
            json!({ "filename": file.filename, "subfolder": file.subfolder, "type": "output", "nodeId": file.node_id, "mediaType": media }),
        );
    }
    Ok(out)
}

/// [`summary`] without the output lookup.
pub(super) fn short(r: &JobRecord) -> Map<String, Json_> {
    let mut out = Map::new();
    out.insert("id".into(), json!(r.public_id()));
    out.insert("status".into(), json!(statuses::comfy_jobs_list(r)));
    out.insert("priority".into(), number(r));
    out.insert("create_time".into(), json!(millis(r.created_at)));
    if r.status.is_terminal() {
        if let Some(t) = r.started_at {
            out.insert("execution_start_time".into(), json!(millis(t)));
        }
        if let Some(t) = r.completed_at {
            out.insert("execution_end_time".into(), json!(millis(t)));
        }
        if let Some(e) = &r.error {
            out.insert(
                "execution_error".into(),
                json!({ "exception_message": e.message, "exception_type": e.code.exception_type(), "node_id": e.node_id, "node_type": e.class_type }),
            );
        }
    }
    out.insert("outputs_count".into(), json!(r.outputs.len()));
    out
}

#[derive(serde::Deserialize)]
pub struct JobsQuery {
    status: Option<String>,
    sort_by: Option<String>,
    sort_order: Option<String>,
    limit: Option<String>,
    offset: Option<String>,
}

pub async fn list(State(state): State<Arc<AppState>>, caller: Caller, Query(q): Query<JobsQuery>) -> Result<Response, ApiError> {
    let wanted: Vec<String> = match q.status.as_deref().filter(|s| !s.is_empty()) {
        None => STATUSES.iter().map(|s| s.to_string()).collect(),
        Some(list) => {
            let given: Vec<String> = list.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect();
            let bad: Vec<&str> = given.iter().map(String::as_str).filter(|s| !STATUSES.contains(s)).collect();
            if !bad.is_empty() {
                return Ok(error(StatusCode::BAD_REQUEST, &format!("Invalid status value(s): {}. Valid values: {}", bad.join(", "), STATUSES.join(", "))));
            }
            given
        }
    };
    let limit = match q.limit.as_deref() {
        None => None,
        Some(text) => match text.trim().parse::<i64>() {
            Ok(n) if n > 0 => Some(n as usize),
            Ok(_) => return Ok(error(StatusCode::BAD_REQUEST, "limit must be a positive integer")),
            Err(_) => return Ok(error(StatusCode::BAD_REQUEST, "limit must be an integer")),
        },
    };
    let offset = q.offset.as_deref().and_then(|o| o.trim().parse::<i64>().ok()).unwrap_or(0).max(0) as usize;
    let by_duration = q.sort_by.as_deref() == Some("execution_duration");
    let ascending = q.sort_order.as_deref() == Some("asc");
    let (service, owner) = (state.service.clone(), caller.owner().to_string());
    // Records only (no listing here shows a workflow): the finished ones
    // from the owner's kept history window (short records, read again only
    // when the owner's history changed), the queue from memory (and, where
    // hosts share the store, the other hosts' part of it from there).
    let (window, running, pending) = blocking(move || {
        let (running, pending) = super::block(service.compat_queue(&owner))?;
        Ok((super::block(service.compat_window(&owner))?, running, pending))
    })
    .await?;
    let live = running.iter().chain(&pending).map(|r| (r, r.outputs.len()));
    let mut jobs: Vec<(&JobRecord, usize)> = window.iter().map(|w| (&w.record, w.outputs_count)).chain(live).collect();
    jobs.retain(|(j, _)| wanted.iter().any(|w| w == statuses::comfy_jobs_list(j)));
    let key = |j: &JobRecord| if by_duration { j.completed_at.zip(j.started_at).map_or(0, |(end, start)| end - start) } else { j.created_at };
    jobs.sort_by_key(|(j, _)| key(j));
    if !ascending {
        jobs.reverse();
    }
    let total = jobs.len();
    let page: Vec<(JobRecord, usize)> = jobs.into_iter().skip(offset).take(limit.unwrap_or(usize::MAX)).map(|(j, n)| (j.clone(), n)).collect();
    let service = state.service.clone();
    let page: Vec<Json_> = blocking(move || page.iter().map(|(j, n)| summary(&service, j, *n).map(Json_::Object)).collect()).await?;
    let has_more = offset.saturating_add(page.len()) < total;
    Ok(Json(json!({ "jobs": page, "pagination": { "offset": offset, "limit": limit, "total": total, "has_more": has_more } })).into_response())
}

pub async fn detail(State(state): State<Arc<AppState>>, caller: Caller, Segment(id): Segment) -> Result<Response, ApiError> {
    if uuid::Uuid::parse_str(&id).is_err() {
        return Ok(error(StatusCode::NOT_FOUND, "Job not found"));
    }
    let (service, owner) = (state.service.clone(), caller.owner().to_string());
    let found = blocking(move || {
        let (record, _) = match super::block(service.get(&owner, &id)) {
            Ok(r) => r,
            Err(ServiceError::NotFound) => return Ok(None),
            Err(e) => return Err(e),
        };
        let finished = super::block(service.compat_history_item(&owner, &id))?;
        let Some(job) = finished else { return Ok(Some(serde_json::to_vec(&short(&record)))) };
        let mut out = summary(&service, &job.record, job.record.outputs.len())?;
        let item = super::history::item(&service, &job)?;
        out.insert("outputs".into(), item.outputs);
        out.insert("execution_status".into(), item.status);
        // The workflow's text is written as stored, never parsed.
        #[derive(serde::Serialize)]
        struct Detail<'a> {
            #[serde(flatten)]
            summary: Map<String, Json_>,
            workflow: Workflow<'a>,
        }
        #[derive(serde::Serialize)]
        struct Workflow<'a> {
            prompt: &'a serde_json::value::RawValue,
            extra_data: &'a Map<String, Json_>,
        }
        let detail = Detail { summary: out, workflow: Workflow { prompt: &job.workflow, extra_data: &item.prompt.3 } };
        Ok(Some(serde_json::to_vec(&detail)))
    })
    .await?;
    Ok(match found {
        Some(Ok(body)) => ([(axum::http::header::CONTENT_TYPE, "application/json")], body).into_response(),
        Some(Err(e)) => return Err(ApiError::internal(&e)),
        None => error(StatusCode::NOT_FOUND, "Job not found"),
    })
}

/// Cancels the jobs that are queued or running; whether any was.
async fn cancel_ids(state: &AppState, owner: &str, ids: Vec<String>) -> Result<bool, ApiError> {
    let (service, owner) = (state.service.clone(), owner.to_string());
    blocking(move || {
        let mut any = false;
        for id in ids {
            match super::block(service.get(&owner, &id)) {
                Ok((r, _)) if matches!(r.status, JobStatus::Queued | JobStatus::Running) => {
                    super::block(service.delete_from_queue(&owner, std::slice::from_ref(&id)))?;
                    any = true;
                }
                Ok(_) | Err(ServiceError::NotFound) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(any)
    })
    .await
}

pub async fn cancel(State(state): State<Arc<AppState>>, caller: Caller, Segment(id): Segment) -> Result<Response, ApiError> {
    let ids = if uuid::Uuid::parse_str(&id).is_ok() { vec![id] } else { Vec::new() };
    Ok(Json(json!({ "cancelled": cancel_ids(&state, caller.owner(), ids).await? })).into_response())
}

pub async fn cancel_many(State(state): State<Arc<AppState>>, caller: Caller, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let body = super::optional_object(body, state.service.options().workflow_limits.max_bytes)?.unwrap_or_default();
    let Some(list) = body.get("job_ids").and_then(Json_::as_array) else { return Ok(error(StatusCode::BAD_REQUEST, "job_ids must be a list")) };
    let canonical = |v: &Json_| v.as_str().filter(|s| uuid::Uuid::parse_str(s).is_ok_and(|u| u.hyphenated().to_string() == *s)).map(str::to_string);
    let invalid: Vec<&Json_> = list.iter().filter(|v| canonical(v).is_none()).collect();
    if !invalid.is_empty() {
        return Ok((StatusCode::BAD_REQUEST, Json(json!({ "error": "job_ids contains invalid id(s)", "invalid_ids": invalid }))).into_response());
    }
    let ids = list.iter().filter_map(canonical).collect();
    Ok(Json(json!({ "cancelled": cancel_ids(&state, caller.owner(), ids).await? })).into_response())
}
