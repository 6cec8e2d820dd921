//! A workflow run in-process through kiln's embedding API: every node in its
//! sandbox, progress as it goes, the saved files at the end.
//! `cargo run -p kiln --example run_workflow`
use kiln::executor::{Event, RunStatus};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let engine = kiln::Engine::new(kiln::Config::default()).await?;
    let workflow = serde_json::json!({
        "1": {"class_type": "EmptyImage", "inputs": {"width": 64, "height": 64, "batch_size": 1, "color": 0x3366cc}},
        "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
        "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "inverted"}}
    });
    let run = kiln::embed::Run::new(std::env::temp_dir().join("kiln-example")).on_event(|event| {
        if let Event::Executed { node, class_type, elapsed_ms, .. } = event {
            println!("{node} {class_type}: {elapsed_ms:.1} ms");
        }
    });
    let outcome = engine.run(&workflow, run).await?;
    let RunStatus::Succeeded = outcome.status else { return Err(format!("the run did not succeed: {:?}", outcome.status).into()) };
    outcome.outputs.iter().flat_map(|(_, files)| files).for_each(|file| println!("saved {}", file.path.display()));
    Ok(())
}
