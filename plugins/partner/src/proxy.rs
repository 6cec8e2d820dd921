//! The partner proxy's operations, as the routes and the node share them:
//! authorize a caller, create a skin-enhancer task, read a task's status.
//! Every answer is an HTTP status and a JSON body: the provider's task
//! record on success, `{error, message}` otherwise, with no internal detail
//! (a provider's own 4xx is passed on with its message).

use serde_json::{Value, json};
use wasip2::http::types::Method;

use crate::provider::{self, ProviderError, Reply};
use crate::settings::Settings;
use crate::validate;

/// Largest provider answer read (a task record is a few hundred bytes).
const MAX_PROVIDER_ANSWER: usize = 1 << 20;
/// Longest provider message passed on.
const MAX_MESSAGE_CHARS: usize = 1000;

/// An HTTP status and JSON body.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub status: u16,
    pub body: Value,
}

impl Answer {
    /// `{error, message}` with `status`.
    pub fn error(status: u16, error: &str, message: &str) -> Answer {
        Answer { status, body: json!({ "error": error, "message": message }) }
    }

    /// The `message` of an error answer.
    pub fn message(&self) -> &str {
        self.body.get("message").and_then(Value::as_str).unwrap_or("")
    }
}

/// 503 when the proxy has no provider, 401 unless `token` is accepted.
pub fn admit<'a>(settings: &'a Settings, token: Option<&str>) -> Result<&'a str, Answer> {
    let Some(base) = settings.base_url.as_deref() else {
        return Err(Answer::error(503, "not_configured", "The partner proxy is not configured on this server (KILN_PARTNER_BASE_URL is unset)."));
    };
    match token {
        None => Err(Answer::error(401, "unauthorized", "Missing credentials: send Authorization: Bearer <token> or X-API-KEY: <token>.")),
        Some(t) if settings.accepts(t) => Ok(base),
        Some(_) => Err(Answer::error(401, "unauthorized", "The token is not valid for this proxy.")),
    }
}

/// Validates a create request and forwards it to the provider.
pub fn create(settings: &Settings, base: &str, body: &[u8]) -> Answer {
    let forward = match validate::flexible_body(body) {
        Ok(forward) => forward,
        Err(message) => return Answer::error(400, "invalid_request", &message),
    };
    let body = forward.to_string();
    let url = format!("{base}/v1/ai/skin-enhancer/flexible");
    let reply = provider::send(Method::Post, &url, &provider_headers(settings, true), Some(body.as_bytes()), MAX_PROVIDER_ANSWER);
    redacted(task_answer(reply, false), settings)
}

/// The status and results of task `task_id`.
pub fn status(settings: &Settings, base: &str, task_id: &str) -> Answer {
    let id_ok = !task_id.is_empty() && task_id.len() <= 128 && task_id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if !id_ok {
        return Answer::error(404, "not_found", "Task not found.");
    }
    let url = format!("{base}/v1/ai/skin-enhancer/{task_id}");
    let reply = provider::send(Method::Get, &url, &provider_headers(settings, false), None, MAX_PROVIDER_ANSWER);
    redacted(task_answer(reply, true), settings)
}

/// `answer` without the provider key in its message (providers may echo it).
fn redacted(mut answer: Answer, settings: &Settings) -> Answer {
    if let (Some(key), Some(Value::String(message))) = (settings.api_key.as_deref().filter(|k| !k.is_empty()), answer.body.get_mut("message"))
        && message.contains(key)
    {
        *message = message.replace(key, "[redacted]");
    }
    answer
}

fn provider_headers(settings: &Settings, json_body: bool) -> Vec<(&'static str, &str)> {
    let mut headers = vec![("accept", "application/json")];
    if json_body {
        headers.push(("content-type", "application/json"));
    }
    if let Some(key) = settings.api_key.as_deref() {
        headers.push(("x-freepik-api-key", key));
    }
    headers
}

/// Maps the provider's reply (or failure) to the proxy's answer.
fn task_answer(reply: Result<Reply, ProviderError>, is_status: bool) -> Answer {
    let reply = match reply {
        Ok(reply) => reply,
        Err(ProviderError::Timeout) => return Answer::error(504, "gateway_timeout", "The provider did not answer in time."),
        Err(ProviderError::TooLarge) => return Answer::error(502, "bad_gateway", "The provider's answer was not valid."),
        Err(ProviderError::Unreachable(_)) => return Answer::error(502, "bad_gateway", "The provider could not be reached."),
    };
    match reply.status {
        200..=299 => match task_record(&reply.body) {
            Some(record) => Answer { status: 200, body: record },
            None => Answer::error(502, "bad_gateway", "The provider's answer was not valid."),
        },
        404 if is_status => Answer::error(404, "not_found", "Task not found."),
        status @ 400..=499 => Answer::error(status, client_error_name(status), &provider_message(&reply.body).unwrap_or_else(|| default_message(status))),
        _ => Answer::error(502, "bad_gateway", "The provider failed to handle the request."),
    }
}

/// `{data: {task_id, status, generated}}` from a provider answer (the
/// `data` envelope optional, `task_status` accepted for `status`).
pub fn task_record(body: &[u8]) -> Option<Value> {
    let value: Value = serde_json::from_slice(body).ok()?;
    let data = value.get("data").unwrap_or(&value);
    let task_id = data.get("task_id")?.as_str()?;
    let status = data.get("status").or_else(|| data.get("task_status"))?.as_str()?;
    let generated = match data.get("generated") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => items.iter().map(|v| v.as_str().map(String::from)).collect::<Option<Vec<_>>>()?,
        Some(_) => return None,
    };
    Some(json!({ "data": { "task_id": task_id, "status": status, "generated": generated } }))
}

fn provider_message(body: &[u8]) -> Option<String> {
    let value: Value = serde_json::from_slice(body).ok()?;
    let message = value.get("message").or_else(|| value.get("detail")).or_else(|| value.get("error"))?.as_str()?;
    Some(message.chars().take(MAX_MESSAGE_CHARS).collect())
}

fn client_error_name(status: u16) -> &'static str {
    match status {
        400 | 422 => "invalid_request",
        401 => "unauthorized",
        402 => "insufficient_funds",
        403 => "forbidden",
        404 => "not_found",
        409 => "conflict",
        429 => "rate_limited",
        _ => "provider_error",
    }
}

fn default_message(status: u16) -> String {
    format!("The provider refused the request (HTTP {status}).")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(status: u16, body: &str) -> Result<Reply, ProviderError> {
        Ok(Reply { status, body: body.as_bytes().to_vec() })
    }

    #[test]
    fn provider_answers_map_to_proxy_answers() {
        let ok = task_answer(reply(200, r#"{"data":{"task_id":"t1","status":"CREATED","generated":[],"extra":1}}"#), false);
        assert_eq!(ok, Answer { status: 200, body: json!({"data":{"task_id":"t1","status":"CREATED","generated":[]}}) });
        assert_eq!(task_answer(reply(200, "<html>"), false).status, 502);
        assert_eq!(task_answer(reply(200, r#"{"data":{"status":"CREATED"}}"#), false).status, 502);
        let paid = task_answer(reply(402, r#"{"message":"Not enough credits"}"#), false);
        assert_eq!((paid.status, paid.message()), (402, "Not enough credits"));
        assert_eq!(task_answer(reply(404, "{}"), true).status, 404);
        let bad = task_answer(reply(400, r#"{"message":"image too small"}"#), false);
        assert_eq!((bad.status, bad.message()), (400, "image too small"));
        let failed = task_answer(reply(503, r#"{"message":"internal db host 10.0.0.3 down"}"#), false);
        assert_eq!(failed.status, 502);
        assert!(!failed.message().contains("10.0.0.3"), "no internal detail");
        assert_eq!(task_answer(Err(ProviderError::Timeout), false).status, 504);
        assert_eq!(task_answer(Err(ProviderError::Unreachable("x".into())), false).status, 502);
    }

    #[test]
    fn the_provider_key_never_appears_in_a_message() {
        let settings = Settings { base_url: None, api_key: Some("pk-123".into()), tokens: vec![] };
        let answer = redacted(task_answer(reply(401, r#"{"message":"Invalid API key pk-123"}"#), false), &settings);
        assert_eq!((answer.status, answer.message()), (401, "Invalid API key [redacted]"));
    }

    #[test]
    fn admission_needs_a_provider_and_a_token() {
        let mut s = Settings { base_url: None, api_key: None, tokens: vec!["t".into()] };
        assert_eq!(admit(&s, Some("t")).unwrap_err().status, 503);
        s.base_url = Some("http://p".into());
        assert_eq!(admit(&s, None).unwrap_err().status, 401);
        assert_eq!(admit(&s, Some("u")).unwrap_err().status, 401);
        assert_eq!(admit(&s, Some("t")), Ok("http://p"));
    }
}
