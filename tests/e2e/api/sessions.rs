//! Signing a browser in (`/login`, `/logout`) on servers that ask for a
//! key, over real HTTP and WebSockets on loopback: the session cookie's
//! attributes; the cookie standing in for the key on both APIs and `/ws`;
//! the same-origin rule for what it can change; the frontend's page
//! sending a stranger to the form; signing out ending the session on the
//! server; sessions surviving a restart; the self-hosted token.

use futures_util::StreamExt;
use kiln::config::Mode;
use reqwest::{Method, StatusCode, header};
use serde_json::{Value, json};

use super::{TestServer, start, start_in, trivial};

const OPERATOR: &str = "operator-token-of-the-sign-in-tests";

fn cloud_with_frontend(frontend: std::path::PathBuf) -> impl FnOnce(&mut kiln::config::Config, &mut kiln::service::ServiceOptions) {
    move |c, o| {
        c.mode = Mode::Cloud;
        c.admin_token = Some(OPERATOR.into());
        c.front_end_root = Some(frontend);
        o.mode = Mode::Cloud;
    }
}

fn frontend_tree() -> tempfile::TempDir {
    let tree = tempfile::tempdir().unwrap();
    std::fs::write(tree.path().join("index.html"), "<html><body>the frontend</body></html>").unwrap();
    tree
}

/// A client that shows redirects instead of following them.
fn browser() -> reqwest::Client {
    reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap()
}

fn origin(s: &TestServer) -> String {
    s.server.url().trim_end_matches('/').to_string()
}

/// `POST /login` with `key` from `from` (an `Origin`); the response.
async fn sign_in(s: &TestServer, key: &str, from: &str) -> reqwest::Response {
    browser()
        .post(format!("{}/login", s.server.url()))
        .header(header::ORIGIN, from)
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(format!("key={}", key))
        .send()
        .await
        .unwrap()
}

/// The `kiln_session=…` pair of a sign-in's `Set-Cookie`, and the whole header.
fn session_cookie(resp: &reqwest::Response) -> (String, String) {
    let set = resp.headers()[header::SET_COOKIE].to_str().unwrap().to_string();
    (set.split(';').next().unwrap().to_string(), set)
}

/// A request carrying `cookie`, from `from` when given.
fn with_cookie(s: &TestServer, method: Method, path: &str, cookie: &str, from: Option<&str>) -> reqwest::RequestBuilder {
    let req = browser().request(method, format!("{}{path}", s.server.url())).header(header::COOKIE, cookie);
    match from {
        Some(from) => req.header(header::ORIGIN, from),
        None => req,
    }
}

#[tokio::test]
async fn a_browser_signs_in_with_a_key_and_its_session_stands_in_for_it() {
    let tree = frontend_tree();
    let s = start(cloud_with_frontend(tree.path().to_path_buf())).await;
    let (key, id) = s.new_account(OPERATOR, "painter", 1000).await;
    let me = origin(&s);

    // A stranger at the frontend is sent to the form.
    let resp = browser().get(s.server.url()).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::SEE_OTHER);
    assert_eq!(resp.headers()[header::LOCATION], "/login");
    let form = browser().get(format!("{}/login", s.server.url())).send().await.unwrap();
    assert_eq!(form.status(), 200);
    let html = form.text().await.unwrap();
    assert!(html.contains("name=\"key\"") && html.contains("action=\"/login\"") && html.contains("method=\"post\""), "{html}");

    // A wrong key shows the form again; a right one from another site is refused.
    let wrong = sign_in(&s, "kiln_not_a_key", &me).await;
    assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
    assert!(wrong.headers().get(header::SET_COOKIE).is_none());
    assert!(wrong.text().await.unwrap().contains("not accepted"));
    let huge = sign_in(&s, &"k".repeat(8192), &me).await;
    assert_eq!(huge.status(), StatusCode::PAYLOAD_TOO_LARGE, "a form is a key, not a body of any size");
    let cross = sign_in(&s, &key, "http://evil.example").await;
    assert_eq!(cross.status(), StatusCode::FORBIDDEN);
    assert!(cross.headers().get(header::SET_COOKIE).is_none());

    let signed = sign_in(&s, &key, &me).await;
    assert_eq!(signed.status(), StatusCode::SEE_OTHER);
    assert_eq!(signed.headers()[header::LOCATION], "/");
    let (cookie, set) = session_cookie(&signed);
    assert!(cookie.starts_with("kiln_session=") && cookie.len() > "kiln_session=".len() + 32, "{set}");
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/", "Max-Age=43200"] {
        assert!(set.contains(attribute), "{attribute} missing: {set}");
    }
    assert!(!set.contains(&key), "the key is not the cookie");

    // Signed in: the frontend's page, both APIs and their lists are the account's.
    let page = with_cookie(&s, Method::GET, "/", &cookie, None).send().await.unwrap();
    assert_eq!(page.status(), 200);
    assert!(page.text().await.unwrap().contains("the frontend"));
    let queued = with_cookie(&s, Method::POST, "/api/prompt", &cookie, Some(&me)).json(&json!({ "prompt": trivial(3) })).send().await.unwrap();
    assert_eq!(queued.status(), 200);
    let prompt_id = queued.json::<Value>().await.unwrap()["prompt_id"].as_str().unwrap().to_string();
    let job = s.http.get(s.url(&format!("/jobs/{prompt_id}"))).bearer_auth(&key).send().await.unwrap();
    assert_eq!(job.status(), 200, "the job is the account's, seen with its key");
    let listed: Value = with_cookie(&s, Method::GET, "/api/v2/jobs", &cookie, None).send().await.unwrap().json().await.unwrap();
    assert!(listed["jobs"].as_array().unwrap().iter().any(|j| j["id"] == prompt_id.as_str()), "{listed}");
    let (other_key, other_id) = s.new_account(OPERATOR, "stranger", 1000).await;
    assert_ne!(other_id, id);
    let theirs = s.http.get(s.url(&format!("/jobs/{prompt_id}"))).bearer_auth(&other_key).send().await.unwrap();
    assert_eq!(theirs.status(), 404);

    // What can change something must come from the server's own origin.
    let forged =
        with_cookie(&s, Method::POST, "/api/prompt", &cookie, Some("http://evil.example")).json(&json!({ "prompt": trivial(4) })).send().await.unwrap();
    assert_eq!(forged.status(), StatusCode::FORBIDDEN);
    let bare = with_cookie(&s, Method::POST, "/api/interrupt", &cookie, None).send().await.unwrap();
    assert_eq!(bare.status(), StatusCode::FORBIDDEN, "no Origin and no Sec-Fetch-Site");
    let fetched = with_cookie(&s, Method::POST, "/api/interrupt", &cookie, None).header("sec-fetch-site", "same-origin").send().await.unwrap();
    assert_eq!(fetched.status(), 200);
    let deleted = with_cookie(&s, Method::DELETE, &format!("/api/v2/jobs/{prompt_id}"), &cookie, Some("http://127.0.0.1:1")).send().await.unwrap();
    assert_eq!(deleted.status(), StatusCode::FORBIDDEN, "another port is another origin");

    // The WebSocket: the cookie from this origin opens it, from another not.
    let ws_url = format!("{}/ws?clientId=b", s.server.url().replacen("http://", "ws://", 1));
    let handshake = |from: String| {
        let mut req = tokio_tungstenite::tungstenite::client::IntoClientRequest::into_client_request(ws_url.as_str()).unwrap();
        req.headers_mut().insert("cookie", cookie.parse().unwrap());
        req.headers_mut().insert("origin", from.parse().unwrap());
        tokio_tungstenite::connect_async(req)
    };
    let (mut socket, _) = handshake(me.clone()).await.expect("the signed-in socket opens");
    let first = socket.next().await.unwrap().unwrap();
    assert!(first.to_text().unwrap().contains("\"status\""), "{first:?}");
    match handshake("http://evil.example".into()).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => assert_eq!(resp.status().as_u16(), 403),
        other => panic!("a cross-site socket opened: {:?}", other.map(|_| ())),
    }

    // An explicit key wins over the cookie, and an unknown cookie opens nothing.
    let keyed = with_cookie(&s, Method::GET, "/api/queue", &cookie, None).header("x-api-key", &other_key).send().await.unwrap();
    assert_eq!(keyed.status(), 200);
    let unknown = with_cookie(&s, Method::GET, "/api/queue", &format!("kiln_session={}", "0".repeat(64)), None).send().await.unwrap();
    assert_eq!(unknown.status(), StatusCode::UNAUTHORIZED);

    // Signing out ends the session on the server: the copied cookie opens nothing.
    let out = with_cookie(&s, Method::POST, "/logout", &cookie, Some(&me)).send().await.unwrap();
    assert_eq!(out.status(), StatusCode::SEE_OTHER);
    assert_eq!(out.headers()[header::LOCATION], "/login");
    assert!(out.headers()[header::SET_COOKIE].to_str().unwrap().contains("Max-Age=0"));
    let after = with_cookie(&s, Method::GET, "/api/queue", &cookie, None).send().await.unwrap();
    assert_eq!(after.status(), StatusCode::UNAUTHORIZED);
    let page = with_cookie(&s, Method::GET, "/", &cookie, None).send().await.unwrap();
    assert_eq!(page.status(), StatusCode::SEE_OTHER);
}

#[tokio::test]
async fn sessions_survive_a_restart_and_end_with_their_account() {
    let tree = frontend_tree();
    let s = start(cloud_with_frontend(tree.path().to_path_buf())).await;
    let (key, _) = s.new_account(OPERATOR, "restarter", 1000).await;
    let me = origin(&s);
    let (cookie, _) = session_cookie(&sign_in(&s, &key, &me).await);
    let data = s.shutdown().await;
    let s = start_in(data, cloud_with_frontend(tree.path().to_path_buf())).await;
    let queue = with_cookie(&s, Method::GET, "/api/queue", &cookie, None).send().await.unwrap();
    assert_eq!(queue.status(), 200, "the session outlived the restart");
    // A disabled account's session opens nothing.
    let disabled = s.http.post(format!("{}/admin/accounts/restarter/disable", s.server.url())).bearer_auth(OPERATOR).send().await.unwrap();
    assert!(disabled.status().is_success(), "{}", disabled.status());
    let queue = with_cookie(&s, Method::GET, "/api/queue", &cookie, None).send().await.unwrap();
    assert_eq!(queue.status(), StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn a_self_hosted_token_signs_a_browser_in_too() {
    let tree = frontend_tree();
    let dir = tree.path().to_path_buf();
    let s = start(move |c, _| {
        c.token = Some("self-hosted-secret".into());
        c.front_end_root = Some(dir);
    })
    .await;
    let me = origin(&s);
    assert_eq!(browser().get(s.server.url()).send().await.unwrap().status(), StatusCode::SEE_OTHER);
    assert_eq!(sign_in(&s, "wrong", &me).await.status(), StatusCode::UNAUTHORIZED);
    let (cookie, _) = session_cookie(&sign_in(&s, "self-hosted-secret", &me).await);
    assert_eq!(with_cookie(&s, Method::GET, "/api/queue", &cookie, None).send().await.unwrap().status(), 200);
    assert_eq!(with_cookie(&s, Method::GET, "/api/v2/jobs", &cookie, None).send().await.unwrap().status(), 200);
    assert_eq!(browser().get(format!("{}/api/queue", s.server.url())).send().await.unwrap().status(), StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn an_open_server_offers_no_sign_in() {
    let s = start(|_, _| {}).await;
    let resp = browser().get(format!("{}/login", s.server.url())).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
}
