//! `GET /api/history` (`max_items`: the last N; `offset`: skipped from the
//! oldest), `GET /api/history/{id}` (`{}` until the job has finished, or
//! for an unknown id, as ComfyUI answers) and `POST /api/history`
//! (`delete`, `clear`: finished jobs leave the history, ending `expired`
//! as retention would end them).
//!
//! A history item is ComfyUI's `{prompt, outputs, status, meta}`: the queue
//! tuple, the output files by node (`images`, `video`, `audio`, `files`,
//! all of type `output`), `status_str`/`completed` with the
//! `execution_start`, `execution_cached` and terminal messages rebuilt from
//! the job's record, and `meta` per output node.

use crate::api::pool::on_pool;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value as Json_, json};

use super::{QueueItem, blocking, delete_or_clear, empty_ok, millis, queue_item, streamed};
use crate::api::AppState;
use crate::api::Caller;
use crate::api::error::ApiError;
use crate::api::v2::Segment;
use crate::codes::JobErrorCode;
use crate::service::Service;
use crate::service::compat::CompatJob;
use crate::store::{JobRecord, JobStatus};

#[derive(serde::Deserialize)]
pub struct HistoryQuery {
    max_items: Option<usize>,
    offset: Option<usize>,
}

/// The ComfyUI output group of an output kind.
pub(super) fn group(kind: &str) -> &'static str {
    match kind {
        "image" => "images",
        "video" => "video",
        "audio" => "audio",
        "text" => "text",
        _ => "files",
    }
}

/// A history item: ComfyUI's `{prompt, outputs, status, meta}`.
#[derive(serde::Serialize)]
pub(super) struct Item<'a> {
    pub prompt: QueueItem<'a>,
    pub outputs: Json_,
    pub status: Json_,
    pub meta: Json_,
}

/// A history item, rendered from a finished job.
pub(super) fn item<'a>(service: &Service, job: &'a CompatJob) -> Result<Item<'a>, crate::service::ServiceError> {
    let r = &job.record;
    let id = r.public_id();
    let files = super::block(service.compat_outputs(r))?;
    let mut outputs = Map::new();
    let mut meta = Map::new();
    for (file, rec) in files.iter().zip(&r.outputs) {
        let node = outputs.entry(file.node_id.clone()).or_insert_with(|| json!({}));
        if let Some(node) = node.as_object_mut()
            && let Some(list) = node.entry(group(&rec.kind)).or_insert_with(|| json!([])).as_array_mut()
        {
            list.push(json!({ "filename": file.filename, "subfolder": file.subfolder, "type": "output" }));
        }
        meta.insert(file.node_id.clone(), json!({ "node_id": file.node_id, "display_node": file.node_id, "parent_node": null, "real_node_id": file.node_id }));
    }
    let started = millis(r.started_at.unwrap_or(r.created_at));
    let ended = millis(r.completed_at.unwrap_or(r.updated_at));
    let executed: Vec<&String> = meta.keys().collect();
    let messages = vec![
        json!(["execution_start", { "prompt_id": id, "timestamp": started }]),
        json!(["execution_cached", { "nodes": [], "prompt_id": id, "timestamp": started }]),
        terminal_message(r, &executed, ended),
    ];
    let success = r.status == JobStatus::Succeeded;
    Ok(Item {
        prompt: queue_item(job),
        outputs: Json_::Object(outputs),
        status: json!({ "status_str": if success { "success" } else { "error" }, "completed": success, "messages": messages }),
        meta: Json_::Object(meta),
    })
}

/// The terminal `[event, data]` of a finished job's status messages:
/// `execution_success`, `execution_interrupted` (canceled) or
/// `execution_error` (failed or expired; a job with no recorded error is
/// shown as `internal_error` would be).
fn terminal_message(r: &JobRecord, executed: &[&String], ended: i64) -> Json_ {
    let id = r.public_id();
    let error = r.error.as_ref();
    let node_id = error.and_then(|e| e.node_id.clone());
    let node_type = error.and_then(|e| e.class_type.clone());
    match r.status {
        JobStatus::Succeeded => json!(["execution_success", { "prompt_id": id, "timestamp": ended }]),
        JobStatus::Canceled => json!(["execution_interrupted", {
            "prompt_id": id, "node_id": node_id, "node_type": node_type, "executed": executed, "timestamp": ended,
        }]),
        _ => json!(["execution_error", {
            "prompt_id": id, "node_id": node_id, "node_type": node_type, "executed": executed,
            "exception_message": error.map(|e| e.message.clone()).unwrap_or_default(),
            "exception_type": error.map_or(JobErrorCode::InternalError, |e| e.code).exception_type(),
            "traceback": error.and_then(|e| e.traceback.clone()).map(|t| vec![t]).unwrap_or_default(),
            "current_inputs": {}, "current_outputs": [], "timestamp": ended,
        }]),
    }
}

/// Writes `{id: item, …}` for `records`, their workflows read a few at a
/// time (within the service's listing budget) and each item rendered as
/// soon as its workflow is there.
fn write_items(service: &Service, records: Vec<crate::store::JobRecord>, out: &mut streamed::Sink) -> Result<(), crate::service::ServiceError> {
    out.raw(b"{")?;
    let mut records = records.into();
    let mut first = true;
    loop {
        let jobs = super::block(service.compat_next_jobs(&mut records))?;
        if jobs.is_empty() {
            break;
        }
        for job in jobs {
            if !std::mem::take(&mut first) {
                out.raw(b",")?;
            }
            out.json(job.record.public_id())?;
            out.raw(b":")?;
            out.json(&item(service, &job)?)?;
        }
    }
    out.raw(b"}")
}

pub async fn list(State(state): State<Arc<AppState>>, caller: Caller, query: Result<Query<HistoryQuery>, QueryRejection>) -> Result<Response, ApiError> {
    let Query(q) = query.map_err(|_| ApiError::invalid_request("`max_items` and `offset` must be whole numbers."))?;
    let (service, owner) = (state.service.clone(), caller.owner().to_string());
    // ComfyUI: `offset` skips from the oldest; `max_items` alone keeps the
    // last N. Only the page's records and workflows are read: the newest N
    // alone, or the page of the owner's kept window (`compat_window`).
    let jobs = on_pool(move || async move {
        match (q.offset, q.max_items) {
            (None, newest) => service.compat_history(&owner, newest).await,
            (Some(offset), max) => {
                let window = service.compat_window(&owner).await?;
                let start = offset.min(window.len());
                let end = start.saturating_add(max.unwrap_or(usize::MAX)).min(window.len());
                service.compat_window_records(&window[start..end]).await
            }
        }
    })
    .await?
    .map_err(super::compat_error)?;
    let service = state.service.clone();
    Ok(streamed::json(move |out| write_items(&service, jobs, out)))
}

pub async fn one(State(state): State<Arc<AppState>>, caller: Caller, Segment(id): Segment) -> Result<Response, ApiError> {
    let (service, owner) = (state.service.clone(), caller.owner().to_string());
    let body = blocking(move || {
        let mut body = Vec::new();
        let job = if uuid::Uuid::parse_str(&id).is_ok() { super::block(service.compat_history_item(&owner, &id))? } else { None };
        let rendered = match &job {
            Some(job) => serde_json::to_writer(&mut body, &std::collections::BTreeMap::from([(job.record.public_id(), item(&service, job)?)])),
            None => serde_json::to_writer(&mut body, &Map::new()),
        };
        rendered.map_err(|e| crate::service::ServiceError::Store(crate::store::StoreError::Backend(e.to_string())))?;
        Ok(body)
    })
    .await?;
    Ok(([(axum::http::header::CONTENT_TYPE, "application/json")], body).into_response())
}

pub async fn edit(State(state): State<Arc<AppState>>, caller: Caller, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let (delete, clear) = delete_or_clear(&state, body)?;
    let (service, owner) = (state.service.clone(), caller.owner().to_string());
    blocking(move || {
        if clear {
            super::block(service.delete_history(&owner, None))?;
        }
        if !delete.is_empty() {
            super::block(service.delete_history(&owner, Some(&delete)))?;
        }
        Ok(())
    })
    .await?;
    Ok(empty_ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::compat::ws::render;
    use crate::store::JobErrorRecord;

    fn failed(code: JobErrorCode) -> JobRecord {
        let mut r = JobRecord::queued_for_test("0c0ffee0-0000-4000-8000-000000000001", 1_000, 1);
        r.status = JobStatus::Failed;
        r.error = Some(JobErrorRecord { code, message: "boom".into(), node_id: Some("3".into()), class_type: Some("Fail".into()), traceback: None });
        r
    }

    /// Every job error code shows on every surface: its wire name as the
    /// Jobs API's `error.code`, and one spec-listed `exception_type` on the
    /// WebSocket, in `/api/history` and in ComfyUI's `/api/jobs`.
    #[test]
    fn every_job_error_code_shows_the_same_on_every_surface() {
        let links = crate::api::links::Links::for_test();
        for &code in JobErrorCode::ALL {
            let r = failed(code);
            let v2 = serde_json::to_value(crate::api::v2::wire::job(&r, None, &links, false)).unwrap();
            assert_eq!(v2["error"]["code"], code.as_str(), "{v2}");
            let want = code.exception_type();
            assert!(!want.is_empty() && crate::codes::SPEC_EXCEPTION_TYPES.contains(&want), "{code}: {want}");
            let ws = render::tests::execution_error(code);
            assert_eq!(ws["exception_type"], want, "ws, {code}");
            let history = terminal_message(&r, &[], 2);
            assert_eq!(history[0], "execution_error", "{history}");
            assert_eq!(history[1]["exception_type"], want, "history, {code}");
            let jobs = super::super::jobs::short(&r);
            assert_eq!(jobs["execution_error"]["exception_type"], want, "/api/jobs, {code}");
            assert_eq!(ws["exception_type"], history[1]["exception_type"], "{code}");
        }
    }

    #[test]
    fn an_interrupted_job_is_an_interrupt_processing_exception_in_the_history() {
        let history = terminal_message(&failed(JobErrorCode::Interrupted), &[], 2);
        assert_eq!(history[1]["exception_type"], "InterruptProcessingException", "{history}");
        let mut unrecorded = failed(JobErrorCode::Interrupted);
        unrecorded.error = None;
        assert_eq!(terminal_message(&unrecorded, &[], 2)[1]["exception_type"], "RuntimeError");
    }
}
