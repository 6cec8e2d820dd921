//! Where a response's links point: the request origin (scheme and host,
//! from forwarded headers only when configured to trust them) and the mount
//! prefix. Job links are host-relative; asset URLs are absolute.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use std::sync::Arc;

use super::AppState;

/// Link context of one request.
#[derive(Debug, Clone)]
pub struct Links {
    /// `scheme://host[:port]`.
    pub origin: String,
    /// Path of the Jobs API: mount prefix (e.g. `/deployment/x`, empty by
    /// default) and `/api/v2`. Shared, not copied per request.
    base: Arc<str>,
}

impl Links {
    /// The host-relative base of the Jobs API.
    pub fn v2(&self) -> &str {
        &self.base
    }
    /// An absolute URL of a host-relative path.
    pub fn absolute(&self, path: &str) -> String {
        format!("{}{}", self.origin, path)
    }
}

#[cfg(test)]
impl Links {
    /// Links of a request to `http://test` with no mount prefix.
    pub fn for_test() -> Links {
        Links { origin: "http://test".into(), base: Arc::from("/api/v2") }
    }
}

/// The first value of header `name`.
fn first_value<'a>(headers: &'a axum::http::HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok()).map(|s| s.split(',').next().unwrap_or("").trim())
}

/// The host a request was addressed to, `host[:port]`: `X-Forwarded-Host`
/// when `trust` (behind a trusted proxy), else `Host`, else the URI's
/// authority; `None` when none is a plausible host.
pub fn request_host<'a>(headers: &'a axum::http::HeaderMap, uri: &'a axum::http::Uri, trust: bool) -> Option<&'a str> {
    let valid = |h: &&str| !h.is_empty() && h.chars().all(|c| c.is_ascii_alphanumeric() || "-.:[]_".contains(c));
    trust
        .then(|| first_value(headers, "x-forwarded-host"))
        .flatten()
        .or_else(|| first_value(headers, "host"))
        .or_else(|| uri.authority().map(|a| a.as_str()))
        .filter(valid)
}

impl FromRequestParts<Arc<AppState>> for Links {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<AppState>) -> Result<Links, Self::Rejection> {
        let trust = state.config.trust_forwarded_headers;
        let scheme = trust.then(|| first_value(&parts.headers, "x-forwarded-proto")).flatten().filter(|s| *s == "http" || *s == "https").unwrap_or("http");
        let host = request_host(&parts.headers, &parts.uri, trust).unwrap_or(&state.local_authority);
        // A deployment's surface links under its own prefix.
        let base = parts.extensions.get::<super::deployment::DeploymentCtx>().map_or_else(|| state.api_base.clone(), |d| d.base.clone());
        Ok(Links { origin: format!("{scheme}://{host}"), base })
    }
}
