//! Host-side bindings generated from `wit/kiln-plugin.wit`.
//!
//! Imports are synchronous (they copy memory or record a fact; none waits), and
//! `trappable` so a host-side refusal can end the guest. Exports are async so a
//! running node yields to tokio at every epoch tick and can be cancelled.

wasmtime::component::bindgen!({
    path: "../wit",
    world: "kiln:plugin/plugin",
    imports: { default: trappable },
    exports: { default: async },
    with: {
        "kiln:plugin/tensors.tensor": crate::tensor::Tensor,
        "kiln:plugin/gpu.kernel": super::gpu_calls::KernelHandle,
    },
});

pub use self::kiln::plugin::host::{FileKind, SavedFile};
pub use self::kiln::plugin::tensors::TensorError as WitTensorError;
pub use exports::kiln::plugin::node;

impl node::NodeDef {
    /// Whether input `name` names an input file (an image combo: the value
    /// is a file the node reads with `read-input`).
    pub fn reads_input_file(&self, name: &str) -> bool {
        self.required
            .iter()
            .chain(&self.optional)
            .any(|i| i.name == name && matches!(&i.kind, node::InputKind::Combo(c) if c.source == node::ComboSource::InputImages))
    }
}
