//! Readiness, for load balancers: whether this host should be sent work
//! now. Ready when its store takes a durable write and its queue has room
//! (the server's bound, `max_queued_jobs`); its plugins are loaded before it
//! listens at all. Liveness (`/health`) stays a constant answer. The
//! store is written at most once per [`PROBE_EVERY`], however often
//! readiness is asked (the route needs no token).

use std::time::{Duration, Instant};

use super::Service;

/// How long a store check's answer is reused.
const PROBE_EVERY: Duration = Duration::from_secs(1);

/// The last store check: when, and why it failed (`None`: it wrote).
#[derive(Default)]
pub(super) struct Probe(tokio::sync::Mutex<Option<(Instant, Option<String>)>>);

/// What readiness found: each check, and whether all passed.
pub struct Readiness {
    /// Why the store took no write; `None` when it did.
    pub store_error: Option<String>,
    /// Jobs queued here, and the bound they may reach.
    pub queued: usize,
    pub max_queued: usize,
    /// Node classes loaded.
    pub nodes: usize,
}

impl Readiness {
    /// Whether this host should be sent work.
    pub fn ready(&self) -> bool {
        self.store_error.is_none() && self.queued < self.max_queued
    }
}

impl Service {
    /// Checks readiness: a small durable store write (at most one per
    /// [`PROBE_EVERY`]; callers meanwhile share its answer), the queue's
    /// count.
    pub async fn readiness(&self) -> Readiness {
        let store_error = {
            let mut last = self.ready_probe.0.lock().await;
            match &*last {
                Some((at, answer)) if at.elapsed() < PROBE_EVERY => answer.clone(),
                _ => {
                    let answer = self.meta.check_writable().await.err().map(|e| {
                        tracing::warn!(error = %e, "not ready: the store takes no write");
                        e.to_string()
                    });
                    *last = Some((Instant::now(), answer.clone()));
                    answer
                }
            }
        };
        Readiness { store_error, queued: self.queue.waiting().queued(), max_queued: self.opts.max_queued_jobs, nodes: self.registry().definitions().count() }
    }
}
