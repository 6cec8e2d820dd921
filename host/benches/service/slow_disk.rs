//! `-- slow-disk`: what a slow device flush does to everything else. The
//! server runs with `slow_sync.rs` preloaded (every `fsync`/`fdatasync`
//! 5 ms longer, `KILN_SLOW_SYNC_MS`); 8 clients submit `/api/v2/jobs` for
//! 8 s while one more times `GET /api/v2/health` every 20 ms. Prints
//! submissions/s and the health check's latency, for this build
//! (`KILN_BENCH_SERVER`) and, when `KILN_BENCH_BASELINE` names one, for
//! that build too, alternating, `KILN_BENCH_ROUNDS` (default 2) rounds.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::start_binary;

fn workflow(n: u64) -> Value {
    json!({
        "1": { "class_type": "EmptyImage", "inputs": { "width": 8, "height": 8, "batch_size": 1, "color": n % 0xFFFFFF } },
        "2": { "class_type": "SaveImage", "inputs": { "images": ["1", 0], "filename_prefix": "slow" } },
    })
}

/// The preload library, compiled into the bench's temporary directory.
fn library() -> PathBuf {
    let out = std::env::temp_dir().join(format!("kiln-slow-sync-{}.so", std::process::id()));
    crate::cdylib::compile("benches/service/slow_sync.rs", "kiln_slow_sync", &out);
    out
}

async fn round(binary: &Path, preload: &Path) -> String {
    let s = start_binary(binary, &[("LD_PRELOAD", preload.to_str().unwrap_or_default()), ("KILN_MAX_RUNNING_JOBS", "2")]);
    let base = s.base.clone();
    let http = reqwest::Client::new();
    let secs = 8;
    let until = Instant::now() + Duration::from_secs(secs);
    let (created, refused) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let clients: Vec<_> = (0..8u64)
        .map(|c| {
            let (http, base, created, refused) = (http.clone(), base.clone(), created.clone(), refused.clone());
            tokio::spawn(async move {
                let mut n = c * 1_000_000;
                while Instant::now() < until {
                    n += 1;
                    let r = http.post(format!("{base}/api/v2/jobs")).json(&json!({ "workflow": workflow(n) })).send().await.unwrap();
                    match r.status().as_u16() {
                        201 => created.fetch_add(1, Ordering::Relaxed),
                        _ => refused.fetch_add(1, Ordering::Relaxed),
                    };
                }
            })
        })
        .collect();
    let mut health = Vec::new();
    while Instant::now() < until {
        let t = Instant::now();
        let r = http.get(format!("{base}/api/v2/health")).send().await.unwrap();
        assert!(r.status().is_success());
        health.push(t.elapsed().as_secs_f64() * 1e3);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for c in clients {
        c.await.unwrap();
    }
    health.sort_by(f64::total_cmp);
    let q = |p: f64| health[((health.len() as f64 * p) as usize).min(health.len() - 1)];
    format!(
        "{:.0} submissions/s ({} not created); health p50 {:.2} ms p95 {:.2} ms p99 {:.2} ms max {:.2} ms ({} probes)",
        created.load(Ordering::Relaxed) as f64 / secs as f64,
        refused.load(Ordering::Relaxed),
        q(0.5),
        q(0.95),
        q(0.99),
        health[health.len() - 1],
        health.len()
    )
}

pub fn run() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let preload = library();
    let current = std::env::var_os("KILN_BENCH_SERVER").map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_kiln")), PathBuf::from);
    let baseline = std::env::var_os("KILN_BENCH_BASELINE").map(PathBuf::from);
    let rounds: usize = std::env::var("KILN_BENCH_ROUNDS").ok().and_then(|n| n.parse().ok()).unwrap_or(2);
    let ms = std::env::var("KILN_SLOW_SYNC_MS").unwrap_or_else(|_| "5".into());
    println!("every fsync/fdatasync {ms} ms slower; 8 clients submitting for 8 s, health checked every 20 ms");
    for r in 0..rounds {
        if let Some(baseline) = &baseline {
            println!("round {r} A (baseline)   {}", rt.block_on(round(baseline, &preload)));
        }
        println!("round {r} B (this build) {}", rt.block_on(round(&current, &preload)));
    }
    let _ = std::fs::remove_file(preload);
}
