//! Compatibility API benchmarks against a real `kiln serve` on loopback.
//!
//! Run: `cargo bench -p kiln --bench compat` (builds the release binary).
//! Prints, for BENCHMARKS.md ("Compatibility API"): `GET /api/object_info`
//! and `GET /api/queue` requests/s (64 connections, 5 s, an in-process
//! client, and `wrk` when installed); the WebSocket bytes a 200-node chain
//! sends (text and binary frames of that prompt); submit → `execution_success`
//! latency over the WebSocket for a trivial workflow (p50/p95 of 300); and the
//! server's RSS with 1000 idle WebSockets open. The result cache is off so
//! every job runs. A machine probe is printed first and last (compare runs
//! whose probes agree).

use std::time::{Duration, Instant};

mod common;

use common::{Server, get_rate, machine_probe, raise_fd_limit, rss_kib, start_with};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Map, Value, json};
use tokio_tungstenite::tungstenite::Message;

fn start() -> Server {
    start_with(&[])
}

fn chain(n: usize) -> Value {
    let mut wf = Map::new();
    wf.insert("0".into(), json!({ "class_type": "EmptyImage", "inputs": { "width": 8, "height": 8, "batch_size": 1, "color": 0 } }));
    for i in 1..=n {
        wf.insert(i.to_string(), json!({ "class_type": "ImageInvert", "inputs": { "image": [(i - 1).to_string(), 0] } }));
    }
    wf.insert("out".into(), json!({ "class_type": "PreviewImage", "inputs": { "images": [n.to_string(), 0] } }));
    Value::Object(wf)
}

type Ws = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn connect(base: &str) -> Ws {
    let url = format!("{}/ws?clientId=bench", base.replacen("http://", "ws://", 1));
    tokio_tungstenite::connect_async(url).await.expect("websocket").0
}

async fn queue(http: &reqwest::Client, base: &str, prompt: &Value) -> String {
    let body: Value =
        http.post(format!("{base}/api/prompt")).json(&json!({ "prompt": prompt, "client_id": "bench" })).send().await.unwrap().json().await.unwrap();
    body["prompt_id"].as_str().unwrap_or_else(|| panic!("{body}")).to_string()
}

/// Reads `ws` until `prompt_id` ends: the bytes of its frames (text, binary).
async fn follow(ws: &mut Ws, prompt_id: &str) -> (usize, usize) {
    let (mut text, mut binary) = (0, 0);
    while let Some(msg) = ws.next().await {
        match msg.unwrap() {
            Message::Text(t) => {
                let v: Value = serde_json::from_str(&t).unwrap();
                if v["data"]["prompt_id"] != prompt_id {
                    continue;
                }
                text += t.len();
                let kind = v["type"].as_str().unwrap_or("");
                if matches!(kind, "execution_success" | "execution_error" | "execution_interrupted") {
                    return (text, binary);
                }
            }
            Message::Binary(b) => binary += b.len(),
            _ => {}
        }
    }
    panic!("the socket closed before {prompt_id} ended");
}

fn main() {
    raise_fd_limit();
    println!("{}", machine_probe());
    let server = start();
    let (base, pid) = (server.base.clone(), server.child.id());
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    rt.block_on(async {
        let http = reqwest::Client::new();
        // 1–2. Read routes.
        get_rate(&http, &format!("{base}/api/object_info"), "GET /api/object_info").await;
        get_rate(&http, &format!("{base}/api/queue"), "GET /api/queue").await;

        // 3. WebSocket bytes of a 200-node chain.
        let mut ws = connect(&base).await;
        let id = queue(&http, &base, &chain(200)).await;
        let (text, binary) = follow(&mut ws, &id).await;
        println!(
            "WebSocket bytes for a 200-node chain (202 nodes): {text} B of text frames, {binary} B binary ({:.1} KB in all)",
            (text + binary) as f64 / 1000.0
        );

        // 4. Submit → execution_success over the WebSocket, trivial workflow.
        let trivial = json!({
            "1": { "class_type": "EmptyImage", "inputs": { "width": 8, "height": 8, "batch_size": 1, "color": 0 } },
            "2": { "class_type": "PreviewImage", "inputs": { "images": ["1", 0] } }
        });
        let mut latencies = Vec::new();
        for i in 0..330 {
            let t0 = Instant::now();
            let id = queue(&http, &base, &trivial).await;
            follow(&mut ws, &id).await;
            if i >= 30 {
                latencies.push(t0.elapsed().as_secs_f64() * 1e3);
            }
        }
        latencies.sort_by(f64::total_cmp);
        let pct = |p: f64| latencies[((latencies.len() - 1) as f64 * p).round() as usize];
        println!("submit → execution_success over the WebSocket (300 after 30 warm-up): p50 {:.2} ms, p95 {:.2} ms", pct(0.5), pct(0.95));
        let _ = ws.close(None).await;

        // 5. RSS with 1000 idle WebSockets.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let before = rss_kib(pid);
        let mut open = Vec::new();
        for _ in 0..1000 {
            let mut ws = connect(&base).await;
            // The first frame is `status`.
            let _ = ws.next().await;
            open.push(ws);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        let after = rss_kib(pid);
        println!(
            "RSS with 1000 idle WebSockets open: {:.1} MiB (before them {:.1} MiB; {:.1} KiB per socket)",
            after as f64 / 1024.0,
            before as f64 / 1024.0,
            (after as f64 - before as f64) / 1000.0
        );
        for mut ws in open {
            let _ = ws.send(Message::Close(None)).await;
        }
    });
    println!("{}", machine_probe());
}
