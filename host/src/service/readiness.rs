//! Readiness, for load balancers: whether this host should be sent work
//! now. Ready when its store takes a durable write, its data directory's
//! filesystem has the free space `ready_min_free_mb` asks, and its queue
//! has room (the server's bound, `max_queued_jobs`); its plugins are
//! loaded before it listens at all. Liveness (`/health`) stays a constant
//! answer. The store is written and the free space read at most once per
//! [`PROBE_EVERY`], however often readiness is asked (the route needs no
//! token).

use std::time::{Duration, Instant};

use super::Service;

/// How long a store check's answer is reused.
const PROBE_EVERY: Duration = Duration::from_secs(1);

/// The last probe (`None`: none yet).
#[derive(Default)]
pub(super) struct Probe(tokio::sync::Mutex<Option<Probed>>);

/// What a probe found: when, why the store failed (`None`: it wrote), and
/// the free space on the data directory's filesystem.
#[derive(Clone)]
struct Probed {
    at: Instant,
    store_error: Option<String>,
    free_bytes: Option<u64>,
}

/// What readiness found: each check, and whether all passed.
pub struct Readiness {
    /// Why the store took no write; `None` when it did.
    pub store_error: Option<String>,
    /// Jobs queued here, and the bound they may reach.
    pub queued: usize,
    pub max_queued: usize,
    /// Node classes loaded.
    pub nodes: usize,
    /// Free bytes on the data directory's filesystem (`None`: unknown),
    /// and the least it must have (0: not checked).
    pub free_bytes: Option<u64>,
    pub min_free_bytes: u64,
}

impl Readiness {
    /// Whether this host should be sent work.
    pub fn ready(&self) -> bool {
        self.store_error.is_none() && self.queued < self.max_queued && self.disk_ok()
    }

    /// Whether the data directory's filesystem has the free space asked
    /// (an unreadable free space does not hold the host back).
    pub fn disk_ok(&self) -> bool {
        self.min_free_bytes == 0 || self.free_bytes.is_none_or(|free| free >= self.min_free_bytes)
    }

    /// The disk check as readiness shows it.
    pub fn disk(&self) -> &'static str {
        match (self.min_free_bytes, self.free_bytes) {
            (0, _) => "not checked",
            (_, None) => "unknown",
            _ if self.disk_ok() => "ok",
            _ => "low",
        }
    }
}

impl Service {
    /// Checks readiness: a small durable store write (at most one per
    /// [`PROBE_EVERY`]; callers meanwhile share its answer), the queue's
    /// count.
    pub async fn readiness(&self) -> Readiness {
        let floor = &self.opts.disk_floor;
        let (store_error, free_bytes) = {
            let mut last = self.ready_probe.0.lock().await;
            match &*last {
                Some(probed) if probed.at.elapsed() < PROBE_EVERY => (probed.store_error.clone(), probed.free_bytes),
                _ => {
                    // Free space first: on a nearly full disk the store is
                    // not written (a write that fails there can leave the
                    // embedded store failing every write until a restart).
                    let free = match floor.min_free {
                        0 => None,
                        min_free => {
                            let floor = floor.clone();
                            tokio::task::spawn_blocking(move || floor.free()).await.ok().flatten().inspect(|&free| {
                                if free < min_free {
                                    tracing::warn!(
                                        free_mb = free >> 20,
                                        min_free_mb = min_free >> 20,
                                        "not ready: the data directory's filesystem is nearly full"
                                    );
                                }
                            })
                        }
                    };
                    let low = free.is_some_and(|free| free < floor.min_free);
                    let answer = match low {
                        true => None,
                        false => self.meta.check_writable().await.err().map(|e| {
                            tracing::warn!(error = %e, "not ready: the store takes no write");
                            e.to_string()
                        }),
                    };
                    *last = Some(Probed { at: Instant::now(), store_error: answer.clone(), free_bytes: free });
                    (answer, free)
                }
            }
        };
        Readiness {
            store_error,
            queued: self.queue.waiting().queued(),
            max_queued: self.opts.max_queued_jobs,
            nodes: self.registry().definitions().count(),
            free_bytes,
            min_free_bytes: floor.min_free,
        }
    }
}
