//! `-- surfaces`: two builds compared on both job surfaces, in interleaved
//! rounds (the order alternating, so drifts of the machine's speed hit both
//! alike). Build A is `KILN_BENCH_BASELINE` (a `kiln` binary, e.g. a
//! release build of the commit before a change), build B this one (or
//! `KILN_BENCH_SERVER`). Per round and build: submit → succeeded latency
//! of small jobs one at a time (p50/p95, each job polled until it is done)
//! on `POST /api/v2/jobs` and on `POST /api/prompt`, then jobs/s with 8
//! concurrent clients on each surface.
//!
//! `KILN_BENCH_ENV_A` / `KILN_BENCH_ENV_B` (space-separated `KEY=VALUE`)
//! add settings to one side: the same binary as both builds, with
//! `KILN_STORE=postgres KILN_DATABASE_URL=…` (and `KILN_BLOB_STORE=s3 …`)
//! on side B, compares the backends.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::{Server, start_binary};
use crate::percentile;

/// Which surface a job goes through.
#[derive(Clone, Copy, PartialEq)]
enum Surface {
    V2,
    Prompt,
}

fn workflow(n: u64) -> Value {
    json!({
        "1": { "class_type": "EmptyImage", "inputs": { "width": 8, "height": 8, "batch_size": 1, "color": n % 200 } },
        "2": { "class_type": "SaveImage", "inputs": { "images": ["1", 0], "filename_prefix": "ab" } },
    })
}

/// Submits one job and polls it until it succeeded; the wall time in ms.
async fn one(http: &reqwest::Client, base: &str, surface: Surface, n: u64) -> f64 {
    let t0 = Instant::now();
    let url = match surface {
        Surface::V2 => {
            let job: Value = http.post(format!("{base}/api/v2/jobs")).json(&json!({ "workflow": workflow(n) })).send().await.unwrap().json().await.unwrap();
            format!("{base}/api/v2/jobs/{}", job["id"].as_str().unwrap_or_else(|| panic!("{job}")))
        }
        Surface::Prompt => {
            let body: Value = http.post(format!("{base}/api/prompt")).json(&json!({ "prompt": workflow(n) })).send().await.unwrap().json().await.unwrap();
            format!("{base}/api/job/{}/status", body["prompt_id"].as_str().unwrap_or_else(|| panic!("{body}")))
        }
    };
    loop {
        let now: Value = http.get(&url).send().await.unwrap().json().await.unwrap();
        match (surface, now["status"].as_str()) {
            (Surface::V2, Some("succeeded")) | (Surface::Prompt, Some("success")) => break,
            (_, Some("failed" | "error" | "non_retryable_error")) => panic!("{now}"),
            _ => tokio::time::sleep(Duration::from_micros(200)).await,
        }
    }
    t0.elapsed().as_secs_f64() * 1e3
}

/// `n` jobs one at a time; sorted latencies in ms.
async fn latencies(base: &str, surface: Surface, n: u64) -> Vec<f64> {
    let http = reqwest::Client::new();
    let mut out = Vec::with_capacity(n as usize);
    for i in 0..n {
        out.push(one(&http, base, surface, i).await);
    }
    out.sort_by(f64::total_cmp);
    out
}

/// Jobs/s with 8 clients, each submitting and following one job at a time.
async fn throughput(base: &str, surface: Surface, secs: u64) -> f64 {
    let done = Arc::new(AtomicU64::new(0));
    let until = Instant::now() + Duration::from_secs(secs);
    let clients: Vec<_> = (0..8)
        .map(|c| {
            let (done, base) = (done.clone(), base.to_string());
            tokio::spawn(async move {
                let http = reqwest::Client::new();
                let mut n = c * 1_000_000;
                while Instant::now() < until {
                    one(&http, &base, surface, n).await;
                    done.fetch_add(1, Ordering::Relaxed);
                    n += 1;
                }
            })
        })
        .collect();
    let t0 = Instant::now();
    for c in clients {
        c.await.unwrap();
    }
    done.load(Ordering::Relaxed) as f64 / t0.elapsed().as_secs_f64()
}

/// `-- fixed`: a fixed amount of work on one server (`KILN_BENCH_SERVER`,
/// else this build): `KILN_BENCH_JOBS` jobs (default 800) on each surface,
/// 8 clients, then exit. Timed from outside (`farm-bench` with `--vs`
/// and the other build as `KILN_BENCH_SERVER`), its wall and CPU seconds,
/// the server's included, compare two builds on the same work.
pub fn fixed() {
    let current = std::env::var_os("KILN_BENCH_SERVER").map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_kiln")), PathBuf::from);
    let jobs: u64 = std::env::var("KILN_BENCH_JOBS").ok().and_then(|n| n.parse().ok()).unwrap_or(800);
    let cache = tempfile::tempdir().unwrap();
    let server = start_binary(&current, &[("KILN_CACHE_DIR", cache.path().to_str().unwrap())]);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    for surface in [Surface::V2, Surface::Prompt] {
        rt.block_on(async {
            let clients: Vec<_> = (0..8u64)
                .map(|c| {
                    let base = server.base.clone();
                    tokio::spawn(async move {
                        let http = reqwest::Client::new();
                        for n in (c..jobs).step_by(8) {
                            one(&http, &base, surface, n).await;
                        }
                    })
                })
                .collect();
            for c in clients {
                c.await.unwrap();
            }
        });
    }
}

fn borrowed(env: &[(String, String)]) -> Vec<(&str, &str)> {
    env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    percentile(&v, 0.5)
}

pub fn run() {
    let baseline = PathBuf::from(std::env::var_os("KILN_BENCH_BASELINE").expect("KILN_BENCH_BASELINE: the kiln binary to compare against"));
    let current = std::env::var_os("KILN_BENCH_SERVER").map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_kiln")), PathBuf::from);
    let rounds: usize = std::env::var("KILN_BENCH_ROUNDS").ok().and_then(|n| n.parse().ok()).unwrap_or(6);
    let jobs: u64 = std::env::var("KILN_BENCH_JOBS").ok().and_then(|n| n.parse().ok()).unwrap_or(200);
    let cache = tempfile::tempdir().unwrap();
    let side_env = |var: &str| {
        let extra = std::env::var(var).unwrap_or_default();
        let mut env: Vec<(String, String)> = vec![("KILN_CACHE_DIR".into(), cache.path().to_str().unwrap().into())];
        env.extend(extra.split_whitespace().map(|kv| kv.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())).expect("KEY=VALUE")));
        env
    };
    let (env_a, env_b) = (side_env("KILN_BENCH_ENV_A"), side_env("KILN_BENCH_ENV_B"));
    let servers: [(&str, Server); 2] =
        [("A (baseline)", start_binary(&baseline, &borrowed(&env_a))), ("B (this build)", start_binary(&current, &borrowed(&env_b)))];
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    for (_, s) in &servers {
        rt.block_on(latencies(&s.base, Surface::V2, 30));
        rt.block_on(latencies(&s.base, Surface::Prompt, 30));
    }
    // [side][surface] → per-round p50, p95, jobs/s.
    let mut figures = [[(Vec::new(), Vec::new(), Vec::new()), (Vec::new(), Vec::new(), Vec::new())], Default::default()];
    for round in 0..rounds {
        let order: [usize; 2] = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for &i in &order {
            let (name, server) = &servers[i];
            for (k, (surface, label)) in [(Surface::V2, "/api/v2/jobs"), (Surface::Prompt, "/api/prompt")].into_iter().enumerate() {
                let lat = rt.block_on(latencies(&server.base, surface, jobs));
                let rate = rt.block_on(throughput(&server.base, surface, 3));
                let (p50, p95) = (percentile(&lat, 0.5), percentile(&lat, 0.95));
                println!("round {round} {name:<15} {label:<13}: submit→succeeded p50 {p50:.3} ms p95 {p95:.3} ms ({jobs} jobs); {rate:.0} jobs/s (8 clients)");
                let f = &mut figures[i][k];
                f.0.push(p50);
                f.1.push(p95);
                f.2.push(rate);
            }
        }
    }
    for (k, label) in ["/api/v2/jobs", "/api/prompt"].into_iter().enumerate() {
        let (a, b) = (&figures[0][k], &figures[1][k]);
        let change = |x: f64, y: f64| (y / x - 1.0) * 100.0;
        println!(
            "{label}, medians of {rounds} rounds: p50 A {:.3} ms, B {:.3} ms ({:+.1} %); p95 A {:.3} ms, B {:.3} ms ({:+.1} %); jobs/s A {:.0}, B {:.0} ({:+.1} %)",
            median(&a.0),
            median(&b.0),
            change(median(&a.0), median(&b.0)),
            median(&a.1),
            median(&b.1),
            change(median(&a.1), median(&b.1)),
            median(&a.2),
            median(&b.2),
            change(median(&a.2), median(&b.2)),
        );
    }
}
