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
    /// With accounts (cloud, serverless): content URLs are signed and
    /// short-lived (the signer, their lifetime in seconds).
    signing: Option<(Arc<super::signing::Signer>, u64)>,
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
    /// Whether content URLs are signed (each rendering signs afresh).
    pub fn signs(&self) -> bool {
        self.signing.is_some()
    }
    /// The URL of asset `id`'s bytes and when it stops working (Unix
    /// microseconds): with accounts a signed URL that needs no credentials
    /// until its signature expires; otherwise the content route, until
    /// `until` (the record's own end).
    pub fn content(&self, id: &str, until: crate::store::Micros) -> (String, crate::store::Micros) {
        match &self.signing {
            Some((signer, ttl_s)) => {
                let expires = super::signing::expiry(*ttl_s);
                (self.signed(signer, id, expires), expires * 1_000_000)
            }
            None => (self.absolute(&format!("{}/assets/{id}/content", self.v2())), until),
        }
    }
    /// The signed URL of asset `id` until `expires` (Unix seconds).
    pub fn signed(&self, signer: &super::signing::Signer, id: &str, expires: i64) -> String {
        let sig = signer.sign(id, expires);
        self.absolute(&format!("{}/signed/assets/{id}?expires={expires}&sig={sig}", self.v2()))
    }
}

#[cfg(test)]
impl Links {
    /// Links of a request to `http://test` with no mount prefix.
    pub fn for_test() -> Links {
        Links { origin: "http://test".into(), base: Arc::from("/api/v2"), signing: None }
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
        let signing = state.config.mode.has_accounts().then(|| (state.signer.clone(), state.config.signed_url_ttl_s));
        Ok(Links { origin: format!("{scheme}://{host}"), base, signing })
    }
}
