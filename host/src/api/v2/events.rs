//! The job event stream (Server-Sent Events): a snapshot on connect
//! (`status`, the outputs so far, then the latest `progress` and `preview`
//! of a running job; of one another host runs, its latest preview comes
//! as the first live `preview` frame),
//! live frames after it, every `output` before the terminal `status`, and
//! the end of the stream right after that. Keepalive comments every 15 s.
//! A stream is a future on its connection plus one broadcast receiver, so
//! thousands of them are cheap.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use tokio::sync::broadcast::error::RecvError;

use super::{Segment, check_id, wire};
use crate::api::Caller;
use crate::api::error::ApiError;
use crate::api::{AppState, Links};
use crate::service::JobEvent;
use crate::store::JobRecord;

fn frame(name: &str, data: &impl serde::Serialize) -> Event {
    Event::default().event(name).data(serde_json::to_string(data).unwrap_or_else(|_| "{}".into()))
}

fn status_frame(state: &AppState, rec: &JobRecord, links: &Links) -> Event {
    let position = (rec.status == crate::store::JobStatus::Queued).then(|| state.service.queue_position(&rec.id)).flatten();
    frame("status", &wire::job(rec, position, links, false))
}

fn event_frame(state: &AppState, event: &JobEvent, links: &Links, job: &JobRecord) -> Event {
    match event {
        JobEvent::Status(rec) => status_frame(state, rec, links),
        JobEvent::Progress(p) => frame("progress", &serde_json::json!(p)),
        JobEvent::Output(o) => frame("output", &wire::output(o, job, links)),
        JobEvent::Preview { node_id, content_type, data } => frame(
            "preview",
            &serde_json::json!({ "node_id": node_id, "content_type": content_type, "data_base64": base64::engine::general_purpose::STANDARD.encode(data.as_slice()) }),
        ),
    }
}

#[utoipa::path(get, path = "/jobs/{id}/events", operation_id = "job_events", tag = "jobs",
    description = "Server-Sent Events: `status` first, `output`, `progress` and `preview` while the job runs, every `output` before the terminal `status`, which ends the stream. The frames are listed in `x-events`.",
    params(("id" = String, Path, description = "The job's id (a UUID).")),
    responses((status = 200, description = "The event stream.", content_type = "text/event-stream", body = crate::api::openapi::schemas::SseEvent)),
    extensions(("x-events" = json!(crate::api::openapi::schemas::event_catalogue()))))]
pub async fn stream(State(state): State<Arc<AppState>>, caller: Caller, links: Links, Segment(id): Segment) -> Result<Response, ApiError> {
    check_id(&id)?;
    let opened = state.service.open_stream(caller.owner(), &id).await?;
    let closing = state.closing.clone();
    // Disabling the account ends the stream at once.
    let ended = opened.guard.closed();
    let state_keepalive = state.config.sse_keepalive_s.max(1);
    let stream = async_stream::stream! {
        let _guard = opened.guard;
        let mut job = opened.snapshot;
        if job.status.is_terminal() || opened.events.is_none() {
            for o in &job.outputs {
                yield Ok::<Event, std::convert::Infallible>(frame("output", &wire::output(o, &job, &links)));
            }
            yield Ok(status_frame(&state, &job, &links));
            return;
        }
        yield Ok(status_frame(&state, &job, &links));
        // Outputs the run already produced. Each output goes out exactly
        // once, whatever order its event and status snapshots arrive in.
        let mut sent: HashSet<String> = HashSet::new();
        for o in &job.outputs {
            sent.insert(o.asset_id.clone());
            yield Ok(frame("output", &wire::output(o, &job, &links)));
        }
        if let Some(p) = &opened.progress {
            yield Ok(frame("progress", &serde_json::json!(p)));
        }
        if let Some(p) = &opened.preview {
            yield Ok(event_frame(&state, p, &links, &job));
        }
        let Some(mut events) = opened.events else { return };
        loop {
            let received = tokio::select! {
                _ = closing.cancelled() => return,
                _ = ended.cancelled() => return,
                r = events.recv() => r,
            };
            match received {
                Ok(event) => {
                    match &event {
                        JobEvent::Status(rec) => job = (**rec).clone(),
                        JobEvent::Output(o) if !sent.insert(o.asset_id.clone()) => continue,
                        JobEvent::Output(o) if !job.outputs.iter().any(|k| k.asset_id == o.asset_id) => job.outputs.push(o.clone()),
                        _ => {}
                    }
                    yield Ok(event_frame(&state, &event, &links, &job));
                    if job.status.is_terminal() {
                        return;
                    }
                }
                Err(e) => {
                    // Fell behind, or the channel is gone (the job finished,
                    // or the process that ran it went away): re-sync from
                    // the record. A closed channel sends nothing more, so
                    // the stream ends there (the client may open another).
                    let Ok((now, _)) = state.service.get(caller.owner(), &job.id).await else { return };
                    for o in now.outputs.iter().filter(|o| sent.insert(o.asset_id.clone())) {
                        yield Ok(frame("output", &wire::output(o, &now, &links)));
                    }
                    job = now;
                    yield Ok(status_frame(&state, &job, &links));
                    if job.status.is_terminal() || matches!(e, RecvError::Closed) {
                        return;
                    }
                }
            }
        }
    };
    let mut response = Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(state_keepalive)).text("keepalive")).into_response();
    let h = response.headers_mut();
    h.insert("cache-control", axum::http::HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", axum::http::HeaderValue::from_static("no"));
    Ok(response)
}
