//! Shared set-up for the crate's unit tests: one plugin runtime and registry
//! of the bundled plugins per test binary (compiling them is the slow part;
//! the compiled components are cached under the build's `OUT_DIR`).

use std::path::PathBuf;
use std::sync::{Arc, LazyLock};

use crate::config::Config;
use crate::plugins::{NodeRegistry, PluginRuntime};

/// The configuration unit tests run under: few instance slots, and a
/// compiled-component cache kept beside the build.
pub fn config() -> Config {
    Config { cache_dir: Some(PathBuf::from(env!("OUT_DIR")).join("unit-test-artifacts")), max_concurrency: 2, ..Config::default() }
}

static REGISTRY: LazyLock<Arc<NodeRegistry>> = LazyLock::new(|| {
    let runtime = PluginRuntime::new(config().runtime()).expect("plugin runtime");
    let loader = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime");
    Arc::new(loader.block_on(NodeRegistry::load_all(&runtime, &[])).expect("bundled plugins load"))
});

/// The bundled plugins' node classes.
pub fn registry() -> &'static Arc<NodeRegistry> {
    &REGISTRY
}
