//! Each request of a connection: its body timed while a handler waits on
//! it, the router, and a response body that keeps the request in flight
//! until it is sent; a reserve connection answers health checks only.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, Request, Response, header};
use axum::response::IntoResponse;
use hyper::body::{Body as HttpBody, Frame, Incoming, SizeHint};
use hyper_util::service::TowerToHyperService;

use super::watch::{Activity, InFlight};
use crate::api::error::ApiError;

/// Each request of one connection: timed body in, router, tracked body out.
#[derive(Clone)]
pub(super) struct ConnService {
    pub(super) router: TowerToHyperService<Router>,
    pub(super) activity: Arc<Activity>,
    pub(super) body_timeout: Duration,
    /// A reserve connection: health checks only.
    pub(super) health_only: bool,
}

pub(super) type Responding = Pin<Box<dyn Future<Output = Result<Response<Tracked>, Infallible>> + Send>>;

impl hyper::service::Service<Request<Incoming>> for ConnService {
    type Response = Response<Tracked>;
    type Error = Infallible;
    type Future = Responding;

    fn call(&self, request: Request<Incoming>) -> Responding {
        let in_flight = self.activity.request_started();
        self.activity.body_unread.store(!request.body().is_end_stream(), Ordering::Relaxed);
        if self.health_only && !is_health_check(request.uri().path()) {
            let mut response = ApiError::too_many_connections().into_response();
            response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
            return Box::pin(std::future::ready(Ok(response.map(|body| Tracked { body, _in_flight: in_flight }))));
        }
        let body_timeout = self.body_timeout;
        let activity = self.activity.clone();
        let request =
            request.map(|body| Body::new(StallGuard { body, timeout: body_timeout, timer: None, armed: false, failed: false, activity: activity.clone() }));
        let responding = hyper::service::Service::call(&self.router, request);
        Box::pin(async move {
            let mut response = match responding.await {
                Ok(response) => response,
                Err(never) => match never {},
            };
            if activity.body_stalled.load(Ordering::Relaxed) {
                // Whatever the handler made of the failed read: the request
                // timed out, and the connection (its body unread) closes.
                response = ApiError::request_timeout(body_timeout).into_response();
                response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            Ok(response.map(|body| Tracked { body, _in_flight: in_flight }))
        })
    }
}

/// The health check: the Jobs API's, at any mount or deployment prefix.
pub(super) fn is_health_check(path: &str) -> bool {
    path.ends_with("/api/v2/health")
}

/// A response body that keeps its request in flight until it is sent
/// (or dropped): an event stream is a request in flight for as long as it
/// streams.
pub(super) struct Tracked {
    pub(super) body: Body,
    pub(super) _in_flight: InFlight,
}

impl HttpBody for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }
    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }
    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// A request body that fails when, while it is being waited on, nothing
/// arrives for `timeout`.
pub(super) struct StallGuard {
    pub(super) body: Incoming,
    pub(super) timeout: Duration,
    pub(super) timer: Option<Pin<Box<tokio::time::Sleep>>>,
    /// Whether `timer` runs for the current wait.
    pub(super) armed: bool,
    pub(super) failed: bool,
    pub(super) activity: Arc<Activity>,
}

/// The error a stalled body ends with.
#[derive(Debug, thiserror::Error)]
#[error("the request body stalled (http_body_timeout_s)")]
pub(super) struct BodyStalled;

impl HttpBody for StallGuard {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        if this.failed {
            return Poll::Ready(None);
        }
        if let Poll::Ready(frame) = Pin::new(&mut this.body).poll_frame(cx) {
            this.armed = false;
            if frame.is_none() || this.body.is_end_stream() {
                this.activity.body_unread.store(false, Ordering::Relaxed);
            }
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        let deadline = tokio::time::Instant::now() + this.timeout;
        let timer = match &mut this.timer {
            Some(timer) => {
                if !this.armed {
                    timer.as_mut().reset(deadline);
                }
                timer
            }
            None => this.timer.insert(Box::pin(tokio::time::sleep_until(deadline))),
        };
        this.armed = true;
        if timer.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        this.failed = true;
        this.activity.body_stalled.store(true, Ordering::Relaxed);
        Poll::Ready(Some(Err(Box::new(BodyStalled))))
    }
    fn is_end_stream(&self) -> bool {
        self.failed || self.body.is_end_stream()
    }
    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
