//! A fake partner provider on loopback: the provider's create and status
//! routes and a result download, with the failures a real one shows. What
//! it does is chosen by the request (the `image` value, or `sharpen` for
//! the node, whose image is always real PNG data), so one instance serves
//! every test; every request is recorded.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

/// The provider key the fake expects (`x-freepik-api-key`).
pub const PROVIDER_KEY: &str = "provider-key-1";

/// base64 of the words that select a behaviour of the create route.
pub const PAY: &str = "UGF5"; // 402
pub const BAD: &str = "QmFk"; // 400 with a message
pub const SLOW: &str = "U2xvdw=="; // answers after 3 s
pub const BIG: &str = "QmlnYm9keQ=="; // 200 with a 2 MiB body
pub const GARBAGE: &str = "R2FyYmFnZQ=="; // 200, not JSON
pub const FAIL: &str = "RmFpbA=="; // 500 with internal detail

/// `sharpen` values that select a task's fate for the node.
pub const SHARPEN_FAILS: i64 = 99;
pub const SHARPEN_NEVER_ENDS: i64 = 98;
pub const SHARPEN_NO_CREDITS: i64 = 97;
pub const SHARPEN_RESULT_ON_LOCALHOST: i64 = 96;
pub const SHARPEN_RESULT_ON_OTHER_PORT: i64 = 95;

/// One request the fake received.
#[derive(Debug, Clone)]
pub struct Seen {
    pub at: Instant,
    pub method: &'static str,
    pub path: String,
    pub api_key: Option<String>,
    pub authorization: Option<String>,
    pub body: Value,
    /// For a status request: the `sharpen` its task was created with.
    pub task_sharpen: Option<i64>,
}

#[derive(Default)]
struct Task {
    polls: u32,
    sharpen: i64,
}

#[derive(Default)]
struct Inner {
    seen: Vec<Seen>,
    tasks: std::collections::HashMap<String, Task>,
}

/// The running fake.
#[derive(Clone)]
pub struct Fake {
    pub port: u16,
    inner: Arc<Mutex<Inner>>,
}

impl Fake {
    /// Starts the fake on its own thread and runtime (it outlives any test's).
    pub fn start() -> Fake {
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        std_listener.set_nonblocking(true).unwrap();
        let port = std_listener.local_addr().unwrap().port();
        let fake = Fake { port, inner: Arc::default() };
        let app = Router::new()
            .route("/v1/ai/skin-enhancer/flexible", post(create))
            .route("/v1/ai/skin-enhancer/{task_id}", get(status))
            .route("/files/{name}", get(file))
            .with_state(fake.clone());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(std_listener).unwrap();
                axum::serve(listener, app).await.unwrap();
            });
        });
        fake
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Every request so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.inner.lock().unwrap().seen.clone()
    }

    /// Requests whose body or path mentions `marker`.
    pub fn seen_with(&self, marker: &str) -> Vec<Seen> {
        self.seen().into_iter().filter(|s| s.path.contains(marker) || s.body.to_string().contains(marker)).collect()
    }

    fn record(&self, method: &'static str, path: String, headers: &HeaderMap, body: Value) {
        let header = |n: &str| headers.get(n).and_then(|v| v.to_str().ok()).map(String::from);
        let task_sharpen = path.rsplit('/').next().and_then(|id| self.inner.lock().unwrap().tasks.get(id).map(|t| t.sharpen));
        let seen = Seen { at: Instant::now(), method, path, api_key: header("x-freepik-api-key"), authorization: header("authorization"), body, task_sharpen };
        self.inner.lock().unwrap().seen.push(seen);
    }
}

fn error(status: u16, message: &str) -> Response {
    (StatusCode::from_u16(status).unwrap(), axum::Json(json!({ "message": message }))).into_response()
}

async fn create(State(fake): State<Fake>, headers: HeaderMap, body: String) -> Response {
    let body: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    fake.record("POST", "/v1/ai/skin-enhancer/flexible".into(), &headers, body.clone());
    if headers.get("x-freepik-api-key").and_then(|v| v.to_str().ok()) != Some(PROVIDER_KEY) {
        return error(401, "Invalid API key");
    }
    let sharpen = body["sharpen"].as_i64().unwrap_or(0);
    match body["image"].as_str().unwrap_or("") {
        PAY => return error(402, "Not enough credits"),
        BAD => return error(400, "Image could not be processed"),
        FAIL => return error(500, "database at 10.0.0.3 is down"),
        GARBAGE => return (StatusCode::OK, "<html>teapot</html>").into_response(),
        BIG => return (StatusCode::OK, "x".repeat(2 << 20)).into_response(),
        SLOW => tokio::time::sleep(Duration::from_secs(3)).await,
        _ if sharpen == SHARPEN_NO_CREDITS => return error(402, "Not enough credits"),
        _ => {}
    }
    let task_id = uuid::Uuid::new_v4().to_string();
    fake.inner.lock().unwrap().tasks.insert(task_id.clone(), Task { polls: 0, sharpen });
    axum::Json(json!({ "data": { "task_id": task_id, "status": "CREATED", "generated": [] } })).into_response()
}

async fn status(State(fake): State<Fake>, Path(task_id): Path<String>, headers: HeaderMap) -> Response {
    fake.record("GET", format!("/v1/ai/skin-enhancer/{task_id}"), &headers, Value::Null);
    if headers.get("x-freepik-api-key").and_then(|v| v.to_str().ok()) != Some(PROVIDER_KEY) {
        return error(401, "Invalid API key");
    }
    let (polls, sharpen) = {
        let mut inner = fake.inner.lock().unwrap();
        let Some(task) = inner.tasks.get_mut(&task_id) else { return error(404, "Not found") };
        task.polls += 1;
        (task.polls, task.sharpen)
    };
    let host = match sharpen {
        SHARPEN_RESULT_ON_LOCALHOST => format!("localhost:{}", fake.port),
        // A port nothing in the allowlist names.
        SHARPEN_RESULT_ON_OTHER_PORT => format!("127.0.0.1:{}", fake.port.wrapping_add(1).max(1)),
        _ => format!("127.0.0.1:{}", fake.port),
    };
    let (state, generated) = match (polls, sharpen) {
        (_, SHARPEN_NEVER_ENDS) | (1, _) => ("IN_PROGRESS", json!([])),
        (_, SHARPEN_FAILS) => ("FAILED", json!([])),
        _ => ("COMPLETED", json!([format!("http://{host}/files/{task_id}.png")])),
    };
    axum::Json(json!({ "data": { "task_id": task_id, "status": state, "generated": generated } })).into_response()
}

async fn file(State(fake): State<Fake>, Path(name): Path<String>, headers: HeaderMap) -> Response {
    fake.record("GET", format!("/files/{name}"), &headers, Value::Null);
    ([("content-type", "image/png")], result_png()).into_response()
}

/// The enhanced image every completed task yields: 200×180, a red–green gradient.
pub fn result_png() -> Vec<u8> {
    let (w, h) = (200u32, 180u32);
    let mut pixels = Vec::with_capacity((w * h * 3) as usize);
    for y in 0..h {
        for x in 0..w {
            pixels.extend_from_slice(&[(x % 256) as u8, (y % 256) as u8, 7]);
        }
    }
    let mut out = Vec::new();
    {
        let mut encoder = png::Encoder::new(&mut out, w, h);
        encoder.set_color(png::ColorType::Rgb);
        encoder.set_depth(png::BitDepth::Eight);
        encoder.write_header().unwrap().write_image_data(&pixels).unwrap();
    }
    out
}
