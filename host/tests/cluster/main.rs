//! Three `kiln serve` processes as one service: one PostgreSQL database
//! (`KILN_TEST_DATABASE_URL`) and one S3 bucket (`KILN_TEST_S3_ENDPOINT`,
//! SeaweedFS in CI), each host with a data directory of its own. A job
//! submitted to one host is polled, streamed (SSE and the compat
//! WebSocket), canceled and downloaded through the others; a host killed
//! with SIGKILL while it runs a job loses it to another host, which runs
//! it; an Idempotency-Key raced on all three is taken once. In cloud mode,
//! accounts made, topped up or disabled through one host hold on all, and
//! a tenant's queue bound and credits hold across concurrent submissions
//! on all three. Jobs queued on a busy host are taken and run by idle
//! ones (a host whose queue waits on a running limit counts as idle). A deployment made, stopped or started through one host
//! is served, refused or served again by the others. A host whose plugins
//! differ from the dead host's never takes over a job it would run on other
//! code: the job waits for a host that has its components. PostgreSQL
//! restarted under three hosts loses nothing: a
//! submission during the outage is 500 `upstream_error` (its key stays
//! free), the job running through it ends recorded, and the hosts go on.
//! The bucket going away under two hosts loses nothing either: uploads and
//! reads of blobs a host has not cached are 500 `upstream_error`, a job
//! whose output cannot be stored fails, records and cached blobs still
//! answer, and everything stored reads back once the bucket is back.
//! The retention sweep runs on one host at a time (the database's advisory
//! lock), and ComfyUI's `/interrupt` through one self-hosted host stops the
//! prompts running on another.
//! Without the servers these skip, except under CI, where they fail.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

#[allow(dead_code)]
#[path = "../../../tests/e2e/own_postgres.rs"]
mod own_postgres;
#[allow(dead_code)]
#[path = "../../../tests/e2e/own_weed.rs"]
mod own_weed;

mod deployments;
mod installs;
mod migrate;
mod plugins;
mod restart;
mod serve;
mod sharing;
mod tenants;

/// The operator token hosts started with `KILN_ADMIN_TOKEN` take.
const ADMIN: &str = "cluster-admin-token";

/// A running `kiln serve` of the cluster.
struct Host {
    child: std::process::Child,
    base: String,
    _data: Option<tempfile::TempDir>,
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
    let mut host = start_in(data.path(), name, shared, extra);
    host._data = Some(data);
    host
}

/// `kiln serve` on data directory `data` (kept when the host is dropped).
fn start_in(data: &std::path::Path, name: &str, shared: &[(String, String)], extra: &[(&str, &str)]) -> Host {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kiln"));
    cmd.args(["serve", "--port", "0", "--data-dir"])
        .arg(data)
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
    Host { child, base, _data: None }
}

/// A job that runs for a few seconds (twenty blurs of a 2048² image, about
/// 150 ms each here) and then saves an image.
fn slow(seed: i64) -> Value {
    let mut graph = json!({
        "1": {"class_type": "EmptyImage", "inputs": {"width": 2048, "height": 2048, "batch_size": 1, "color": seed}},
    });
    let last = blurs(&mut graph, 20);
    graph["99"] = json!({"class_type": "SaveImage", "inputs": {"images": [last, 0], "filename_prefix": "slow"}});
    graph
}

/// Adds `count` blurs in a row to `graph` after its node "1" (as nodes
/// "2", "3", …): the last one's id.
fn blurs(graph: &mut Value, count: usize) -> String {
    let mut last = "1".to_string();
    for n in 2..2 + count {
        graph[n.to_string()] = json!({"class_type": "ImageBlur", "inputs": {"image": [last, 0], "blur_radius": 31, "sigma": 8.0}});
        last = n.to_string();
    }
    last
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

/// The bucket the hosts share, as a client of it.
fn bucket(shared: &[(String, String)]) -> object_store::aws::AmazonS3 {
    object_store::aws::AmazonS3Builder::from_env()
        .with_endpoint(env(shared, "KILN_S3_ENDPOINT"))
        .with_allow_http(true)
        .with_bucket_name(env(shared, "KILN_S3_BUCKET"))
        .with_region("us-east-1")
        .build()
        .unwrap()
}

fn env(shared: &[(String, String)], name: &str) -> String {
    shared.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()).unwrap_or_else(|| panic!("{name} is set"))
}

/// `POST /api/v2/jobs` to `host` with an Idempotency-Key.
async fn submit_keyed(http: &reqwest::Client, host: &Host, key: &str, workflow: Value) -> reqwest::Response {
    http.post(format!("{}/api/v2/jobs", host.base)).header("Idempotency-Key", key).json(&json!({ "workflow": workflow })).send().await.unwrap()
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
