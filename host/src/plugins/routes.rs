//! Serving a plugin's routes: each request goes to the plugin's
//! `wasi:http/incoming-handler` export in a fresh store, with the same
//! memory ceiling and pool slot as a node call of the plugin, and its
//! deadline capped by `route_timeout_ms`. The
//! request body arrives whole and bounded (the API edge limits it); the
//! response body is collected up to `route_response_bytes`.

use bytes::Bytes;
use http_body_util::BodyExt;
use tokio_util::sync::CancellationToken;
use wasmtime_wasi_http::WasiHttpView;

use super::determinism::GuestWorld;
use super::manifest::EffectiveLimits;
use super::network::full_body;
use super::outcome::{FailureKind, NodeFailure};
use super::runtime::{CallSetup, Plugin, PluginRuntime};

/// Why a route call produced no response.
#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    /// The plugin serves no routes.
    #[error("the plugin serves no routes")]
    NoRoutes,
    /// The call failed (trap, deadline, memory); `kind` says how.
    #[error("the plugin's route handler failed: {0}")]
    Failed(NodeFailure),
    /// The handler returned without a response, or reported an error.
    #[error("the plugin's route handler gave no response: {0}")]
    NoResponse(String),
    /// The response body was larger than `route_response_bytes`.
    #[error("the plugin's response is larger than {0} bytes")]
    TooLarge(usize),
}

impl RouteError {
    /// Whether the handler ran past its deadline.
    pub fn is_timeout(&self) -> bool {
        matches!(self, RouteError::Failed(f) if f.kind == FailureKind::Timeout)
    }
}

impl PluginRuntime {
    /// Hands `request` to `plugin`'s incoming handler and returns its response.
    pub async fn serve_route(&self, plugin: &Plugin, request: http::Request<Bytes>, cancel: &CancellationToken) -> Result<http::Response<Bytes>, RouteError> {
        let Some(proxy) = plugin.proxy.clone() else { return Err(RouteError::NoRoutes) };
        let (tx, rx) = tokio::sync::oneshot::channel();
        let limits = EffectiveLimits { memory_bytes: plugin.limits.memory_bytes, timeout: plugin.limits.timeout.min(self.config.route_timeout) };
        let setup =
            CallSetup { limits, io: None, guest_world: GuestWorld::Real, name: plugin.manifest.name.as_str().into(), net: plugin.net.clone(), gpu: false };
        let run = async {
            // The store (and with it the response's sender) is dropped as
            // soon as the handler returns, so `collect` cannot wait forever.
            self.call(setup, cancel, move |store| {
                Box::pin(async move {
                    let req =
                        store.data_mut().http().new_incoming_request(wasmtime_wasi_http::p2::bindings::http::types::Scheme::Http, request.map(full_body))?;
                    let out = store.data_mut().http().new_response_outparam(tx)?;
                    let proxy = proxy.instantiate_async(&mut *store).await?;
                    proxy.wasi_http_incoming_handler().call_handle(store, req, out).await
                })
            })
            .await
            .map(|(r, _called)| r)
        };
        let max = self.config.route_response_bytes;
        let collect = async move {
            let response = match rx.await {
                Ok(Ok(response)) => response,
                Ok(Err(code)) => return Err(RouteError::NoResponse(format!("{code:?}"))),
                Err(_) => return Err(RouteError::NoResponse("the handler returned without setting a response".into())),
            };
            let (parts, body) = response.into_parts();
            match http_body_util::Limited::new(body, max).collect().await {
                Ok(collected) => Ok(http::Response::from_parts(parts, collected.to_bytes())),
                Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(RouteError::TooLarge(max)),
                Err(e) => Err(RouteError::NoResponse(format!("its body failed: {e}"))),
            }
        };
        let (ran, collected) = tokio::join!(run, collect);
        match (ran, collected) {
            (Err(failure), _) => Err(RouteError::Failed(failure)),
            (Ok(_), collected) => collected,
        }
    }
}
