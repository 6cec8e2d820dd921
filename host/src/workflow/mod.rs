//! ComfyUI API-format workflows: parsing ([`parse`]) and validation against
//! node definitions ([`validate`]), producing a [`Plan`] the executor runs.

mod coerce;
pub mod cost;
pub mod parse;
pub mod plan;
#[cfg(test)]
mod proptests;
pub mod validate;

pub use cost::JsonCost;
pub use parse::{InputValue, ParseError, Workflow, WorkflowLimits, WorkflowNode, is_ui_format};
pub use plan::{Plan, PlannedInput, PlannedNode};
pub use validate::{Issue, IssueKind, ValidationError, validate};
