//! The official ComfyUI web frontend, served from `front_end_root` (the
//! `static/` directory of PyPI's `comfyui-frontend-package`; kiln does not
//! ship it): `GET /` answers its `index.html` (`Cache-Control: no-store`),
//! every other path not routed elsewhere a file of the tree (404 when
//! absent: `user.css` is optional).
//!
//! Every response carries a Content-Security-Policy that keeps the browser
//! on this server's origin — the frontend tries to fetch release notes,
//! telemetry and model files from other hosts — while allowing what the UI
//! needs: its scripts and styles from here, `index.html`'s inline
//! `<script>` and `<style>` elements by their sha256 (computed from the
//! served file at start), WebAssembly compilation (`'wasm-unsafe-eval'`:
//! not JavaScript's `eval`), `blob:`/`data:` images, media and fonts, and
//! workers from here or `blob:`. One `<style>` element the frontend adds at
//! run time is refused (a console error): the `.draggable-item` rules of its
//! drag-to-reorder lists, whose only effect is the reorder animation. Styles set through `style` attributes are
//! allowed (`style-src-attr 'unsafe-inline'`: PrimeVue and LiteGraph
//! position every element that way; an attribute cannot run code).

use std::path::{Path, PathBuf};

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use sha2::{Digest, Sha256};
use tower_http::services::ServeDir;

use crate::api::error::ApiError;

/// The `comfyui-frontend-package` release kiln is tested with (the one
/// `kiln serve --fetch-front-end` and `.ci/run` download).
pub const FRONT_END_VERSION: &str = "1.58.1";

/// Largest `index.html` read at start (the 1.58 one is 20 KiB).
const MAX_INDEX_BYTES: u64 = 4 << 20;

/// Why the frontend directory cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum FrontendError {
    #[error("front_end_root {path}: cannot read index.html: {source}")]
    Index { path: PathBuf, source: std::io::Error },
    #[error("front_end_root {path}: index.html is larger than {MAX_INDEX_BYTES} bytes")]
    IndexTooLarge { path: PathBuf },
    #[error("the Content-Security-Policy is not a valid header value")]
    Header,
}

/// A frontend tree ready to serve.
#[derive(Clone)]
pub struct Frontend {
    index: bytes::Bytes,
    csp: HeaderValue,
    files: ServeDir,
}

impl Frontend {
    /// Reads `root/index.html` and derives the policy from it.
    pub fn load(root: &Path) -> Result<Frontend, FrontendError> {
        let index_path = root.join("index.html");
        let len = std::fs::metadata(&index_path).map_err(|source| FrontendError::Index { path: root.to_path_buf(), source })?.len();
        if len > MAX_INDEX_BYTES {
            return Err(FrontendError::IndexTooLarge { path: root.to_path_buf() });
        }
        let index = std::fs::read(&index_path).map_err(|source| FrontendError::Index { path: root.to_path_buf(), source })?;
        let csp = HeaderValue::try_from(policy(&String::from_utf8_lossy(&index))).map_err(|_| FrontendError::Header)?;
        Ok(Frontend { index: index.into(), csp, files: ServeDir::new(root).append_index_html_on_directories(false) })
    }

    /// The policy in effect (for tests and logs).
    pub fn csp(&self) -> &HeaderValue {
        &self.csp
    }

    /// `GET /`: `index.html`, never cached (it names the hashed assets).
    pub fn index(&self) -> Response {
        let mut response = (
            [(header::CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8")), (header::CACHE_CONTROL, HeaderValue::from_static("no-store"))],
            Body::from(self.index.clone()),
        )
            .into_response();
        self.secure(&mut response);
        response
    }

    /// A file of the tree at `path` (below the mount prefix); only `GET`
    /// and `HEAD`.
    pub async fn file(&self, path: &str, request: Request) -> Response {
        if path.is_empty() || path == "/" {
            return self.index();
        }
        let mut request = request;
        match path.parse() {
            Ok(uri) => *request.uri_mut() = uri,
            Err(_) => return ApiError::not_found().into_response(),
        }
        let mut response = match self.files.clone().try_call(request).await {
            Ok(r) => r.map(Body::new),
            Err(e) => return ApiError::internal(&e).into_response(),
        };
        if response.status() == StatusCode::NOT_FOUND {
            return ApiError::not_found().into_response();
        }
        self.secure(&mut response);
        response
    }

    fn secure(&self, response: &mut Response) {
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_SECURITY_POLICY, self.csp.clone());
        headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
        headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    }
}

/// The Content-Security-Policy for `index`: everything from this origin,
/// its inline `<script>` and `<style>` elements by hash.
pub fn policy(index: &str) -> String {
    let hashes = |tag: &str| inline_elements(index, tag).iter().map(|body| format!(" 'sha256-{}'", sha256_base64(body))).collect::<String>();
    format!(
        "default-src 'self'; script-src 'self' 'wasm-unsafe-eval'{scripts}; style-src 'self'{styles}; style-src-elem 'self'{styles}; style-src-attr 'unsafe-inline'; \
         img-src 'self' blob: data:; media-src 'self' blob: data:; font-src 'self' data:; connect-src 'self'; worker-src 'self' blob:; \
         manifest-src 'self'; object-src 'none'; base-uri 'self'; form-action 'self'; frame-ancestors 'self'",
        scripts = hashes("script"),
        styles = hashes("style"),
    )
}

fn sha256_base64(text: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(Sha256::digest(text.as_bytes()))
}

/// The bodies of `<tag ...>` elements without a `src` attribute (inline
/// ones), in order.
fn inline_elements<'a>(html: &'a str, tag: &str) -> Vec<&'a str> {
    let (open, close) = (format!("<{tag}"), format!("</{tag}>"));
    let mut out = Vec::new();
    let mut rest = html;
    while let Some(start) = rest.find(&open) {
        let after = &rest[start + open.len()..];
        // `<scripts>` or `<style-x>` are other tags.
        if !after.starts_with(['>', ' ', '\t', '\n', '\r', '/']) {
            rest = after;
            continue;
        }
        let Some(tag_end) = after.find('>') else { break };
        let attributes = &after[..tag_end];
        let body_start = &after[tag_end + 1..];
        let Some(end) = body_start.find(&close) else { break };
        if !attributes.contains("src=") {
            out.push(&body_start[..end]);
        }
        rest = &body_start[end + close.len()..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inline_scripts_and_styles_are_allowed_by_hash() {
        let html =
            r#"<html><head><style>a{}</style><script type="module" src="./x.js"></script><script>go()</script></head><body><style>b{}</style></body></html>"#;
        assert_eq!(inline_elements(html, "script"), ["go()"]);
        assert_eq!(inline_elements(html, "style"), ["a{}", "b{}"]);
        let csp = policy(html);
        assert!(csp.contains(&format!("script-src 'self' 'wasm-unsafe-eval' 'sha256-{}';", sha256_base64("go()"))), "{csp}");
        assert!(csp.contains(&format!("style-src 'self' 'sha256-{}' 'sha256-{}';", sha256_base64("a{}"), sha256_base64("b{}"))), "{csp}");
        assert!(!csp.contains("script-src 'self' 'unsafe-inline'") && csp.contains("connect-src 'self';"), "{csp}");
        // The well-known digest of an empty string.
        assert_eq!(sha256_base64(""), "47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=");
    }

    #[tokio::test]
    async fn serves_index_and_files_with_the_policy() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("index.html"), "<script>x()</script>").unwrap();
        std::fs::create_dir(dir.path().join("assets")).unwrap();
        std::fs::write(dir.path().join("assets/a.js"), "export {}").unwrap();
        let frontend = Frontend::load(dir.path()).unwrap();
        let index = frontend.index();
        assert_eq!(index.headers()[header::CACHE_CONTROL], "no-store");
        assert_eq!(index.headers()[header::CONTENT_SECURITY_POLICY], frontend.csp());
        let get = |p: &str| Request::builder().uri(p).body(Body::empty()).unwrap();
        let js = frontend.file("/assets/a.js", get("/assets/a.js")).await;
        assert_eq!(js.status(), 200);
        assert!(js.headers()[header::CONTENT_TYPE].to_str().unwrap().contains("javascript"));
        assert!(js.headers().contains_key(header::CONTENT_SECURITY_POLICY));
        assert_eq!(frontend.file("/user.css", get("/user.css")).await.status(), 404);
        assert_eq!(frontend.file("/../etc/passwd", get("/../etc/passwd")).await.status(), 404);
        assert!(Frontend::load(&dir.path().join("assets")).is_err());
    }
}
