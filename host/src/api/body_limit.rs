//! Request body limits, in one place. Each route group states its limit
//! once with [`BodyLimit`]; the layer
//!
//! - refuses a request whose declared `Content-Length` is over the limit
//!   before a byte of the body is read: the answer goes out at once, with
//!   `Connection: close`, and a client that sent `Expect: 100-continue`
//!   never gets its `100` (hyper sends it only when the body is first
//!   read), so it never sends the body either;
//! - sets the same number as axum's body limit ([`DefaultBodyLimit`]) for
//!   what the handler reads, which cuts a body sent without a length, or
//!   longer than it declared.
//!
//! The limits: the Jobs API's and the compatibility API's JSON routes
//! `max_workflow_kb` (the settings routes `max_settings_kb` if larger),
//! uploads `max_upload_mb` (+1 MiB of multipart framing), user data files
//! `max_userdata_file_kb`, plugin routes `route_max_body_mb`, the admin API
//! 64 KiB. Over it: 413 `payload_too_large` in the envelope, or the
//! route's own answer where its contract has one (`POST /api/v2/jobs`:
//! 422 `invalid_workflow` naming `max_workflow_kb`; `/proxy/`: the proxy's
//! `{error, message}`).

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;

/// A route group's body limit and how it refuses a larger body.
#[derive(Clone, Copy)]
pub struct BodyLimit {
    max: usize,
    refuse: fn(usize) -> Response,
}

impl BodyLimit {
    /// At most `max` bytes; beyond, 413 `payload_too_large`.
    pub fn new(max: usize) -> BodyLimit {
        BodyLimit { max, refuse: |max| ApiError::payload_too_large(max as u64).into_response() }
    }

    /// At most `max` bytes; beyond, `refuse(max)`.
    pub fn refusing(max: usize, refuse: fn(usize) -> Response) -> BodyLimit {
        BodyLimit { max, refuse }
    }

    /// The most bytes a body may have.
    pub fn max(&self) -> usize {
        self.max
    }

    /// `router` with this limit on each of its routes (those added so far).
    pub fn on<S: Clone + Send + Sync + 'static>(self, router: Router<S>) -> Router<S> {
        router.route_layer(axum::middleware::from_fn_with_state(self, check))
    }

    /// The answer to a request declaring `Content-Length`, if it is over.
    fn refuse_declared(&self, request: &Request) -> Option<Response> {
        let declared = request.headers().get(header::CONTENT_LENGTH)?.to_str().ok()?.trim().parse::<u64>().ok()?;
        if declared <= self.max as u64 {
            return None;
        }
        let mut response = (self.refuse)(self.max);
        // The body stays unread: the connection cannot carry another request.
        response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
        Some(response)
    }
}

async fn check(State(limit): State<BodyLimit>, mut request: Request, next: Next) -> Response {
    if let Some(refused) = limit.refuse_declared(&request) {
        return refused;
    }
    DefaultBodyLimit::max(limit.max).apply(&mut request);
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::{Body, Bytes};
    use axum::http::StatusCode;
    use tower::ServiceExt;

    fn app() -> Router {
        let limited = BodyLimit::new(8).on(Router::new().route("/small", axum::routing::post(|body: Bytes| async move { body.len().to_string() })));
        let other = BodyLimit::refusing(16, |_| StatusCode::IM_A_TEAPOT.into_response())
            .on(Router::new().route("/own", axum::routing::post(|body: Bytes| async move { body.len().to_string() })));
        limited.merge(other)
    }

    async fn post(path: &str, declared: Option<&str>, body: &'static [u8]) -> (StatusCode, Option<String>, String) {
        let mut request = axum::http::Request::post(path);
        if let Some(length) = declared {
            request = request.header(header::CONTENT_LENGTH, length);
        }
        let response = app().oneshot(request.body(Body::from(body)).unwrap()).await.unwrap();
        let connection = response.headers().get(header::CONNECTION).map(|v| v.to_str().unwrap().to_string());
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), 1 << 16).await.unwrap();
        (status, connection, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn a_declared_length_over_the_limit_is_refused_before_the_body_and_one_without_is_cut_while_read() {
        assert_eq!(post("/small", Some("8"), b"12345678").await, (StatusCode::OK, None, "8".into()));
        let (status, connection, body) = post("/small", Some("9"), b"").await;
        assert_eq!((status, connection.as_deref()), (StatusCode::PAYLOAD_TOO_LARGE, Some("close")));
        assert!(body.contains("payload_too_large") && body.contains("exceeds 8 bytes"), "{body}");
        // No declared length: the same limit applies to what is read.
        let (status, _, body) = post("/small", None, b"123456789").await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{body}");
        // A route's own refusal, and its own limit.
        assert_eq!(post("/own", Some("17"), b"").await.0, StatusCode::IM_A_TEAPOT);
        assert_eq!(post("/own", Some("16"), b"0123456789abcdef").await.0, StatusCode::OK);
    }
}
