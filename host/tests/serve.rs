//! `kiln serve` as a process: the real binary on loopback, killed with
//! SIGKILL to prove durability, and driven by the real Python `comfy-sdk`.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

mod common;
use common::{Kiln, spawn, spawn_with};

fn heavy(color: i64) -> Value {
    json!({
        "1": { "class_type": "EmptyImage", "inputs": { "width": 2048, "height": 2048, "batch_size": 1, "color": color } },
        "2": { "class_type": "ImageBlur", "inputs": { "image": ["1", 0], "blur_radius": 15, "sigma": 4.0 } },
        "3": { "class_type": "SaveImage", "inputs": { "images": ["2", 0], "filename_prefix": "h" } },
    })
}

fn png() -> Vec<u8> {
    // 1×1 RGB PNG.
    vec![
        0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A, 0, 0, 0, 0x0D, 0x49, 0x48, 0x44, 0x52, 0, 0, 0, 1, 0, 0, 0, 1, 8, 2, 0, 0, 0, 0x90, 0x77, 0x53, 0xDE,
        0, 0, 0, 0x0C, 0x49, 0x44, 0x41, 0x54, 0x08, 0xD7, 0x63, 0xF8, 0xCF, 0xC0, 0x00, 0x00, 0x03, 0x01, 0x01, 0x00, 0x18, 0xDD, 0x8D, 0xB0, 0, 0, 0, 0,
        0x49, 0x45, 0x4E, 0x44, 0xAE, 0x42, 0x60, 0x82,
    ]
}

async fn wait_terminal(http: &reqwest::Client, base: &str, id: &str) -> Value {
    for _ in 0..1200 {
        let job: Value = http.get(format!("{base}/api/v2/jobs/{id}")).send().await.unwrap().json().await.unwrap();
        if ["succeeded", "failed", "canceled", "expired"].contains(&job["status"].as_str().unwrap_or("")) {
            return job;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("job {id} never finished");
}

/// SIGKILL at several moments while clients submit: every job, asset and
/// idempotency claim the server acknowledged is there after a restart, and
/// every acknowledged job reaches a terminal state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_at_any_moment_loses_no_acknowledged_job_asset_or_claim() {
    let data = tempfile::tempdir().unwrap();
    let http = reqwest::Client::new();
    let env = [("KILN_MAX_RUNNING_JOBS", "1")];
    let mut acknowledged: Vec<(String, String)> = Vec::new(); // (job id, key)
    let mut assets: Vec<String> = Vec::new();
    for (round, kill_after_ms) in [150u64, 400, 50].into_iter().enumerate() {
        let kiln = spawn(data.path(), &env, &[]);
        let base = kiln.base.clone();
        let acks = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let submitter = {
            let (http, base, acks) = (http.clone(), base.clone(), acks.clone());
            tokio::spawn(async move {
                let mut acked = Vec::new();
                let mut uploaded = Vec::new();
                for i in 0..1000 {
                    let form = reqwest::multipart::Form::new()
                        .text("file_path", format!("r{round}-{i}.png"))
                        .part("file", reqwest::multipart::Part::bytes([png(), vec![round as u8, (i % 256) as u8]].concat()).file_name("x.png"));
                    match http.post(format!("{base}/api/v2/assets")).multipart(form).send().await {
                        Ok(r) if r.status().is_success() => {
                            uploaded.push(r.json::<Value>().await.map(|a| a["id"].as_str().unwrap_or("").to_string()).unwrap_or_default())
                        }
                        _ => break,
                    }
                    let key = format!("key-{round}-{i}");
                    let body = if i % 4 == 0 {
                        json!({ "workflow": heavy(i) })
                    } else {
                        json!({ "workflow": {
                        "1": { "class_type": "EmptyImage", "inputs": { "width": 8, "height": 8, "batch_size": 1, "color": i } },
                        "2": { "class_type": "SaveImage", "inputs": { "images": ["1", 0], "filename_prefix": "s" } } } })
                    };
                    match http.post(format!("{base}/api/v2/jobs")).header("Idempotency-Key", &key).json(&body).send().await {
                        Ok(r) if r.status() == 201 => match r.json::<Value>().await {
                            Ok(job) => {
                                acked.push((job["id"].as_str().unwrap().to_string(), key));
                                acks.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                            }
                            Err(_) => break,
                        },
                        _ => break,
                    }
                }
                (acked, uploaded)
            })
        };
        // The kill comes `kill_after_ms` after the first acknowledgement (a
        // loaded machine may take longer than that to answer the first).
        for _ in 0..1000 {
            if acks.load(std::sync::atomic::Ordering::SeqCst) > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(Duration::from_millis(kill_after_ms)).await;
        drop(kiln); // SIGKILL
        let (acked, uploaded) = submitter.await.unwrap();
        assert!(!acked.is_empty(), "round {round}: some jobs were acknowledged before the kill");
        acknowledged.extend(acked);
        assets.extend(uploaded.into_iter().filter(|a| !a.is_empty()));
    }
    let kiln = spawn(data.path(), &env, &[]);
    for id in &assets {
        assert_eq!(http.get(format!("{}/api/v2/assets/{id}", kiln.base)).send().await.unwrap().status(), 200, "asset {id} survived");
    }
    for (id, key) in &acknowledged {
        let job = wait_terminal(&http, &kiln.base, id).await;
        // A job killed mid-run twice is failed on purpose (see service::retention).
        let interrupted_twice = job["status"] == "failed" && job["error"]["code"] == "interrupted";
        assert!(job["status"] == "succeeded" || interrupted_twice, "{job}");
        let again = http.post(format!("{}/api/v2/jobs", kiln.base)).header("Idempotency-Key", key).json(&json!({ "workflow": heavy(1) })).send().await.unwrap();
        assert_eq!(again.status(), 422, "claim {key} survived");
    }
    eprintln!("{} acknowledged jobs and {} assets survived three SIGKILLs", acknowledged.len(), assets.len());
}

/// A job seen `succeeded` is still `succeeded`, with the same outputs, after
/// a SIGKILL that came right after: its terminal record was durable before
/// it was published (sled writes its own buffers out only every 200 ms, so
/// the last ones come back from the commit log), and it is not run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_seen_succeeded_stay_succeeded_across_sigkill() {
    let data = tempfile::tempdir().unwrap();
    let http = reqwest::Client::new();
    let mut seen = Vec::new();
    for round in 0..3 {
        let kiln = spawn(data.path(), &[], &[]);
        for i in 0..20 {
            let body = json!({ "workflow": {
                "1": { "class_type": "EmptyImage", "inputs": { "width": 8, "height": 8, "batch_size": 1, "color": round * 100 + i } },
                "2": { "class_type": "SaveImage", "inputs": { "images": ["1", 0], "filename_prefix": "k" } } } });
            let job: Value = http.post(format!("{}/api/v2/jobs", kiln.base)).json(&body).send().await.unwrap().json().await.unwrap();
            let done = wait_terminal(&http, &kiln.base, job["id"].as_str().unwrap()).await;
            assert_eq!(done["status"], "succeeded", "{done}");
            seen.push(done);
        }
        drop(kiln); // SIGKILL, within milliseconds of the last completion
    }
    let kiln = spawn(data.path(), &[], &[]);
    let ids = |job: &Value| job["outputs"].as_array().unwrap().iter().map(|o| o["id"].as_str().unwrap().to_string()).collect::<Vec<_>>();
    for before in &seen {
        let id = before["id"].as_str().unwrap();
        let after: Value = http.get(format!("{}/api/v2/jobs/{id}", kiln.base)).send().await.unwrap().json().await.unwrap();
        assert_eq!(after["status"], "succeeded", "{after}");
        assert_eq!(ids(&after), ids(before), "job {id} kept its outputs (it did not run again)");
        assert_eq!(after["completed_at"], before["completed_at"]);
        for out in ids(before) {
            assert_eq!(http.get(format!("{}/api/v2/assets/{out}", kiln.base)).send().await.unwrap().status(), 200, "output {out}");
        }
    }
}

/// The Python `comfy-sdk` 0.5.0 from PyPI, unmodified, against `kiln serve`.
#[test]
fn the_real_comfy_sdk_runs_end_to_end() {
    let python = std::env::var("KILN_SDK_PYTHON").unwrap_or_else(|_| "python3".into());
    let has_sdk = Command::new(&python).args(["-c", "import comfy_sdk"]).status().is_ok_and(|s| s.success());
    if !has_sdk {
        assert!(std::env::var_os("CI").is_none(), "CI must provide comfy-sdk (set KILN_SDK_PYTHON)");
        eprintln!("SKIPPED: comfy-sdk is not installed for {python}; set KILN_SDK_PYTHON (CI does)");
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let mut kiln = spawn(data.path(), &[("KILN_MAX_RUNNING_JOBS", "1"), ("KILN_MAX_QUEUED_JOBS", "2")], &["--token", "sdk-token"]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/sdk/sdk_e2e.py");
    let out = Command::new(&python)
        .arg(script)
        .env("COMFY_BASE_URL", &kiln.base)
        .env("KILN_TEST_TOKEN", "sdk-token")
        .env_remove("COMFY_API_KEY")
        .output()
        .expect("python runs");
    assert!(out.status.success(), "sdk e2e failed:\n{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("all checks passed"));
    // Graceful shutdown on SIGTERM.
    sigterm(kiln.child.id());
    let status = kiln.child.wait().unwrap();
    assert!(status.success(), "kiln exits cleanly on SIGTERM: {status:?}");
}

fn sigterm(pid: u32) {
    let ok = Command::new("kill").args(["-TERM", &pid.to_string()]).status().unwrap().success();
    assert!(ok);
}

/// Runs `kiln serve` with `env`: one job that succeeds, one whose LoadImage
/// fails at run time; the server's log, and the two job ids.
async fn log_of_two_jobs(env: &[(&str, &str)]) -> (String, String, String) {
    let data = tempfile::tempdir().unwrap();
    let mut kiln = spawn_with(data.path(), env, &[], Stdio::piped());
    let mut stderr = kiln.child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut stderr, &mut text).unwrap();
        text
    });
    let http = reqwest::Client::new();
    let submit = |workflow: Value| {
        let (http, url) = (http.clone(), format!("{}/api/v2/jobs", kiln.base));
        async move { http.post(url).json(&json!({ "workflow": workflow })).send().await.unwrap().json::<Value>().await.unwrap()["id"].as_str().unwrap().to_string() }
    };
    let ok = submit(json!({
        "1": { "class_type": "EmptyImage", "inputs": { "width": 8, "height": 8, "batch_size": 1, "color": 1 } },
        "2": { "class_type": "SaveImage", "inputs": { "images": ["1", 0], "filename_prefix": "l" } },
    }))
    .await;
    // Bytes that are not an image: LoadImage fails at run time.
    let form = reqwest::multipart::Form::new().text("file_path", "not.png").part("file", reqwest::multipart::Part::bytes(b"not a png".to_vec()));
    let asset: Value = http.post(format!("{}/api/v2/assets", kiln.base)).multipart(form).send().await.unwrap().json().await.unwrap();
    let bad = submit(json!({
        "1": { "class_type": "LoadImage", "inputs": { "image": { "__type": "core/ASSET", "info": { "id": asset["id"] } } } },
        "2": { "class_type": "SaveImage", "inputs": { "images": ["1", 0], "filename_prefix": "l" } },
    }))
    .await;
    assert_eq!(wait_terminal(&http, &kiln.base, &ok).await["status"], "succeeded");
    assert_eq!(wait_terminal(&http, &kiln.base, &bad).await["status"], "failed");
    sigterm(kiln.child.id());
    assert!(kiln.child.wait().unwrap().success());
    (reader.join().unwrap(), ok, bad)
}

/// By default the server logs one line per job, with its id, status, times
/// and error code, and a node failure with the job's and the node's ids.
#[tokio::test]
async fn jobs_are_logged_with_their_job_and_node_ids() {
    let (log, ok, bad) = log_of_two_jobs(&[]).await;
    let line = |needle: &str| log.lines().find(|l| l.contains(needle)).unwrap_or_else(|| panic!("no line with {needle:?} in:\n{log}")).to_string();
    let ok_line = line(&format!("job_id={ok}"));
    assert!(ok_line.contains("job finished") && ok_line.contains("status=\"succeeded\"") && ok_line.contains("execution_ms="), "{ok_line}");
    let bad_line = line(&format!("job finished job_id={bad}"));
    assert!(bad_line.contains("status=\"failed\"") && bad_line.contains("error=\"node_execution_error\""), "{bad_line}");
    let node_line = line("node failed");
    assert!(node_line.contains(&format!("job_id={bad}")) && node_line.contains("node_id=1") && node_line.contains("class_type=LoadImage"), "{node_line}");
    assert!(!log.contains("\u{1b}["), "no colour codes when stderr is not a terminal");
}

/// With `KILN_LOG_FORMAT=json` every line is one JSON object: an event's
/// fields at the top level, the spans it happened in (the job's run with
/// its account, the node) with theirs.
#[tokio::test]
async fn json_logs_carry_job_node_and_account_ids_as_fields() {
    let (log, ok, bad) = log_of_two_jobs(&[("KILN_LOG_FORMAT", "json")]).await;
    let events: Vec<Value> =
        log.lines().filter(|l| !l.trim().is_empty()).map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l:?}"))).collect();
    let event = |message: &str, job: &str| {
        events
            .iter()
            .find(|e| e["message"] == message && (e["job_id"] == job || e["spans"].as_array().is_some_and(|s| s.iter().any(|s| s["job_id"] == job))))
            .unwrap_or_else(|| panic!("no {message:?} of {job} in:\n{log}"))
            .clone()
    };
    let finished = event("job finished", &ok);
    assert_eq!((finished["level"].as_str(), finished["status"].as_str()), (Some("INFO"), Some("succeeded")), "{finished}");
    assert!(finished["execution_ms"].is_u64() && finished["timestamp"].is_string(), "{finished}");
    let failed = event("node failed", &bad);
    let spans = failed["spans"].as_array().unwrap();
    let run = spans.iter().find(|s| s["name"] == "run").unwrap_or_else(|| panic!("no run span: {failed}"));
    assert_eq!((run["job_id"].as_str(), run["owner"].as_str()), (Some(bad.as_str()), Some("local")), "{failed}");
    let node = spans.iter().find(|s| s["name"] == "node").unwrap_or_else(|| panic!("no node span: {failed}"));
    assert_eq!((node["node_id"].as_str(), node["class_type"].as_str()), (Some("1"), Some("LoadImage")), "{failed}");
}

/// A test input: a 16×12 RGB PNG with a gradient.
fn gradient_png() -> Vec<u8> {
    let mut out = Vec::new();
    let mut encoder = png::Encoder::new(&mut out, 16, 12);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    let pixels: Vec<u8> = (0..16 * 12 * 3).map(|i| (i * 7 % 256) as u8).collect();
    encoder.write_header().unwrap().write_image_data(&pixels).unwrap();
    out
}

/// Starts `kiln serve`, writes the test input, and runs `client` with
/// `HOST:PORT INPUT.png`: the server, the client's JSON report, and the
/// data dir (to keep).
fn run_client(mut client: Command) -> (Kiln, Value, tempfile::TempDir) {
    let data = tempfile::tempdir().unwrap();
    let kiln = spawn(data.path(), &[], &[]);
    let input = data.path().join("input.png");
    std::fs::write(&input, gradient_png()).unwrap();
    let host = kiln.base.strip_prefix("http://").unwrap().to_string();
    let out = client.arg(&host).arg(&input).output().unwrap();
    assert!(out.status.success(), "client failed:\n{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (kiln, serde_json::from_slice(out.stdout.trim_ascii()).unwrap(), data)
}

/// A real ComfyUI client's run: the server's record of the job and the
/// output the job stored, fetched over `/api/v2` (a prompt is a job).
async fn v2_output(base: &str, prompt_id: &str) -> Vec<u8> {
    let http = reqwest::Client::new();
    let job = wait_terminal(&http, base, prompt_id).await;
    assert_eq!(job["status"], "succeeded", "{job}");
    let url = job["outputs"][0]["url"].as_str().unwrap();
    http.get(url).send().await.unwrap().bytes().await.unwrap().to_vec()
}

/// The npm client `@stable-canvas/comfyui-client` 1.5.9, unmodified (CI
/// installs it from `tests/clients/node/package-lock.json`): uploads an
/// image, queues a workflow, follows it on the WebSocket and downloads the
/// output through `/view`.
#[tokio::test]
async fn the_stable_canvas_js_client_runs_a_workflow() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/clients/node");
    let ready =
        dir.join("node_modules/@stable-canvas/comfyui-client").is_dir() && Command::new("node").arg("--version").output().is_ok_and(|o| o.status.success());
    if !ready {
        assert!(std::env::var_os("CI").is_none(), "CI must provide node and `npm ci` in tests/clients/node");
        eprintln!("SKIPPED: run `npm ci --prefix tests/clients/node` (CI does)");
        return;
    }
    let mut client = Command::new("node");
    client.arg(dir.join("comfyui_client_e2e.mjs"));
    let (kiln, report, _data) = run_client(client);
    let prompt_id = report["prompt_id"].as_str().unwrap();
    assert_eq!(report["uploaded"]["type"], "input", "{report}");
    let types: Vec<&str> = report["events"].as_array().unwrap().iter().filter(|e| e["prompt_id"] == prompt_id).filter_map(|e| e["type"].as_str()).collect();
    for expected in ["execution_start", "executing", "executed", "execution_success"] {
        assert!(types.contains(&expected), "the client saw {expected}: {types:?}");
    }
    use base64::Engine as _;
    let downloaded = base64::engine::general_purpose::STANDARD.decode(report["output_b64"].as_str().unwrap()).unwrap();
    assert_eq!(downloaded, v2_output(&kiln.base, prompt_id).await, "the client downloaded the job's output");
}

/// A client written the way ComfyUI's own `websocket_api_example.py` is
/// (urllib + `websocket-client`), against `kiln serve`.
#[tokio::test]
async fn a_websocket_api_example_client_runs_a_workflow() {
    let python = std::env::var("KILN_SDK_PYTHON").unwrap_or_else(|_| "python3".into());
    let ready = Command::new(&python).args(["-c", "import websocket"]).status().is_ok_and(|s| s.success());
    if !ready {
        assert!(std::env::var_os("CI").is_none(), "CI must provide websocket-client (KILN_SDK_PYTHON)");
        eprintln!("SKIPPED: websocket-client is not installed for {python}");
        return;
    }
    let mut client = Command::new(&python);
    client.arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/clients/python/websocket_api_example.py"));
    let (kiln, report, _data) = run_client(client);
    let prompt_id = report["prompt_id"].as_str().unwrap();
    let messages: Vec<&str> = report["messages"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert_eq!(messages.first(), Some(&"execution_start"), "{messages:?}");
    assert!(messages.contains(&"executed") && messages.contains(&"execution_success"), "{messages:?}");
    assert_eq!(report["status"]["status_str"], "success", "{report}");
    use base64::Engine as _;
    let images = report["images"].as_array().unwrap();
    assert_eq!(images.len(), 1, "{report}");
    let downloaded = base64::engine::general_purpose::STANDARD.decode(images[0].as_str().unwrap()).unwrap();
    assert_eq!(downloaded, v2_output(&kiln.base, prompt_id).await);
}

/// The official ComfyUI web frontend (PyPI's `comfyui-frontend-package`,
/// `KILN_TEST_FRONT_END` naming its `static/` directory) served by `kiln
/// serve --front-end-root`, driven in headless Chromium by Playwright for
/// Python (`KILN_BROWSER_PYTHON`, Chromium at `CHROMIUM`, default
/// `/usr/bin/chromium`): it loads, opens a UI-format workflow, uploads an
/// image, runs, and shows the output (`tests/browser/comfyui_frontend.py`).
/// CI installs all three (`.ci/run`); elsewhere the test skips without them.
#[test]
fn the_official_frontend_runs_a_workflow_in_a_real_browser() {
    let Some(browser) = BrowserTest::find() else { return };
    let data = tempfile::tempdir().unwrap();
    let kiln = spawn(data.path(), &[], &["--front-end-root", browser.root.to_str().unwrap()]);
    browser.run(&kiln, "browser-frontend", None);
    // Saved with the UI: the settings it wrote are kept (in the data
    // directory, or the database), read back as the UI reads them.
    let url = format!("{}/api/settings", kiln.base);
    let settings = tokio::runtime::Runtime::new().unwrap().block_on(async { reqwest::get(url).await.unwrap().text().await.unwrap() });
    assert!(settings.contains("Comfy.InstalledVersion"), "{settings}");
}

/// The same flow on a cloud server: the UI sends the browser to kiln's
/// sign-in page, an account's key signs it in, the session cookie carries
/// the UI's requests and WebSocket (the job is the account's), a request
/// from another origin with it is refused, and signing out ends it
/// (`tests/browser/comfyui_frontend.py` with a key).
#[tokio::test(flavor = "multi_thread")]
async fn the_official_frontend_signs_in_to_a_cloud_server_in_a_real_browser() {
    let Some(browser) = BrowserTest::find() else { return };
    const OPERATOR: &str = "browser-operator-token";
    let data = tempfile::tempdir().unwrap();
    let kiln = spawn(data.path(), &[("KILN_ADMIN_TOKEN", OPERATOR)], &["--mode", "cloud", "--front-end-root", browser.root.to_str().unwrap()]);
    let http = reqwest::Client::new();
    let created = common::new_account(&http, &kiln.base, OPERATOR, "browser", 1000).await;
    let key = created["key"].as_str().unwrap().to_string();
    tokio::task::block_in_place(|| browser.run(&kiln, "browser-frontend-cloud", Some(&key)));
    // The UI's job and settings are the account's.
    let jobs: Value = http.get(format!("{}/api/v2/jobs", kiln.base)).bearer_auth(&key).send().await.unwrap().json().await.unwrap();
    let jobs = jobs["jobs"].as_array().unwrap();
    assert!(jobs.iter().any(|j| j["status"] == "succeeded"), "{jobs:?}");
    let settings = http.get(format!("{}/api/settings", kiln.base)).header("X-API-Key", &key).send().await.unwrap().text().await.unwrap();
    assert!(settings.contains("Comfy.InstalledVersion"), "{settings}");
}

/// What the browser tests need: Playwright for Python (`KILN_BROWSER_PYTHON`),
/// Chromium (`CHROMIUM`, default `/usr/bin/chromium`) and the frontend's
/// `static/` directory (`KILN_TEST_FRONT_END`). CI installs all three
/// (`.ci/run`); elsewhere the tests skip without them.
struct BrowserTest {
    python: String,
    chromium: String,
    root: std::path::PathBuf,
}

impl BrowserTest {
    fn find() -> Option<BrowserTest> {
        let python = std::env::var("KILN_BROWSER_PYTHON").unwrap_or_else(|_| "python3".into());
        let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
        let root = std::env::var_os("KILN_TEST_FRONT_END").map(std::path::PathBuf::from);
        let has_playwright = Command::new(&python).args(["-c", "import playwright"]).status().is_ok_and(|s| s.success());
        let missing: Vec<&str> = [
            (!has_playwright).then_some("Playwright for Python (KILN_BROWSER_PYTHON)"),
            (!Path::new(&chromium).exists()).then_some("Chromium (CHROMIUM)"),
            (!root.as_ref().is_some_and(|r| r.join("index.html").is_file())).then_some("the frontend's static/ directory (KILN_TEST_FRONT_END)"),
        ]
        .into_iter()
        .flatten()
        .collect();
        if !missing.is_empty() {
            assert!(std::env::var_os("CI").is_none(), "CI must provide {missing:?} (.ci/run installs them)");
            eprintln!("SKIPPED: missing {missing:?}; .ci/run installs them");
            return None;
        }
        Some(BrowserTest { python, chromium, root: root.unwrap() })
    }

    /// Runs the script against `kiln` (signing in with `key`), screenshots
    /// under `artifacts` in the tests' temporary folder.
    fn run(&self, kiln: &Kiln, artifacts: &str, key: Option<&str>) {
        let here = Path::new(env!("CARGO_MANIFEST_DIR"));
        let artifacts = Path::new(env!("CARGO_TARGET_TMPDIR")).join(artifacts);
        let _ = std::fs::remove_dir_all(&artifacts);
        let started = std::time::Instant::now();
        let out = Command::new(&self.python)
            .arg(here.join("../tests/browser/comfyui_frontend.py"))
            .arg(&kiln.base)
            .arg(here.join("../tests/fixtures/ui-workflow.json"))
            .arg(&artifacts)
            .args(key)
            .env("CHROMIUM", &self.chromium)
            .output()
            .expect("python runs");
        let log = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        eprintln!("{log}");
        eprintln!("browser test took {:.1}s; screenshots in {}", started.elapsed().as_secs_f64(), artifacts.display());
        assert!(out.status.success(), "the browser test failed:\n{log}");
        assert!(artifacts.join("final.png").is_file());
    }
}

/// `kiln accounts …` (the real binary) against `kiln serve --mode cloud`
/// (the real binary): the key it prints once opens both surfaces, and
/// `list`, `credit`, `subscription`, `disable` change what the server does.
#[tokio::test]
async fn the_accounts_cli_manages_a_cloud_server() {
    const OPERATOR: &str = "cli-operator-token";
    let data = tempfile::tempdir().unwrap();
    let kiln = spawn(data.path(), &[("KILN_ADMIN_TOKEN", OPERATOR)], &["--mode", "cloud"]);
    let cli = |args: &[&str], token: Option<&str>| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_kiln"));
        cmd.arg("accounts").arg("--url").arg(&kiln.base).args(args).env_remove("KILN_ADMIN_TOKEN");
        if let Some(t) = token {
            cmd.env("KILN_ADMIN_TOKEN", t);
        }
        let out = cmd.output().unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (ok, stdout, stderr) = cli(&["create", "carol", "--credits", "50", "--tier", "pro"], Some(OPERATOR));
    assert!(ok, "{stdout}{stderr}");
    let key = stdout.lines().find_map(|l| l.strip_prefix("key: ")).unwrap_or_else(|| panic!("{stdout}")).to_string();
    assert!(key.starts_with("kiln_") && stdout.contains("carol") && stdout.contains("pro"), "{stdout}");
    // The same key on both surfaces.
    let http = reqwest::Client::new();
    let v2 = http.get(format!("{}/api/v2/jobs", kiln.base)).bearer_auth(&key).send().await.unwrap();
    assert_eq!(v2.status(), 200);
    let compat = http.get(format!("{}/api/queue", kiln.base)).header("X-API-Key", &key).send().await.unwrap();
    assert_eq!(compat.status(), 200);
    let (ok, stdout, _) = cli(&["list"], Some(OPERATOR));
    assert!(ok && stdout.contains("carol") && stdout.contains("50") && !stdout.contains(&key), "{stdout}");
    let (ok, stdout, _) = cli(&["credit", "carol", "-60"], Some(OPERATOR));
    assert!(ok && stdout.contains("-10"), "{stdout}");
    let prompt = json!({ "prompt": heavy(1) });
    let refused = http.post(format!("{}/api/prompt", kiln.base)).header("X-API-Key", &key).json(&prompt).send().await.unwrap();
    assert_eq!(refused.status(), 402, "no credits");
    cli(&["credit", "carol", "100"], Some(OPERATOR));
    let (ok, stdout, _) = cli(&["subscription", "carol", "inactive"], Some(OPERATOR));
    assert!(ok && stdout.contains("inactive"), "{stdout}");
    let refused = http.post(format!("{}/api/prompt", kiln.base)).header("X-API-Key", &key).json(&prompt).send().await.unwrap();
    assert_eq!(refused.status(), 429, "inactive subscription");
    let (ok, _, _) = cli(&["disable", "carol"], Some(OPERATOR));
    assert!(ok);
    let v2 = http.get(format!("{}/api/v2/jobs", kiln.base)).bearer_auth(&key).send().await.unwrap();
    assert_eq!(v2.status(), 403);
    // Without the operator token, or with an account key, the CLI is refused.
    let (ok, _, stderr) = cli(&["list"], None);
    assert!(!ok && stderr.contains("KILN_ADMIN_TOKEN"), "{stderr}");
    let (ok, _, stderr) = cli(&["list"], Some("wrong"));
    assert!(!ok && stderr.contains("401"), "{stderr}");
    let (ok, _, stderr) = cli(&["create", "carol"], Some(OPERATOR));
    assert!(!ok && stderr.contains("409"), "{stderr}");
}

/// `kiln deployments` against a real `kiln serve`: the admin token from
/// `KILN_ADMIN_TOKEN` on both sides, create → ready, stop → 422
/// `deployment_stopped`, start → serving again, and the deployments are
/// still there after a SIGKILL and restart.
#[tokio::test]
async fn the_deployments_cli_creates_stops_and_starts_a_deployment_that_survives_sigkill() {
    let data = tempfile::tempdir().unwrap();
    let token = "cli-operator-token";
    let env = [("KILN_ADMIN_TOKEN", token)];
    let http = reqwest::Client::new();
    let cli = |base: &str, args: &[&str], token: Option<&str>| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_kiln"));
        cmd.arg("deployments").args(["--url", base]).args(args).env_remove("KILN_ADMIN_TOKEN");
        if let Some(t) = token {
            cmd.env("KILN_ADMIN_TOKEN", t);
        }
        cmd.output().unwrap()
    };
    let kiln = spawn(data.path(), &env, &[]);
    let base = kiln.base.clone();
    let out = cli(&base, &["create", "cli-dep", "--owner", "local", "--max-running", "1", "--max-queued", "4"], Some(token));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let created: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((created["id"].as_str(), created["state"].as_str()), (Some("cli-dep"), Some("starting")));
    assert_eq!(created["limits"], json!({ "max_running": 1, "max_queued": 4 }));
    // A wrong token is refused (exit 1, the server's message); none at all never reaches the server.
    let out = cli(&base, &["stop", "cli-dep"], Some("wrong"));
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("401"), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!cli(&base, &["list"], None).status.success());

    let jobs = format!("{base}/deployment/cli-dep/api/v2/jobs");
    let mut ready = false;
    for _ in 0..400 {
        if http.get(&jobs).send().await.unwrap().status() == 200 {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(ready, "the deployment never became ready");
    let out = cli(&base, &["stop", "cli-dep"], Some(token));
    assert!(out.status.success());
    let resp = http.get(&jobs).send().await.unwrap();
    assert_eq!(resp.status(), 422);
    assert_eq!(resp.json::<Value>().await.unwrap()["error"]["code"], "deployment_stopped");

    // SIGKILL: the stopped deployment is still there, still stopped.
    drop(kiln);
    let kiln = spawn(data.path(), &env, &[]);
    let base = kiln.base.clone();
    let out = cli(&base, &["list"], Some(token));
    let list: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(list["deployments"][0]["state"], "stopped", "{list}");
    let out = cli(&base, &["start", "cli-dep"], Some(token));
    assert!(out.status.success());
    let jobs = format!("{base}/deployment/cli-dep/api/v2/jobs");
    for _ in 0..400 {
        if http.get(&jobs).send().await.unwrap().status() == 200 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("the restarted deployment never served");
}

/// The partner proxy configured the way an operator does it, through the
/// environment of the real binary: the route accepts the configured tokens
/// only, and the provider (a small loopback server here) sees the provider
/// key and the validated body; without a provider URL the route answers 503.
#[tokio::test]
async fn the_partner_proxy_is_configured_from_the_environment() {
    use axum::http::HeaderMap;
    /// What the provider received: its key header and the body.
    type Seen = std::sync::Arc<std::sync::Mutex<Vec<(Option<String>, Value)>>>;
    let seen: Seen = Default::default();
    let record = seen.clone();
    let provider = axum::Router::new().route(
        "/v1/ai/skin-enhancer/flexible",
        axum::routing::post(move |headers: HeaderMap, axum::Json(body): axum::Json<Value>| {
            let record = record.clone();
            async move {
                record.lock().unwrap().push((headers.get("x-freepik-api-key").and_then(|v| v.to_str().ok()).map(String::from), body));
                axum::Json(json!({ "data": { "task_id": "t-1", "status": "CREATED", "generated": [] } }))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, provider).await.unwrap() });

    let data = tempfile::tempdir().unwrap();
    let base_url = format!("http://127.0.0.1:{port}");
    let env = [("KILN_PARTNER_BASE_URL", base_url.as_str()), ("KILN_PARTNER_API_KEY", "pk-env"), ("KILN_PARTNER_TOKENS", "tok-a, tok-b")];
    let kiln = spawn(data.path(), &env, &[]);
    let http = reqwest::Client::new();
    let route = format!("{}/proxy/partner/v1/ai/skin-enhancer/flexible", kiln.base);
    let body = json!({ "image": "aGVsbG8=" });
    let refused = http.post(&route).bearer_auth("tok-c").json(&body).send().await.unwrap();
    assert_eq!(refused.status(), 401);
    let created = http.post(&route).header("X-API-KEY", "tok-b").json(&body).send().await.unwrap();
    assert_eq!(created.status(), 200);
    assert_eq!(created.json::<Value>().await.unwrap(), json!({ "data": { "task_id": "t-1", "status": "CREATED", "generated": [] } }));
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "the refused request never reached the provider");
    assert_eq!(seen[0].0.as_deref(), Some("pk-env"));
    assert_eq!(seen[0].1, json!({ "image": "aGVsbG8=", "optimized_for": "enhance_skin", "sharpen": 0, "smart_grain": 2 }));

    // Without a provider URL the same binary answers 503.
    let unconfigured_data = tempfile::tempdir().unwrap();
    let unconfigured = spawn(unconfigured_data.path(), &[("KILN_PARTNER_TOKENS", "tok-a")], &[]);
    let resp = http.post(format!("{}/proxy/partner/v1/ai/skin-enhancer/flexible", unconfigured.base)).bearer_auth("tok-a").json(&body).send().await.unwrap();
    assert_eq!(resp.status(), 503);
}
