//! Results are cached across runs by class, inputs and upstream keys: an
//! unchanged re-run runs nothing and writes no new files; changing an input
//! file's content re-runs what depends on it.

use kiln::executor::{Event, Executor, RunStatus};
use serde_json::json;

use crate::support::{RunOpts, env, run_with, write_png};

#[tokio::test]
async fn unchanged_rerun_is_served_from_cache_and_writes_nothing() {
    let env = env().await;
    // A private executor so other tests' runs do not share this cache.
    let executor = Executor::new(env.runtime.clone(), 64 << 20, 2);
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.png");
    write_png(&input, 4, 3, 3, &[10u8; 36]);
    let out = dir.path().join("out");
    let workflow = json!({
        "1": {"class_type": "LoadImage", "inputs": {"image": "in.png"}},
        "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
        "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "c"}},
        "4": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}}
    });
    let opts = || {
        let mut o = RunOpts::new(&out);
        o.inputs.insert("in.png", &input);
        o
    };
    let first = run_with(&executor, &env.registry, workflow.clone(), opts()).await;
    assert!(matches!(first.outcome.status, RunStatus::Succeeded), "{:?}", first.outcome.status);
    assert_eq!(first.outcome.executed, vec!["1", "2", "3"], "node 4 feeds no output and never runs");
    assert!(first.outcome.cached.is_empty());

    let second = run_with(&executor, &env.registry, workflow.clone(), opts()).await;
    assert!(second.outcome.executed.is_empty(), "nothing re-runs: {:?}", second.outcome.executed);
    assert_eq!(second.outcome.cached, vec!["1", "2", "3"]);
    assert!(second.events.iter().any(|e| matches!(e, Event::Cached { nodes, .. } if nodes.len() == 3)));
    let files: Vec<_> = std::fs::read_dir(&out).unwrap().filter_map(|e| e.ok()).filter(|e| e.path().is_file()).collect();
    assert_eq!(files.len(), 1, "no new files on an unchanged re-run");
    assert_eq!(first.outcome.outputs, second.outcome.outputs, "the cached output re-reports the same file");

    // Same file name, different content: LoadImage and everything after re-run.
    write_png(&input, 4, 3, 3, &[200u8; 36]);
    let third = run_with(&executor, &env.registry, workflow.clone(), opts()).await;
    assert_eq!(third.outcome.executed, vec!["1", "2", "3"]);

    // Changing only the save prefix re-runs only SaveImage.
    let mut renamed = workflow.clone();
    renamed["3"]["inputs"]["filename_prefix"] = json!("d");
    let fourth = run_with(&executor, &env.registry, renamed, opts()).await;
    assert_eq!(fourth.outcome.executed, vec!["3"]);
    assert_eq!(fourth.outcome.cached, vec!["1", "2"]);
}

#[tokio::test]
async fn the_node_id_is_not_part_of_the_key() {
    let env = env().await;
    let executor = Executor::new(env.runtime.clone(), 64 << 20, 2);
    let out = tempfile::tempdir().unwrap();
    let empty = json!({"class_type": "EmptyImage", "inputs": {"width": 4, "height": 4, "batch_size": 1, "color": 0}});
    let first = run_with(
        &executor,
        &env.registry,
        json!({"1": empty, "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "a"}}}),
        RunOpts::new(out.path()),
    )
    .await;
    assert_eq!(first.outcome.executed, vec!["1", "2"]);
    // The same nodes under other ids are the same computation.
    let second = run_with(
        &executor,
        &env.registry,
        json!({"70": empty, "80": {"class_type": "SaveImage", "inputs": {"images": ["70", 0], "filename_prefix": "a"}}}),
        RunOpts::new(out.path()),
    )
    .await;
    assert!(matches!(second.outcome.status, RunStatus::Succeeded));
    assert_eq!(second.outcome.cached, vec!["70", "80"]);
    assert!(second.outcome.executed.is_empty());
}
