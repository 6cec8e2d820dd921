//! What the engine and GPU benches share: running a workflow once with each
//! node's own time, and the test picture they load.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kiln::executor::{Executor, RunContext, RunStatus};
use kiln::files::{DirOutputs, NamedInputs};
use kiln::workflow::{Workflow, validate};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

/// Runs once; returns the wall time and each node's own time.
pub async fn run_timed(
    executor: &Executor,
    registry: &Arc<kiln::plugins::NodeRegistry>,
    workflow: &Value,
    inputs: &Arc<NamedInputs>,
    out: &Path,
) -> (Duration, Vec<(String, f64)>) {
    let nodes = Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = nodes.clone();
    let parsed = Workflow::from_json(workflow, &Default::default()).expect("workflow parses");
    let start = Instant::now();
    let (plan, issues) = validate(&parsed, registry, inputs.as_ref()).expect("workflow validates");
    assert!(issues.is_empty(), "{issues:?}");
    let ctx = RunContext {
        job_id: "bench".into(),
        registry: registry.clone(),
        prompt: Arc::from(workflow.to_string()),
        extra_pnginfo: None,
        inputs: inputs.clone(),
        outputs: Arc::new(DirOutputs::new(out, out.join("temp"))),
        events: Arc::new(move |e| {
            if let kiln::executor::Event::Executed { class_type, elapsed_ms, .. } = e {
                sink.lock().expect("events").push((class_type, elapsed_ms));
            }
        }),
        cancel: CancellationToken::new(),
        secrets: Default::default(),
        branches: None,
        budget: kiln::budget::JobBudget::new(kiln::budget::JobLimits::UNLIMITED),
        cache_scope: String::new(),
        funds: None,
    };
    let outcome = executor.run(&plan, ctx).await;
    let elapsed = start.elapsed();
    assert!(matches!(outcome.status, RunStatus::Succeeded), "{:?}", outcome.status);
    let nodes = std::mem::take(&mut *nodes.lock().expect("events"));
    (elapsed, nodes)
}

/// A w×h RGB PNG of gradients with noise.
pub fn write_input(path: &Path, w: u32, h: u32) {
    let mut px = Vec::with_capacity((w * h * 3) as usize);
    for y in 0..h {
        for x in 0..w {
            let noise = ((x.wrapping_mul(73856093) ^ y.wrapping_mul(19349663)) >> 7) as u8 & 31;
            px.extend_from_slice(&[((x * 255 / w) as u8).wrapping_add(noise), ((y * 255 / h) as u8).wrapping_add(noise), (((x + y) * 127 / w) as u8) ^ noise]);
        }
    }
    let mut enc = png::Encoder::new(std::io::BufWriter::new(std::fs::File::create(path).expect("create input")), w, h);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    enc.write_header().and_then(|mut wr| wr.write_image_data(&px)).expect("encode input");
}
