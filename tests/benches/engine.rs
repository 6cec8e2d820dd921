//! Engine benchmark: per-node overhead on the 200-node ImageInvert chain and
//! the time of the heavy chain (2048² LoadImage → ImageScaleBy 1.5 →
//! ImageBlur(8, 4) → ImageSharpen(2, 1, 1) → SaveImage).
//!
//! Run with `cargo bench -p kiln-tests --bench engine`; figures go to
//! BENCHMARKS.md. The result cache is disabled so every node really runs.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kiln::config::Config;
use kiln::executor::Executor;
use kiln::files::{DirOutputs, NamedInputs};
use kiln::plugins::{NodeRegistry, PluginRuntime};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

mod common;
use common::{run_timed, write_input};

fn chain(n: usize, size: u32) -> Value {
    let mut wf = serde_json::Map::new();
    wf.insert("0".into(), json!({"class_type": "EmptyImage", "inputs": {"width": size, "height": size, "batch_size": 1, "color": 0x336699}}));
    for i in 1..=n {
        wf.insert(i.to_string(), json!({"class_type": "ImageInvert", "inputs": {"image": [(i - 1).to_string(), 0]}}));
    }
    wf.insert("out".into(), json!({"class_type": "PreviewImage", "inputs": {"images": [n.to_string(), 0]}}));
    Value::Object(wf)
}

async fn run(executor: &Executor, registry: &Arc<NodeRegistry>, workflow: &Value, inputs: &Arc<NamedInputs>, out: &Path) -> Duration {
    run_timed(executor, registry, workflow, inputs, out).await.0
}

fn stats(mut samples: Vec<Duration>) -> (f64, f64, f64) {
    samples.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    (ms(samples[0]), ms(samples[samples.len() / 2]), ms(samples[samples.len() - 1]))
}

/// A deterministic 2048² RGB test picture: gradients plus hash noise, so the
/// PNG codec has real work to do.
fn write_heavy_input(path: &Path) {
    write_input(path, 2048, 2048);
}

fn main() {
    if std::env::var_os("KILN_BENCH_DEFAULT_MALLOC").is_none() {
        kiln::memory::tune_allocator();
    }
    let rt = tokio::runtime::Runtime::new().expect("tokio");
    rt.block_on(async {
        let dir = tempfile::tempdir().expect("tempdir");
        // Decommits batched as `kiln run` does (the server releases each
        // instance's memory at once: ~10 µs more per node, see BENCHMARKS.md).
        let batch = std::env::var("KILN_DECOMMIT_BATCH").ok().and_then(|v| v.parse().ok()).unwrap_or(16);
        let config = Config { cache_dir: Some(dir.path().join("artifacts")), decommit_batch: batch, ..Config::default() };
        let started = Instant::now();
        let runtime = Arc::new(PluginRuntime::new(kiln::plugins::RuntimeConfig::from_config(&config).expect("config")).expect("runtime"));
        let registry = Arc::new(NodeRegistry::load_all(&runtime, &[]).await.expect("plugins"));
        println!("cold start (compile bundled plugins): {:.0} ms", started.elapsed().as_secs_f64() * 1e3);
        let started = Instant::now();
        let registry_warm = NodeRegistry::load_all(&runtime, &[]).await.expect("plugins");
        println!("warm start (load compiled plugins from the cache): {:.1} ms", started.elapsed().as_secs_f64() * 1e3);
        drop(registry_warm);
        println!("allocator: {:?}", runtime.allocator());
        // Cache disabled: every node runs every time.
        let executor = Executor::new(runtime.clone(), 0, config.max_concurrency as usize);
        let no_inputs = Arc::new(NamedInputs::new());
        let out = dir.path().join("out");
        let small = dir.path().join("small.png");
        write_input(&small, 64, 64);
        let mut named = NamedInputs::new();
        named.insert("small.png", &small);
        let named = Arc::new(named);

        // Breakdown: one node call straight through the plugin runtime.
        for (class, inputs) in [
            ("PrimitiveInt", vec![("value".to_string(), kiln::value::Value::Int(7))]),
            (
                "ImageInvert",
                vec![("image".to_string(), kiln::value::Value::Tensor(kiln::tensor::Tensor::new(vec![1, 8, 8, 3], vec![0.5; 192]).expect("tensor")))],
            ),
            ("LoadImage", vec![("image".to_string(), kiln::value::Value::String("small.png".into()))]),
        ] {
            let (plugin, _) = registry.get(class).expect("class");
            let io = || kiln::plugins::NodeIo { inputs: named.clone(), outputs: Arc::new(DirOutputs::new(&out, out.join("temp"))), signals: Arc::new(|_| {}), secrets: Default::default(), budget: kiln::budget::JobBudget::new(kiln::budget::JobLimits::UNLIMITED), cache_key: None };
            let cancel = CancellationToken::new();
            for _ in 0..200 {
                runtime.execute(plugin, class, &inputs, io(), &cancel).await.expect("node runs");
            }
            let only = std::env::var("KILN_BENCH_ONLY").ok();
            if only.as_deref().is_some_and(|o| o != class) { continue; }
            let n = if only.is_some() { 40000 } else { 2000 };
            let start = Instant::now();
            for _ in 0..n {
                runtime.execute(plugin, class, &inputs, io(), &cancel).await.expect("node runs");
            }
            println!("runtime.execute {class} (fresh store + instantiate + call): {:.1} µs per call", start.elapsed().as_secs_f64() * 1e6 / n as f64);
        }

        if std::env::var("KILN_BENCH_ONLY").is_ok() { return; }
        for size in [8u32, 64] {
            let wf = chain(200, size);
            let _ = run(&executor, &registry, &wf, &no_inputs, &out).await;
            let samples: Vec<Duration> = repeat(&executor, &registry, &wf, &no_inputs, &out, 10).await;
            let (min, p50, max) = stats(samples);
            println!(
                "200-node ImageInvert chain, {size}x{size}: run min {min:.1} / median {p50:.1} / max {max:.1} ms; per node (202 nodes) median {:.1} µs",
                p50 * 1e3 / 202.0
            );
        }

        // The service benchmark's job without the service: a 64² PNG through
        // LoadImage → SaveImage. SaveImage writes a file here, not a blob, into
        // a directory emptied after every run (outside the timing): ComfyUI's
        // file naming scans the directory for the next counter.
        let job_out = dir.path().join("job-out");
        let job = json!({
            "1": {"class_type": "LoadImage", "inputs": {"image": "small.png"}},
            "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "small"}}
        });
        for _ in 0..50 {
            run(&executor, &registry, &job, &named, &job_out).await;
            let _ = std::fs::remove_dir_all(&job_out);
        }
        let (mut runs, mut load, mut save) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..1000 {
            let (elapsed, nodes) = run_timed(&executor, &registry, &job, &named, &job_out).await;
            let _ = std::fs::remove_dir_all(&job_out);
            runs.push(elapsed);
            for (class, ms) in nodes {
                let d = Duration::from_secs_f64(ms / 1e3);
                if class == "LoadImage" { load.push(d) } else { save.push(d) }
            }
        }
        let (_, run_p50, _) = stats(runs);
        let (_, load_p50, _) = stats(load);
        let (_, save_p50, _) = stats(save);
        println!(
            "64² LoadImage → SaveImage (the service bench's job), 1000 runs: median run {:.0} µs (validate + both nodes); LoadImage {:.0} µs, SaveImage {:.0} µs",
            run_p50 * 1e3,
            load_p50 * 1e3,
            save_p50 * 1e3
        );

        let input = dir.path().join("heavy.png");
        write_heavy_input(&input);
        let mut named = NamedInputs::new();
        named.insert("heavy.png", &input);
        let named = Arc::new(named);
        let heavy = json!({
            "1": {"class_type": "LoadImage", "inputs": {"image": "heavy.png"}},
            "2": {"class_type": "ImageScaleBy", "inputs": {"image": ["1", 0], "upscale_method": "bilinear", "scale_by": 1.5}},
            "3": {"class_type": "ImageBlur", "inputs": {"image": ["2", 0], "blur_radius": 8, "sigma": 4.0}},
            "4": {"class_type": "ImageSharpen", "inputs": {"image": ["3", 0], "sharpen_radius": 2, "sigma": 1.0, "alpha": 1.0}},
            "5": {"class_type": "SaveImage", "inputs": {"images": ["4", 0], "filename_prefix": "heavy"}}
        });
        let _ = run(&executor, &registry, &heavy, &named, &out).await;
        let samples = repeat(&executor, &registry, &heavy, &named, &out, 5).await;
        let probe = json!({
            "1": {"class_type": "LoadImage", "inputs": {"image": "heavy.png"}},
            "2": {"class_type": "ImageScaleBy", "inputs": {"image": ["1", 0], "upscale_method": "nearest-exact", "scale_by": 1.5}},
            "3": {"class_type": "ImageInvert", "inputs": {"image": ["2", 0]}},
            "4": {"class_type": "ImageBlur", "inputs": {"image": ["3", 0], "blur_radius": 1, "sigma": 1.0}},
            "5": {"class_type": "GetImageSize", "inputs": {"image": ["4", 0]}},
            "6": {"class_type": "PreviewImage", "inputs": {"images": ["4", 0]}}
        });
        let (_, per_node) = run_timed(&executor, &registry, &probe, &named, &out).await;
        let breakdown: Vec<String> = per_node.iter().map(|(class, ms)| format!("{class} {ms:.0} ms")).collect();
        println!("3072² data-movement probe per node: {}", breakdown.join(", "));
        let (_, per_node) = run_timed(&executor, &registry, &heavy, &named, &out).await;
        let breakdown: Vec<String> = per_node.iter().map(|(class, ms)| format!("{class} {ms:.0} ms")).collect();
        println!("heavy chain per node: {}", breakdown.join(", "));
        let (min, p50, max) = stats(samples);
        println!(
            "heavy chain (2048² → 3072², blur 8/4, sharpen 2/1/1, PNG): min {min:.0} / median {p50:.0} / max {max:.0} ms; reference 3970 ms → {:.1}× faster",
            3970.0 / p50
        );
    });
}

async fn repeat(executor: &Executor, registry: &Arc<NodeRegistry>, wf: &Value, inputs: &Arc<NamedInputs>, out: &Path, n: usize) -> Vec<Duration> {
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        samples.push(run(executor, registry, wf, inputs, out).await);
    }
    samples
}
