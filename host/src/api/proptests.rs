//! Property tests of the HTTP edge: whatever a client sends — Range
//! headers, ids, signed-URL query strings, multipart bodies — the answer is
//! the documented one or a well-formed error envelope with a 4xx status;
//! never a panic, never a 5xx. The pure parts are tested directly, the rest
//! through the real router in-process (`tower::ServiceExt::oneshot`) on a
//! service over a temporary data directory.

use std::sync::Arc;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Method, Request, StatusCode, header};
use proptest::prelude::*;
use proptest::test_runner::{TestCaseError, TestRunner};
use serde_json::Value as Json;
use tower::ServiceExt;

use super::AppState;
use super::content::{RangeReply, range_reply};
use super::signing::Signer;
use super::v2::check_id;
use crate::config::Config;
use crate::executor::Executor;
use crate::service::{Service, ServiceOptions};
use crate::test_support;

use crate::test_support::proptest_config as config;

// ---------------------------------------------------------------------------
// The app, in-process
// ---------------------------------------------------------------------------

/// A service on a fresh data directory and the router over it (also used
/// by the contract's tests, `api::openapi::tests`).
pub(in crate::api) struct App {
    runtime: tokio::runtime::Runtime,
    router: Router,
    pub(in crate::api) state: Arc<AppState>,
    _data: tempfile::TempDir,
}

/// A response, read whole.
pub(in crate::api) struct Reply {
    pub(in crate::api) status: StatusCode,
    headers: HeaderMap,
    pub(in crate::api) body: Bytes,
}

impl App {
    fn start() -> App {
        App::start_with(|_| {})
    }

    /// [`App::start`] with `tweak` applied to the configuration.
    pub(in crate::api) fn start_with(tweak: impl FnOnce(&mut Config)) -> App {
        let data = tempfile::tempdir().unwrap();
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let mut config = Config { data_dir: data.path().to_path_buf(), max_running_jobs: 1, download_redirect: false, ..test_support::config() };
        tweak(&mut config);
        let options = ServiceOptions::from_config(&config);
        let registry = test_support::registry().clone();
        let executor = Arc::new(Executor::new(test_support::runtime().clone(), 16 << 20, 1));
        let service = runtime.block_on(Service::start(options, &config.data_dir, registry, executor)).unwrap();
        let signer = Signer::load_or_create(&config.data_dir).unwrap();
        let state = AppState::new(service, config, signer, "127.0.0.1:8188".parse().unwrap(), None);
        App { router: super::router(state.clone()), runtime, state, _data: data }
    }

    pub(in crate::api) fn call(&self, request: Request<Body>) -> Reply {
        self.runtime.block_on(async {
            let response = self.router.clone().oneshot(request).await.unwrap();
            let (parts, body) = response.into_parts();
            Reply { status: parts.status, headers: parts.headers, body: axum::body::to_bytes(body, usize::MAX).await.unwrap() }
        })
    }

    pub(in crate::api) fn get(&self, uri: &str, headers: &[(&str, &str)]) -> Reply {
        let mut request = Request::get(uri);
        for (k, v) in headers {
            request = request.header(*k, *v);
        }
        self.call(request.body(Body::empty()).unwrap())
    }

    /// Uploads `bytes` (a valid multipart body); returns the Asset.
    fn upload(&self, bytes: &[u8]) -> Json {
        let body = multipart(B, &[Part::text("file_path", "in/a.bin"), Part::file(bytes)], None);
        let reply = self.call(upload_request(Some(format!("multipart/form-data; boundary={B}")), body));
        assert!(reply.status.is_success(), "{}", String::from_utf8_lossy(&reply.body));
        serde_json::from_slice(&reply.body).unwrap()
    }
}

impl Drop for App {
    fn drop(&mut self) {
        self.runtime.block_on(self.state.service.shutdown());
    }
}

/// The error envelope `{"error": {"code", "message", "details"}}` with a
/// 4xx status and a JSON content type: its code.
fn envelope(reply: &Reply) -> Result<String, TestCaseError> {
    let text = String::from_utf8_lossy(&reply.body);
    prop_assert!(reply.status.is_client_error(), "status {} body {}", reply.status, text);
    prop_assert_eq!(reply.headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()), Some("application/json"));
    let json: Json = serde_json::from_slice(&reply.body).map_err(|e| TestCaseError::fail(format!("{e}: {text}")))?;
    let error = json.get("error").and_then(Json::as_object).ok_or_else(|| TestCaseError::fail(format!("no error object: {text}")))?;
    prop_assert_eq!(json.as_object().map(|o| o.len()), Some(1), "{}", text);
    let mut keys: Vec<&str> = error.keys().map(String::as_str).collect();
    keys.sort_unstable();
    prop_assert_eq!(keys, ["code", "details", "message"], "{}", text);
    prop_assert!(error["message"].as_str().is_some_and(|m| !m.is_empty()), "{}", text);
    prop_assert!(error["details"].is_null() || error["details"].is_object(), "{}", text);
    error["code"].as_str().map(str::to_string).ok_or_else(|| TestCaseError::fail(format!("code is not a string: {text}")))
}

/// Percent-encodes everything but unreserved characters.
fn encode(s: &str) -> String {
    s.bytes().map(|b| if b.is_ascii_alphanumeric() || b"-._~".contains(&b) { (b as char).to_string() } else { format!("%{b:02X}") }).collect()
}

// ---------------------------------------------------------------------------
// Range
// ---------------------------------------------------------------------------

/// One range of a generated `Range` header.
#[derive(Debug, Clone, Copy)]
enum Spec {
    /// `a-b`.
    FromTo(u64, u64),
    /// `a-`.
    From(u64),
    /// `-n`.
    Suffix(u64),
}

impl Spec {
    fn text(self) -> String {
        match self {
            Spec::FromTo(a, b) => format!("{a}-{b}"),
            Spec::From(a) => format!("{a}-"),
            Spec::Suffix(n) => format!("-{n}"),
        }
    }
    /// RFC 9110 §14.1.1: a last position before the first makes the header invalid.
    fn valid(self) -> bool {
        !matches!(self, Spec::FromTo(a, b) if b < a)
    }
    /// RFC 9110 §14.1.1: valid, and starting inside the body (a suffix: non-empty).
    fn satisfiable(self, len: u64) -> bool {
        match self {
            Spec::FromTo(a, b) => a < len && a <= b,
            Spec::From(a) => a < len,
            Spec::Suffix(n) => n > 0,
        }
    }
    /// The bytes a satisfiable range selects.
    fn bytes(self, len: u64) -> std::ops::RangeInclusive<u64> {
        match self {
            Spec::FromTo(a, b) => a..=b.min(len - 1),
            Spec::From(a) => a..=len - 1,
            Spec::Suffix(n) => len.saturating_sub(n)..=len - 1,
        }
    }
}

/// A position near the body's edges (`len` is at most 5000), or far out.
fn position() -> impl Strategy<Value = u64> {
    prop_oneof![6 => 0u64..5010, 1 => Just(0u64), 1 => any::<u64>(), 1 => Just(u64::MAX)]
}

fn spec() -> impl Strategy<Value = Spec> {
    prop_oneof![
        3 => (position(), position()).prop_map(|(a, b)| Spec::FromTo(a, b)),
        1 => position().prop_map(Spec::From),
        1 => position().prop_map(Spec::Suffix),
    ]
}

/// Header text: mostly near the grammar, sometimes anything.
fn range_text() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => (prop::collection::vec(spec(), 1..4), prop::sample::select(vec![",", ", ", " ,", ",,", "; "])).prop_map(|(specs, sep)| {
            format!("bytes={}", specs.iter().map(|s| s.text()).collect::<Vec<_>>().join(sep))
        }),
        2 => "(bytes|BYTES|items| bytes)?=?[-0-9, ]{0,16}",
        1 => ".{0,24}",
    ]
}

proptest! {
    #![proptest_config(config(2048))]

    /// Any header, any length: a range inside the body, 416 only for a
    /// `bytes=` header over a non-empty body, or the whole body.
    #[test]
    fn any_range_header_stays_inside_the_body(text in range_text(), len in prop_oneof![Just(0u64), 1u64..5000, Just(u64::MAX)]) {
        prop_assert_eq!(range_reply(None, len), RangeReply::Whole);
        match range_reply(Some(&text), len) {
            RangeReply::Part(r) => prop_assert!(r.start() <= r.end() && *r.end() < len, "{:?} of {}", r, len),
            RangeReply::Unsatisfiable => prop_assert!(len > 0 && text.starts_with("bytes="), "416 for {:?} over {}", text, len),
            RangeReply::Whole => {}
        }
        if len == 0 {
            prop_assert_eq!(range_reply(Some(&text), len), RangeReply::Whole);
        }
    }

    /// Well-formed headers get what RFC 9110 says: one satisfiable range →
    /// exactly its bytes; one unsatisfiable (or invalid) range → 416;
    /// several → the whole body, or 416 only when none can be served.
    #[test]
    fn well_formed_ranges_follow_rfc_9110(specs in prop::collection::vec(spec(), 1..4), comma_space in any::<bool>(), len in 1u64..5000) {
        let text = format!("bytes={}", specs.iter().map(|s| s.text()).collect::<Vec<_>>().join(if comma_space { ", " } else { "," }));
        let reply = range_reply(Some(&text), len);
        let any_satisfiable = specs.iter().any(|s| s.satisfiable(len));
        let all_valid = specs.iter().all(|s| s.valid());
        match specs.as_slice() {
            [one] if one.satisfiable(len) => prop_assert_eq!(reply, RangeReply::Part(one.bytes(len)), "{}", text),
            [_] => prop_assert_eq!(reply, RangeReply::Unsatisfiable, "{}", text),
            _ => {
                prop_assert!(!matches!(reply, RangeReply::Part(_)), "{}: {:?}", text, reply);
                if reply == RangeReply::Unsatisfiable {
                    prop_assert!(!any_satisfiable || !all_valid, "416 for {} over {} bytes, though a range can be served", text, len);
                }
                let zero_suffix = specs.iter().any(|s| matches!(s, Spec::Suffix(0)));
                if !any_satisfiable && all_valid && !zero_suffix {
                    prop_assert_eq!(reply, RangeReply::Unsatisfiable, "{}", text);
                }
            }
        }
    }
}

/// The handler serves what [`range_reply`] decides: the bytes with their
/// Content-Range, or the 416 envelope with `bytes */len`.
#[test]
fn content_requests_answer_range_headers_with_the_right_bytes() {
    let app = App::start();
    let file: Vec<u8> = (0..777u32).map(|i| (i * 31 % 251) as u8).collect();
    let asset = app.upload(&file);
    let uri = format!("/api/v2/assets/{}/content", asset["id"].as_str().unwrap());
    let len = file.len() as u64;
    let mut runner = TestRunner::new(config(256));
    runner
        .run(&range_text(), |text| {
            let reply = match axum::http::HeaderValue::from_str(&text) {
                Ok(_) => app.get(&uri, &[("range", &text)]),
                Err(_) => return Ok(()),
            };
            let content_range = reply.headers.get(header::CONTENT_RANGE).and_then(|v| v.to_str().ok()).map(str::to_string);
            match range_reply(Some(&text), len) {
                RangeReply::Whole => {
                    prop_assert_eq!(reply.status, StatusCode::OK);
                    prop_assert_eq!(&reply.body[..], &file[..]);
                    prop_assert_eq!(content_range, None);
                }
                RangeReply::Part(r) => {
                    prop_assert_eq!(reply.status, StatusCode::PARTIAL_CONTENT);
                    prop_assert_eq!(&reply.body[..], &file[*r.start() as usize..=*r.end() as usize]);
                    prop_assert_eq!(content_range, Some(format!("bytes {}-{}/{len}", r.start(), r.end())));
                }
                RangeReply::Unsatisfiable => {
                    prop_assert_eq!(envelope(&reply)?, "range_not_satisfiable");
                    prop_assert_eq!(reply.status, StatusCode::RANGE_NOT_SATISFIABLE);
                    prop_assert_eq!(content_range, Some(format!("bytes */{len}")));
                }
            }
            Ok(())
        })
        .unwrap();
}

// ---------------------------------------------------------------------------
// Ids
// ---------------------------------------------------------------------------

/// What the API accepts as a job or asset id, written out again: a UUID as
/// 32 hex digits, as 8-4-4-4-12 with hyphens, braced, or as a URN.
fn is_uuid(s: &str) -> bool {
    let hex = |s: &str| s.bytes().all(|b| b.is_ascii_hexdigit());
    let hyphenated = |s: &str| {
        let groups: Vec<&str> = s.split('-').collect();
        s.len() == 36 && groups.iter().map(|g| g.len()).eq([8, 4, 4, 4, 12]) && groups.iter().all(|g| hex(g))
    };
    (s.len() == 32 && hex(s))
        || hyphenated(s)
        || s.strip_prefix('{').and_then(|s| s.strip_suffix('}')).is_some_and(hyphenated)
        || (s.len() == 45 && s.is_char_boundary(9) && s[..9].eq_ignore_ascii_case("urn:uuid:") && hyphenated(&s[9..]))
}

/// Strings near the id formats: a UUID in one of its forms, with random
/// case, sometimes with a character changed, dropped or added.
fn id_like() -> impl Strategy<Value = String> {
    let form = (any::<u128>(), 0..4usize, any::<u64>()).prop_map(|(n, form, case)| {
        let u = uuid::Uuid::from_u128(n);
        let s = match form {
            0 => u.hyphenated().to_string(),
            1 => u.simple().to_string(),
            2 => u.braced().to_string(),
            _ => u.urn().to_string(),
        };
        s.chars().enumerate().map(|(i, c)| if case >> (i % 64) & 1 == 1 { c.to_ascii_uppercase() } else { c }).collect::<String>()
    });
    let edit = (any::<prop::sample::Index>(), 0..4usize, prop::sample::select(vec!['0', 'f', 'g', '-', '{', '}', ' ', 'é', '\0', ':']));
    prop_oneof![
        3 => form.clone(),
        3 => (form, edit).prop_map(|(s, (at, op, c))| {
            let mut chars: Vec<char> = s.chars().collect();
            let i = at.index(chars.len());
            match op {
                0 => chars[i] = c,
                1 => drop(chars.remove(i)),
                2 => chars.insert(i, c),
                _ => chars.truncate(i),
            }
            chars.into_iter().collect()
        }),
        2 => ".{0,48}",
    ]
}

proptest! {
    #![proptest_config(config(2048))]

    /// `check_id` accepts exactly the UUID forms; anything else is the
    /// `not_found` envelope (a malformed id names nothing).
    #[test]
    fn ids_are_accepted_exactly_when_they_are_uuids(id in id_like()) {
        match check_id(&id) {
            Ok(()) => prop_assert!(is_uuid(&id), "accepted {:?}", id),
            Err(e) => {
                prop_assert!(!is_uuid(&id), "refused {:?}", id);
                prop_assert_eq!((e.status, e.code), (StatusCode::NOT_FOUND, crate::api::error::ApiCode::NotFound));
            }
        }
    }
}

/// Every route with an id answers any segment that names no record with
/// the `not_found` envelope (the static `from-hash` route: 405).
#[test]
fn any_id_segment_of_any_route_is_not_found() {
    let app = App::start();
    let routes: [(Method, &str); 7] = [
        (Method::GET, "/jobs/{}"),
        (Method::GET, "/jobs/{}/workflow"),
        (Method::POST, "/jobs/{}/cancel"),
        (Method::GET, "/jobs/{}/events"),
        (Method::GET, "/assets/{}"),
        (Method::DELETE, "/assets/{}"),
        (Method::GET, "/assets/{}/content"),
    ];
    let mut runner = TestRunner::new(config(256));
    runner
        .run(&(id_like(), 0..routes.len()), |(id, route)| {
            let (method, path) = &routes[route];
            let uri = format!("/api/v2{}", path.replace("{}", &encode(&id)));
            let reply = app.call(Request::builder().method(method.clone()).uri(&uri).body(Body::empty()).unwrap());
            let code = envelope(&reply)?;
            if id == "from-hash" && path == &"/assets/{}" {
                prop_assert_eq!(code, "method_not_allowed");
            } else {
                prop_assert_eq!((reply.status, code.as_str()), (StatusCode::NOT_FOUND, "not_found"), "{} {}", method, uri);
            }
            Ok(())
        })
        .unwrap();
}

// ---------------------------------------------------------------------------
// Signed URLs
// ---------------------------------------------------------------------------

/// A signature string changed somewhere: a digit, a length, or anything.
fn mangled_signature(sig: String) -> impl Strategy<Value = String> {
    let edit = (any::<prop::sample::Index>(), 0..5usize, prop::sample::select(vec!['0', '7', 'a', 'f', 'F', 'g', ' ', 'é']));
    prop_oneof![
        4 => edit.prop_map(move |(at, op, c)| {
            let mut s: Vec<char> = sig.chars().collect();
            let i = at.index(s.len());
            match op {
                0 => s[i] = c,
                1 => drop(s.remove(i)),
                2 => s.insert(i, c),
                3 => s = s.iter().map(|c| c.to_ascii_uppercase()).collect(),
                _ => s.truncate(i),
            }
            s.into_iter().collect()
        }),
        1 => ".{0,70}",
    ]
}

/// A signature verifies until its expiry and not after; any other asset
/// id or expiry fails, and so does a signature with one bit changed or one
/// made with another key.
#[test]
fn signatures_bind_asset_expiry_and_time() {
    let (dir, other_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let signer = Signer::load_or_create(dir.path()).unwrap();
    let other = Signer::load_or_create(other_dir.path()).unwrap();
    let inputs = (".{0,40}", any::<i64>(), any::<i64>(), any::<u64>(), ".{0,40}", any::<i64>());
    let mut runner = TestRunner::new(config(1024));
    runner
        .run(&inputs, |(id, expires, now, sig_edit, other_id, other_expires)| {
            let sig = signer.sign(&id, expires);
            prop_assert_eq!(sig.len(), 64);
            prop_assert_eq!(signer.verify(&id, expires, &sig, now), expires >= now);
            prop_assert!(signer.verify(&id, expires, &sig, expires));
            prop_assert_eq!(signer.verify(&id, expires, &sig, expires.saturating_add(1)), expires == i64::MAX);
            if other_id != id {
                prop_assert!(!signer.verify(&other_id, expires, &sig, i64::MIN));
            }
            if other_expires != expires {
                prop_assert!(!signer.verify(&id, other_expires, &sig, i64::MIN));
            }
            // One bit of one hex digit changed.
            let digit = (sig_edit % 64) as usize;
            let flipped: String = sig
                .char_indices()
                .map(|(i, c)| if i == digit { std::char::from_digit(c.to_digit(16).unwrap_or(0) ^ (1 << (sig_edit / 64 % 4)), 16).unwrap_or('0') } else { c })
                .collect();
            prop_assert!(!signer.verify(&id, expires, &flipped, i64::MIN), "{} verified as {}", flipped, sig);
            prop_assert!(!other.verify(&id, expires, &sig, i64::MIN));
            Ok(())
        })
        .unwrap();
}

/// Any mutation of a signature string fails unless only the letter case changed.
#[test]
fn mangled_signatures_fail() {
    let dir = tempfile::tempdir().unwrap();
    let signer = Signer::load_or_create(dir.path()).unwrap();
    let sig = signer.sign("asset", 1000);
    let mut runner = TestRunner::new(config(1024));
    runner
        .run(&mangled_signature(sig.clone()), |s| {
            prop_assert_eq!(signer.verify("asset", 1000, &s, 0), s.to_ascii_lowercase() == sig, "{:?}", s);
            Ok(())
        })
        .unwrap();
}

/// The signed download route: a valid link serves the bytes; any other
/// query string (mangled, expired, duplicated, for another asset, or
/// arbitrary) is the `forbidden` envelope.
#[test]
fn any_query_of_a_signed_link_is_the_file_or_forbidden() {
    let app = App::start();
    let file = b"signed bytes".to_vec();
    let asset = app.upload(&file);
    let id = asset["id"].as_str().unwrap().to_string();
    let now = crate::store::now_micros() / 1_000_000;
    let expires = now + 3600;
    let sig = app.state.signer.sign(&id, expires);
    let signed = |q: String| (q, true);
    let refused = |q: String| (q, false);
    let mangled = {
        let sig = sig.clone();
        move |s: String| (format!("expires={expires}&sig={}", encode(&s)), s.to_ascii_lowercase() == sig)
    };
    let other_expiry = {
        let sig = sig.clone();
        move |d: i64| refused(format!("expires={}&sig={sig}", expires + d))
    };
    // Arbitrary text, encoded, with the characters that structure a query kept.
    let arbitrary = |q: String| {
        let encoded = q.split_inclusive(['&', '=']).map(|p| {
            let (body, sep) = p.split_at(p.len() - usize::from(p.ends_with(['&', '='])));
            format!("{}{sep}", encode(body))
        });
        refused(encoded.collect())
    };
    let queries = prop_oneof![
        1 => Just(signed(format!("expires={expires}&sig={sig}"))),
        1 => Just(signed(format!("sig={sig}&expires={expires}&extra=1"))),
        1 => Just(signed(format!("expires=%2B{expires}&sig={sig}"))),
        2 => mangled_signature(sig.clone()).prop_map(mangled),
        1 => (-5i64..5).prop_filter("changed", |d| *d != 0).prop_map(other_expiry),
        1 => Just(refused(format!("expires={expires}&expires={expires}&sig={sig}"))),
        1 => Just(refused(format!("expires={}&sig={}", now - 10, app.state.signer.sign(&id, now - 10)))),
        1 => Just(refused(format!("expires={expires}.0&sig={sig}"))),
        1 => Just(refused(format!("sig={sig}"))),
        3 => ".{0,60}".prop_map(arbitrary),
    ];
    let mut runner = TestRunner::new(config(256));
    runner
        .run(&queries, |(query, valid)| {
            let reply = app.get(&format!("/api/v2/signed/assets/{id}?{query}"), &[]);
            if valid {
                prop_assert_eq!(reply.status, StatusCode::OK, "{}", query);
                prop_assert_eq!(&reply.body[..], &file[..]);
            } else {
                let code = envelope(&reply)?;
                prop_assert_eq!((code.as_str(), reply.status), ("forbidden", StatusCode::FORBIDDEN), "{}", query);
            }
            Ok(())
        })
        .unwrap();
    // The same query for another asset id: forbidden.
    let other = uuid::Uuid::now_v7();
    let reply = app.get(&format!("/api/v2/signed/assets/{other}?expires={expires}&sig={sig}"), &[]);
    assert_eq!(envelope(&reply).unwrap(), "forbidden");
}

// ---------------------------------------------------------------------------
// Multipart uploads
// ---------------------------------------------------------------------------

/// The boundary of the well-formed uploads the helpers send.
const B: &str = "kiln-test-boundary";

/// One part of a multipart body.
#[derive(Debug, Clone)]
struct Part {
    /// `None`: a Content-Disposition without a name.
    name: Option<String>,
    filename: Option<String>,
    content_type: Option<&'static str>,
    body: Vec<u8>,
}

impl Part {
    fn text(name: &str, value: &str) -> Part {
        Part { name: Some(name.into()), filename: None, content_type: None, body: value.as_bytes().to_vec() }
    }
    fn file(bytes: &[u8]) -> Part {
        Part { name: Some("file".into()), filename: Some("a.bin".into()), content_type: Some("application/octet-stream"), body: bytes.to_vec() }
    }
}

/// A multipart body; `bad_headers` replaces the headers of part `i` with garbage.
fn multipart(boundary: &str, parts: &[Part], bad_headers: Option<usize>) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, part) in parts.iter().enumerate() {
        out.extend_from_slice(format!("--{boundary}\r\n").as_bytes());
        if bad_headers == Some(i) {
            out.extend_from_slice(b"Content-Disposition form-data; name=\"x\r\nno colon here\r\n\r\n");
        } else {
            let mut disposition = "Content-Disposition: form-data".to_string();
            if let Some(name) = &part.name {
                disposition += &format!("; name=\"{name}\"");
            }
            if let Some(filename) = &part.filename {
                disposition += &format!("; filename=\"{filename}\"");
            }
            out.extend_from_slice(format!("{disposition}\r\n").as_bytes());
            if let Some(ct) = part.content_type {
                out.extend_from_slice(format!("Content-Type: {ct}\r\n").as_bytes());
            }
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(&part.body);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    out
}

fn upload_request(content_type: Option<String>, body: Vec<u8>) -> Request<Body> {
    let mut request = Request::post("/api/v2/assets");
    if let Some(ct) = content_type {
        request = request.header(header::CONTENT_TYPE, ct);
    }
    request.body(Body::from(body)).unwrap()
}

/// How a generated upload is sent.
#[derive(Debug, Clone)]
enum Framing {
    /// As written, with the boundary the body uses.
    Proper,
    /// Another boundary in the header than in the body.
    OtherBoundary,
    /// `multipart/form-data` without a boundary.
    NoBoundary,
    /// Another media type, or none.
    NotMultipart(Option<&'static str>),
    /// Cut after this many bytes.
    Truncated(prop::sample::Index),
    /// Part `i`'s headers replaced with garbage.
    BadHeaders(prop::sample::Index),
    /// Random bytes instead of the body.
    Garbage(Vec<u8>),
}

#[derive(Debug, Clone)]
struct Upload {
    boundary: String,
    parts: Vec<Part>,
    framing: Framing,
}

/// The bytes of the `file` part, and a hash that is not theirs.
const FILE_BYTES: usize = 2048;
const WRONG_HASH: &str = "blake3:0000000000000000000000000000000000000000000000000000000000000000";

fn part() -> impl Strategy<Value = Part> {
    let text = |name: &'static str, values: Vec<String>| prop::sample::select(values).prop_map(move |v| Part::text(name, &v));
    prop_oneof![
        4 => (prop::collection::vec(any::<u8>(), 0..FILE_BYTES), prop::option::of(".{0,12}".prop_map(|s: String| s.chars().filter(|c| !c.is_control() && *c != '"').collect::<String>())))
            .prop_map(|(bytes, filename)| Part { filename, ..Part::file(&bytes) }),
        4 => text("file_path", ["in/cat.png", "a", "", "/abs", "\\abs", "a/../b", "..", "a\0b", "ok/./x.png", &"x".repeat(1025), "é/ü.png"].map(String::from).to_vec()),
        1 => text("content_type", ["image/png", "", "text/html", "x"].map(String::from).to_vec()),
        1 => text("tags", ["cat", "", "é", "a\u{7}b", &"t".repeat(65), &"t".repeat(64), &"語".repeat(64)].map(String::from).to_vec()),
        1 => text("expires_in", ["60", "59", " 3600 ", "604800", "604801", "-1", "1e3", "", "18446744073709551616"].map(String::from).to_vec()),
        // The right hash is filled in when the body is built.
        1 => text("expected_hash", ["right", "RIGHT", WRONG_HASH, "nonsense"].map(String::from).to_vec()),
        1 => (prop::option::of("[a-z_]{0,10}"), prop::collection::vec(any::<u8>(), 0..300), any::<bool>())
            .prop_map(|(name, body, long)| Part { name, filename: None, content_type: Some("text/plain"), body: if long { vec![b'y'; 4097] } else { body } }),
    ]
}

fn upload() -> impl Strategy<Value = Upload> {
    let framing = prop_oneof![
        12 => Just(Framing::Proper),
        1 => Just(Framing::OtherBoundary),
        1 => Just(Framing::NoBoundary),
        1 => prop::sample::select(vec![Some("application/json"), Some("multipart/mixed; boundary=x"), Some("text/plain"), None]).prop_map(Framing::NotMultipart),
        3 => any::<prop::sample::Index>().prop_map(Framing::Truncated),
        1 => any::<prop::sample::Index>().prop_map(Framing::BadHeaders),
        1 => prop::collection::vec(any::<u8>(), 0..200).prop_map(Framing::Garbage),
    ];
    let many_tags = (0..70).map(|i| Part::text("tags", &format!("t{i}"))).collect::<Vec<_>>();
    let parts = prop_oneof![
        // A valid upload, then with extra parts.
        4 => (prop::collection::vec(any::<u8>(), 0..FILE_BYTES), prop::collection::vec(part(), 0..3)).prop_map(|(bytes, extra)| {
            let mut parts = vec![Part::text("file_path", "in/ok.bin"), Part::file(&bytes)];
            parts.extend(extra);
            parts
        }),
        3 => prop::collection::vec(part(), 0..6),
        1 => prop::collection::vec(any::<u8>(), 0..64).prop_map(move |bytes| {
            let mut parts = many_tags.clone();
            parts.push(Part::text("file_path", "x"));
            parts.push(Part::file(&bytes));
            parts
        }),
    ];
    ("[A-Za-z0-9'_.+-]{1,70}", parts, framing).prop_map(|(boundary, parts, framing)| Upload { boundary, parts, framing })
}

/// What the handler must answer a well-framed upload: the asset (its file
/// bytes and path), or an error code.
fn expected_upload(parts: &[Part]) -> Result<(Vec<u8>, String), &'static str> {
    let mut file: Option<&[u8]> = None;
    let (mut path, mut hash) = (None, None);
    let mut tags: Vec<String> = Vec::new();
    for part in parts {
        let text = String::from_utf8_lossy(&part.body).into_owned();
        match part.name.as_deref().unwrap_or("") {
            "file" if file.is_some() => return Err("invalid_request"),
            "file" => file = Some(&part.body),
            _ if text.len() > 4096 => return Err("invalid_request"),
            "file_path" => path = Some(text),
            "expected_hash" => hash = Some(text),
            "tags" => {
                if text.is_empty() || text.chars().count() > 64 || text.chars().any(char::is_control) || tags.len() == 64 {
                    return Err("invalid_request");
                }
                if !tags.contains(&text) {
                    tags.push(text);
                }
            }
            // A whole number, written as an integer or not (`1e3`).
            "expires_in" => {
                match text.trim().parse::<u64>().ok().or_else(|| text.trim().parse::<f64>().ok().filter(|f| f.fract() == 0.0 && *f >= 0.0).map(|f| f as u64)) {
                    Some(s) if (60..=604_800).contains(&s) => {}
                    _ => return Err("invalid_request"),
                }
            }
            "content_type" => {
                if !(text.is_empty() || text.split_once('/').is_some_and(|(t, s)| !t.is_empty() && !s.is_empty())) {
                    return Err("invalid_request");
                }
            }
            // Any other part.
            _ => return Err("invalid_request"),
        }
    }
    let file = file.ok_or("invalid_request")?;
    let path = path.ok_or("invalid_request")?;
    let path_ok = !path.is_empty()
        && path.chars().count() <= 1024
        && !path.starts_with(['/', '\\'])
        && !path.split(['/', '\\']).any(|s| s == "..")
        && !path.contains('\0');
    if !path_ok {
        return Err("invalid_request");
    }
    let actual = format!("blake3:{}", blake3::hash(file).to_hex());
    if hash.is_some_and(|h| !h.eq_ignore_ascii_case(&actual)) {
        return Err("hash_mismatch");
    }
    Ok((file.to_vec(), path))
}

/// Any multipart body — malformed, truncated, with missing, repeated or
/// unknown parts — is stored exactly as sent or refused with the envelope
/// and a 4xx status.
#[test]
fn any_upload_is_stored_whole_or_refused_with_the_envelope() {
    let app = App::start();
    // Statuses seen: the generator must produce both outcomes.
    let statuses: parking_lot::Mutex<std::collections::BTreeMap<u16, usize>> = Default::default();
    // Uploads stored so far: hash → (asset id, file path).
    let stored: parking_lot::Mutex<std::collections::HashMap<String, (String, String)>> = Default::default();
    let mut runner = TestRunner::new(config(256));
    runner
        .run(&upload(), |upload| {
            let Upload { boundary, mut parts, framing } = upload;
            // The expected hash of the first file part, where asked.
            let right = parts.iter().find(|p| p.name.as_deref() == Some("file")).map(|p| format!("blake3:{}", blake3::hash(&p.body).to_hex()));
            for p in parts.iter_mut().filter(|p| p.name.as_deref() == Some("expected_hash")) {
                match (&p.body[..], &right) {
                    (b"right", Some(h)) => p.body = h.clone().into_bytes(),
                    (b"RIGHT", Some(h)) => p.body = h.to_ascii_uppercase().into_bytes(),
                    _ => {}
                }
            }
            let delimiter = format!("\r\n--{boundary}");
            let ambiguous = parts.iter().any(|p| p.body.windows(delimiter.len()).any(|w| w == delimiter.as_bytes()));
            let proper = format!("multipart/form-data; boundary={boundary}");
            let bad_headers = match &framing {
                Framing::BadHeaders(i) if !parts.is_empty() => Some(i.index(parts.len())),
                _ => None,
            };
            let body = multipart(&boundary, &parts, bad_headers);
            let full_len = body.len();
            let (content_type, body) = match &framing {
                Framing::Proper | Framing::BadHeaders(_) => (Some(proper), body),
                Framing::OtherBoundary => (Some(format!("multipart/form-data; boundary=x{boundary}")), body),
                Framing::NoBoundary => (Some("multipart/form-data".into()), body),
                Framing::NotMultipart(ct) => (ct.map(String::from), body),
                Framing::Truncated(at) => (Some(proper), body[..at.index(body.len())].to_vec()),
                Framing::Garbage(bytes) => (Some(proper), bytes.clone()),
            };
            // What the handler must do: exactly the reference's answer for a
            // well-framed body; for a cut one, the reference's answer or a
            // refusal (a cut within the closing delimiter may still parse);
            // anything else is refused.
            let cut_in_closing = matches!(framing, Framing::Truncated(_)) && body.len() + format!("--{boundary}--\r\n").len() > full_len;
            let want = expected_upload(&parts);
            let reply = app.call(upload_request(content_type, body));
            *statuses.lock().entry(reply.status.as_u16()).or_default() += 1;
            let exact = matches!(framing, Framing::Proper) || (matches!(framing, Framing::BadHeaders(_)) && bad_headers.is_none());
            let unframed =
                matches!(framing, Framing::BadHeaders(_) | Framing::Garbage(_) | Framing::OtherBoundary | Framing::NoBoundary | Framing::NotMultipart(_))
                    && !exact;
            if reply.status.is_success() {
                let (file, path) = want.map_err(|code| TestCaseError::fail(format!("stored an upload that must fail with {code}")))?;
                prop_assert!(!unframed && (exact || cut_in_closing || ambiguous), "stored a malformed upload ({:?})", framing);
                let asset: Json = serde_json::from_slice(&reply.body).map_err(|e| TestCaseError::fail(format!("{e}")))?;
                prop_assert_eq!(asset["size_bytes"].as_u64(), Some(file.len() as u64));
                let hash = format!("blake3:{}", blake3::hash(&file).to_hex());
                prop_assert_eq!(asset["hash"].as_str(), Some(hash.as_str()));
                let (id, file_path) = (asset["id"].as_str().unwrap_or("").to_string(), asset["file_path"].as_str().unwrap_or("").to_string());
                // New bytes: a new asset named as sent; known bytes: the
                // asset that has them (its name kept).
                match stored.lock().entry(hash) {
                    std::collections::hash_map::Entry::Vacant(new) => {
                        prop_assert_eq!((reply.status, asset["created_new"].as_bool()), (StatusCode::CREATED, Some(true)));
                        prop_assert_eq!(&file_path, &path);
                        new.insert((id, file_path));
                    }
                    std::collections::hash_map::Entry::Occupied(known) => {
                        prop_assert_eq!((reply.status, asset["created_new"].as_bool()), (StatusCode::OK, Some(false)));
                        prop_assert_eq!(known.get(), &(id, file_path));
                    }
                }
            } else {
                let code = envelope(&reply)?;
                if exact && !ambiguous {
                    prop_assert_eq!(Err(code.as_str()), want.map(|_| ()), "{:?}", framing);
                } else {
                    prop_assert!(code == "invalid_request" || want.as_ref().err() == Some(&code.as_str()), "{}", code);
                }
            }
            Ok(())
        })
        .unwrap();
    let statuses = statuses.into_inner();
    assert!(statuses.get(&201).is_some_and(|&n| n > 0) && statuses.get(&400).is_some_and(|&n| n > 0), "{statuses:?}");
}

// ---------------------------------------------------------------------------
// The compatibility routes
// ---------------------------------------------------------------------------

/// Any JSON value, a few levels deep, with the keys the routes look at.
fn json_value() -> impl Strategy<Value = Json> {
    let leaf = prop_oneof![
        Just(Json::Null),
        any::<bool>().prop_map(Json::Bool),
        any::<i64>().prop_map(Json::from),
        any::<f64>().prop_filter_map("finite", |f| serde_json::Number::from_f64(f).map(Json::Number)),
        "[a-zA-Z0-9 ._/\\\\\\[\\]-]{0,16}".prop_map(Json::String),
        Just(Json::String(uuid::Uuid::new_v4().to_string())),
    ];
    let key = "prompt|delete|clear|number|front|prompt_id|client_id|extra_data|api_key_svc_org|job_ids|class_type|inputs|image|1|2|[a-z_]{1,8}";
    leaf.prop_recursive(4, 32, 5, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Json::Array),
            prop::collection::btree_map(key, inner, 0..5).prop_map(|m| Json::Object(m.into_iter().collect())),
        ]
    })
}

/// Whatever JSON (or non-JSON) a client posts to a compatibility route, and
/// whatever query it sends, the answer is not a 5xx (and nothing panics).
#[test]
fn any_body_or_query_on_the_compat_routes_is_answered_without_a_5xx() {
    let app = App::start();
    let posts = ["/api/prompt", "/prompt", "/api/queue", "/history", "/interrupt", "/api/jobs/cancel", "/api/free"];
    let gets = ["/api/view", "/view", "/api/history", "/api/jobs", "/api/object_info", "/api/prompt"];
    let mut runner = TestRunner::new(config(256));
    runner
        .run(&(json_value(), 0..posts.len(), any::<bool>()), |(body, route, raw)| {
            let bytes = if raw { body.to_string().into_bytes().into_iter().rev().collect::<Vec<u8>>() } else { body.to_string().into_bytes() };
            let request = Request::post(posts[route]).header(header::CONTENT_TYPE, "application/json").body(Body::from(bytes)).unwrap();
            let reply = app.call(request);
            prop_assert!(!reply.status.is_server_error(), "POST {} {} → {} {}", posts[route], body, reply.status, String::from_utf8_lossy(&reply.body));
            Ok(())
        })
        .unwrap();
    let query = prop::collection::vec(("filename|subfolder|type|max_items|offset|status|limit|sort_by|[a-z]{1,5}", "[a-zA-Z0-9 ._/\\\\%-]{0,12}"), 0..4);
    runner
        .run(&(query, 0..gets.len()), |(pairs, route)| {
            let q: Vec<String> = pairs.iter().map(|(k, v)| format!("{k}={}", encode(v))).collect();
            let uri = format!("{}?{}", gets[route], q.join("&"));
            let reply = app.get(&uri, &[]);
            prop_assert!(!reply.status.is_server_error(), "GET {} → {} {}", uri, reply.status, String::from_utf8_lossy(&reply.body));
            Ok(())
        })
        .unwrap();
}
