//! Rendering records as the Jobs API's JSON. Every required-but-nullable
//! key is written, as `null` when unknown; timestamps are RFC 3339 with an
//! explicit `+00:00`; asset URLs are absolute, job links host-relative.
//! Views borrow the records and serialize straight to bytes (no
//! intermediate `serde_json::Value`): `GET /jobs/{id}` is the hot path.

use chrono::{DateTime, SecondsFormat};
use serde::Serialize;
use serde_json::{Map, Value as Json};
use utoipa::ToSchema;

use crate::api::Links;
use crate::store::{AssetRecord, JobErrorRecord, JobRecord, JobStatus, Micros, OutputRecord, ProgressSnapshot, now_micros};

/// Download URLs of uploads are advertised for this long.
const UPLOAD_URL_TTL_US: Micros = 24 * 3600 * 1_000_000;

/// RFC 3339 with microseconds and `+00:00`.
pub fn timestamp(us: Micros) -> String {
    DateTime::from_timestamp_micros(us).unwrap_or_default().to_rfc3339_opts(SecondsFormat::Micros, false)
}

/// An Output object.
#[derive(Serialize, ToSchema)]
pub struct OutputView<'a> {
    node_id: &'a str,
    name: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    content_type: &'a str,
    size_bytes: u64,
    id: &'a str,
    hash: &'a str,
    url: String,
    #[schema(schema_with = crate::api::openapi::schemas::timestamp)]
    url_expires_at: String,
    job_id: &'a str,
}

pub fn output<'a>(o: &'a OutputRecord, job: &'a JobRecord, links: &Links) -> OutputView<'a> {
    let (url, url_expires_at) = links.content(&o.asset_id, job.expires_at);
    OutputView {
        node_id: &o.node_id,
        name: &o.name,
        kind: &o.kind,
        content_type: &o.content_type,
        size_bytes: o.size_bytes,
        id: &o.asset_id,
        hash: &o.hash,
        url,
        url_expires_at: timestamp(url_expires_at),
        job_id: job.public_id(),
    }
}

#[derive(Serialize, ToSchema)]
struct Metrics {
    queue_ms: Option<i64>,
    execution_ms: Option<i64>,
}

#[derive(Serialize, ToSchema)]
struct Urls {
    #[serde(rename = "self")]
    this: String,
    events: String,
    cancel: String,
}

#[derive(Serialize, ToSchema)]
struct LogsView<'a> {
    text: &'a str,
    truncated: bool,
    #[schema(schema_with = crate::api::openapi::schemas::timestamp)]
    captured_at: String,
}

/// A Job object (plus `create_time`/`update_time` for list readers).
#[derive(Serialize, ToSchema)]
pub struct JobView<'a> {
    id: &'a str,
    #[schema(value_type = JobStatus)]
    status: &'static str,
    #[schema(schema_with = crate::api::openapi::schemas::timestamp)]
    created_at: String,
    #[schema(schema_with = crate::api::openapi::schemas::maybe_timestamp)]
    started_at: Option<String>,
    #[schema(schema_with = crate::api::openapi::schemas::maybe_timestamp)]
    completed_at: Option<String>,
    #[schema(schema_with = crate::api::openapi::schemas::timestamp)]
    expires_at: String,
    queue_position: Option<usize>,
    progress: &'a Option<ProgressSnapshot>,
    outputs: Vec<OutputView<'a>>,
    error: &'a Option<JobErrorRecord>,
    metrics: Metrics,
    urls: Urls,
    #[schema(schema_with = crate::api::openapi::schemas::timestamp)]
    create_time: String,
    #[schema(schema_with = crate::api::openapi::schemas::timestamp)]
    update_time: String,
    /// The labels it was submitted with.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    metadata: Option<&'a Map<String, Json>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    logs: Option<LogsView<'a>>,
    /// Plugin name → component hash of what its run used (while it
    /// waits, what it was validated against).
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    components: &'a std::collections::BTreeMap<String, String>,
    /// The bundle whose components it ran (`blake3:<hex>`).
    #[serde(skip_serializing_if = "Option::is_none")]
    bundle: Option<&'a str>,
}

/// A Job; `logs` only when asked (GET of one job).
pub fn job<'a>(rec: &'a JobRecord, queue_position: Option<usize>, links: &Links, with_logs: bool) -> JobView<'a> {
    let base = format!("{}/jobs/{}", links.v2(), rec.public_id());
    let created = timestamp(rec.created_at);
    JobView {
        id: rec.public_id(),
        status: rec.status.as_str(),
        created_at: created.clone(),
        started_at: rec.started_at.map(timestamp),
        completed_at: rec.completed_at.map(timestamp),
        expires_at: timestamp(rec.expires_at),
        queue_position,
        progress: &rec.progress,
        outputs: rec.outputs.iter().map(|o| output(o, rec, links)).collect(),
        error: &rec.error,
        metrics: Metrics { queue_ms: rec.queue_ms, execution_ms: rec.execution_ms },
        urls: Urls { events: format!("{base}/events"), cancel: format!("{base}/cancel"), this: base },
        create_time: created,
        update_time: timestamp(rec.updated_at),
        metadata: rec.metadata.as_ref(),
        logs: rec.logs.as_ref().filter(|_| with_logs).map(|l| LogsView { text: &l.text, truncated: l.truncated, captured_at: timestamp(l.captured_at) }),
        components: &rec.components,
        bundle: rec.bundle.as_deref(),
    }
}

/// An Asset object.
#[derive(Serialize, ToSchema)]
pub struct AssetView<'a> {
    id: &'a str,
    hash: &'a str,
    size_bytes: u64,
    content_type: &'a str,
    #[schema(schema_with = crate::api::openapi::schemas::timestamp)]
    created_at: String,
    url: String,
    #[schema(schema_with = crate::api::openapi::schemas::timestamp)]
    url_expires_at: String,
    file_path: &'a Option<String>,
    #[schema(schema_with = crate::api::openapi::schemas::maybe_timestamp)]
    expires_at: Option<String>,
    job_id: Option<&'a str>,
    tags: &'a [String],
    /// Only on create responses.
    #[serde(skip_serializing_if = "Option::is_none")]
    created_new: Option<bool>,
}

pub fn asset<'a>(a: &'a AssetRecord, links: &Links, created_new: Option<bool>) -> AssetView<'a> {
    let (url, url_expires_at) = links.content(&a.id, a.expires_at.unwrap_or_else(|| now_micros() + UPLOAD_URL_TTL_US));
    AssetView {
        id: &a.id,
        hash: &a.hash,
        size_bytes: a.size_bytes,
        content_type: &a.content_type,
        created_at: timestamp(a.created_at),
        url,
        url_expires_at: timestamp(url_expires_at),
        file_path: &a.file_path,
        expires_at: a.expires_at.map(timestamp),
        job_id: a.job_id.as_deref().map(crate::store::public_job_id),
        tags: &a.tags,
        created_new,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_zone_aware() {
        assert_eq!(timestamp(1_700_000_000_123_456), "2023-11-14T22:13:20.123456+00:00");
    }
}
