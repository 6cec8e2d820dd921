//! The workflows in `examples/workflows/` run as shipped.

use kiln::executor::RunStatus;
use serde_json::Value;

use crate::support::{RunOpts, read_png, run_workflow, write_png};

fn example(name: &str) -> Value {
    let path = format!("{}/../examples/workflows/{name}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

#[tokio::test]
async fn invert_chain_of_200_runs_and_inverts_an_even_number_of_times() {
    let out = tempfile::tempdir().unwrap();
    let ran = run_workflow(example("invert-chain-200.json"), RunOpts::new(out.path())).await;
    assert!(matches!(ran.outcome.status, RunStatus::Succeeded), "{:?}", ran.outcome.status);
    assert_eq!(ran.outcome.executed.len() + ran.outcome.cached.len(), 202);
    let (w, h, _, px, _) = read_png(&out.path().join("chain200_00001_.png"));
    assert_eq!((w, h), (64, 64));
    // 200 inversions of 0x336699 give it back, up to SaveImage's truncation.
    assert!(px[0].abs_diff(0x33) <= 1 && px[1].abs_diff(0x66) <= 1 && px[2].abs_diff(0x99) <= 1, "{:?}", &px[..3]);
}

#[tokio::test]
async fn mask_workflow_runs() {
    let out = tempfile::tempdir().unwrap();
    let ran = run_workflow(example("mask-composite.json"), RunOpts::new(out.path())).await;
    assert!(matches!(ran.outcome.status, RunStatus::Succeeded), "{:?}", ran.outcome.status);
    let (w, h, _, mask, _) = read_png(&out.path().join("mask/mask_00001_.png"));
    assert_eq!((w, h), (256, 192));
    let at = |x: usize, y: usize| mask[(y * 256 + x) * 3];
    assert_eq!(at(128, 96), 255, "inside the composited square");
    assert_eq!(at(5, 5), 0, "outside it");
    assert!(out.path().join("mask/composite_00001_.png").is_file());
}

#[tokio::test]
async fn heavy_chain_runs_on_a_small_input() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.png");
    let px: Vec<u8> = (0..96 * 64 * 3).map(|i| (i * 7 % 251) as u8).collect();
    write_png(&input, 96, 64, 3, &px);
    let out = dir.path().join("out");
    let mut opts = RunOpts::new(&out);
    opts.inputs.insert("input.png", &input);
    let ran = run_workflow(example("heavy-chain.json"), opts).await;
    assert!(matches!(ran.outcome.status, RunStatus::Succeeded), "{:?}", ran.outcome.status);
    let (w, h, _, _, _) = read_png(&out.join("heavy_00001_.png"));
    assert_eq!((w, h), (144, 96), "scaled by 1.5");
}
