//! Bundles through the real binary: `kiln pack` → `kiln inspect` /
//! `kiln unpack` → `kiln run FILE.kiln` on two differently set-up hosts
//! with bit-identical outputs, inputs replaced only where the bundle
//! allows, damaged bundles refused; and `kiln deployments create --bundle`
//! against a real `kiln serve`, whose jobs record the bundle's hash, still
//! after a SIGKILL and restart.

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use serde_json::{Value, json};

mod common;
use common::spawn;

fn kiln(args: &[&str], cwd: &Path, env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kiln"));
    cmd.args(args).current_dir(cwd).env("KILN_CACHE_DIR", Path::new(env!("CARGO_TARGET_TMPDIR")).join("kiln-artifacts"));
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("kiln runs")
}

fn ok(out: &Output) -> String {
    assert!(out.status.success(), "exit {:?}; stderr: {}", out.status.code(), String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn write_png(path: &Path, seed: u8) {
    let pixels: Vec<u8> = (0..8 * 8 * 3).map(|i| (i as u8).wrapping_mul(37).wrapping_add(seed)).collect();
    let mut bytes = Vec::new();
    let mut encoder = png::Encoder::new(&mut bytes, 8, 8);
    encoder.set_color(png::ColorType::Rgb);
    encoder.write_header().unwrap().write_image_data(&pixels).unwrap();
    std::fs::write(path, bytes).unwrap();
}

/// The workflow the suite packs: its input inverted (a node whose GPU
/// kernel promises the CPU's exact pixels: 1 - x).
fn workflow() -> Value {
    json!({
        "1": {"class_type": "LoadImage", "inputs": {"image": "photo.png"}},
        "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
        "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "bundle"}}
    })
}

/// Whether this machine has a GPU adapter `gpu = "required"` can use.
fn has_adapter(cwd: &Path) -> bool {
    let out = kiln(&["doctor"], cwd, &[("KILN_GPU", "required")]);
    String::from_utf8_lossy(&out.stdout).lines().any(|l| l.starts_with("gpu: ") && !l.starts_with("gpu: none"))
}

#[test]
fn a_packed_bundle_inspects_unpacks_and_runs_bit_identically_on_two_hosts() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write_png(&d.join("photo.png"), 0);
    write_png(&d.join("other.png"), 101);
    std::fs::write(d.join("invert.json"), workflow().to_string()).unwrap();

    let stdout = ok(&kiln(&["pack", "invert.json", "--input", "photo.png=photo.png"], d, &[]));
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[0], "invert.kiln", "the default name is the workflow's stem");
    let hash = lines[1].to_string();
    assert!(hash.starts_with("blake3:") && hash.len() == 71, "{hash}");
    ok(&kiln(&["pack", "invert.json", "--input", "photo.png=photo.png", "--out", "again.kiln"], d, &[]));
    assert_eq!(std::fs::read(d.join("invert.kiln")).unwrap(), std::fs::read(d.join("again.kiln")).unwrap(), "packing is reproducible");

    let inspected: Value = serde_json::from_str(&ok(&kiln(&["inspect", "invert.kiln"], d, &[]))).unwrap();
    assert_eq!(inspected["hash"], hash.as_str());
    assert_eq!((inspected["name"].as_str(), inspected["format"].as_u64()), (Some("invert"), Some(1)));
    assert_eq!(inspected["inputs"]["photo.png"]["overridable"], true);
    let core = inspected["components"].as_array().unwrap().iter().find(|c| c["plugin"] == "core-image").expect("core-image pinned");
    assert_eq!(core["included"], false, "bundled plugins are pinned by hash by default");
    assert_eq!(core["classes"], json!(["ImageInvert", "LoadImage", "SaveImage"]));
    assert!(inspected["files"]["inputs/photo.png"].as_u64().unwrap() > 0);

    ok(&kiln(&["unpack", "invert.kiln", "--out", "unpacked"], d, &[]));
    assert_eq!(std::fs::read(d.join("unpacked/inputs/photo.png")).unwrap(), std::fs::read(d.join("photo.png")).unwrap());
    let unpacked_workflow: Value = serde_json::from_slice(&std::fs::read(d.join("unpacked/workflows/invert.json")).unwrap()).unwrap();
    assert_eq!(unpacked_workflow, workflow());
    assert!(d.join("unpacked/bundle.json").is_file() && d.join("unpacked/plugins/core-image/kiln-plugin.toml").is_file());

    // Host A: no GPU, one data dir. Host B: another data dir, the GPU
    // where there is one (the nodes used here promise the same pixels),
    // one node at a time, no result cache.
    let a = ok(&kiln(&["run", "invert.kiln", "--out", "a", "--timings"], d, &[("KILN_GPU", "off"), ("KILN_DATA_DIR", "data-a")]));
    let gpu = if has_adapter(d) { "required" } else { "auto" };
    let b_env = [("KILN_GPU", gpu), ("KILN_DATA_DIR", "data-b"), ("KILN_MAX_CONCURRENCY", "1"), ("KILN_RESULT_CACHE_MB", "0")];
    let out_b = kiln(&["run", "invert.kiln", "--out", "b", "--timings"], d, &b_env);
    let b = ok(&out_b);
    assert_eq!(a.trim(), "a/bundle_00001_.png");
    assert_eq!(b.trim(), "b/bundle_00001_.png");
    let (png_a, png_b) = (std::fs::read(d.join(a.trim())).unwrap(), std::fs::read(d.join(b.trim())).unwrap());
    assert_eq!(png_a, png_b, "the same bundle and inputs give the same bytes on both hosts");
    if gpu == "required" {
        let timings = String::from_utf8_lossy(&out_b.stderr);
        assert!(timings.lines().any(|l| l.starts_with("timing 2 ImageInvert gpu")), "host B really ran on the GPU: {timings}");
    } else {
        eprintln!("no GPU adapter here: host B differs by data dir, concurrency and cache only");
    }

    // Replacing the overridable input changes the output; the default is
    // what ran otherwise.
    let c = ok(&kiln(&["run", "invert.kiln", "--input", "photo.png=other.png", "--out", "c"], d, &[]));
    assert_ne!(std::fs::read(d.join(c.trim())).unwrap(), png_a);
    let out = kiln(&["run", "invert.kiln", "--input", "nope.png=other.png", "--out", "c"], d, &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no input `nope.png` (its inputs: photo.png)"), "{}", String::from_utf8_lossy(&out.stderr));
    ok(&kiln(&["pack", "invert.json", "--input", "photo.png=photo.png", "--fixed", "photo.png", "--out", "fixed.kiln"], d, &[]));
    let out = kiln(&["run", "fixed.kiln", "--input", "photo.png=other.png", "--out", "c"], d, &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("input `photo.png` is fixed"), "{}", String::from_utf8_lossy(&out.stderr));

    // A damaged bundle is refused before anything runs.
    let mut damaged = std::fs::read(d.join("invert.kiln")).unwrap();
    let middle = damaged.len() / 2;
    damaged[middle] ^= 0x55;
    std::fs::write(d.join("damaged.kiln"), damaged).unwrap();
    for args in [&["run", "damaged.kiln", "--out", "x"][..], &["inspect", "damaged.kiln"]] {
        let out = kiln(args, d, &[]);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("damaged.kiln is refused"), "{}", String::from_utf8_lossy(&out.stderr));
    }
    assert!(!d.join("x").exists(), "nothing ran");

    // Packing refuses an input no workflow reads, and an invalid workflow (exit 2).
    let out = kiln(&["pack", "invert.json", "--input", "photo.png=photo.png", "--input", "spare.png=other.png"], d, &[]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("`spare.png` is not read by any workflow"), "{}", String::from_utf8_lossy(&out.stderr));
    let out = kiln(&["pack", "invert.json"], d, &[]);
    assert_eq!(out.status.code(), Some(2), "photo.png is not given: {}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn a_bundle_of_several_workflows_runs_the_one_named() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for (name, color) in [("a", 0x010203), ("b", 0x040506)] {
        let workflow = json!({
            "1": {"class_type": "EmptyImage", "inputs": {"width": 4, "height": 4, "batch_size": 1, "color": color}},
            "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": name}}
        });
        std::fs::write(d.join(format!("{name}.json")), workflow.to_string()).unwrap();
    }
    let stdout = ok(&kiln(&["pack", "a.json", "b.json", "--out", "both.kiln", "--name", "pair", "--bundle-version", "0.3.0"], d, &[]));
    assert_eq!(stdout.lines().next(), Some("both.kiln"));
    let inspected: Value = serde_json::from_str(&ok(&kiln(&["inspect", "both.kiln"], d, &[]))).unwrap();
    assert_eq!((inspected["name"].as_str(), inspected["version"].as_str()), (Some("pair"), Some("0.3.0")));
    assert_eq!(inspected["workflows"].as_object().unwrap().keys().collect::<Vec<_>>(), ["a", "b"]);

    let out = kiln(&["run", "both.kiln", "--out", "o"], d, &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("several workflows (a, b)"), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(ok(&kiln(&["run", "both.kiln", "--workflow", "b", "--out", "o"], d, &[])).trim(), "o/b_00001_.png");
    let out = kiln(&["run", "both.kiln", "--workflow", "c", "--out", "o"], d, &[]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("no workflow \"c\""), "{}", String::from_utf8_lossy(&out.stderr));
    let out = kiln(&["run", "a.json", "--workflow", "a"], d, &[]);
    assert!(!out.status.success(), "--workflow is for bundles");
}

/// `kiln deployments create ID --bundle FILE` against a real server: the
/// deployment shows the bundle's hash, its jobs run the bundle's
/// components only and record its hash, and both survive a SIGKILL.
#[tokio::test]
async fn a_deployment_from_a_bundle_records_its_hash_on_itself_and_its_jobs() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(
        d.join("solid.json"),
        json!({
            "1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 0x102030}},
            "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
            "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "solid"}}
        })
        .to_string(),
    )
    .unwrap();
    let stdout = ok(&kiln(&["pack", "solid.json", "--include", "all"], d, &[]));
    let hash = stdout.lines().nth(1).unwrap().to_string();

    let token = "bundle-operator-token";
    let env = [("KILN_ADMIN_TOKEN", token), ("KILN_GPU", "off")];
    let data = d.join("data");
    let server = spawn(&data, &env, &[]);
    let deployments = |base: &str, args: &[&str]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_kiln"));
        cmd.arg("deployments").args(["--url", base]).args(args).current_dir(d).env("KILN_ADMIN_TOKEN", token);
        cmd.output().unwrap()
    };
    let created: Value = serde_json::from_str(&ok(&deployments(&server.base, &["create", "solid", "--owner", "local", "--bundle", "solid.kiln"]))).unwrap();
    assert_eq!(created["bundle"]["hash"], hash.as_str(), "{created}");
    assert_eq!(created["bundle"]["workflows"], json!(["solid"]));

    let http = reqwest::Client::new();
    let run_job = |base: String, workflow: Value| {
        let http = http.clone();
        async move {
            let jobs = format!("{base}/deployment/solid/api/v2/jobs");
            for _ in 0..800 {
                let resp = http.post(&jobs).json(&json!({ "workflow": workflow })).send().await.unwrap();
                if resp.status() != 429 {
                    return (resp.status().as_u16(), resp.json::<Value>().await.unwrap());
                }
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            panic!("the deployment never became ready");
        }
    };
    let finished = |base: String, id: String| {
        let http = http.clone();
        async move {
            for _ in 0..2000 {
                let job: Value = http.get(format!("{base}/deployment/solid/api/v2/jobs/{id}")).send().await.unwrap().json().await.unwrap();
                if ["succeeded", "failed", "canceled"].contains(&job["status"].as_str().unwrap_or("")) {
                    return job;
                }
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            panic!("job {id} never finished");
        }
    };
    let workflow: Value = serde_json::from_slice(&std::fs::read(d.join("solid.json")).unwrap()).unwrap();
    let (status, job) = run_job(server.base.clone(), workflow.clone()).await;
    assert_eq!(status, 201, "{job}");
    let job = finished(server.base.clone(), job["id"].as_str().unwrap().to_string()).await;
    assert_eq!(job["status"], "succeeded", "{job}");
    assert_eq!(job["bundle"], hash.as_str(), "the job records the bundle it ran");
    let inspected: Value = serde_json::from_str(&ok(&kiln(&["inspect", "solid.kiln"], d, &[]))).unwrap();
    let core = inspected["components"].as_array().unwrap().iter().find(|c| c["plugin"] == "core-image").unwrap();
    assert_eq!(job["components"]["core-image"], core["component"], "and each component's hash");

    // Only the bundle's components: a class of another plugin is unknown here.
    let other = json!({"1": {"class_type": "PrimitiveInt", "inputs": {"value": 1}}, "2": {"class_type": "SaveImage", "inputs": {"images": ["3", 0], "filename_prefix": "x"}}, "3": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 0}}});
    let (status, body) = run_job(server.base.clone(), other).await;
    assert_eq!((status, body["error"]["code"].as_str()), (422, Some("invalid_workflow")), "{body}");

    // A damaged bundle: 422 bundle_refused, nothing created.
    let mut damaged = std::fs::read(d.join("solid.kiln")).unwrap();
    let middle = damaged.len() / 2;
    damaged[middle] ^= 0x55;
    std::fs::write(d.join("damaged.kiln"), damaged).unwrap();
    let out = deployments(&server.base, &["create", "broken", "--owner", "local", "--bundle", "damaged.kiln"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("422"), "{}", String::from_utf8_lossy(&out.stderr));

    // SIGKILL and restart: the deployment comes back with the same bundle.
    drop(server);
    let server = spawn(&data, &env, &[]);
    let shown: Value = http.get(format!("{}/admin/deployments/solid", server.base)).bearer_auth(token).send().await.unwrap().json().await.unwrap();
    assert_eq!(shown["bundle"]["hash"], hash.as_str(), "{shown}");
    let (status, job) = run_job(server.base.clone(), workflow).await;
    assert_eq!(status, 201, "{job}");
    let job = finished(server.base.clone(), job["id"].as_str().unwrap().to_string()).await;
    assert_eq!((job["status"].as_str(), job["bundle"].as_str()), (Some("succeeded"), Some(hash.as_str())), "{job}");
    let listed: Value = serde_json::from_str(&ok(&deployments(&server.base, &["list"]))).unwrap();
    assert_eq!(listed["deployments"].as_array().map(Vec::len), Some(1), "the refused one was never created: {listed}");
}
