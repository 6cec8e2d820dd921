//! The hostile suite: the real `kiln serve` binary as a child process,
//! attacked over real HTTP on loopback with the requests and plugins that
//! used to take it down or take more than a job's share (graph depth, file
//! names, memory). Each test checks that the job fails with a clear error
//! (or runs), that the server keeps answering, and that its peak memory
//! (`VmHWM`) stays under a generous ceiling: a containment bound that
//! catches gigabytes, not a performance target (those are in BENCHMARKS.md).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Map, Value, json};

#[path = "../../tests/shapes.rs"]
mod shapes;
use shapes::empty;

const HOSTILE_WASM: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/kiln_hostile_guests.wasm"));
const HOSTILE_MANIFEST: &str = include_str!("../../tests/guests/hostile/kiln-plugin.toml");

/// The job memory bound the server runs with here.
const JOB_MEMORY_MB: u64 = 256;
/// What the whole server may reach at its peak: the bound of the one job
/// running at a time (256), the result cache (64), the plugins and the
/// runtime (~60 idle), with room to spare (measured: 376 at most). Low
/// enough to catch the wide graph unbounded (its 16 big images alone are
/// 768 MiB); before the limits, these attacks took 1.5+ GB.
const PEAK_CEILING_MB: u64 = 640;

struct Kiln {
    child: Child,
    base: String,
    http: reqwest::Client,
    _plugins: tempfile::TempDir,
    _data: tempfile::TempDir,
}

/// Writes the hostile plugin into `dir`, under the manifest name `name`.
fn install(dir: &Path, name: &str) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("kiln-plugin.toml"), HOSTILE_MANIFEST.replace("name = \"hostile\"", &format!("name = \"{name}\""))).unwrap();
    std::fs::write(dir.join("kiln_hostile_guests.wasm"), HOSTILE_WASM).unwrap();
}

/// `kiln serve` on `data` loading the plugins under `plugins`, the partner
/// key granted to the directory `granted`, one job at a time, and bounds.
fn serve(data: &Path, plugins: &Path, granted: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kiln"));
    cmd.args(["serve", "--port", "0", "--data-dir"])
        .arg(data)
        .env("KILN_CACHE_DIR", Path::new(env!("CARGO_TARGET_TMPDIR")).join("kiln-artifacts"))
        .env("KILN_PLUGIN_DIRS", plugins)
        .env("KILN_SECRET_PLUGINS", granted.canonicalize().unwrap())
        .env("KILN_JOB_MEMORY_MB", JOB_MEMORY_MB.to_string())
        .env("KILN_MAX_RUNNING_JOBS", "1")
        .env("KILN_RESULT_CACHE_MB", "64")
        .env("KILN_LOG", "warn");
    cmd
}

/// `kiln serve` with the hostile plugin (granted the partner key).
fn spawn() -> Kiln {
    spawn_with(&[])
}

/// [`spawn`] with more settings (`KILN_*` variables).
fn spawn_with(env: &[(&str, &str)]) -> Kiln {
    let data = tempfile::tempdir().unwrap();
    let plugins = tempfile::tempdir().unwrap();
    let dir = plugins.path().join("hostile");
    install(&dir, "hostile");
    let mut cmd = serve(data.path(), plugins.path(), &dir);
    cmd.envs(env.iter().copied());
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn().expect("kiln serve starts");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let base = line.trim().strip_prefix("kiln listening on ").unwrap_or_else(|| panic!("unexpected first line {line:?}")).to_string();
    Kiln { child, base: format!("{base}/api/v2"), http: reqwest::Client::new(), _plugins: plugins, _data: data }
}

impl Drop for Kiln {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Kiln {
    /// A line of `/proc/<pid>/status` in MiB (`VmHWM`, `VmRSS`).
    fn status_mb(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let line = status.lines().find(|l| l.starts_with(field)).unwrap_or_else(|| panic!("no {field}"));
        line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() / 1024
    }

    /// The server still answers, and its peak memory is under the ceiling.
    async fn assert_contained(&mut self) {
        assert!(self.child.try_wait().unwrap().is_none(), "the server is still running");
        let health = self.http.get(format!("{}/health", self.base)).send().await.unwrap();
        assert_eq!(health.status(), 200);
        let peak = self.status_mb("VmHWM:");
        eprintln!("server peak so far: {peak} MiB");
        assert!(peak < PEAK_CEILING_MB, "server peak {peak} MiB over the {PEAK_CEILING_MB} MiB ceiling");
    }

    async fn post_owned(&self, body: Value) -> (u16, Value) {
        self.post(&body).await
    }

    /// Waits for job `id` to end; returns it.
    async fn wait(&self, id: &str) -> Value {
        for _ in 0..2400 {
            let job: Value = self.http.get(format!("{}/jobs/{id}", self.base)).send().await.unwrap().json().await.unwrap();
            if ["succeeded", "failed", "canceled"].contains(&job["status"].as_str().unwrap_or("")) {
                return job;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("job {id} never finished");
    }

    async fn post(&self, body: &Value) -> (u16, Value) {
        let resp = self.http.post(format!("{}/jobs", self.base)).json(body).send().await.unwrap();
        (resp.status().as_u16(), resp.json().await.unwrap())
    }

    /// Submits `workflow` (201 expected) and waits for the job to end.
    async fn run(&self, workflow: Value) -> Value {
        let (status, job) = self.post(&json!({ "workflow": workflow })).await;
        assert_eq!(status, 201, "{job}");
        self.wait(job["id"].as_str().unwrap()).await
    }
}

fn invert_chain(n: usize) -> Map<String, Value> {
    shapes::invert_chain(n, 8)
}

fn failed_with(job: &Value, code: &str, says: &str) {
    assert_eq!(job["status"], "failed", "{job}");
    assert_eq!(job["error"]["code"], code, "{job}");
    let message = job["error"]["message"].as_str().unwrap();
    assert!(message.contains(says), "{message:?} should say {says:?}");
    assert!(message.len() < 1024, "a clear message, not an echo of the input: {} bytes", message.len());
}

#[tokio::test]
async fn deep_and_large_graphs_are_validated_without_recursion_and_bounded() {
    let mut kiln = spawn();
    // ~700 nodes aborted the server with a stack overflow; 4,900 is under
    // the default node limit and runs.
    let done = kiln.run(Value::Object(invert_chain(4_900))).await;
    assert_eq!(done["status"], "succeeded", "{done}");
    // Over the node limit, and over the size limit: invalid_workflow naming the setting.
    let (status, err) = kiln.post(&json!({ "workflow": invert_chain(5_000) })).await;
    assert_eq!((status, err["error"]["code"].as_str()), (422, Some("invalid_workflow")), "{err}");
    assert!(err["error"]["message"].as_str().unwrap().contains("max_workflow_nodes"), "{err}");
    // On a connection of its own: the server answers before reading the
    // whole body and closes it, which a pooled client could reuse.
    let resp =
        reqwest::Client::new().post(format!("{}/jobs", kiln.base)).header("content-type", "application/json").body(vec![b' '; 9 << 20]).send().await.unwrap();
    assert_eq!(resp.status(), 422);
    assert!(resp.json::<Value>().await.unwrap()["error"]["message"].as_str().unwrap().contains("max_workflow_kb"));
    // A long cycle is a validation error, found in linear time.
    let mut ring = invert_chain(4_000);
    ring.insert("0".into(), json!({ "class_type": "ImageInvert", "inputs": { "image": ["4000", 0] } }));
    let (status, err) = kiln.post(&json!({ "workflow": ring })).await;
    assert_eq!(status, 422, "{err}");
    assert!(err.to_string().contains("dependency_cycle"), "{err}");
    kiln.assert_contained().await;

    // `kiln run` refuses the same graphs with exit 2 naming the limit.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("big.json");
    std::fs::write(&file, serde_json::to_vec(&Value::Object(invert_chain(5_000))).unwrap()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["run", "--out"])
        .arg(dir.path())
        .arg(&file)
        .env("KILN_CACHE_DIR", Path::new(env!("CARGO_TARGET_TMPDIR")).join("kiln-artifacts"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("max_workflow_nodes"));
}

#[tokio::test]
async fn file_names_and_counts_cannot_amplify_memory_or_disk() {
    let mut kiln = spawn();
    // A 1 MiB prefix on a 96-image batch raised RSS by ~1.5 GB.
    let prefix = "p".repeat(1 << 20);
    let job = kiln
        .run(json!({
            "1": empty(64, 96),
            "2": { "class_type": "SaveImage", "inputs": { "images": ["1", 0], "filename_prefix": prefix } }
        }))
        .await;
    failed_with(&job, "node_invalid_output", "prefix too long");
    // A plugin saving 400 files under 256 KiB prefixes, ignoring every refusal.
    let job = kiln.run(json!({ "1": { "class_type": "HostileFileFlood", "inputs": { "trigger": 400, "prefix_kb": 256 } } })).await;
    failed_with(&job, "node_invalid_output", "prefix too long");
    // 40,000 empty outputs from one node: bounded by node_max_files.
    let job = kiln.run(json!({ "1": { "class_type": "HostileFileFlood", "inputs": { "trigger": 40_000, "prefix_kb": 0 } } })).await;
    failed_with(&job, "node_invalid_output", "node_max_files");
    assert_eq!(job["outputs"].as_array().map_or(0, Vec::len), 0, "a failed node's files are not outputs");
    // Three nodes of 4,000 files each: bounded per job (job_max_files, 10,000).
    let flood = |n: usize| {
        (0..n).map(|i| (i.to_string(), json!({ "class_type": "HostileFileFlood", "inputs": { "trigger": 4_000, "prefix_kb": 0 } }))).collect::<Map<_, _>>()
    };
    let job = kiln.run(Value::Object(flood(3))).await;
    failed_with(&job, "node_invalid_output", "job_max_files");
    kiln.assert_contained().await;
}

/// From 512², each branch's big image is 2048²×3 f32 = 48 MiB.
fn wide_tree(leaves: usize, size: u32) -> Value {
    shapes::wide_tree(leaves, size, 4.0)
}

#[tokio::test]
async fn a_job_holds_at_most_its_memory_bound_and_gives_it_back() {
    let mut kiln = spawn();
    let before = kiln.status_mb("VmRSS:");
    // 16 branches of 48 MiB each (768 MiB if all leaves ran first; 1.5 GB
    // peak before the bound): run branch by branch within 256 MiB.
    let job = kiln.run(wide_tree(16, 512)).await;
    assert_eq!(job["status"], "succeeded", "{job}");
    kiln.assert_contained().await;
    // A 3 KB request asking for 8192² × 4 batch (3 GiB): a clear job error.
    let job = kiln
        .run(json!({
            "1": empty(1024, 4),
            "2": { "class_type": "ImageScaleBy", "inputs": { "image": ["1", 0], "upscale_method": "nearest-exact", "scale_by": 8.0 } },
            "3": { "class_type": "PreviewImage", "inputs": { "images": ["2", 0] } }
        }))
        .await;
    failed_with(&job, "job_out_of_memory", "job_memory_mb");
    kiln.assert_contained().await;
    // Memory goes back once the server is idle (the trimmer runs after a
    // few quiet seconds): read /proc only, no requests meanwhile.
    // What stays after the idle trim varied from +67 to +181 MiB between
    // runs (steady state, runs of 2026-11-24/25; why is not understood yet:
    // RELIABILITY.md); the peak of the 48 MiB branches is 300–500 MiB, and
    // the trim itself returned ~50 MiB in a traced run.
    const KEPT_MB: u64 = 192;
    let mut rss = u64::MAX;
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        rss = kiln.status_mb("VmRSS:");
        if rss < before + KEPT_MB {
            break;
        }
    }
    eprintln!("RSS before {before} MiB, after the jobs and an idle pause {rss} MiB");
    assert!(rss < before + KEPT_MB, "memory returned after the jobs: {before} → {rss} MiB");
}

#[tokio::test]
async fn a_plugin_cannot_claim_another_plugins_grant_by_its_name() {
    let data = tempfile::tempdir().unwrap();
    let plugins = tempfile::tempdir().unwrap();
    let granted = plugins.path().join("hostile");
    install(&granted, "hostile");
    // An impostor beside it claiming the same name (asking for nothing, so
    // only its name is in question): refused at start.
    let impostor = plugins.path().join("impostor");
    install(&impostor, "hostile");
    let manifest = std::fs::read_to_string(impostor.join("kiln-plugin.toml")).unwrap();
    std::fs::write(impostor.join("kiln-plugin.toml"), manifest.replace("secrets = [\"api_key_svc_org\"]", "")).unwrap();
    let out = serve(data.path(), plugins.path(), &granted).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "two plugins named `hostile` must not start");
    assert!(stderr.contains("impostor") && stderr.contains("names must be unique"), "{stderr}");
    // The impostor alone, named like the granted plugin (whose directory
    // it is not): it asks for the partner key and is refused; the grant
    // binds to the directory, not the name.
    let alone = tempfile::tempdir().unwrap();
    install(&alone.path().join("impostor"), "hostile");
    let out = serve(data.path(), alone.path(), &granted).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "an ungranted plugin asking for a secret must not load");
    assert!(stderr.contains("api_key_svc_org") && stderr.contains("not granted"), "{stderr}");
}

#[tokio::test]
async fn a_node_sees_the_hosts_virtual_clock_not_the_real_one() {
    let mut kiln = spawn();
    let job = kiln.run(json!({ "7": { "class_type": "HostileClockProbe", "inputs": { "trigger": 1 } } })).await;
    assert_eq!(job["status"], "succeeded", "{job}");
    let url = job["outputs"][0]["url"].as_str().unwrap();
    let report = kiln.http.get(url).send().await.unwrap().text().await.unwrap();
    // 2000-01-01T00:00:00Z, whatever the time is: no timing channel
    // between tenants, and the cached result is what a re-run computes.
    assert!(report.starts_with("wall=946684800.000000000 "), "{report}");
    kiln.assert_contained().await;
}

/// Two tenants on one server: a public demo deployment running the hostile
/// plugin (a flood of jobs that spin, exhaust memory, panic and spam their
/// logs) beside the server's own caller running small jobs. The second
/// tenant's jobs all succeed, the deployment's limit keeps the flood to one
/// worker, and the server stays contained. The second tenant's job latency
/// (server-side `queue_ms + execution_ms`) alone and under the flood is
/// printed for BENCHMARKS.md (no timed assertion).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_tenants_deployment_does_not_stop_another_tenants_jobs() {
    let data = tempfile::tempdir().unwrap();
    let plugins = tempfile::tempdir().unwrap();
    let dir = plugins.path().join("hostile");
    install(&dir, "hostile");
    let mut child = serve(data.path(), plugins.path(), &dir)
        .env("KILN_MAX_RUNNING_JOBS", "2")
        .env("KILN_ADMIN_TOKEN", "hostile-suite-operator")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("kiln serve starts");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let root = line.trim().strip_prefix("kiln listening on ").unwrap().to_string();
    let mut kiln = Kiln { child, base: format!("{root}/api/v2"), http: reqwest::Client::new(), _plugins: plugins, _data: data };
    let spec = json!({ "id": "evil", "owner": "someone-else", "plugin_dirs": [dir], "public_demo": true,
                       "limits": { "max_running": 1, "max_queued": 100 } });
    let resp = kiln.http.post(format!("{root}/admin/deployments")).bearer_auth("hostile-suite-operator").json(&spec).send().await.unwrap();
    assert_eq!(resp.status(), 201);
    let evil = format!("{root}/deployment/evil/api/v2");
    let mut ready = false;
    for _ in 0..2400 {
        if kiln.http.get(format!("{evil}/health")).send().await.unwrap().status() == 200 {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(ready, "the deployment never became ready");

    let small = |i: i64| {
        json!({ "1": { "class_type": "EmptyImage", "inputs": { "width": 64, "height": 64, "batch_size": 1, "color": i } },
                                 "2": { "class_type": "SaveImage", "inputs": { "images": ["1", 0], "filename_prefix": "ok" } } })
    };
    let latency = |job: &Value| job["metrics"]["queue_ms"].as_i64().unwrap() + job["metrics"]["execution_ms"].as_i64().unwrap();
    let mut alone = Vec::new();
    for i in 0..20 {
        let job = kiln.run(small(i)).await;
        assert_eq!(job["status"], "succeeded", "{job}");
        alone.push(latency(&job));
    }
    // The flood: 24 hostile jobs queued on the deployment at once.
    let classes = ["HostileInfiniteLoop", "HostileMemoryBomb", "HostilePanic", "HostileChatty"];
    let mut flood = Vec::new();
    for i in 0..24 {
        let wf = json!({ "1": { "class_type": classes[i % classes.len()], "inputs": { "trigger": i } } });
        let resp = kiln.http.post(format!("{evil}/jobs")).json(&json!({ "workflow": wf })).send().await.unwrap();
        assert_eq!(resp.status(), 201);
        flood.push(resp.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_string());
    }
    let mut loaded = Vec::new();
    for i in 0..20 {
        let job = kiln.run(small(100 + i)).await;
        assert_eq!(job["status"], "succeeded", "the other tenant's job: {job}");
        loaded.push(latency(&job));
    }
    // The flood was still going while the other tenant ran (it takes ~2 s per spinning job on its one slot).
    let (_, still) = {
        let resp = kiln.http.get(format!("{evil}/jobs?status=queued,running")).send().await.unwrap();
        (resp.status(), resp.json::<Value>().await.unwrap())
    };
    assert!(!still["jobs"].as_array().unwrap().is_empty(), "the flood outlasted the other tenant's jobs");
    kiln.assert_contained().await;
    let stats = |v: &mut Vec<i64>| {
        v.sort();
        (v[v.len() / 2], v[v.len() * 95 / 100], v[v.len() - 1])
    };
    let (a50, a95, amax) = stats(&mut alone);
    let (l50, l95, lmax) = stats(&mut loaded);
    eprintln!(
        "other tenant's job latency (queue_ms + execution_ms), 20 jobs: alone p50 {a50} p95 {a95} max {amax} ms; beside the hostile deployment p50 {l50} p95 {l95} max {lmax} ms"
    );
    // Cancel the rest of the flood: every cancel answers.
    for id in &flood {
        let resp = kiln.http.post(format!("{evil}/jobs/{id}/cancel")).send().await.unwrap();
        assert_eq!(resp.status(), 200);
    }
}

/// `EmptyImage → SaveImage` whose EmptyImage carries an input no class
/// reads: `values` one-element arrays (`[1]`, the shape that costs the most
/// parsed: ~90× its text).
fn padded(n: i64, values: usize) -> Value {
    let mut w = json!({
        "1": { "class_type": "EmptyImage", "inputs": { "width": 8, "height": 8, "batch_size": 1, "color": n } },
        "2": { "class_type": "SaveImage", "inputs": { "images": ["1", 0], "filename_prefix": "p" } },
    });
    w["1"]["inputs"]["pad"] = Value::Array(vec![json!([1]); values]);
    w
}

#[tokio::test]
async fn a_submission_costs_a_bounded_multiple_of_its_bytes_and_listings_read_only_what_they_return() {
    let mut kiln = spawn_with(&[("KILN_INTAKE_MEMORY_MB", "160")]);
    let root = kiln.base.trim_end_matches("/api/v2").to_string();
    let start = kiln.status_mb("VmHWM:");
    // 7.4 MiB of one-element arrays: 3.7 M values (it used to parse to
    // +715 MiB); refused on the count, before it is parsed.
    let (status, body) = kiln.post(&json!({ "workflow": padded(0, 1_850_000) })).await;
    assert_eq!(status, 422, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("max_workflow_values"), "{body}");
    let refused = kiln.status_mb("VmHWM:");
    eprintln!("peak {start} MiB at start, {refused} MiB after the refused 7.4 MiB body");
    assert!(refused < start + 48, "a refused body is not parsed: {start} -> {refused} MiB");
    // Four at once just under the count (262,000 values, 1 MiB each):
    // admitted one at a time by the intake budget (160 MiB: one estimate).
    let jobs = futures_util::future::join_all((1..=4).map(|i| kiln.post_owned(json!({ "workflow": padded(i, 130_000) })))).await;
    let mut ids = Vec::new();
    for (status, job) in jobs {
        assert_eq!(status, 201, "{job}");
        ids.push(job["id"].as_str().unwrap().to_string());
    }
    for id in &ids {
        kiln.wait(id).await;
    }
    let admitted = kiln.status_mb("VmHWM:");
    eprintln!("peak {admitted} MiB after four concurrent 1 MiB submissions");
    // Parsing (submissions, and jobs preparing from their stored bytes) is
    // within the 160 MiB intake budget; all four at once took ~4×.
    assert!(admitted < refused + 200, "one parse at a time: {refused} -> {admitted} MiB");
    // Listings page on the records; only what they return is read, and
    // written as it goes (ComfyUI's items carry whole workflows).
    for path in ["/history?max_items=1", "/api/jobs?limit=1", "/history"] {
        let resp = kiln.http.get(format!("{root}{path}")).send().await.unwrap();
        assert_eq!(resp.status(), 200, "{path}");
        let text = resp.text().await.unwrap();
        let body: Value = serde_json::from_str(&text).unwrap();
        if path == "/history" {
            assert_eq!(body.as_object().unwrap().len(), 4);
            assert!(text.len() > 4 * 500_000, "whole workflows: {} bytes", text.len());
        }
    }
    let listed = kiln.status_mb("VmHWM:");
    eprintln!("peak {listed} MiB after the listings");
    assert!(listed < admitted + 32, "listings parse no workflow: {admitted} -> {listed} MiB");
    kiln.assert_contained().await;
}

#[tokio::test]
async fn a_mask_upload_composes_row_by_row() {
    let mut kiln = spawn();
    let root = kiln.base.trim_end_matches("/api/v2").to_string();
    // 6000×6000 canvases of one color: ~150 KiB files, 144 MB decoded each.
    let big = |alpha: u8| {
        let (w, h) = (6000u32, 6000u32);
        let row: Vec<u8> = (0..w).flat_map(|_| [90, 120, 200, alpha]).collect();
        let mut out = Vec::new();
        let mut e = png::Encoder::new(&mut out, w, h);
        e.set_color(png::ColorType::Rgba);
        e.set_depth(png::BitDepth::Eight);
        let mut writer = e.write_header().unwrap();
        let mut stream = writer.stream_writer().unwrap();
        for _ in 0..h {
            std::io::Write::write_all(&mut stream, &row).unwrap();
        }
        stream.finish().unwrap();
        writer.finish().unwrap();
        out
    };
    let (original, mask) = (big(255), big(7));
    let form = reqwest::multipart::Form::new().part("image", reqwest::multipart::Part::bytes(original).file_name("orig.png"));
    let resp = kiln.http.post(format!("{root}/upload/image")).multipart(form).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let start = kiln.status_mb("VmHWM:");
    // Three at once (each used to peak at +275 MiB).
    let uploads = (0..3).map(|i| {
        let form = reqwest::multipart::Form::new()
            .part("image", reqwest::multipart::Part::bytes(mask.clone()).file_name(format!("mask{i}.png")))
            .text("original_ref", r#"{"filename": "orig.png", "type": "input"}"#);
        kiln.http.post(format!("{root}/upload/mask")).multipart(form).send()
    });
    for resp in futures_util::future::join_all(uploads).await {
        let resp = resp.unwrap();
        assert_eq!(resp.status(), 200);
    }
    let peak = kiln.status_mb("VmHWM:");
    eprintln!("three 6000² mask uploads: peak {start} -> {peak} MiB");
    assert!(peak < start + 64, "composed by rows, not canvases: {start} -> {peak} MiB");
    // The composed image is the original with the mask's alpha.
    let bytes = kiln.http.get(format!("{root}/view?filename=mask0.png&type=input")).send().await.unwrap().bytes().await.unwrap();
    let mut reader = png::Decoder::new(std::io::Cursor::new(bytes.to_vec())).read_info().unwrap();
    assert_eq!((reader.info().width, reader.info().height), (6000, 6000));
    let row = reader.next_row().unwrap().unwrap().data().to_vec();
    assert_eq!(&row[..8], &[90, 120, 200, 7, 90, 120, 200, 7]);
    kiln.assert_contained().await;
}
