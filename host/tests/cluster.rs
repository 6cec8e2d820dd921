//! Three `kiln serve` processes as one service: one PostgreSQL database
//! (`KILN_TEST_DATABASE_URL`) and one S3 bucket (`KILN_TEST_S3_ENDPOINT`,
//! SeaweedFS in CI), each host with a data directory of its own. A job
//! submitted to one host is polled, streamed (SSE and the compat
//! WebSocket), canceled and downloaded through the others; a host killed
//! with SIGKILL while it runs a job loses it to another host, which runs
//! it; an Idempotency-Key raced on all three is taken once. In cloud mode,
//! accounts made, topped up or disabled through one host hold on all, and
//! a tenant's queue bound and credits hold across concurrent submissions
//! on all three. A deployment made, stopped or started through one host
//! is served, refused or served again by the others. PostgreSQL restarted under three hosts loses nothing: a
//! submission during the outage is 500 `upstream_error` (its key stays
//! free), the job running through it ends recorded, and the hosts go on.
//! Without the servers these skip, except under CI, where they fail.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{Value, json};

#[allow(dead_code)]
#[path = "../../tests/e2e/own_postgres.rs"]
mod own_postgres;

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
    let Ok(url) = std::env::var("KILN_TEST_DATABASE_URL") else {
        assert!(std::env::var_os("CI").is_none(), "CI must set KILN_TEST_DATABASE_URL (.ci/run starts PostgreSQL)");
        eprintln!("SKIPPED: KILN_TEST_DATABASE_URL is not set");
        return None;
    };
    shared_on(&url).await
}

/// A new database on the server at `url` and a new bucket, shared.
async fn shared_on(url: &str) -> Option<Vec<(String, String)>> {
    let Ok(endpoint) = std::env::var("KILN_TEST_S3_ENDPOINT") else {
        assert!(std::env::var_os("CI").is_none(), "CI must set KILN_TEST_S3_ENDPOINT (.ci/run starts an S3 server)");
        eprintln!("SKIPPED: KILN_TEST_S3_ENDPOINT is not set");
        return None;
    };
    let name = format!("kiln_cluster_{}", uuid::Uuid::new_v4().simple());
    let admin = sqlx::PgPool::connect(url).await.expect("the test server answers");
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
    start_with(name, shared, &[])
}

fn start_with(name: &str, shared: &[(String, String)], extra: &[(&str, &str)]) -> Host {
    let data = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kiln"));
    cmd.args(["serve", "--port", "0", "--data-dir"])
        .arg(data.path())
        .env("KILN_CACHE_DIR", std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("kiln-artifacts"))
        .env("KILN_HOST_ID", name)
        .envs(shared.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .envs(extra.iter().copied())
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

const ADMIN: &str = "cluster-admin-token";

/// Creates account `name` through `host`; its API key.
async fn create_account(http: &reqwest::Client, host: &Host, name: &str, credits: i64) -> String {
    let resp = http.post(format!("{}/admin/accounts", host.base)).bearer_auth(ADMIN).json(&json!({"name": name, "credits": credits})).send().await.unwrap();
    assert_eq!(resp.status(), 201, "{name}");
    resp.json::<Value>().await.unwrap()["key"].as_str().unwrap().to_string()
}

async fn admin(http: &reqwest::Client, host: &Host, path: &str, body: Value) -> Value {
    let resp = http.post(format!("{}/admin/accounts/{path}", host.base)).bearer_auth(ADMIN).json(&body).send().await.unwrap();
    assert_eq!(resp.status(), 200, "{path}");
    resp.json().await.unwrap()
}

async fn balance(http: &reqwest::Client, host: &Host, name: &str) -> i64 {
    let account: Value = http.get(format!("{}/admin/accounts/{name}", host.base)).bearer_auth(ADMIN).send().await.unwrap().json().await.unwrap();
    account["credits"].as_i64().unwrap_or_else(|| panic!("{account}"))
}

/// Submits as `key` through `host`: the status and the body.
async fn submit_as(http: &reqwest::Client, host: &Host, key: &str, workflow: Value) -> (u16, Value) {
    let resp = http.post(format!("{}/api/v2/jobs", host.base)).bearer_auth(key).json(&json!({ "workflow": workflow })).send().await.unwrap();
    (resp.status().as_u16(), resp.json().await.unwrap_or(Value::Null))
}

async fn job_as(http: &reqwest::Client, host: &Host, key: &str, id: &str) -> Value {
    http.get(format!("{}/api/v2/jobs/{id}", host.base)).bearer_auth(key).send().await.unwrap().json().await.unwrap()
}

/// Polls `host` as `key` until job `id`'s status is one of `wanted` (30 s).
async fn wait_as(http: &reqwest::Client, host: &Host, key: &str, id: &str, wanted: &[&str]) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let job = job_as(http, host, key, id).await;
        if wanted.contains(&job["status"].as_str().unwrap_or("")) {
            return job;
        }
        assert!(Instant::now() < deadline, "job {id} never reached {wanted:?}: {job}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls until `check` holds for the status `GET /api/v2/jobs` answers `key` on `host`.
async fn until_status(http: &reqwest::Client, host: &Host, key: &str, check: impl Fn(u16) -> bool, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let status = http.get(format!("{}/api/v2/jobs", host.base)).bearer_auth(key).send().await.unwrap().status().as_u16();
        if check(status) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: still {status} after 10 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Submits `workflow` as `key` `per_host` times on each host, all at once.
async fn burst(http: &reqwest::Client, hosts: &[Host], key: &str, per_host: usize, workflow: impl Fn(usize) -> Value) -> Vec<(usize, u16, Value)> {
    let racing = (0..per_host * hosts.len()).map(|n| {
        let (http, host, workflow) = (http.clone(), &hosts[n % hosts.len()], workflow(n));
        async move {
            let (status, body) = submit_as(&http, host, key, workflow).await;
            (n % hosts.len(), status, body)
        }
    });
    futures_util::future::join_all(racing).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_hold_across_hosts() {
    let Some(shared) = shared().await else { return };
    // One job at a time per host; a tenant may have six waiting in all;
    // a job costs at least 5 credits.
    let cloud = [
        ("KILN_MODE", "cloud"),
        ("KILN_ADMIN_TOKEN", ADMIN),
        ("KILN_MAX_RUNNING_JOBS", "1"),
        ("KILN_MAX_QUEUED_JOBS_PER_ACCOUNT", "6"),
        ("KILN_CREDITS_MIN_PER_JOB", "5"),
        ("KILN_CREDITS_PER_SECOND", "1"),
    ];
    let hosts: Vec<Host> = ["t1", "t2", "t3"].iter().map(|name| start_with(name, &shared, &cloud)).collect();
    let http = reqwest::Client::new();
    let [h1, h2, h3] = [&hosts[0], &hosts[1], &hosts[2]];

    // Accounts made on h1 are known to h2 and h3 at once.
    let blocker = create_account(&http, h1, "blocker", 1_000_000).await;
    let tenant = create_account(&http, h1, "tenant", 1_000_000).await;
    let poor = create_account(&http, h1, "poor", 1).await;
    for host in [h2, h3] {
        until_status(&http, host, &tenant, |s| s == 200, "a key made on h1 works on the others").await;
        until_status(&http, host, &poor, |s| s == 200, "a key made on h1 works on the others").await;
    }

    // Every host's one worker busy with a long job of another account ...
    let mut blocking = Vec::new();
    for host in &hosts {
        let (status, body) = submit_as(&http, host, &blocker, slow(1)).await;
        assert_eq!(status, 201, "{body}");
        blocking.push(body["id"].as_str().unwrap().to_string());
    }
    for (host, id) in hosts.iter().zip(&blocking) {
        wait_as(&http, host, &blocker, id, &["running"]).await;
    }
    // ... a tenant submitting 15 jobs on all three at once has 6 taken.
    let answers = burst(&http, &hosts, &tenant, 5, |n| quick(n as i64)).await;
    let taken: Vec<_> = answers.iter().filter(|(_, status, _)| *status == 201).collect();
    assert_eq!(taken.len(), 6, "the tenant's queue bound holds across hosts: {answers:?}");
    for (_, status, body) in &answers {
        assert!(*status == 201 || (*status == 429 && body["error"]["code"] == "queue_full"), "{status} {body}");
    }

    // ComfyUI's queue on any host shows the jobs of every host.
    let queue: Value = http.get(format!("{}/api/queue", h1.base)).header("X-API-Key", &tenant).send().await.unwrap().json().await.unwrap();
    let mut pending: Vec<&str> = queue["queue_pending"].as_array().unwrap_or_else(|| panic!("{queue}")).iter().map(|e| e[1].as_str().unwrap()).collect();
    let mut expected: Vec<&str> = taken.iter().map(|(_, _, body)| body["id"].as_str().unwrap()).collect();
    pending.sort();
    expected.sort();
    assert_eq!(pending, expected, "{queue}");
    let counted: Value = http.get(format!("{}/api/prompt", h3.base)).header("X-API-Key", &tenant).send().await.unwrap().json().await.unwrap();
    assert_eq!(counted["exec_info"]["queue_remaining"], 6, "{counted}");
    let queue: Value = http.get(format!("{}/api/queue", h2.base)).header("X-API-Key", &blocker).send().await.unwrap().json().await.unwrap();
    assert_eq!(queue["queue_running"].as_array().unwrap().len(), 3, "{queue}");

    // Disabled through h2: its keys fail on h3, and its jobs waiting on
    // every host are canceled (read from the database they share).
    admin(&http, h2, "tenant/disable", json!({})).await;
    until_status(&http, h3, &tenant, |s| s == 403, "an account disabled on h2 is disabled on h3").await;
    let db = sqlx::PgPool::connect(&env(&shared, "KILN_DATABASE_URL")).await.unwrap();
    for (_, _, body) in &taken {
        let id = body["id"].as_str().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let (status,): (String,) = sqlx::query_as("SELECT status FROM jobs WHERE id = $1").bind(id).fetch_one(&db).await.unwrap();
            if status == "canceled" {
                break;
            }
            assert!(Instant::now() < deadline, "job {id} of the disabled account is still {status}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    // ComfyUI's interrupt through h3 stops the account's running jobs on all.
    let resp = http.post(format!("{}/api/interrupt", h3.base)).header("X-API-Key", &blocker).json(&json!({})).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    for (host, id) in hosts.iter().zip(&blocking) {
        wait_as(&http, host, &blocker, id, &["canceled"]).await;
    }

    // An account with 1 credit: a job queued on h2 behind another account's
    // long job, then one run on h1, whose charge takes the balance below
    // zero; when h2's worker comes to the queued job, it does not run.
    let busy = submit_as(&http, h2, &blocker, slow(2)).await.1["id"].as_str().unwrap().to_string();
    wait_as(&http, h2, &blocker, &busy, &["running"]).await;
    let (status, queued) = submit_as(&http, h2, &poor, quick(100)).await;
    assert_eq!(status, 201, "{queued}");
    let (status, first) = submit_as(&http, h1, &poor, quick(101)).await;
    assert_eq!(status, 201, "{first}");
    let first = wait_as(&http, h3, &poor, first["id"].as_str().unwrap(), &["succeeded", "failed"]).await;
    assert_eq!(first["status"], "succeeded", "{first}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while balance(&http, h3, "poor").await != -4 {
        assert!(Instant::now() < deadline, "the charge of 5 lands: {}", balance(&http, h3, "poor").await);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    http.post(format!("{}/api/v2/jobs/{busy}/cancel", h1.base)).bearer_auth(&blocker).send().await.unwrap();
    let stopped = wait_as(&http, h3, &poor, queued["id"].as_str().unwrap(), &["succeeded", "failed"]).await;
    assert_eq!((stopped["status"].as_str(), stopped["error"]["code"].as_str()), (Some("failed"), Some("insufficient_credits")), "{stopped}");
    for host in &hosts {
        let (status, body) = submit_as(&http, host, &poor, quick(0)).await;
        assert_eq!((status, body["error"]["code"].as_str()), (402, Some("insufficient_credits")), "{body}");
    }
    assert_eq!(balance(&http, h1, "poor").await, -4, "the job that never ran cost nothing");

    // Topped up through h3 (to 96), it submits through h1 again ...
    admin(&http, h3, "poor/credits", json!({"amount": 100})).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body) = submit_as(&http, h1, &poor, quick(1)).await;
        if status == 201 {
            wait_as(&http, h1, &poor, body["id"].as_str().unwrap(), &["succeeded"]).await;
            break;
        }
        assert!(status == 402 && Instant::now() < deadline, "{status} {body}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // ... and six jobs at once on all three hosts are all charged, once each.
    let answers = burst(&http, &hosts, &poor, 2, |n| quick(200 + n as i64)).await;
    for (host, status, body) in &answers {
        assert_eq!(*status, 201, "{body}");
        wait_as(&http, &hosts[(host + 1) % 3], &poor, body["id"].as_str().unwrap(), &["succeeded"]).await;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while balance(&http, h2, "poor").await != 96 - 5 - 6 * 5 {
        assert!(Instant::now() < deadline, "every charge lands once: {}", balance(&http, h2, "poor").await);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // The same bytes uploaded through two hosts are one object in the bucket.
    let bytes = format!("the same bytes, {}", uuid::Uuid::new_v4()).into_bytes();
    let (mut hashes, mut ids) = (Vec::new(), Vec::new());
    for (host, created) in [(h1, 201), (h2, 200)] {
        let form =
            reqwest::multipart::Form::new().text("file_path", "same.txt").part("file", reqwest::multipart::Part::bytes(bytes.clone()).file_name("same.txt"));
        let resp = http.post(format!("{}/api/v2/assets", host.base)).bearer_auth(&blocker).multipart(form).send().await.unwrap();
        // The second host finds the first's asset: 200, the same one.
        assert_eq!(resp.status(), created);
        let asset: Value = resp.json().await.unwrap();
        hashes.push(asset["hash"].as_str().unwrap().to_string());
        ids.push(asset["id"].as_str().unwrap().to_string());
    }
    assert_eq!((&hashes[0], &ids[0]), (&hashes[1], &ids[1]));
    assert_eq!(hashes[0], format!("blake3:{}", blake3::hash(&bytes).to_hex()));
    let bucket = object_store::aws::AmazonS3Builder::from_env()
        .with_endpoint(env(&shared, "KILN_S3_ENDPOINT"))
        .with_allow_http(true)
        .with_bucket_name(env(&shared, "KILN_S3_BUCKET"))
        .with_region("us-east-1")
        .build()
        .unwrap();
    let hex = hashes[0].trim_start_matches("blake3:").to_string();
    let objects: Vec<_> = object_store::ObjectStore::list(&bucket, None)
        .filter_map(|o| async { o.ok() })
        .filter(|o| futures_util::future::ready(o.location.as_ref().contains(&hex)))
        .collect()
        .await;
    assert_eq!(objects.len(), 1, "one object holds the bytes both hosts took: {objects:?}");
}

fn env(shared: &[(String, String)], name: &str) -> String {
    shared.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()).unwrap_or_else(|| panic!("{name} is set"))
}

/// `POST /api/v2/jobs` to `host` with an Idempotency-Key.
async fn submit_keyed(http: &reqwest::Client, host: &Host, key: &str, workflow: Value) -> reqwest::Response {
    http.post(format!("{}/api/v2/jobs", host.base)).header("Idempotency-Key", key).json(&json!({ "workflow": workflow })).send().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_restart_under_three_hosts_loses_nothing() {
    let Some(pg) = own_postgres::OwnPostgres::start_new() else { return };
    let Some(mut shared) = shared_on(&pg.url()).await else { return };
    // Leases outlast the outage.
    for (key, value) in shared.iter_mut() {
        match key.as_str() {
            "KILN_LEASE_S" => *value = "30".into(),
            "KILN_HEARTBEAT_S" => *value = "2".into(),
            _ => {}
        }
    }
    let mut hosts: Vec<Host> = ["r1", "r2", "r3"].iter().map(|name| start(name, &shared)).collect();
    let http = reqwest::Client::new();
    let running = submit(&http, &hosts[0], slow(5)).await;
    wait_for(&http, &hosts[1], &running, &["running"], Duration::from_secs(30)).await;

    pg.stop();
    for (n, host) in hosts.iter().enumerate() {
        let resp = submit_keyed(&http, host, &format!("outage-{n}"), quick(n as i64)).await;
        let status = resp.status().as_u16();
        let body: Value = resp.json().await.unwrap();
        assert_eq!((status, body["error"]["code"].as_str()), (500, Some("upstream_error")), "{body}");
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    pg.start();

    // The job that ran through the outage ends, recorded, seen on every host.
    let ended = wait_for(&http, &hosts[2], &running, &["succeeded", "failed"], Duration::from_secs(60)).await;
    assert_eq!(ended["status"], "succeeded", "{ended}");
    for host in &hosts {
        assert_eq!(job(&http, host, &running).await["status"], "succeeded");
    }
    // The keys of the refused submissions are free; each host runs work.
    for (n, host) in hosts.iter().enumerate() {
        let resp = submit_keyed(&http, host, &format!("outage-{n}"), quick(n as i64)).await;
        assert_eq!(resp.status(), 201, "host {n}");
        let id = resp.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_string();
        let done = wait_for(&http, &hosts[(n + 1) % 3], &id, &["succeeded", "failed"], Duration::from_secs(30)).await;
        assert_eq!(done["status"], "succeeded", "{done}");
    }
    for host in &mut hosts {
        assert!(host.child.try_wait().unwrap().is_none(), "every host kept its lease through the outage");
    }
}

/// Polls `POST /deployment/{id}/api/v2/jobs` on `host` until it answers
/// `wanted` (within 60 s: a host loads the deployment's plugins first).
async fn deployment_answers(http: &reqwest::Client, host: &Host, id: &str, wanted: u16) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let resp = http.post(format!("{}/deployment/{id}/api/v2/jobs", host.base)).json(&json!({ "workflow": quick(3) })).send().await.unwrap();
        let status = resp.status().as_u16();
        let body: Value = resp.json().await.unwrap_or(Value::Null);
        if status == wanted {
            return body;
        }
        assert!(Instant::now() < deadline, "{} still answers {status} {body}, not {wanted}", host.base);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deployments_follow_the_operator_on_every_host() {
    let Some(shared) = shared().await else { return };
    let hosts: Vec<Host> = ["d1", "d2", "d3"].iter().map(|name| start_with(name, &shared, &[("KILN_ADMIN_TOKEN", ADMIN)])).collect();
    let http = reqwest::Client::new();
    let [h1, h2, h3] = [&hosts[0], &hosts[1], &hosts[2]];
    let operate = |host: &Host, path: &str, body: Option<Value>| {
        let request = http.post(format!("{}/admin/deployments{path}", host.base)).bearer_auth(ADMIN);
        let request = match body {
            Some(body) => request.json(&body),
            None => request,
        };
        async move { request.send().await.unwrap().status().as_u16() }
    };

    // Made through h1: served by h2, its job read through h3.
    assert_eq!(operate(h1, "", Some(json!({"id": "everywhere", "owner": "local"}))).await, 201);
    let queued = deployment_answers(&http, h2, "everywhere", 201).await;
    let id = queued["id"].as_str().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let job: Value = http.get(format!("{}/deployment/everywhere/api/v2/jobs/{id}", h3.base)).send().await.unwrap().json().await.unwrap();
        if job["status"] == "succeeded" {
            break;
        }
        assert!(Instant::now() < deadline && job["status"] != "failed", "{job}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Stopped through h3: refused by every host.
    assert_eq!(operate(h3, "/everywhere/stop", None).await, 200);
    for host in &hosts {
        let refused = deployment_answers(&http, host, "everywhere", 422).await;
        assert_eq!(refused["error"]["code"], "deployment_stopped", "{refused}");
    }
    // Started again through h2: h1 serves it again.
    assert_eq!(operate(h2, "/everywhere/start", None).await, 200);
    deployment_answers(&http, h1, "everywhere", 201).await;
}
