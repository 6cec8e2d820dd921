//! ComfyUI's rules for what reaches an input: which link types connect
//! ([`types_match`]) and how a constant becomes the input's type
//! ([`convert`], as Python's `int()`, `float()`, `str()`, `bool()` would).

use std::collections::HashSet;

use serde_json::Value as Json;

use super::validate::IssueKind;
use crate::plugins::node::InputKind;
use crate::value::Value;

/// The link type an input accepts.
pub(super) fn input_type(kind: &InputKind) -> String {
    match kind {
        InputKind::Int(_) => "INT".into(),
        InputKind::Float(_) => "FLOAT".into(),
        InputKind::String(_) => "STRING".into(),
        InputKind::Boolean(_) => "BOOLEAN".into(),
        InputKind::Combo(_) => "COMBO".into(),
        InputKind::Link(t) => t.clone(),
    }
}

/// An input's type as issues name it.
pub(super) fn kind_label(kind: &InputKind) -> String {
    input_type(kind)
}

/// ComfyUI's link type rule: equal, either side `*`, or comma-separated
/// unions that intersect.
pub(super) fn types_match(received: &str, expected: &str) -> bool {
    if received == expected || received == "*" || expected == "*" {
        return true;
    }
    let r: HashSet<&str> = received.split(',').map(str::trim).collect();
    expected.split(',').map(str::trim).any(|t| r.contains(t))
}

/// Converts a constant to the input's type the way ComfyUI does (Python's
/// `int()`, `float()`, `str()`, `bool()`).
pub(super) fn convert(kind: &InputKind, json: &Json) -> Result<Value, IssueKind> {
    match kind {
        InputKind::Int(_) => match json {
            Json::Number(n) => n
                .as_i64()
                .or_else(|| n.as_f64().filter(|f| f.is_finite() && f.abs() < 9.2e18).map(|f| f.trunc() as i64))
                .map(Value::Int)
                .ok_or(IssueKind::InvalidInputType),
            Json::Bool(b) => Ok(Value::Int(*b as i64)),
            Json::String(s) => s.trim().parse::<i64>().map(Value::Int).map_err(|_| IssueKind::InvalidInputType),
            _ => Err(IssueKind::InvalidInputType),
        },
        InputKind::Float(_) => match json {
            Json::Number(n) => n.as_f64().map(Value::Float).ok_or(IssueKind::InvalidInputType),
            Json::Bool(b) => Ok(Value::Float(*b as i64 as f64)),
            Json::String(s) => s.trim().parse::<f64>().ok().filter(|f| f.is_finite()).map(Value::Float).ok_or(IssueKind::InvalidInputType),
            _ => Err(IssueKind::InvalidInputType),
        },
        InputKind::String(_) | InputKind::Combo(_) => match json {
            Json::String(s) => Ok(Value::String(s.clone())),
            Json::Number(n) => Ok(Value::String(n.to_string())),
            Json::Bool(b) => Ok(Value::String(if *b { "True" } else { "False" }.into())),
            _ => Err(IssueKind::InvalidInputType),
        },
        InputKind::Boolean(_) => match json {
            Json::Bool(b) => Ok(Value::Bool(*b)),
            Json::Number(n) => Ok(Value::Bool(n.as_f64().is_some_and(|f| f != 0.0))),
            Json::String(s) => Ok(Value::Bool(!s.is_empty())),
            Json::Null => Ok(Value::Bool(false)),
            _ => Err(IssueKind::InvalidInputType),
        },
        // A constant where a link is required.
        InputKind::Link(_) => Err(IssueKind::BadLinkedInput),
    }
}
