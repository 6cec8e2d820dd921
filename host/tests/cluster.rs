//! Three `kiln serve` processes as one service: one PostgreSQL database
//! (`KILN_TEST_DATABASE_URL`) and one S3 bucket (`KILN_TEST_S3_ENDPOINT`,
//! SeaweedFS in CI), each host with a data directory of its own. A job
//! submitted to one host is polled, streamed (SSE and the compat
//! WebSocket), canceled and downloaded through the others; a host killed
//! with SIGKILL while it runs a job loses it to another host, which runs
//! it; an Idempotency-Key raced on all three is taken once. Without the
//! servers these skip, except under CI, where they fail.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{Value, json};

/// A running `kiln serve` of the cluster.
struct Host {
    child: std::process::Child,
    base: String,
    _data: tempfile::TempDir,
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The database and bucket the hosts share; `None` (skipped) without them.
async fn shared() -> Option<Vec<(String, String)>> {
    let (Ok(url), Ok(endpoint)) = (std::env::var("KILN_TEST_DATABASE_URL"), std::env::var("KILN_TEST_S3_ENDPOINT")) else {
        assert!(std::env::var_os("CI").is_none(), "CI must set KILN_TEST_DATABASE_URL and KILN_TEST_S3_ENDPOINT (.ci/run starts both)");
        eprintln!("SKIPPED: KILN_TEST_DATABASE_URL or KILN_TEST_S3_ENDPOINT is not set");
        return None;
    };
    let name = format!("kiln_cluster_{}", uuid::Uuid::new_v4().simple());
    let admin = sqlx::PgPool::connect(&url).await.expect("the test server answers");
    sqlx::query(&format!("CREATE DATABASE {name}")).execute(&admin).await.expect("a test database");
    admin.close().await;
    let database = format!("{}/{name}", url.rsplit_once('/').expect("a database URL ends with /NAME").0);
    let bucket = format!("kiln-cluster-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    Some(vec![
        ("KILN_STORE".into(), "postgres".into()),
        ("KILN_DATABASE_URL".into(), database),
        ("KILN_BLOB_STORE".into(), "s3".into()),
        ("KILN_S3_ENDPOINT".into(), endpoint),
        ("KILN_S3_BUCKET".into(), bucket),
        // A host that dies loses its jobs 3 s after its last heartbeat.
        ("KILN_LEASE_S".into(), "3".into()),
        ("KILN_HEARTBEAT_S".into(), "1".into()),
        ("KILN_GPU".into(), "off".into()),
        ("KILN_LOG".into(), "warn".into()),
    ])
}

fn start(name: &str, shared: &[(String, String)]) -> Host {
    let data = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kiln"));
    cmd.args(["serve", "--port", "0", "--data-dir"])
        .arg(data.path())
        .env("KILN_CACHE_DIR", std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("kiln-artifacts"))
        .env("KILN_HOST_ID", name)
        .envs(shared.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut child = cmd.spawn().expect("kiln serve starts");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let base = line.trim().strip_prefix("kiln listening on ").unwrap_or_else(|| panic!("unexpected first line {line:?}")).to_string();
    Host { child, base, _data: data }
}

/// A job that runs for a few seconds (twenty blurs of a 2048² image, about
/// 150 ms each here) and then saves an image.
fn slow(seed: i64) -> Value {
    let mut graph = json!({
        "1": {"class_type": "EmptyImage", "inputs": {"width": 2048, "height": 2048, "batch_size": 1, "color": seed}},
    });
    let mut last = "1".to_string();
    for n in 2..22 {
        graph[n.to_string()] = json!({"class_type": "ImageBlur", "inputs": {"image": [last, 0], "blur_radius": 31, "sigma": 8.0}});
        last = n.to_string();
    }
    graph["99"] = json!({"class_type": "SaveImage", "inputs": {"images": [last, 0], "filename_prefix": "slow"}});
    graph
}

fn quick(seed: i64) -> Value {
    json!({
        "1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": seed}},
        "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "quick"}},
    })
}

async fn submit(http: &reqwest::Client, host: &Host, workflow: Value) -> String {
    let resp = http.post(format!("{}/api/v2/jobs", host.base)).json(&json!({ "workflow": workflow })).send().await.unwrap();
    assert_eq!(resp.status(), 201);
    resp.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_string()
}

async fn job(http: &reqwest::Client, host: &Host, id: &str) -> Value {
    http.get(format!("{}/api/v2/jobs/{id}", host.base)).send().await.unwrap().json().await.unwrap()
}

/// Polls `host` until the job's status is one of `wanted`.
async fn wait_for(http: &reqwest::Client, host: &Host, id: &str, wanted: &[&str], within: Duration) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let job = job(http, host, id).await;
        if wanted.contains(&job["status"].as_str().unwrap_or("")) {
            return job;
        }
        assert!(Instant::now() < deadline, "job {id} never reached {wanted:?}: {job}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn download(http: &reqwest::Client, host: &Host, job: &Value) -> Vec<u8> {
    let url = job["outputs"][0]["url"].as_str().unwrap_or_else(|| panic!("an output: {job}"));
    let path = url.split_once("/api/v2").unwrap().1;
    let resp = http.get(format!("{}/api/v2{path}", host.base)).send().await.unwrap();
    assert_eq!(resp.status(), 200, "{url}");
    resp.bytes().await.unwrap().to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hosts_serve_as_one() {
    let Some(shared) = shared().await else { return };
    let hosts: Vec<Host> = ["h1", "h2", "h3"].iter().map(|name| start(name, &shared)).collect();
    let http = reqwest::Client::new();
    let [h1, h2, h3] = [&hosts[0], &hosts[1], &hosts[2]];

    // Jobs submitted to every host, each polled through the next and its
    // output downloaded through the one after: the same bytes everywhere.
    let mut ids = Vec::new();
    for n in 0..6 {
        ids.push((n, submit(&http, &hosts[n % 3], quick(n as i64)).await));
    }
    for (n, id) in &ids {
        let done = wait_for(&http, &hosts[(n + 1) % 3], id, &["succeeded", "failed"], Duration::from_secs(30)).await;
        assert_eq!(done["status"], "succeeded", "{done}");
        let png = download(&http, &hosts[(n + 2) % 3], &done).await;
        assert_eq!(&png[..4], b"\x89PNG");
    }
    let listed: Value = http.get(format!("{}/api/v2/jobs?limit=100", h2.base)).send().await.unwrap().json().await.unwrap();
    assert_eq!(listed["jobs"].as_array().unwrap().len(), 6, "a listing on any host shows every host's jobs");

    // An event stream on h2 follows a job h1 runs, to its end.
    let id = submit(&http, h1, slow(1)).await;
    let mut stream = http.get(format!("{}/api/v2/jobs/{id}/events", h2.base)).send().await.unwrap();
    assert_eq!(stream.status(), 200);
    let mut seen = String::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !seen.contains("\"status\":\"succeeded\"") {
        let chunk = tokio::time::timeout_at(deadline.into(), stream.chunk()).await.expect("the stream ends the job within 60 s").unwrap();
        let Some(chunk) = chunk else { break };
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(seen.contains("\"status\":\"running\"") && seen.contains("event: output"), "the stream saw the run: {seen}");
    assert!(seen.contains("\"status\":\"succeeded\""), "and its end: {seen}");

    // The compat WebSocket on h3 hears a prompt queued on h1.
    let ws_url = format!("{}/ws?clientId=watcher", h3.base.replacen("http", "ws", 1));
    let (mut socket, _) = tokio_tungstenite::connect_async(ws_url).await.unwrap();
    let queued: Value =
        http.post(format!("{}/api/prompt", h1.base)).json(&json!({ "prompt": quick(42), "client_id": "watcher" })).send().await.unwrap().json().await.unwrap();
    let prompt_id = queued["prompt_id"].as_str().unwrap_or_else(|| panic!("{queued}")).to_string();
    let heard = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(Ok(message)) = socket.next().await {
            if let tokio_tungstenite::tungstenite::Message::Text(text) = message {
                let message: Value = serde_json::from_str(&text).unwrap();
                if message["type"] == "execution_success" && message["data"]["prompt_id"] == prompt_id.as_str() {
                    return true;
                }
            }
        }
        false
    })
    .await;
    assert_eq!(heard, Ok(true), "h3's socket heard the prompt h1 ran succeed");
    let _ = socket.close(None).await;

    // A cancel sent to h2 stops the job h1 runs; h3 sees it canceled.
    let id = submit(&http, h1, slow(2)).await;
    wait_for(&http, h3, &id, &["running"], Duration::from_secs(30)).await;
    let resp = http.post(format!("{}/api/v2/jobs/{id}/cancel", h2.base)).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let answer: Value = resp.json().await.unwrap();
    assert!(["canceling", "canceled"].contains(&answer["status"].as_str().unwrap()), "{answer}");
    wait_for(&http, h3, &id, &["canceled"], Duration::from_secs(30)).await;

    // An Idempotency-Key raced on all three hosts: one 201.
    let racing = (0..9).map(|n| {
        let (http, url) = (http.clone(), format!("{}/api/v2/jobs", hosts[n % 3].base));
        async move { http.post(url).header("Idempotency-Key", "raced").json(&json!({ "workflow": quick(7) })).send().await.unwrap().status().as_u16() }
    });
    let mut codes = futures_util::future::join_all(racing).await;
    codes.sort();
    assert_eq!(codes.iter().filter(|&&c| c == 201).count(), 1, "{codes:?}");

    // SIGKILL of the host running a job: another host takes it over once
    // the lease lapses, and runs it to the end.
    let id = submit(&http, h1, slow(3)).await;
    wait_for(&http, h2, &id, &["running"], Duration::from_secs(30)).await;
    let mut hosts = hosts;
    let mut h1 = hosts.remove(0);
    h1.child.kill().unwrap();
    h1.child.wait().unwrap();
    let killed_at = Instant::now();
    let (h2, h3) = (&hosts[0], &hosts[1]);
    let done = wait_for(&http, h2, &id, &["succeeded", "failed", "canceled"], Duration::from_secs(90)).await;
    assert_eq!(done["status"], "succeeded", "the job ran again on another host: {done}");
    assert!(killed_at.elapsed() >= Duration::from_secs(2), "not before the dead host's lease lapsed");
    let png = download(&http, h3, &done).await;
    assert_eq!(&png[..4], b"\x89PNG");
    // The hosts left still take and run new work.
    let id = submit(&http, h3, quick(9)).await;
    assert_eq!(wait_for(&http, h2, &id, &["succeeded", "failed"], Duration::from_secs(30)).await["status"], "succeeded");
}
