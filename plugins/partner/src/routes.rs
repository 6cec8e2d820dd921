//! The partner proxy's routes, served through `wasi:http/incoming-handler`:
//!
//! - `POST /proxy/partner/v1/ai/skin-enhancer/flexible`: create a task;
//! - `GET /proxy/partner/v1/ai/skin-enhancer/{task_id}`: its status.
//!
//! Both take `Authorization: Bearer <token>` or `X-API-KEY: <token>`.
//! kiln bounds the request body before it gets here.

use wasip2::http::types::{Fields, IncomingRequest, Method, OutgoingBody, OutgoingResponse, ResponseOutparam};
use wasip2::io::streams::StreamError;

use crate::proxy::{self, Answer};
use crate::settings::Settings;

const PREFIX: &str = "/proxy/partner/v1/ai/skin-enhancer/";
/// Largest request body read (kiln's own limit is usually lower).
const MAX_BODY: usize = 256 << 20;

/// The exported incoming handler.
pub struct Routes;

impl wasip2::exports::http::incoming_handler::Guest for Routes {
    fn handle(request: IncomingRequest, out: ResponseOutparam) {
        let answer = answer(&request);
        respond(out, &answer);
    }
}

/// The answer to one request.
fn answer(request: &IncomingRequest) -> Answer {
    let path_and_query = request.path_with_query().unwrap_or_default();
    let path = path_and_query.split('?').next().unwrap_or("");
    let Some(rest) = path.strip_prefix(PREFIX).filter(|r| !r.is_empty() && !r.contains('/')) else {
        return Answer::error(404, "not_found", "No such partner route.");
    };
    let allowed = match rest {
        "flexible" => matches!(request.method(), Method::Post),
        _ => matches!(request.method(), Method::Get),
    };
    if !allowed {
        return Answer::error(405, "method_not_allowed", "This route does not accept that method.");
    }
    let settings = Settings::load();
    let base = match proxy::admit(&settings, token(request).as_deref()) {
        Ok(base) => base.to_string(),
        Err(answer) => return answer,
    };
    if rest == "flexible" {
        match read_body(request) {
            Some(body) => proxy::create(&settings, &base, &body),
            None => Answer::error(400, "invalid_request", "The request body could not be read."),
        }
    } else {
        proxy::status(&settings, &base, rest)
    }
}

/// The caller's token: `Authorization: Bearer <t>` or `X-API-KEY: <t>`.
fn token(request: &IncomingRequest) -> Option<String> {
    let headers = request.headers();
    let first = |name: &str| headers.get(name).into_iter().next().and_then(|v| String::from_utf8(v).ok());
    let bearer = first("authorization").and_then(|v| {
        let (scheme, token) = v.trim().split_once(' ')?;
        scheme.eq_ignore_ascii_case("bearer").then(|| token.trim().to_string())
    });
    bearer.or_else(|| first("x-api-key").map(|v| v.trim().to_string())).filter(|t| !t.is_empty())
}

fn read_body(request: &IncomingRequest) -> Option<Vec<u8>> {
    let body = request.consume().ok()?;
    let stream = body.stream().ok()?;
    let mut data = Vec::new();
    loop {
        match stream.blocking_read(64 << 10) {
            Ok(chunk) if data.len() + chunk.len() <= MAX_BODY => data.extend_from_slice(&chunk),
            Ok(_) => return None,
            Err(StreamError::Closed) => break,
            Err(StreamError::LastOperationFailed(_)) => return None,
        }
    }
    drop(stream);
    Some(data)
}

fn respond(out: ResponseOutparam, answer: &Answer) {
    let headers = Fields::from_list(&[("content-type".to_string(), b"application/json".to_vec())]).unwrap_or_else(|_| Fields::new());
    let response = OutgoingResponse::new(headers);
    // Every status used here is valid.
    let _ = response.set_status_code(answer.status);
    let Ok(body) = response.body() else { return };
    ResponseOutparam::set(out, Ok(response));
    let bytes = answer.body.to_string();
    if let Ok(stream) = body.write() {
        for chunk in bytes.as_bytes().chunks(4096) {
            if stream.blocking_write_and_flush(chunk).is_err() {
                return;
            }
        }
        drop(stream);
    }
    let _ = OutgoingBody::finish(body, None);
}
