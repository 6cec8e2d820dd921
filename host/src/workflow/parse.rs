//! Parsing the API format: `{node_id: {"class_type": ..., "inputs": {...}}}`,
//! where an input is a constant or a link `[node_id, output_index]`.

use serde_json::{Map, Value as Json};

/// A parsed workflow, nodes in document order.
#[derive(Debug, Clone)]
pub struct Workflow {
    pub nodes: Vec<WorkflowNode>,
    index: std::collections::HashMap<String, usize>,
}

/// One node of a workflow.
#[derive(Debug, Clone)]
pub struct WorkflowNode {
    pub id: String,
    /// `None` when the node has no `class_type`.
    pub class_type: Option<String>,
    /// Inputs in document order.
    pub inputs: Vec<(String, InputValue)>,
}

/// An input as written in the workflow.
#[derive(Debug, Clone, PartialEq)]
pub enum InputValue {
    /// `[node_id, output_index]`.
    Link { node: String, output: u32 },
    /// A list that is not a well-formed link.
    BadLink(Json),
    /// A constant (with `{"__value__": x}` unwrapped).
    Const(Json),
}

/// Bounds on a workflow, checked while it is read: a workflow is client
/// input, and everything later (validation, planning, execution, the
/// records) costs at least linear work and memory in its size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkflowLimits {
    /// Most nodes one workflow may have (config `max_workflow_nodes`).
    pub max_nodes: usize,
    /// Most bytes of workflow JSON (config `max_workflow_kb`).
    pub max_bytes: usize,
    /// Most JSON values in a submission (config `max_workflow_values`).
    pub max_values: usize,
}

impl Default for WorkflowLimits {
    fn default() -> WorkflowLimits {
        WorkflowLimits { max_nodes: 5_000, max_bytes: 8 << 20, max_values: 1 << 18 }
    }
}

impl WorkflowLimits {
    /// The limits `config` sets (`max_workflow_nodes`, `max_workflow_kb`,
    /// `max_workflow_values`), each at least a small floor.
    pub fn from_config(config: &crate::config::Config) -> WorkflowLimits {
        WorkflowLimits {
            max_nodes: config.max_workflow_nodes.max(1),
            max_bytes: config.max_workflow_kb.saturating_mul(1024).max(1024),
            max_values: config.max_workflow_values.max(16),
        }
    }

    /// Refuses a document of `len` bytes over the size limit.
    pub fn check_size(&self, len: usize) -> Result<(), ParseError> {
        if len > self.max_bytes {
            return Err(ParseError::TooLarge { limit: self.max_bytes });
        }
        Ok(())
    }

    /// Checks a submission's text before it is parsed: its size, then its
    /// value count; returns what its parsed tree may cost.
    pub fn check_text(&self, text: &[u8]) -> Result<super::JsonCost, ParseError> {
        self.check_size(text.len())?;
        super::cost::count_values(text, self.max_values as u64).map_err(|_| ParseError::TooManyValues { limit: self.max_values })
    }
}

/// Why a document is not an API-format workflow at all.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ParseError {
    #[error("the workflow is not valid JSON: {0}")]
    Json(String),
    #[error("this is a UI-format workflow (with `nodes` and `links`); export it in API format")]
    UiFormat,
    #[error("a workflow must be a JSON object of node id to node")]
    NotAnObject,
    #[error("node `{0}` must be an object with `class_type` and `inputs`")]
    BadNode(String),
    #[error("the workflow has no nodes")]
    Empty,
    #[error("the workflow has {count} nodes, over the limit of {limit} (max_workflow_nodes)")]
    TooManyNodes { count: usize, limit: usize },
    #[error("the workflow is larger than the limit of {} KiB (max_workflow_kb)", .limit >> 10)]
    TooLarge { limit: usize },
    #[error("the submission holds more than {limit} JSON values (max_workflow_values)")]
    TooManyValues { limit: usize },
}

impl Workflow {
    /// Parses workflow JSON text under `limits`.
    pub fn from_json_str(text: &str, limits: &WorkflowLimits) -> Result<Workflow, ParseError> {
        limits.check_text(text.as_bytes())?;
        let json: Json = serde_json::from_str(text).map_err(|e| ParseError::Json(e.to_string()))?;
        Workflow::from_json(&json, limits)
    }

    /// Parses an already-decoded workflow under `limits` (its size in bytes
    /// is the caller's to check, where the bytes are).
    pub fn from_json(json: &Json, limits: &WorkflowLimits) -> Result<Workflow, ParseError> {
        let map = json.as_object().ok_or(ParseError::NotAnObject)?;
        if is_ui_format(map) {
            return Err(ParseError::UiFormat);
        }
        if map.is_empty() {
            return Err(ParseError::Empty);
        }
        if map.len() > limits.max_nodes {
            return Err(ParseError::TooManyNodes { count: map.len(), limit: limits.max_nodes });
        }
        let nodes: Vec<WorkflowNode> = map.iter().map(|(id, node)| parse_node(id, node)).collect::<Result<_, _>>()?;
        let index = nodes.iter().enumerate().map(|(i, n)| (n.id.clone(), i)).collect();
        Ok(Workflow { nodes, index })
    }

    /// The node with id `id`.
    pub fn node(&self, id: &str) -> Option<&WorkflowNode> {
        self.index.get(id).map(|&i| &self.nodes[i])
    }
}

/// Whether a JSON object is a UI-format (graph editor) workflow.
pub fn is_ui_format(map: &Map<String, Json>) -> bool {
    map.get("nodes").is_some_and(Json::is_array) && map.contains_key("links")
}

fn parse_node(id: &str, node: &Json) -> Result<WorkflowNode, ParseError> {
    let obj = node.as_object().ok_or_else(|| ParseError::BadNode(id.to_string()))?;
    let class_type = match obj.get("class_type") {
        None | Some(Json::Null) => None,
        Some(Json::String(s)) => Some(s.clone()),
        Some(_) => return Err(ParseError::BadNode(id.to_string())),
    };
    let inputs = match obj.get("inputs") {
        None | Some(Json::Null) => Vec::new(),
        Some(Json::Object(inputs)) => inputs.iter().map(|(k, v)| (k.clone(), parse_input(v))).collect(),
        Some(_) => return Err(ParseError::BadNode(id.to_string())),
    };
    Ok(WorkflowNode { id: id.to_string(), class_type, inputs })
}

fn parse_input(value: &Json) -> InputValue {
    match value {
        Json::Array(items) => {
            let node = match items.first() {
                Some(Json::String(s)) => Some(s.clone()),
                Some(Json::Number(n)) if n.is_u64() => Some(n.to_string()),
                _ => None,
            };
            let output = items.get(1).and_then(Json::as_u64).and_then(|o| u32::try_from(o).ok());
            match (items.len(), node, output) {
                (2, Some(node), Some(output)) => InputValue::Link { node, output },
                _ => InputValue::BadLink(value.clone()),
            }
        }
        Json::Object(o) if o.len() == 1 && o.contains_key("__value__") => InputValue::Const(o["__value__"].clone()),
        other => InputValue::Const(other.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parses_links_constants_and_wrapped_values() {
        let wf = Workflow::from_json(
            &json!({
                "1": {"class_type": "A", "inputs": {"x": 3, "img": ["2", 0], "n": [5, 1], "v": {"__value__": [1, 2]}, "bad": ["2"]}},
                "2": {"class_type": "B"}
            }),
            &WorkflowLimits::default(),
        )
        .unwrap();
        let n1 = wf.node("1").unwrap();
        assert_eq!(n1.inputs[0].1, InputValue::Const(json!(3)));
        assert_eq!(n1.inputs[1].1, InputValue::Link { node: "2".into(), output: 0 });
        assert_eq!(n1.inputs[2].1, InputValue::Link { node: "5".into(), output: 1 });
        assert_eq!(n1.inputs[3].1, InputValue::Const(json!([1, 2])));
        assert!(matches!(n1.inputs[4].1, InputValue::BadLink(_)));
        assert!(wf.node("2").unwrap().inputs.is_empty());
    }

    #[test]
    fn rejects_ui_format_and_non_objects() {
        let l = WorkflowLimits::default();
        assert_eq!(Workflow::from_json(&json!({"nodes": [], "links": []}), &l).unwrap_err(), ParseError::UiFormat);
        assert_eq!(Workflow::from_json(&json!([1]), &l).unwrap_err(), ParseError::NotAnObject);
        assert_eq!(Workflow::from_json(&json!({}), &l).unwrap_err(), ParseError::Empty);
        assert_eq!(Workflow::from_json(&json!({"1": 5}), &l).unwrap_err(), ParseError::BadNode("1".into()));
        assert!(matches!(Workflow::from_json_str("{", &l), Err(ParseError::Json(_))));
    }

    #[test]
    fn node_count_and_size_limits_name_their_setting() {
        let limits = WorkflowLimits { max_nodes: 2, max_bytes: 64, max_values: 100 };
        let three = json!({"1": {"class_type": "A"}, "2": {"class_type": "A"}, "3": {"class_type": "A"}});
        let err = Workflow::from_json(&three, &limits).unwrap_err();
        assert_eq!(err, ParseError::TooManyNodes { count: 3, limit: 2 });
        assert!(err.to_string().contains("max_workflow_nodes"), "{err}");
        assert!(Workflow::from_json(&json!({"1": {"class_type": "A"}, "2": {"class_type": "A"}}), &limits).is_ok());
        let err = Workflow::from_json_str(&" ".repeat(65), &limits).unwrap_err();
        assert!(matches!(err, ParseError::TooLarge { limit: 64 }) && err.to_string().contains("max_workflow_kb"), "{err}");
    }
}
