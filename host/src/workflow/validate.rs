//! Synchronous, complete validation of a workflow against node definitions.
//!
//! Follows ComfyUI's rules: every class must exist; output nodes and their
//! ancestors are checked along links (depth first, cycles detected on the
//! current path); an output whose ancestry has an error is dropped. Each
//! [`Issue`] names the node, its class and the input, with the data both
//! wire formats need (the Jobs API's `invalid_workflow` details and
//! ComfyUI's `node_errors`).

use std::collections::{HashMap, HashSet};

use serde::Serialize;
use serde_json::Value as Json;

use super::coerce::{convert, input_type, kind_label, types_match};
use super::parse::{InputValue, Workflow, WorkflowNode};
use super::plan::{Plan, PlannedInput, PlannedNode};
use crate::files::InputFiles;
use crate::plugins::NodeRegistry;
use crate::plugins::node::{ComboSource, InputKind, InputSpec, NodeDef};
use crate::value::Value;

/// What is wrong with one node input (or node).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum IssueKind {
    MissingClassType,
    UnknownClass,
    RequiredInputMissing,
    BadLinkedInput,
    LinkToMissingNode,
    LinkOutputOutOfRange,
    ReturnTypeMismatch,
    InvalidInputType,
    ValueBelowMin,
    ValueAboveMax,
    ValueNotInList,
    InputFileMissing,
    DependencyCycle,
}

impl IssueKind {
    /// ComfyUI's error `type` for this kind.
    pub fn comfy_type(self) -> &'static str {
        match self {
            IssueKind::MissingClassType | IssueKind::UnknownClass => "missing_node_type",
            IssueKind::RequiredInputMissing => "required_input_missing",
            IssueKind::BadLinkedInput => "bad_linked_input",
            IssueKind::LinkToMissingNode | IssueKind::LinkOutputOutOfRange => "exception_during_inner_validation",
            IssueKind::ReturnTypeMismatch => "return_type_mismatch",
            IssueKind::InvalidInputType => "invalid_input_type",
            IssueKind::ValueBelowMin => "value_smaller_than_min",
            IssueKind::ValueAboveMax => "value_bigger_than_max",
            IssueKind::ValueNotInList => "value_not_in_list",
            IssueKind::InputFileMissing => "custom_validation_failed",
            IssueKind::DependencyCycle => "dependency_cycle",
        }
    }
}

/// One validation error.
#[derive(Debug, Clone, Serialize)]
pub struct Issue {
    pub node_id: String,
    pub class_type: Option<String>,
    pub kind: IssueKind,
    /// The input the error is about, if any.
    pub input: Option<String>,
    /// A sentence for people.
    pub message: String,
    /// The offending constant, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub received: Option<Json>,
    /// For link errors: the link as written.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub linked: Option<(String, u32)>,
    /// For type mismatches: the type the link carries.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub received_type: Option<String>,
    /// Output nodes this error made unusable.
    pub dependent_outputs: Vec<String>,
}

/// Why a workflow cannot run at all.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ValidationError {
    /// A node has no class or an unknown class (the whole workflow is refused).
    #[error("{}", .0.message)]
    Node(Box<Issue>),
    /// No node is an output node.
    #[error("the workflow has no output node")]
    NoOutputs,
    /// Every output node failed validation.
    #[error("{} validation error(s); no output node can run", .0.len())]
    OutputsFailed(Vec<Issue>),
}

/// Validates `workflow`. On success the plan holds every output that
/// validated, and `issues` lists the errors of the outputs that were dropped
/// (callers that need all-or-nothing treat a non-empty list as failure).
pub fn validate(workflow: &Workflow, registry: &NodeRegistry, files: &dyn InputFiles) -> Result<(Plan, Vec<Issue>), ValidationError> {
    let mut defs: HashMap<&str, &NodeDef> = HashMap::new();
    for node in &workflow.nodes {
        let Some(class) = &node.class_type else {
            return Err(ValidationError::Node(Box::new(issue(node, IssueKind::MissingClassType, None, format!("node {} has no class_type", node.id)))));
        };
        let Some((_, def)) = registry.get(class) else {
            return Err(ValidationError::Node(Box::new(issue(
                node,
                IssueKind::UnknownClass,
                None,
                format!("node {} uses unknown node class `{class}`", node.id),
            ))));
        };
        defs.insert(node.id.as_str(), def);
    }
    let outputs: Vec<&WorkflowNode> = workflow.nodes.iter().filter(|n| defs[n.id.as_str()].output_node).collect();
    if outputs.is_empty() {
        return Err(ValidationError::NoOutputs);
    }
    let mut v = Validator { workflow, defs, files, state: HashMap::new(), planned: HashMap::new(), order: Vec::new(), issues: Vec::new() };
    let mut good = Vec::new();
    let mut attribution_budget = ATTRIBUTION_BUDGET;
    for out in &outputs {
        let before = v.issues.len();
        if v.visit(&out.id) {
            good.push(out.id.clone());
        } else {
            for issue in &mut v.issues[before..] {
                issue.dependent_outputs.push(out.id.clone());
            }
            // Errors found while validating an earlier output also block this one.
            if before > 0 {
                v.attribute_earlier(&out.id, before, &mut attribution_budget);
            }
        }
    }
    if good.is_empty() {
        return Err(ValidationError::OutputsFailed(v.issues));
    }
    let keep = v.planned_ancestors(&good);
    let nodes = v.order.iter().filter(|id| keep.contains(id.as_str())).filter_map(|id| v.planned.remove(id)).collect();
    Ok((Plan::new(nodes, good), v.issues))
}

/// Steps of dependent-output attribution over one validation (see
/// [`Validator::attribute_earlier`]).
const ATTRIBUTION_BUDGET: usize = 1 << 20;

#[derive(Clone, Copy, PartialEq)]
enum State {
    Visiting,
    Valid,
    Invalid,
}

struct Validator<'a> {
    workflow: &'a Workflow,
    defs: HashMap<&'a str, &'a NodeDef>,
    files: &'a dyn InputFiles,
    state: HashMap<String, State>,
    planned: HashMap<String, PlannedNode>,
    order: Vec<String>,
    issues: Vec<Issue>,
}

fn issue(node: &WorkflowNode, kind: IssueKind, input: Option<&str>, message: String) -> Issue {
    Issue {
        node_id: node.id.clone(),
        class_type: node.class_type.clone(),
        kind,
        input: input.map(str::to_string),
        message,
        received: None,
        linked: None,
        received_type: None,
        dependent_outputs: Vec::new(),
    }
}

/// What linking to a node found without descending into it.
enum LinkCheck {
    /// The link itself is wrong (an issue was recorded).
    Bad,
    /// The source was already validated: valid or not.
    Known(bool),
    /// The source has not been visited yet.
    Visit,
}

/// A node being validated: the input it is at, and what it has so far.
struct Frame<'a> {
    node: &'a WorkflowNode,
    def: &'a NodeDef,
    given: HashMap<&'a str, &'a InputValue>,
    /// Index into the node's inputs, required then optional.
    next: usize,
    valid: bool,
    inputs: Vec<(String, PlannedInput)>,
    /// The link input waiting for its source's verdict: (input, source, output).
    awaiting: Option<(String, String, u32)>,
}

impl<'a> Validator<'a> {
    fn frame(&mut self, id: &str) -> Option<Frame<'a>> {
        let node = self.workflow.node(id)?;
        let def = *self.defs.get(id)?;
        self.state.insert(id.to_string(), State::Visiting);
        let given = node.inputs.iter().map(|(k, v)| (k.as_str(), v)).collect();
        Some(Frame { node, def, given, next: 0, valid: true, inputs: Vec::new(), awaiting: None })
    }

    /// Validates node `id` and its ancestors; true if all are valid.
    ///
    /// Depth first with an explicit stack (a graph is client input: its
    /// depth must not become the host's stack depth); a node on the current
    /// path is `Visiting`, so a cycle is found in O(1) per link.
    fn visit(&mut self, id: &str) -> bool {
        match self.state.get(id) {
            Some(State::Valid) => return true,
            Some(State::Invalid | State::Visiting) => return false,
            None => {}
        }
        let Some(root) = self.frame(id) else { return false };
        let mut stack = vec![root];
        let mut verdict = false;
        while let Some(frame) = stack.last_mut() {
            if let Some((name, from, output)) = frame.awaiting.take() {
                if verdict {
                    frame.inputs.push((name, PlannedInput::Link { node: from, output }));
                } else {
                    frame.valid = false;
                }
            }
            if let Some(from) = self.advance(frame) {
                match self.frame(&from) {
                    Some(child) => stack.push(child),
                    None => verdict = false,
                }
                continue;
            }
            let Some(done) = stack.pop() else { break };
            verdict = self.finish(done);
        }
        verdict
    }

    /// Checks the frame's inputs from where it stopped; returns the source
    /// node to descend into when a link leads to an unvisited node.
    fn advance(&mut self, frame: &mut Frame<'a>) -> Option<String> {
        let def: &'a NodeDef = frame.def;
        let (required, optional) = (&def.required, &def.optional);
        while frame.next < required.len() + optional.len() {
            let (spec, is_required) = match required.get(frame.next) {
                Some(spec) => (spec, true),
                None => (&optional[frame.next - required.len()], false),
            };
            frame.next += 1;
            match frame.given.get(spec.name.as_str()).copied() {
                None if is_required => {
                    self.issues.push(issue(
                        frame.node,
                        IssueKind::RequiredInputMissing,
                        Some(&spec.name),
                        format!("required input `{}` is missing", spec.name),
                    ));
                    frame.valid = false;
                }
                None => {}
                Some(InputValue::Link { node: from, output }) => match self.check_link(frame.node, spec, from, *output) {
                    LinkCheck::Bad | LinkCheck::Known(false) => frame.valid = false,
                    LinkCheck::Known(true) => frame.inputs.push((spec.name.clone(), PlannedInput::Link { node: from.clone(), output: *output })),
                    LinkCheck::Visit => {
                        frame.awaiting = Some((spec.name.clone(), from.clone(), *output));
                        return Some(from.clone());
                    }
                },
                Some(value) => match self.check_input(frame.node, spec, value) {
                    Some(planned) => frame.inputs.push((spec.name.clone(), planned)),
                    None => frame.valid = false,
                },
            }
        }
        None
    }

    /// Records a node whose inputs are all checked; returns whether it is valid.
    fn finish(&mut self, frame: Frame<'a>) -> bool {
        let Frame { node, def, valid, mut inputs, .. } = frame;
        for hidden in &def.hidden {
            inputs.push((crate::plugins::registry::hidden_name(*hidden).to_string(), PlannedInput::Hidden(*hidden)));
        }
        self.state.insert(node.id.clone(), if valid { State::Valid } else { State::Invalid });
        if valid {
            self.planned.insert(node.id.clone(), PlannedNode { id: node.id.clone(), class_type: def.class_type.clone(), inputs });
            self.order.push(node.id.clone());
        }
        valid
    }

    /// A constant or a malformed link (links go through [`Self::check_link`]).
    fn check_input(&mut self, node: &WorkflowNode, spec: &InputSpec, value: &InputValue) -> Option<PlannedInput> {
        let name = spec.name.as_str();
        match value {
            InputValue::BadLink(json) => {
                let mut i = issue(node, IssueKind::BadLinkedInput, Some(name), format!("input `{name}` is a list but not a link [node_id, output_index]"));
                i.received = Some(json.clone());
                self.issues.push(i);
                None
            }
            InputValue::Link { .. } => None,
            InputValue::Const(json) => match convert(&spec.kind, json) {
                Err(kind) => {
                    let expected = kind_label(&spec.kind);
                    let mut i = issue(node, kind, Some(name), format!("input `{name}`: {json} is not a valid {expected}"));
                    i.received = Some(json.clone());
                    self.issues.push(i);
                    None
                }
                Ok(v) => self.check_range(node, spec, v, json),
            },
        }
    }

    fn check_link(&mut self, node: &WorkflowNode, spec: &InputSpec, from: &str, output: u32) -> LinkCheck {
        let name = spec.name.as_str();
        let linked = Some((from.to_string(), output));
        let Some(&from_def) = self.defs.get(from) else {
            let mut i = issue(node, IssueKind::LinkToMissingNode, Some(name), format!("input `{name}` links to node {from}, which does not exist"));
            i.linked = linked;
            self.issues.push(i);
            return LinkCheck::Bad;
        };
        let Some(out) = from_def.outputs.get(output as usize) else {
            let mut i = issue(
                node,
                IssueKind::LinkOutputOutOfRange,
                Some(name),
                format!("input `{name}` links to output {output} of node {from} ({}), which has {} output(s)", from_def.class_type, from_def.outputs.len()),
            );
            i.linked = linked;
            self.issues.push(i);
            return LinkCheck::Bad;
        };
        let expected = input_type(&spec.kind);
        if !types_match(&out.type_name, &expected) {
            let mut i = issue(
                node,
                IssueKind::ReturnTypeMismatch,
                Some(name),
                format!("input `{name}` expects {expected} but node {from} output {output} is {}", out.type_name),
            );
            i.linked = linked;
            i.received_type = Some(out.type_name.clone());
            self.issues.push(i);
            return LinkCheck::Bad;
        }
        match self.state.get(from) {
            Some(State::Visiting) => {
                let mut i =
                    issue(node, IssueKind::DependencyCycle, Some(name), format!("input `{name}` links to node {from}, which depends on node {}", node.id));
                i.linked = linked;
                self.issues.push(i);
                LinkCheck::Bad
            }
            Some(State::Valid) => LinkCheck::Known(true),
            Some(State::Invalid) => LinkCheck::Known(false),
            None => LinkCheck::Visit,
        }
    }

    fn check_range(&mut self, node: &WorkflowNode, spec: &InputSpec, value: Value, json: &Json) -> Option<PlannedInput> {
        let name = spec.name.as_str();
        let fail = |kind, message: String| {
            let mut i = issue(node, kind, Some(name), message);
            i.received = Some(json.clone());
            i
        };
        let problem = match (&spec.kind, &value) {
            (InputKind::Int(s), Value::Int(v)) => match (s.min, s.max) {
                (Some(min), _) if *v < min => Some(fail(IssueKind::ValueBelowMin, format!("input `{name}`: value {v} smaller than min of {min}"))),
                (_, Some(max)) if *v > max => Some(fail(IssueKind::ValueAboveMax, format!("input `{name}`: value {v} bigger than max of {max}"))),
                _ => None,
            },
            (InputKind::Float(s), Value::Float(v)) => match (s.min, s.max) {
                (Some(min), _) if *v < min => Some(fail(IssueKind::ValueBelowMin, format!("input `{name}`: value {v} smaller than min of {min}"))),
                (_, Some(max)) if *v > max => Some(fail(IssueKind::ValueAboveMax, format!("input `{name}`: value {v} bigger than max of {max}"))),
                _ => None,
            },
            (InputKind::Combo(c), Value::String(v)) => match c.source {
                ComboSource::Fixed if !c.choices.contains(v) => {
                    Some(fail(IssueKind::ValueNotInList, format!("input `{name}`: value `{v}` not in list {:?}", c.choices)))
                }
                ComboSource::InputImages if !self.files.contains(v) => {
                    Some(fail(IssueKind::InputFileMissing, format!("input `{name}`: invalid image file: {v}")))
                }
                _ => None,
            },
            _ => None,
        };
        match problem {
            Some(i) => {
                self.issues.push(i);
                None
            }
            None => Some(PlannedInput::Const(value)),
        }
    }

    /// Adds `output` to the dependents of the issues among the first
    /// `before` that lie upstream of it. Only invalid nodes can hold an issue
    /// or lead to one (a valid node's ancestors are all valid), so the walk
    /// goes through invalid nodes alone; `budget` bounds the total work over
    /// all outputs (past it, earlier issues are not attributed further: the
    /// job is refused either way, and this list is informational).
    fn attribute_earlier(&mut self, output: &str, before: usize, budget: &mut usize) {
        let workflow: &'a Workflow = self.workflow;
        let mut seen: HashSet<&str> = HashSet::new();
        let mut stack = vec![output];
        while let Some(id) = stack.pop() {
            if *budget == 0 {
                return;
            }
            *budget -= 1;
            if self.state.get(id) != Some(&State::Invalid) || !seen.insert(id) {
                continue;
            }
            if let Some(node) = workflow.node(id) {
                stack.extend(node.inputs.iter().filter_map(|(_, v)| match v {
                    InputValue::Link { node: from, .. } => Some(from.as_str()),
                    _ => None,
                }));
            }
        }
        for issue in &mut self.issues[..before] {
            if *budget == 0 {
                return;
            }
            *budget -= 1;
            if seen.contains(issue.node_id.as_str()) && !issue.dependent_outputs.iter().any(|o| o == output) {
                issue.dependent_outputs.push(output.to_string());
            }
        }
    }

    /// The planned nodes `roots` read, directly or not (`roots` included):
    /// links under names the class has no input for are not followed.
    fn planned_ancestors(&self, roots: &[String]) -> HashSet<String> {
        let mut seen = HashSet::new();
        let mut stack: Vec<&str> = roots.iter().map(String::as_str).collect();
        while let Some(id) = stack.pop() {
            if !seen.insert(id.to_string()) {
                continue;
            }
            if let Some(node) = self.planned.get(id) {
                for (_, input) in &node.inputs {
                    if let PlannedInput::Link { node: from, .. } = input {
                        stack.push(from);
                    }
                }
            }
        }
        seen
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_types_follow_comfy_rules() {
        assert!(types_match("IMAGE", "IMAGE"));
        assert!(types_match("*", "MASK"));
        assert!(types_match("IMAGE,MASK", "MASK"));
        assert!(!types_match("IMAGE", "INT"));
    }

    #[test]
    fn a_link_under_a_name_the_class_lacks_plans_nothing() {
        // "2" is valid and was validated for output "3" (which fails: no
        // filename_prefix); the good output "4" links to it only under a
        // name SaveImage has no input for, so "2" must not run.
        let workflow = Workflow::from_json(
            &serde_json::json!({
                "1": { "class_type": "EmptyImage", "inputs": { "width": 8, "height": 8, "batch_size": 1, "color": 0 } },
                "2": { "class_type": "ImageInvert", "inputs": { "image": ["1", 0] } },
                "3": { "class_type": "SaveImage", "inputs": { "images": ["2", 0] } },
                "4": { "class_type": "SaveImage", "inputs": { "images": ["1", 0], "filename_prefix": "x", "not_an_input": ["2", 0] } },
            }),
            &crate::workflow::WorkflowLimits::default(),
        )
        .unwrap();
        let (plan, issues) = validate(&workflow, crate::test_support::registry(), &crate::files::NamedInputs::new()).unwrap();
        assert_eq!(plan.outputs, ["4"]);
        assert_eq!(plan.nodes.iter().map(|n| n.id.as_str()).collect::<Vec<_>>(), ["1", "4"]);
        assert!(matches!(issues.as_slice(), [i] if i.kind == IssueKind::RequiredInputMissing && i.node_id == "3"), "{issues:?}");
    }

    #[test]
    fn constants_convert_like_python() {
        let int =
            InputKind::Int(crate::plugins::node::IntSpec { default: None, min: None, max: None, step: None, display: None, control_after_generate: false });
        assert!(matches!(convert(&int, &serde_json::json!(3.9)), Ok(Value::Int(3))));
        assert!(matches!(convert(&int, &serde_json::json!("12")), Ok(Value::Int(12))));
        assert_eq!(convert(&int, &serde_json::json!("abc")).unwrap_err(), IssueKind::InvalidInputType);
        assert_eq!(convert(&InputKind::Link("IMAGE".into()), &serde_json::json!(1)).unwrap_err(), IssueKind::BadLinkedInput);
    }
}
