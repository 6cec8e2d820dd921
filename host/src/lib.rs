//! # kiln
//!
//! kiln executes ComfyUI API-format workflows whose node classes are sandboxed
//! WebAssembly components.
//!
//! ## Embedding kiln
//!
//! Two entry points are meant for other programs:
//! - [`Engine`] (module [`embed`]) runs workflows in-process: build it from a
//!   [`Config`], then [`Engine::run`] a workflow with named input files, an
//!   event callback and a cancellation token (`examples/run_workflow.rs`).
//! - [`Mounted`] starts the job service and hands its HTTP surfaces (Jobs
//!   API, ComfyUI API and `/ws`, admin API) to the application as an axum
//!   `Router` to merge beside its own routes; set `mount_prefix` and links
//!   keep it (`examples/mount_router.rs`). [`Server`] is the same, serving
//!   on its own listener (`kiln serve`).
//!
//! [`bundle`] is the portable form of a deployment: workflows, the exact
//! plugin components they use (pinned by blake3) and default inputs in one
//! file, made by [`Engine::pack`] and run by [`Engine::run_bundle`] with the
//! same outputs on any host.
//!
//! [`config`] holds the settings both take. The other modules are the
//! host's internals, public for its binary and its test suites, hidden from
//! these docs; they change without notice. CI keeps the public surface
//! (`host/public-api.txt`, made by `.ci/public-api.py`) from changing by
//! accident.
//!
//! ## Inside
//!
//! Following one workflow through the crate:
//! 1. [`workflow`] parses the API format and validates it against the node
//!    definitions in the [`plugins::NodeRegistry`] — every error names the node,
//!    its class and the input.
//! 2. [`executor`] plans the run (only ancestors of output nodes, in
//!    dependency order), serves unchanged nodes from its result cache, and
//!    calls each remaining node through [`plugins::PluginRuntime`], publishing
//!    [`executor::Event`]s from one place.
//! 3. [`plugins`] instantiates the node's component in a fresh store with a
//!    memory ceiling and a deadline; host imports hand it [`tensor::Tensor`]s,
//!    input files and an output sink ([`files`]).
//!
//! 4. [`service`] runs jobs for the HTTP [`api`]: durable records in the
//!    [`store`], a bounded queue, workers, idempotency, assets, retention;
//!    [`server`] wires them into `kiln serve`.
//!
//! [`gpu`] owns the wgpu device: plugins' WGSL kernels and the GPU versions
//! of the host's pixel kernels run there, over tensors that stay on the device.
//!
//! [`codes`] names job failures on every surface; [`config`] is the one
//! typed configuration; [`cli`] is the `kiln` binary's front end;
//! [`object_info`] renders node definitions in ComfyUI's format.

#[doc(hidden)]
pub mod accounts;
#[doc(hidden)]
pub mod api;
#[doc(hidden)]
pub mod atomic_file;
#[doc(hidden)]
pub mod budget;
pub mod bundle;
#[doc(hidden)]
pub mod cli;
#[doc(hidden)]
pub mod codes;
pub mod config;
pub mod embed;
#[doc(hidden)]
pub mod executor;
#[doc(hidden)]
pub mod files;
#[doc(hidden)]
pub mod gpu;
#[doc(hidden)]
pub mod logging;
#[doc(hidden)]
pub mod memory;
pub mod migrate;
#[doc(hidden)]
pub mod object_info;
#[doc(hidden)]
pub mod plugins;
#[doc(hidden)]
pub mod secret_file;
#[doc(hidden)]
pub mod server;
#[doc(hidden)]
pub mod service;
#[doc(hidden)]
pub mod store;
#[doc(hidden)]
pub mod tensor;
#[cfg(test)]
mod test_support;
#[doc(hidden)]
pub mod value;
#[doc(hidden)]
pub mod workflow;

pub use config::Config;
pub use embed::Engine;
#[doc(inline)]
pub use server::{Mounted, Server};
