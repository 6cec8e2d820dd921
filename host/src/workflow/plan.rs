//! A validated workflow, reduced to what will run.

use crate::plugins::node::HiddenInput;
use crate::value::Value;

/// Where a planned node's input comes from.
#[derive(Debug, Clone)]
pub enum PlannedInput {
    /// Output `output` of node `node`.
    Link { node: String, output: u32 },
    /// A constant, already converted to the input's type.
    Const(Value),
    /// A value the host fills in.
    Hidden(HiddenInput),
}

/// A node that will run.
#[derive(Debug, Clone)]
pub struct PlannedNode {
    pub id: String,
    pub class_type: String,
    pub inputs: Vec<(String, PlannedInput)>,
}

/// The nodes to run in dependency order, and the output nodes they serve.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Ancestors of `outputs` (and the outputs), each after its inputs.
    pub nodes: Vec<PlannedNode>,
    /// Output node ids that validated.
    pub outputs: Vec<String>,
}

impl Plan {
    /// The planned node `id`.
    pub fn node(&self, id: &str) -> Option<&PlannedNode> {
        self.nodes.iter().find(|n| n.id == id)
    }
}
