//! Rendering records as the Jobs API's JSON. Every required-but-nullable
//! key is written, as `null` when unknown; timestamps are RFC 3339 with an
//! explicit `+00:00`; asset URLs are absolute, job links host-relative.

use chrono::{DateTime, SecondsFormat};
use serde_json::{Value as Json, json};

use crate::api::Links;
use crate::store::{AssetRecord, JobRecord, Micros, OutputRecord, now_micros};

/// Download URLs of uploads are advertised for this long.
const UPLOAD_URL_TTL_US: Micros = 24 * 3600 * 1_000_000;

/// RFC 3339 with microseconds and `+00:00`.
pub fn timestamp(us: Micros) -> String {
    DateTime::from_timestamp_micros(us).unwrap_or_default().to_rfc3339_opts(SecondsFormat::Micros, false)
}

fn opt_ts(us: Option<Micros>) -> Json {
    us.map_or(Json::Null, |t| Json::String(timestamp(t)))
}

/// An Output object.
pub fn output(o: &OutputRecord, job: &JobRecord, links: &Links) -> Json {
    json!({
        "node_id": o.node_id,
        "name": o.name,
        "type": o.kind,
        "content_type": o.content_type,
        "size_bytes": o.size_bytes,
        "id": o.asset_id,
        "hash": o.hash,
        "url": links.absolute(&format!("{}/assets/{}/content", links.v2(), o.asset_id)),
        "url_expires_at": timestamp(job.expires_at),
        "job_id": job.id,
    })
}

/// A Job object; `logs` only when asked (GET of one job).
pub fn job(rec: &JobRecord, queue_position: Option<usize>, links: &Links, with_logs: bool) -> Json {
    let base = format!("{}/jobs/{}", links.v2(), rec.id);
    let mut v = json!({
        "id": rec.id,
        "status": rec.status.as_str(),
        "created_at": timestamp(rec.created_at),
        "started_at": opt_ts(rec.started_at),
        "completed_at": opt_ts(rec.completed_at),
        "expires_at": timestamp(rec.expires_at),
        "queue_position": queue_position,
        "progress": rec.progress,
        "outputs": rec.outputs.iter().map(|o| output(o, rec, links)).collect::<Vec<_>>(),
        "error": rec.error,
        "metrics": { "queue_ms": rec.queue_ms, "execution_ms": rec.execution_ms },
        "urls": { "self": base, "events": format!("{base}/events"), "cancel": format!("{base}/cancel") },
        "create_time": timestamp(rec.created_at),
        "update_time": timestamp(rec.updated_at),
    });
    if let Some(m) = &rec.metadata {
        v["metadata"] = Json::Object(m.clone());
    }
    if with_logs && let Some(logs) = &rec.logs {
        v["logs"] = json!({ "text": logs.text, "truncated": logs.truncated, "captured_at": timestamp(logs.captured_at) });
    }
    v
}

/// An Asset object; `created_new` only on create responses.
pub fn asset(a: &AssetRecord, links: &Links, created_new: Option<bool>) -> Json {
    let url_expires = a.expires_at.unwrap_or_else(|| now_micros() + UPLOAD_URL_TTL_US);
    let mut v = json!({
        "id": a.id,
        "hash": a.hash,
        "size_bytes": a.size_bytes,
        "content_type": a.content_type,
        "created_at": timestamp(a.created_at),
        "url": links.absolute(&format!("{}/assets/{}/content", links.v2(), a.id)),
        "url_expires_at": timestamp(url_expires),
        "file_path": a.file_path,
        "expires_at": opt_ts(a.expires_at),
        "job_id": a.job_id,
    });
    if let Some(c) = created_new {
        v["created_new"] = Json::Bool(c);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_zone_aware() {
        assert_eq!(timestamp(1_700_000_000_123_456), "2023-11-14T22:13:20.123456+00:00");
    }
}
