//! Execution messages as ComfyUI's WebSocket frames: JSON text frames
//! `{"type", "data"}` (compat-protocol.md 3.4) and binary frames (3.6; all
//! integers big-endian u32).

use serde_json::{Value, json};

use crate::files::{FileKind, SavedFile};
use crate::service::bus::{ExecBody, ExecMessage};

/// Binary frame type: a preview image without metadata.
pub const PREVIEW_IMAGE: u32 = 1;
/// Binary frame type: progress text (`[node id length][node id][text]`).
pub const TEXT: u32 = 3;
/// Binary frame type: a preview image after a JSON metadata block.
pub const PREVIEW_IMAGE_WITH_METADATA: u32 = 4;

/// A frame for one connection.
pub enum Frame {
    Text(String),
    Binary(Vec<u8>),
}

fn text(kind: &str, data: Value) -> Frame {
    Frame::Text(json!({ "type": kind, "data": data }).to_string())
}

/// `status`: the queue count; `sid` only in the first message of a connection.
pub fn status(remaining: usize, sid: Option<&str>) -> Frame {
    let mut data = json!({ "status": { "exec_info": { "queue_remaining": remaining } } });
    if let Some(sid) = sid {
        data["sid"] = json!(sid);
    }
    text("status", data)
}

/// `executing` as sent on connect while a node runs: no `prompt_id`, no
/// `display_node` (compat-protocol.md 3.2).
pub fn reconnect_executing(node: &str) -> Frame {
    text("executing", json!({ "node": node }))
}

/// The answer to a client's `feature_flags`.
pub fn feature_flags(flags: Value) -> Frame {
    text("feature_flags", flags)
}

/// The UI output of a node's saved files: `{"images": [{filename,
/// subfolder, type}]}` (other media under `video`, `audio`, `files`).
pub fn ui_output(files: &[SavedFile]) -> Value {
    let mut out = serde_json::Map::new();
    for file in files {
        let key = match crate::service::job_files::media_type(&file.filename).1 {
            "image" => "images",
            "video" => "video",
            "audio" => "audio",
            _ => "files",
        };
        let kind = match file.kind {
            FileKind::Output => "output",
            FileKind::Temp => "temp",
        };
        let entry = json!({ "filename": file.filename, "subfolder": file.subfolder, "type": kind });
        if let Value::Array(list) = out.entry(key).or_insert_with(|| Value::Array(Vec::new())) {
            list.push(entry);
        }
    }
    Value::Object(out)
}

/// The frame of `message` for a connection (`preview_metadata`: it asked
/// for type-4 previews); `None` for what ComfyUI does not show.
pub fn message(message: &ExecMessage, preview_metadata: bool) -> Option<Frame> {
    let id = crate::store::public_job_id(&message.job_id);
    Some(match &message.body {
        ExecBody::Queue { remaining } => status(*remaining, None),
        ExecBody::Started { at_ms } => text("execution_start", json!({ "prompt_id": id, "timestamp": at_ms })),
        ExecBody::Cached { nodes, at_ms } => text("execution_cached", json!({ "nodes": nodes, "prompt_id": id, "timestamp": at_ms })),
        // The node whose state changed and the others running now (ComfyUI
        // re-sends the whole map every time: quadratic in the number of
        // nodes; the frontend replaces its map with each message, so the
        // running ones must be there).
        ExecBody::NodeState { node, value, max, state, others } => {
            let entry = |node: &str, value: f64, max: f64, state: &str| {
                json!({ "value": value, "max": max, "state": state, "node_id": node, "prompt_id": id,
                        "display_node_id": node, "parent_node_id": null, "real_node_id": node })
            };
            let mut nodes = serde_json::Map::new();
            for (other, v, m) in others {
                nodes.insert(other.clone(), entry(other, *v, *m, "running"));
            }
            nodes.insert(node.clone(), entry(node, *value, *max, state.as_str()));
            text("progress_state", json!({ "prompt_id": id, "nodes": nodes }))
        }
        ExecBody::Executing { node: Some(node) } => text("executing", json!({ "node": node, "display_node": node, "prompt_id": id })),
        ExecBody::Executing { node: None } => text("executing", json!({ "node": null, "prompt_id": id })),
        ExecBody::Progress { node, value, max } => text("progress", json!({ "value": value, "max": max, "prompt_id": id, "node": node })),
        ExecBody::Output { node, files } => text("executed", json!({ "node": node, "display_node": node, "output": ui_output(files), "prompt_id": id })),
        ExecBody::Succeeded { at_ms } => text("execution_success", json!({ "prompt_id": id, "timestamp": at_ms })),
        ExecBody::Failed { node, class_type, code, message, executed, at_ms } => text(
            "execution_error",
            json!({
                "prompt_id": id, "node_id": node, "node_type": class_type, "executed": executed,
                "exception_message": format!("{message}\n"), "exception_type": code.exception_type(),
                "traceback": [], "current_inputs": {}, "current_outputs": [], "timestamp": at_ms,
            }),
        ),
        ExecBody::Interrupted { node, class_type, executed, at_ms } => {
            text("execution_interrupted", json!({ "prompt_id": id, "node_id": node, "node_type": class_type, "executed": executed, "timestamp": at_ms }))
        }
        ExecBody::Preview { node, content_type, data } => Frame::Binary(preview(id, node, content_type, data, preview_metadata)),
        ExecBody::Text { node, text } => Frame::Binary(progress_text(node, text)),
    })
}

/// A binary preview frame: type 4 with metadata for clients that asked for
/// it, type 1 otherwise.
pub fn preview(prompt_id: &str, node: &str, content_type: &str, image: &[u8], with_metadata: bool) -> Vec<u8> {
    if with_metadata {
        let meta = json!({
            "node_id": node, "display_node_id": node, "real_node_id": node, "prompt_id": prompt_id,
            "parent_node_id": null, "image_type": content_type,
        })
        .to_string();
        let mut frame = Vec::with_capacity(8 + meta.len() + image.len());
        frame.extend_from_slice(&PREVIEW_IMAGE_WITH_METADATA.to_be_bytes());
        frame.extend_from_slice(&(meta.len() as u32).to_be_bytes());
        frame.extend_from_slice(meta.as_bytes());
        frame.extend_from_slice(image);
        frame
    } else {
        let format: u32 = if content_type == "image/jpeg" { 1 } else { 2 };
        let mut frame = Vec::with_capacity(8 + image.len());
        frame.extend_from_slice(&PREVIEW_IMAGE.to_be_bytes());
        frame.extend_from_slice(&format.to_be_bytes());
        frame.extend_from_slice(image);
        frame
    }
}

/// A TEXT frame (the plain layout: no prompt id, since the server does not
/// advertise `supports_progress_text_metadata`).
pub fn progress_text(node: &str, text: &str) -> Vec<u8> {
    let mut frame = Vec::with_capacity(8 + node.len() + text.len());
    frame.extend_from_slice(&TEXT.to_be_bytes());
    frame.extend_from_slice(&(node.len() as u32).to_be_bytes());
    frame.extend_from_slice(node.as_bytes());
    frame.extend_from_slice(text.as_bytes());
    frame
}

#[cfg(test)]
pub(in crate::api::compat) mod tests {
    use super::*;

    #[test]
    fn binary_frames_are_big_endian_with_their_layouts() {
        let plain = preview("p", "7", "image/png", b"PNG", false);
        assert_eq!(plain, [&[0, 0, 0, 1, 0, 0, 0, 2][..], b"PNG"].concat());
        let meta = preview("p", "7", "image/png", b"PNG", true);
        assert_eq!(&meta[..4], &[0, 0, 0, 4]);
        let len = u32::from_be_bytes(meta[4..8].try_into().unwrap()) as usize;
        let json: Value = serde_json::from_slice(&meta[8..8 + len]).unwrap();
        assert_eq!(json["node_id"], "7");
        assert_eq!(json["prompt_id"], "p");
        assert!(json["parent_node_id"].is_null());
        assert_eq!(&meta[8 + len..], b"PNG");
        let text = progress_text("12", "width: 4");
        assert_eq!(text, [&[0, 0, 0, 3, 0, 0, 0, 2][..], b"12", b"width: 4"].concat());
    }

    /// The data of the `execution_error` frame of a failure with `code`.
    pub(in crate::api::compat) fn execution_error(code: crate::codes::JobErrorCode) -> Value {
        let body =
            ExecBody::Failed { node: Some("3".into()), class_type: Some("Fail".into()), code, message: "boom".into(), executed: vec!["1".into()], at_ms: 5 };
        let Some(Frame::Text(text)) = message(&ExecMessage::new("j".into(), None, body), false) else { panic!("no text frame") };
        let frame: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(frame["type"], "execution_error", "{frame}");
        frame["data"].clone()
    }

    #[test]
    fn execution_errors_carry_the_exception_type_of_their_code() {
        for &code in crate::codes::JobErrorCode::ALL {
            let data = execution_error(code);
            assert_eq!(data["exception_type"], code.exception_type(), "{code}");
            assert!(crate::codes::SPEC_EXCEPTION_TYPES.contains(&code.exception_type()), "{code}");
            assert_eq!((data["node_id"].as_str(), data["exception_message"].as_str()), (Some("3"), Some("boom\n")), "{data}");
        }
    }
}
