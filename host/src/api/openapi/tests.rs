//! The documents against the router that serves them: every route under
//! the Jobs API (and the admin API) is documented, every documented
//! operation is routed, an undocumented method on a documented path is
//! 405, and every schema a document names is in it.

use std::collections::BTreeSet;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use serde_json::Value as Json;

use crate::api::proptests::App;

const ADMIN_TOKEN: &str = "contract-test-operator";

fn app() -> App {
    App::start_with(|config| config.admin_token = Some(ADMIN_TOKEN.into()))
}

fn document(app: &App, uri: &str, headers: &[(&str, &str)]) -> Json {
    let reply = app.get(uri, headers);
    assert_eq!(reply.status, StatusCode::OK, "{uri}");
    serde_json::from_slice(&reply.body).unwrap()
}

/// The route patterns a router holds, read from its `Debug` output (axum
/// prints each route's path); only those under `prefix`.
fn routed_paths(router: &axum::Router, prefix: &str) -> BTreeSet<String> {
    let text = format!("{router:?}");
    let mut found = BTreeSet::new();
    for piece in text.split('"').skip(1).step_by(2) {
        if piece.starts_with(prefix) {
            found.insert(piece.to_string());
        }
    }
    found
}

/// `(path, method)` of every documented operation, paths prefixed by `base`.
fn documented(doc: &Json, base: &str) -> BTreeSet<(String, String)> {
    let mut ops = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys().filter(|k| METHODS.contains(&k.as_str())) {
            ops.insert((format!("{base}{path}"), method.clone()));
        }
    }
    ops
}

const METHODS: [&str; 5] = ["get", "post", "delete", "head", "put"];

/// A concrete URI for a route pattern (any id: the route matters, not the resource).
fn concrete(path: &str) -> String {
    path.replace("{id}", "00000000-0000-4000-8000-000000000000").replace("{hash}", &format!("blake3:{}", "0".repeat(64))).replace("{name}", "no-such-plugin")
}

/// Every documented operation answers from its handler (not 405), and
/// every other method on its path is 405.
fn probe(app: &App, ops: &BTreeSet<(String, String)>, auth: &[(&str, &str)]) {
    let paths: BTreeSet<&String> = ops.iter().map(|(p, _)| p).collect();
    for path in paths {
        for method in METHODS {
            let mut request = Request::builder().method(Method::from_bytes(method.to_uppercase().as_bytes()).unwrap()).uri(concrete(path));
            for (k, v) in auth {
                request = request.header(*k, *v);
            }
            let reply = app.call(request.body(Body::empty()).unwrap());
            if ops.contains(&(path.clone(), method.to_string())) {
                assert_ne!(reply.status, StatusCode::METHOD_NOT_ALLOWED, "{method} {path} is documented but not routed");
            } else if !(method == "head" && ops.contains(&(path.clone(), "get".into()))) {
                // (axum answers HEAD with a GET route.)
                assert_eq!(reply.status, StatusCode::METHOD_NOT_ALLOWED, "{method} {path} is routed but not documented");
            }
        }
    }
}

/// Every `$ref` of `doc` names a schema in its components.
fn refs_resolve(doc: &Json) {
    let schemas = doc["components"]["schemas"].as_object().unwrap();
    let mut stack = vec![doc];
    let mut seen = 0;
    while let Some(value) = stack.pop() {
        match value {
            Json::Object(map) => {
                if let Some(Json::String(target)) = map.get("$ref") {
                    let name = target.strip_prefix("#/components/schemas/").unwrap_or_else(|| panic!("unexpected $ref {target}"));
                    assert!(schemas.contains_key(name), "$ref {target} names no schema");
                    seen += 1;
                }
                stack.extend(map.values());
            }
            Json::Array(items) => stack.extend(items),
            _ => {}
        }
    }
    assert!(seen > 0, "the document names no schema");
}

#[test]
fn the_jobs_api_document_and_its_router_agree() {
    let app = app();
    let base = app.state.api_base.to_string();
    let doc = document(&app, &format!("{base}/openapi.json"), &[]);
    assert_eq!(doc["openapi"], "3.1.0");
    assert_eq!(doc["servers"][0]["url"], base.as_str());
    let ops = documented(&doc, &base);
    // Every route under the Jobs API, whichever part of the edge mounts it.
    let state = app.state.clone();
    let mut routed = routed_paths(&crate::api::v2::routes(&base, state.clone()), &format!("{base}/"));
    for other in [
        crate::api::compat::routes(state.clone()),
        crate::api::admin::routes(state.clone()),
        crate::api::metrics::routes(state.clone()),
        crate::api::session::routes(state.clone()),
    ] {
        let stray = routed_paths(&other, &format!("{base}/"));
        assert!(stray.is_empty(), "routes under the Jobs API outside its router: {stray:?}");
        routed.extend(stray);
    }
    let documented_paths: BTreeSet<String> = ops.iter().map(|(p, _)| p.clone()).collect();
    assert!(routed.len() >= 15, "too few routes read from the router: {routed:?}");
    assert_eq!(routed, documented_paths, "routed vs documented paths");
    probe(&app, &ops, &[]);
    refs_resolve(&doc);
    // Every operation names its errors; the codes are the envelope's.
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            assert!(op["operationId"].is_string(), "{method} {path}");
            assert!(op["responses"].get("500").is_some(), "{method} {path} lists no 500");
        }
    }
    // The public operations' ids and paths (`auth::PUBLIC_OPERATIONS`) name documented operations.
    for (id, public) in crate::api::auth::PUBLIC_OPERATIONS {
        let found = doc["paths"].as_object().unwrap().iter().any(|(path, item)| {
            let at = if public.ends_with('/') { path.starts_with(public) } else { path == public };
            at && item.as_object().unwrap().values().any(|op| op["operationId"] == *id)
        });
        assert!(found, "public operation {id} at {public} is not in the document");
    }
    let codes = &doc["components"]["schemas"]["ApiCode"]["enum"];
    assert_eq!(codes.as_array().unwrap().len(), crate::api::error::ApiCode::ALL.len(), "{codes}");
}

/// Every operation id of the error table names an operation of one of
/// the documents (a renamed operation cannot silently lose its codes).
#[test]
fn the_error_table_names_documented_operations() {
    let app = app();
    let bearer = format!("Bearer {ADMIN_TOKEN}");
    let mut ids = BTreeSet::new();
    let base = app.state.api_base.to_string();
    for doc in [document(&app, &format!("{base}/openapi.json"), &[]), document(&app, "/admin/openapi.json", &[("authorization", bearer.as_str())])] {
        for item in doc["paths"].as_object().unwrap().values() {
            ids.extend(item.as_object().unwrap().values().filter_map(|op| op["operationId"].as_str().map(str::to_string)));
        }
    }
    for (id, _) in super::errors::TABLE {
        assert!(ids.contains(*id), "{id} is in the error table but no document has it: {ids:?}");
    }
}

#[test]
fn the_admin_document_and_its_router_agree() {
    let app = app();
    let bearer = format!("Bearer {ADMIN_TOKEN}");
    let auth = [("authorization", bearer.as_str())];
    // Behind the operator's gate, like every admin route.
    assert_eq!(app.get("/admin/openapi.json", &[]).status, StatusCode::UNAUTHORIZED);
    let doc = document(&app, "/admin/openapi.json", &auth);
    let ops = documented(&doc, "");
    let routed = routed_paths(&crate::api::admin::routes(app.state.clone()), "/admin/");
    let documented_paths: BTreeSet<String> = ops.iter().map(|(p, _)| p.clone()).collect();
    assert!(routed.len() >= 8, "too few routes read from the router: {routed:?}");
    assert_eq!(routed, documented_paths, "routed vs documented paths");
    probe(&app, &ops, &auth);
    refs_resolve(&doc);
    // Every admin operation needs the operator's token.
    for item in doc["paths"].as_object().unwrap().values() {
        for op in item.as_object().unwrap().values() {
            assert!(op["responses"].get("401").is_some() && op["security"].is_array(), "{op}");
        }
    }
}
