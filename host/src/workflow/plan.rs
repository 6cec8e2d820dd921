//! A validated workflow, reduced to what will run.

use std::collections::HashMap;

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
    index: HashMap<String, usize>,
}

impl Plan {
    /// A plan of `nodes` (dependencies first) serving `outputs`.
    pub fn new(nodes: Vec<PlannedNode>, outputs: Vec<String>) -> Plan {
        let index = nodes.iter().enumerate().map(|(i, n)| (n.id.clone(), i)).collect();
        Plan { nodes, outputs, index }
    }

    /// The planned node `id`.
    pub fn node(&self, id: &str) -> Option<&PlannedNode> {
        self.index.get(id).map(|&i| &self.nodes[i])
    }
}
