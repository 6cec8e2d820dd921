//! A third-party plugin built on the SDK outside the bundled set loads from a
//! plugin directory and runs like any bundled node; bad plugin directories
//! are refused with clear errors.

use std::sync::Arc;

use kiln::executor::{Executor, RunStatus};
use kiln::plugins::{NodeRegistry, RegistryError};
use serde_json::json;

use crate::support::{EXAMPLE_MANIFEST, EXAMPLE_WASM, RunOpts, env, install_plugin, read_png, run_with};

#[tokio::test]
async fn example_plugin_loads_from_a_directory_and_runs() {
    let env = env().await;
    let plugins = tempfile::tempdir().unwrap();
    install_plugin(&plugins.path().join("posterize"), EXAMPLE_MANIFEST, EXAMPLE_WASM);
    let registry = Arc::new(NodeRegistry::load_all(&env.runtime, &[plugins.path().to_path_buf()]).await.unwrap());
    let (plugin, def) = registry.get("ExamplePosterize").expect("the example's node is registered");
    assert_eq!(plugin.manifest.name, "example-posterize");
    assert_eq!(def.category, "examples");
    assert!(registry.get("ImageInvert").is_some(), "bundled plugins are still there");

    let executor = Executor::new(env.runtime.clone(), registry, 16 << 20, 2);
    let out = tempfile::tempdir().unwrap();
    let ran = run_with(
        &executor,
        json!({
            "1": {"class_type": "EmptyImage", "inputs": {"width": 4, "height": 2, "batch_size": 1, "color": 0x4080c0}},
            "2": {"class_type": "ExamplePosterize", "inputs": {"image": ["1", 0], "levels": 2}},
            "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "p"}}
        }),
        RunOpts::new(out.path()),
    )
    .await;
    assert!(matches!(ran.outcome.status, RunStatus::Succeeded), "{:?}", ran.outcome.status);
    let (_, _, _, px, _) = read_png(&out.path().join("p_00001_.png"));
    // 0x40 → 0, 0x80 → 255 (0.502 rounds up), 0xc0 → 255 with two levels.
    assert_eq!(&px[..3], &[0, 255, 255]);
}

#[tokio::test]
async fn refuses_duplicate_classes_missing_components_and_ungranted_capabilities() {
    let env = env().await;
    let plugins = tempfile::tempdir().unwrap();
    // The example again under another name: its class is already taken.
    install_plugin(&plugins.path().join("a"), EXAMPLE_MANIFEST, EXAMPLE_WASM);
    install_plugin(&plugins.path().join("b"), &EXAMPLE_MANIFEST.replace("example-posterize", "copycat"), EXAMPLE_WASM);
    match NodeRegistry::load_all(&env.runtime, &[plugins.path().to_path_buf()]).await {
        Err(RegistryError::DuplicateClass { class, plugin, existing }) => {
            assert_eq!((class.as_str(), plugin.as_str(), existing.as_str()), ("ExamplePosterize", "copycat", "example-posterize"));
        }
        Err(other) => panic!("{other}"),
        Ok(_) => panic!("a duplicate class must be refused"),
    }

    let missing = tempfile::tempdir().unwrap();
    std::fs::write(missing.path().join("kiln-plugin.toml"), EXAMPLE_MANIFEST).unwrap();
    let err = NodeRegistry::load_all(&env.runtime, &[missing.path().to_path_buf()]).await.err().expect("missing component");
    assert!(err.to_string().contains("kiln_custom_node_example.wasm"), "{err}");

    let greedy = tempfile::tempdir().unwrap();
    install_plugin(greedy.path(), &format!("{EXAMPLE_MANIFEST}\n[capabilities]\noutbound_hosts = [\"evil.example\"]\n"), EXAMPLE_WASM);
    let err = NodeRegistry::load_all(&env.runtime, &[greedy.path().to_path_buf()]).await.err().expect("ungranted capability");
    assert!(err.to_string().contains("outbound_hosts"), "{err}");

    let garbage = tempfile::tempdir().unwrap();
    install_plugin(garbage.path(), EXAMPLE_MANIFEST, b"\0asm not really a component");
    let err = NodeRegistry::load_all(&env.runtime, &[garbage.path().to_path_buf()]).await.err().expect("invalid component");
    assert!(err.to_string().contains("not a valid component"), "{err}");
}

#[tokio::test]
async fn compiled_components_are_cached_and_tampered_artifacts_refused() {
    let dir = tempfile::tempdir().unwrap();
    let config = kiln::config::Config { cache_dir: Some(dir.path().join("artifacts")), max_concurrency: 1, ..crate::support::test_config() };
    let runtime = kiln::plugins::PluginRuntime::new(config.runtime()).unwrap();
    let manifest = || kiln::plugins::Manifest::parse(EXAMPLE_MANIFEST).unwrap();
    let cold = runtime.load(manifest(), EXAMPLE_WASM).await.unwrap();
    assert!(!cold.from_cache, "first load compiles");
    let warm = runtime.load(manifest(), EXAMPLE_WASM).await.unwrap();
    assert!(warm.from_cache, "second load deserializes the cached artifact");

    // Flip a byte of every artifact: the checksum no longer matches, so the
    // host recompiles instead of deserializing bytes it did not produce.
    for entry in std::fs::read_dir(dir.path().join("artifacts")).unwrap() {
        let path = entry.unwrap().path();
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        std::fs::write(&path, bytes).unwrap();
    }
    let recompiled = runtime.load(manifest(), EXAMPLE_WASM).await.unwrap();
    assert!(!recompiled.from_cache, "a tampered artifact is not loaded");
    assert_eq!(recompiled.definitions.len(), 1);
}
