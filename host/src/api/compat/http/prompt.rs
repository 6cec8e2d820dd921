//! `POST /api/prompt` (validate and queue; ComfyUI's `{prompt_id, number,
//! node_errors}`, its 400 bodies for validation failures), `GET
//! /api/prompt` (`queue_remaining`) and `GET /api/job/{id}/status` (the
//! compatibility status names).
//!
//! The priority counter is taken by every request whose body parses and
//! gives no `number` (rejected ones included, as ComfyUI does); `front`
//! makes the number negative and puts the job at the head of the queue.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value as Json_, json};

use super::compat_error;
use crate::api::AppState;
use crate::api::Caller;
use crate::api::body::json_object;
use crate::api::error::ApiError;
use crate::api::v2::{Segment, check_id};
use crate::files::NamedInputs;
use crate::service::{ExtraData, ServiceError};
use crate::service::{Submission, SubmitError};
use crate::store::CompatFields;
use crate::workflow::{Issue, IssueKind, ValidationError};

/// Longest `client_id` kept.
const MAX_CLIENT_ID: usize = 256;

/// ComfyUI's 400 body: `{error: {type, message, details, extra_info}, node_errors}`.
fn rejection(kind: &str, message: impl Into<String>, details: impl Into<String>, extra_info: Json_, node_errors: Json_) -> Response {
    let body = json!({
        "error": { "type": kind, "message": message.into(), "details": details.into(), "extra_info": extra_info },
        "node_errors": node_errors,
    });
    (StatusCode::BAD_REQUEST, Json(body)).into_response()
}

pub async fn remaining(State(state): State<Arc<AppState>>, caller: Caller) -> Result<Json<Json_>, ApiError> {
    let (service, owner) = (state.service.clone(), caller.owner().to_string());
    let remaining = crate::api::pool::on_pool(move || async move { service.queue_remaining_everywhere(&owner).await }).await?;
    Ok(Json(json!({ "exec_info": { "queue_remaining": remaining } })))
}

pub async fn status(State(state): State<Arc<AppState>>, caller: Caller, Segment(id): Segment) -> Result<Json<Json_>, ApiError> {
    check_id(&id)?;
    let (record, _) = state.service.get_shared(caller.owner(), &id).await.map_err(compat_error)?;
    Ok(Json(json!({ "status": crate::api::statuses::comfy_job(&record) })))
}

/// A canonical (lowercase, hyphenated) UUID.
fn canonical_uuid(s: &str) -> bool {
    uuid::Uuid::parse_str(s).is_ok_and(|u| u.hyphenated().to_string() == s)
}

/// `extra_data`: free-form in ComfyUI; `api_key_svc_org` (the partner
/// key, never stored) and `extra_pnginfo` (PNG metadata for SaveImage, held
/// for the run) mean something here.
fn extra_data(value: Option<&Json_>) -> Result<ExtraData, ApiError> {
    let mut extra = ExtraData::default();
    match value {
        None | Some(Json_::Null) => {}
        Some(Json_::Object(map)) => {
            match map.get("api_key_svc_org") {
                None | Some(Json_::Null) => {}
                Some(Json_::String(key)) => extra.secrets = crate::plugins::JobSecrets::new(Some(key.clone())),
                Some(_) => return Err(ApiError::invalid_request("`extra_data.api_key_svc_org` must be a string.")),
            }
            extra.extra_pnginfo = map.get("extra_pnginfo").filter(|v| v.is_object()).map(|v| Arc::new(v.clone()));
        }
        Some(_) => return Err(ApiError::invalid_request("`extra_data` must be an object.")),
    }
    Ok(extra)
}

pub async fn submit(State(state): State<Arc<AppState>>, caller: Caller, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let limit = state.service.options().workflow_limits.max_bytes;
    // Counted before it is parsed; parsed only once its memory fits.
    let admitted = match &body {
        Ok(bytes) => match state.service.admit_body(bytes).await {
            Ok(permit) => Some(permit),
            Err(crate::service::ServiceError::InvalidWorkflow { message, .. }) => {
                return Ok(rejection("invalid_prompt", message, "", json!({}), json!({})));
            }
            Err(e) => return Err(e.into()),
        },
        Err(_) => None,
    };
    let size = body.as_ref().map_or(0, |b| b.len());
    let mut body = json_object(body, limit)?;
    let front = body.get("front").and_then(Json_::as_bool).unwrap_or(false);
    // ComfyUI float()s a given number; without one the counter is taken.
    let number = match body.get("number") {
        None | Some(Json_::Null) => {
            let n = state.service.next_prompt_number(caller.owner()).await?;
            serde_json::Number::from(if front { -n } else { n })
        }
        Some(v) => {
            let float = v.as_f64().or_else(|| v.as_str().and_then(|s| s.trim().parse::<f64>().ok()));
            float.and_then(serde_json::Number::from_f64).ok_or_else(|| ApiError::invalid_request("`number` must be a number."))?
        }
    };
    let workflow = match body.remove("prompt") {
        Some(w @ Json_::Object(_)) => w,
        _ => return Ok(rejection("no_prompt", "No prompt provided", "No prompt provided", json!({}), json!({}))),
    };
    let id = match body.get("prompt_id") {
        None | Some(Json_::Null) => None,
        Some(Json_::String(s)) if canonical_uuid(s) => Some(s.clone()),
        Some(_) => {
            return Ok(rejection(
                "invalid_prompt_id",
                "prompt_id must be a valid UUID",
                "prompt_id must be a UUID string in canonical lowercase hyphenated form; omit it to let the server generate one",
                json!({}),
                json!({}),
            ));
        }
    };
    let client_id = match body.get("client_id") {
        Some(Json_::String(s)) if s.len() <= MAX_CLIENT_ID => Some(s.clone()),
        None | Some(Json_::Null) => None,
        Some(_) => return Err(ApiError::invalid_request(format!("`client_id` must be a string of at most {MAX_CLIENT_ID} bytes."))),
    };
    let extra = extra_data(body.get("extra_data"))?;
    let titles = node_titles(&workflow);
    let fields = CompatFields { number: number.clone(), client_id };
    let submission = Submission { extra, id, front, ..Submission::compat(caller.owner(), workflow, fields) };
    let outcome = crate::api::pool::admit(state.service.clone(), submission, size).await?;
    drop(admitted);
    let registry = state.service.registry_for(caller.owner());
    match outcome {
        Ok(accepted) => {
            Ok(Json(json!({ "prompt_id": accepted.record.public_id(), "number": number, "node_errors": node_errors(&accepted.dropped, &registry) }))
                .into_response())
        }
        Err(e) => refused(e, &titles, &registry),
    }
}

/// A prompt the intake refused, as ComfyUI answers: its 400 bodies for the
/// graph itself, the error envelope for every other rule.
fn refused(e: SubmitError, titles: &Map<String, Json_>, registry: &crate::plugins::NodeRegistry) -> Result<Response, ApiError> {
    match e {
        // ComfyUI finds no output in an empty prompt.
        SubmitError::Unreadable(crate::workflow::ParseError::Empty) | SubmitError::Invalid(ValidationError::NoOutputs) => {
            Ok(rejection("prompt_no_outputs", "Prompt has no outputs", "", json!({}), json!({})))
        }
        SubmitError::Unreadable(e) => Ok(rejection("invalid_prompt", e.to_string(), "", json!({}), json!({}))),
        SubmitError::Invalid(ValidationError::Node(issue)) => Ok(unknown_node(&issue, titles)),
        SubmitError::Invalid(ValidationError::OutputsFailed(issues)) => {
            // `details`: the errors of the failed output nodes themselves.
            let details: Vec<String> = issues
                .iter()
                .filter(|i| i.dependent_outputs.contains(&i.node_id))
                .map(|i| {
                    let e = error_entry(i, registry);
                    format!("{}: {}", e["message"].as_str().unwrap_or(""), e["details"].as_str().unwrap_or(""))
                })
                .collect();
            Ok(rejection("prompt_outputs_failed_validation", "Prompt outputs failed validation", details.join("\n"), json!({}), node_errors(&issues, registry)))
        }
        SubmitError::Refused(ServiceError::InvalidWorkflow { message, .. }) => Ok(rejection("invalid_prompt", message, "", json!({}), json!({}))),
        SubmitError::Refused(e) => Err(compat_error(e)),
    }
}

/// Node id → `_meta.title` (what ComfyUI names a node by in messages).
fn node_titles(workflow: &Json_) -> Map<String, Json_> {
    let Some(nodes) = workflow.as_object() else { return Map::new() };
    nodes.iter().filter_map(|(id, n)| Some((id.clone(), n.get("_meta")?.get("title")?.as_str()?.into()))).collect()
}

/// `missing_node_type`: a node without a class, or with a class no plugin provides.
fn unknown_node(issue: &Issue, titles: &Map<String, Json_>) -> Response {
    let id = &issue.node_id;
    let title = titles.get(id).and_then(Json_::as_str);
    let details = format!("Node ID '#{id}'");
    match (&issue.kind, &issue.class_type) {
        (IssueKind::UnknownClass, Some(class)) => {
            let shown = title.unwrap_or(class);
            rejection(
                "missing_node_type",
                format!("Node '{shown}' not found. The custom node may not be installed."),
                details,
                json!({ "node_id": id, "class_type": class, "node_title": title.unwrap_or(class) }),
                json!({}),
            )
        }
        _ => {
            let shown = title.map_or_else(|| format!("ID #{id}"), str::to_string);
            rejection(
                "missing_node_type",
                format!("Node '{shown}' has no class_type. The workflow may be corrupted or a custom node is missing."),
                details,
                json!({ "node_id": id, "class_type": null, "node_title": title }),
                json!({}),
            )
        }
    }
}

/// `node_errors`: node id → `{errors, dependent_outputs, class_type}`.
pub(super) fn node_errors(issues: &[Issue], registry: &crate::plugins::NodeRegistry) -> Json_ {
    let mut out = Map::new();
    for issue in issues {
        let entry = out.entry(issue.node_id.clone()).or_insert_with(|| json!({ "errors": [], "dependent_outputs": [], "class_type": issue.class_type }));
        if let Some(errors) = entry["errors"].as_array_mut() {
            errors.push(error_entry(issue, registry));
        }
        if let Some(deps) = entry["dependent_outputs"].as_array_mut() {
            for d in &issue.dependent_outputs {
                if !deps.iter().any(|x| x == d) {
                    deps.push(Json_::String(d.clone()));
                }
            }
        }
    }
    Json_::Object(out)
}

/// A value as Python's `str()` shows it in ComfyUI's messages.
fn shown(value: Option<&Json_>) -> String {
    match value {
        Some(Json_::String(s)) => s.clone(),
        Some(other) => other.to_string(),
        None => String::new(),
    }
}

/// A number as Python prints it (`0.0` for a whole float).
fn python_number(value: &Json_, float: bool) -> String {
    match value.as_f64() {
        Some(f) if float && f.fract() == 0.0 && f.abs() < 1e16 => format!("{f:.1}"),
        Some(f) if float => format!("{f}"),
        _ => shown(Some(value)),
    }
}

/// The validator's sentence without its `input \`x\`: ` lead, capitalized.
fn reason(issue: &Issue) -> String {
    let text = match &issue.input {
        Some(name) => issue.message.strip_prefix(&format!("input `{name}`: ") as &str).unwrap_or(&issue.message),
        None => &issue.message,
    };
    let mut chars = text.chars();
    chars.next().map(|c| c.to_uppercase().chain(chars).collect()).unwrap_or_default()
}

/// ComfyUI's per-input error object for one issue.
pub(super) fn error_entry(issue: &Issue, registry: &crate::plugins::NodeRegistry) -> Json_ {
    let name = issue.input.clone().unwrap_or_default();
    let config = issue
        .class_type
        .as_deref()
        .and_then(|c| registry.get(c))
        .and_then(|(_, def)| crate::object_info::input_config(def, &name, &NamedInputs::new()))
        .unwrap_or(Json_::Null);
    let expected = config.get(0).and_then(Json_::as_str).unwrap_or("").to_string();
    let received = issue.received.clone().unwrap_or(Json_::Null);
    let linked = issue.linked.as_ref().map_or(Json_::Null, |(id, slot)| json!([id, slot]));
    let entry = |message: String, details: String, extra: Json_| json!({ "type": issue.kind.comfy_type(), "message": message, "details": details, "extra_info": extra });
    match issue.kind {
        IssueKind::RequiredInputMissing => entry("Required input is missing".into(), name.clone(), json!({ "input_name": name })),
        IssueKind::BadLinkedInput => entry(
            "Bad linked input, must be a length-2 list of [node_id, slot_index]".into(),
            name.clone(),
            json!({ "input_name": name, "input_config": config, "received_value": received }),
        ),
        IssueKind::ReturnTypeMismatch => entry(
            "Return type mismatch between linked nodes".into(),
            format!("{name}, received_type({}) mismatch input_type({expected})", issue.received_type.as_deref().unwrap_or("")),
            json!({ "input_name": name, "input_config": config, "received_type": issue.received_type, "linked_node": linked }),
        ),
        IssueKind::InvalidInputType | IssueKind::ValueBelowMin | IssueKind::ValueAboveMax | IssueKind::ValueNotInList => {
            let (message, details, extra) = value_error(issue, &name, config, &expected, received);
            entry(message, details, extra)
        }
        IssueKind::InputFileMissing => entry(
            "Custom validation failed for node".into(),
            format!("{name} - Invalid image file: {}", shown(issue.received.as_ref())),
            json!({ "input_name": name }),
        ),
        IssueKind::DependencyCycle => {
            entry("Dependency cycle detected".into(), issue.message.clone(), json!({ "node_id": issue.node_id, "cycle_nodes": [issue.node_id] }))
        }
        IssueKind::LinkToMissingNode => json!({
            "type": "exception_during_validation",
            "message": "Exception when validating node",
            "details": format!("'{}'", issue.linked.as_ref().map_or("", |(id, _)| id.as_str())),
            "extra_info": { "exception_type": "KeyError", "traceback": [] },
        }),
        IssueKind::LinkOutputOutOfRange => entry(
            "Exception when validating inner node".into(),
            "tuple index out of range".into(),
            json!({
                "input_name": name, "input_config": config, "exception_message": "tuple index out of range",
                "exception_type": "IndexError", "traceback": [], "linked_node": linked,
            }),
        ),
        IssueKind::MissingClassType | IssueKind::UnknownClass => entry(issue.message.clone(), format!("Node ID '#{}'", issue.node_id), json!({})),
    }
}

/// A value's error (a wrong type, out of range, not among the choices):
/// ComfyUI's message, details and extra info.
fn value_error(issue: &Issue, name: &str, config: Json_, expected: &str, received: Json_) -> (String, String, Json_) {
    match issue.kind {
        IssueKind::InvalidInputType => {
            // Python's words for the failed conversion, where it has them.
            let why = match (expected, &received) {
                ("INT", Json_::String(v)) => format!("invalid literal for int() with base 10: '{v}'"),
                ("FLOAT", Json_::String(v)) => format!("could not convert string to float: '{v}'"),
                _ => reason(issue),
            };
            (
                format!("Failed to convert an input value to a {expected} value"),
                format!("{name}, {}, {why}", shown(issue.received.as_ref())),
                json!({ "input_name": name, "input_config": config, "received_value": received, "exception_message": why }),
            )
        }
        IssueKind::ValueBelowMin | IssueKind::ValueAboveMax => {
            let float = expected == "FLOAT";
            let (bound, word) = if issue.kind == IssueKind::ValueBelowMin { ("min", "smaller") } else { ("max", "bigger") };
            let message = match config.get(1).and_then(|o| o.get(bound)) {
                Some(limit) => format!("Value {} {word} than {bound} of {}", python_number(&received, float), python_number(limit, float)),
                None => reason(issue),
            };
            (message, name.to_string(), json!({ "input_name": name, "input_config": config, "received_value": received }))
        }
        _ => {
            let choices: Vec<String> =
                config.get(0).and_then(Json_::as_array).map(|c| c.iter().map(|v| format!("'{}'", shown(Some(v)))).collect()).unwrap_or_default();
            let (list, config) =
                if choices.len() > 20 { (format!("(list of length {})", choices.len()), Json_::Null) } else { (format!("[{}]", choices.join(", ")), config) };
            (
                "Value not in list".into(),
                format!("{name}: '{}' not in {list}", shown(issue.received.as_ref())),
                json!({ "input_name": name, "input_config": config, "received_value": received }),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::canonical_uuid;

    #[test]
    fn prompt_ids_must_be_canonical() {
        assert!(canonical_uuid("6e554df5-c221-43c1-8653-4471afe7e4ae"));
        assert!(!canonical_uuid("6E554DF5-C221-43C1-8653-4471AFE7E4AE"));
        assert!(!canonical_uuid("6e554df5c22143c186534471afe7e4ae"));
        assert!(!canonical_uuid("nope"));
    }
}
