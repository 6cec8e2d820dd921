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

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde_json::{Map, Value, json};
use tokio_tungstenite::tungstenite::Message;

struct Server {
    child: Child,
    /// `http://127.0.0.1:PORT`
    base: String,
    _data: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start() -> Server {
    let data = tempfile::tempdir().unwrap();
    let server = std::env::var_os("KILN_BENCH_SERVER").unwrap_or_else(|| env!("CARGO_BIN_EXE_kiln").into());
    let mut child = Command::new(server)
        .args(["serve", "--port", "0", "--data-dir"])
        .arg(data.path())
        .env("KILN_RESULT_CACHE_MB", "0")
        .env("KILN_MAX_QUEUED_JOBS", "100000")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("kiln serve");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let base = line.trim().strip_prefix("kiln listening on ").expect("listening line").to_string();
    Server { child, base, _data: data }
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.split_whitespace().next()).and_then(|v| v.parse().ok()).unwrap_or(0)
}

fn raise_fd_limit() {
    // SAFETY: plain getrlimit/setrlimit on a local struct.
    unsafe {
        let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
            lim.rlim_cur = lim.rlim_max.min(65536);
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

/// Single-thread hashing time of 64 MiB: how fast the VM runs right now.
fn machine_probe() -> String {
    let data = vec![7u8; 64 << 20];
    let started = Instant::now();
    let _ = std::hint::black_box(blake3::hash(&data));
    format!("machine probe: blake3 of 64 MiB in {:.1} ms", started.elapsed().as_secs_f64() * 1e3)
}

/// GETs of `url` with 64 connections for 5 s: requests/s (and wrk's figure).
async fn get_rate(http: &reqwest::Client, url: &str, what: &str) {
    let count = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..64 {
        let (http, url, count, stop) = (http.clone(), url.to_string(), count.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let r = http.get(&url).send().await.unwrap();
                assert_eq!(r.status(), 200);
                r.bytes().await.unwrap();
                count.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    println!("{what}, 64 connections, in-process reqwest: {:.0} req/s", count.load(Ordering::Relaxed) as f64 / t0.elapsed().as_secs_f64());
    match Command::new("wrk").args(["-t1", "-c64", "-d5s", url]).output() {
        Ok(out) if out.status.success() => {
            let text = String::from_utf8_lossy(&out.stdout);
            let rate = text.lines().find_map(|l| l.strip_prefix("Requests/sec:")).map(str::trim).unwrap_or("?");
            println!("{what}, 64 connections, wrk -t1: {rate} req/s");
        }
        _ => println!("{what} with wrk: skipped (wrk not installed)"),
    }
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
