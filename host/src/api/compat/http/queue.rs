//! `GET /api/queue` (ComfyUI's 5-element entries; every running job in
//! `queue_running`, pending ones in queue order), `POST /api/queue`
//! (`delete`: cancels the listed jobs, pending or running, as the spec
//! says; `clear`: cancels every pending one) and `POST /api/interrupt`
//! (`{"prompt_id"}`: that job if it runs; otherwise every running job).
//! Edits answer 200 with an empty body.

use crate::api::pool::on_pool;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::Response;
use serde_json::Value as Json_;

use super::{delete_or_clear, empty_ok, optional_object, queue_item, streamed};
use crate::api::AppState;
use crate::api::Caller;
use crate::api::error::ApiError;

pub async fn list(State(state): State<Arc<AppState>>, caller: Caller) -> Result<Response, ApiError> {
    let (service, owner) = (state.service.clone(), caller.owner().to_string());
    let s = service.clone();
    let (running, pending) = on_pool(move || async move { s.compat_queue(&owner).await }).await?.map_err(super::compat_error)?;
    // Each entry carries its workflow: written one job at a time.
    Ok(streamed::json(move |out| {
        for (i, (name, jobs)) in [("queue_running", running), ("queue_pending", pending)].into_iter().enumerate() {
            out.raw(if i == 0 { b"{" } else { b"," })?;
            out.json(name)?;
            out.raw(b":[")?;
            for (j, record) in jobs.into_iter().enumerate() {
                if j > 0 {
                    out.raw(b",")?;
                }
                let job = super::block(service.compat_job(record))?;
                out.json(&queue_item(&job))?;
            }
            out.raw(b"]")?;
        }
        out.raw(b"}")
    }))
}

pub async fn edit(State(state): State<Arc<AppState>>, caller: Caller, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let (delete, clear) = delete_or_clear(&state, body)?;
    let (service, owner) = (state.service.clone(), caller.owner().to_string());
    super::blocking(move || {
        if clear {
            super::block(service.clear_queue(&owner))?;
        }
        super::block(service.delete_from_queue(&owner, &delete))
    })
    .await?;
    Ok(empty_ok())
}

pub async fn interrupt(State(state): State<Arc<AppState>>, caller: Caller, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let body = optional_object(body, state.service.options().workflow_limits.max_bytes)?;
    let id = body.as_ref().and_then(|b| b.get("prompt_id")).and_then(Json_::as_str).map(str::to_string);
    let (service, owner) = (state.service.clone(), caller.owner().to_string());
    on_pool(move || async move { service.interrupt(&owner, id.as_deref()).await }).await?.map_err(super::compat_error)?;
    Ok(empty_ok())
}
