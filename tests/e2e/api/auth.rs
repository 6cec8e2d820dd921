//! The optional static bearer token.

use serde_json::Value;

use super::{start, trivial};

#[tokio::test]
async fn a_configured_token_guards_every_route_but_health() {
    let s = start(|c, _| c.token = Some("s3cret".into())).await;
    let h = &s.http;
    assert_eq!(h.get(s.url("/health")).send().await.unwrap().status(), 200);
    let job_path = format!("/jobs/{}", uuid::Uuid::new_v4());
    for (method, path) in [("GET", "/jobs"), ("POST", "/jobs"), ("GET", job_path.as_str()), ("POST", "/assets")] {
        let req = |auth: Option<&str>| {
            let mut r = h.request(method.parse().unwrap(), s.url(path));
            if let Some(a) = auth {
                r = r.header("authorization", a);
            }
            r
        };
        for (auth, message) in [
            (None, "Missing or malformed Authorization header."),
            (Some("Bearer wrong"), "Invalid token."),
            (Some("Basic s3cret"), "Missing or malformed Authorization header."),
        ] {
            let resp = req(auth).send().await.unwrap();
            assert_eq!(resp.status(), 401, "{method} {path} {auth:?}");
            let body: Value = resp.json().await.unwrap();
            assert_eq!(body["error"]["code"], "unauthorized");
            assert_eq!(body["error"]["message"], message);
        }
    }
    // Paths the API does not have: refused without the token (their
    // existence is not revealed); outside the API, a plain 404.
    assert_eq!(h.get(s.url("/no-such-route")).send().await.unwrap().status(), 401);
    let outside = h.get(format!("{}/no-such-route", s.server.url())).send().await.unwrap();
    assert_eq!(outside.status(), 404);
    assert_eq!(outside.json::<Value>().await.unwrap()["error"]["code"], "not_found");
    // HEAD: 401 with no body.
    let head = h.head(s.url(&format!("/assets/by-hash/blake3:{}", "0".repeat(64)))).send().await.unwrap();
    assert_eq!(head.status(), 401);
    assert!(head.bytes().await.unwrap().is_empty());
    // The right token, with the scheme in any case.
    let ok = h.post(s.url("/jobs")).header("authorization", "bearer s3cret").json(&serde_json::json!({ "workflow": trivial(1) })).send().await.unwrap();
    assert_eq!(ok.status(), 201);
    let ok = h.get(s.url("/jobs")).header("authorization", "Bearer s3cret").send().await.unwrap();
    assert_eq!(ok.status(), 200);
    assert!(ok.headers().contains_key("x-comfy-request-id"));
}
