//! kiln's bundled partner plugin: the partner proxy's skin-enhancer routes
//! (`/proxy/partner/v1/ai/skin-enhancer/flexible` and `.../{task_id}`),
//! served through `wasi:http/incoming-handler`, and the
//! `MagnificImageSkinEnhancerNode` node, which runs the same validation and
//! forwarding code in-process.
//!
//! - [`settings`]: the operator's configuration (the plugin's environment).
//! - [`validate`]: the create route's request rules.
//! - [`provider`]: HTTP to the provider through `wasi:http/outgoing-handler`.
//! - [`proxy`]: create and status, as the routes and the node share them.
//! - [`routes`]: the incoming handler.
//! - [`node`]: the partner node.

pub mod node;
pub mod provider;
pub mod proxy;
pub mod routes;
pub mod settings;
pub mod validate;

kiln_sdk::export_plugin!(node::SKIN_ENHANCER);

#[cfg(target_arch = "wasm32")]
use routes::Routes;
#[cfg(target_arch = "wasm32")]
wasip2::http::proxy::export!(Routes);
