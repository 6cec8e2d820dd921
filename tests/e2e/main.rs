//! End-to-end suites for kiln's engine: real plugins compiled to WebAssembly,
//! real files on disk, the real executor. One binary, one module per concern.

#[path = "../shapes.rs"]
mod shapes;
mod support;

mod api;
mod cache;
mod cancel;
mod compat;
mod containment;
mod embed;
mod events;
mod examples;
mod files;
mod gpu;
mod hostile;
mod image_bombs;
mod object_info;
mod own_postgres;
mod own_weed;
pub mod parity;
mod partner;
mod plugin_dir;
mod validation;
