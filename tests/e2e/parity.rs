//! Every core node against expected pixels: the fixtures in
//! `tests/fixtures/parity/` were computed by an independent reference
//! implementation of ComfyUI's formulas (`tests/parity/generate.py`, torch
//! and Pillow), and each case runs here through the real WebAssembly node.

use std::path::Path;
use std::sync::Arc;

use kiln::files::{DirOutputs, NamedInputs};
use kiln::plugins::NodeIo;
use kiln::plugins::node::InputKind;
use kiln::tensor::Tensor;
use kiln::value::Value;
use serde_json::Value as Json;

use crate::support::env;

fn tensor(json: &Json) -> Option<Tensor> {
    let shape = json.get("shape")?.as_array()?.iter().map(|d| d.as_u64().map(|d| d as u32)).collect::<Option<Vec<_>>>()?;
    let data = json.get("data")?.as_array()?.iter().map(|v| v.as_f64().map(|v| v as f32)).collect::<Option<Vec<_>>>()?;
    Tensor::new(shape, data).ok()
}

fn input_value(kind: &InputKind, json: &Json) -> Value {
    match kind {
        InputKind::Int(_) => Value::Int(json.as_i64().expect("int input")),
        InputKind::Float(_) => Value::Float(json.as_f64().expect("float input")),
        InputKind::Boolean(_) => Value::Bool(json.as_bool().expect("bool input")),
        InputKind::String(_) | InputKind::Combo(_) => Value::String(json.as_str().expect("string input").to_string()),
        InputKind::Link(_) => Value::Tensor(tensor(json).expect("tensor input")),
    }
}

/// Runs one case; returns the worst absolute error over its tensor outputs.
async fn run_case(case: &Json, out: &Path) -> Result<f32, String> {
    let env = env().await;
    Ok(run_case_on(&env.runtime, &env.registry, case, out).await?.0)
}

/// Runs one case on `runtime`; returns the worst absolute error over its
/// tensor outputs and whether the node ran on the GPU.
pub async fn run_case_on(
    runtime: &kiln::plugins::PluginRuntime,
    registry: &kiln::plugins::NodeRegistry,
    case: &Json,
    out: &Path,
) -> Result<(f32, bool), String> {
    let class = case["class_type"].as_str().ok_or("no class_type")?;
    let (plugin, def) = registry.get(class).ok_or(format!("{class} is not provided"))?;
    let given = case["inputs"].as_object().ok_or("no inputs")?;
    let mut inputs = Vec::new();
    for spec in def.required.iter().chain(&def.optional) {
        if let Some(v) = given.get(&spec.name) {
            inputs.push((spec.name.clone(), input_value(&spec.kind, v)));
        }
    }
    let io = NodeIo {
        inputs: Arc::new(NamedInputs::new()),
        outputs: Arc::new(DirOutputs::new(out, out.join("temp"))),
        signals: Arc::new(|_| {}),
        secrets: Default::default(),
        budget: kiln::budget::JobBudget::new(kiln::budget::JobLimits::UNLIMITED),
        cache_key: None,
    };
    let output = runtime.execute(plugin, class, &inputs, io, &Default::default()).await.map_err(|f| format!("{:?}: {}", f.kind, f.message))?;
    let expected = case["outputs"].as_array().ok_or("no outputs")?;
    if expected.len() != output.values.len() {
        return Err(format!("{} outputs, expected {}", output.values.len(), expected.len()));
    }
    let mut worst = 0.0f32;
    for (i, (got, want)) in output.values.iter().zip(expected).enumerate() {
        match got {
            Value::Tensor(t) => {
                let want = tensor(want).ok_or(format!("output {i}: expected a tensor"))?;
                if t.shape() != want.shape() {
                    return Err(format!("output {i}: shape {:?}, expected {:?}", t.shape(), want.shape()));
                }
                for (a, b) in t.data().unwrap().iter().zip(want.data().unwrap()) {
                    worst = worst.max((a - b).abs());
                }
            }
            Value::Int(v) if want.as_i64() == Some(*v) => {}
            Value::Float(v) if want.as_f64().is_some_and(|w| (w - v).abs() < 1e-9) => {}
            Value::Bool(v) if want.as_bool() == Some(*v) => {}
            Value::String(v) if want.as_str() == Some(v) => {}
            other => return Err(format!("output {i}: {other:?}, expected {want}")),
        }
    }
    Ok((worst, output.on_gpu))
}

#[tokio::test]
async fn core_nodes_match_reference_pixels() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/parity");
    let mut files: Vec<_> = std::fs::read_dir(&dir).expect("parity fixtures exist").filter_map(|e| e.ok()).map(|e| e.path()).collect();
    files.sort();
    let out = tempfile::tempdir().unwrap();
    let mut failures = Vec::new();
    let mut cases = 0;
    let mut classes = std::collections::BTreeSet::new();
    for file in files.iter().filter(|f| f.extension().is_some_and(|e| e == "json")) {
        let fixture: Json = serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
        for case in fixture.as_array().expect("a fixture file is a list of cases") {
            cases += 1;
            let name = format!("{}/{}", case["class_type"].as_str().unwrap_or("?"), case["name"].as_str().unwrap_or("?"));
            classes.insert(case["class_type"].as_str().unwrap_or("?").to_string());
            let tolerance = case["tolerance"].as_f64().unwrap_or(1.0 / 255.0) as f32;
            match run_case(case, out.path()).await {
                Ok(worst) if worst <= tolerance + 1e-6 => {}
                Ok(worst) => failures.push(format!("{name}: max error {worst} > tolerance {tolerance}")),
                Err(e) => failures.push(format!("{name}: {e}")),
            }
        }
    }
    assert!(cases > 0, "no parity cases found in {}", dir.display());
    assert!(failures.is_empty(), "{} of {cases} parity cases failed:\n{}", failures.len(), failures.join("\n"));
    eprintln!("parity: {cases} cases over {} node classes passed", classes.len());
}
