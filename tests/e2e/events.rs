//! The event stream: order, host-computed progress weighted by node count and
//! by the steps nodes report, and outputs as they are saved.

use kiln::executor::{Event, RunStatus};
use serde_json::json;

use crate::support::{RunOpts, run_workflow};

#[tokio::test]
async fn events_follow_the_run_and_progress_is_weighted() {
    let out = tempfile::tempdir().unwrap();
    let ran = run_workflow(
        json!({
            "1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 2, "color": 0x102030}},
            "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
            "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "ev"}}
        }),
        RunOpts::new(out.path()),
    )
    .await;
    assert!(matches!(ran.outcome.status, RunStatus::Succeeded));
    assert!(matches!(ran.events.first(), Some(Event::Started { .. })));
    assert!(matches!(ran.events.last(), Some(Event::Succeeded { .. })));
    let executing: Vec<&str> = ran.events.iter().filter_map(|e| if let Event::Executing { node, .. } = e { Some(node.as_str()) } else { None }).collect();
    assert_eq!(executing, vec!["1", "2", "3"], "dependency order");

    let progress: Vec<(String, u64, u64, f64)> = ran
        .events
        .iter()
        .filter_map(|e| if let Event::Progress { node, step, steps, overall } = e { Some((node.clone(), *step, *steps, *overall)) } else { None })
        .collect();
    assert!(progress.windows(2).all(|w| w[0].3 <= w[1].3), "overall progress never goes back: {progress:?}");
    assert_eq!(progress.last().map(|p| p.3), Some(1.0));
    // SaveImage reports one step per image: half-way through it the run is
    // (2 done + 0.5) of 3 nodes.
    let half = progress.iter().find(|p| p.0 == "3" && p.1 == 1 && p.2 == 2).expect("SaveImage reports its steps");
    assert!((half.3 - 2.5 / 3.0).abs() < 1e-9, "{half:?}");

    let output =
        ran.events.iter().find_map(|e| if let Event::Output { node, files, cached, .. } = e { Some((node.clone(), files.len(), *cached)) } else { None });
    assert_eq!(output, Some(("3".to_string(), 2, false)));
    let done_at = ran.events.iter().position(|e| matches!(e, Event::Executed { node, .. } if node == "3")).unwrap();
    let output_at = ran.events.iter().position(|e| matches!(e, Event::Output { .. })).unwrap();
    assert!(output_at < done_at, "the output is published when the node finishes");
}
