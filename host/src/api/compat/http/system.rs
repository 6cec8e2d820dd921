//! The small routes clients call at start: `/api/system_stats`,
//! `/api/features`, `/api/extensions` and `/api/embeddings` (`[]`: no
//! frontend extensions, no embeddings), `/api/models` (`[]`: no model
//! folders), `POST /api/free` (accepted; kiln holds no models to unload),
//! what the official frontend reads before it starts: `/api/users`
//! (single-user mode), and the frontend's optional lookups kiln has nothing
//! for: `/api/i18n`, `/api/workflow_templates`, `/api/global_subgraphs`,
//! `/api/node_replacements` (`{}`), `/api/experiment/models` (`[]`: no
//! model folders) and `/api/view_metadata/{folder}` (404: no model files).

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::response::Response;
use serde_json::{Value as Json_, json};

use crate::api::AppState;

/// `(total, available)` memory in bytes, from `/proc/meminfo` (zeros elsewhere).
fn memory() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let field = |name: &str| {
        text.lines().find_map(|l| l.strip_prefix(name)).and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse::<u64>().ok()).map_or(0, |kb| kb * 1024)
    };
    (field("MemTotal:"), field("MemAvailable:"))
}

pub async fn stats() -> Json<Json_> {
    let (total, free) = memory();
    Json(json!({
        "system": {
            "os": std::env::consts::OS,
            "ram_total": total,
            "ram_free": free,
            "comfyui_version": format!("kiln-{}", env!("CARGO_PKG_VERSION")),
            "required_frontend_version": "",
            "installed_templates_version": "",
            "required_templates_version": "",
            "comfy_package_versions": [],
            "python_version": "",
            "pytorch_version": "",
            "embedded_python": false,
            "deploy_environment": "kiln",
            "argv": ["kiln", "serve"],
        },
        "devices": [{
            "name": "cpu", "type": "cpu", "index": null,
            "vram_total": 0, "vram_free": 0, "torch_vram_total": 0, "torch_vram_free": 0,
        }],
    }))
}

pub async fn features(State(state): State<Arc<AppState>>) -> Json<Json_> {
    Json(json!({
        "supports_preview_metadata": true,
        "max_upload_size": state.service.options().max_upload_bytes,
        "extension": { "manager": { "supports_v4": false } },
        "node_replacements": false,
        "assets": false,
    }))
}

pub async fn empty_list() -> Json<Json_> {
    Json(json!([]))
}

pub async fn free() -> Response {
    super::empty_ok()
}

pub async fn users() -> Json<Json_> {
    Json(json!({ "storage": "server", "migrated": true }))
}

pub async fn empty_object() -> Json<Json_> {
    Json(json!({}))
}

pub async fn no_metadata() -> crate::api::error::ApiError {
    crate::api::error::ApiError::not_found()
}
