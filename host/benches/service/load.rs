//! `-- load`: a bounded load run against one `kiln serve` on loopback, the
//! figures RELIABILITY.md ("Load") records. Three phases, each on a server
//! of its own; the first two keep its one worker busy with a long job (a
//! chain of 4000 blurs of a 512² image, a few MiB steady):
//!
//! 1. **Watchers.** `KILN_BENCH_WATCHERS` (default 2000) ComfyUI
//!    WebSockets on an idle server, then one prompt: every socket must hear
//!    its `execution_success` (an owner's sockets all get its jobs'
//!    messages). Then, on a new server, as many SSE streams on a job queued
//!    behind a long one, which is canceled: every stream must see the queued
//!    job succeed. RSS after each half gives KiB per connection.
//! 2. **At the queue bound.** `KILN_MAX_QUEUED_JOBS=200`: 8 clients submit
//!    for 10 s. Counted: 201s, 429 `queue_full` (each must carry
//!    `Retry-After`), anything else; RSS sampled every second.
//! 3. **Consumers that never read.** 500 WebSockets with a 4 KiB receive
//!    buffer that never read after the handshake, and one that reads, while
//!    a job of `KILN_BENCH_BROADCAST_NODES` (default 200) blurs runs (every
//!    socket of the owner gets its messages, about two per node). Counted: what the reader got, time taken,
//!    RSS before, at the peak, after; how many non-readers the server
//!    closed.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

use crate::common::{Server, rss_kib, start_with};

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// A chain of `nodes` blurs of a 512² image: the one worker busy for
/// `nodes` × ~6 ms with little memory (3 MiB images), so RSS differences
/// are the connections'.
fn chain(nodes: usize) -> Value {
    let mut long = serde_json::Map::new();
    long.insert("0".into(), json!({ "class_type": "EmptyImage", "inputs": { "width": 512, "height": 512, "batch_size": 1, "color": 3 } }));
    for i in 1..=nodes {
        long.insert(i.to_string(), json!({ "class_type": "ImageBlur", "inputs": { "image": [(i - 1).to_string(), 0], "blur_radius": 31, "sigma": 9.0 } }));
    }
    long.insert("out".into(), json!({ "class_type": "PreviewImage", "inputs": { "images": [nodes.to_string(), 0] } }));
    Value::Object(long)
}

/// Starts the long job as a ComfyUI prompt of its own client (so its
/// per-node messages go to that client only); its cancel URL.
async fn blocker(http: &reqwest::Client, base: &str) -> String {
    let body: Value =
        http.post(format!("{base}/api/prompt")).json(&json!({ "prompt": chain(4000), "client_id": "blocker" })).send().await.unwrap().json().await.unwrap();
    format!("{base}/api/v2/jobs/{}/cancel", body["prompt_id"].as_str().unwrap())
}

fn small(n: u64) -> Value {
    json!({
        "1": { "class_type": "EmptyImage", "inputs": { "width": 8, "height": 8, "batch_size": 1, "color": n % 200 } },
        "2": { "class_type": "SaveImage", "inputs": { "images": ["1", 0], "filename_prefix": "load" } },
    })
}

/// RSS with the long job's buffer churn taken out: the least of five
/// readings 50 ms apart.
async fn steady_rss(pid: u32) -> u64 {
    let mut least = u64::MAX;
    for _ in 0..5 {
        least = least.min(rss_kib(pid));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    least
}

fn server(extra: &[(&str, &str)]) -> Server {
    let mut env = vec![("KILN_MAX_RUNNING_JOBS", "1"), ("KILN_MAX_CONNECTIONS", "12000"), ("KILN_MAX_CONNECTIONS_PER_IP", "12000")];
    env.extend_from_slice(extra);
    start_with(&env)
}

pub fn run() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let watchers: usize = std::env::var("KILN_BENCH_WATCHERS").ok().and_then(|n| n.parse().ok()).unwrap_or(2000);
    rt.block_on(watch(watchers));
    rt.block_on(at_the_bound());
    rt.block_on(never_read());
}

async fn watch(n: usize) {
    // WebSockets first, on an idle server: every connection of an owner
    // gets every one of its jobs' messages (the spec's routing), so sockets
    // left unread while a long job runs would fill and be dropped.
    let s = server(&[]);
    let (base, pid) = (s.base.clone(), s.child.id());
    let http = reqwest::Client::new();
    let ws_url = format!("{}/ws", base.replace("http://", "ws://"));
    let rss0 = steady_rss(pid).await;
    let mut rss = Vec::new();
    let mut sockets = Vec::new();
    let t0 = Instant::now();
    for half in 0..2 {
        for i in 0..n / 2 {
            let (ws, _) = tokio_tungstenite::connect_async(format!("{ws_url}?clientId=w{half}-{i}")).await.unwrap();
            sockets.push(ws);
        }
        rss.push(steady_rss(pid).await);
    }
    let ws_secs = t0.elapsed().as_secs_f64();
    let per_socket = (rss[1] as f64 - rss[0] as f64) / (n / 2) as f64;
    let body: Value =
        http.post(format!("{base}/api/prompt")).json(&json!({ "prompt": small(1), "client_id": "w0-0" })).send().await.unwrap().json().await.unwrap();
    let prompt = body["prompt_id"].as_str().unwrap().to_string();
    let heard = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = sockets
        .into_iter()
        .map(|mut ws| {
            let (heard, prompt) = (heard.clone(), prompt.clone());
            tokio::spawn(async move {
                let deadline = Instant::now() + Duration::from_secs(60);
                while let Ok(Some(Ok(msg))) = tokio::time::timeout(deadline.saturating_duration_since(Instant::now()), ws.next()).await {
                    if let Message::Text(text) = msg
                        && text.contains("execution_success")
                        && text.contains(prompt.as_str())
                    {
                        heard.fetch_add(1, Ordering::Relaxed);
                        return;
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        let _ = t.await;
    }
    println!(
        "{n} WebSockets opened in {ws_secs:.2} s, {per_socket:.1} KiB each (second half), RSS {:.1} → {:.1} MiB; {} of {n} heard a prompt's execution_success",
        mib(rss0),
        mib(rss[1]),
        heard.load(Ordering::Relaxed)
    );
    drop(s);

    // SSE streams on a job queued behind the long one.
    let s = server(&[]);
    let (base, pid) = (s.base.clone(), s.child.id());
    let cancel = blocker(&http, &base).await;
    let queued: Value = http.post(format!("{base}/api/v2/jobs")).json(&json!({ "workflow": small(2) })).send().await.unwrap().json().await.unwrap();
    let events = format!("{base}{}", queued["urls"]["events"].as_str().unwrap());
    tokio::time::sleep(Duration::from_millis(800)).await;
    let streams = reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap();
    let rss0 = steady_rss(pid).await;
    let mut open = Vec::new();
    let mut rss = Vec::new();
    let t0 = Instant::now();
    for _ in 0..2 {
        for _ in 0..n / 2 {
            let r = streams.get(&events).send().await.unwrap();
            assert_eq!(r.status(), 200);
            open.push(r);
        }
        rss.push(steady_rss(pid).await);
    }
    let sse_secs = t0.elapsed().as_secs_f64();
    let per_stream = (rss[1] as f64 - rss[0] as f64) / (n / 2) as f64;
    let ended = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = open
        .into_iter()
        .map(|r| {
            let ended = ended.clone();
            tokio::spawn(async move {
                let body = tokio::time::timeout(Duration::from_secs(120), r.text()).await.ok().and_then(Result::ok).unwrap_or_default();
                if body.contains("\"succeeded\"") {
                    ended.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let t1 = Instant::now();
    http.post(&cancel).send().await.unwrap();
    for t in tasks {
        let _ = t.await;
    }
    println!(
        "{n} SSE streams on a queued job opened in {sse_secs:.2} s, {per_stream:.1} KiB each (second half), RSS {:.1} → {:.1} MiB; after the long job's cancel {} of {n} saw the queued job succeed, in {:.2} s",
        mib(rss0),
        mib(rss[1]),
        ended.load(Ordering::Relaxed),
        t1.elapsed().as_secs_f64()
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    println!("RSS 2 s after every stream ended: {:.1} MiB", mib(rss_kib(pid)));
}

async fn at_the_bound() {
    let s = server(&[("KILN_MAX_QUEUED_JOBS", "200")]);
    let (base, pid) = (s.base.clone(), s.child.id());
    let http = reqwest::Client::new();
    let cancel = blocker(&http, &base).await;
    let (created, full, other, no_retry_after) =
        (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let until = Instant::now() + Duration::from_secs(10);
    let clients: Vec<_> = (0..8)
        .map(|c| {
            let (http, base) = (http.clone(), base.clone());
            let (created, full, other, no_retry_after) = (created.clone(), full.clone(), other.clone(), no_retry_after.clone());
            tokio::spawn(async move {
                let mut n = c * 1_000_000;
                while Instant::now() < until {
                    n += 1;
                    let r = http.post(format!("{base}/api/v2/jobs")).json(&json!({ "workflow": small(n) })).send().await.unwrap();
                    match r.status().as_u16() {
                        201 => created.fetch_add(1, Ordering::Relaxed),
                        429 => {
                            if r.headers().get("retry-after").is_none() {
                                no_retry_after.fetch_add(1, Ordering::Relaxed);
                            }
                            let body: Value = r.json().await.unwrap_or_default();
                            match body["error"]["code"] == "queue_full" {
                                true => full.fetch_add(1, Ordering::Relaxed),
                                false => other.fetch_add(1, Ordering::Relaxed),
                            }
                        }
                        _ => other.fetch_add(1, Ordering::Relaxed),
                    };
                }
            })
        })
        .collect();
    let mut samples = Vec::new();
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_secs(1)).await;
        samples.push(rss_kib(pid));
    }
    for c in clients {
        c.await.unwrap();
    }
    let (lo, hi) = (samples.iter().min().copied().unwrap_or(0), samples.iter().max().copied().unwrap_or(0));
    println!(
        "10 s of 8 clients at a queue bound of 200: {} created, {} queue_full ({:.0}/s; {} without Retry-After), {} other; RSS per second {:.1}–{:.1} MiB ({})",
        created.load(Ordering::Relaxed),
        full.load(Ordering::Relaxed),
        full.load(Ordering::Relaxed) as f64 / 10.0,
        no_retry_after.load(Ordering::Relaxed),
        other.load(Ordering::Relaxed),
        mib(lo),
        mib(hi),
        samples.iter().map(|k| format!("{:.1}", mib(*k))).collect::<Vec<_>>().join(" ")
    );
    http.post(&cancel).send().await.unwrap();
}

async fn never_read() {
    let s = server(&[]);
    let (base, pid) = (s.base.clone(), s.child.id());
    let addr: std::net::SocketAddr = base.trim_start_matches("http://").parse().unwrap();
    let mut stuck = Vec::new();
    for i in 0..500 {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(4096).unwrap();
        let stream = socket.connect(addr).await.unwrap();
        let (ws, _) = tokio_tungstenite::client_async(format!("ws://{addr}/ws?clientId=stuck{i}"), stream).await.unwrap();
        stuck.push(ws);
    }
    let (mut reader, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/ws?clientId=reader")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let rss0 = rss_kib(pid);
    let peak = Arc::new(AtomicU64::new(rss0));
    let sampler = {
        let peak = peak.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(100)).await;
                peak.fetch_max(rss_kib(pid), Ordering::Relaxed);
            }
        })
    };
    // A job with no client of its own: ComfyUI sends its messages to every
    // socket (about two per node: `executing`, `progress_state`).
    let http = reqwest::Client::new();
    let t0 = Instant::now();
    let nodes: usize = std::env::var("KILN_BENCH_BROADCAST_NODES").ok().and_then(|n| n.parse().ok()).unwrap_or(200);
    let job: Value = http.post(format!("{base}/api/v2/jobs")).json(&json!({ "workflow": chain(nodes) })).send().await.unwrap().json().await.unwrap();
    let id = job["id"].as_str().unwrap().to_string();
    let (mut messages, mut bytes, mut success) = (0u64, 0u64, false);
    while let Ok(Some(Ok(msg))) = tokio::time::timeout(Duration::from_secs(120), reader.next()).await {
        messages += 1;
        bytes += msg.len() as u64;
        if let Message::Text(text) = &msg
            && text.contains("execution_success")
            && text.contains(id.as_str())
        {
            success = true;
            break;
        }
    }
    let took = t0.elapsed().as_secs_f64();
    sampler.abort();
    // A socket the server dropped reads its end once its queued frames are
    // read; a live one blocks.
    let mut closed = 0;
    for ws in &mut stuck {
        loop {
            match tokio::time::timeout(Duration::from_millis(50), ws.next()).await {
                Ok(Some(Ok(Message::Close(_)))) | Ok(Some(Err(_))) | Ok(None) => {
                    closed += 1;
                    break;
                }
                Ok(Some(Ok(_))) => continue,
                Err(_) => break,
            }
        }
    }
    println!(
        "500 WebSockets that never read (4 KiB receive buffers) and one that does, while a {}-node job broadcast to all: the reader got {messages} messages ({:.1} MB){} in {took:.1} s; RSS {:.1} MiB before, {:.1} at the peak, {:.1} after; {closed} of 500 non-readers closed by the server",
        nodes + 2,
        bytes as f64 / 1e6,
        if success { " through execution_success" } else { ", NO execution_success" },
        mib(rss0),
        mib(peak.load(Ordering::Relaxed)),
        mib(rss_kib(pid))
    );
}
