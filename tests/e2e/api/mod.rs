//! The Jobs API (`/api/v2`) over real HTTP on loopback: a real server
//! (`kiln::server::Server`) on the shared plugin runtime, driven with
//! reqwest. One module per area of the spec.

mod account_plugins;
mod admission;
mod assets;
mod auth;
mod blob_gc;
mod bundles;
mod deployments;
mod disk;
mod durability;
mod events;
mod failures;
mod fair;
mod idempotency;
mod intake;
mod jobs;
mod metrics;
mod plugins;
mod postgres;
mod s3;
mod sessions;
mod tenants;

use std::time::Duration;

use kiln::config::Config;
use kiln::server::Server;
use kiln::service::ServiceOptions;
use serde_json::{Value, json};

use crate::support::{env, test_config};

/// A server on a fresh data directory.
pub struct TestServer {
    pub server: Server,
    pub base: String,
    pub http: reqwest::Client,
    pub data: tempfile::TempDir,
}

/// Test settings: loopback, a free port, small limits.
pub fn config(data: &std::path::Path) -> Config {
    Config { host: "127.0.0.1".into(), port: 0, data_dir: data.to_path_buf(), max_running_jobs: 2, ..test_config() }
}

/// A new database on the PostgreSQL test server (`KILN_TEST_DATABASE_URL`),
/// as a `postgres://` URL; `None` when there is none (outside CI only).
pub async fn fresh_database() -> Option<String> {
    let Ok(url) = std::env::var("KILN_TEST_DATABASE_URL") else {
        assert!(std::env::var_os("CI").is_none(), "CI must set KILN_TEST_DATABASE_URL (.ci/run starts PostgreSQL)");
        eprintln!("SKIPPED: KILN_TEST_DATABASE_URL is not set");
        return None;
    };
    let name = format!("kiln_e2e_{}", uuid::Uuid::new_v4().simple());
    let admin = sqlx::PgPool::connect(&url).await.unwrap();
    sqlx::query(&format!("CREATE DATABASE {name}")).execute(&admin).await.unwrap();
    admin.close().await;
    Some(format!("{}/{name}", url.rsplit_once('/').unwrap().0))
}

/// With `KILN_TEST_STORE=postgres` every server of these suites keeps its
/// records in PostgreSQL: a database of its own, remembered in its data
/// directory so a restart on that directory finds it again. With
/// `KILN_TEST_BLOB_STORE=s3`, its blobs in a bucket of its own on the S3
/// server `KILN_TEST_S3_ENDPOINT` names, remembered the same way.
async fn store_of_the_run(config: &mut Config) {
    blobs_of_the_run(config);
    if std::env::var("KILN_TEST_STORE").as_deref() != Ok("postgres") {
        return;
    }
    let remembered = config.data_dir.join("test-database-url");
    let url = match std::fs::read_to_string(&remembered) {
        Ok(url) => url,
        Err(_) => {
            let url = fresh_database().await.expect("KILN_TEST_STORE=postgres needs KILN_TEST_DATABASE_URL");
            std::fs::write(&remembered, &url).unwrap();
            url
        }
    };
    config.store = kiln::config::StoreKind::Postgres;
    config.database_url = Some(url);
    // One host id per data directory: a restart on it takes its jobs back
    // at once, as an operator's restarted host does.
    let host = config.data_dir.join("test-host-id");
    let id = std::fs::read_to_string(&host).unwrap_or_else(|_| {
        let id = format!("e2e-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
        std::fs::write(&host, &id).unwrap();
        id
    });
    config.host_id = Some(id);
}

fn blobs_of_the_run(config: &mut Config) {
    if std::env::var("KILN_TEST_BLOB_STORE").as_deref() != Ok("s3") {
        return;
    }
    let endpoint = std::env::var("KILN_TEST_S3_ENDPOINT").expect("KILN_TEST_BLOB_STORE=s3 needs KILN_TEST_S3_ENDPOINT");
    let remembered = config.data_dir.join("test-bucket");
    let bucket = std::fs::read_to_string(&remembered).unwrap_or_else(|_| {
        let bucket = format!("kiln-e2e-{}", uuid::Uuid::new_v4().simple());
        std::fs::write(&remembered, &bucket).unwrap();
        bucket
    });
    config.blob_store = kiln::config::BlobStoreKind::S3;
    config.s3_endpoint = Some(endpoint);
    config.s3_bucket = Some(bucket);
}

pub async fn start_in(data: tempfile::TempDir, tweak: impl FnOnce(&mut Config, &mut ServiceOptions)) -> TestServer {
    let env = env().await;
    let mut config = config(data.path());
    store_of_the_run(&mut config).await;
    let mut options = ServiceOptions::from_config(&config);
    tweak(&mut config, &mut options);
    let server = Server::start_with(config, options, env.runtime.clone(), env.registry.clone()).await.expect("server starts");
    let base = format!("{}/api/v2", server.url());
    TestServer { server, base, http: reqwest::Client::new(), data }
}

/// A server on the backends `make` builds in its data directory (test
/// doubles around the embedded ones).
pub async fn start_on_backends(make: impl FnOnce(&std::path::Path) -> kiln::service::Backends) -> TestServer {
    let env = env().await;
    let data = tempfile::tempdir().unwrap();
    let config = config(data.path());
    let options = ServiceOptions::from_config(&config);
    let backends = make(data.path());
    let executor = std::sync::Arc::new(kiln::executor::Executor::new(env.runtime.clone(), 0, 2));
    let service = kiln::service::Service::start_on(options, backends, env.registry.clone(), executor).await.expect("service starts");
    let server = Server::start_on(config, service).await.expect("server starts");
    TestServer { base: format!("{}/api/v2", server.url()), server, http: reqwest::Client::new(), data }
}

pub async fn start(tweak: impl FnOnce(&mut Config, &mut ServiceOptions)) -> TestServer {
    start_in(tempfile::tempdir().unwrap(), tweak).await
}

pub async fn start_default() -> TestServer {
    start(|_, _| {}).await
}

impl TestServer {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// A new account `name` holding `credits`, made through the admin API
    /// with the operator token `operator` (201 expected): its key and id.
    pub async fn new_account(&self, operator: &str, name: &str, credits: i64) -> (String, String) {
        let resp = self
            .http
            .post(format!("{}/admin/accounts", self.server.url()))
            .bearer_auth(operator)
            .json(&json!({ "name": name, "credits": credits }))
            .send()
            .await
            .unwrap();
        let status = resp.status();
        let body: Value = resp.json().await.unwrap_or(Value::Null);
        assert_eq!(status, 201, "{body}");
        (body["key"].as_str().unwrap().to_string(), body["account"]["id"].as_str().unwrap().to_string())
    }

    /// POST /jobs with `body`; returns (status, JSON body, headers).
    pub async fn post_job(&self, body: &Value, key: Option<&str>) -> (u16, Value, reqwest::header::HeaderMap) {
        let mut req = self.http.post(self.url("/jobs")).json(body);
        if let Some(k) = key {
            req = req.header("Idempotency-Key", k);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        (status, resp.json().await.unwrap_or(Value::Null), headers)
    }

    /// Submits `workflow`, asserting 201; returns the Job.
    pub async fn submit(&self, workflow: Value) -> Value {
        let (status, job, _) = self.post_job(&json!({ "workflow": workflow }), None).await;
        assert_eq!(status, 201, "{job}");
        job
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        let resp = self.http.get(self.url(path)).send().await.unwrap();
        (resp.status().as_u16(), resp.json().await.unwrap_or(Value::Null))
    }

    pub async fn job(&self, id: &str) -> Value {
        let (status, job) = self.get(&format!("/jobs/{id}")).await;
        assert_eq!(status, 200, "{job}");
        job
    }

    /// Polls until the job is terminal (at most 30 s).
    pub async fn wait(&self, id: &str) -> Value {
        for _ in 0..600 {
            let job = self.job(id).await;
            if ["succeeded", "failed", "canceled", "expired"].contains(&job["status"].as_str().unwrap()) {
                return job;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("job {id} did not finish");
    }

    /// Polls until the job has `status`.
    pub async fn wait_for(&self, id: &str, status: &str) -> Value {
        for _ in 0..600 {
            let job = self.job(id).await;
            if job["status"] == status {
                return job;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("job {id} never became {status}");
    }

    /// Uploads `bytes` as `name`; returns (status, Asset).
    pub async fn upload(&self, name: &str, bytes: Vec<u8>, expected_hash: Option<&str>) -> (u16, Value) {
        let mut form = reqwest::multipart::Form::new().text("content_type", "image/png").text("file_path", name.to_string());
        if let Some(h) = expected_hash {
            form = form.text("expected_hash", h.to_string());
        }
        form = form.part("file", reqwest::multipart::Part::bytes(bytes).file_name(name.to_string()).mime_str("image/png").unwrap());
        let resp = self.http.post(self.url("/assets")).multipart(form).send().await.unwrap();
        (resp.status().as_u16(), resp.json().await.unwrap_or(Value::Null))
    }

    /// Cancels job `id` after `ms` milliseconds, from another task.
    pub fn cancel_later(&self, id: &str, ms: u64) -> tokio::task::JoinHandle<()> {
        let (http, url) = (self.http.clone(), self.url(&format!("/jobs/{id}/cancel")));
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            http.post(url).send().await.unwrap();
        })
    }

    pub async fn shutdown(self) -> tempfile::TempDir {
        self.server.shutdown().await.unwrap();
        self.data
    }
}

/// A small PNG (w×h RGB gradient).
pub fn png_bytes(w: u32, h: u32, seed: u8) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("in.png");
    let pixels: Vec<u8> = (0..w * h * 3).map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed)).collect();
    crate::support::write_png(&path, w, h, 3, &pixels);
    std::fs::read(path).unwrap()
}

/// `{"__type": "core/ASSET", "info": {...}}` for an Asset.
pub fn asset_ref(asset: &Value) -> Value {
    json!({ "__type": "core/ASSET", "info": { "id": asset["id"], "hash": asset["hash"], "file_path": asset["file_path"] } })
}

/// LoadImage(asset) → SaveImage.
pub fn load_save(asset: &Value) -> Value {
    json!({
        "1": { "class_type": "LoadImage", "inputs": { "image": asset_ref(asset) } },
        "2": { "class_type": "SaveImage", "inputs": { "images": ["1", 0], "filename_prefix": "kiln" } },
    })
}

/// A job that runs until its node's 2 s limit (the hostile infinite loop).
pub fn spinner(trigger: i64) -> Value {
    json!({ "1": { "class_type": "HostileInfiniteLoop", "inputs": { "trigger": trigger } } })
}

/// A job that succeeds without inputs.
pub fn trivial(n: i64) -> Value {
    json!({
        "1": { "class_type": "EmptyImage", "inputs": { "width": 8, "height": 8, "batch_size": 1, "color": n } },
        "2": { "class_type": "SaveImage", "inputs": { "images": ["1", 0], "filename_prefix": "t" } },
    })
}

/// Checks the keys every Job must carry (required-nullable ones present).
pub fn assert_job_shape(job: &Value) {
    for key in ["id", "status", "created_at", "started_at", "completed_at", "expires_at", "queue_position", "progress", "outputs", "error", "urls"] {
        assert!(job.get(key).is_some(), "Job lacks `{key}`: {job}");
    }
    for key in ["created_at", "expires_at"] {
        assert!(job[key].as_str().unwrap().ends_with("+00:00"), "{key} must carry an offset: {job}");
    }
    for key in ["self", "events", "cancel"] {
        assert!(job["urls"][key].as_str().unwrap().starts_with('/'), "urls.{key} must be host-relative: {job}");
    }
    assert!(job["metrics"].as_object().is_some_and(|m| m.contains_key("queue_ms") && m.contains_key("execution_ms")));
}
