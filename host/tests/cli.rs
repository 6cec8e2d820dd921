//! `kiln run` as a process: real binary, real files, exit codes.

use std::path::Path;
use std::process::Command;

mod common;
use common::slow_to_compile;

fn kiln(args: &[&str], cwd: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .current_dir(cwd)
        .env("KILN_CACHE_DIR", Path::new(env!("CARGO_TARGET_TMPDIR")).join("kiln-artifacts"))
        .output()
        .expect("kiln runs")
}

#[test]
fn runs_a_workflow_with_an_input_and_prints_outputs() {
    let dir = tempfile::tempdir().unwrap();
    let workflow = dir.path().join("wf.json");
    std::fs::write(
        &workflow,
        r#"{"1": {"class_type": "EmptyImage", "inputs": {"width": 16, "height": 8, "batch_size": 2, "color": 255}},
            "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
            "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "run/x"}}}"#,
    )
    .unwrap();
    let out = kiln(&["run", "wf.json", "--out", "results"], dir.path());
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let printed: Vec<&str> = stdout.lines().collect();
    assert_eq!(printed, vec!["results/run/x_00001_.png", "results/run/x_00002_.png"], "one file per batch image");
    assert!(dir.path().join("results/run/x_00002_.png").is_file());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("executing 2 (ImageInvert)"), "plain progress lines off a terminal: {stderr}");

    // The saved image becomes the input of a second run.
    std::fs::write(
        dir.path().join("wf2.json"),
        r#"{"1": {"class_type": "LoadImage", "inputs": {"image": "pic.png"}},
            "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "again"}}}"#,
    )
    .unwrap();
    let out = kiln(&["run", "wf2.json", "--input", "pic.png=results/run/x_00001_.png", "--out", "results"], dir.path());
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    assert!(dir.path().join("results/again_00001_.png").is_file());
}

#[test]
fn invalid_workflow_prints_errors_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("bad.json"),
        r#"{"1": {"class_type": "EmptyImage", "inputs": {"width": 0, "height": 8, "batch_size": 1, "color": 0}},
            "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "bad"}}}"#,
    )
    .unwrap();
    let out = kiln(&["run", "bad.json", "--out", "results"], dir.path());
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("node 1 (EmptyImage), input `width`"), "names node, class and input: {stderr}");
    assert!(stderr.contains("value_smaller_than_min"), "{stderr}");
    assert!(!dir.path().join("results").exists(), "no outputs written");

    std::fs::write(dir.path().join("ui.json"), r#"{"nodes": [], "links": []}"#).unwrap();
    let out = kiln(&["run", "ui.json"], dir.path());
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("UI-format"));
}

#[test]
fn a_failing_node_exits_non_zero_with_its_error() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("evil.png"), b"not an image at all").unwrap();
    std::fs::write(
        dir.path().join("wf.json"),
        r#"{"1": {"class_type": "LoadImage", "inputs": {"image": "evil.png"}},
            "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "e"}}}"#,
    )
    .unwrap();
    let out = kiln(&["run", "wf.json", "--input", "evil.png=evil.png"], dir.path());
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("node 1 (LoadImage) failed [failed]"), "{stderr}");
}

/// A plugin whose component would take the compiler most of a minute does
/// not stall start-up: the compiler child is killed at `compile_timeout_s`
/// and `kiln run` and `kiln serve` fail at once, naming the plugin and the
/// limit. (The bundled plugins compile within it: their artifacts are
/// cached first, as a server's would be.)
#[test]
fn a_plugin_too_slow_to_compile_fails_start_up_at_the_compile_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let plugin = dir.path().join("plugins/slow");
    std::fs::create_dir_all(&plugin).unwrap();
    std::fs::write(plugin.join("kiln-plugin.toml"), "name = \"slow\"\nversion = \"1\"\ncomponent = \"slow.wasm\"\n").unwrap();
    std::fs::write(plugin.join("slow.wasm"), slow_to_compile(5000, 50_000)).unwrap();
    std::fs::write(dir.path().join("wf.json"), r#"{"1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 0}}}"#)
        .unwrap();
    let warm = kiln(&["nodes"], dir.path());
    assert!(warm.status.success(), "stderr: {}", String::from_utf8_lossy(&warm.stderr));

    let kiln_with_timeout = |args: &[&str]| {
        let started = std::time::Instant::now();
        let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
            .args(args)
            .current_dir(dir.path())
            .env("KILN_CACHE_DIR", Path::new(env!("CARGO_TARGET_TMPDIR")).join("kiln-artifacts"))
            .env("KILN_COMPILE_TIMEOUT_S", "1")
            .output()
            .expect("kiln runs");
        (out, started.elapsed())
    };
    let data = dir.path().join("data");
    for args in [&["run", "wf.json", "--plugins", "plugins"][..], &["serve", "--port", "0", "--plugins", "plugins", "--data-dir", data.to_str().unwrap()]] {
        let (out, took) = kiln_with_timeout(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} must fail: {stderr}");
        assert!(stderr.contains("plugin `slow (") && stderr.contains("compile_timeout_s = 1 s"), "{args:?}: names the plugin and the limit: {stderr}");
        assert!(took < std::time::Duration::from_secs(20), "{args:?} took {took:?}");
    }
}

/// The compiler child runs under `compile_memory_mb`: a compile that needs
/// more (this one: ~250 MiB of address space; a small component compiles
/// in 100) fails the plugin's load, naming the limit.
#[test]
fn a_plugin_compile_over_the_memory_limit_fails_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let plugin = dir.path().join("plugins/big");
    std::fs::create_dir_all(&plugin).unwrap();
    std::fs::write(plugin.join("kiln-plugin.toml"), "name = \"big\"\nversion = \"1\"\ncomponent = \"big.wasm\"\n").unwrap();
    std::fs::write(plugin.join("big.wasm"), slow_to_compile(5000, 50_000)).unwrap();
    let warm = kiln(&["nodes"], dir.path());
    assert!(warm.status.success(), "stderr: {}", String::from_utf8_lossy(&warm.stderr));
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["nodes", "--plugins", "plugins"])
        .current_dir(dir.path())
        .env("KILN_CACHE_DIR", Path::new(env!("CARGO_TARGET_TMPDIR")).join("kiln-artifacts"))
        .env("KILN_COMPILE_MEMORY_MB", "100")
        .output()
        .expect("kiln runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "must fail: {stderr}");
    assert!(stderr.contains("plugin `big (") && stderr.contains("compile_memory_mb = 100"), "names the plugin and the limit: {stderr}");
}

#[test]
fn timings_say_where_each_node_ran_and_doctor_names_the_gpu() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("wf.json"),
        r#"{"1": {"class_type": "EmptyImage", "inputs": {"width": 64, "height": 32, "batch_size": 1, "color": 255}},
            "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
            "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "t"}}}"#,
    )
    .unwrap();
    let doctor = |gpu: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
            .args(["doctor"])
            .current_dir(dir.path())
            .env("KILN_GPU", gpu)
            .env("KILN_DATA_DIR", "/srv/kiln-data")
            .output()
            .unwrap();
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect::<Vec<_>>()
    };
    let off = doctor("off");
    assert_eq!(off.len(), 5, "{off:?}");
    assert_eq!(off[0], "gpu: none (gpu = \"off\")");
    assert!(off[1].starts_with("plugin cache: "), "{off:?}");
    assert_eq!(off[2], "data dir: /srv/kiln-data");
    assert_eq!(off[3], "store: embedded (sled under /srv/kiln-data/meta)");
    assert_eq!(off[4], "blobs: files under /srv/kiln-data/blobs");
    let auto = doctor("auto");
    let has_adapter = !auto[0].starts_with("gpu: none");
    assert!(auto[0].starts_with("gpu: "), "{auto:?}");
    if !has_adapter && std::env::var_os("CI").is_some() {
        panic!("CI needs a GPU adapter (Mesa lavapipe): {}", auto[0]);
    }
    // The child `kiln serve` asks under `auto` before loading a driver:
    // the same adapter, classed as `auto` treats it.
    let probe = Command::new(env!("CARGO_BIN_EXE_kiln")).arg("probe-gpu").output().unwrap();
    let probe = String::from_utf8_lossy(&probe.stdout).trim().to_string();
    let (kind, rest) = probe.split_once(' ').unwrap_or_else(|| panic!("{probe}"));
    match kind {
        "hardware" | "software" => assert!(has_adapter && auto[0].contains(rest.split(" (").next().unwrap()), "{probe} vs {auto:?}"),
        "none" => assert!(!has_adapter, "{probe} vs {auto:?}"),
        other => panic!("unknown probe answer {other}: {probe}"),
    }

    for (gpu, place) in [("off", "cpu"), ("required", "gpu")] {
        if gpu == "required" && !has_adapter {
            eprintln!("skipped the GPU run: {}", auto[0]);
            continue;
        }
        let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
            .args(["run", "wf.json", "--out", gpu, "--timings"])
            .current_dir(dir.path())
            .env("KILN_GPU", gpu)
            .env("KILN_CACHE_DIR", Path::new(env!("CARGO_TARGET_TMPDIR")).join("kiln-artifacts"))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        let timings: Vec<Vec<&str>> = stderr.lines().filter_map(|l| l.strip_prefix("timing ")).map(|l| l.split(' ').collect()).collect();
        assert_eq!(timings.len(), 3, "one line per executed node: {stderr}");
        let invert = timings.iter().find(|t| t[0] == "2").unwrap();
        assert_eq!((invert[1], invert[2], invert[4]), ("ImageInvert", place, "ms"), "{stderr}");
        assert!(invert[3].parse::<f64>().unwrap() >= 0.0);
        let empty = timings.iter().find(|t| t[0] == "1").unwrap();
        assert_eq!(empty[2], "cpu", "EmptyImage has no GPU kernel");
    }
}

#[test]
fn required_without_an_adapter_fails_start_up_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("wf.json"), r#"{"1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 0}}, "2": {"class_type": "PreviewImage", "inputs": {"images": ["1", 0]}}}"#).unwrap();
    // No Vulkan driver for the loader to find: no adapter.
    let without_drivers = |args: &[&str], gpu: &str| {
        Command::new(env!("CARGO_BIN_EXE_kiln"))
            .args(args)
            .current_dir(dir.path())
            .env("KILN_GPU", gpu)
            .env("VK_DRIVER_FILES", "/nonexistent/icd.json")
            .env("VK_ICD_FILENAMES", "/nonexistent/icd.json")
            .env("KILN_CACHE_DIR", Path::new(env!("CARGO_TARGET_TMPDIR")).join("kiln-artifacts"))
            .output()
            .unwrap()
    };
    let out = without_drivers(&["run", "wf.json", "--out", "o"], "required");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("gpu = \"required\" but no Vulkan adapter found"), "{stderr}");
    // `auto` runs on the CPU instead, and doctor says why there is no GPU.
    let out = without_drivers(&["run", "wf.json", "--out", "o"], "auto");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = without_drivers(&["doctor"], "required");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.starts_with("gpu: none (no Vulkan adapter found"), "{stdout}");
}

#[test]
fn auto_probes_the_gpu_only_when_a_node_would_use_it() {
    let dir = tempfile::tempdir().unwrap();
    // 64² RGB: 12288 values, under `gpu_min_auto_elements` (65536); a host
    // kernel (ImageInvert) and a plugin's WGSL (ImageBlend, `gpu.prefers`).
    std::fs::write(
        dir.path().join("small.json"),
        r#"{"1": {"class_type": "EmptyImage", "inputs": {"width": 64, "height": 64, "batch_size": 1, "color": 255}},
            "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
            "3": {"class_type": "ImageBlend", "inputs": {"image1": ["1", 0], "image2": ["2", 0], "blend_factor": 0.5, "blend_mode": "multiply"}},
            "4": {"class_type": "SaveImage", "inputs": {"images": ["3", 0], "filename_prefix": "s"}}}"#,
    )
    .unwrap();
    // A 2048² RGB blur of radius 31: 1.6·10⁹ taps, ~0.4 s on one core by
    // `auto`'s prices, ~20 ms with the upload on a GPU: worth opening the
    // device for (an invert of the same image is not: its upload costs more).
    std::fs::write(
        dir.path().join("large.json"),
        r#"{"1": {"class_type": "EmptyImage", "inputs": {"width": 2048, "height": 2048, "batch_size": 1, "color": 255}},
            "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
            "3": {"class_type": "ImageBlur", "inputs": {"image": ["2", 0], "blur_radius": 31, "sigma": 10.0}},
            "4": {"class_type": "PreviewImage", "inputs": {"images": ["3", 0]}}}"#,
    )
    .unwrap();
    let run = |workflow: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
            .args(["run", workflow, "--out", "o", "--timings"])
            .current_dir(dir.path())
            .env("KILN_GPU", "auto")
            // The CPU's price is per kernel thread: one, whatever the machine.
            .env("RAYON_NUM_THREADS", "1")
            .env("KILN_LOG", "kiln::gpu=debug")
            .env("KILN_CACHE_DIR", Path::new(env!("CARGO_TARGET_TMPDIR")).join("kiln-artifacts"))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(out.status.success(), "{stderr}");
        stderr
    };
    let small = run("small.json");
    assert!(!small.contains(kiln::gpu::PROBE_CHILD_LOG), "no node would use the GPU, yet the adapter was probed:\n{small}");
    assert!(small.lines().filter(|l| l.starts_with("timing ")).all(|l| l.contains(" cpu ")), "{small}");
    // The same hook shows the probe where a node would use the GPU (on a
    // software adapter or none the node then runs on the CPU).
    let large = run("large.json");
    assert_eq!(large.matches(kiln::gpu::PROBE_CHILD_LOG).count(), 1, "one probe, for the blur:\n{large}");
    let invert = large.lines().find(|l| l.starts_with("timing 2 ")).unwrap_or_default();
    assert!(invert.contains(" cpu "), "the invert of a host image stays on the CPU: {invert}");
}

/// `kiln doctor` asks the networked backends it is configured with:
/// PostgreSQL (`KILN_TEST_DATABASE_URL`) and an S3 bucket
/// (`KILN_TEST_S3_ENDPOINT`, created on the way), and exits 1 naming the
/// one that does not answer. Skipped without them, except under CI.
#[test]
fn doctor_checks_that_the_database_and_the_bucket_answer() {
    let (Ok(database), Ok(endpoint)) = (std::env::var("KILN_TEST_DATABASE_URL"), std::env::var("KILN_TEST_S3_ENDPOINT")) else {
        assert!(std::env::var_os("CI").is_none(), "CI must set KILN_TEST_DATABASE_URL and KILN_TEST_S3_ENDPOINT");
        eprintln!("SKIPPED: KILN_TEST_DATABASE_URL or KILN_TEST_S3_ENDPOINT is not set");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let bucket = format!("kiln-doctor-{}", uuid::Uuid::new_v4().simple());
    let doctor = |database: &str, endpoint: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
            .arg("doctor")
            .env("KILN_GPU", "off")
            .env("KILN_DATA_DIR", dir.path())
            .env("KILN_STORE", "postgres")
            .env("KILN_DATABASE_URL", database)
            .env("KILN_BLOB_STORE", "s3")
            .env("KILN_S3_ENDPOINT", endpoint)
            .env("KILN_S3_BUCKET", &bucket)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        (out.status.code(), stdout.lines().skip(3).map(str::to_string).collect::<Vec<_>>())
    };
    let (code, lines) = doctor(&database, &endpoint);
    assert_eq!(code, Some(0), "{lines:?}");
    assert!(lines[0].starts_with("store: postgres at ") && lines[0].contains("(answers; migrations applied: "), "{lines:?}");
    assert_eq!(lines[1], format!("blobs: s3 bucket `{bucket}` at {endpoint} (answers; local cache up to 10240 MiB)"));
    assert!(!dir.path().join("blob-cache").exists(), "doctor leaves a server's blob cache alone");
    // Nothing listens on port 1.
    let (code, lines) = doctor("postgres://kiln:hunter2@127.0.0.1:1/kiln", "http://127.0.0.1:1");
    assert_eq!(code, Some(1), "{lines:?}");
    assert!(lines[0].starts_with("store: postgres at postgres://kiln:***@127.0.0.1:1/kiln (does not answer: "), "{lines:?}");
    assert!(!lines.join("\n").contains("hunter2"), "the password is not shown");
    assert!(lines[1].starts_with(&format!("blobs: s3 bucket `{bucket}` (does not answer: ")), "{lines:?}");
}

/// `kiln db migrate` applies kiln's schema to an empty database once (a
/// second run applies nothing), and refuses without `store = "postgres"`.
/// Skipped without `KILN_TEST_DATABASE_URL`, except under CI.
#[test]
fn db_migrate_applies_the_schema_once() {
    let Ok(server) = std::env::var("KILN_TEST_DATABASE_URL") else {
        assert!(std::env::var_os("CI").is_none(), "CI must set KILN_TEST_DATABASE_URL");
        eprintln!("SKIPPED: KILN_TEST_DATABASE_URL is not set");
        return;
    };
    let name = format!("kiln_cli_{}", uuid::Uuid::new_v4().simple());
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let admin = sqlx::PgPool::connect(&server).await.unwrap();
        sqlx::query(&format!("CREATE DATABASE {name}")).execute(&admin).await.unwrap();
        admin.close().await;
    });
    let url = format!("{}/{name}", server.rsplit_once('/').unwrap().0);
    let migrate = |store: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_kiln")).args(["db", "migrate"]).env("KILN_STORE", store).env("KILN_DATABASE_URL", &url).output().unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stdout).trim().to_string(), String::from_utf8_lossy(&out.stderr).to_string())
    };
    let (ok, first, err) = migrate("postgres");
    assert!(ok, "{err}");
    assert!(first.starts_with(&format!("{url}: migrations [1, 2, 3")), "{first}");
    let all = first.split_once("migrations ").unwrap().1.split_once(" (").unwrap().0.to_string();
    assert!(first.ends_with(&format!("(applied now: {all})")), "everything is new the first time: {first}");
    let (ok, second, err) = migrate("postgres");
    assert!(ok, "{err}");
    assert_eq!(second, format!("{url}: migrations {all} (applied now: [])"));
    let (ok, _, err) = migrate("embedded");
    assert!(!ok && err.contains("kiln db needs store = \"postgres\""), "{err}");
}
