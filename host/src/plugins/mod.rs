//! Node plugins: sandboxed WebAssembly components and everything needed to
//! load them and call their nodes safely.
//!
//! - [`manifest`]: what a plugin asks for; the capability policy.
//! - [`meta`]: the optional `node-meta` export (API nodes, dynamic combos).
//! - [`network`]: outbound HTTP policy and route prefixes (operator grants).
//! - [`routes`]: serving a plugin's routes through its `wasi:http/incoming-handler`.
//! - [`identity`]: who a plugin is (its directory, its component hash,
//!   `bundled:<name>`) and the operator's grants that name it.
//! - [`engine`]: the one wasmtime engine, its allocator and epoch ticker.
//! - [`compile`]: compiling components in a child process under limits.
//! - [`artifacts`]: the on-disk cache of compiled components.
//! - [`determinism`]: the virtual clocks and seeded randomness of node calls.
//! - [`runtime`]: loading plugins and calling nodes under limits.
//! - [`settings`]: the runtime's settings, built from the configuration.
//! - [`registry`]: which plugin provides each node class.
//! - `state`, `imports`, `kernels`, `gpu_calls`, `log_pipe`: a node store's data and the
//!   host side of the imports (`kernels`: pixel kernels over host tensors, on
//!   the CPU or the GPU; `gpu_calls`: plugins' own WGSL kernels).
//! - [`bundled`]: the plugins shipped inside the binary.

mod account_plugins;
pub mod artifacts;
pub mod bindings;
pub mod bundled;
mod call_values;
pub mod compile;
mod deadlines;
pub mod determinism;
pub mod engine;
mod gpu_calls;
pub mod identity;
mod imports;
mod kernels;
pub mod live;
mod log_pipe;
pub mod manifest;
#[cfg(test)]
mod manifest_proptests;
pub mod meta;
pub mod network;
pub mod outcome;
pub mod registry;
pub mod routes;
pub mod runtime;
pub mod secrets;
pub mod settings;
mod shared;
pub mod state;

pub use account_plugins::AccountQuota;
pub use bindings::node;
pub use identity::{PluginGrant, PluginId};
pub use live::{Holdings, InstallError, LivePlugins, PluginInfo};
pub use manifest::{Manifest, OperatorLimits};
pub use outcome::{FailureKind, LoadError, NodeFailure, NodeOutput};
pub use registry::{NodeRegistry, RegistryError};
pub use runtime::{CapturedLog, NodeDef, Plugin, PluginRuntime};
pub use secrets::JobSecrets;
pub use settings::RuntimeConfig;
pub use shared::{kept_in, read_kept};
pub use state::{NodeIo, NodeSignal};
