//! HTTP to the provider (and to the hosts it serves results from) through
//! `wasi:http/outgoing-handler`. kiln decides where a request may go (its
//! allowlist) and caps the timeouts and the response size; this module
//! asks for its own, shorter limits and reads at most `max` bytes.

use wasip2::http::outgoing_handler;
use wasip2::http::types::{ErrorCode, Fields, Method, OutgoingBody, OutgoingRequest, RequestOptions, Scheme};
use wasip2::io::streams::StreamError;

/// Connect timeout asked for (kiln may cap it lower).
const CONNECT_TIMEOUT_NS: u64 = 10_000_000_000;
/// First-byte and between-bytes timeout asked for.
const FIRST_BYTE_TIMEOUT_NS: u64 = 60_000_000_000;

/// Why the provider gave no usable answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProviderError {
    /// Refused by kiln's allowlist, connection failed, or the connection broke.
    Unreachable(String),
    /// No answer in time.
    Timeout,
    /// An answer larger than allowed.
    TooLarge,
}

/// A provider's answer.
pub struct Reply {
    pub status: u16,
    pub body: Vec<u8>,
}

/// Sends `method url` with `headers` and `body`; reads at most `max` bytes.
pub fn send(method: Method, url: &str, headers: &[(&str, &str)], body: Option<&[u8]>, max: usize) -> Result<Reply, ProviderError> {
    let (scheme, authority, path) = split_url(url).ok_or_else(|| ProviderError::Unreachable("not an http(s) URL".into()))?;
    let list: Vec<(String, Vec<u8>)> = headers.iter().map(|(k, v)| (k.to_string(), v.as_bytes().to_vec())).collect();
    let fields = Fields::from_list(&list).map_err(|e| ProviderError::Unreachable(format!("bad header: {e:?}")))?;
    let request = OutgoingRequest::new(fields);
    let bad = |what: &str| ProviderError::Unreachable(format!("bad {what}"));
    request.set_method(&method).map_err(|_| bad("method"))?;
    request.set_scheme(Some(&scheme)).map_err(|_| bad("scheme"))?;
    request.set_authority(Some(authority)).map_err(|_| bad("authority"))?;
    request.set_path_with_query(Some(path)).map_err(|_| bad("path"))?;
    let outgoing = request.body().map_err(|_| bad("body"))?;
    let options = RequestOptions::new();
    // Refusals only mean the host keeps its own (lower) limits.
    let _ = options.set_connect_timeout(Some(CONNECT_TIMEOUT_NS));
    let _ = options.set_first_byte_timeout(Some(FIRST_BYTE_TIMEOUT_NS));
    let _ = options.set_between_bytes_timeout(Some(FIRST_BYTE_TIMEOUT_NS));
    // Sent first, so the body streams out while it is written.
    let pending = outgoing_handler::handle(request, Some(options)).map_err(map_code)?;
    if let Some(body) = body {
        let stream = outgoing.write().map_err(|_| bad("body"))?;
        for chunk in body.chunks(4096) {
            // A broken connection shows in the response below.
            if stream.blocking_write_and_flush(chunk).is_err() {
                break;
            }
        }
        drop(stream);
    }
    OutgoingBody::finish(outgoing, None).map_err(map_code)?;
    pending.subscribe().block();
    let response = match pending.get() {
        Some(Ok(Ok(response))) => response,
        Some(Ok(Err(code))) => return Err(map_code(code)),
        Some(Err(())) | None => return Err(ProviderError::Unreachable("no response".into())),
    };
    let status = response.status();
    let incoming = response.consume().map_err(|_| bad("response body"))?;
    let stream = incoming.stream().map_err(|_| bad("response body"))?;
    let mut data = Vec::new();
    loop {
        match stream.blocking_read(64 << 10) {
            Ok(chunk) => {
                if data.len() + chunk.len() > max {
                    return Err(ProviderError::TooLarge);
                }
                data.extend_from_slice(&chunk);
            }
            Err(StreamError::Closed) => break,
            Err(StreamError::LastOperationFailed(e)) => {
                return Err(match wasip2::http::types::http_error_code(&e) {
                    Some(code) => map_code(code),
                    None => ProviderError::Unreachable("the response broke off".into()),
                });
            }
        }
    }
    drop(stream);
    Ok(Reply { status, body: data })
}

fn map_code(code: ErrorCode) -> ProviderError {
    match code {
        ErrorCode::ConnectionTimeout | ErrorCode::ConnectionReadTimeout | ErrorCode::HttpResponseTimeout | ErrorCode::DnsTimeout => ProviderError::Timeout,
        ErrorCode::HttpResponseBodySize(_) => ProviderError::TooLarge,
        other => ProviderError::Unreachable(format!("{other:?}")),
    }
}

/// `(scheme, authority, path?query)` of an http(s) URL.
fn split_url(url: &str) -> Option<(Scheme, &str, &str)> {
    let (scheme, rest) = match url.split_once("://")? {
        ("https", rest) => (Scheme::Https, rest),
        ("http", rest) => (Scheme::Http, rest),
        _ => return None,
    };
    let at = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(at);
    if authority.is_empty() || authority.contains('@') {
        return None;
    }
    Some((scheme, authority, if path.is_empty() { "/" } else { path }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_split() {
        let (s, a, p) = split_url("http://127.0.0.1:9/v1/x?y=1").unwrap();
        assert!(matches!(s, Scheme::Http));
        assert_eq!((a, p), ("127.0.0.1:9", "/v1/x?y=1"));
        assert_eq!(split_url("https://cdn.example.com").map(|(_, a, p)| (a, p)), Some(("cdn.example.com", "/")));
        assert!(split_url("ftp://x/").is_none());
        assert!(split_url("http://user@x/").is_none());
    }
}
