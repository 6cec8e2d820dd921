//! Parse and validation of a resolved graph against the node registry,
//! under a submission's output policy; also what a job that starts from its
//! stored graph (after a restart) goes through again.

use serde_json::Value as Json;

use super::{OutputPolicy, SubmitError};
use crate::plugins::NodeRegistry;
use crate::service::ServiceError;
use crate::service::job_files::JobInputs;
use crate::workflow::{Issue, Plan, ValidationError, Workflow, WorkflowLimits, validate};

/// The plan of a resolved graph, and the outputs dropped under
/// [`OutputPolicy::DropFailing`] (none under `AllOrNothing`, where any
/// failing output refuses the job).
pub fn plan(
    workflow: &Json,
    registry: &NodeRegistry,
    inputs: &JobInputs,
    limits: &WorkflowLimits,
    policy: OutputPolicy,
) -> Result<(Plan, Vec<Issue>), SubmitError> {
    let parsed = Workflow::from_json(workflow, limits).map_err(SubmitError::Unreadable)?;
    match validate(&parsed, registry, inputs) {
        Ok((plan, dropped)) if dropped.is_empty() || policy == OutputPolicy::DropFailing => Ok((plan, dropped)),
        Ok((_, failed)) => Err(SubmitError::Invalid(ValidationError::OutputsFailed(failed))),
        Err(e) => Err(SubmitError::Invalid(e)),
    }
}

/// `invalid_workflow`, with `details.node_errors` (node id →
/// `[{field, reason, message, class_type}]`) when nodes are at fault.
pub(super) fn invalid_workflow(e: ValidationError) -> ServiceError {
    match e {
        ValidationError::OutputsFailed(issues) => node_errors(&issues),
        ValidationError::Node(issue) => node_errors(std::slice::from_ref(issue.as_ref())),
        e @ ValidationError::NoOutputs => ServiceError::InvalidWorkflow { message: e.to_string(), details: None },
    }
}

fn node_errors(issues: &[Issue]) -> ServiceError {
    let mut nodes: std::collections::BTreeMap<&str, Vec<Json>> = std::collections::BTreeMap::new();
    for issue in issues {
        nodes.entry(&issue.node_id).or_default().push(serde_json::json!({
            "field": issue.input,
            "reason": issue.kind,
            "message": issue.message,
            "class_type": issue.class_type,
        }));
    }
    let message = match issues {
        [one] => one.message.clone(),
        many => format!("{} validation errors", many.len()),
    };
    ServiceError::InvalidWorkflow { message, details: Some(serde_json::json!({ "node_errors": nodes })) }
}
