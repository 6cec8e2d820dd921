//! The published contract: the OpenAPI 3.1 documents of the Jobs API
//! (`/api/v2/openapi.json`) and of the admin API (`/admin/openapi.json`),
//! generated from the handlers' `#[utoipa::path]` attributes and the wire
//! types' schemas.
//!
//! Routes and document come from the same attributes: a surface registers
//! its handlers through [`Contract::routes`] (utoipa-axum's `routes!`
//! gives each handler's path, methods and operation), which mounts each at
//! its documented path and records the operation. A route cannot be served
//! without its entry, nor documented without being served. The error
//! responses of each operation come from one table ([`errors`]); whether
//! an operation needs credentials comes from the server's configuration
//! (a token, or accounts), so the served document describes this server.

pub mod errors;
pub mod schemas;
#[cfg(test)]
mod tests;

use axum::Router;
use axum::body::Bytes;
use axum::response::IntoResponse;
use utoipa::openapi::path::{Operation, Paths};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{ComponentsBuilder, InfoBuilder, OpenApi, OpenApiBuilder, RefOr, Schema, Server};
use utoipa_axum::router::UtoipaMethodRouter;

/// The operations of one surface as they are registered: the document's
/// paths and the schemas they name.
#[derive(Default)]
pub struct Contract {
    paths: Paths,
    schemas: Vec<(String, RefOr<Schema>)>,
}

impl Contract {
    /// Mounts each handler of `routes` at `base` and its documented path,
    /// and records its operations.
    pub fn routes<S: Clone + Send + Sync + 'static>(&mut self, base: &str, routes: impl IntoIterator<Item = UtoipaMethodRouter<S>>) -> Router<S> {
        let mut router = Router::new();
        for (schemas, paths, method_router) in routes {
            for path in paths.paths.keys() {
                router = router.route(&format!("{base}{path}"), method_router.clone());
            }
            self.paths.merge(paths);
            self.schemas.extend(schemas);
        }
        router
    }

    /// The document: `title`, served at `server` (the paths are relative
    /// to it); `authenticated`: whether this server asks for credentials.
    pub fn document(self, title: &str, description: &str, server: &str, authenticated: bool) -> OpenApi {
        let mut paths = self.paths;
        for item in paths.paths.values_mut() {
            for operation in operations(item) {
                let id = operation.operation_id.clone().unwrap_or_default();
                errors::add_responses(&id, operation, authenticated);
                if authenticated && !errors::is_public(&id) {
                    operation.security = Some(vec![SecurityRequirement::new("bearer", Vec::<String>::new())]);
                }
            }
        }
        // The envelope (every error's body) and the event frames (named by
        // the stream's catalogue), with the schemas they name.
        let mut named = self.schemas;
        <schemas::ErrorEnvelope as utoipa::ToSchema>::schemas(&mut named);
        <schemas::PreviewFrame as utoipa::ToSchema>::schemas(&mut named);
        let mut components = ComponentsBuilder::new().schemas_from_iter(named).schema_from::<schemas::ErrorEnvelope>().schema_from::<schemas::PreviewFrame>();
        if authenticated {
            components = components.security_scheme("bearer", SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()));
        }
        let server = if server.is_empty() { "/" } else { server };
        OpenApiBuilder::new()
            .info(InfoBuilder::new().title(title).description(Some(description)).version(env!("CARGO_PKG_VERSION")))
            .servers(Some([Server::new(server)]))
            .paths(paths)
            .components(Some(components.build()))
            .build()
    }
}

/// Every operation of a path item.
fn operations(item: &mut utoipa::openapi::PathItem) -> impl Iterator<Item = &mut Operation> {
    [&mut item.get, &mut item.put, &mut item.post, &mut item.delete, &mut item.options, &mut item.head, &mut item.patch, &mut item.trace]
        .into_iter()
        .filter_map(Option::as_mut)
}

/// A rendered document, as the route serving it hands it out.
#[derive(Clone)]
pub struct Rendered(pub Bytes);

impl Rendered {
    pub fn new(document: &OpenApi) -> Rendered {
        Rendered(Bytes::from(serde_json::to_vec(document).unwrap_or_default()))
    }
}

impl IntoResponse for Rendered {
    fn into_response(self) -> axum::response::Response {
        ([(axum::http::header::CONTENT_TYPE, "application/json")], self.0).into_response()
    }
}

/// `GET /openapi.json`: the Jobs API's document.
#[utoipa::path(get, path = "/openapi.json", operation_id = "openapi", tag = "contract",
    responses((status = 200, description = "This document (OpenAPI 3.1).", content_type = "application/json", body = Object)))]
pub async fn jobs_document(axum::Extension(document): axum::Extension<Rendered>) -> Rendered {
    document
}

/// `GET /admin/openapi.json`: the admin API's document.
#[utoipa::path(get, path = "/admin/openapi.json", operation_id = "admin_openapi", tag = "contract",
    responses((status = 200, description = "This document (OpenAPI 3.1).", content_type = "application/json", body = Object)))]
pub async fn admin_document(axum::Extension(document): axum::Extension<Rendered>) -> Rendered {
    document
}
