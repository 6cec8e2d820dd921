//! Containment of what a workflow can ask of the host, at the engine level:
//! graph size and depth, memory per job, saved files per node and per job,
//! and the run's own bookkeeping (progress, missing classes, stale cache).
//! The same classes are tried against the real binary in `host/tests/hostile.rs`.

use std::sync::Arc;

use kiln::budget::{JobBudget, JobLimits};
use kiln::executor::{Event, RunStatus};
use kiln::files::NamedInputs;
use kiln::plugins::FailureKind;
use kiln::workflow::{IssueKind, Plan, PlannedNode, ValidationError, Workflow, WorkflowLimits, validate};
use serde_json::{Map, Value, json};

use crate::shapes::{self, invert_chain};
use crate::support::{RunOpts, env, run_workflow};

const MIB: u64 = 1 << 20;

#[tokio::test]
async fn a_long_cycle_is_reported_as_a_cycle() {
    let registry = env().await.registry.clone();
    // 50,000 inverts in a ring, read by an output: a cycle check that
    // scanned the current path per link would take ~10⁹ steps here.
    let n = 50_000;
    let mut wf = Map::new();
    for i in 0..n {
        let from = if i == 0 { n - 1 } else { i - 1 };
        wf.insert(i.to_string(), json!({ "class_type": "ImageInvert", "inputs": { "image": [from.to_string(), 0] } }));
    }
    wf.insert("out".into(), json!({ "class_type": "PreviewImage", "inputs": { "images": ["7", 0] } }));
    let limits = WorkflowLimits { max_nodes: 100_000, ..WorkflowLimits::default() };
    let issues = std::thread::Builder::new()
        .stack_size(256 << 10)
        .spawn(move || match validate(&Workflow::from_json(&Value::Object(wf), &limits).unwrap(), &registry, &NamedInputs::new()) {
            Err(ValidationError::OutputsFailed(issues)) => issues,
            other => panic!("a cycle must fail validation: {:?}", other.map(|(p, _)| p.nodes.len())),
        })
        .unwrap()
        .join()
        .unwrap();
    let cycle: Vec<_> = issues.iter().filter(|i| i.kind == IssueKind::DependencyCycle).collect();
    assert_eq!(cycle.len(), 1, "{:?}", issues.iter().map(|i| &i.message).collect::<Vec<_>>());
    assert_eq!(cycle[0].dependent_outputs, ["out"]);
}

/// 512² source, branches of 1024² (12 MiB) big images.
fn wide_tree(leaves: usize) -> Value {
    shapes::wide_tree(leaves, 512, 2.0)
}

fn limited(memory_mb: u64) -> Arc<JobBudget> {
    JobBudget::new(JobLimits { memory_bytes: memory_mb * MIB, ..JobLimits::UNLIMITED })
}

#[tokio::test]
async fn a_wide_graph_runs_branch_by_branch_within_the_job_memory_limit() {
    // Each `big` is 1024²×3 f32 = 12 MiB: all 16 at once would be 192 MiB.
    // Under a 64 MiB limit the scheduler finishes a branch (big → small)
    // before it starts the next, and starts a second one only while the
    // job holds under half its limit.
    let out = tempfile::tempdir().unwrap();
    let budget = limited(64);
    let ran = run_workflow(wide_tree(16), RunOpts { budget: budget.clone(), ..RunOpts::new(out.path()) }).await;
    assert!(matches!(ran.outcome.status, RunStatus::Succeeded), "{:?}", ran.outcome.status);
    let peak = budget.peak_memory();
    assert!(peak <= 64 * MIB, "never above the bound: {} MiB", peak / MIB);
    assert!(peak >= 12 * MIB, "the account saw the big tensors: {} MiB", peak / MIB);
    assert_eq!(budget.memory_in_use(), 0, "everything given back after the run");
}

#[tokio::test]
async fn a_job_over_its_memory_limit_fails_with_a_clear_out_of_memory_error() {
    let out = tempfile::tempdir().unwrap();
    // 12 MiB tensors cannot fit a 10 MiB job.
    let ran = run_workflow(wide_tree(2), RunOpts { budget: limited(10), ..RunOpts::new(out.path()) }).await;
    match ran.outcome.status {
        RunStatus::Failed { failure, .. } => {
            assert_eq!(failure.kind, FailureKind::JobOutOfMemory, "{}", failure.message);
            assert!(failure.message.contains("job_memory_mb") && failure.message.contains("10 MiB"), "{}", failure.message);
        }
        other => panic!("expected out of memory, got {other:?}"),
    }
}

#[tokio::test]
async fn a_long_chain_holds_a_few_results_not_all() {
    // 40 inverts of a 512² image (3 MiB each): holding every result would
    // be 120 MiB; each is dropped once its one reader has started.
    let out = tempfile::tempdir().unwrap();
    let budget = limited(4096);
    let ran = run_workflow(Value::Object(invert_chain(40, 512)), RunOpts { budget: budget.clone(), ..RunOpts::new(out.path()) }).await;
    assert!(matches!(ran.outcome.status, RunStatus::Succeeded), "{:?}", ran.outcome.status);
    let peak = budget.peak_memory();
    assert!(peak < 40 * MIB, "peak {} MiB: results must not pile up", peak / MIB);
}

fn save(prefix: &str, batch: u32) -> Value {
    json!({
        "1": { "class_type": "EmptyImage", "inputs": { "width": 4, "height": 4, "batch_size": batch, "color": 0 } },
        "2": { "class_type": "SaveImage", "inputs": { "images": ["1", 0], "filename_prefix": prefix } }
    })
}

fn failure_of(status: RunStatus) -> kiln::plugins::NodeFailure {
    match status {
        RunStatus::Failed { failure, node, .. } => {
            assert_eq!(node, "2");
            failure
        }
        other => panic!("expected a failure, got {other:?}"),
    }
}

#[tokio::test]
async fn a_huge_filename_prefix_is_a_node_error_not_memory_growth() {
    let out = tempfile::tempdir().unwrap();
    let prefix = "p".repeat(1 << 20);
    let ran = run_workflow(save(&prefix, 4), RunOpts::new(out.path())).await;
    let failure = failure_of(ran.outcome.status);
    assert!(failure.message.contains("prefix too long") && failure.message.len() < 512, "{}", &failure.message[..failure.message.len().min(300)]);
    assert!(std::fs::read_dir(out.path()).map_or(0, |d| d.count()) == 0, "nothing was written");
}

#[tokio::test]
async fn saved_files_are_bounded_per_job() {
    let out = tempfile::tempdir().unwrap();
    let budget = JobBudget::new(JobLimits { max_files: 10, ..JobLimits::UNLIMITED });
    let ran = run_workflow(save("many", 64), RunOpts { budget, ..RunOpts::new(out.path()) }).await;
    let failure = failure_of(ran.outcome.status);
    assert!(failure.message.contains("job_max_files"), "{}", failure.message);
    let written = std::fs::read_dir(out.path()).unwrap().count();
    assert_eq!(written, 10, "the first ten were saved, no more");
}

#[tokio::test]
async fn progress_only_grows_when_parallel_branches_join() {
    let out = tempfile::tempdir().unwrap();
    let ran = run_workflow(wide_tree(8), RunOpts::new(out.path())).await;
    assert!(matches!(ran.outcome.status, RunStatus::Succeeded));
    let values: Vec<f64> = ran.events.iter().filter_map(|e| if let Event::Progress { overall, .. } = e { Some(*overall) } else { None }).collect();
    assert!(values.len() >= 8, "{values:?}");
    assert!(values.windows(2).all(|w| w[0] <= w[1]), "never goes back: {values:?}");
    assert_eq!(values.last(), Some(&1.0));
}

#[tokio::test]
async fn a_planned_node_without_a_provider_fails_the_run() {
    let env = env().await;
    let out = tempfile::tempdir().unwrap();
    // Validation refuses unknown classes, so build the plan by hand.
    let plan = Plan::new(vec![PlannedNode { id: "1".into(), class_type: "NoSuchClass".into(), inputs: vec![] }], vec!["1".into()]);
    let ctx = kiln::executor::RunContext {
        job_id: "missing".into(),
        registry: env.registry.clone(),
        prompt: Arc::from("{}"),
        extra_pnginfo: None,
        inputs: Arc::new(NamedInputs::new()),
        outputs: Arc::new(kiln::files::DirOutputs::new(out.path(), out.path())),
        events: Arc::new(|_| {}),
        cancel: Default::default(),
        secrets: Default::default(),
        branches: None,
        budget: JobBudget::new(JobLimits::UNLIMITED),
        cache_scope: String::new(),
        funds: None,
    };
    match env.executor.run(&plan, ctx).await.status {
        RunStatus::Failed { node, failure, .. } => {
            assert_eq!(node, "1");
            assert!(failure.message.contains("NoSuchClass"), "{}", failure.message);
        }
        other => panic!("must not succeed: {other:?}"),
    }
}

#[tokio::test]
async fn a_cached_output_whose_file_is_gone_runs_again() {
    let out = tempfile::tempdir().unwrap();
    let wf = save("gone-then-back", 1);
    let first = run_workflow(wf.clone(), RunOpts::new(out.path())).await;
    assert!(matches!(first.outcome.status, RunStatus::Succeeded));
    let file = out.path().join("gone-then-back_00001_.png");
    assert!(file.is_file());
    // Unchanged re-run: served from the cache, nothing executes.
    let cached = run_workflow(wf.clone(), RunOpts::new(out.path())).await;
    assert!(cached.outcome.executed.is_empty(), "{:?}", cached.outcome.executed);
    // The file is removed behind the cache's back (as blob collection
    // would): the hit is refused and the node runs and saves again.
    std::fs::remove_file(&file).unwrap();
    let again = run_workflow(wf, RunOpts::new(out.path())).await;
    assert!(again.outcome.executed.contains(&"2".to_string()), "{:?}", again.outcome.executed);
    let saved = &again.outcome.outputs[0].1[0];
    assert!(saved.path.is_file(), "the output named exists: {}", saved.path.display());
}
