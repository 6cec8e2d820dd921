//! Cloud and serverless modes over real HTTP and WebSockets on
//! loopback: accounts made through the admin API, whose keys open both
//! surfaces; two accounts that cannot see, download, cancel, reference or
//! stream each other's work (every route tried with the other's ids);
//! credits charged when jobs end, held at the minimum price while they have
//! not, and 402 when the balance does not cover one more; the cloud's subscription
//! rule (429 on the compatibility API only); the admin API's gate; the
//! result cache per account; accounts surviving a restart.

use std::time::Duration;

use futures_util::StreamExt;
use kiln::config::Mode;
use reqwest::{Method, RequestBuilder, StatusCode};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

use super::{TestServer, load_save, png_bytes, start, start_default, start_in, trivial};

const OPERATOR: &str = "operator-token-of-the-tests";

fn cloud(c: &mut kiln::config::Config, o: &mut kiln::service::ServiceOptions) {
    c.mode = Mode::Cloud;
    c.admin_token = Some(OPERATOR.into());
    o.mode = Mode::Cloud;
}

async fn start_cloud() -> TestServer {
    start(cloud).await
}

/// An admin API request with `token` as the bearer.
fn admin(s: &TestServer, method: Method, path: &str, token: Option<&str>) -> RequestBuilder {
    let req = s.http.request(method, format!("{}/admin{path}", s.server.url()));
    match token {
        Some(t) => req.bearer_auth(t),
        None => req,
    }
}

async fn json_of(req: RequestBuilder) -> (StatusCode, Value) {
    let resp = req.send().await.unwrap();
    (resp.status(), resp.json().await.unwrap_or(Value::Null))
}

/// One account's client.
struct Tenant<'a> {
    s: &'a TestServer,
    name: String,
    key: String,
}

async fn tenant<'a>(s: &'a TestServer, name: &str, credits: i64) -> Tenant<'a> {
    let (status, body) = json_of(admin(s, Method::POST, "/accounts", Some(OPERATOR)).json(&json!({ "name": name, "credits": credits }))).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["account"]["name"], name);
    let key = body["key"].as_str().unwrap().to_string();
    Tenant { s, name: name.into(), key }
}

impl Tenant<'_> {
    /// A Jobs API request (`Authorization: Bearer`).
    fn v2(&self, method: Method, path: &str) -> RequestBuilder {
        self.s.http.request(method, self.s.url(path)).bearer_auth(&self.key)
    }
    /// A compatibility API request (`X-API-Key`), `path` from the root.
    fn compat(&self, method: Method, path: &str) -> RequestBuilder {
        self.s.http.request(method, format!("{}{path}", self.s.server.url())).header("X-API-Key", &self.key)
    }
    async fn submit(&self, workflow: Value) -> (StatusCode, Value) {
        json_of(self.v2(Method::POST, "/jobs").json(&json!({ "workflow": workflow }))).await
    }
    async fn wait(&self, id: &str) -> Value {
        for _ in 0..600 {
            let (status, job) = json_of(self.v2(Method::GET, &format!("/jobs/{id}"))).await;
            assert_eq!(status, 200, "{job}");
            if ["succeeded", "failed", "canceled", "expired"].contains(&job["status"].as_str().unwrap()) {
                return job;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("job {id} did not finish");
    }
    async fn upload(&self, bytes: Vec<u8>) -> Value {
        let form = reqwest::multipart::Form::new()
            .text("content_type", "image/png")
            .text("file_path", "in.png")
            .part("file", reqwest::multipart::Part::bytes(bytes).file_name("in.png").mime_str("image/png").unwrap());
        let (status, asset) = json_of(self.v2(Method::POST, "/assets").multipart(form)).await;
        assert!(status.is_success(), "{asset}");
        asset
    }
    async fn compat_upload(&self, name: &str, bytes: Vec<u8>) -> Value {
        let form =
            reqwest::multipart::Form::new().part("image", reqwest::multipart::Part::bytes(bytes).file_name(name.to_string()).mime_str("image/png").unwrap());
        let (status, body) = json_of(self.compat(Method::POST, "/api/upload/image").multipart(form)).await;
        assert_eq!(status, 200, "{body}");
        body
    }
    async fn prompt(&self, workflow: Value) -> (StatusCode, Value) {
        json_of(self.compat(Method::POST, "/api/prompt").json(&json!({ "prompt": workflow }))).await
    }
    async fn account(&self) -> Value {
        let (status, body) = json_of(admin(self.s, Method::GET, &format!("/accounts/{}", self.name), Some(OPERATOR))).await;
        assert_eq!(status, 200, "{body}");
        body
    }
    async fn ws(&self) -> Socket {
        let url = format!("{}/ws?clientId=c&token={}", self.s.server.url().replacen("http://", "ws://", 1), self.key);
        tokio_tungstenite::connect_async(url).await.expect("the WebSocket opens").0
    }
}

type Socket = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// The JSON messages a socket receives until it has been quiet for `quiet`.
async fn drain(ws: &mut Socket, quiet: Duration) -> Vec<Value> {
    let mut out = Vec::new();
    while let Ok(Some(Ok(message))) = tokio::time::timeout(quiet, ws.next()).await {
        if let Message::Text(text) = message {
            out.push(serde_json::from_str(&text).unwrap());
        }
    }
    out
}

/// The JSON messages up to `executing {node: null}` of `prompt_id`.
async fn until_done(ws: &mut Socket, prompt_id: &str) -> Vec<Value> {
    let mut out = Vec::new();
    loop {
        let message = tokio::time::timeout(Duration::from_secs(30), ws.next()).await.expect("a frame within 30 s").unwrap().unwrap();
        let Message::Text(text) = message else { continue };
        let value: Value = serde_json::from_str(&text).unwrap();
        let done = value["type"] == "executing" && value["data"]["node"].is_null() && value["data"]["prompt_id"] == prompt_id;
        out.push(value);
        if done {
            return out;
        }
    }
}

/// LoadImage(name) → SaveImage.
fn load_named(name: &str) -> Value {
    json!({
        "1": { "class_type": "LoadImage", "inputs": { "image": name } },
        "2": { "class_type": "SaveImage", "inputs": { "images": ["1", 0], "filename_prefix": "tenant" } },
    })
}

#[tokio::test]
async fn accounts_cannot_reach_each_others_jobs_or_assets_on_v2() {
    let s = start_cloud().await;
    let (a, b) = (tenant(&s, "alice", 1000).await, tenant(&s, "bob", 1000).await);
    let asset = a.upload(png_bytes(8, 8, 1)).await;
    let (status, job) = json_of(a.v2(Method::POST, "/jobs").header("Idempotency-Key", "shared-key").json(&json!({ "workflow": load_save(&asset) }))).await;
    assert_eq!(status, 201, "{job}");
    let ja = job["id"].as_str().unwrap().to_string();
    let done = a.wait(&ja).await;
    assert_eq!(done["status"], "succeeded", "{done}");
    let output = done["outputs"][0]["id"].as_str().unwrap().to_string();
    let (aid, hash) = (asset["id"].as_str().unwrap().to_string(), asset["hash"].as_str().unwrap().to_string());

    // Alice reaches all of it (the control) ...
    for path in [format!("/jobs/{ja}"), format!("/jobs/{ja}/workflow"), format!("/assets/{aid}"), format!("/assets/{output}"), format!("/assets/{aid}/content")]
    {
        let status = a.v2(Method::GET, &path).send().await.unwrap().status();
        assert_eq!(status, 200, "alice: {path}");
    }
    // Hosted outputs: a short-lived signed URL that needs no credentials,
    // bound to its asset; the content route answers 302 to a fresh one.
    let url = done["outputs"][0]["url"].as_str().unwrap().to_string();
    assert!(url.contains("/signed/assets/") && url.contains(&output), "{url}");
    let expires = chrono::DateTime::parse_from_rfc3339(done["outputs"][0]["url_expires_at"].as_str().unwrap()).unwrap().timestamp();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    assert!((now + 3500..=now + 3700).contains(&expires), "url_expires_at is the signature's: {expires} vs now {now}");
    let anonymous = reqwest::Client::new();
    let got = anonymous.get(&url).send().await.unwrap();
    assert_eq!(got.status(), 200, "no credentials needed");
    assert_eq!(&got.bytes().await.unwrap()[..4], b"\x89PNG");
    let moved = url.replace(&output, &aid);
    assert_eq!(anonymous.get(&moved).send().await.unwrap().status(), 403, "a signature moved to another asset serves nothing");
    let bare = url.split('?').next().unwrap().to_string();
    assert_eq!(anonymous.get(&bare).send().await.unwrap().status(), 403, "nor one without its query");
    let no_follow = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let redirect = no_follow.get(s.url(&format!("/assets/{output}/content"))).bearer_auth(&a.key).send().await.unwrap();
    assert_eq!(redirect.status(), 302);
    assert!(redirect.headers()["location"].to_str().unwrap().contains("/signed/assets/"));
    // ... Bob none of it: the answer is the one a made-up id gets.
    let nobody = uuid::Uuid::new_v4().to_string();
    let (_, unknown) = json_of(b.v2(Method::GET, &format!("/jobs/{nobody}"))).await;
    assert_eq!(unknown["error"]["code"], "not_found");
    let theirs = [
        (Method::GET, format!("/jobs/{ja}")),
        (Method::GET, format!("/jobs/{ja}/workflow")),
        (Method::POST, format!("/jobs/{ja}/cancel")),
        (Method::GET, format!("/jobs/{ja}/events")),
        (Method::GET, format!("/assets/{aid}")),
        (Method::GET, format!("/assets/{aid}/content")),
        (Method::DELETE, format!("/assets/{aid}")),
        (Method::GET, format!("/assets/{output}")),
        (Method::GET, format!("/assets/{output}/content")),
        (Method::DELETE, format!("/assets/{output}")),
    ];
    for (method, path) in theirs {
        let (status, body) = json_of(b.v2(method.clone(), &path)).await;
        assert_eq!(status, 404, "bob: {method} {path}: {body}");
        assert_eq!(body, unknown, "bob: {method} {path} must look like an unknown id");
    }
    let head = b.v2(Method::HEAD, &format!("/assets/by-hash/{hash}")).send().await.unwrap().status();
    assert_eq!(head, 404, "another account's bytes are not 'known' to bob");
    assert_eq!(a.v2(Method::HEAD, &format!("/assets/by-hash/{hash}")).send().await.unwrap().status(), 200);
    let (status, body) = json_of(b.v2(Method::POST, "/assets/from-hash").json(&json!({ "hash": hash }))).await;
    assert_eq!((status.as_u16(), body["error"]["code"].as_str()), (404, Some("blob_not_found")), "{body}");
    let (_, listed) = json_of(b.v2(Method::GET, "/jobs")).await;
    assert!(!listed.to_string().contains(&ja), "bob's listing shows alice's job: {listed}");
    // Referencing her asset is a missing asset.
    let (status, body) = b.submit(load_save(&asset)).await;
    assert_eq!((status.as_u16(), body["error"]["code"].as_str()), (422, Some("missing_asset")), "{body}");
    // Idempotency keys are per account: the key alice used is free for bob.
    let (status, body) = json_of(b.v2(Method::POST, "/jobs").header("Idempotency-Key", "shared-key").json(&json!({ "workflow": trivial(1) }))).await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = json_of(a.v2(Method::POST, "/jobs").header("Idempotency-Key", "shared-key").json(&json!({ "workflow": trivial(1) }))).await;
    assert_eq!((status.as_u16(), body["error"]["code"].as_str()), (422, Some("idempotency_key_reuse")), "{body}");
    // Alice's job is untouched by bob's cancel and delete attempts.
    assert_eq!(a.wait(&ja).await["status"], "succeeded");
    assert_eq!(a.v2(Method::GET, &format!("/assets/{aid}")).send().await.unwrap().status(), 200);

    // Keys: none or a wrong one is 401; the same key opens the compat API.
    let (status, body) = json_of(s.http.get(s.url("/jobs"))).await;
    assert_eq!((status.as_u16(), body["error"]["code"].as_str()), (401, Some("unauthorized")), "{body}");
    let (status, _) = json_of(s.http.get(s.url("/jobs")).bearer_auth("kiln_not-a-key")).await;
    assert_eq!(status, 401);
    assert_eq!(s.http.get(s.url("/health")).send().await.unwrap().status(), 200, "health stays public");
    assert_eq!(a.compat(Method::GET, &format!("/api/job/{ja}/status")).send().await.unwrap().status(), 200);
    s.shutdown().await;
}

#[tokio::test]
async fn accounts_cannot_reach_each_others_work_on_the_compat_api_or_websocket() {
    let s = start_cloud().await;
    let (a, b) = (tenant(&s, "alice", 1000).await, tenant(&s, "bob", 1000).await);
    let (mut wa, mut wb) = (a.ws().await, b.ws().await);
    // Each socket opens with its own (empty) queue.
    let first = drain(&mut wb, Duration::from_millis(300)).await;
    assert_eq!(first[0]["data"]["status"]["exec_info"]["queue_remaining"], 0, "{first:?}");
    drain(&mut wa, Duration::from_millis(100)).await;

    // The same upload name is each account's own: no renaming, no sharing.
    assert_eq!(a.compat_upload("same.png", png_bytes(8, 8, 1)).await["name"], "same.png");
    assert_eq!(b.compat_upload("same.png", png_bytes(8, 8, 2)).await["name"], "same.png", "bob's name is not taken by alice's file");
    let (status, body) = a.prompt(load_named("same.png")).await;
    assert_eq!(status, 200, "{body}");
    let pa = body["prompt_id"].as_str().unwrap().to_string();
    let messages = until_done(&mut wa, &pa).await;
    let saved = messages.iter().find(|m| m["type"] == "executed").expect("alice hears her output")["data"]["output"]["images"][0].clone();
    let filename = saved["filename"].as_str().unwrap().to_string();
    // Alice's job read alice's bytes (seed 1), not bob's.
    let view = |t: &Tenant, query: String| t.compat(Method::GET, &format!("/api/view?{query}"));
    let no_redirect = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let resp = no_redirect.execute(view(&a, format!("filename={filename}&type=output")).build().unwrap()).await.unwrap();
    assert_eq!(resp.status(), 302, "alice views her output");
    let resp = no_redirect.execute(view(&b, format!("filename={filename}&type=output")).build().unwrap()).await.unwrap();
    assert_eq!(resp.status(), 404, "bob cannot view alice's output");
    let fetch_input = |t: &Tenant| view(t, "filename=same.png&type=input".into()).send();
    let (ia, ib) = (fetch_input(&a).await.unwrap().bytes().await.unwrap(), fetch_input(&b).await.unwrap().bytes().await.unwrap());
    assert_eq!((ia.to_vec(), ib.to_vec()), (png_bytes(8, 8, 1), png_bytes(8, 8, 2)), "each sees its own same.png");

    // Bob's view of alice's prompt: nothing, on every route.
    let (_, history) = json_of(b.compat(Method::GET, &format!("/api/history/{pa}"))).await;
    assert_eq!(history, json!({}));
    for path in ["/api/history", "/history", "/api/queue", "/api/jobs"] {
        let (status, body) = json_of(b.compat(Method::GET, path)).await;
        assert_eq!(status, 200, "{path}");
        assert!(!body.to_string().contains(&pa), "bob's {path} shows alice's prompt: {body}");
    }
    let (_, own_history) = json_of(a.compat(Method::GET, &format!("/api/history/{pa}"))).await;
    assert!(own_history.get(&pa).is_some(), "alice's history has it (control)");
    for path in [format!("/api/job/{pa}/status"), format!("/api/jobs/{pa}")] {
        assert_eq!(b.compat(Method::GET, &path).send().await.unwrap().status(), 404, "{path}");
    }
    // Cancels and deletes of alice's running job by bob do nothing.
    let (status, body) = a.submit(super::spinner(1)).await;
    assert_eq!(status, 201, "{body}");
    let running = body["id"].as_str().unwrap().to_string();
    for _ in 0..200 {
        let (_, j) = json_of(a.v2(Method::GET, &format!("/jobs/{running}"))).await;
        if j["status"] == "running" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    b.compat(Method::POST, "/api/queue").json(&json!({ "delete": [running] })).send().await.unwrap();
    b.compat(Method::POST, "/api/interrupt").send().await.unwrap();
    let (_, cancelled) = json_of(b.compat(Method::POST, &format!("/api/jobs/{running}/cancel"))).await;
    assert_eq!(cancelled["cancelled"], false);
    b.compat(Method::POST, "/api/history").json(&json!({ "clear": true })).send().await.unwrap();
    let finished = a.wait(&running).await;
    assert_eq!(finished["status"], "failed", "the spinner ran to its time limit, not cancelled: {finished}");
    assert_eq!(finished["error"]["code"], "node_timeout", "{finished}");
    let (_, still) = json_of(a.compat(Method::GET, &format!("/api/history/{pa}"))).await;
    assert!(still.get(&pa).is_some(), "bob's history clear left alice's history alone");

    // Bob's socket heard nothing of alice's jobs: no message names them,
    // and no queue count moved.
    let heard = drain(&mut wb, Duration::from_millis(500)).await;
    assert!(heard.is_empty(), "bob's socket heard alice's work: {heard:?}");
    // (Control: bob's socket hears bob's own job.)
    let (status, body) = b.prompt(load_named("same.png")).await;
    assert_eq!(status, 200, "{body}");
    let pb = body["prompt_id"].as_str().unwrap().to_string();
    let mine = until_done(&mut wb, &pb).await;
    assert!(mine.iter().any(|m| m["type"] == "execution_success"), "{mine:?}");
    assert!(mine.iter().all(|m| m["data"]["prompt_id"].as_str().is_none_or(|p| p == pb)), "{mine:?}");
    assert!(mine.iter().filter(|m| m["type"] == "status").all(|m| m["data"]["status"]["exec_info"]["queue_remaining"].as_u64() <= Some(1)), "{mine:?}");

    // Keys on the compat API: none → 401; `?token=` works like X-API-Key;
    // a bad WebSocket token is refused at the handshake.
    assert_eq!(s.http.get(format!("{}/api/queue", s.server.url())).send().await.unwrap().status(), 401);
    let with_query = s.http.get(format!("{}/api/queue?token={}", s.server.url(), a.key)).send().await.unwrap();
    assert_eq!(with_query.status(), 200);
    let bad = format!("{}/ws?token=kiln_nope", s.server.url().replacen("http://", "ws://", 1));
    assert!(tokio_tungstenite::connect_async(bad).await.is_err());
    s.shutdown().await;
}

#[tokio::test]
async fn the_result_cache_is_per_account() {
    let s = start_cloud().await;
    let (a, b) = (tenant(&s, "alice", 1000).await, tenant(&s, "bob", 1000).await);
    let (mut wa, mut wb) = (a.ws().await, b.ws().await);
    let cached = |messages: &[Value]| messages.iter().find(|m| m["type"] == "execution_cached").map(|m| m["data"]["nodes"].as_array().unwrap().len()).unwrap();
    let workflow = trivial(42);
    let (_, first) = a.prompt(workflow.clone()).await;
    let m = until_done(&mut wa, first["prompt_id"].as_str().unwrap()).await;
    assert_eq!(cached(&m), 0);
    let (_, again) = a.prompt(workflow.clone()).await;
    let m = until_done(&mut wa, again["prompt_id"].as_str().unwrap()).await;
    assert_eq!(cached(&m), 2, "alice's second run is served from her cache (control): {m:?}");
    let (_, other) = b.prompt(workflow).await;
    let m = until_done(&mut wb, other["prompt_id"].as_str().unwrap()).await;
    assert_eq!(cached(&m), 0, "bob's run is never served alice's results: {m:?}");
    s.shutdown().await;
}

#[tokio::test]
async fn jobs_are_charged_and_an_empty_balance_is_402_on_both_surfaces() {
    let s = start(|c, o| {
        cloud(c, o);
        o.pricing = kiln::accounts::Pricing { credits_per_second: 1000, min_per_job: 5 };
    })
    .await;
    let t = tenant(&s, "payer", 7).await;
    let (status, job) = t.submit(trivial(1)).await;
    assert_eq!(status, 201, "{job}");
    let done = t.wait(job["id"].as_str().unwrap()).await;
    let ms = done["metrics"]["execution_ms"].as_i64().unwrap();
    // A job costs its execution time at 1000 credits/s, at least 5.
    let cost = ms.max(5);
    let balance = 7 - cost;
    for _ in 0..100 {
        if t.account().await["credits"] == balance {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(t.account().await["credits"], balance, "charged {cost} for {ms} ms");
    // At most 2 left, below the minimum price: 402 on v2 (the
    // Idempotency-Key stays free) and on the compat API.
    assert!(balance < 5);
    let keyed = || t.v2(Method::POST, "/jobs").header("Idempotency-Key", "after-top-up").json(&json!({ "workflow": trivial(3) }));
    let (status, body) = json_of(keyed()).await;
    assert_eq!((status.as_u16(), body["error"]["code"].as_str()), (402, Some("insufficient_credits")), "{body}");
    let (status, body) = t.prompt(trivial(3)).await;
    assert_eq!(status, 402, "{body}");
    // Topped up to 100 (the last job may have overdrawn by more than a
    // small top-up covers): the same key goes through.
    let (status, body) = json_of(admin(&s, Method::POST, "/accounts/payer/credits", Some(OPERATOR)).json(&json!({ "amount": 100 - balance }))).await;
    assert_eq!((status.as_u16(), body["credits"].as_i64()), (200, Some(100)), "{body}");
    let (status, body) = json_of(keyed()).await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = t.prompt(trivial(4)).await;
    assert_eq!(status, 200, "{body}");
    s.shutdown().await;
}

#[tokio::test]
async fn an_inactive_subscription_stops_the_cloud_compat_api_only() {
    let s = start_cloud().await;
    let t = tenant(&s, "lapsed", 1000).await;
    let (status, body) = json_of(admin(&s, Method::POST, "/accounts/lapsed/subscription", Some(OPERATOR)).json(&json!({ "active": false }))).await;
    assert_eq!((status.as_u16(), body["subscription"].as_str()), (200, Some("inactive")), "{body}");
    let mut ws = t.ws().await;
    drain(&mut ws, Duration::from_millis(200)).await;
    let id = uuid::Uuid::new_v4().to_string();
    let (status, body) = json_of(t.compat(Method::POST, "/api/prompt").json(&json!({ "prompt": trivial(1), "prompt_id": id }))).await;
    assert_eq!(status, 429, "{body}");
    let heard = drain(&mut ws, Duration::from_millis(500)).await;
    let error = heard.iter().find(|m| m["type"] == "execution_error").unwrap_or_else(|| panic!("{heard:?}"));
    assert_eq!(error["data"]["exception_type"], "InactiveSubscriptionError");
    assert_eq!(error["data"]["prompt_id"], id.as_str());
    // /api/v2 is unaffected; reading the compat API too.
    let (status, job) = t.submit(trivial(1)).await;
    assert_eq!(status, 201, "{job}");
    assert_eq!(t.compat(Method::GET, "/api/queue").send().await.unwrap().status(), 200);
    // Active again: the compat API runs workflows.
    admin(&s, Method::POST, "/accounts/lapsed/subscription", Some(OPERATOR)).json(&json!({ "active": true })).send().await.unwrap();
    let (status, body) = t.prompt(trivial(2)).await;
    assert_eq!(status, 200, "{body}");
    s.shutdown().await;
}

#[tokio::test]
async fn the_admin_api_is_the_operators_only_and_accounts_survive_a_restart() {
    // No operator token: no admin API at all.
    let plain = start_default().await;
    assert_eq!(admin(&plain, Method::GET, "/accounts", Some("anything")).send().await.unwrap().status(), 404);
    plain.shutdown().await;

    let s = start_cloud().await;
    let t = tenant(&s, "member", 10).await;
    for (token, status) in [(None, 401), (Some("wrong"), 401), (Some(t.key.as_str()), 403), (Some(OPERATOR), 200)] {
        let (got, body) = json_of(admin(&s, Method::GET, "/accounts", token)).await;
        assert_eq!(got, status, "{token:?}: {body}");
        if status == 403 {
            assert_eq!(body["error"]["code"], "forbidden");
        }
    }
    let (status, _) = json_of(admin(&s, Method::GET, "/accounts", None).header("X-API-Key", &t.key)).await;
    assert_eq!(status, 403, "an account key as X-API-Key is refused as forbidden too");
    let (status, body) = json_of(admin(&s, Method::POST, "/accounts", Some(OPERATOR)).json(&json!({ "name": "member" }))).await;
    assert_eq!(status, 409, "{body}");
    let (status, body) = json_of(admin(&s, Method::POST, "/accounts", Some(OPERATOR)).json(&json!({ "name": "../x" }))).await;
    assert_eq!(status, 400, "{body}");
    let (_, listed) = json_of(admin(&s, Method::GET, "/accounts", Some(OPERATOR))).await;
    assert!(!listed.to_string().contains(&t.key), "keys are never listed");
    let (status, job) = t.submit(trivial(1)).await;
    assert_eq!(status, 201);
    let id = job["id"].as_str().unwrap().to_string();
    t.wait(&id).await;

    // A restart keeps the account, its key, its balance and its jobs. (The
    // job is charged just after it shows finished: read the balance once
    // the charge has landed.)
    let mut before = t.account().await;
    for _ in 0..250 {
        if before["credits"] != 10 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        before = t.account().await;
    }
    assert_eq!(before["credits"], 9, "the job was charged: {before}");
    let key = t.key.clone();
    let data = s.shutdown().await;
    let s = start_in(data, cloud).await;
    let t = Tenant { s: &s, name: "member".into(), key };
    assert_eq!(t.account().await, before);
    assert_eq!(t.v2(Method::GET, &format!("/jobs/{id}")).send().await.unwrap().status(), 200);

    // Disabled: its key is forbidden everywhere.
    let (status, body) = json_of(admin(&s, Method::POST, "/accounts/member/disable", Some(OPERATOR))).await;
    assert_eq!((status.as_u16(), body["disabled"].as_bool()), (200, Some(true)));
    let (status, body) = json_of(t.v2(Method::GET, "/jobs")).await;
    assert_eq!((status.as_u16(), body["error"]["code"].as_str()), (403, Some("forbidden")), "{body}");
    assert_eq!(t.compat(Method::GET, "/api/queue").send().await.unwrap().status(), 403);
    let url = format!("{}/ws?token={}", s.server.url().replacen("http://", "ws://", 1), t.key);
    assert!(tokio_tungstenite::connect_async(url).await.is_err());
    s.shutdown().await;
}

#[tokio::test]
async fn a_job_queued_when_the_balance_ran_out_fails_uncharged() {
    let s = start(|c, o| {
        cloud(c, o);
        (c.max_running_jobs, o.max_running_jobs) = (1, 1);
        o.pricing = kiln::accounts::Pricing { credits_per_second: 10, min_per_job: 5 };
    })
    .await;
    let t = tenant(&s, "thin", 10).await;
    // The spinner runs to its 2 s node limit; the second job waits behind
    // it. Each holds the minimum of 5, so a third is refused.
    let (status, first) = t.submit(super::spinner(7)).await;
    assert_eq!(status, 201, "{first}");
    let (status, second) = t.submit(trivial(7)).await;
    assert_eq!(status, 201, "10 credits cover two jobs at the minimum: {second}");
    let (status, third) = t.submit(trivial(8)).await;
    assert_eq!((status.as_u16(), third["error"]["code"].as_str()), (402, Some("insufficient_credits")), "{third}");
    let first = t.wait(first["id"].as_str().unwrap()).await;
    assert_eq!(first["error"]["code"], "node_timeout", "{first}");
    // Its time costs more than the minimum (2 s at 10 a second): the
    // balance goes below zero, and the waiting job does not run.
    let cost = (first["metrics"]["execution_ms"].as_u64().unwrap() * 10).div_ceil(1000).max(5) as i64;
    assert!(cost > 10, "{first}");
    let second = t.wait(second["id"].as_str().unwrap()).await;
    assert_eq!((second["status"].as_str(), second["error"]["code"].as_str()), (Some("failed"), Some("insufficient_credits")), "{second}");
    assert!(second["outputs"].as_array().unwrap().is_empty());
    tokio::time::sleep(Duration::from_millis(50)).await;
    // Only the job that ran was charged.
    assert_eq!(t.account().await["credits"], 10 - cost);
    s.shutdown().await;
}

/// Submissions racing on both surfaces while another account's job holds
/// the only worker: each admitted job holds the minimum price until it is
/// charged, so a balance of 10 at 5 a job admits exactly two of twelve,
/// and ends at zero, never below.
#[tokio::test]
async fn concurrent_submissions_never_promise_more_than_the_balance() {
    let s = start(|c, o| {
        cloud(c, o);
        (c.max_running_jobs, o.max_running_jobs) = (1, 1);
        o.pricing = kiln::accounts::Pricing { credits_per_second: 1, min_per_job: 5 };
    })
    .await;
    let (blocker, t) = (tenant(&s, "blocker", 1000).await, tenant(&s, "racer", 10).await);
    let (status, spinning) = blocker.submit(super::spinner(9)).await;
    assert_eq!(status, 201, "{spinning}");
    let racing = (0..12).map(|n| {
        let t = &t;
        async move {
            let (status, body) = if n % 2 == 0 { t.submit(trivial(100 + n)).await } else { t.prompt(trivial(100 + n)).await };
            let id = body.get("id").or_else(|| body.get("prompt_id")).and_then(Value::as_str).map(str::to_string);
            (status.as_u16(), body, id)
        }
    });
    let answers = futures_util::future::join_all(racing).await;
    let admitted: Vec<String> = answers.iter().filter_map(|(_, _, id)| id.clone()).collect();
    assert_eq!(admitted.len(), 2, "{answers:?}");
    for (status, body, id) in &answers {
        assert!(id.is_some() || (*status == 402 && body["error"]["code"] == "insufficient_credits"), "{status} {body}");
    }
    for id in &admitted {
        assert_eq!(t.wait(id).await["status"], "succeeded");
    }
    for _ in 0..100 {
        if t.account().await["credits"] == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(t.account().await["credits"], 0, "two charges of 5");
    let (status, body) = t.submit(trivial(1)).await;
    assert_eq!((status.as_u16(), body["error"]["code"].as_str()), (402, Some("insufficient_credits")), "{body}");
    s.shutdown().await;
}

#[tokio::test]
async fn serverless_mode_has_accounts_but_no_subscription_rule() {
    let s = start(|c, o| {
        (c.mode, o.mode) = (Mode::Serverless, Mode::Serverless);
        c.admin_token = Some(OPERATOR.into());
    })
    .await;
    let t = tenant(&s, "fn-owner", 100).await;
    assert_eq!(s.http.get(s.url("/jobs")).send().await.unwrap().status(), 401, "keys are required");
    admin(&s, Method::POST, "/accounts/fn-owner/subscription", Some(OPERATOR)).json(&json!({ "active": false })).send().await.unwrap();
    let (status, body) = t.prompt(trivial(5)).await;
    assert_eq!(status, 200, "only the hosted cloud requires a subscription: {body}");
    let done = t.wait(body["prompt_id"].as_str().unwrap()).await;
    assert_eq!(done["status"], "succeeded");
    s.shutdown().await;
}

/// Serverless deployments owned by accounts: the owner is named by its
/// account (an unknown one is 400), only the owner's key opens its
/// deployment (another account's is 403, none 401), and a public demo's
/// anonymous jobs are billed to the owning account.
#[tokio::test]
async fn deployments_belong_to_accounts_and_a_public_demo_bills_its_owner() {
    let s = start(|c, o| {
        (c.mode, o.mode) = (Mode::Serverless, Mode::Serverless);
        c.admin_token = Some(OPERATOR.into());
    })
    .await;
    let alice = tenant(&s, "dep-alice", 1000).await;
    let bob = tenant(&s, "dep-bob", 1000).await;
    let alice_id = alice.account().await["id"].as_str().unwrap().to_string();
    let create = |body: Value| json_of(admin(&s, Method::POST, "/deployments", Some(OPERATOR)).json(&body));
    let (status, body) = create(json!({ "id": "nobodys", "owner": "no-such-account" })).await;
    assert_eq!(status, 400, "{body}");
    let (status, body) = create(json!({ "id": "alice-fn", "owner": "dep-alice" })).await;
    assert_eq!((status, body["spec"]["owner"].as_str().or(body["owner"].as_str())), (StatusCode::CREATED, Some(alice_id.as_str())), "{body}");
    let (status, body) = create(json!({ "id": "alice-demo", "owner": alice_id, "public_demo": true })).await;
    assert_eq!(status, 201, "{body}");
    for id in ["alice-fn", "alice-demo"] {
        let mut ready = false;
        for _ in 0..1200 {
            let (_, rec) = json_of(admin(&s, Method::GET, &format!("/deployments/{id}"), Some(OPERATOR))).await;
            if rec["state"] == "ready" {
                ready = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        assert!(ready, "deployment {id} never became ready");
    }
    let jobs = |id: &str| format!("{}/deployment/{id}/api/v2/jobs", s.server.url());
    let submit = json!({ "workflow": trivial(4) });
    let anonymous = s.http.post(jobs("alice-fn")).json(&submit).send().await.unwrap();
    assert_eq!(anonymous.status(), 401);
    // An unknown id answers as a known one without a key: ids cannot be
    // probed; with a key it is 404.
    let probe = s.http.post(jobs("no-such-fn")).json(&submit).send().await.unwrap();
    assert_eq!(probe.status(), 401);
    let probe = s.http.get(jobs("no-such-fn")).bearer_auth("kiln_wrong").send().await.unwrap();
    assert_eq!(probe.status(), 401);
    let known = s.http.get(jobs("no-such-fn")).bearer_auth(&bob.key).send().await.unwrap();
    assert_eq!(known.status(), 404);
    let by_bob = s.http.post(jobs("alice-fn")).bearer_auth(&bob.key).json(&submit).send().await.unwrap();
    assert_eq!(by_bob.status(), 403);
    assert_eq!(by_bob.json::<Value>().await.unwrap()["error"]["code"], "forbidden");
    let (status, job) = json_of(s.http.post(jobs("alice-fn")).bearer_auth(&alice.key).json(&submit)).await;
    assert_eq!(status, 201, "{job}");
    let url = format!("{}{}", s.server.url(), job["urls"]["self"].as_str().unwrap());
    assert!(url.contains("/deployment/alice-fn/api/v2/jobs/"), "{url}");
    let mut done = Value::Null;
    for _ in 0..600 {
        done = json_of(s.http.get(&url).bearer_auth(&alice.key)).await.1;
        if done["status"] == "succeeded" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(done["status"], "succeeded", "{done}");
    assert!(done.get("logs").is_some_and(Value::is_object), "a serverless deployment's job shows its logs: {done}");
    assert_eq!(json_of(s.http.get(&url).bearer_auth(&bob.key)).await.0, 403, "bob cannot read alice's deployment");
    // The demo: no key, billed to alice.
    let before = alice.account().await["credits"].as_i64().unwrap();
    let (status, job) = json_of(s.http.post(jobs("alice-demo")).json(&submit)).await;
    assert_eq!(status, 201, "{job}");
    let url = format!("{}{}", s.server.url(), job["urls"]["self"].as_str().unwrap());
    for _ in 0..600 {
        done = json_of(s.http.get(&url)).await.1;
        if done["status"] == "succeeded" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(done["status"], "succeeded", "{done}");
    assert!(done.get("logs").is_none(), "a public demo withholds logs: {done}");
    let mut after = before;
    for _ in 0..200 {
        after = alice.account().await["credits"].as_i64().unwrap();
        if after < before {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(after < before, "the demo's job is charged to its owner: {before} → {after}");
    assert_eq!(bob.account().await["credits"], 1000, "nobody else pays");
    // A disabled owner is billed for no more demo jobs.
    let (status, _) = json_of(admin(&s, Method::POST, "/accounts/dep-alice/disable", Some(OPERATOR))).await;
    assert_eq!(status, 200);
    let (status, body) = json_of(s.http.post(jobs("alice-demo")).json(&submit)).await;
    assert_eq!((status, body["error"]["code"].as_str()), (StatusCode::FORBIDDEN, Some("forbidden")), "{body}");
    s.shutdown().await;
}

/// Tiers come from each account's record: an account in a small tier runs
/// one job at a time (more queue) and may have two waiting (more are 429
/// `queue_full`), while another account's jobs start beside its flood.
#[tokio::test]
async fn an_accounts_tier_bounds_its_running_and_queued_jobs_and_never_starves_another() {
    let s = start(|c, o| {
        cloud(c, o);
        (c.max_running_jobs, o.max_running_jobs) = (2, 2);
        o.tiers.tiers.insert("small".into(), kiln::service::fair::OwnerLimits { max_running: 1, max_queued: 2 });
    })
    .await;
    let body = json!({ "name": "tier-small", "credits": 1_000_000, "tier": "small" });
    let (status, created) = json_of(admin(&s, Method::POST, "/accounts", Some(OPERATOR)).json(&body)).await;
    assert_eq!((status, created["account"]["tier"].as_str()), (StatusCode::CREATED, Some("small")), "{created}");
    let small = Tenant { s: &s, name: "tier-small".into(), key: created["key"].as_str().unwrap().into() };
    let other = tenant(&s, "tier-default", 1_000_000).await;

    let (status, spinning) = small.submit(super::spinner(1)).await;
    assert_eq!(status, 201, "{spinning}");
    let spinning = spinning["id"].as_str().unwrap().to_string();
    for _ in 0..400 {
        if json_of(small.v2(Method::GET, &format!("/jobs/{spinning}"))).await.1["status"] == "running" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let mut waiting = Vec::new();
    for n in 0..2 {
        let (status, job) = small.submit(trivial(n)).await;
        assert_eq!((status, job["status"].as_str()), (StatusCode::CREATED, Some("queued")), "{job}");
        waiting.push(job["id"].as_str().unwrap().to_string());
    }
    let (status, refused) = small.submit(trivial(9)).await;
    assert_eq!((status, refused["error"]["code"].as_str()), (StatusCode::TOO_MANY_REQUESTS, Some("queue_full")), "{refused}");

    // The other account runs beside the flood, while the small tier's
    // queued jobs still wait for its one running slot.
    let (status, job) = other.submit(trivial(5)).await;
    assert_eq!(status, 201, "{job}");
    let done = other.wait(job["id"].as_str().unwrap()).await;
    assert_eq!(done["status"], "succeeded", "{done}");
    for id in &waiting {
        assert_eq!(json_of(small.v2(Method::GET, &format!("/jobs/{id}"))).await.1["status"], "queued");
    }
    // Released, the small tier's jobs run one at a time.
    let (status, _) = json_of(small.v2(Method::POST, &format!("/jobs/{spinning}/cancel"))).await;
    assert_eq!(status, 200);
    let first = small.wait(&waiting[0]).await;
    let second = small.wait(&waiting[1]).await;
    assert_eq!((first["status"].as_str(), second["status"].as_str()), (Some("succeeded"), Some("succeeded")));
    // RFC 3339 with a fixed microsecond width and one zone: they order as strings.
    let at = |job: &Value, field: &str| job[field].as_str().unwrap().to_string();
    assert!(at(&second, "started_at") >= at(&first, "completed_at"), "never two at once: {first} {second}");
    s.shutdown().await;
}

/// Waits until `t`'s job `id` runs.
async fn until_running(t: &Tenant<'_>, id: &str) {
    for _ in 0..400 {
        if json_of(t.v2(Method::GET, &format!("/jobs/{id}"))).await.1["status"] == "running" {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("job {id} never ran");
}

/// Opens an SSE stream of `t`'s job `id`: its status and the response.
async fn sse(t: &Tenant<'_>, id: &str) -> (StatusCode, reqwest::Response) {
    let resp = t.v2(Method::GET, &format!("/jobs/{id}/events")).send().await.unwrap();
    (resp.status(), resp)
}

/// A WebSocket of `t`: opened, or the handshake's refusal status.
async fn ws_or_status(t: &Tenant<'_>) -> Result<Socket, StatusCode> {
    let url = format!("{}/ws?token={}", t.s.server.url().replacen("http://", "ws://", 1), t.key);
    match tokio_tungstenite::connect_async(url).await {
        Ok((socket, _)) => Ok(socket),
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => Err(StatusCode::from_u16(resp.status().as_u16()).unwrap()),
        Err(e) => panic!("{e}"),
    }
}

#[tokio::test]
async fn one_account_cannot_take_the_whole_queue_or_stream_pool() {
    let s = start(|c, o| {
        cloud(c, o);
        (c.max_running_jobs, o.max_running_jobs) = (1, 1);
        // No tier: the server-wide bounds and a per-account share of each.
        (o.max_queued_jobs, o.max_queued_per_account) = (5, 3);
        (o.max_event_streams, o.max_streams_per_account) = (5, 3);
    })
    .await;
    let (a, b) = (tenant(&s, "greedy", 1000).await, tenant(&s, "polite", 1000).await);
    let (_, spinning) = a.submit(super::spinner(11)).await;
    let spinning = spinning["id"].as_str().unwrap().to_string();
    until_running(&a, &spinning).await;
    // The queue: greedy gets its share (3 of 5) and no more.
    let mut queued = Vec::new();
    for n in 0..3 {
        let (status, job) = a.submit(trivial(n)).await;
        assert_eq!(status, 201, "{job}");
        queued.push(job["id"].as_str().unwrap().to_string());
    }
    let (status, refused) = a.submit(trivial(3)).await;
    assert_eq!((status, refused["error"]["code"].as_str()), (StatusCode::TOO_MANY_REQUESTS, Some("queue_full")), "{refused}");
    let mut polite = Vec::new();
    for n in 0..2 {
        let (status, job) = b.submit(trivial(10 + n)).await;
        assert_eq!(status, 201, "the other account still queues: {job}");
        polite.push(job["id"].as_str().unwrap().to_string());
    }
    let (status, refused) = b.submit(trivial(12)).await;
    assert_eq!((status, refused["error"]["code"].as_str()), (StatusCode::TOO_MANY_REQUESTS, Some("queue_full")), "the server-wide bound holds: {refused}");

    // Streams: greedy's SSE streams and WebSockets share its 3 slots.
    let mut held = Vec::new();
    for _ in 0..2 {
        let (status, resp) = sse(&a, &queued[2]).await;
        assert_eq!(status, 200);
        held.push(resp);
    }
    let greedy_socket = ws_or_status(&a).await.expect("greedy's third stream is a WebSocket");
    let (status, resp) = sse(&a, &queued[2]).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(resp.json::<Value>().await.unwrap()["error"]["code"], "too_many_streams");
    assert_eq!(ws_or_status(&a).await.err(), Some(StatusCode::TOO_MANY_REQUESTS), "a fourth as a WebSocket neither");
    // The other account opens its own, up to the server's 5.
    let (status, polite_sse) = sse(&b, &polite[1]).await;
    assert_eq!(status, 200, "the other account still streams");
    let polite_socket = ws_or_status(&b).await.expect("and opens a WebSocket");
    let (status, _) = sse(&b, &polite[1]).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "the server-wide bound holds");
    // A closed stream gives its slot back.
    drop(held.pop());
    let mut reopened = None;
    for _ in 0..100 {
        let (status, resp) = sse(&a, &queued[2]).await;
        if status == 200 {
            reopened = Some(resp);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(reopened.is_some(), "the slot was given back");
    drop((held, reopened, polite_sse, greedy_socket, polite_socket));
    s.shutdown().await;
}

#[tokio::test]
async fn queue_positions_and_prompt_numbers_are_per_account() {
    let s = start(|c, o| {
        cloud(c, o);
        (c.max_running_jobs, o.max_running_jobs) = (1, 1);
    })
    .await;
    let (a, b) = (tenant(&s, "first", 1000).await, tenant(&s, "second", 1000).await);
    let (_, spinning) = a.submit(super::spinner(12)).await;
    let spinning = spinning["id"].as_str().unwrap().to_string();
    until_running(&a, &spinning).await;
    let mut mine = Vec::new();
    for n in 0..3 {
        let (status, job) = a.submit(trivial(n)).await;
        assert_eq!(status, 201, "{job}");
        assert_eq!(job["queue_position"], n + 1, "{job}");
        mine.push(job["id"].as_str().unwrap().to_string());
    }
    // The other account's first job is first among its own, whatever the
    // first account queued (round-robin runs it second; counting that
    // would tell it the first account has work queued).
    let (status, theirs) = b.submit(trivial(9)).await;
    assert_eq!((status, theirs["queue_position"].as_u64()), (StatusCode::CREATED, Some(1)), "{theirs}");
    let (_, again) = json_of(b.v2(Method::GET, &format!("/jobs/{}", theirs["id"].as_str().unwrap()))).await;
    assert_eq!(again["queue_position"], 1, "{again}");
    let (_, last) = json_of(a.v2(Method::GET, &format!("/jobs/{}", mine[2]))).await;
    assert_eq!(last["queue_position"], 3, "the other account's job is not counted: {last}");
    // Prompt numbers: each account's own counter.
    let mut numbers = Vec::new();
    for _ in 0..3 {
        let (status, body) = a.prompt(trivial(20)).await;
        assert_eq!(status, 200, "{body}");
        numbers.push(body["number"].as_i64().unwrap());
    }
    for _ in 0..2 {
        let (status, body) = b.prompt(trivial(21)).await;
        assert_eq!(status, 200, "{body}");
        numbers.push(body["number"].as_i64().unwrap());
    }
    assert_eq!(numbers, [0, 1, 2, 0, 1], "the second account's numbers do not count the first's prompts");
    s.shutdown().await;
}

#[tokio::test]
async fn disabling_an_account_cancels_its_jobs_and_closes_its_streams() {
    let s = start(|c, o| {
        cloud(c, o);
        (c.max_running_jobs, o.max_running_jobs) = (1, 1);
    })
    .await;
    let (a, b) = (tenant(&s, "leaving", 1000).await, tenant(&s, "staying", 1000).await);
    let account = a.account().await["id"].as_str().unwrap().to_string();
    let mut socket = a.ws().await;
    drain(&mut socket, Duration::from_millis(100)).await;
    let (_, spinning) = a.submit(super::spinner(13)).await;
    let spinning = spinning["id"].as_str().unwrap().to_string();
    until_running(&a, &spinning).await;
    let mut queued = Vec::new();
    for n in 0..6 {
        let (status, body) = if n % 2 == 0 { a.submit(trivial(n)).await } else { a.prompt(trivial(n)).await };
        assert!(status.is_success(), "{body}");
        queued.push(body.get("id").or(body.get("prompt_id")).unwrap().as_str().unwrap().to_string());
    }
    // The other account's job, canceled by its owner: the normal cancel.
    let (_, other) = b.submit(trivial(30)).await;
    let other = other["id"].as_str().unwrap().to_string();
    let (status, _) = json_of(b.v2(Method::POST, &format!("/jobs/{other}/cancel"))).await;
    assert_eq!(status, 200);
    let (_, later) = b.submit(trivial(31)).await;
    let later = later["id"].as_str().unwrap().to_string();
    let (status, mut stream) = sse(&a, &queued[4]).await;
    assert_eq!(status, 200);
    assert!(stream.chunk().await.unwrap().is_some(), "the stream opened with its status");
    assert_eq!(s.server.state.service.open_streams_of(&account), 2);

    let (status, body) = json_of(admin(&s, Method::POST, &format!("/accounts/{}/disable", a.name), Some(OPERATOR))).await;
    assert_eq!((status, body["disabled"].as_bool()), (StatusCode::OK, Some(true)), "{body}");
    // The WebSocket is closed by the server, the SSE stream ends.
    let closed = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match socket.next().await {
                None | Some(Err(_)) | Some(Ok(Message::Close(_))) => return,
                Some(Ok(_)) => {}
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "the disabled account's WebSocket was closed");
    let ended = tokio::time::timeout(Duration::from_secs(5), async { while stream.chunk().await.unwrap_or(None).is_some() {} }).await;
    assert!(ended.is_ok(), "the disabled account's SSE stream ended");
    for _ in 0..100 {
        if s.server.state.service.open_streams_of(&account) == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(s.server.state.service.open_streams_of(&account), 0, "its stream slots were given back");
    // Its jobs: canceled, the queued ones never started, with the status
    // and error a client's cancel gives.
    let service = &s.server.state.service;
    let (normal, _) = service.get(&b_id(&b).await, &other).await.unwrap();
    for id in &queued {
        let (rec, _) = service.get(&account, id).await.unwrap();
        assert_eq!(rec.status, kiln::store::JobStatus::Canceled, "{id}");
        assert_eq!((rec.started_at, rec.execution_ms), (None, None), "never ran: {id}");
        assert_eq!(rec.error.as_ref().map(|e| e.code), normal.error.as_ref().map(|e| e.code));
    }
    let mut ran = None;
    for _ in 0..300 {
        let (rec, _) = service.get(&account, &spinning).await.unwrap();
        if rec.status.is_terminal() {
            ran = Some(rec);
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let ran = ran.expect("the running job ended");
    assert_eq!(ran.status, kiln::store::JobStatus::Canceled, "canceled, not run to its 2 s limit: {:?}", ran.error);
    // Charged for the running job only (at the minimum of 1 credit per
    // started second), never for the six that waited.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let cost = ((ran.execution_ms.unwrap_or(0) + 999) / 1000).max(1);
    assert_eq!(a.account().await["credits"], 1000 - cost);
    // The other account is untouched: its next job runs.
    assert_eq!(b.wait(&later).await["status"], "succeeded");
    s.shutdown().await;
}

async fn b_id(t: &Tenant<'_>) -> String {
    t.account().await["id"].as_str().unwrap().to_string()
}

/// Uploading bytes another account already stored does the work new bytes
/// take (the blob is written, synced and renamed either way), so its time
/// does not say whether anyone stored them. The answer is the caller's
/// own new asset either way. Prints the median times of both (measured,
/// not asserted: timing on a shared machine is no test).
#[tokio::test]
async fn uploading_bytes_another_account_stored_is_a_new_upload_of_ones_own() {
    let s = start_cloud().await;
    let (a, b) = (tenant(&s, "stored-first", 1000).await, tenant(&s, "stored-second", 1000).await);
    const ROUNDS: u8 = 25;
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (mut known, mut fresh) = (Vec::new(), Vec::new());
    let (mut known_compat, mut fresh_compat) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        // Bytes of the first account's, then the same and new ones by the second.
        let (theirs, new) = (png_bytes(96, 96, round), png_bytes(96, 96, 128 + round));
        let stored = a.upload(theirs.clone()).await;
        let started = std::time::Instant::now();
        let mine = b.upload(theirs.clone()).await;
        known.push(started.elapsed().as_secs_f64() * 1000.0);
        assert_ne!(mine["id"], stored["id"], "the second account's own asset");
        assert_eq!(mine["hash"], stored["hash"]);
        let started = std::time::Instant::now();
        b.upload(new.clone()).await;
        fresh.push(started.elapsed().as_secs_f64() * 1000.0);
        // The same on the compatibility API.
        a.compat_upload(&format!("c{round}.png"), theirs.clone()).await;
        let (theirs2, new2) = (png_bytes(97, 96, round), png_bytes(97, 96, 128 + round));
        a.compat_upload(&format!("d{round}.png"), theirs2.clone()).await;
        let started = std::time::Instant::now();
        b.compat_upload(&format!("d{round}.png"), theirs2).await;
        known_compat.push(started.elapsed().as_secs_f64() * 1000.0);
        let started = std::time::Instant::now();
        b.compat_upload(&format!("e{round}.png"), new2).await;
        fresh_compat.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    println!(
        "upload medians over {ROUNDS} rounds: /api/v2/assets known {:.2} ms, new {:.2} ms; /api/upload/image known {:.2} ms, new {:.2} ms",
        median(known),
        median(fresh),
        median(known_compat),
        median(fresh_compat)
    );
    s.shutdown().await;
}

#[tokio::test]
async fn a_prompt_id_another_account_used_is_an_unused_one() {
    let s = start_cloud().await;
    let (a, b) = (tenant(&s, "chose-first", 1000).await, tenant(&s, "chose-second", 1000).await);
    let chosen = "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d";
    let prompt = |t: &Tenant, color: i64| {
        let body = json!({ "prompt": trivial(color), "prompt_id": chosen });
        json_of(t.compat(Method::POST, "/api/prompt").json(&body))
    };
    let (status, body) = prompt(&a, 1).await;
    assert_eq!((status, body["prompt_id"].as_str()), (StatusCode::OK, Some(chosen)), "{body}");
    let theirs = a.wait(chosen).await;
    // The second account's prompt with the same id is answered as for an
    // unused id, and the job is its own under that id on every surface.
    let mut socket = b.ws().await;
    let (status, body) = prompt(&b, 2).await;
    assert_eq!((status, body["prompt_id"].as_str()), (StatusCode::OK, Some(chosen)), "{body}");
    let heard = until_done(&mut socket, chosen).await;
    assert!(heard.iter().any(|m| m["type"] == "execution_success" && m["data"]["prompt_id"] == chosen), "{heard:?}");
    assert!(!format!("{heard:?}").contains('~'), "no internal key on the socket: {heard:?}");
    let mine = b.wait(chosen).await;
    assert_eq!((mine["id"].as_str(), mine["status"].as_str()), (Some(chosen), Some("succeeded")), "{mine}");
    assert_ne!(mine["created_at"], theirs["created_at"], "two jobs");
    assert!(mine["urls"]["self"].as_str().unwrap().ends_with(chosen), "{mine}");
    for output in mine["outputs"].as_array().unwrap() {
        let (status, asset) = json_of(b.v2(Method::GET, &format!("/assets/{}", output["id"].as_str().unwrap()))).await;
        assert_eq!((status, asset["job_id"].as_str()), (StatusCode::OK, Some(chosen)), "{asset}");
    }
    let history = |t: &Tenant| json_of(t.compat(Method::GET, &format!("/api/history/{chosen}")));
    let (_, hb) = history(&b).await;
    let (_, ha) = history(&a).await;
    assert_eq!(hb[chosen]["prompt"][2]["1"]["inputs"]["color"], 2, "{hb}");
    assert_eq!(ha[chosen]["prompt"][2]["1"]["inputs"]["color"], 1, "the first account's job is untouched: {ha}");
    assert_eq!(a.wait(chosen).await["created_at"], theirs["created_at"]);
    // Each account's own reuse of the id is refused, as before.
    for t in [&a, &b] {
        let (status, body) = prompt(t, 3).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert!(body.to_string().contains("already exists") && !body.to_string().contains('~'), "{body}");
    }
    s.shutdown().await;
}
