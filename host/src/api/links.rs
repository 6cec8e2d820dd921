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

impl FromRequestParts<Arc<AppState>> for Links {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<AppState>) -> Result<Links, Self::Rejection> {
        let header = |name: &str| parts.headers.get(name).and_then(|v| v.to_str().ok()).map(|s| s.split(',').next().unwrap_or("").trim());
        let trust = state.config.trust_forwarded_headers;
        let scheme = trust.then(|| header("x-forwarded-proto")).flatten().filter(|s| *s == "http" || *s == "https").unwrap_or("http");
        let valid = |h: &&str| !h.is_empty() && h.chars().all(|c| c.is_ascii_alphanumeric() || "-.:[]_".contains(c));
        let host = trust
            .then(|| header("x-forwarded-host"))
            .flatten()
            .or_else(|| header("host"))
            .or_else(|| parts.uri.authority().map(|a| a.as_str()))
            .filter(valid)
            .unwrap_or(&state.local_authority);
        // A deployment's surface links under its own prefix.
        let base = parts.extensions.get::<super::deployment::DeploymentCtx>().map_or_else(|| state.api_base.clone(), |d| d.base.clone());
        Ok(Links { origin: format!("{scheme}://{host}"), base })
    }
}
