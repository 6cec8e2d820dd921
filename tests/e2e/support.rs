//! Shared set-up: one plugin runtime and registry for the whole binary
//! (bundled plugins plus the hostile test plugin), and helpers to run
//! workflows and collect their events.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use kiln::config::Config;
use kiln::executor::{Event, Executor, RunContext, RunOutcome};
use kiln::files::{DirOutputs, NamedInputs};
use kiln::plugins::{NodeRegistry, PluginRuntime};
use kiln::workflow::{Workflow, validate};
use std::sync::Mutex;

use tokio::sync::OnceCell;
use tokio_util::sync::CancellationToken;

pub const HOSTILE_WASM: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/kiln_hostile_guests.wasm"));
pub const HOSTILE_MANIFEST: &str = include_str!("../guests/hostile/kiln-plugin.toml");
pub const EXAMPLE_WASM: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/kiln_custom_node_example.wasm"));
pub const EXAMPLE_MANIFEST: &str = include_str!("../../examples/custom-node/kiln-plugin.toml");

/// The configuration the suites run under: small budgets so hostile nodes hit
/// them quickly, and a compiled-component cache shared across test runs.
pub fn test_config() -> Config {
    Config {
        cache_dir: Some(PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("kiln-artifacts")),
        max_concurrency: 4,
        node_tensor_budget_mb: 256,
        node_log_kb: 16,
        // The hostile plugin's probe reads the partner key: granted by its
        // component's hash (its directory is a temporary one).
        secret_plugins: vec![hostile_grant()],
        ..Config::default()
    }
}

/// The grant of the hostile test plugin: `blake3:` and its component's hash.
pub fn hostile_grant() -> String {
    format!("blake3:{}", blake3::hash(HOSTILE_WASM).to_hex())
}

pub struct Env {
    pub runtime: Arc<PluginRuntime>,
    pub registry: Arc<NodeRegistry>,
    pub executor: Executor,
    _plugin_dir: tempfile::TempDir,
}

static ENV: OnceCell<Env> = OnceCell::const_new();

/// Writes a plugin (manifest + component) into `dir`.
pub fn install_plugin(dir: &Path, manifest: &str, wasm: &[u8]) {
    std::fs::create_dir_all(dir).unwrap();
    let component = manifest.lines().find_map(|l| l.strip_prefix("component = ")).unwrap().trim_matches('"');
    std::fs::write(dir.join("kiln-plugin.toml"), manifest).unwrap();
    std::fs::write(dir.join(component), wasm).unwrap();
}

pub async fn env() -> &'static Env {
    ENV.get_or_init(|| async {
        let config = test_config();
        let runtime = Arc::new(PluginRuntime::new(kiln::plugins::RuntimeConfig::from_config(&config).expect("config")).expect("runtime"));
        let plugin_dir = tempfile::tempdir().unwrap();
        install_plugin(&plugin_dir.path().join("hostile"), HOSTILE_MANIFEST, HOSTILE_WASM);
        let registry = Arc::new(NodeRegistry::load_all(&runtime, &[plugin_dir.path().to_path_buf()]).await.expect("plugins load"));
        let executor = Executor::new(runtime.clone(), 512 << 20, 4);
        Env { runtime, registry, executor, _plugin_dir: plugin_dir }
    })
    .await
}

/// A finished run and everything it reported.
pub struct Ran {
    pub outcome: RunOutcome,
    pub events: Vec<Event>,
}

/// Options for [`run_workflow`].
pub struct RunOpts<'a> {
    pub inputs: NamedInputs,
    pub out: &'a Path,
    pub cancel: CancellationToken,
    /// The run's account (the test config's job limits by default); keep a
    /// clone to read its peak afterwards.
    pub budget: Arc<kiln::budget::JobBudget>,
    /// The account's funds check (none by default: no accounts).
    pub funds: Option<kiln::executor::FundsCheck>,
}

impl<'a> RunOpts<'a> {
    pub fn new(out: &'a Path) -> RunOpts<'a> {
        RunOpts {
            inputs: NamedInputs::new(),
            out,
            cancel: CancellationToken::new(),
            budget: kiln::budget::JobBudget::new(kiln::budget::JobLimits::from_config(&test_config())),
            funds: None,
        }
    }
}

/// Validates (all-or-nothing) and runs `workflow` on `executor`.
pub async fn run_with(executor: &Executor, registry: &Arc<NodeRegistry>, workflow: serde_json::Value, opts: RunOpts<'_>) -> Ran {
    let parsed = Workflow::from_json(&workflow, &Default::default()).expect("parses");
    let (plan, issues) = validate(&parsed, registry, &opts.inputs).expect("validates");
    assert!(issues.is_empty(), "validation issues: {issues:?}");
    let events = Arc::new(Mutex::new(Vec::new()));
    let sink = events.clone();
    let ctx = RunContext {
        job_id: "test".into(),
        registry: registry.clone(),
        prompt: Arc::from(workflow.to_string()),
        extra_pnginfo: None,
        inputs: Arc::new(opts.inputs),
        outputs: Arc::new(DirOutputs::new(opts.out, opts.out.join("temp"))),
        events: Arc::new(move |e| sink.lock().unwrap().push(e)),
        cancel: opts.cancel,
        secrets: Default::default(),
        branches: None,
        budget: opts.budget,
        cache_scope: String::new(),
        funds: opts.funds,
    };
    let outcome = executor.run(&plan, ctx).await;
    let events = std::mem::take(&mut *events.lock().unwrap());
    Ran { outcome, events }
}

pub async fn run_workflow(workflow: serde_json::Value, opts: RunOpts<'_>) -> Ran {
    let env = env().await;
    run_with(&env.executor, &env.registry, workflow, opts).await
}

/// Encodes an 8-bit PNG (RGB or RGBA) for tests.
pub fn write_png(path: &Path, width: u32, height: u32, channels: usize, pixels: &[u8]) {
    let file = std::fs::File::create(path).unwrap();
    let mut enc = png::Encoder::new(std::io::BufWriter::new(file), width, height);
    enc.set_color(if channels == 4 { png::ColorType::Rgba } else { png::ColorType::Rgb });
    enc.set_depth(png::BitDepth::Eight);
    enc.write_header().unwrap().write_image_data(pixels).unwrap();
}

/// Decodes an 8-bit PNG: (width, height, channels, pixels, text chunks: `tEXt` then `iTXt`).
pub fn read_png(path: &Path) -> (u32, u32, usize, Vec<u8>, Vec<(String, String)>) {
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(path).unwrap()));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    buf.truncate(info.buffer_size());
    let chunks = reader.info();
    let mut text: Vec<(String, String)> = chunks.uncompressed_latin1_text.iter().map(|t| (t.keyword.clone(), t.text.clone())).collect();
    text.extend(chunks.utf8_text.iter().map(|t| (t.keyword.clone(), t.get_text().unwrap())));
    (info.width, info.height, info.color_type.samples(), buf, text)
}

/// xorshift64*: a fixed sequence, reproducible from the seed (the seeded
/// input generators of the tests).
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}
