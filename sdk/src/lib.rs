//! # kiln-sdk: node plugins for kiln
//!
//! A kiln plugin is a WebAssembly component (target `wasm32-wasip2`) that
//! provides one or more node classes. This crate hides the component
//! bindings: a node is a Rust function marked [`#[node]`](node). Its
//! parameters are the node's inputs, its return type its outputs:
//!
//! ```text
//! use kiln_sdk::prelude::*;
//!
//! #[node(class = "MyPosterize", category = "image/filters")]
//! pub fn posterize(mut image: Image, #[input(default = 4, min = 2, max = 256)] levels: i64) -> Image {
//!     let steps = (levels - 1) as f32;
//!     image.data.iter_mut().for_each(|v| *v = (v.clamp(0.0, 1.0) * steps).round() / steps);
//!     image
//! }
//!
//! kiln_sdk::export_plugin!(POSTERIZE);
//! ```
//!
//! `#[node]` leaves the function as it is (call it in unit tests with plain
//! values) and adds the constant `POSTERIZE` (the function's name in upper
//! case), a [`NodeClass`] holding the generated definition and dispatch.
//!
//! - **Inputs.** The parameter's type picks the socket or widget (see
//!   [`typed`]): `i64`, `usize`, `f64`, `bool`, `String`/`&str` widgets;
//!   [`Image`]/[`Mask`] (copied into the plugin) and
//!   [`ImageHandle`]/[`MaskHandle`] (left on the host) links; `Option<T>`
//!   for an optional input; `&T` borrows. `#[input(..)]` sets a widget's
//!   `default`, `min`, `max`, `step`, `round`, `display`, `tooltip`,
//!   `multiline`/`single_line`, `control_after_generate`; `choices = LIST`
//!   makes a `String` a combo and `image_upload` a combo of the uploaded
//!   images; `name = ".."` names an input that is not a Rust identifier.
//!   `#[hidden]` on a `String` or `Option<String>` named `prompt`,
//!   `extra_pnginfo` or `unique_id` asks the host for that value.
//! - **Outputs.** One type, or a tuple for several, optionally in a
//!   `Result` (its error becomes the node's [`Error`]). Each output is named
//!   after its type unless `outputs = ["width", "height"]` names them.
//! - **The node.** `#[node(..)]` takes `category` (required), `class`
//!   (default: the function's name in UpperCamelCase), `display_name`,
//!   `description`, `search_aliases = [..]`, the flags `output_node`,
//!   `deprecated`, `experimental`, `api_node`, and
//!   `dynamic_combo(INPUT, OPTIONS)`.
//!
//! Mistakes are compile errors: an input is a variable, so a misspelled one
//! is unknown; an option that does not fit its input's type, a default of
//! the wrong type, a type that is no input or output, or an `outputs` list
//! whose length differs from the function's outputs is refused with a
//! message naming it. [`NodeDef`] and [`Inputs`] remain for nodes written
//! by hand as [`NodeClass`] values.
//!
//! Build with `cargo build --release --target wasm32-wasip2` and put the
//! `.wasm` with a `kiln-plugin.toml` manifest into a plugin directory.
//!
//! What a node can reach is only what the host imports provide: host-owned
//! tensors ([`Tensor`]), progress and previews, uploaded input files and saved
//! output files ([`host`]), native pixel kernels over tensors ([`kernels`]),
//! and WGSL kernels on the host's GPU with a CPU fallback ([`gpu`]).
//! No filesystem; HTTP (`wasi:http`, e.g. through the `wasip2` crate) and an
//! environment only as the operator grants them to the plugin (its
//! manifest's `outbound_hosts` and `routes`, see the README). A plugin that calls a partner
//! service can read the job's partner key with [`host::secret`], once its
//! manifest asks for it (`[capabilities] secrets = ["api_key_svc_org"]`)
//! and the operator lists the plugin (its directory or component hash) in
//! `secret_plugins`.
//!
//! A node sees a virtual clock and randomness seeded from its inputs, so its
//! result can be cached; list classes that need the real time or fresh
//! randomness in the manifest's `nondeterministic = ["Class"]`.
//!
//! Link with a few MiB of initial memory (`-C link-arg=--initial-memory=4194304`,
//! see `examples/custom-node/.cargo/config.toml`): the linker's default leaves
//! the allocator no heap, so every call grows its memory, and the host must
//! then reset the slot's memory protection before the next call.

#![warn(missing_docs)]

mod def;
mod dispatch;
pub mod gpu;
pub mod host;
mod image;
mod io;
pub mod kernels;
pub mod typed;

#[doc(hidden)]
pub mod bindings {
    //! Generated component bindings; use the SDK types instead.
    #![allow(missing_docs)]
    wit_bindgen::generate!({
        path: "../wit",
        world: "kiln:plugin/plugin-with-meta",
        pub_export_macro: true,
        export_macro_name: "__export_kiln_plugin",
        default_bindings_module: "kiln_sdk::bindings",
    });
}

pub use def::{Hidden, Kind, NodeDef};
pub use dispatch::NodeClass;
#[doc(hidden)]
pub use dispatch::{definitions, describe, execute};
pub use image::{Image, Mask};
pub use io::{Error, Inputs, Output, Outputs, Result, Tensor};
pub use kiln_sdk_macros::node;
pub use typed::{ImageHandle, MaskHandle};

/// Everything a node plugin usually needs.
pub mod prelude {
    pub use crate::gpu;
    pub use crate::host;
    pub use crate::kernels;
    pub use crate::{Error, Hidden, Image, ImageHandle, Inputs, Kind, Mask, MaskHandle, NodeClass, NodeDef, Output, Outputs, Result, node};
}

/// Exports the listed [`NodeClass`] constants as this component's nodes.
///
/// Call it once, at the crate root of a `cdylib` plugin crate.
#[macro_export]
macro_rules! export_plugin {
    ($($node:expr),+ $(,)?) => {
        struct __KilnPlugin;
        const __KILN_NODES: &[$crate::NodeClass] = &[$($node),+];
        impl $crate::bindings::exports::kiln::plugin::node::Guest for __KilnPlugin {
            fn definitions() -> ::std::vec::Vec<$crate::bindings::exports::kiln::plugin::node::NodeDef> {
                $crate::definitions(__KILN_NODES)
            }
            fn execute(
                class_type: ::std::string::String,
                inputs: ::std::vec::Vec<$crate::bindings::exports::kiln::plugin::node::Input>,
            ) -> ::std::result::Result<
                ::std::vec::Vec<$crate::bindings::exports::kiln::plugin::node::Value>,
                $crate::bindings::exports::kiln::plugin::node::NodeError,
            > {
                $crate::execute(__KILN_NODES, &class_type, inputs)
            }
        }
        impl $crate::bindings::exports::kiln::plugin::node_meta::Guest for __KilnPlugin {
            fn describe() -> ::std::vec::Vec<$crate::bindings::exports::kiln::plugin::node_meta::ClassMeta> {
                $crate::describe(__KILN_NODES)
            }
        }
        // Component exports exist only in the WebAssembly build; natively the
        // crate still compiles (and its node functions can be unit-tested).
        #[cfg(target_arch = "wasm32")]
        $crate::bindings::__export_kiln_plugin!(__KilnPlugin);
    };
}
