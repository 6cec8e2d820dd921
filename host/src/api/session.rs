//! Signing a browser in, for the web frontend on a server that asks for a
//! key (accounts, or a self-hosted token): `GET /login` (a form whose
//! field `key` posts to `POST /login`), `POST /logout`, and the session
//! cookie the edge accepts in place of the key on the HTTP routes and
//! `/ws` (`accounts::sessions` keeps the sessions themselves).
//!
//! The cookie (`kiln_session`) is HttpOnly, SameSite=Strict, scoped to the
//! mount prefix, `Secure` when the request came over HTTPS (as
//! `trust_forwarded_headers` lets the edge know), and lasts as long as the
//! session. Explicit credentials (a bearer token, `X-API-Key`, `?token=`)
//! win over it. CSRF: besides SameSite, a request the cookie authenticates
//! must come from the server's own origin when it can change anything
//! (any method but GET, HEAD and OPTIONS, and every WebSocket): its
//! `Origin` names the request's own host, or, without `Origin`,
//! `Sec-Fetch-Site` says `same-origin`. Signing in and out are checked the
//! same way.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Router, extract::Request};

use super::AppState;
use super::auth::{authenticate, bearer, query_token};
use super::error::ApiError;
use super::links::request_host;

/// The session cookie's name.
pub const COOKIE: &str = "kiln_session";

/// Largest sign-in form body (a key is under 100 bytes).
const FORM_LIMIT: usize = 4096;

/// The owner a session cookie signed in, as the edge found it (a request
/// extension `auth` reads in place of a key).
#[derive(Clone, Debug)]
pub struct SessionOwner(pub Arc<str>);

/// Whether this server asks for a key, and so offers sign-in.
pub fn offered(state: &AppState) -> bool {
    state.config.mode.has_accounts() || state.token_hash.is_some()
}

/// The `/login` and `/logout` routes, under the mount prefix.
pub fn routes(state: Arc<AppState>) -> Router {
    let prefix = state.config.mount_prefix.clone();
    let routes = Router::new().route(&format!("{prefix}/login"), get(page).post(login)).route(&format!("{prefix}/logout"), post(logout));
    // A sign-in form is a key: its body is refused before it is read past this.
    super::body_limit::BodyLimit::new(FORM_LIMIT).on(routes).with_state(state)
}

/// The session secret a request's cookies carry.
fn cookie_secret(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|pair| pair.trim().strip_prefix(COOKIE)?.strip_prefix('='))
        .map(str::trim)
}

/// Whether a request carries credentials of its own.
fn has_explicit_credentials(headers: &HeaderMap, uri: &Uri) -> bool {
    bearer(headers).is_some() || headers.contains_key("x-api-key") || query_token(uri).is_some()
}

/// Whether a request comes from the server's own origin (see the module
/// docs): its `Origin` names the host it was sent to, or, without one,
/// the browser marked it same-origin.
pub fn same_origin(state: &AppState, headers: &HeaderMap, uri: &Uri) -> bool {
    let origin = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok());
    match origin {
        Some(origin) => {
            let authority = origin.split_once("://").map(|(_, rest)| rest).unwrap_or_default();
            request_host(headers, uri, state.config.trust_forwarded_headers).is_some_and(|host| host.eq_ignore_ascii_case(authority))
        }
        None => headers.get("sec-fetch-site").is_some_and(|v| v.as_bytes() == b"same-origin"),
    }
}

/// The owner the request's session cookie signs in, checked for CSRF
/// (`needs_same_origin`: the request can change something): `Ok(None)`
/// without a cookie, with explicit credentials (they win), on a server
/// without sign-in, or for a session that is unknown or over (the request
/// then goes on without one, and a route that needs a caller says 401).
pub async fn resolve(state: &AppState, headers: &HeaderMap, uri: &Uri, needs_same_origin: bool) -> Result<Option<SessionOwner>, ApiError> {
    if !offered(state) || has_explicit_credentials(headers, uri) {
        return Ok(None);
    }
    let Some(secret) = cookie_secret(headers) else { return Ok(None) };
    let Some(session) = state.service.sessions().find(secret).await.map_err(|e| ApiError::from(crate::service::ServiceError::from(e)))? else {
        return Ok(None);
    };
    if needs_same_origin && !same_origin(state, headers, uri) {
        return Err(ApiError::forbidden("A cross-site request cannot use the session cookie."));
    }
    Ok(Some(SessionOwner(Arc::from(session.owner))))
}

/// Whether a request's method can change something.
pub fn unsafe_method(method: &Method) -> bool {
    !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// The path of the server's root (the frontend) and of `name` under it.
fn under_prefix(state: &AppState, name: &str) -> String {
    format!("{}/{name}", state.config.mount_prefix)
}

/// `Set-Cookie` for `secret` (`None`: one that clears the cookie).
fn set_cookie(state: &AppState, headers: &HeaderMap, secret: Option<&str>) -> String {
    let path = if state.config.mount_prefix.is_empty() { "/" } else { state.config.mount_prefix.as_str() };
    let https = state.config.trust_forwarded_headers && headers.get("x-forwarded-proto").is_some_and(|p| p.as_bytes().eq_ignore_ascii_case(b"https"));
    let secure = if https { "; Secure" } else { "" };
    match secret {
        Some(secret) => format!("{COOKIE}={secret}; Path={path}; HttpOnly; SameSite=Strict; Max-Age={}{secure}", state.config.session_ttl_s.max(1)),
        None => format!("{COOKIE}=; Path={path}; HttpOnly; SameSite=Strict; Max-Age=0{secure}"),
    }
}

/// An HTML page (no script: the frontend's CSP allows none inline).
fn html(status: StatusCode, body: &str) -> Response {
    let page = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width\">\
         <title>Sign in · kiln</title></head><body style=\"font-family:sans-serif;max-width:28rem;margin:4rem auto\">{body}</body></html>"
    );
    (
        status,
        [
            (header::CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8")),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
            (header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY")),
            (
                header::CONTENT_SECURITY_POLICY,
                HeaderValue::from_static("default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'"),
            ),
        ],
        page,
    )
        .into_response()
}

/// The sign-in form, with `notice` above it.
fn form(state: &AppState, status: StatusCode, notice: &str) -> Response {
    let action = under_prefix(state, "login");
    html(
        status,
        &format!(
            "<h1>Sign in</h1>{notice}<form method=\"post\" action=\"{action}\">\
             <label for=\"key\">API key</label><br><input id=\"key\" name=\"key\" type=\"password\" autocomplete=\"current-password\" required \
             style=\"width:100%\"><br><br><button type=\"submit\">Sign in</button></form>"
        ),
    )
}

/// `GET /login`: the form, or, for a browser already signed in, a way on
/// and a way out.
async fn page(State(state): State<Arc<AppState>>, headers: HeaderMap, uri: Uri) -> Response {
    if !offered(&state) {
        return html(StatusCode::NOT_FOUND, "<p>This server asks for no key: <a href=\"./\">open it</a>.</p>");
    }
    if let Ok(Some(_)) = resolve(&state, &headers, &uri, false).await {
        let (home, logout) = (under_prefix(&state, ""), under_prefix(&state, "logout"));
        return html(
            StatusCode::OK,
            &format!(
                "<h1>Signed in</h1><p><a href=\"{home}\">Open kiln</a></p>\
                 <form method=\"post\" action=\"{logout}\"><button type=\"submit\">Sign out</button></form>"
            ),
        );
    }
    form(&state, StatusCode::OK, "")
}

/// `POST /login` (`key=…`, form-encoded): a session for the key's owner
/// and a 303 to the frontend; a wrong key shows the form again (401).
async fn login(State(state): State<Arc<AppState>>, headers: HeaderMap, uri: Uri, body: Result<Bytes, BytesRejection>) -> Response {
    if !offered(&state) {
        return ApiError::not_found().into_response();
    }
    if !same_origin(&state, &headers, &uri) {
        return ApiError::forbidden("Sign in from this server's own page.").into_response();
    }
    let body = match body {
        Ok(body) => body,
        Err(e) => return super::body::body_error(e, FORM_LIMIT).into_response(),
    };
    let key = form_urlencoded::parse(&body).find(|(k, _)| k == "key").map(|(_, v)| v.trim().to_string()).unwrap_or_default();
    let caller = match authenticate(&state, Some(&key)) {
        Ok(caller) => caller,
        Err(e) if e.status == StatusCode::FORBIDDEN => return form(&state, StatusCode::FORBIDDEN, "<p role=\"alert\">This account is disabled.</p>"),
        Err(_) => return form(&state, StatusCode::UNAUTHORIZED, "<p role=\"alert\">That key was not accepted.</p>"),
    };
    let owner = caller.owner().to_string();
    let service = state.service.clone();
    let started = super::pool::on_pool(move || async move { service.sessions().start(&owner).await }).await;
    match started {
        Ok(Ok((secret, _))) => {
            let cookie = set_cookie(&state, &headers, Some(&secret));
            (StatusCode::SEE_OTHER, [(header::LOCATION, under_prefix(&state, "")), (header::SET_COOKIE, cookie)]).into_response()
        }
        Ok(Err(e)) => ApiError::from(crate::service::ServiceError::from(e)).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `POST /logout`: ends the session (server-side: the cookie opens nothing
/// from now on, wherever it was copied), clears the cookie, 303 to the form.
async fn logout(State(state): State<Arc<AppState>>, request: Request) -> Response {
    let (headers, uri) = (request.headers().clone(), request.uri().clone());
    if !same_origin(&state, &headers, &uri) {
        return ApiError::forbidden("Sign out from this server's own page.").into_response();
    }
    if let Some(secret) = cookie_secret(&headers).map(str::to_string) {
        let service = state.service.clone();
        match super::pool::on_pool(move || async move { service.sessions().end(&secret).await }).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return ApiError::from(crate::service::ServiceError::from(e)).into_response(),
            Err(e) => return e.into_response(),
        }
    }
    let cookie = set_cookie(&state, &headers, None);
    (StatusCode::SEE_OTHER, [(header::LOCATION, under_prefix(&state, "login")), (header::SET_COOKIE, cookie)]).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_session_cookie_is_found_among_others() {
        let mut h = HeaderMap::new();
        assert_eq!(cookie_secret(&h), None);
        h.insert(header::COOKIE, "a=1; kiln_session=abc ; b=2".parse().unwrap());
        assert_eq!(cookie_secret(&h), Some("abc"));
        h.insert(header::COOKIE, "kiln_sessionx=abc".parse().unwrap());
        assert_eq!(cookie_secret(&h), None);
        h.append(header::COOKIE, "kiln_session=def".parse().unwrap());
        assert_eq!(cookie_secret(&h), Some("def"));
    }
}
