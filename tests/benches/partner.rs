//! Partner proxy benchmark: the latency the proxy route adds over calling
//! the (fake, loopback) provider directly, and requests/s through the route
//! with 64 concurrent clients.
//!
//! Run with `cargo bench -p kiln-tests --bench partner`; figures go to
//! BENCHMARKS.md ("Partner proxy"). Every request is a create with a small
//! base64 image: auth, validation, one outbound request, the answer mapped.

#[path = "../e2e/partner/fake.rs"]
#[allow(dead_code)]
mod fake;

use std::sync::Arc;
use std::time::{Duration, Instant};

use kiln::config::Config;
use kiln::plugins::{NodeRegistry, PluginRuntime};
use kiln::server::Server;
use kiln::service::ServiceOptions;
use serde_json::json;

const TOKEN: &str = "bench-token";
const SAMPLES: usize = 2000;
const CLIENTS: usize = 64;
const THROUGHPUT_FOR: Duration = Duration::from_secs(10);

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1e6
}

async fn latencies(http: &reqwest::Client, url: &str, headers: &[(&str, &str)], body: &serde_json::Value) -> Vec<Duration> {
    let mut out = Vec::with_capacity(SAMPLES);
    for i in 0..SAMPLES + 200 {
        let mut req = http.post(url).json(body);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let start = Instant::now();
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status(), 200);
        resp.bytes().await.unwrap();
        // The first 200 warm up connections and caches.
        if i >= 200 {
            out.push(start.elapsed());
        }
    }
    out.sort();
    out
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let fake = fake::Fake::start();
    let data = tempfile::tempdir().unwrap();
    let config = Config {
        host: "127.0.0.1".into(),
        port: 0,
        data_dir: data.path().to_path_buf(),
        cache_dir: Some(std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("kiln-artifacts")),
        partner_base_url: Some(fake.url()),
        partner_api_key: Some(fake::PROVIDER_KEY.into()),
        partner_tokens: vec![TOKEN.into()],
        ..Config::default()
    };
    let runtime = Arc::new(PluginRuntime::new(kiln::plugins::RuntimeConfig::from_config(&config).unwrap()).unwrap());
    let registry = Arc::new(NodeRegistry::load_all(&runtime, &[]).await.unwrap());
    let options = ServiceOptions::from_config(&config);
    let server = Server::start_with(config, options, runtime, registry).await.unwrap();
    let route = format!("{}/proxy/partner/v1/ai/skin-enhancer/flexible", server.url());
    let direct = format!("{}/v1/ai/skin-enhancer/flexible", fake.url());
    let body = json!({ "image": "aGVsbG8gd29ybGQ=", "optimized_for": "enhance_skin", "sharpen": 10, "smart_grain": 2 });
    let http = reqwest::Client::new();

    let d = latencies(&http, &direct, &[("x-freepik-api-key", fake::PROVIDER_KEY)], &body).await;
    let p = latencies(&http, &route, &[("authorization", &format!("Bearer {TOKEN}"))], &body).await;
    let (d50, d99, p50, p99) = (percentile(&d, 0.5), percentile(&d, 0.99), percentile(&p, 0.5), percentile(&p, 0.99));
    println!("direct to the provider:  p50 {d50:.0} µs, p99 {d99:.0} µs ({SAMPLES} sequential requests)");
    println!("through the proxy route: p50 {p50:.0} µs, p99 {p99:.0} µs");
    println!("added by the proxy:      p50 {:.0} µs, p99 {:.0} µs", p50 - d50, p99 - d99);

    let done = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let until = Instant::now() + THROUGHPUT_FOR;
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let (http, route, body, done) = (reqwest::Client::new(), route.clone(), body.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            while Instant::now() < until {
                let resp = http.post(&route).bearer_auth(TOKEN).json(&body).send().await.unwrap();
                assert_eq!(resp.status(), 200);
                resp.bytes().await.unwrap();
                done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }));
    }
    let start = Instant::now();
    for t in tasks {
        t.await.unwrap();
    }
    let n = done.load(std::sync::atomic::Ordering::Relaxed);
    println!(
        "{CLIENTS} concurrent clients through the route: {:.0} requests/s ({n} in {:.1} s)",
        n as f64 / start.elapsed().as_secs_f64(),
        start.elapsed().as_secs_f64()
    );
    server.shutdown().await.unwrap();
}
