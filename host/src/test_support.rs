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

struct Plugins {
    runtime: Arc<PluginRuntime>,
    registry: Arc<NodeRegistry>,
}

static PLUGINS: LazyLock<Plugins> = LazyLock::new(|| {
    let runtime = Arc::new(PluginRuntime::new(crate::plugins::RuntimeConfig::from_config(&config()).expect("runtime config")).expect("plugin runtime"));
    let loader = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime");
    let registry = Arc::new(loader.block_on(NodeRegistry::load_all(&runtime, &[])).expect("bundled plugins load"));
    Plugins { runtime, registry }
});

/// The plugin runtime the bundled plugins were loaded on.
pub fn runtime() -> &'static Arc<PluginRuntime> {
    &PLUGINS.runtime
}

/// The bundled plugins' node classes.
pub fn registry() -> &'static Arc<NodeRegistry> {
    &PLUGINS.registry
}

/// Property-test settings: `cases` per property (`PROPTEST_CASES`
/// overrides, for a longer soak), and no persisted failures (a failure
/// prints its minimal input instead).
pub fn proptest_config(cases: u32) -> proptest::test_runner::Config {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(cases);
    proptest::test_runner::Config { cases, failure_persistence: None, ..proptest::test_runner::Config::default() }
}
