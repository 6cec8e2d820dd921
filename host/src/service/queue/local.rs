//! The embedded waiting queue: a [`FairQueue`] in memory, a counter of the
//! jobs queued on the server, a `Notify` that wakes idle workers (which
//! also wake at the end of a key's hold). One process holds it; a restart
//! rebuilds it from the store's unfinished jobs (`retention`).

use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;
use tokio::sync::Notify;

use super::Waiting;
use crate::service::fair::{FairQueue, KeyQueueFull, TenantLimits};

/// Waiting jobs of one server, in memory.
pub struct LocalWaiting {
    /// Queued jobs per scheduling key, served round-robin (see `fair`).
    waiting: Mutex<FairQueue>,
    /// Jobs queued on the whole server (reserved before they are pushed).
    queued: AtomicUsize,
    /// Wakes a worker when a job is pushed or a key may run another.
    notify: Notify,
}

impl Default for LocalWaiting {
    fn default() -> Self {
        LocalWaiting { waiting: Mutex::default(), queued: AtomicUsize::new(0), notify: Notify::new() }
    }
}

#[async_trait::async_trait]
impl Waiting for LocalWaiting {
    fn reserve(&self, max: usize) -> bool {
        if self.queued.fetch_add(1, Ordering::SeqCst) >= max {
            self.queued.fetch_sub(1, Ordering::SeqCst);
            return false;
        }
        true
    }

    fn release(&self) {
        self.queued.fetch_sub(1, Ordering::SeqCst);
    }

    fn queued(&self) -> usize {
        self.queued.load(Ordering::SeqCst)
    }

    fn startable(&self, limits: &dyn TenantLimits) -> bool {
        self.waiting.lock().startable(limits, std::time::Instant::now())
    }

    fn push(&self, key: &str, owner: &str, id: String, front: bool, max_queued: usize) -> Result<usize, KeyQueueFull> {
        let position = self.waiting.lock().push(key, owner, id, front, max_queued)?;
        self.notify.notify_one();
        Ok(position)
    }

    fn requeue(&self, key: &str, owner: &str, id: String) {
        self.queued.fetch_add(1, Ordering::SeqCst);
        let _ = self.waiting.lock().push(key, owner, id, false, usize::MAX);
        // (A job taken over from another host while the workers wait.)
        self.notify.notify_one();
    }

    fn put_back(&self, key: &str, owner: &str, id: String, until: std::time::Instant) {
        self.queued.fetch_add(1, Ordering::SeqCst);
        self.waiting.lock().put_back(key, owner, id, until);
        // A worker waiting with no hold in view learns of this one.
        self.notify.notify_one();
    }

    fn withdraw(&self, id: &str) -> bool {
        let removed = self.waiting.lock().remove(id);
        if removed {
            self.queued.fetch_sub(1, Ordering::SeqCst);
        }
        removed
    }

    async fn next(&self, limits: &dyn TenantLimits) -> (String, String) {
        loop {
            // Registered before the queue is checked, so a push in between
            // still wakes this worker.
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let hold = {
                let (mut waiting, now) = (self.waiting.lock(), std::time::Instant::now());
                if let Some(next) = waiting.pop(limits, now) {
                    self.queued.fetch_sub(1, Ordering::SeqCst);
                    return next;
                }
                waiting.next_hold(now)
            };
            match hold {
                // A held key's jobs may be taken then, if nothing wakes it before.
                Some(until) => {
                    let _ = tokio::time::timeout_at(until.into(), notified).await;
                }
                None => notified.await,
            }
        }
    }

    fn done(&self, key: &str) {
        self.waiting.lock().done(key);
        self.notify.notify_one();
    }

    fn limits_changed(&self) {
        self.notify.notify_waiters();
    }

    fn waiting_of(&self, key: &str) -> Vec<String> {
        self.waiting.lock().waiting_of(key)
    }

    fn has_waiting(&self, key: &str) -> bool {
        self.waiting.lock().has_waiting(key)
    }

    fn waiting_keys(&self) -> Vec<String> {
        self.waiting.lock().waiting_keys()
    }

    fn position(&self, id: &str) -> Option<usize> {
        self.waiting.lock().position(id)
    }

    fn ordered(&self) -> Vec<String> {
        self.waiting.lock().ordered()
    }
}
