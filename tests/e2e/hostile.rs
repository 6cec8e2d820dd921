//! Hostile plugins are contained: each misbehaviour fails its node with the
//! right failure kind, the node is named, and the host keeps serving.

use kiln::executor::{Event, RunStatus};
use kiln::plugins::FailureKind;
use serde_json::json;

use crate::support::{RunOpts, env, run_workflow};

async fn run_hostile(class: &str) -> (RunStatus, String) {
    let out = tempfile::tempdir().unwrap();
    let ran = run_workflow(json!({"7": {"class_type": class, "inputs": {"trigger": 1}}}), RunOpts::new(out.path())).await;
    let failed_event = ran.events.iter().any(|e| matches!(e, Event::Failed { node, .. } if node == "7"));
    if matches!(ran.outcome.status, RunStatus::Failed { .. }) {
        assert!(failed_event, "a failure is also published as an event");
    }
    (ran.outcome.status, ran.outcome.log)
}

/// Services for calling a node straight through the runtime: no inputs,
/// outputs into `out`, signals dropped.
fn node_io(out: &std::path::Path) -> kiln::plugins::NodeIo {
    kiln::plugins::NodeIo {
        inputs: std::sync::Arc::new(kiln::files::NamedInputs::new()),
        outputs: std::sync::Arc::new(kiln::files::DirOutputs::new(out, out)),
        signals: std::sync::Arc::new(|_| {}),
        secrets: Default::default(),
        budget: kiln::budget::JobBudget::new(kiln::budget::JobLimits::UNLIMITED),
        cache_key: None,
    }
}

fn expect_failure(status: RunStatus, kind: FailureKind, class: &str) -> String {
    match status {
        RunStatus::Failed { node, class_type, failure } => {
            assert_eq!((node.as_str(), class_type.as_str()), ("7", class), "the failure names the node and its class");
            assert_eq!(failure.kind, kind, "{class}: {}", failure.message);
            failure.message
        }
        other => panic!("{class} should fail with {kind:?}, got {other:?}"),
    }
}

#[tokio::test]
async fn infinite_loop_times_out() {
    let (status, _) = run_hostile("HostileInfiniteLoop").await;
    let message = expect_failure(status, FailureKind::Timeout, "HostileInfiniteLoop");
    assert!(message.contains("time limit"), "{message}");
}

#[tokio::test]
async fn guest_blocked_in_a_host_call_times_out() {
    let (status, _) = run_hostile("HostileSleeper").await;
    expect_failure(status, FailureKind::Timeout, "HostileSleeper");
}

#[tokio::test]
async fn memory_bomb_is_out_of_memory() {
    let (status, _) = run_hostile("HostileMemoryBomb").await;
    let message = expect_failure(status, FailureKind::OutOfMemory, "HostileMemoryBomb");
    assert!(message.contains("64 MiB"), "names the plugin's ceiling: {message}");
}

#[tokio::test]
async fn deep_recursion_is_a_contained_stack_overflow() {
    let (status, _) = run_hostile("HostileDeepRecursion").await;
    let message = expect_failure(status, FailureKind::Crashed, "HostileDeepRecursion");
    // Native stack overflow, or (Rust guests) the shadow stack in linear memory running out.
    assert!(message.contains("stack overflow") || message.contains("stack overflowed"), "{message}");
}

#[tokio::test]
async fn panic_is_a_crash_with_the_panic_message() {
    let (status, log) = run_hostile("HostilePanic").await;
    let message = expect_failure(status, FailureKind::Crashed, "HostilePanic");
    assert!(message.contains("hostile node panicked on purpose"), "{message}");
    assert!(log.contains("[7 HostilePanic]"), "the panic output is in the job log: {log}");
}

#[tokio::test]
async fn oversized_output_is_invalid_output() {
    let (status, _) = run_hostile("HostileOversizedOutput").await;
    let message = expect_failure(status, FailureKind::InvalidOutput, "HostileOversizedOutput");
    assert!(message.contains("tensor budget"), "{message}");
}

#[tokio::test]
async fn wrong_output_type_is_invalid_output() {
    let (status, _) = run_hostile("HostileWrongOutput").await;
    let message = expect_failure(status, FailureKind::InvalidOutput, "HostileWrongOutput");
    assert!(message.contains("must be IMAGE"), "{message}");
}

#[tokio::test]
async fn chatty_plugin_succeeds_with_a_bounded_log() {
    let (status, log) = run_hostile("HostileChatty").await;
    assert!(matches!(status, RunStatus::Succeeded), "{status:?}");
    assert!(log.trim_end().ends_with("line 19999 of noise from a chatty plugin"), "keeps the end of the log");
    assert!(!log.contains("line 0 of noise"), "sheds the beginning");
    assert!(log.contains("earlier bytes of output dropped"), "says it shed some");
    assert!(log.len() < 64 * 1024, "bounded: {} bytes", log.len());
}

#[tokio::test]
async fn plugin_sees_no_files_environment_or_network() {
    let out = tempfile::tempdir().unwrap();
    // Something a plugin must never see, set on the host.
    // SAFETY: tests in this binary do not read this variable concurrently.
    unsafe { std::env::set_var("KILN_TEST_SECRET", "hunter2") };
    let ran = run_workflow(json!({"7": {"class_type": "HostileSnoop", "inputs": {"trigger": 1}}}), RunOpts::new(out.path())).await;
    assert!(matches!(ran.outcome.status, RunStatus::Succeeded), "{:?}", ran.outcome.status);
    let env = env().await;
    // Re-run the node directly to read its report.
    let (plugin, _) = env.registry.get("HostileSnoop").unwrap();
    let io = node_io(out.path());
    let output = env.runtime.execute(plugin, "HostileSnoop", &[("trigger".into(), kiln::value::Value::Int(1))], io, &Default::default()).await.unwrap();
    match &output.values[0] {
        kiln::value::Value::String(report) => assert_eq!(report, "", "the plugin reached: {report}"),
        other => panic!("unexpected {other:?}"),
    }
}

/// Instance slots keep their pages resident between calls (reset in place
/// instead of unmapped, see `plugins::engine`): nothing a call writes may
/// reach the next call in the same slot.
#[tokio::test]
async fn no_call_sees_memory_an_earlier_call_wrote() {
    let env = env().await;
    let (plugin, _) = env.registry.get("HostileRemember").unwrap();
    let out = tempfile::tempdir().unwrap();
    for mark in 1..=8 {
        let inputs = [("trigger".into(), kiln::value::Value::Int(mark))];
        let output = env.runtime.execute(plugin, "HostileRemember", &inputs, node_io(out.path()), &Default::default()).await.unwrap();
        match output.values.as_slice() {
            [kiln::value::Value::Int(found)] => assert_eq!(*found, 0, "call {mark} found an earlier call's mark"),
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[tokio::test]
async fn host_keeps_working_after_hostile_nodes() {
    let _ = run_hostile("HostilePanic").await;
    let _ = run_hostile("HostileMemoryBomb").await;
    let out = tempfile::tempdir().unwrap();
    let ran = run_workflow(
        json!({
            "1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 255}},
            "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "after"}}
        }),
        RunOpts::new(out.path()),
    )
    .await;
    assert!(matches!(ran.outcome.status, RunStatus::Succeeded), "{:?}", ran.outcome.status);
    assert!(out.path().join("after_00001_.png").is_file());
}

/// A large but legitimate output (a 4096² RGB image, 201 MB) is not mistaken
/// for abuse: wasmtime's per-hostcall transfer cap (128 MiB by default) is
/// raised to the node's memory ceiling.
#[tokio::test]
async fn a_4096_square_image_crosses_the_boundary() {
    let out = tempfile::tempdir().unwrap();
    let ran = crate::support::run_workflow(
        serde_json::json!({
            "1": { "class_type": "EmptyImage", "inputs": { "width": 4096, "height": 4096, "batch_size": 1, "color": 0x102030 } },
            "2": { "class_type": "PreviewImage", "inputs": { "images": ["1", 0] } },
        }),
        crate::support::RunOpts::new(out.path()),
    )
    .await;
    assert!(matches!(ran.outcome.status, kiln::executor::RunStatus::Succeeded), "{:?}", ran.outcome.status);
}

/// Host kernels validate what a plugin passes: every bad call is refused with
/// an error the plugin sees (no trap, no panic, no allocation of the refused
/// result), and the node goes on.
#[tokio::test]
async fn host_kernels_refuse_bad_arguments() {
    let out = tempfile::tempdir().unwrap();
    let ran = run_workflow(json!({"7": {"class_type": "HostileKernelAbuse", "inputs": {"trigger": 1}}}), RunOpts::new(out.path())).await;
    assert!(matches!(ran.outcome.status, RunStatus::Succeeded), "{:?}", ran.outcome.status);
    let env = env().await;
    let (plugin, _) = env.registry.get("HostileKernelAbuse").unwrap();
    let io = node_io(out.path());
    let output = env.runtime.execute(plugin, "HostileKernelAbuse", &[("trigger".into(), kiln::value::Value::Int(1))], io, &Default::default()).await.unwrap();
    match &output.values[0] {
        kiln::value::Value::String(report) => assert_eq!(report, "", "the host accepted: {report}"),
        other => panic!("unexpected {other:?}"),
    }
}

/// Host code is not interrupted by epochs, so a kernel polls the node's
/// cancellation between bands: cancelling a node inside a long kernel ends it
/// as `interrupted` long before the kernel would have finished.
#[tokio::test]
async fn cancel_stops_a_host_kernel() {
    let env = env().await;
    let (plugin, _) = env.registry.get("HostileKernelHog").unwrap();
    let out = tempfile::tempdir().unwrap();
    let io = || node_io(out.path());
    let inputs = [("trigger".to_string(), kiln::value::Value::Int(1))];
    // How long the kernel takes when left alone (it must succeed).
    let started = std::time::Instant::now();
    let whole = env.runtime.execute(plugin, "HostileKernelHog", &inputs, io(), &Default::default()).await;
    let full = started.elapsed();
    assert!(whole.is_ok(), "{:?}", whole.err());
    // Cancelled a moment after it starts, from another thread (the kernel
    // occupies this test's only runtime thread).
    let cancel = tokio_util::sync::CancellationToken::new();
    let trigger = cancel.clone();
    std::thread::spawn(move || {
        std::thread::sleep(full / 10);
        trigger.cancel();
    });
    let started = std::time::Instant::now();
    let failure = env.runtime.execute(plugin, "HostileKernelHog", &inputs, io(), &cancel).await.expect_err("a cancelled node fails");
    let stopped = started.elapsed();
    assert_eq!(failure.kind, FailureKind::Interrupted, "{}", failure.message);
    assert!(stopped < full / 2, "the kernel ran on after the cancel: {stopped:?} of {full:?}");
}

/// More node calls at once than the instance pool has slots: each waits for
/// a slot, none fails. (A call used to give its slot's permit back before its
/// store — and the slot — were dropped, so a waiting call could instantiate
/// into a full pool: "maximum concurrent limit of N for component instances
/// reached", seen as `node_crashed` with 4 jobs on a 2-CPU server.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn more_calls_than_instance_slots_wait_instead_of_failing() {
    let config = kiln::config::Config { max_concurrency: 1, ..crate::support::test_config() };
    let runtime = std::sync::Arc::new(kiln::plugins::PluginRuntime::new(kiln::plugins::RuntimeConfig::from_config(&config).unwrap()).unwrap());
    let registry = kiln::plugins::NodeRegistry::load_all(&runtime, &[]).await.unwrap();
    let (plugin, _) = registry.get("PrimitiveInt").unwrap();
    let out = tempfile::tempdir().unwrap();
    let calls = (0..64).map(|i| {
        let (runtime, plugin, io) = (runtime.clone(), plugin.clone(), node_io(out.path()));
        tokio::spawn(async move { runtime.execute(&plugin, "PrimitiveInt", &[("value".into(), kiln::value::Value::Int(i))], io, &Default::default()).await })
    });
    for (i, call) in calls.collect::<Vec<_>>().into_iter().enumerate() {
        match call.await.unwrap() {
            Ok(output) => assert!(matches!(output.values.as_slice(), [kiln::value::Value::Int(v)] if *v == i as i64)),
            Err(failure) => panic!("call {i} failed: {failure:?}"),
        }
    }
}

/// FNV-1a, as `HostileSecretProbe` reports secrets.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf29ce484222325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100000001b3))
}

/// What `HostileSecretProbe` reports for a job carrying `key`.
pub fn secret_report(key: Option<&str>) -> String {
    let known = key.map_or("api_key_svc_org=none".to_string(), |k| format!("api_key_svc_org={}:{:016x}", k.len(), fnv1a(k.as_bytes())));
    format!("{known} something_else=none")
}

/// The partner key reaches a node only through a plugin that asked for it
/// and was granted it; a plugin asking without the operator's grant is
/// refused at load.
#[tokio::test]
async fn secrets_reach_only_the_plugins_granted_them() {
    let env = env().await;
    let out = tempfile::tempdir().unwrap();
    let probe = |secrets: kiln::plugins::JobSecrets, plugin: std::sync::Arc<kiln::plugins::Plugin>| {
        let io = kiln::plugins::NodeIo { secrets, ..node_io(out.path()) };
        let runtime = env.runtime.clone();
        async move {
            let output =
                runtime.execute(&plugin, "HostileSecretProbe", &[("trigger".into(), kiln::value::Value::Int(0))], io, &Default::default()).await.unwrap();
            match output.values.as_slice() {
                [kiln::value::Value::String(report)] => report.clone(),
                other => panic!("unexpected {other:?}"),
            }
        }
    };
    let (granted, _) = env.registry.get("HostileSecretProbe").unwrap();
    let job = kiln::plugins::JobSecrets::new(Some("k-123 partner".into()));
    assert_eq!(probe(job.clone(), granted.clone()).await, secret_report(Some("k-123 partner")));
    assert_eq!(probe(Default::default(), granted.clone()).await, secret_report(None));

    // The same component under a manifest that asks for nothing: granted
    // secrets or not, it reads none.
    let quiet = crate::support::HOSTILE_MANIFEST.split("[capabilities]").next().unwrap().to_string();
    let id = kiln::plugins::PluginId::Dir("/plugins/quiet".into());
    let loaded = env.runtime.load(id.clone(), kiln::plugins::Manifest::parse(&quiet).unwrap(), crate::support::HOSTILE_WASM).await.unwrap();
    assert_eq!(probe(job, std::sync::Arc::new(loaded)).await, secret_report(None));

    // A runtime whose operator granted no plugin secrets refuses it, and
    // says how to grant it.
    let config = kiln::config::Config { secret_plugins: Vec::new(), max_concurrency: 1, ..crate::support::test_config() };
    let runtime = kiln::plugins::PluginRuntime::new(kiln::plugins::RuntimeConfig::from_config(&config).unwrap()).unwrap();
    let manifest = kiln::plugins::Manifest::parse(crate::support::HOSTILE_MANIFEST).unwrap();
    let err = runtime.load(id, manifest, crate::support::HOSTILE_WASM).await.err().expect("refused without a grant");
    let message = err.to_string();
    assert!(message.contains("asks for secret `api_key_svc_org`") && message.contains(&crate::support::hostile_grant()), "{message}");
}

/// What `HostileClockProbe` reported: (wall clock, monotonic step in ns,
/// the rest: random bytes and a `RandomState`-keyed hash).
pub fn clock_report(report: &str) -> (std::time::Duration, u64, String) {
    let field = |name: &str| report.split(' ').find_map(|f| f.strip_prefix(name)).unwrap_or_else(|| panic!("no {name} in {report}"));
    let (secs, nanos) = field("wall=").split_once('.').unwrap();
    let wall = std::time::Duration::new(secs.parse().unwrap(), nanos.parse().unwrap());
    (wall, field("step=").parse().unwrap(), format!("{} {}", field("random="), field("keyed=")))
}

/// Runs `HostileClockProbe` (node "7") on `executor`, saving into `out`
/// (kept across runs: a cached output is served only while its file is
/// there): the outcome, and the report it saved when it ran (not when
/// served from the cache).
pub async fn run_clock_probe(
    executor: &kiln::executor::Executor,
    registry: &std::sync::Arc<kiln::plugins::NodeRegistry>,
    out: &std::path::Path,
) -> (kiln::executor::RunOutcome, Option<String>) {
    let workflow = json!({"7": {"class_type": "HostileClockProbe", "inputs": {"trigger": 1}}});
    let ran = crate::support::run_with(executor, registry, workflow, RunOpts::new(out)).await;
    assert!(matches!(ran.outcome.status, RunStatus::Succeeded), "{:?}", ran.outcome.status);
    let report = (!ran.outcome.executed.is_empty()).then(|| {
        let (_, files) = ran.outcome.outputs.iter().find(|(node, _)| node == "7").expect("the probe is an output");
        std::fs::read_to_string(&files[0].path).unwrap()
    });
    (ran.outcome, report)
}

/// By default a node sees a virtual wall clock, a stepping monotonic clock
/// and randomness seeded from its cache key: a re-run on a cold cache
/// computes the very bytes the cache holds, and the result is cached.
#[tokio::test]
async fn nodes_see_virtual_clocks_and_seeded_randomness() {
    let env = env().await;
    let fresh = || kiln::executor::Executor::new(env.runtime.clone(), 16 << 20, 2);
    let first = fresh();
    let out = tempfile::tempdir().unwrap();
    let (ran, report) = run_clock_probe(&first, &env.registry, out.path()).await;
    let report = report.expect("the first run executes the probe");
    let (wall, step, _) = clock_report(&report);
    assert_eq!(wall, kiln::plugins::determinism::VIRTUAL_WALL_CLOCK, "{report}");
    assert_eq!(step, kiln::plugins::determinism::MONOTONIC_STEP.as_nanos() as u64, "{report}");
    assert_eq!(ran.executed, ["7"]);

    let (again, _) = run_clock_probe(&first, &env.registry, out.path()).await;
    assert_eq!(again.cached, ["7"], "a deterministic node's result is reused");

    let (cold, report_cold) = run_clock_probe(&fresh(), &env.registry, out.path()).await;
    assert_eq!(cold.executed, ["7"]);
    assert_eq!(report_cold.as_deref(), Some(report.as_str()), "a re-run computes the same bytes");

    // Called outside a run (no cache key): seeded from class and inputs.
    let out = tempfile::tempdir().unwrap();
    let (plugin, _) = env.registry.get("HostileClockProbe").unwrap();
    let call = |trigger| {
        let inputs = [("trigger".to_string(), kiln::value::Value::Int(trigger))];
        let io = node_io(out.path());
        async move {
            match env.runtime.execute(plugin, "HostileClockProbe", &inputs, io, &Default::default()).await.unwrap().values.as_slice() {
                [kiln::value::Value::String(report)] => clock_report(report).2,
                other => panic!("unexpected {other:?}"),
            }
        }
    };
    assert_eq!(call(1).await, call(1).await);
    assert_ne!(call(1).await, call(2).await, "other inputs, other seed");
}
