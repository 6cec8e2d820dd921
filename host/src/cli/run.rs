//! `kiln run`: validate and run one workflow, with a progress bar on a
//! terminal and plain lines otherwise.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::embed::{Engine, EngineError, Run};
use crate::executor::{Event, RunStatus};
use crate::workflow::{ValidationError, Workflow, WorkflowLimits};

/// Arguments of `kiln run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// The workflow, in ComfyUI API format, or a bundle (`kiln pack`).
    pub workflow: PathBuf,
    /// Of a bundle with several workflows, the one to run.
    #[arg(long = "workflow", value_name = "NAME")]
    pub bundle_workflow: Option<String>,
    /// Makes the file at PATH available to LoadImage-style nodes as NAME
    /// (repeatable); of a bundle, replaces its default input NAME.
    #[arg(long = "input", value_name = "NAME=PATH", value_parser = parse_input)]
    pub inputs: Vec<(String, PathBuf)>,
    /// Where outputs go (previews go to DIR/temp).
    #[arg(long, default_value = "output", value_name = "DIR")]
    pub out: PathBuf,
    /// Plain progress lines even on a terminal.
    #[arg(long)]
    pub no_progress_bar: bool,
    /// After the run, print one line per executed node on stderr: node id,
    /// class, where it ran (`cpu` or `gpu`) and milliseconds.
    #[arg(long)]
    pub timings: bool,
}

/// One executed node, for `--timings`.
struct Timing {
    node: String,
    class_type: String,
    on_gpu: bool,
    elapsed_ms: f64,
}

pub(super) fn parse_input(s: &str) -> Result<(String, PathBuf), String> {
    let (name, path) = s.split_once('=').ok_or("expected NAME=PATH")?;
    if name.is_empty() || path.is_empty() {
        return Err("expected NAME=PATH".into());
    }
    Ok((name.to_string(), PathBuf::from(path)))
}

/// Exit code for validation errors.
pub(super) const EXIT_INVALID: i32 = 2;
/// Exit code for an interrupted run.
const EXIT_INTERRUPTED: i32 = 130;

/// Decommit batch of a one-shot run (see `Config::decommit_batch`).
const RUN_DECOMMIT_BATCH: usize = 16;

pub async fn run(mut config: Config, args: RunArgs) -> anyhow::Result<i32> {
    if config.decommit_batch == Config::default().decommit_batch {
        config.decommit_batch = RUN_DECOMMIT_BATCH;
    }
    let source = if is_bundle(&args.workflow) {
        Source::Bundle(super::bundle::read_bundle(&args.workflow, &config)?)
    } else {
        anyhow::ensure!(args.bundle_workflow.is_none(), "--workflow picks a workflow of a bundle; {} is a workflow", args.workflow.display());
        let Some(json) = read_workflow(&args.workflow, &WorkflowLimits::from_config(&config))? else { return Ok(EXIT_INVALID) };
        Source::Workflow(json)
    };
    let mut run = Run::new(&args.out);
    for (name, path) in &args.inputs {
        anyhow::ensure!(path.is_file(), "--input {name}: {} is not a file", path.display());
        run = run.input(name.clone(), path.clone());
    }
    let engine = Engine::new(config).await?;
    let cancel = CancellationToken::new();
    let ctrl_c = cancel.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            ctrl_c.cancel();
        }
    });
    let bar = (!args.no_progress_bar && std::io::stderr().is_terminal()).then(|| {
        let bar = ProgressBar::new(1000);
        bar.set_style(
            ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:40} {percent:>3}% {msg}").unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar
    });
    let timings = Arc::new(parking_lot::Mutex::new(Vec::<Timing>::new()));
    let events = {
        let (bar, timings) = (bar.clone(), timings.clone());
        move |event: Event| {
            if let Event::Executed { node, class_type, elapsed_ms, on_gpu, .. } = &event {
                timings.lock().push(Timing { node: node.clone(), class_type: class_type.clone(), on_gpu: *on_gpu, elapsed_ms: *elapsed_ms });
            }
            report(&bar, &event)
        }
    };
    let run = run.on_event(events).cancel_with(cancel);
    let outcome = match &source {
        Source::Workflow(json) => engine.run(json, run).await,
        Source::Bundle(bundle) => engine.run_bundle(bundle, args.bundle_workflow.as_deref(), run).await,
    };
    let outcome = match outcome {
        Ok(outcome) => outcome,
        Err(EngineError::Invalid(e)) => {
            print_validation(&e);
            return Ok(EXIT_INVALID);
        }
        Err(e) => return Err(e.into()),
    };
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    if !outcome.log.is_empty() {
        eprint!("{}", outcome.log);
    }
    if args.timings {
        for t in timings.lock().iter() {
            eprintln!("timing {} {} {} {:.1} ms", t.node, t.class_type, if t.on_gpu { "gpu" } else { "cpu" }, t.elapsed_ms);
        }
    }
    finish(outcome)
}

/// What `kiln run` runs.
enum Source {
    Workflow(serde_json::Value),
    Bundle(crate::bundle::Bundle),
}

/// Whether `path` is a bundle: it starts as gzip does (a workflow is JSON).
fn is_bundle(path: &std::path::Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 2];
    std::fs::File::open(path).and_then(|mut f| f.read_exact(&mut magic)).is_ok() && magic == [0x1f, 0x8b]
}

/// The workflow file as JSON (a `/prompt` request body too) and parsed;
/// `None` (exit 2, said why) when it is over the size limit or does not
/// parse as a workflow. Its size is checked before it is read: a workflow
/// is bounded here as on the API (`max_workflow_kb`).
pub(super) fn read_workflow(path: &std::path::Path, limits: &WorkflowLimits) -> anyhow::Result<Option<serde_json::Value>> {
    let size = std::fs::metadata(path).with_context(|| format!("reading {}", path.display()))?.len();
    if let Err(e) = limits.check_size(usize::try_from(size).unwrap_or(usize::MAX)) {
        eprintln!("error: {e}");
        return Ok(None);
    }
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut json: serde_json::Value = serde_json::from_str(&text).with_context(|| format!("{} is not valid JSON", path.display()))?;
    if let Some(prompt) = json.get("prompt").filter(|p| p.is_object()) {
        json = prompt.clone();
    }
    // Parsed here too, so a malformed file fails before plugins load.
    match Workflow::from_json(&json, limits) {
        Ok(_) => Ok(Some(json)),
        Err(e) => {
            eprintln!("error: {e}");
            Ok(None)
        }
    }
}

/// Prints how the run ended; the exit code.
fn finish(outcome: crate::executor::RunOutcome) -> anyhow::Result<i32> {
    match outcome.status {
        RunStatus::Succeeded => {
            for (_, files) in &outcome.outputs {
                for f in files {
                    println!("{}", f.path.display());
                }
            }
            Ok(0)
        }
        RunStatus::Failed { node, class_type, failure } => {
            eprintln!("error: node {node} ({class_type}) failed [{}]: {}", serde_json::to_value(failure.kind)?.as_str().unwrap_or("failed"), failure.message);
            Ok(1)
        }
        RunStatus::Interrupted => {
            eprintln!("interrupted");
            Ok(EXIT_INTERRUPTED)
        }
    }
}

fn report(bar: &Option<ProgressBar>, event: &Event) {
    match (bar, event) {
        (Some(bar), Event::Executing { node, class_type }) => bar.set_message(format!("{node} {class_type}")),
        (Some(bar), Event::Progress { overall, .. }) => bar.set_position((overall * 1000.0) as u64),
        (Some(_), _) => {}
        (None, Event::Cached { nodes, .. }) if !nodes.is_empty() => eprintln!("cached: {}", nodes.join(", ")),
        (None, Event::Executing { node, class_type }) => eprintln!("executing {node} ({class_type})"),
        (None, Event::Executed { node, elapsed_ms, .. }) => eprintln!("done {node} in {elapsed_ms:.1} ms"),
        (None, _) => {}
    }
}

/// Prints validation errors, one line per node input.
pub fn print_validation(e: &ValidationError) {
    match e {
        ValidationError::OutputsFailed(issues) => {
            eprintln!("error: the workflow is invalid:");
            for i in issues {
                let class = i.class_type.as_deref().unwrap_or("?");
                let input = i.input.as_deref().map(|n| format!(", input `{n}`")).unwrap_or_default();
                eprintln!("  node {} ({class}){input}: {} [{}]", i.node_id, i.message, i.kind.comfy_type());
            }
        }
        other => eprintln!("error: the workflow is invalid: {other}"),
    }
}
