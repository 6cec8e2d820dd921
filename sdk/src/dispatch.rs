//! Routing the component's exports to the plugin's node functions.

use crate::bindings::exports::kiln::plugin::node as wit;
use crate::def::NodeDef;
use crate::io::{Inputs, Outputs, Result};

/// One node class: its name, its definition and its function.
///
/// Declare each as a `const` and list them in [`export_plugin!`](crate::export_plugin).
#[derive(Clone, Copy)]
pub struct NodeClass {
    /// The class name workflows use in `class_type`.
    pub class_type: &'static str,
    /// Builds the definition (called when the host loads the plugin).
    pub define: fn() -> NodeDef,
    /// Runs the node.
    pub run: fn(&mut Inputs) -> Result<Outputs>,
}

#[doc(hidden)]
pub fn definitions(nodes: &[NodeClass]) -> Vec<wit::NodeDef> {
    nodes
        .iter()
        .map(|n| {
            let mut def = (n.define)().def;
            def.class_type = n.class_type.to_string();
            def
        })
        .collect()
}

#[doc(hidden)]
pub fn describe(nodes: &[NodeClass]) -> Vec<crate::bindings::exports::kiln::plugin::node_meta::ClassMeta> {
    nodes
        .iter()
        .map(|n| {
            let mut meta = (n.define)().meta;
            meta.class_type = n.class_type.to_string();
            meta
        })
        .filter(|m| m.api_node || !m.dynamic_combos.is_empty())
        .collect()
}

#[doc(hidden)]
pub fn execute(nodes: &[NodeClass], class_type: &str, inputs: Vec<wit::Input>) -> std::result::Result<Vec<wit::Value>, wit::NodeError> {
    let node = nodes
        .iter()
        .find(|n| n.class_type == class_type)
        .ok_or_else(|| wit::NodeError::InvalidInput(format!("this plugin has no node class `{class_type}`")))?;
    let mut inputs = Inputs { values: inputs.into_iter().map(|i| (i.name, Some(i.value))).collect() };
    let outputs = (node.run)(&mut inputs)?;
    outputs.into_iter().map(|o| o.into_wit().map_err(Into::into)).collect()
}
