//! The compatibility WebSocket (`/ws`): jobs submitted on `/api/v2`, their
//! messages checked against the reference captures
//! (`tests/fixtures/comfyui/captures/ws-*.jsonl`): the sequence of message
//! types and each message's keys (not ids or timestamps).

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

use crate::api::{TestServer, asset_ref, png_bytes, start, start_default};

type Socket = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// A frame as a test sees it.
#[derive(Debug, Clone)]
enum Frame {
    Json(Value),
    Binary(Vec<u8>),
}

struct Ws {
    socket: Socket,
}

fn ws_url(server: &TestServer, query: &str) -> String {
    format!("{}/ws{query}", server.server.url().replacen("http://", "ws://", 1))
}

async fn connect(server: &TestServer, query: &str) -> Ws {
    let (socket, _) = tokio_tungstenite::connect_async(ws_url(server, query)).await.expect("the WebSocket opens");
    Ws { socket }
}

impl Ws {
    /// The next text or binary frame (at most 30 s).
    async fn next(&mut self) -> Frame {
        loop {
            let message = tokio::time::timeout(Duration::from_secs(30), self.socket.next())
                .await
                .expect("a frame within 30 s")
                .expect("the socket is open")
                .expect("a valid frame");
            match message {
                Message::Text(text) => return Frame::Json(serde_json::from_str(&text).expect("JSON text frames")),
                Message::Binary(bytes) => return Frame::Binary(bytes.to_vec()),
                _ => continue,
            }
        }
    }

    async fn next_json(&mut self) -> Value {
        loop {
            if let Frame::Json(v) = self.next().await {
                return v;
            }
        }
    }

    async fn send_json(&mut self, value: Value) {
        self.socket.send(Message::Text(value.to_string().into())).await.unwrap();
    }

    /// Every frame up to and including `executing {node: null}` of `prompt_id`.
    async fn until_done(&mut self, prompt_id: &str) -> Vec<Frame> {
        let mut frames = Vec::new();
        loop {
            let frame = self.next().await;
            let done = matches!(&frame, Frame::Json(m) if m["type"] == "executing" && m["data"]["node"].is_null() && m["data"]["prompt_id"] == prompt_id);
            frames.push(frame);
            if done {
                return frames;
            }
        }
    }
}

/// The JSON messages of `frames`.
fn texts(frames: &[Frame]) -> Vec<Value> {
    frames.iter().filter_map(|f| if let Frame::Json(v) = f { Some(v.clone()) } else { None }).collect()
}

/// The text messages a capture received after it posted its prompt.
fn capture(name: &str) -> Vec<Value> {
    let path = format!("{}/../tests/fixtures/comfyui/captures/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut posted = false;
    let mut messages = Vec::new();
    for line in text.lines() {
        let entry: Value = serde_json::from_str(line).unwrap();
        if entry["dir"] == "http" && entry["path"].as_str().is_some_and(|p| p.starts_with("/prompt")) {
            posted = true;
        } else if posted && entry["dir"] == "recv" && entry["kind"] == "text" {
            messages.push(entry["msg"].clone());
        }
    }
    messages
}

/// A message's type as the comparison sees it (`executing` with a null node
/// is a message of its own).
fn kind(message: &Value) -> String {
    let t = message["type"].as_str().unwrap_or_default();
    if t == "executing" && message["data"]["node"].is_null() { "executing(null)".into() } else { t.into() }
}

fn kinds(messages: &[Value]) -> Vec<String> {
    messages.iter().map(kind).collect()
}

fn keys(value: &Value) -> BTreeSet<String> {
    value.as_object().map(|m| m.keys().cloned().collect()).unwrap_or_default()
}

/// Each of our messages has the keys the capture's messages of its type
/// have (and a `progress_state` node entry those of the capture's).
fn assert_same_keys(ours: &[Value], reference: &[Value]) {
    let mut by_kind: HashMap<String, &Value> = HashMap::new();
    for m in reference {
        by_kind.entry(kind(m)).or_insert(m);
    }
    for m in ours {
        let Some(r) = by_kind.get(&kind(m)) else { continue };
        assert_eq!(keys(&m["data"]), keys(&r["data"]), "keys of {m} vs the capture's {r}");
        if m["type"] == "progress_state" {
            let ours = m["data"]["nodes"].as_object().unwrap().values().next().unwrap();
            let theirs = r["data"]["nodes"].as_object().unwrap().values().next().unwrap();
            assert_eq!(keys(ours), keys(theirs), "progress_state entries");
        }
        if m["type"] == "executed" {
            assert_eq!(keys(&m["data"]["output"]), keys(&r["data"]["output"]), "executed.output");
            assert_eq!(keys(&m["data"]["output"]["images"][0]), keys(&r["data"]["output"]["images"][0]), "executed.output.images[]");
        }
    }
}

/// The messages from the job's queue change on: those the capture has
/// after its POST (the capture's own job began with `status`).
fn job_messages(frames: &[Frame], prompt_id: &str) -> Vec<Value> {
    let all = texts(frames);
    // Ours begin with the submission's `status`; anything else before it
    // (another job's) is not this job's.
    let start = all.iter().position(|m| m["type"] == "status").unwrap_or(0);
    all[start..].iter().filter(|m| m["type"] == "status" || m["data"]["prompt_id"] == prompt_id).cloned().collect()
}

/// LoadImage → ImageBlur(5, 1.0) → SaveImage, as in the captures.
fn blur(asset: &Value, prefix: &str) -> Value {
    json!({
        "1": { "class_type": "LoadImage", "inputs": { "image": asset_ref(asset) } },
        "2": { "class_type": "ImageBlur", "inputs": { "image": ["1", 0], "blur_radius": 5, "sigma": 1.0 } },
        "3": { "class_type": "SaveImage", "inputs": { "images": ["2", 0], "filename_prefix": prefix } },
    })
}

/// Submits `workflow` on `/api/v2` and collects this socket's frames of it.
async fn run(server: &TestServer, ws: &mut Ws, workflow: Value) -> (String, Vec<Frame>) {
    let job = server.submit(workflow).await;
    let id = job["id"].as_str().unwrap().to_string();
    let frames = ws.until_done(&id).await;
    (id, frames)
}

#[tokio::test]
async fn connect_sends_status_with_the_sid_and_answers_feature_flags() {
    let server = start_default().await;
    let reference: Vec<Value> =
        std::fs::read_to_string(format!("{}/../tests/fixtures/comfyui/captures/ws-connect-feature-flags.jsonl", env!("CARGO_MANIFEST_DIR")))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap()["msg"].clone())
            .collect();

    let mut ws = connect(&server, "?clientId=my-client-1").await;
    let status = ws.next_json().await;
    assert_eq!(status["type"], "status");
    assert_eq!(status["data"]["sid"], "my-client-1");
    assert_eq!(status["data"]["status"]["exec_info"]["queue_remaining"], 0);
    assert_eq!(keys(&status["data"]), keys(&reference[0]["data"]));
    ws.send_json(json!({ "type": "feature_flags", "data": { "supports_preview_metadata": true } })).await;
    let flags = ws.next_json().await;
    assert_eq!(flags["type"], "feature_flags", "{flags}");
    assert_eq!(flags["data"]["supports_preview_metadata"], true);
    assert!(flags["data"]["max_upload_size"].as_u64().unwrap() > 0);
    // Only the first frame is looked at.
    ws.send_json(json!({ "type": "feature_flags", "data": {} })).await;

    // No clientId: a fresh uuid hex; `/api/ws` works too.
    let url = format!("{}/api/ws", server.server.url().replacen("http://", "ws://", 1));
    let (mut other, _) = tokio_tungstenite::connect_async(url).await.unwrap();
    let Some(Ok(Message::Text(text))) = other.next().await else { panic!("a status frame") };
    let status: Value = serde_json::from_str(&text).unwrap();
    let sid = status["data"]["sid"].as_str().unwrap();
    assert!(sid.len() == 32 && sid.chars().all(|c| c.is_ascii_hexdigit()), "{sid}");

    // A job afterwards: the second feature_flags frame was not answered.
    let (_, frames) = run(&server, &mut ws, crate::api::trivial(1)).await;
    assert!(texts(&frames).iter().all(|m| m["type"] != "feature_flags"));
}

#[tokio::test]
async fn fresh_cached_and_partly_cached_runs_match_the_captures() {
    let server = start_default().await;
    let (status, asset) = server.upload("anchor.png", png_bytes(64, 64, 3), None).await;
    assert_eq!(status, 201, "{asset}");
    let mut ws = connect(&server, "?clientId=c").await;
    assert_eq!(ws.next_json().await["type"], "status");

    // (a) a fresh run.
    let (id, frames) = run(&server, &mut ws, blur(&asset, "anchor_blur")).await;
    let ours = job_messages(&frames, &id);
    let reference = capture("ws-a-blur.jsonl");
    assert_eq!(kinds(&ours), kinds(&reference), "fresh run: {ours:#?}");
    assert_same_keys(&ours, &reference);
    let queue: Vec<u64> =
        ours.iter().filter(|m| m["type"] == "status").map(|m| m["data"]["status"]["exec_info"]["queue_remaining"].as_u64().unwrap()).collect();
    assert_eq!(queue, [1, 1, 0], "queued, running, done");
    let executed = ours.iter().find(|m| m["type"] == "executed").unwrap();
    assert_eq!(executed["data"]["node"], "3");
    let image = &executed["data"]["output"]["images"][0];
    assert_eq!(image["type"], "output");
    assert!(image["filename"].as_str().unwrap().starts_with("anchor_blur_"), "{image}");
    assert_eq!(ours.iter().find(|m| m["type"] == "execution_cached").unwrap()["data"]["nodes"], json!([]));
    let states: Vec<(String, String)> = ours
        .iter()
        .filter(|m| m["type"] == "progress_state")
        .map(|m| {
            let nodes = m["data"]["nodes"].as_object().unwrap();
            assert_eq!(nodes.len(), 1, "only the node that changed: {m}");
            let (node, entry) = nodes.iter().next().unwrap();
            (node.clone(), entry["state"].as_str().unwrap().to_string())
        })
        .collect();
    let expected: Vec<(String, String)> =
        ["1", "2", "3"].iter().flat_map(|n| [(n.to_string(), "running".to_string()), (n.to_string(), "finished".to_string())]).collect();
    assert_eq!(states, expected);
    for m in &ours {
        if m["type"] != "status" {
            assert_eq!(m["data"]["prompt_id"], id.as_str(), "{m}");
        }
    }

    // (b) the same again: everything cached; the output node re-reports
    // the same file.
    let (id_b, frames) = run(&server, &mut ws, blur(&asset, "anchor_blur")).await;
    let ours_b = job_messages(&frames, &id_b);
    let reference = capture("ws-b-blur-again.jsonl");
    assert_eq!(kinds(&ours_b), kinds(&reference), "cached run: {ours_b:#?}");
    assert_same_keys(&ours_b, &reference);
    assert_eq!(ours_b.iter().find(|m| m["type"] == "execution_cached").unwrap()["data"]["nodes"], json!(["1", "2", "3"]));
    let again = ours_b.iter().find(|m| m["type"] == "executed").unwrap();
    assert_eq!(again["data"]["output"], executed["data"]["output"], "the cached UI output");

    // (b2) only the prefix changed: 1 and 2 cached, 3 runs.
    let (id_c, frames) = run(&server, &mut ws, blur(&asset, "anchor_blur2")).await;
    let ours_c = job_messages(&frames, &id_c);
    let reference = capture("ws-b2-partial-cache.jsonl");
    assert_eq!(kinds(&ours_c), kinds(&reference), "partly cached run: {ours_c:#?}");
    assert_same_keys(&ours_c, &reference);
    assert_eq!(ours_c.iter().find(|m| m["type"] == "execution_cached").unwrap()["data"]["nodes"], json!(["1", "2"]));
}

#[tokio::test]
async fn a_runtime_error_matches_the_capture() {
    let server = start_default().await;
    let mut ws = connect(&server, "").await;
    ws.next_json().await;
    let (id, frames) = run(&server, &mut ws, json!({ "1": { "class_type": "HostilePanic", "inputs": { "trigger": 1 } } })).await;
    let ours = job_messages(&frames, &id);
    let reference = capture("ws-c-runtime-error.jsonl");
    assert_eq!(kinds(&ours), kinds(&reference), "{ours:#?}");
    assert_same_keys(&ours, &reference);
    let error = &ours.iter().find(|m| m["type"] == "execution_error").unwrap()["data"];
    assert_eq!(error["node_id"], "1");
    assert_eq!(error["node_type"], "HostilePanic");
    assert_eq!(error["exception_type"], "RuntimeError");
    assert!(error["exception_message"].as_str().unwrap().ends_with('\n'), "{error}");
    assert_eq!(error["executed"], json!([]));
    assert!(error["traceback"].is_array());
}

#[tokio::test]
async fn a_memory_limit_hit_is_an_oom_error() {
    let server = start_default().await;
    let mut ws = connect(&server, "").await;
    ws.next_json().await;
    let (id, frames) = run(&server, &mut ws, json!({ "1": { "class_type": "HostileMemoryBomb", "inputs": { "trigger": 0 } } })).await;
    let ours = job_messages(&frames, &id);
    let error = &ours.iter().find(|m| m["type"] == "execution_error").expect("an execution_error")["data"];
    assert_eq!(error["exception_type"], "OOMError", "{error}");
    assert_eq!(error["node_type"], "HostileMemoryBomb");
}

#[tokio::test]
async fn an_interrupt_names_the_node_that_was_stopped() {
    let server = start_default().await;
    let mut ws = connect(&server, "").await;
    ws.next_json().await;
    let workflow = json!({
        "1": { "class_type": "EmptyImage", "inputs": { "width": 8, "height": 8, "batch_size": 1, "color": 0 } },
        "2": { "class_type": "SaveImage", "inputs": { "images": ["1", 0], "filename_prefix": "before" } },
        "3": { "class_type": "HostileInfiniteLoop", "inputs": { "trigger": 0 } },
    });
    let job = server.submit(workflow).await;
    let id = job["id"].as_str().unwrap().to_string();
    // Cancel once the spinning node runs and the other branch is done (the
    // two may run side by side).
    let mut frames = Vec::new();
    let (mut spinning, mut saved) = (false, false);
    while !(spinning && saved) {
        let frame = ws.next().await;
        if let Frame::Json(m) = &frame {
            spinning |= m["type"] == "executing" && m["data"]["node"] == "3";
            saved |= m["type"] == "progress_state" && m["data"]["nodes"]["2"]["state"] == "finished";
        }
        frames.push(frame);
    }
    let resp = server.http.post(server.url(&format!("/jobs/{id}/cancel"))).send().await.unwrap();
    assert!(resp.status().is_success());
    frames.extend(ws.until_done(&id).await);
    let ours = job_messages(&frames, &id);
    let reference = capture("ws-d-interrupt.jsonl");
    // ComfyUI lets the running node finish and stops at the next one; kiln
    // stops the running node: the run ends the same way.
    let tail = |m: &[Value]| kinds(&m[m.len() - 3..]);
    assert_eq!(tail(&ours), tail(&reference), "{ours:#?}");
    assert_eq!(kinds(&ours[..4]), kinds(&reference[..4]), "status, status, execution_start, execution_cached");
    assert_same_keys(&ours, &reference);
    assert!(ours.iter().all(|m| !["execution_success", "execution_error"].contains(&m["type"].as_str().unwrap())));
    let interrupted = &ours.iter().find(|m| m["type"] == "execution_interrupted").unwrap()["data"];
    assert_eq!(interrupted["node_id"], "3", "the node that was stopped");
    assert_eq!(interrupted["node_type"], "HostileInfiniteLoop");
    let mut executed: Vec<&str> = interrupted["executed"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    executed.sort();
    assert_eq!(executed, ["1", "2"]);
    assert_eq!(server.wait(&id).await["status"], "canceled");
}

#[tokio::test]
async fn previews_and_progress_text_are_binary_frames() {
    let server = start_default().await;
    let mut plain = connect(&server, "").await;
    plain.next_json().await;
    let mut meta = connect(&server, "").await;
    meta.next_json().await;
    meta.send_json(json!({ "type": "feature_flags", "data": { "supports_preview_metadata": true } })).await;
    assert_eq!(meta.next_json().await["type"], "feature_flags");

    // trigger 8: 8 KiB of text past the first line, cut by the host to 4 KiB.
    let workflow = json!({ "7": { "class_type": "HostilePreviewText", "inputs": { "trigger": 8 } } });
    let (id, frames) = run(&server, &mut plain, workflow).await;
    let meta_frames = meta.until_done(&id).await;

    let binary = |frames: &[Frame]| -> Vec<Vec<u8>> { frames.iter().filter_map(|f| if let Frame::Binary(b) = f { Some(b.clone()) } else { None }).collect() };
    let be = |b: &[u8], at: usize| u32::from_be_bytes(b[at..at + 4].try_into().unwrap());
    let png_magic = [0x89, b'P', b'N', b'G'];

    let plain_binary = binary(&frames);
    assert_eq!(plain_binary.len(), 2, "a preview and a text frame");
    let preview = &plain_binary[0];
    assert_eq!((be(preview, 0), be(preview, 4)), (1, 2), "PREVIEW_IMAGE, PNG");
    assert_eq!(preview[8..12], png_magic);
    let text = &plain_binary[1];
    assert_eq!(be(text, 0), 3, "TEXT");
    let n = be(text, 4) as usize;
    assert_eq!(&text[8..8 + n], b"7");
    let body = std::str::from_utf8(&text[8 + n..]).unwrap();
    assert!(body.starts_with("width: 4, height: 4\n batch size: 8"), "{body}");
    assert_eq!(body.len(), 4096, "bounded by the host");

    let meta_binary = binary(&meta_frames);
    let preview = &meta_binary[0];
    assert_eq!(be(preview, 0), 4, "PREVIEW_IMAGE_WITH_METADATA");
    let n = be(preview, 4) as usize;
    let json: Value = serde_json::from_slice(&preview[8..8 + n]).unwrap();
    assert_eq!(json["prompt_id"], id.as_str());
    assert_eq!(json["node_id"], "7");
    for key in ["display_node_id", "real_node_id", "parent_node_id"] {
        assert!(json.get(key).is_some(), "{json}");
    }
    assert_eq!(preview[8 + n..12 + n], png_magic);
    assert_eq!(be(&meta_binary[1], 0), 3);

    // The node's steps: `progress` 1/2 and 2/2, with the node's state.
    let progress: Vec<(u64, u64)> = texts(&frames)
        .iter()
        .filter(|m| m["type"] == "progress")
        .map(|m| {
            assert_eq!(m["data"]["node"], "7");
            assert_eq!(m["data"]["prompt_id"], id.as_str());
            (m["data"]["value"].as_u64().unwrap(), m["data"]["max"].as_u64().unwrap())
        })
        .collect();
    assert_eq!(progress.last(), Some(&(2, 2)), "{progress:?}");
    assert_same_keys(&texts(&frames), &capture("ws-g-binary-plain.jsonl"));
}

/// EmptyImage → n−2 × ImageInvert → SaveImage.
fn chain(n: usize, color: i64) -> Value {
    let mut workflow = serde_json::Map::new();
    workflow.insert("1".into(), json!({ "class_type": "EmptyImage", "inputs": { "width": 4, "height": 4, "batch_size": 1, "color": color } }));
    for i in 2..n {
        workflow.insert(i.to_string(), json!({ "class_type": "ImageInvert", "inputs": { "image": [(i - 1).to_string(), 0] } }));
    }
    workflow.insert(n.to_string(), json!({ "class_type": "SaveImage", "inputs": { "images": [(n - 1).to_string(), 0], "filename_prefix": "chain" } }));
    Value::Object(workflow)
}

#[tokio::test]
async fn progress_state_of_a_200_node_chain_stays_linear() {
    let server = start_default().await;
    let mut ws = connect(&server, "").await;
    ws.next_json().await;
    let (id, frames) = run(&server, &mut ws, chain(200, 5)).await;
    let messages = job_messages(&frames, &id);
    let bytes: usize = messages.iter().map(|m| m.to_string().len()).sum();
    let state_bytes: usize = messages.iter().filter(|m| m["type"] == "progress_state").map(|m| m.to_string().len()).sum();
    let count = messages.iter().filter(|m| m["type"] == "progress_state").count();
    println!("200-node chain: {} messages, {bytes} bytes ({count} progress_state: {state_bytes} bytes); ComfyUI: 612 frames, 8.1 MB", messages.len());
    assert_eq!(count, 400, "a start and a finish per node");
    assert!(bytes < 200_000, "{bytes} bytes for a 200-node chain");
}

/// Two branches running at once: each `progress_state` carries every node
/// running then, since the official frontend replaces its map of the job's
/// node states with each message (a message naming only the node that
/// changed would hide the other running node).
#[tokio::test]
async fn progress_state_carries_every_running_node() {
    let server = start_default().await;
    let mut ws = connect(&server, "").await;
    ws.next_json().await;
    let workflow = json!({
        "1": { "class_type": "EmptyImage", "inputs": { "width": 1024, "height": 1024, "batch_size": 1, "color": 7 } },
        "2": { "class_type": "ImageBlur", "inputs": { "image": ["1", 0], "blur_radius": 31, "sigma": 8.0 } },
        "3": { "class_type": "ImageBlur", "inputs": { "image": ["1", 0], "blur_radius": 29, "sigma": 7.0 } },
        "4": { "class_type": "PreviewImage", "inputs": { "images": ["2", 0] } },
        "5": { "class_type": "PreviewImage", "inputs": { "images": ["3", 0] } },
    });
    let (id, frames) = run(&server, &mut ws, workflow).await;
    let states: Vec<Value> = job_messages(&frames, &id).into_iter().filter(|m| m["type"] == "progress_state").collect();
    // Both blurs become ready together and start in one scheduling pass:
    // the second's start names the first as running too.
    let both = states.iter().any(|m| {
        let nodes = m["data"]["nodes"].as_object().unwrap();
        ["2", "3"].iter().all(|n| nodes.get(*n).is_some_and(|e| e["state"] == "running"))
    });
    assert!(both, "{states:#?}");
    // Never more than the running nodes and the one that changed.
    assert!(states.iter().all(|m| m["data"]["nodes"].as_object().unwrap().len() <= 2), "{states:#?}");
    // A stream ComfyUI could have sent, parallel branches and all: every
    // `executed` and `progress` follows an `executing` naming its node,
    // with no other `executing` in between.
    let mut said = Value::Null;
    let mut executed = 0;
    for m in job_messages(&frames, &id) {
        match m["type"].as_str() {
            Some("executing") => said = m["data"]["node"].clone(),
            Some("executed" | "progress") => {
                assert_eq!(m["data"]["node"], said, "{m} after executing {said}");
                executed += usize::from(m["type"] == "executed");
            }
            _ => {}
        }
    }
    assert_eq!(executed, 2, "both previews reported");
}

/// A connection that reads nothing: a small receive buffer, so the server's
/// writes back up soon.
async fn stalled(server: &TestServer) -> Socket {
    let addr = server.server.url().trim_start_matches("http://").split('/').next().unwrap().parse().unwrap();
    let tcp = tokio::net::TcpSocket::new_v4().unwrap();
    tcp.set_recv_buffer_size(4096).unwrap();
    let stream = tcp.connect(addr).await.unwrap();
    let (socket, _) = tokio_tungstenite::client_async(ws_url(server, "?clientId=stalled"), tokio_tungstenite::MaybeTlsStream::Plain(stream)).await.unwrap();
    socket
}

#[tokio::test]
async fn a_client_that_never_reads_holds_up_neither_jobs_nor_other_clients() {
    let server = start_default().await;
    let mut stalled = stalled(&server).await;
    let mut reader = connect(&server, "?clientId=reader").await;
    reader.next_json().await;
    // 12 jobs of 200 nodes, each showing 4 KiB of progress text: ~10 MB,
    // more than the kernel's socket buffers and the connection's own.
    let mut sent = 0;
    for round in 0..12 {
        let workflow: serde_json::Map<String, Value> =
            (1..=200).map(|i| (i.to_string(), json!({ "class_type": "HostilePreviewText", "inputs": { "trigger": 10 + round * 1000 + i } }))).collect();
        let (id, frames) = run(&server, &mut reader, Value::Object(workflow)).await;
        sent += frames.len();
        // Every message of the job.
        let texts_sent = frames.iter().filter(|f| matches!(f, Frame::Binary(b) if b[..4] == [0, 0, 0, 3])).count();
        assert_eq!(texts_sent, 200);
        let messages = job_messages(&frames, &id);
        assert_eq!(kind(&messages[2]), "execution_start");
        // 200 independent nodes run in parallel: each named by an
        // `executing` (again before its own text when another was named since).
        let named: std::collections::HashSet<String> =
            messages.iter().filter(|m| m["type"] == "executing" && !m["data"]["node"].is_null()).map(|m| m["data"]["node"].to_string()).collect();
        assert_eq!(named.len(), 200);
        assert_eq!(messages.iter().filter(|m| m["type"] == "execution_success").count(), 1);
        assert_eq!(server.wait(&id).await["status"], "succeeded");
    }
    // The stalled connection fell behind past its buffer and was dropped:
    // reading it now ends before everything the reader got.
    let mut got = 0;
    let ended = loop {
        match tokio::time::timeout(Duration::from_secs(10), stalled.next()).await {
            Ok(Some(Ok(_))) => got += 1,
            Ok(Some(Err(_)) | None) => break true,
            Err(_) => break false,
        }
    };
    println!("the stalled client got {got} of {sent} frames before it was dropped");
    assert!(ended && got < sent, "dropped: {ended}, {got} of {sent} frames");
}

#[tokio::test]
async fn every_connection_of_the_owner_gets_every_job_whatever_its_client_id() {
    let server = start_default().await;
    let mut a = connect(&server, "?clientId=a").await;
    a.next_json().await;
    let mut b = connect(&server, "?clientId=a").await;
    b.next_json().await;
    let (id, frames) = run(&server, &mut a, crate::api::trivial(3)).await;
    let other = b.until_done(&id).await;
    assert_eq!(kinds(&job_messages(&frames, &id)), kinds(&job_messages(&other, &id)));
}

#[tokio::test]
async fn with_a_token_the_socket_requires_it() {
    let server = start(|c, _| c.token = Some("s3cret".into())).await;
    for query in ["", "?token=wrong"] {
        match tokio_tungstenite::connect_async(ws_url(&server, query)).await {
            Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => assert_eq!(resp.status(), 401, "{query}"),
            other => panic!("{query}: {:?}", other.map(|(_, r)| r.status())),
        }
    }
    let mut ws = connect(&server, "?token=s3cret&clientId=x").await;
    assert_eq!(ws.next_json().await["data"]["sid"], "x");
}

#[tokio::test]
async fn a_refused_submission_sends_nothing_as_in_the_capture() {
    // ComfyUI validates inside `POST /prompt` and sends no frame for a
    // refused prompt (ws-c-validation.jsonl holds only HTTP exchanges); a
    // v2 job is validated before it is queued, and the same holds.
    assert!(capture("ws-c-validation.jsonl").is_empty());
    let server = start_default().await;
    let mut ws = connect(&server, "").await;
    ws.next_json().await;
    let bad = json!({ "1": { "class_type": "EmptyImage", "inputs": { "width": 0, "height": 8, "batch_size": 1, "color": 0 } },
                      "2": { "class_type": "SaveImage", "inputs": { "images": ["1", 0], "filename_prefix": "x" } } });
    let (status, body, _) = server.post_job(&json!({ "workflow": bad }), None).await;
    assert_eq!(status, 422, "{body}");
    let (id, frames) = run(&server, &mut ws, crate::api::trivial(9)).await;
    let first = &texts(&frames)[0];
    assert_eq!(first["type"], "status", "the next job's queue change comes first: {first}");
    assert!(texts(&frames).iter().all(|m| m["type"] == "status" || m["data"]["prompt_id"] == id.as_str()));
}

#[tokio::test]
async fn status_tells_every_queue_change() {
    let server = start(|_, o| o.max_running_jobs = 1).await;
    let mut ws = connect(&server, "").await;
    assert_eq!(ws.next_json().await["data"]["status"]["exec_info"]["queue_remaining"], 0);
    let remaining = |m: &Value| m["data"]["status"]["exec_info"]["queue_remaining"].as_u64().unwrap();
    let mut counts = Vec::new();
    // A runs (it spins until canceled); B waits behind it.
    let a = server.submit(crate::api::spinner(1)).await["id"].as_str().unwrap().to_string();
    loop {
        let m = ws.next_json().await;
        if m["type"] == "status" {
            counts.push(remaining(&m));
        }
        if m["type"] == "executing" && m["data"]["prompt_id"] == a.as_str() {
            break;
        }
    }
    // A client connecting now hears which node runs (ComfyUI's reconnect
    // variant: no prompt_id).
    let mut late = connect(&server, "").await;
    assert_eq!(remaining(&late.next_json().await), 1);
    assert_eq!(late.next_json().await, json!({ "type": "executing", "data": { "node": "1" } }));
    let b = server.submit(crate::api::trivial(4)).await["id"].as_str().unwrap().to_string();
    let m = ws.next_json().await;
    assert_eq!(m["type"], "status", "{m}");
    counts.push(remaining(&m));
    server.http.post(server.url(&format!("/jobs/{b}/cancel"))).send().await.unwrap();
    let m = ws.next_json().await;
    assert_eq!(m["type"], "status", "{m}");
    counts.push(remaining(&m));
    server.http.post(server.url(&format!("/jobs/{a}/cancel"))).send().await.unwrap();
    for frame in ws.until_done(&a).await {
        if let Frame::Json(m) = frame
            && m["type"] == "status"
        {
            counts.push(remaining(&m));
        }
    }
    // Enqueued, started (running jobs count), B enqueued, B canceled, A over.
    assert_eq!(counts, [1, 1, 2, 1, 0]);
}
