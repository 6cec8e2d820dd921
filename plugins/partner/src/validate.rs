//! The create route's request rules (one home for them: the route and the
//! node both go through [`flexible_body`]).

use base64::Engine;
use serde_json::{Map, Value};

/// The values `optimized_for` may take.
pub const OPTIMIZED_FOR: [&str; 5] = ["enhance_skin", "improve_lighting", "enhance_everything", "transform_to_real", "no_make_up"];

const FIELDS: [&str; 5] = ["image", "optimized_for", "sharpen", "smart_grain", "webhook_url"];

/// Checks a create request's JSON body and returns the body to forward,
/// defaults filled in; `Err` is the 400 message.
pub fn flexible_body(body: &[u8]) -> Result<Value, String> {
    let value: Value = serde_json::from_slice(body).map_err(|_| "The request body must be a JSON object.".to_string())?;
    let Value::Object(fields) = value else { return Err("The request body must be a JSON object.".into()) };
    if let Some(unknown) = fields.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(format!("Unknown field `{}`; accepted fields: {}.", shorten(unknown), FIELDS.join(", ")));
    }
    let mut out = Map::new();
    out.insert("image".into(), Value::String(image(fields.get("image"))?));
    let optimized_for = match fields.get("optimized_for") {
        None | Some(Value::Null) => "enhance_skin".to_string(),
        Some(Value::String(s)) if OPTIMIZED_FOR.contains(&s.as_str()) => s.clone(),
        Some(_) => return Err(format!("`optimized_for` must be one of {}.", OPTIMIZED_FOR.join(", "))),
    };
    out.insert("optimized_for".into(), Value::String(optimized_for));
    out.insert("sharpen".into(), percent("sharpen", fields.get("sharpen"), 0)?);
    out.insert("smart_grain".into(), percent("smart_grain", fields.get("smart_grain"), 2)?);
    match fields.get("webhook_url") {
        None | Some(Value::Null) => {}
        Some(Value::String(url)) if is_absolute_http_url(url) => {
            out.insert("webhook_url".into(), Value::String(url.clone()));
        }
        Some(_) => return Err("`webhook_url` must be an absolute http:// or https:// URL.".into()),
    }
    Ok(Value::Object(out))
}

/// `image`: base64 data or an `https://` URL.
fn image(value: Option<&Value>) -> Result<String, String> {
    let Some(value) = value.filter(|v| !v.is_null()) else { return Err("`image` is required.".into()) };
    let Value::String(image) = value else { return Err("`image` must be a string: base64 data or an https:// URL.".into()) };
    if let Some(rest) = image.strip_prefix("https://") {
        return match url_host(rest) {
            true => Ok(image.clone()),
            false => Err("`image` is not a valid https:// URL.".into()),
        };
    }
    if image.contains("://") {
        return Err("`image` URLs must use https://.".into());
    }
    let decoded = base64::engine::general_purpose::STANDARD.decode(image.as_bytes());
    match decoded {
        Ok(bytes) if !bytes.is_empty() => Ok(image.clone()),
        _ => Err("`image` must be base64 data or an https:// URL.".into()),
    }
}

/// A number in 0..=100, or `default` when absent.
fn percent(name: &str, value: Option<&Value>, default: i64) -> Result<Value, String> {
    match value {
        None | Some(Value::Null) => Ok(Value::from(default)),
        Some(Value::Number(n)) => match n.as_f64() {
            Some(f) if (0.0..=100.0).contains(&f) => Ok(Value::Number(n.clone())),
            _ => Err(format!("`{name}` must be a number from 0 to 100.")),
        },
        Some(_) => Err(format!("`{name}` must be a number from 0 to 100.")),
    }
}

fn is_absolute_http_url(url: &str) -> bool {
    let rest = url.strip_prefix("https://").or_else(|| url.strip_prefix("http://"));
    rest.is_some_and(url_host) && url.len() <= 2048 && !url.chars().any(|c| c.is_whitespace() || c.is_control())
}

/// Whether `rest` (a URL after its `scheme://`) starts with a plausible host.
fn url_host(rest: &str) -> bool {
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let host = host.strip_prefix('[').map_or_else(|| host.split(':').next().unwrap_or(""), |v6| v6.split(']').next().unwrap_or(""));
    !host.is_empty() && host.chars().all(|c| c.is_ascii_alphanumeric() || "-.:".contains(c)) && !rest.chars().any(char::is_whitespace)
}

/// A client-chosen name, cut for an error message.
fn shorten(s: &str) -> String {
    s.chars().take(64).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(body: &str) -> Result<Value, String> {
        flexible_body(body.as_bytes())
    }

    #[test]
    fn defaults_are_filled_in() {
        let v = check(r#"{"image":"aGVsbG8="}"#).unwrap();
        assert_eq!(v, serde_json::json!({"image":"aGVsbG8=","optimized_for":"enhance_skin","sharpen":0,"smart_grain":2}));
        let v = check(
            r#"{"image":"https://cdn.example.com/a.png","optimized_for":"no_make_up","sharpen":100,"smart_grain":0,"webhook_url":"http://h.example/cb"}"#,
        )
        .unwrap();
        assert_eq!(v["webhook_url"], "http://h.example/cb");
        assert_eq!(v["sharpen"], 100);
    }

    #[test]
    fn every_rule_refuses() {
        for (body, says) in [
            ("[]", "JSON object"),
            ("nope", "JSON object"),
            (r#"{}"#, "`image` is required"),
            (r#"{"image":null}"#, "`image` is required"),
            (r#"{"image":5}"#, "must be a string"),
            (r#"{"image":"http://x.com/a.png"}"#, "https://"),
            (r#"{"image":"https://"}"#, "valid https"),
            (r#"{"image":"not base64!"}"#, "base64"),
            (r#"{"image":""}"#, "base64"),
            (r#"{"image":"aGVsbG8=","optimized_for":"other"}"#, "optimized_for"),
            (r#"{"image":"aGVsbG8=","sharpen":101}"#, "sharpen"),
            (r#"{"image":"aGVsbG8=","sharpen":-1}"#, "sharpen"),
            (r#"{"image":"aGVsbG8=","smart_grain":"2"}"#, "smart_grain"),
            (r#"{"image":"aGVsbG8=","webhook_url":"ftp://x"}"#, "webhook_url"),
            (r#"{"image":"aGVsbG8=","webhook_url":"/relative"}"#, "webhook_url"),
            (r#"{"image":"aGVsbG8=","mode":"creative"}"#, "Unknown field `mode`"),
        ] {
            let err = check(body).unwrap_err();
            assert!(err.contains(says), "{body}: {err}");
        }
    }
}
