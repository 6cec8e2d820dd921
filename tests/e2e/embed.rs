//! The embedding API (`kiln::Engine`, `kiln::embed::Run`): a run with named
//! inputs reports its events and saves its files; an invalid workflow is
//! refused before anything runs, naming the node; a cancellation token
//! interrupts a running workflow.

use std::sync::{Arc, Mutex};

use kiln::embed::{EngineError, Run};
use kiln::executor::{Event, RunStatus};
use kiln::workflow::ValidationError;
use serde_json::json;

use crate::support::test_config;

async fn engine() -> kiln::Engine {
    kiln::Engine::new(test_config()).await.expect("the engine starts")
}

#[tokio::test]
async fn a_run_reports_its_events_and_saves_its_files() {
    let engine = engine().await;
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.png");
    image::RgbImage::from_pixel(4, 3, image::Rgb([10, 20, 30])).save(&input).unwrap();
    let workflow = json!({
        "1": {"class_type": "LoadImage", "inputs": {"image": "photo.png"}},
        "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
        "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "embedded"}}
    });
    let events = Arc::new(Mutex::new(Vec::new()));
    let sink = events.clone();
    let run = Run::new(dir.path().join("out")).input("photo.png", &input).on_event(move |e| sink.lock().unwrap().push(e));
    let outcome = engine.run(&workflow, run).await.expect("it runs");
    assert!(matches!(outcome.status, RunStatus::Succeeded), "{:?}", outcome.status);
    let saved: Vec<_> = outcome.outputs.iter().flat_map(|(_, files)| files).collect();
    assert_eq!(saved.len(), 1);
    let png = image::open(&saved[0].path).unwrap().into_rgb8();
    assert_eq!(png.get_pixel(0, 0).0, [245, 235, 225]);
    let events = events.lock().unwrap();
    let executed: Vec<&str> = events.iter().filter_map(|e| if let Event::Executed { node, .. } = e { Some(node.as_str()) } else { None }).collect();
    assert_eq!(executed, ["1", "2", "3"]);
    assert!(events.iter().any(|e| matches!(e, Event::Progress { overall, .. } if *overall == 1.0)));
}

#[tokio::test]
async fn an_invalid_workflow_is_refused_before_it_runs() {
    let engine = engine().await;
    let dir = tempfile::tempdir().unwrap();
    let workflow = json!({
        "1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 0}},
        "2": {"class_type": "SaveImage", "inputs": {"images": ["9", 0], "filename_prefix": "x"}}
    });
    match engine.run(&workflow, Run::new(dir.path())).await {
        Err(EngineError::Invalid(ValidationError::OutputsFailed(issues))) => {
            assert!(issues.iter().any(|i| i.node_id == "2" && i.input.as_deref() == Some("images") && i.message.contains('9')), "{issues:?}")
        }
        other => panic!("expected a validation error, got {other:?}"),
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "nothing ran");
}

#[tokio::test]
async fn a_cancellation_token_interrupts_the_run() {
    let engine = engine().await;
    let dir = tempfile::tempdir().unwrap();
    let mut workflow = serde_json::Map::new();
    workflow.insert("0".into(), json!({"class_type": "EmptyImage", "inputs": {"width": 2048, "height": 2048, "batch_size": 1, "color": 1}}));
    for i in 1..=40 {
        workflow.insert(i.to_string(), json!({"class_type": "ImageBlur", "inputs": {"image": [(i - 1).to_string(), 0], "blur_radius": 31, "sigma": 10.0}}));
    }
    workflow.insert("s".into(), json!({"class_type": "SaveImage", "inputs": {"images": ["40", 0], "filename_prefix": "never"}}));
    let cancel = tokio_util::sync::CancellationToken::new();
    let trigger = cancel.clone();
    // Cancelled as soon as the first blur starts.
    let run = Run::new(dir.path()).cancel_with(cancel).on_event(move |e| {
        if let Event::Executing { class_type, .. } = e
            && class_type == "ImageBlur"
        {
            trigger.cancel();
        }
    });
    let outcome = engine.run(&serde_json::Value::Object(workflow), run).await.expect("it starts");
    assert!(matches!(outcome.status, RunStatus::Interrupted), "{:?}", outcome.status);
    assert!(outcome.executed.len() < 5, "{:?}", outcome.executed);
}
