//! Cancellation interrupts the running node at once (epoch interruption),
//! not only between nodes.

use std::time::Duration;

use kiln::executor::{Event, RunStatus};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::support::{RunOpts, run_workflow};

#[tokio::test]
async fn cancel_interrupts_a_running_node() {
    let out = tempfile::tempdir().unwrap();
    let cancel = CancellationToken::new();
    let mut opts = RunOpts::new(out.path());
    opts.cancel = cancel.clone();
    let trigger = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        trigger.cancel();
    });
    // The node would spin until its 2 s timeout; cancellation must stop it
    // first and report an interruption, not a timeout.
    let ran = run_workflow(json!({"5": {"class_type": "HostileInfiniteLoop", "inputs": {"trigger": 3}}}), opts).await;
    assert!(matches!(ran.outcome.status, RunStatus::Interrupted), "{:?}", ran.outcome.status);
    assert!(ran.events.iter().any(|e| matches!(e, Event::Executing { node, .. } if node == "5")), "the node was running");
    assert!(
        ran.events.iter().any(|e| matches!(e, Event::Interrupted { node: Some(n), .. } if n == "5")),
        "the interruption names the running node: {:?}",
        ran.events.last()
    );
}

#[tokio::test]
async fn a_failure_stops_the_other_branch() {
    let out = tempfile::tempdir().unwrap();
    // Two independent branches: one panics at once, the other spins. The run
    // fails with the panic, and the spinning node is stopped rather than
    // left to its timeout.
    let ran = run_workflow(
        json!({
            "1": {"class_type": "HostileInfiniteLoop", "inputs": {"trigger": 1}},
            "2": {"class_type": "HostilePanic", "inputs": {"trigger": 1}}
        }),
        RunOpts::new(out.path()),
    )
    .await;
    match ran.outcome.status {
        RunStatus::Failed { node, failure, .. } => {
            assert_eq!(node, "2");
            assert_eq!(failure.kind, kiln::plugins::FailureKind::Crashed);
        }
        other => panic!("{other:?}"),
    }
}
