//! The partner proxy over real HTTP on loopback: the bundled
//! partner plugin's routes and node against a fake provider (`fake`), on
//! a server whose runtime grants the plugin the fake's address. Covers
//! every validation rule, auth, success and status, the provider's errors,
//! timeouts and oversized answers, allowlist refusals (logged), the node on
//! `/api/v2` and `/api/prompt` with the key from `extra_data`, insufficient
//! funds on the WebSocket, and cancellation mid-poll.

mod fake;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use kiln::config::Config;
use kiln::plugins::{NodeRegistry, PluginRuntime};
use kiln::server::Server;
use kiln::service::ServiceOptions;
use serde_json::{Value, json};
use tokio::sync::OnceCell;

use crate::api::TestServer;
use fake::Fake;

/// Tokens the proxy accepts.
const TOKEN: &str = "proxy-token-a";
const TOKEN_B: &str = "proxy-token-b";

struct Partner {
    fake: Fake,
    runtime: Arc<PluginRuntime>,
    registry: Arc<NodeRegistry>,
    logs: Arc<Mutex<Vec<u8>>>,
}

static PARTNER: OnceCell<Partner> = OnceCell::const_new();

/// Captured `warn` logs of the whole test binary.
#[derive(Clone)]
struct LogBuffer(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for LogBuffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn partner_config(fake: &Fake, data: &std::path::Path) -> Config {
    Config {
        host: "127.0.0.1".into(),
        port: 0,
        data_dir: data.to_path_buf(),
        max_running_jobs: 2,
        partner_base_url: Some(fake.url()),
        partner_api_key: Some(fake::PROVIDER_KEY.into()),
        partner_tokens: vec![TOKEN.into(), TOKEN_B.into()],
        // Allowed, but a name: it resolves to loopback, which only an IP
        // literal may name, so it is refused.
        partner_download_hosts: vec![format!("localhost:{}", fake.port)],
        outbound_first_byte_timeout_ms: 1500,
        ..crate::support::test_config()
    }
}

async fn partner() -> &'static Partner {
    PARTNER
        .get_or_init(|| async {
            let logs = Arc::new(Mutex::new(Vec::new()));
            let writer = LogBuffer(logs.clone());
            let subscriber = tracing_subscriber::fmt().with_writer(move || writer.clone()).with_ansi(false).with_max_level(tracing::Level::WARN).finish();
            tracing::subscriber::set_global_default(subscriber).expect("no other test sets a global subscriber");
            let fake = Fake::start();
            let config = partner_config(&fake, std::path::Path::new("unused"));
            let runtime = Arc::new(PluginRuntime::new(kiln::plugins::RuntimeConfig::from_config(&config).expect("config")).expect("runtime"));
            let registry = Arc::new(NodeRegistry::load_all(&runtime, &[]).await.expect("bundled plugins load"));
            Partner { fake, runtime, registry, logs }
        })
        .await
}

/// A server whose partner plugin talks to the fake provider.
async fn server(tweak: impl FnOnce(&mut Config)) -> (TestServer, &'static Partner) {
    let p = partner().await;
    let data = tempfile::tempdir().unwrap();
    let mut config = partner_config(&p.fake, data.path());
    tweak(&mut config);
    let options = ServiceOptions::from_config(&config);
    let server = Server::start_with(config, options, p.runtime.clone(), p.registry.clone()).await.expect("server starts");
    let base = format!("{}/api/v2", server.url());
    (TestServer { server, base, http: reqwest::Client::new(), data }, p)
}

enum Auth<'a> {
    None,
    Bearer(&'a str),
    Key(&'a str),
}

fn route(s: &TestServer, rest: &str) -> String {
    format!("{}/proxy/partner/v1/ai/skin-enhancer/{rest}", s.server.url())
}

async fn send(req: reqwest::RequestBuilder, auth: Auth<'_>) -> (u16, Value) {
    let req = match auth {
        Auth::None => req,
        Auth::Bearer(t) => req.bearer_auth(t),
        Auth::Key(t) => req.header("X-API-KEY", t),
    };
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

async fn create(s: &TestServer, auth: Auth<'_>, body: &Value) -> (u16, Value) {
    send(s.http.post(route(s, "flexible")).json(body), auth).await
}

/// `{error, message}` with non-empty strings.
fn assert_error_shape(body: &Value) {
    assert!(body["error"].as_str().is_some_and(|e| !e.is_empty()) && body["message"].as_str().is_some_and(|m| !m.is_empty()), "{body}");
    assert_eq!(body.as_object().unwrap().len(), 2, "{body}");
}

#[tokio::test]
async fn every_validation_rule_answers_400_and_reaches_no_provider() {
    let (s, p) = server(|_| {}).await;
    let m = "TWFya2VyVmFs"; // base64, unique to this test
    let cases = [
        (json!([1]), "JSON object"),
        (json!({}), "`image` is required"),
        (json!({ "image": null, "sharpen": 1 }), "`image` is required"),
        (json!({ "image": 7 }), "must be a string"),
        (json!({ "image": "http://cdn.example.com/a.png" }), "https://"),
        (json!({ "image": "%%% not base64" }), "base64"),
        (json!({ "image": m, "optimized_for": "make_it_pop" }), "optimized_for"),
        (json!({ "image": m, "sharpen": 100.5 }), "sharpen"),
        (json!({ "image": m, "sharpen": -1 }), "sharpen"),
        (json!({ "image": m, "sharpen": "5" }), "sharpen"),
        (json!({ "image": m, "smart_grain": 101 }), "smart_grain"),
        (json!({ "image": m, "webhook_url": "notaurl" }), "webhook_url"),
        (json!({ "image": m, "webhook_url": "ftp://h.example/cb" }), "webhook_url"),
        (json!({ "image": m, "mode": "creative" }), "Unknown field `mode`"),
    ];
    for (body, says) in cases {
        let (status, answer) = create(&s, Auth::Bearer(TOKEN), &body).await;
        assert_eq!(status, 400, "{body} → {answer}");
        assert_error_shape(&answer);
        assert_eq!(answer["error"], "invalid_request");
        assert!(answer["message"].as_str().unwrap().contains(says), "{body} → {answer}");
    }
    let (status, answer) = send(s.http.post(route(&s, "flexible")).header("content-type", "application/json").body("{\"image\":"), Auth::Bearer(TOKEN)).await;
    assert_eq!((status, answer["error"].as_str()), (400, Some("invalid_request")), "{answer}");
    assert!(p.fake.seen_with(m).is_empty(), "invalid requests never reach the provider");
    // The bounds themselves are valid.
    let (status, answer) =
        create(&s, Auth::Bearer(TOKEN), &json!({ "image": m, "sharpen": 100, "smart_grain": 0, "webhook_url": "https://h.example/cb?x=1" })).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(p.fake.seen_with(m).len(), 1);
}

#[tokio::test]
async fn credentials_are_bearer_or_x_api_key_and_must_be_a_configured_token() {
    let (s, _) = server(|_| {}).await;
    let body = json!({ "image": "QXV0aA==" });
    for auth in [Auth::None, Auth::Bearer("nope"), Auth::Key("nope"), Auth::Bearer("")] {
        let (status, answer) = create(&s, auth, &body).await;
        assert_eq!(status, 401, "{answer}");
        assert_error_shape(&answer);
        assert_eq!(answer["error"], "unauthorized");
    }
    let basic = s.http.post(route(&s, "flexible")).json(&body).header("Authorization", format!("Basic {TOKEN}"));
    assert_eq!(send(basic, Auth::None).await.0, 401);
    assert_eq!(create(&s, Auth::Bearer(TOKEN), &body).await.0, 200);
    assert_eq!(create(&s, Auth::Key(TOKEN_B), &body).await.0, 200);
    // The status route takes the same credentials.
    assert_eq!(send(s.http.get(route(&s, "some-task")), Auth::None).await.0, 401);
    assert_eq!(send(s.http.get(route(&s, "some-task")), Auth::Key("nope")).await.0, 401);
}

#[tokio::test]
async fn a_task_is_created_with_the_provider_key_and_its_status_is_followed() {
    let (s, p) = server(|_| {}).await;
    let image = "U3VjY2Vzcw=="; // "Success"
    let (status, created) = create(&s, Auth::Bearer(TOKEN), &json!({ "image": image, "optimized_for": "transform_to_real" })).await;
    assert_eq!(status, 200, "{created}");
    let task_id = created["data"]["task_id"].as_str().unwrap().to_string();
    assert_eq!(created, json!({ "data": { "task_id": task_id, "status": "CREATED", "generated": [] } }));
    let seen = p.fake.seen_with(image);
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].api_key.as_deref(), Some(fake::PROVIDER_KEY), "the provider sees the operator's key");
    assert_eq!(seen[0].authorization, None, "and never the caller's token");
    assert_eq!(seen[0].body, json!({ "image": image, "optimized_for": "transform_to_real", "sharpen": 0, "smart_grain": 2 }), "defaults filled in");

    let (status, first) = send(s.http.get(route(&s, &task_id)), Auth::Key(TOKEN)).await;
    assert_eq!((status, &first["data"]["status"]), (200, &json!("IN_PROGRESS")), "{first}");
    let (status, done) = send(s.http.get(route(&s, &task_id)), Auth::Bearer(TOKEN_B)).await;
    assert_eq!(status, 200, "{done}");
    assert_eq!(done["data"]["status"], "COMPLETED");
    assert_eq!(done["data"]["generated"], json!([format!("http://127.0.0.1:{}/files/{task_id}.png", p.fake.port)]));

    let (status, missing) = send(s.http.get(route(&s, "00000000-0000-0000-0000-000000000000")), Auth::Bearer(TOKEN)).await;
    assert_eq!(status, 404, "{missing}");
    assert_error_shape(&missing);
    assert_eq!(send(s.http.get(route(&s, "bad%20id")), Auth::Bearer(TOKEN)).await.0, 404);
    assert_eq!(send(s.http.put(route(&s, "flexible")), Auth::Bearer(TOKEN)).await.0, 405);
    assert_eq!(send(s.http.get(format!("{}/proxy/partner/v2/other", s.server.url())), Auth::Bearer(TOKEN)).await.0, 404);
    assert_eq!(send(s.http.get(format!("{}/proxy/nobody/x", s.server.url())), Auth::Bearer(TOKEN)).await.0, 404);
}

#[tokio::test]
async fn provider_errors_timeouts_and_oversized_answers_are_mapped() {
    let (s, _) = server(|_| {}).await;
    let cases = [
        (fake::PAY, 402, Some("Not enough credits")),
        (fake::BAD, 400, Some("Image could not be processed")),
        (fake::FAIL, 502, None),
        (fake::GARBAGE, 502, None),
        (fake::BIG, 502, None),
        (fake::SLOW, 504, None),
    ];
    for (image, expected, message) in cases {
        let (status, answer) = create(&s, Auth::Bearer(TOKEN), &json!({ "image": image })).await;
        assert_eq!(status, expected, "{image} → {answer}");
        assert_error_shape(&answer);
        if let Some(message) = message {
            assert_eq!(answer["message"], message, "the provider's own message is passed on");
        }
        let text = answer.to_string();
        assert!(!text.contains("10.0.0.3") && !text.contains("teapot") && !text.contains("127.0.0.1"), "no internal detail: {text}");
    }
}

#[tokio::test]
async fn an_unconfigured_proxy_answers_503_and_bodies_are_bounded() {
    let s = crate::api::start_default().await;
    let (status, answer) = create(&s, Auth::Bearer(TOKEN), &json!({ "image": "aGk=" })).await;
    assert_eq!(status, 503, "{answer}");
    assert_error_shape(&answer);
    assert!(answer["message"].as_str().unwrap().contains("not configured"), "{answer}");

    let (s, _) = server(|c| c.route_max_body_mb = 1).await;
    let big = json!({ "image": "A".repeat(2 << 20) });
    let (status, answer) = create(&s, Auth::Bearer(TOKEN), &big).await;
    assert_eq!(status, 413, "{answer}");
    assert_error_shape(&answer);
}

/// The workflow with the partner node: a 256×256 image in, the result saved.
fn node_workflow(sharpen: i64) -> Value {
    json!({
        "1": { "class_type": "EmptyImage", "inputs": { "width": 256, "height": 256, "batch_size": 1, "color": 0x336699 } },
        "2": { "class_type": "MagnificImageSkinEnhancerNode", "inputs": {
            "image": ["1", 0], "sharpen": sharpen, "smart_grain": 3, "mode": "flexible", "mode.optimized_for": "improve_lighting" } },
        "3": { "class_type": "SaveImage", "inputs": { "images": ["2", 0], "filename_prefix": "enhanced" } },
    })
}

async fn submit_with_key(s: &TestServer, workflow: Value, key: Option<&str>) -> String {
    let mut body = json!({ "workflow": workflow });
    if let Some(key) = key {
        body["extra_data"] = json!({ "api_key_svc_org": key });
    }
    let (status, job, _) = s.post_job(&body, None).await;
    assert_eq!(status, 201, "{job}");
    job["id"].as_str().unwrap().to_string()
}

/// The saved output of a finished job, decoded: (width, height).
async fn output_size(s: &TestServer, job: &Value) -> (u32, u32) {
    let url = job["outputs"][0]["url"].as_str().unwrap_or_else(|| panic!("an output: {job}"));
    let bytes = s.http.get(url).send().await.unwrap().bytes().await.unwrap();
    let decoder = png::Decoder::new(std::io::Cursor::new(bytes.to_vec()));
    let reader = decoder.read_info().unwrap();
    (reader.info().width, reader.info().height)
}

#[tokio::test]
async fn the_partner_node_runs_on_v2_with_the_key_from_extra_data() {
    let (s, p) = server(|_| {}).await;
    let id = submit_with_key(&s, node_workflow(11), Some(TOKEN)).await;
    let done = s.wait(&id).await;
    assert_eq!(done["status"], "succeeded", "{done}");
    assert_eq!(output_size(&s, &done).await, (200, 180), "the provider's result is the node's output");
    let sent: Vec<_> = p.fake.seen().into_iter().filter(|r| r.method == "POST" && r.body["sharpen"] == 11).collect();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].body["optimized_for"], "improve_lighting");
    assert_eq!(sent[0].body["smart_grain"], 3);
    assert_eq!(sent[0].api_key.as_deref(), Some(fake::PROVIDER_KEY));
    assert!(!format!("{sent:?}").contains(TOKEN), "the caller's key never reaches the provider");
    let png = base64::Engine::decode(&base64::engine::general_purpose::STANDARD, sent[0].body["image"].as_str().unwrap()).unwrap();
    let info = png::Decoder::new(std::io::Cursor::new(png)).read_info().unwrap().info().clone();
    assert_eq!((info.width, info.height), (256, 256), "the input image is sent as base64 PNG");
}

#[tokio::test]
async fn the_partner_node_runs_on_api_prompt_with_the_key_from_extra_data() {
    let (s, _) = server(|_| {}).await;
    let body = json!({ "prompt": node_workflow(12), "extra_data": { "api_key_svc_org": TOKEN_B } });
    let resp = s.http.post(format!("{}/api/prompt", s.server.url())).json(&body).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let id = resp.json::<Value>().await.unwrap()["prompt_id"].as_str().unwrap().to_string();
    let done = s.wait(&id).await;
    assert_eq!(done["status"], "succeeded", "{done}");
    assert_eq!(output_size(&s, &done).await, (200, 180));
}

#[tokio::test]
async fn the_partner_node_names_a_missing_or_refused_key_and_a_failed_task() {
    let (s, p) = server(|_| {}).await;
    let missing = s.wait(&submit_with_key(&s, node_workflow(13), None).await).await;
    assert_eq!(missing["status"], "failed");
    assert!(missing["error"]["message"].as_str().unwrap().contains("api_key_svc_org"), "{missing}");
    let refused = s.wait(&submit_with_key(&s, node_workflow(14), Some("not-a-token")).await).await;
    assert_eq!(refused["status"], "failed");
    assert!(refused["error"]["message"].as_str().unwrap().contains("does not accept the key"), "{refused}");
    assert!(!refused.to_string().contains("not-a-token"), "the key is never echoed");
    assert!(p.fake.seen().iter().all(|r| r.body["sharpen"] != 13 && r.body["sharpen"] != 14), "nothing reached the provider");
    let failed = s.wait(&submit_with_key(&s, node_workflow(fake::SHARPEN_FAILS), Some(TOKEN)).await).await;
    assert_eq!(failed["status"], "failed");
    assert!(failed["error"]["message"].as_str().unwrap().contains("Task failed"), "{failed}");
}

#[tokio::test]
async fn downloads_outside_the_allowlist_are_refused_and_logged() {
    let (s, p) = server(|_| {}).await;
    for sharpen in [fake::SHARPEN_RESULT_ON_LOCALHOST, fake::SHARPEN_RESULT_ON_OTHER_PORT] {
        let done = s.wait(&submit_with_key(&s, node_workflow(sharpen), Some(TOKEN)).await).await;
        assert_eq!(done["status"], "failed", "{done}");
        assert!(done["error"]["message"].as_str().unwrap().contains("Downloading the result failed"), "{done}");
    }
    let logs = String::from_utf8_lossy(&p.logs.lock().unwrap()).to_string();
    let refusals: Vec<&str> = logs.lines().filter(|l| l.contains("outbound request refused") && l.contains("plugin=partner")).collect();
    assert!(
        refusals.iter().any(|l| l.contains("host=\"localhost\"") && l.contains("resolves to the internal address 127.0.0.1")),
        "a name resolving to loopback is refused: {refusals:#?}"
    );
    let other_port = p.fake.port.wrapping_add(1).max(1);
    assert!(
        refusals.iter().any(|l| l.contains(&format!("port={other_port}")) && l.contains("not in the plugin's allowlist")),
        "another host is refused: {refusals:#?}"
    );
    // The fake (which also listens behind `localhost`) served neither result.
    let completed: Vec<_> = p.fake.seen().into_iter().filter(|r| matches!(r.task_sharpen, Some(96 | 95))).collect();
    assert!(!completed.is_empty());
    assert!(p.fake.seen().iter().all(|r| !r.path.starts_with("/files/") || !completed.iter().any(|c| r.path.contains(c.path.rsplit('/').next().unwrap()))));
}

#[tokio::test]
async fn a_provider_402_is_insufficient_funds_on_the_websocket() {
    let (s, _) = server(|_| {}).await;
    let ws_url = format!("{}/ws?clientId=funds", s.server.url().replacen("http://", "ws://", 1));
    let (mut socket, _) = tokio_tungstenite::connect_async(ws_url).await.unwrap();
    let body = json!({ "prompt": node_workflow(fake::SHARPEN_NO_CREDITS), "client_id": "funds", "extra_data": { "api_key_svc_org": TOKEN } });
    let resp = s.http.post(format!("{}/api/prompt", s.server.url())).json(&body).send().await.unwrap();
    let id = resp.json::<Value>().await.unwrap()["prompt_id"].as_str().unwrap().to_string();
    let error = loop {
        let frame = tokio::time::timeout(Duration::from_secs(30), socket.next()).await.expect("a frame").unwrap().unwrap();
        let Ok(text) = frame.into_text() else { continue };
        let Ok(message) = serde_json::from_str::<Value>(&text) else { continue };
        if message["type"] == "execution_error" && message["data"]["prompt_id"] == id.as_str() {
            break message["data"].clone();
        }
    };
    assert_eq!(error["exception_type"], "InsufficientFundsError", "{error}");
    assert_eq!(error["node_type"], "MagnificImageSkinEnhancerNode");
    assert!(error["exception_message"].as_str().unwrap().contains("Not enough credits"), "{error}");
    let job = s.wait(&id).await;
    assert_eq!(job["error"]["code"], "insufficient_funds", "{job}");
}

#[tokio::test]
async fn a_job_cancelled_mid_poll_ends_canceled_and_polls_no_more() {
    let (s, p) = server(|_| {}).await;
    let id = submit_with_key(&s, node_workflow(fake::SHARPEN_NEVER_ENDS), Some(TOKEN)).await;
    let polls = || p.fake.seen().into_iter().filter(|r| r.task_sharpen == Some(fake::SHARPEN_NEVER_ENDS)).count();
    let started = Instant::now();
    while polls() < 2 {
        assert!(started.elapsed() < Duration::from_secs(30), "the node polls");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let resp = s.http.post(s.url(&format!("/jobs/{id}/cancel"))).send().await.unwrap();
    assert!(resp.status().is_success(), "{}", resp.status());
    let cancelled_at = Instant::now();
    let done = s.wait(&id).await;
    assert_eq!(done["status"], "canceled", "{done}");
    // Longer than the node's next wait (its backoff after two polls is 1.1 s).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let late: Vec<_> = p.fake.seen().into_iter().filter(|r| r.task_sharpen == Some(fake::SHARPEN_NEVER_ENDS) && r.at > cancelled_at).collect();
    assert!(late.is_empty(), "status requests after the cancel: {late:#?}");
}

#[tokio::test]
async fn object_info_shows_an_api_node_with_a_dynamic_mode_combo() {
    let (s, _) = server(|_| {}).await;
    let info: Value = s.http.get(format!("{}/object_info/MagnificImageSkinEnhancerNode", s.server.url())).send().await.unwrap().json().await.unwrap();
    let node = &info["MagnificImageSkinEnhancerNode"];
    assert_eq!(node["api_node"], true, "{node}");
    assert_eq!(node["category"], "partner/image/Magnific");
    assert_eq!(node["display_name"], "Magnific Image Skin Enhancer");
    let mode = &node["input"]["required"]["mode"];
    assert_eq!(mode[0], "COMFY_DYNAMICCOMBO_V3", "{mode}");
    let options = mode[1]["options"].as_array().unwrap();
    assert_eq!(options.len(), 1, "flexible only: {mode}");
    assert_eq!(options[0]["key"], "flexible");
    let optimized_for = &options[0]["inputs"]["required"]["optimized_for"][0];
    assert_eq!(optimized_for, &json!(["enhance_skin", "improve_lighting", "enhance_everything", "transform_to_real", "no_make_up"]));
    assert!(node["input"]["required"].get("mode.optimized_for").is_none(), "the sub-input shows under its choice only");
    assert_eq!(node["input_order"]["required"], json!(["image", "sharpen", "smart_grain", "mode"]));
    assert_eq!(node["input"]["required"]["sharpen"], json!(["INT", { "default": 0, "min": 0, "max": 100, "display": "slider" }]));
    assert_eq!(node["output"], json!(["IMAGE"]));
    // Other nodes are not API nodes.
    let empty: Value = s.http.get(format!("{}/object_info/EmptyImage", s.server.url())).send().await.unwrap().json().await.unwrap();
    assert_eq!(empty["EmptyImage"]["api_node"], false);
}

#[tokio::test]
async fn a_route_call_past_its_deadline_is_stopped_with_504() {
    let p = partner().await;
    let data = tempfile::tempdir().unwrap();
    // A runtime of its own: the route deadline is a runtime setting.
    let config = Config { route_timeout_ms: 300, outbound_first_byte_timeout_ms: 10_000, ..partner_config(&p.fake, data.path()) };
    let runtime = Arc::new(PluginRuntime::new(kiln::plugins::RuntimeConfig::from_config(&config).unwrap()).unwrap());
    let registry = Arc::new(NodeRegistry::load_all(&runtime, &[]).await.unwrap());
    let options = ServiceOptions::from_config(&config);
    let server = Server::start_with(config, options, runtime, registry).await.unwrap();
    let base = format!("{}/api/v2", server.url());
    let s = TestServer { server, base, http: reqwest::Client::new(), data };
    let started = Instant::now();
    // The provider answers after 3 s; the call is stopped at 0.3 s.
    let (status, answer) = create(&s, Auth::Bearer(TOKEN), &json!({ "image": fake::SLOW })).await;
    assert_eq!(status, 504, "{answer}");
    assert_eq!(answer["error"], "timeout", "the host's deadline, not the plugin's own mapping: {answer}");
    assert_error_shape(&answer);
    assert!(started.elapsed() < Duration::from_secs(3), "stopped before the provider answered");
}

/// A provider that cannot be reached (nothing listens on its port) is a 502
/// in the error shape, naming neither its address nor the connection error.
#[tokio::test]
async fn an_unreachable_provider_is_502_without_internal_detail() {
    let p = partner().await;
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let data = tempfile::tempdir().unwrap();
    let config = Config { partner_base_url: Some(format!("http://127.0.0.1:{port}")), ..partner_config(&p.fake, data.path()) };
    let runtime = Arc::new(PluginRuntime::new(kiln::plugins::RuntimeConfig::from_config(&config).expect("config")).expect("runtime"));
    let registry = Arc::new(NodeRegistry::load_all(&runtime, &[]).await.expect("bundled plugins load"));
    let options = ServiceOptions::from_config(&config);
    let server = Server::start_with(config, options, runtime, registry).await.expect("server starts");
    let s = TestServer { base: format!("{}/api/v2", server.url()), server, http: reqwest::Client::new(), data };
    let (status, answer) = create(&s, Auth::Bearer(TOKEN), &json!({ "image": "aGk=" })).await;
    assert_eq!(status, 502, "{answer}");
    assert_error_shape(&answer);
    let text = answer.to_string();
    assert!(!text.contains("127.0.0.1") && !text.contains(&port.to_string()) && !text.to_lowercase().contains("refused"), "no internal detail: {text}");
}

/// An API node does not start for an account without funds: the run fails
/// on it as `insufficient_funds` (InsufficientFundsError on the WebSocket)
/// and the provider never hears of it; the check is asked when it starts.
#[tokio::test]
async fn an_api_node_of_an_account_without_funds_is_insufficient_funds() {
    let p = partner().await;
    let executor = kiln::executor::Executor::new(p.runtime.clone(), 16 << 20, 2);
    let out = tempfile::tempdir().unwrap();
    let asked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = asked.clone();
    let mut opts = crate::support::RunOpts::new(out.path());
    opts.funds = Some(Arc::new(move || {
        counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        false
    }));
    let ran = crate::support::run_with(&executor, &p.registry, node_workflow(41), opts).await;
    match &ran.outcome.status {
        kiln::executor::RunStatus::Failed { node, class_type, failure } => {
            assert_eq!((node.as_str(), class_type.as_str()), ("2", "MagnificImageSkinEnhancerNode"));
            assert_eq!(failure.kind, kiln::plugins::FailureKind::InsufficientFunds, "{failure:?}");
        }
        other => panic!("the API node must fail: {other:?}"),
    }
    assert_eq!(asked.load(std::sync::atomic::Ordering::SeqCst), 1, "asked once, for the API node only");
    assert!(p.fake.seen().iter().all(|s| s.body.get("sharpen") != Some(&json!(41))), "the provider never heard of it");
}
