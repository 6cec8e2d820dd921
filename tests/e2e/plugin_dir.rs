//! A third-party plugin built on the SDK outside the bundled set loads from a
//! plugin directory and runs like any bundled node; bad plugin directories
//! are refused with clear errors; grants bind to a plugin's directory or
//! component hash, never to the name it claims; a manifest's
//! nondeterministic classes see the real clock and are never cached; network
//! grants meet manifests; a component built against contract 0.1.0 loads.

use std::sync::Arc;

use kiln::executor::{Executor, RunStatus};
use kiln::plugins::LoadError;
use kiln::plugins::{NodeRegistry, PluginId, PluginRuntime, RegistryError};
use serde_json::json;

use crate::hostile::{clock_report, run_clock_probe, secret_report};
use crate::support::{
    EXAMPLE_MANIFEST, EXAMPLE_WASM, HOSTILE_MANIFEST, HOSTILE_WASM, RunOpts, env, hostile_grant, install_plugin, read_png, run_with, test_config,
};

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

    posterizes(env, registry).await;
}

/// A component built against `kiln:plugin@0.1.0` (no `node-meta` export)
/// loads on the 0.1.2 host and runs.
#[tokio::test]
async fn a_component_built_against_contract_0_1_0_still_loads_and_runs() {
    let wasm = include_bytes!("../fixtures/plugins/custom-node-kiln-plugin-0.1.0.wasm");
    let env = env().await;
    let plugins = tempfile::tempdir().unwrap();
    install_plugin(&plugins.path().join("posterize"), EXAMPLE_MANIFEST, wasm);
    let registry = Arc::new(NodeRegistry::load_all(&env.runtime, &[plugins.path().to_path_buf()]).await.expect("a 0.1.0 component loads"));
    let (plugin, _) = registry.get("ExamplePosterize").expect("its node is registered");
    assert!(plugin.meta.is_empty(), "no node-meta export, no extras");
    posterizes(env, registry).await;
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
    assert!(err.to_string().contains("outbound_hosts: evil.example") && err.to_string().contains("[[plugin_network]]"), "{err}");
    let router = tempfile::tempdir().unwrap();
    install_plugin(router.path(), &format!("{EXAMPLE_MANIFEST}\n[capabilities]\nroutes = [\"/proxy/example/\"]\n"), EXAMPLE_WASM);
    let err = NodeRegistry::load_all(&env.runtime, &[router.path().to_path_buf()]).await.err().expect("ungranted routes");
    assert!(err.to_string().contains("routes: /proxy/example/"), "{err}");

    let garbage = tempfile::tempdir().unwrap();
    install_plugin(garbage.path(), EXAMPLE_MANIFEST, b"\0asm not really a component");
    let err = NodeRegistry::load_all(&env.runtime, &[garbage.path().to_path_buf()]).await.err().expect("invalid component");
    assert!(err.to_string().contains("not a valid component"), "{err}");
}

/// An artifact from the cache is loaded from memory, not mapped from its
/// file: one truncated in place under a loaded component (by a person, a
/// tool, a shared network directory) leaves that component running, where
/// a mapping would take the whole host down with `SIGBUS`; the damaged
/// artifact is then compiled again, never loaded.
#[tokio::test]
async fn compiled_components_are_cached_and_tampered_artifacts_refused() {
    let dir = tempfile::tempdir().unwrap();
    let config = kiln::config::Config {
        cache_dir: Some(dir.path().join("artifacts")),
        max_concurrency: 1,
        secret_plugins: vec![hostile_grant()],
        ..crate::support::test_config()
    };
    let runtime = Arc::new(kiln::plugins::PluginRuntime::new(kiln::plugins::RuntimeConfig::from_config(&config).unwrap()).unwrap());
    let manifest = || kiln::plugins::Manifest::parse(HOSTILE_MANIFEST).unwrap();
    let id = || PluginId::Dir("/plugins/hostile".into());
    let cold = runtime.load(id(), manifest(), HOSTILE_WASM).await.unwrap();
    assert!(!cold.from_cache, "first load compiles");
    drop(cold);
    let warm = runtime.load(id(), manifest(), HOSTILE_WASM).await.unwrap();
    assert!(warm.from_cache, "second load deserializes the cached artifact");
    let mut registry = NodeRegistry::new();
    registry.add(warm).unwrap();
    let registry = Arc::new(registry);

    // Cut every artifact to half, in place, and flip its last byte.
    for entry in std::fs::read_dir(dir.path().join("artifacts")).unwrap() {
        let path = entry.unwrap().path();
        let mut bytes = std::fs::read(&path).unwrap();
        bytes.truncate(bytes.len() / 2);
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        std::fs::write(&path, bytes).unwrap();
    }
    let executor = Executor::new(runtime.clone(), 16 << 20, 1);
    let out = tempfile::tempdir().unwrap();
    let (outcome, report) = run_clock_probe(&executor, &registry, out.path()).await;
    assert!(outcome.executed.iter().any(|node| node == "7") && report.is_some(), "the loaded component still runs");

    let recompiled = runtime.load(id(), manifest(), HOSTILE_WASM).await.unwrap();
    assert!(!recompiled.from_cache, "a damaged artifact is not loaded");
    assert!(!recompiled.definitions.is_empty());
}

/// A runtime whose operator grants secrets to `grants` (`secret_plugins`).
fn runtime_granting(grants: Vec<String>) -> Arc<PluginRuntime> {
    let config = kiln::config::Config { secret_plugins: grants, max_concurrency: 1, ..test_config() };
    Arc::new(PluginRuntime::new(kiln::plugins::RuntimeConfig::from_config(&config).unwrap()).unwrap())
}

/// What `HostileSecretProbe` of `registry` reads in a job carrying `key`.
async fn probe_secret(runtime: &PluginRuntime, registry: &NodeRegistry, key: &str) -> String {
    let (plugin, _) = registry.get("HostileSecretProbe").expect("the probe is loaded");
    let out = tempfile::tempdir().unwrap();
    let io = kiln::plugins::NodeIo {
        inputs: Arc::new(kiln::files::NamedInputs::new()),
        outputs: Arc::new(kiln::files::DirOutputs::new(out.path(), out.path())),
        signals: Arc::new(|_| {}),
        secrets: kiln::plugins::JobSecrets::new(Some(key.into())),
        cache_key: None,
        budget: kiln::budget::JobBudget::new(kiln::budget::JobLimits::UNLIMITED),
    };
    let inputs = [("trigger".to_string(), kiln::value::Value::Int(0))];
    match runtime.execute(plugin, "HostileSecretProbe", &inputs, io, &Default::default()).await.unwrap().values.as_slice() {
        [kiln::value::Value::String(report)] => report.clone(),
        other => panic!("unexpected {other:?}"),
    }
}

fn not_granted(result: Result<NodeRegistry, RegistryError>) -> String {
    match result {
        Err(RegistryError::Load(e @ LoadError::SecretNotGranted { .. })) => e.to_string(),
        Err(other) => panic!("refused for another reason: {other}"),
        Ok(_) => panic!("an ungranted plugin asking for the partner key must be refused"),
    }
}

/// A grant names the plugin's directory or its component's hash. A plugin
/// elsewhere claiming the granted plugin's name — the impostor — is refused
/// at load (not granted), and, should it ask for nothing, refused as a
/// duplicate name beside the real one.
#[tokio::test]
async fn secret_grants_bind_to_directories_or_hashes_not_names() {
    let plugins = tempfile::tempdir().unwrap();
    let partner = plugins.path().join("partner");
    install_plugin(&partner, HOSTILE_MANIFEST, HOSTILE_WASM);
    let elsewhere = tempfile::tempdir().unwrap();
    let impostor = elsewhere.path().join("partner");
    install_plugin(&impostor, HOSTILE_MANIFEST, HOSTILE_WASM);

    // By directory: the plugin there reads the key; the impostor, same
    // name and same code in another directory, is not granted.
    let by_dir = runtime_granting(vec![format!("{}/../partner", partner.display())]);
    let registry = NodeRegistry::load_all(&by_dir, std::slice::from_ref(&partner)).await.unwrap();
    assert_eq!(probe_secret(&by_dir, &registry, "k-1").await, secret_report(Some("k-1")));
    let message = not_granted(NodeRegistry::load_all(&by_dir, std::slice::from_ref(&impostor)).await);
    assert!(message.contains(&impostor.canonicalize().unwrap().display().to_string()), "names the impostor's directory: {message}");
    not_granted(NodeRegistry::load_all(&by_dir, &[partner.clone(), impostor.clone()]).await);
    // An impostor asking for nothing, claiming the name beside the real one.
    let quiet = elsewhere.path().join("quiet");
    install_plugin(&quiet, HOSTILE_MANIFEST.split("[capabilities]").next().unwrap(), HOSTILE_WASM);
    match NodeRegistry::load_all(&by_dir, &[partner.clone(), quiet.clone()]).await {
        Err(RegistryError::DuplicateName { name, plugin, existing }) => {
            assert_eq!(name, "hostile");
            assert_eq!(plugin, PluginId::dir(&quiet).unwrap());
            assert_eq!(existing, PluginId::dir(&partner).unwrap());
        }
        Err(other) => panic!("{other}"),
        Ok(_) => panic!("two plugins named `hostile` must be refused"),
    }

    // By hash: any directory holding exactly that component; other code
    // under the same manifest is not granted.
    let by_hash = runtime_granting(vec![hostile_grant()]);
    let registry = NodeRegistry::load_all(&by_hash, std::slice::from_ref(&impostor)).await.unwrap();
    assert_eq!(probe_secret(&by_hash, &registry, "k-2").await, secret_report(Some("k-2")));
    let other_code = elsewhere.path().join("other-code");
    install_plugin(&other_code, HOSTILE_MANIFEST, EXAMPLE_WASM);
    let message = not_granted(NodeRegistry::load_all(&by_hash, &[other_code]).await);
    assert!(message.contains(&format!("blake3:{}", blake3::hash(EXAMPLE_WASM).to_hex())), "says how to grant it: {message}");
}

#[tokio::test]
async fn duplicate_plugin_names_are_refused_bundled_included() {
    let env = env().await;
    let plugins = tempfile::tempdir().unwrap();
    install_plugin(&plugins.path().join("a"), EXAMPLE_MANIFEST, EXAMPLE_WASM);
    let same_name = HOSTILE_MANIFEST.split("[capabilities]").next().unwrap().replace("name = \"hostile\"", "name = \"example-posterize\"");
    install_plugin(&plugins.path().join("b"), &same_name, HOSTILE_WASM);
    let err = NodeRegistry::load_all(&env.runtime, &[plugins.path().to_path_buf()]).await.err().expect("duplicate name");
    assert!(matches!(&err, RegistryError::DuplicateName { name, .. } if name == "example-posterize"), "{err}");
    assert!(err.to_string().contains("must be unique"), "{err}");

    let bundled_name = tempfile::tempdir().unwrap();
    install_plugin(bundled_name.path(), &EXAMPLE_MANIFEST.replace("example-posterize", "core-image"), EXAMPLE_WASM);
    let err = NodeRegistry::load_all(&env.runtime, &[bundled_name.path().to_path_buf()]).await.err().expect("a bundled plugin's name");
    assert!(matches!(&err, RegistryError::DuplicateName { existing: PluginId::Bundled(b), .. } if b == "core-image"), "{err}");
    assert!(err.to_string().contains("bundled:core-image"), "{err}");
}

/// `manifest` with a top-level `line` (before its first table).
fn with_top_level(manifest: &str, line: &str) -> String {
    let at = manifest.find("\n[").map_or(manifest.len(), |i| i + 1);
    format!("{}{line}\n{}", &manifest[..at], &manifest[at..])
}

/// A class the manifest declares nondeterministic sees the real clock and
/// fresh randomness, and neither it nor anything downstream is served from
/// the cache; a manifest naming a class the plugin lacks is refused.
#[tokio::test]
async fn nondeterministic_nodes_see_real_clocks_and_are_never_cached() {
    let env = env().await;
    let plugins = tempfile::tempdir().unwrap();
    let manifest = with_top_level(HOSTILE_MANIFEST, r#"nondeterministic = ["HostileClockProbe"]"#);
    install_plugin(&plugins.path().join("hostile"), &manifest, HOSTILE_WASM);
    let registry = Arc::new(NodeRegistry::load_all(&env.runtime, &[plugins.path().to_path_buf()]).await.unwrap());
    let (plugin, _) = registry.get("HostileClockProbe").unwrap();
    assert!(!plugin.is_deterministic("HostileClockProbe") && plugin.is_deterministic("HostilePanic"));
    let executor = Executor::new(env.runtime.clone(), 16 << 20, 2);

    let out = tempfile::tempdir().unwrap();
    let (first, report) = run_clock_probe(&executor, &registry, out.path()).await;
    let (second, report_again) = run_clock_probe(&executor, &registry, out.path()).await;
    assert_eq!((first.executed, second.executed), (vec!["7".to_string()], vec!["7".to_string()]), "never served from the cache");
    let (report, report_again) = (report.unwrap(), report_again.unwrap());
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    let (wall, _, chance) = clock_report(&report);
    assert!(now.abs_diff(wall) < std::time::Duration::from_secs(10), "the real clock: {report}");
    assert_ne!(chance, clock_report(&report_again).2, "fresh randomness each run");

    // Downstream of it, nothing is cached either.
    let workflow = json!({
        "7": {"class_type": "HostileClockProbe", "inputs": {"trigger": 1}},
        "8": {"class_type": "PrimitiveString", "inputs": {"value": ["7", 0]}}
    });
    for _ in 0..2 {
        let out = tempfile::tempdir().unwrap();
        let ran = run_with(&executor, &registry, workflow.clone(), RunOpts::new(out.path())).await;
        assert!(matches!(ran.outcome.status, RunStatus::Succeeded), "{:?}", ran.outcome.status);
        assert!(ran.outcome.cached.is_empty(), "cached: {:?}", ran.outcome.cached);
    }

    let unknown = tempfile::tempdir().unwrap();
    install_plugin(unknown.path(), &with_top_level(HOSTILE_MANIFEST, r#"nondeterministic = ["NoSuchClass"]"#), HOSTILE_WASM);
    let err = NodeRegistry::load_all(&env.runtime, &[unknown.path().to_path_buf()]).await.err().expect("an unknown class is refused");
    assert!(err.to_string().contains("nondeterministic") && err.to_string().contains("NoSuchClass"), "{err}");
}

/// A component instantiating `count` copies of a core module that defines
/// `memories` memories and `tables` tables (0 or 1 each).
fn component_of_instances(count: u32, memories: u32, tables: u32) -> Vec<u8> {
    use wasm_encoder::{Component, InstanceSection, MemorySection, MemoryType, Module, ModuleArg, ModuleSection, RefType, TableSection, TableType};
    let mut module = Module::new();
    if tables > 0 {
        let mut section = TableSection::new();
        section.table(TableType { element_type: RefType::FUNCREF, table64: false, minimum: 1, maximum: None, shared: false });
        module.section(&section);
    }
    if memories > 0 {
        let mut section = MemorySection::new();
        section.memory(MemoryType { minimum: 1, maximum: None, memory64: false, shared: false, page_size_log2: None });
        module.section(&section);
    }
    let mut component = Component::new();
    component.section(&ModuleSection(&module));
    let mut instances = InstanceSection::new();
    for _ in 0..count {
        instances.instantiate(0, Vec::<(&str, ModuleArg)>::new());
    }
    component.section(&instances);
    component.finish()
}

/// Each component may take only its share of the instance pool: one
/// defining more core instances, memories or tables than a slot's share is
/// refused when it loads, with a message saying which limit.
#[tokio::test]
async fn components_over_the_pools_per_component_limits_are_refused_at_load() {
    use kiln::plugins::engine::{Allocator, CORE_INSTANCES_PER_COMPONENT, MEMORIES_PER_COMPONENT, TABLES_PER_COMPONENT};
    let env = env().await;
    if env.runtime.allocator() != Allocator::Pooling {
        eprintln!("no pooling allocator on this machine: its limits do not apply");
        return;
    }
    let manifest = || kiln::plugins::Manifest::parse("name = 'greedy'\nversion = '1'\ncomponent = 'greedy.wasm'").unwrap();
    for (bytes, what, limit) in [
        (component_of_instances(CORE_INSTANCES_PER_COMPONENT + 1, 0, 0), "core module instances", CORE_INSTANCES_PER_COMPONENT),
        (component_of_instances(MEMORIES_PER_COMPONENT + 1, 1, 0), "linear memories", MEMORIES_PER_COMPONENT),
        (component_of_instances(TABLES_PER_COMPONENT + 1, 0, 1), "tables", TABLES_PER_COMPONENT),
    ] {
        let err = env.runtime.load(PluginId::Dir("/plugins/greedy".into()), manifest(), &bytes).await.err().expect("over the limit");
        let message = err.to_string();
        assert!(message.contains("plugin `greedy (/plugins/greedy)`"), "{message}");
        assert!(message.contains(what) && message.contains(&format!("maximum of {limit} ")), "{what}: {message}");
    }
    // Within the limits, the same shape loads as far as its (missing) exports.
    let err = env.runtime.load(PluginId::Dir("/plugins/greedy".into()), manifest(), &component_of_instances(2, 1, 1)).await.err().unwrap();
    assert!(!err.to_string().contains("maximum of"), "{err}");
}

/// Network grants bind to a plugin's directory: the hosts it may reach are
/// its manifest's list intersected with the grant, and a plugin granted
/// routes must export `wasi:http/incoming-handler`.
#[tokio::test]
async fn network_grants_intersect_manifests_and_routes_need_a_handler() {
    let plugins = tempfile::tempdir().unwrap();
    let dir = plugins.path().join("net");
    let manifest = format!("{EXAMPLE_MANIFEST}\n[capabilities]\noutbound_hosts = [\"api.example.com\", \"other.example.com:8443\"]\n");
    install_plugin(&dir, &manifest, EXAMPLE_WASM);
    let grant = |routes: bool| kiln::config::PluginNetwork {
        plugin: dir.display().to_string(),
        outbound_hosts: vec!["api.example.com".into(), "cdn.example.com".into()],
        routes,
        env: [("NET_KEY".to_string(), "v".to_string())].into(),
    };
    let config = kiln::config::Config { plugin_network: vec![grant(false)], ..test_config() };
    let runtime = PluginRuntime::new(kiln::plugins::RuntimeConfig::from_config(&config).unwrap()).unwrap();
    let registry = NodeRegistry::load_all(&runtime, &[plugins.path().to_path_buf()]).await.expect("a granted plugin loads");
    let (plugin, _) = registry.get("ExamplePosterize").unwrap();
    let allowed: Vec<String> = plugin.net.allowed.iter().map(|h| h.to_string()).collect();
    assert_eq!(allowed, ["api.example.com"], "only what both the manifest and the grant name");
    assert_eq!(&plugin.net.env[..], &[("NET_KEY".to_string(), "v".to_string())]);
    assert!(plugin.net.routes.is_empty());

    std::fs::write(dir.join("kiln-plugin.toml"), format!("{manifest}routes = [\"/proxy/net/\"]\n")).unwrap();
    let config = kiln::config::Config { plugin_network: vec![grant(true)], ..test_config() };
    let runtime = PluginRuntime::new(kiln::plugins::RuntimeConfig::from_config(&config).unwrap()).unwrap();
    match NodeRegistry::load_all(&runtime, &[plugins.path().to_path_buf()]).await {
        Err(RegistryError::Load(LoadError::NoHttpHandler { plugin, .. })) => assert!(plugin.contains("example-posterize"), "{plugin}"),
        Err(other) => panic!("{other}"),
        Ok(_) => panic!("routes without an incoming handler must be refused"),
    }
}

/// Runs EmptyImage → ExamplePosterize(2 levels) → SaveImage on `registry`
/// and checks the pixels: 0x40 → 0, 0x80 → 255 (0.502 rounds up), 0xc0 → 255.
async fn posterizes(env: &crate::support::Env, registry: Arc<NodeRegistry>) {
    let executor = Executor::new(env.runtime.clone(), 16 << 20, 2);
    let out = tempfile::tempdir().unwrap();
    let ran = run_with(
        &executor,
        &registry,
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
    assert_eq!(&px[..3], &[0, 255, 255]);
}
