//! Hosts with different plugin sets (their plugin folders): a job records the components it was
//! validated against when submitted, and when its host dies, a host whose
//! plugin of that name is another build leaves it alone (it would run other
//! code); a host that has the very component takes it and runs it. A job
//! a client asks to cancel meanwhile is taken at once and ended canceled.
//! A plugin's previews reach the streams that watch its job on a host
//! that cannot run it: an event stream and the owner's WebSocket.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::*;

/// `examples/custom-node` (class `ExamplePosterize`) as built before.
pub(super) const POSTERIZE: &[u8] = include_bytes!("../../../tests/fixtures/plugins/custom-node-kiln-plugin-0.1.0.wasm");

/// The same component with a custom section appended: it behaves alike,
/// but it is another build, with another hash.
pub(super) fn another_build() -> Vec<u8> {
    let mut bytes = POSTERIZE.to_vec();
    // Section 0 (custom), 10 bytes: a 9-byte name and no payload.
    bytes.extend([0u8, 10, 9]);
    bytes.extend(b"kiln-test");
    bytes
}

/// The manifest of plugin `example-posterize`.
pub(super) const MANIFEST: &str =
    "name = \"example-posterize\"\nversion = \"1.0.0\"\ncomponent = \"plugin.wasm\"\n[limits]\nmemory_mb = 256\ntimeout_ms = 30000\n";

/// A plugin folder holding `component` as plugin `example-posterize`, for
/// one host's `KILN_PLUGIN_DIRS`; and the component's hash.
pub(super) fn plugin_folder(component: &[u8]) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("kiln-plugin.toml"), MANIFEST).unwrap();
    std::fs::write(dir.path().join("plugin.wasm"), component).unwrap();
    (dir, format!("blake3:{}", blake3::hash(component).to_hex()))
}

/// `KILN_PLUGIN_DIRS` naming `folder`.
pub(super) fn plugin_dirs(folder: &tempfile::TempDir) -> (&'static str, &str) {
    ("KILN_PLUGIN_DIRS", folder.path().to_str().unwrap())
}

/// A few seconds of blurs, then the plugin's posterize, then a save.
fn posterized() -> Value {
    let mut graph = slow(4);
    graph["p"] = json!({"class_type": "ExamplePosterize", "inputs": {"image": ["21", 0], "levels": 3}});
    graph["99"]["inputs"]["images"] = json!(["p", 0]);
    graph
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_is_taken_over_only_by_a_host_with_its_components() {
    let Some(mut shared) = shared().await else { return };
    // A 6 s lease: a job waits 60 s for a host with its components, well
    // past what this test needs to start a third host.
    for (key, value) in shared.iter_mut() {
        if key == "KILN_LEASE_S" {
            *value = "6".into();
        }
    }
    let ((first, v1), (second, other)) = (plugin_folder(POSTERIZE), plugin_folder(&another_build()));
    assert_ne!(v1, other);
    let one_worker = ("KILN_MAX_RUNNING_JOBS", "1");
    let (mut p1, p2) = (start_with("p1", &shared, &[one_worker, plugin_dirs(&first)]), start_with("p2", &shared, &[one_worker, plugin_dirs(&second)]));
    let http = reqwest::Client::new();

    let id = submit(&http, &p1, posterized()).await;
    wait_for(&http, &p2, &id, &["running"], Duration::from_secs(30)).await;
    // One job at a time: the second waits, its components recorded as
    // validated at submission.
    let waiting = submit(&http, &p1, posterized()).await;
    let doomed = submit(&http, &p1, posterized()).await;
    let queued = job(&http, &p2, &waiting).await;
    assert_eq!((queued["status"].as_str(), &queued["components"]["example-posterize"]), (Some("queued"), &json!(v1)), "{queued}");
    p1.child.kill().unwrap();
    p1.child.wait().unwrap();

    // p2 ends p1's lapsed lease (and looks for its jobs in the same
    // transaction, every heartbeat after): the job is not p2's.
    let db = sqlx::PgPool::connect(&env(&shared, "KILN_DATABASE_URL")).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (p1_rows,): (i64,) = sqlx::query_as("SELECT count(*) FROM hosts WHERE host_id = 'p1'").fetch_one(&db).await.unwrap();
        if p1_rows == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "p1's lease never lapsed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    for (id, left_as) in [(&id, "running"), (&waiting, "queued")] {
        let (holder,): (Option<String>,) = sqlx::query_as("SELECT holder FROM jobs WHERE id = $1").bind(id).fetch_one(&db).await.unwrap();
        assert!(holder.as_deref().is_some_and(|h| h.starts_with("p1/")), "still the dead host's, not p2's: {holder:?}");
        assert_eq!(job(&http, &p2, id).await["status"], left_as, "as the dead host left it");
    }

    // A cancel asked of a dead host's job: the job is taken over at once,
    // whatever it needs, and ended canceled, never run.
    let resp = http.post(format!("{}/api/v2/jobs/{doomed}/cancel", p2.base)).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let canceled = wait_for(&http, &p2, &doomed, &["canceled", "succeeded", "failed"], Duration::from_secs(30)).await;
    assert_eq!((canceled["status"].as_str(), &canceled["started_at"]), (Some("canceled"), &Value::Null), "{canceled}");

    // A host with the very component: it takes the job once it has it.
    let p3 = start_with("p3", &shared, &[one_worker, plugin_dirs(&first)]);
    for id in [&id, &waiting] {
        let done = wait_for(&http, &p2, id, &["succeeded", "failed", "canceled"], Duration::from_secs(90)).await;
        assert_eq!(done["status"], "succeeded", "{done}");
        assert_eq!(done["components"]["example-posterize"], v1.as_str(), "run on the component it was validated against: {done}");
        let (holder,): (Option<String>,) = sqlx::query_as("SELECT holder FROM jobs WHERE id = $1").bind(id).fetch_one(&db).await.unwrap();
        assert_eq!(holder, None, "finished, held by none");
    }
    drop(p3);
}

/// A noisy 256² PNG (its preview, posterized, is far over NOTIFY's size).
fn noise() -> Vec<u8> {
    let (w, h) = (256u32, 256u32);
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let pixels: Vec<u8> = (0..w * h * 3)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect();
    let mut out = Vec::new();
    let mut encoder = png::Encoder::new(&mut out, w, h);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    encoder.write_header().unwrap().write_image_data(&pixels).unwrap();
    out
}

/// The noisy image posterized to `levels` (the plugin's preview; each job
/// its own, so none is served from the cache), then scaled up and blurred
/// for a few seconds.
fn noisy_posterized(image: &str, levels: i64) -> Value {
    let mut graph = json!({
        "l": {"class_type": "LoadImage", "inputs": {"image": image}},
        "p": {"class_type": "ExamplePosterize", "inputs": {"image": ["l", 0], "levels": levels}},
        "1": {"class_type": "ImageScaleBy", "inputs": {"image": ["p", 0], "upscale_method": "nearest-exact", "scale_by": 4.0}},
    });
    let last = blurs(&mut graph, 14);
    graph["99"] = json!({"class_type": "SaveImage", "inputs": {"images": [last, 0], "filename_prefix": "noisy"}});
    graph
}

/// Queues `workflow` as a ComfyUI prompt on `host` (its `LoadImage` names
/// an upload): its id.
async fn prompt(http: &reqwest::Client, host: &Host, workflow: Value) -> String {
    let queued: Value = http.post(format!("{}/api/prompt", host.base)).json(&json!({ "prompt": workflow })).send().await.unwrap().json().await.unwrap();
    queued["prompt_id"].as_str().unwrap_or_else(|| panic!("{queued}")).to_string()
}

/// The frames of an SSE stream until the `until` event (or 120 s).
async fn frames_until(stream: &mut reqwest::Response, until: &str) -> String {
    let mut seen = String::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    while !seen.contains(until) {
        match tokio::time::timeout_at(deadline.into(), stream.chunk()).await {
            Ok(Ok(Some(chunk))) => seen.push_str(&String::from_utf8_lossy(&chunk)),
            _ => break,
        }
    }
    seen
}

/// The preview frames in an SSE text: (node, PNG bytes).
fn previews_in(seen: &str) -> Vec<(String, usize)> {
    use base64::Engine;
    seen.split("\n\n")
        .filter(|frame| frame.contains("event: preview"))
        .filter_map(|frame| {
            let data: Value = serde_json::from_str(frame.split("data: ").nth(1)?).ok()?;
            let png = base64::engine::general_purpose::STANDARD.decode(data["data_base64"].as_str()?).ok()?;
            (data["content_type"] == "image/png" && png.starts_with(b"\x89PNG")).then(|| (data["node_id"].as_str().unwrap_or("").to_string(), png.len()))
        })
        .collect()
}

/// Jobs only one host can run (the other lacks their plugin), each watched
/// from the other host one way only: an event stream opened while the job
/// waits, one opened after its preview was made (it gets that preview, the
/// job's latest), and a WebSocket of the owner. Each hears the plugin's
/// preview — over NOTIFY's size, so sent through the database to that host
/// alone — as it would on the host running the job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn previews_reach_streams_on_another_host() {
    use futures_util::StreamExt;
    let Some(shared) = shared().await else { return };
    let (folder, _) = plugin_folder(POSTERIZE);
    let one_worker = ("KILN_MAX_RUNNING_JOBS", "1");
    let (runner, watcher) = (start_with("v1", &shared, &[one_worker, plugin_dirs(&folder)]), start_with("v2", &shared, &[one_worker]));
    let http = reqwest::Client::new();
    let form = reqwest::multipart::Form::new().part("image", reqwest::multipart::Part::bytes(noise()).file_name("noise.png").mime_str("image/png").unwrap());
    let uploaded: Value = http.post(format!("{}/api/upload/image", runner.base)).multipart(form).send().await.unwrap().json().await.unwrap();
    let image = uploaded["name"].as_str().unwrap_or_else(|| panic!("{uploaded}")).to_string();

    // An event stream on the other host, opened while the job waits there.
    let blocker = submit(&http, &runner, slow(1)).await;
    let early = prompt(&http, &runner, noisy_posterized(&image, 3)).await;
    let mut stream = http.get(format!("{}/api/v2/jobs/{early}/events", watcher.base)).send().await.unwrap();
    assert_eq!(stream.status(), 200);
    let seen = frames_until(&mut stream, "\"status\":\"succeeded\"").await;
    assert!(seen.contains("\"status\":\"succeeded\""), "{blocker} then {early} ran on the host with the plugin: {seen}");
    let previews = previews_in(&seen);
    assert!(previews.iter().any(|(node, bytes)| node == "p" && *bytes > 7000), "the plugin's large preview on the other host's stream: {previews:?}");

    // One opened after the preview was made: the job's latest, at once.
    let late = prompt(&http, &runner, noisy_posterized(&image, 4)).await;
    let mut local = http.get(format!("{}/api/v2/jobs/{late}/events", runner.base)).send().await.unwrap();
    assert!(frames_until(&mut local, "event: preview").await.contains("event: preview"));
    let mut stream = http.get(format!("{}/api/v2/jobs/{late}/events", watcher.base)).send().await.unwrap();
    let seen = frames_until(&mut stream, "\"status\":\"succeeded\"").await;
    assert!(previews_in(&seen).iter().any(|(node, _)| node == "p"), "the latest preview reached a stream opened after it: {seen}");

    // A WebSocket of the owner on the other host, and no event stream.
    let ws_url = format!("{}/ws?clientId=elsewhere", watcher.base.replacen("http", "ws", 1));
    let (mut socket, _) = tokio_tungstenite::connect_async(ws_url).await.unwrap();
    let watched = prompt(&http, &runner, noisy_posterized(&image, 5)).await;
    let (mut previews, mut ended) = (0, false);
    let heard = tokio::time::timeout(Duration::from_secs(120), async {
        while let Some(Ok(message)) = socket.next().await {
            match message {
                tokio_tungstenite::tungstenite::Message::Binary(frame) if frame.len() > 7000 && frame[8..].starts_with(b"\x89PNG") => previews += 1,
                tokio_tungstenite::tungstenite::Message::Text(text) => {
                    let message: Value = serde_json::from_str(&text).unwrap();
                    if message["type"] == "execution_success" && message["data"]["prompt_id"] == watched.as_str() {
                        ended = true;
                        return;
                    }
                }
                _ => {}
            }
        }
    })
    .await;
    assert!(heard.is_ok() && ended, "the socket heard the job end");
    assert!(previews >= 1, "and its large preview");
}
