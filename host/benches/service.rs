//! Service benchmarks against a real `kiln serve` process on loopback.
//!
//! Run: `cargo bench -p kiln --bench service` (builds the release binary).
//! Prints: idle RSS of the server; submit→succeeded latency of a 64×64
//! LoadImage → SaveImage job (p50/p95, one client, client- and server-side);
//! jobs/s with 8 concurrent clients; `GET /api/v2/jobs/{id}` requests/s with
//! 64 concurrent connections (reqwest in this process, and `wrk` if it is
//! installed: `apt-get install wrk`); RSS after the load and after 8 s idle;
//! then, on a second server, the memory of 1000 more SSE streams on a queued
//! job. The result cache is off (`KILN_RESULT_CACHE_MB=0`)
//! so every job really executes both nodes. Record results in BENCHMARKS.md.
//! `-- latency` runs only the latency figure, over 1000 jobs; `-- throughput`
//! only the 8-client throughput figure, three 5 s rounds. The server inherits
//! this process's environment, so `KILN_*` settings can be tried per run;
//! `KILN_BENCH_SERVER=/path/to/kiln` runs another build (A/B comparisons).
//! A machine probe (hashing speed, loopback round trip) is printed first
//! and last: compare figures only between runs whose probes agree.
//! `-- tenants` compares a self-hosted server with a cloud one (account
//! key on every request: authentication and scoping) in interleaved
//! rounds: submit latency (POST → 201) and `GET /api/v2/jobs/{id}` req/s.
//! `-- surfaces` compares two builds on both job surfaces (see `surfaces.rs`).
//! `-- load`: watchers by the thousand, submissions at the queue bound and
//! consumers that never read (see `load.rs`). `-- slow-disk`: submissions
//! and health checks on a disk whose cache flush is slow (see
//! `slow_disk.rs`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[path = "../tests/common/cdylib.rs"]
mod cdylib;
mod common;
#[path = "service/load.rs"]
mod load;
#[path = "service/slow_disk.rs"]
mod slow_disk;
#[path = "service/surfaces.rs"]
mod surfaces;

use common::{machine_probe, raise_fd_limit, rss_kib, start_with};
use futures_util::StreamExt;
use serde_json::{Value, json};

/// CPU seconds (user + system) a process has used so far.
fn cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces): utime and stime
    // are the 12th and 13th of them, in clock ticks.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = fields.get(11..13).map_or(0.0, |f| f.iter().filter_map(|v| v.parse::<f64>().ok()).sum());
    // SAFETY: sysconf has no preconditions.
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// Context switches (voluntary + involuntary) of all of a process's threads.
fn context_switches(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return 0 };
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("status")).ok())
        .flat_map(|status| {
            status.lines().filter(|l| l.contains("ctxt_switches:")).filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok()).collect::<Vec<_>>()
        })
        .sum()
}

fn png64() -> Vec<u8> {
    let mut out = Vec::new();
    let mut enc = png::Encoder::new(&mut out, 64, 64);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let pixels: Vec<u8> = (0..64 * 64 * 3).map(|i| (i * 7 % 251) as u8).collect();
    let mut writer = enc.write_header().unwrap();
    writer.write_image_data(&pixels).unwrap();
    writer.finish().unwrap();
    out
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn micros(ts: &str) -> f64 {
    // RFC 3339 with +00:00: seconds of the day are enough for differences.
    let t = &ts[11..26];
    let (h, m, s): (f64, f64, f64) = (t[0..2].parse().unwrap(), t[3..5].parse().unwrap(), t[6..].parse().unwrap());
    (h * 3600.0 + m * 60.0 + s) * 1e6
}

/// Wall-clock instants of one job as the client saw them (µs of the day,
/// the same clock as the server's timestamps).
#[derive(Default, Clone, Copy)]
struct Marks {
    sent: f64,
    created: f64,
    started: f64,
    accepted: f64,
    stream_open: f64,
    completed: f64,
    terminal_seen: f64,
}

fn wall_micros() -> f64 {
    let d = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    (d.as_micros() % 86_400_000_000) as f64
}

/// [`run_one`] with the instants of each step (for `-- timeline`).
async fn run_marked(http: &reqwest::Client, base: &str, workflow: &Value) -> Marks {
    let mut m = Marks { sent: wall_micros(), ..Marks::default() };
    let job: Value = http.post(format!("{base}/api/v2/jobs")).json(&json!({ "workflow": workflow })).send().await.unwrap().json().await.unwrap();
    m.accepted = wall_micros();
    let origin = base.split("/api").next().unwrap();
    let mut stream = http.get(format!("{origin}{}", job["urls"]["events"].as_str().unwrap())).send().await.unwrap();
    m.stream_open = wall_micros();
    let mut buf = Vec::new();
    while let Some(chunk) = stream.chunk().await.unwrap() {
        buf.extend_from_slice(&chunk);
        if String::from_utf8_lossy(&buf).contains("\"status\":\"succeeded\"") {
            break;
        }
    }
    m.terminal_seen = wall_micros();
    let done: Value = http.get(format!("{origin}{}", job["urls"]["self"].as_str().unwrap())).send().await.unwrap().json().await.unwrap();
    m.created = micros(done["created_at"].as_str().unwrap());
    m.started = micros(done["started_at"].as_str().unwrap());
    m.completed = micros(done["completed_at"].as_str().unwrap());
    m
}

/// Submits one job and follows its event stream to the terminal status.
async fn run_one(http: &reqwest::Client, base: &str, workflow: &Value) -> (f64, Value) {
    let t0 = Instant::now();
    let job: Value = http.post(format!("{base}/api/v2/jobs")).json(&json!({ "workflow": workflow })).send().await.unwrap().json().await.unwrap();
    let events = job["urls"]["events"].as_str().expect("job urls");
    let origin = base.split("/api").next().unwrap();
    let mut stream = http.get(format!("{origin}{events}")).send().await.unwrap().bytes_stream();
    let mut buf = Vec::new();
    while let Some(chunk) = stream.next().await {
        buf.extend_from_slice(&chunk.unwrap());
        let text = String::from_utf8_lossy(&buf);
        if text.contains("\"status\":\"succeeded\"") || text.contains("\"status\":\"failed\"") {
            break;
        }
    }
    let elapsed = t0.elapsed().as_secs_f64() * 1e3;
    let done: Value = http.get(format!("{origin}{}", job["urls"]["self"].as_str().unwrap())).send().await.unwrap().json().await.unwrap();
    assert_eq!(done["status"], "succeeded", "{done}");
    (elapsed, done)
}

/// Lets this process and the server it spawns hold thousands of sockets.
fn main() {
    raise_fd_limit();
    if std::env::args().any(|a| a == "fixed") {
        surfaces::fixed();
        return;
    }
    println!("{}", machine_probe());
    if std::env::args().any(|a| a == "surfaces") {
        surfaces::run();
        println!("{}", machine_probe());
        return;
    }
    if std::env::args().any(|a| a == "load") {
        load::run();
        println!("{}", machine_probe());
        return;
    }
    if std::env::args().any(|a| a == "slow-disk") {
        slow_disk::run();
        println!("{}", machine_probe());
        return;
    }
    if std::env::args().any(|a| a == "tenants") {
        tenants_ab();
        println!("{}", machine_probe());
        return;
    }
    // `cargo bench -p kiln --bench service -- latency`: only the latency
    // figure, over more jobs (for comparing builds back to back).
    let latency_only = std::env::args().any(|a| a == "latency");
    let throughput_only = std::env::args().any(|a| a == "throughput");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    // The first start compiles the bundled components into an empty
    // artifact cache; every later start deserializes them.
    let cache = tempfile::tempdir().unwrap();
    let cache_env = [("KILN_CACHE_DIR", cache.path().to_str().unwrap())];
    let first = start_with(&cache_env);
    std::thread::sleep(Duration::from_secs(2));
    println!("idle RSS after a first start (components compiled): {:.1} MiB", rss_kib(first.child.id()) as f64 / 1024.0);
    drop(first);
    let server = start_with(&cache_env);
    let base = server.base.clone();
    let pid = server.child.id();
    std::thread::sleep(Duration::from_secs(2));
    println!("idle RSS after a warm start: {:.1} MiB", rss_kib(pid) as f64 / 1024.0);

    // One sequential client measures latency: on a current-thread runtime
    // its requests and their connection tasks share one thread, so the
    // figure carries no hand-offs between the client's own threads.
    let single = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let timeline = std::env::args().any(|a| a == "timeline");
    let workflow = single.block_on(async {
        let http = reqwest::Client::new();
        let form = reqwest::multipart::Form::new().text("file_path", "in.png").part("file", reqwest::multipart::Part::bytes(png64()).file_name("in.png"));
        let asset: Value = http.post(format!("{base}/api/v2/assets")).multipart(form).send().await.unwrap().json().await.unwrap();
        let workflow = json!({
            "1": { "class_type": "LoadImage", "inputs": { "image": { "__type": "core/ASSET", "info": { "id": asset["id"] } } } },
            "2": { "class_type": "SaveImage", "inputs": { "images": ["1", 0], "filename_prefix": "bench" } },
        });
        // Warm up (compiles nothing: components come from the artifact cache).
        for _ in 0..20 {
            run_one(&http, &base, &workflow).await;
        }

        if std::env::args().any(|a| a == "timeline") {
            let marks: Vec<Marks> = {
                let mut v = Vec::new();
                let jobs = std::env::var("KILN_BENCH_JOBS").ok().and_then(|n| n.parse().ok()).unwrap_or(1000);
                for _ in 0..jobs {
                    v.push(run_marked(&http, &base, &workflow).await);
                }
                v
            };
            let median = |f: &dyn Fn(&Marks) -> f64| {
                let mut xs: Vec<f64> = marks.iter().map(f).collect();
                xs.sort_by(f64::total_cmp);
                percentile(&xs, 0.5)
            };
            println!("timeline of {} jobs, median µs after the POST was sent:", marks.len());
            println!("  created_at      {:7.0}", median(&|m| m.created - m.sent));
            println!("  started_at      {:7.0}", median(&|m| m.started - m.sent));
            println!("  201 received    {:7.0}", median(&|m| m.accepted - m.sent));
            println!("  stream headers  {:7.0}", median(&|m| m.stream_open - m.sent));
            println!("  completed_at    {:7.0}", median(&|m| m.completed - m.sent));
            println!("  terminal frame  {:7.0}", median(&|m| m.terminal_seen - m.sent));
            return workflow;
        }
        // 1. Latency, one client.
        let n = if latency_only {
            1000
        } else if throughput_only {
            0
        } else {
            300
        };
        let (mut client_ms, mut server_ms) = (Vec::new(), Vec::new());
        let (cpu0, switches0) = (cpu_secs(pid), context_switches(pid));
        for _ in 0..n {
            let (ms, done) = run_one(&http, &base, &workflow).await;
            client_ms.push(ms);
            server_ms.push((micros(done["completed_at"].as_str().unwrap()) - micros(done["created_at"].as_str().unwrap())) / 1e3);
        }
        client_ms.sort_by(f64::total_cmp);
        server_ms.sort_by(f64::total_cmp);
        if n > 0 {
            println!(
                "submit→succeeded, 64² LoadImage→SaveImage, {n} jobs: client p50 {:.2} ms p95 {:.2} ms; server (created→completed) p50 {:.2} ms p95 {:.2} ms",
                percentile(&client_ms, 0.5),
                percentile(&client_ms, 0.95),
                percentile(&server_ms, 0.5),
                percentile(&server_ms, 0.95)
            );
            println!(
                "  per job: server CPU {:.0} µs, server context switches {:.1}",
                (cpu_secs(pid) - cpu0) * 1e6 / n as f64,
                (context_switches(pid) - switches0) as f64 / n as f64
            );
        }

        workflow
    });
    if latency_only || timeline {
        println!("{}", machine_probe());
        return;
    }

    rt.block_on(async {
        let http = reqwest::Client::builder().pool_max_idle_per_host(256).build().unwrap();
        // 2. Throughput, 8 clients, 5 s (three rounds with `-- throughput`).
        for _ in 0..if throughput_only { 3 } else { 1 } {
            let done = Arc::new(AtomicU64::new(0));
            let stop = Arc::new(AtomicBool::new(false));
            let (server_cpu0, client_cpu0) = (cpu_secs(pid), cpu_secs(std::process::id()));
            let t0 = Instant::now();
            let mut tasks = Vec::new();
            for _ in 0..8 {
                let (http, base, wf, done, stop) = (http.clone(), base.clone(), workflow.clone(), done.clone(), stop.clone());
                tasks.push(tokio::spawn(async move {
                    while !stop.load(Ordering::Relaxed) {
                        run_one(&http, &base, &wf).await;
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                }));
            }
            tokio::time::sleep(Duration::from_secs(5)).await;
            stop.store(true, Ordering::Relaxed);
            for t in tasks {
                t.await.unwrap();
            }
            let secs = t0.elapsed().as_secs_f64();
            let jobs = done.load(Ordering::Relaxed).max(1);
            println!(
                "throughput, 8 concurrent clients: {:.0} jobs/s ({jobs} jobs in {secs:.1} s); CPU per job: server {:.0} µs, this client {:.0} µs",
                jobs as f64 / secs,
                (cpu_secs(pid) - server_cpu0) * 1e6 / jobs as f64,
                (cpu_secs(std::process::id()) - client_cpu0) * 1e6 / jobs as f64,
            );
        }
        if throughput_only {
            return;
        }

        // 3. GET /api/v2/jobs/{id}, 64 connections, 5 s.
        let (_, job) = run_one(&http, &base, &workflow).await;
        let url = format!("{base}/api/v2/jobs/{}", job["id"].as_str().unwrap());
        common::get_rate(&http, &url, "GET /api/v2/jobs/{id}").await;
    });
    if throughput_only {
        println!("{}", machine_probe());
        return;
    }
    println!("RSS right after the load: {:.1} MiB", rss_kib(pid) as f64 / 1024.0);
    std::thread::sleep(Duration::from_secs(8));
    println!("RSS after 8 s idle: {:.1} MiB", rss_kib(pid) as f64 / 1024.0);
    drop(server);

    // 4. Memory per event stream: a second server with one worker, kept busy
    // by a long job whose memory is steady while it computes (a chain of
    // 2048² blurs: each one's buffer reuses the one freed before it), and
    // 2000 streams open on the job queued behind it.
    let streams_server = start_with(&[("KILN_MAX_RUNNING_JOBS", "1")]);
    let (base, pid) = (streams_server.base.clone(), streams_server.child.id());
    rt.block_on(async {
        let http = reqwest::Client::new();
        let mut long = serde_json::Map::new();
        long.insert("0".into(), json!({ "class_type": "EmptyImage", "inputs": { "width": 2048, "height": 2048, "batch_size": 1, "color": 3 } }));
        let blurs = 40;
        for i in 1..=blurs {
            long.insert(i.to_string(), json!({ "class_type": "ImageBlur", "inputs": { "image": [(i - 1).to_string(), 0], "blur_radius": 31, "sigma": 9.0 } }));
        }
        long.insert("out".into(), json!({ "class_type": "PreviewImage", "inputs": { "images": [blurs.to_string(), 0] } }));
        let blocker: Value = http.post(format!("{base}/api/v2/jobs")).json(&json!({ "workflow": long })).send().await.unwrap().json().await.unwrap();
        let queued: Value = http.post(format!("{base}/api/v2/jobs")).json(&json!({ "workflow": {
            "1": { "class_type": "EmptyImage", "inputs": { "width": 8, "height": 8, "batch_size": 1, "color": 1 } },
            "2": { "class_type": "SaveImage", "inputs": { "images": ["1", 0], "filename_prefix": "q" } } } })).send().await.unwrap().json().await.unwrap();
        let origin = base.split("/api").next().unwrap().to_string();
        let events = format!("{origin}{}", queued["urls"]["events"].as_str().unwrap());
        // Two batches of streams, RSS read after each: the difference is
        // the cost of the second batch alone, taken while the blocker's
        // memory is steady (its blur computes for seconds).
        tokio::time::sleep(Duration::from_millis(800)).await;
        let batch = 1000;
        let streams = reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap();
        let mut open = Vec::new();
        let mut rss = Vec::new();
        let t0 = Instant::now();
        for _ in 0..2 {
            for _ in 0..batch {
                let r = streams.get(&events).send().await.unwrap();
                assert_eq!(r.status(), 200);
                open.push(r);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            rss.push(rss_kib(pid));
        }
        let opened_in = t0.elapsed();
        let blocker_now: Value = http.get(format!("{origin}{}", blocker["urls"]["self"].as_str().unwrap())).send().await.unwrap().json().await.unwrap();
        let node = format!("{} of {blurs} blurs, node {}", blocker_now["status"].as_str().unwrap_or("?"), blocker_now["progress"]["current_node"].as_str().unwrap_or("?"));
        let still_queued: Value = http.get(format!("{origin}{}", queued["urls"]["self"].as_str().unwrap())).send().await.unwrap().json().await.unwrap();
        let per_stream = (rss[1] as f64 - rss[0] as f64) / batch as f64;
        println!(
            "{} concurrent SSE streams on a queued job ({}; blocker {node}): opened in {:.2} s; the second {batch} added {:.1} MiB RSS ({per_stream:.1} KiB per stream)",
            2 * batch,
            still_queued["status"].as_str().unwrap_or("?"),
            opened_in.as_secs_f64(),
            (rss[1] as f64 - rss[0] as f64) / 1024.0,
        );
        http.post(format!("{origin}{}", blocker["urls"]["cancel"].as_str().unwrap())).send().await.unwrap();
        drop(open);
    });
    println!("{}", machine_probe());
}

/// One side of the `-- tenants` comparison: a server and a client that
/// sends its credential (none self-hosted, an account key in the cloud).
struct Side {
    name: &'static str,
    _server: common::Server,
    base: String,
    headers: reqwest::header::HeaderMap,
}

impl Side {
    /// A client for the runtime it is first used on (a pooled connection
    /// belongs to the runtime that opened it).
    fn client(&self) -> reqwest::Client {
        reqwest::Client::builder().default_headers(self.headers.clone()).pool_max_idle_per_host(256).build().unwrap()
    }
}

fn side(name: &'static str, env: &[(&str, &str)], cache: &str) -> Side {
    let mut env = env.to_vec();
    env.push(("KILN_CACHE_DIR", cache));
    let server = start_with(&env);
    let base = server.base.clone();
    let mut headers = reqwest::header::HeaderMap::new();
    if name == "cloud" {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let key = rt.block_on(async {
            let created: Value = reqwest::Client::new()
                .post(format!("{base}/admin/accounts"))
                .bearer_auth("bench-operator")
                .json(&json!({ "name": "bench", "credits": 1_000_000_000 }))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            created["key"].as_str().expect("an account key").to_string()
        });
        headers.insert(reqwest::header::AUTHORIZATION, format!("Bearer {key}").parse().unwrap());
    }
    Side { name, _server: server, base, headers }
}

/// POST → 201 of `n` small jobs, one at a time, each followed to its end
/// (so the queue never grows); returns the sorted latencies in ms.
async fn submit_latencies(side: &Side, n: usize) -> Vec<f64> {
    let workflow = json!({
        "1": { "class_type": "EmptyImage", "inputs": { "width": 8, "height": 8, "batch_size": 1, "color": 1 } },
        "2": { "class_type": "SaveImage", "inputs": { "images": ["1", 0], "filename_prefix": "ab" } },
    });
    let http = side.client();
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let t0 = Instant::now();
        let resp = http.post(format!("{}/api/v2/jobs", side.base)).json(&json!({ "workflow": workflow })).send().await.unwrap();
        assert_eq!(resp.status(), 201);
        let job: Value = resp.json().await.unwrap();
        out.push(t0.elapsed().as_secs_f64() * 1e3);
        let url = format!("{}/api/v2/jobs/{}", side.base, job["id"].as_str().unwrap());
        loop {
            let now: Value = http.get(&url).send().await.unwrap().json().await.unwrap();
            if now["status"] == "succeeded" {
                break;
            }
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
    }
    out.sort_by(f64::total_cmp);
    out
}

/// `-- tenants`: self-hosted vs cloud, interleaved rounds (the order
/// alternating), so drifts of this VM's speed hit both sides alike.
fn tenants_ab() {
    let cache = tempfile::tempdir().unwrap();
    let cache = cache.path().to_str().unwrap().to_string();
    let rounds: usize = std::env::var("KILN_BENCH_ROUNDS").ok().and_then(|n| n.parse().ok()).unwrap_or(6);
    let jobs: usize = std::env::var("KILN_BENCH_JOBS").ok().and_then(|n| n.parse().ok()).unwrap_or(300);
    let sides = [side("self-hosted", &[], &cache), side("cloud", &[("KILN_MODE", "cloud"), ("KILN_ADMIN_TOKEN", "bench-operator")], &cache)];
    // Submit latency on a current-thread client (no hand-offs in the
    // client); GET rate on a 2-thread one, as the other figures.
    let single = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let multi = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let urls: Vec<String> = sides
        .iter()
        .map(|s| {
            single.block_on(submit_latencies(s, 30)); // warm-up
            let job: Value =
                single.block_on(async { s.client().get(format!("{}/api/v2/jobs?limit=1", s.base)).send().await.unwrap().json::<Value>().await.unwrap() });
            format!("{}/api/v2/jobs/{}", s.base, job["jobs"][0]["id"].as_str().expect("a finished job"))
        })
        .collect();
    let mut p50 = [Vec::new(), Vec::new()];
    let mut gets = [Vec::new(), Vec::new()];
    for round in 0..rounds {
        let order: [usize; 2] = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for &i in &order {
            let lat = single.block_on(submit_latencies(&sides[i], jobs));
            let rate = multi.block_on(common::rate_of(&sides[i].client(), &urls[i], 3));
            println!(
                "round {round} {:<11}: submit (POST→201) p50 {:.3} ms p95 {:.3} ms over {jobs} jobs; GET /jobs/{{id}} {rate:.0} req/s",
                sides[i].name,
                percentile(&lat, 0.5),
                percentile(&lat, 0.95)
            );
            p50[i].push(percentile(&lat, 0.5));
            gets[i].push(rate);
        }
    }
    let median = |xs: &[f64]| {
        let mut v = xs.to_vec();
        v.sort_by(f64::total_cmp);
        percentile(&v, 0.5)
    };
    println!(
        "tenants A/B, medians of {rounds} rounds: submit p50 self-hosted {:.3} ms, cloud {:.3} ms ({:+.1} %); GET self-hosted {:.0} req/s, cloud {:.0} req/s ({:+.1} %)",
        median(&p50[0]),
        median(&p50[1]),
        (median(&p50[1]) / median(&p50[0]) - 1.0) * 100.0,
        median(&gets[0]),
        median(&gets[1]),
        (median(&gets[1]) / median(&gets[0]) - 1.0) * 100.0
    );
}
