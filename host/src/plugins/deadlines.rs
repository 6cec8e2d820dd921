//! Node time limits, fired by the epoch ticker.
//!
//! Every node call has a wall-clock limit. A tokio timer per call would
//! make the execution runtime wake the thread parked on its time driver to
//! re-arm it (a wake-up of another thread, on every call, in a process
//! whose cores are busy with jobs). The engine's epoch ticker already
//! wakes every [`super::engine::EPOCH_TICK`]; it fires the deadlines that
//! have passed, so a call is stopped within one tick of its limit — also
//! when its guest is blocked in an async WASI call rather than running.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

/// The armed deadlines of the process.
#[derive(Default)]
pub struct Deadlines {
    armed: Mutex<BTreeMap<(Instant, u64), CancellationToken>>,
    next_id: AtomicU64,
}

/// An armed deadline; disarmed when dropped.
pub struct Deadline {
    deadlines: Arc<Deadlines>,
    key: (Instant, u64),
    expired: CancellationToken,
}

impl Deadlines {
    /// Arms a deadline at `at`.
    pub fn arm(self: &Arc<Self>, at: Instant) -> Deadline {
        let key = (at, self.next_id.fetch_add(1, Ordering::Relaxed));
        let expired = CancellationToken::new();
        self.armed.lock().insert(key, expired.clone());
        Deadline { deadlines: self.clone(), key, expired }
    }

    /// Fires every deadline at or before `now`.
    pub fn fire_due(&self, now: Instant) {
        let due = {
            let mut armed = self.armed.lock();
            let later = armed.split_off(&(now, u64::MAX));
            std::mem::replace(&mut *armed, later)
        };
        for token in due.into_values() {
            token.cancel();
        }
    }

    /// Deadlines armed and not yet fired or dropped.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.armed.lock().len()
    }
}

impl Deadline {
    /// Completes once the deadline has passed (within a tick of it).
    pub async fn expired(&self) {
        self.expired.cancelled().await;
    }
}

impl Drop for Deadline {
    fn drop(&mut self) {
        self.deadlines.armed.lock().remove(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn fires_what_is_due_and_forgets_what_is_dropped() {
        let deadlines = Arc::new(Deadlines::default());
        let t0 = Instant::now();
        let early = deadlines.arm(t0 + Duration::from_millis(5));
        let same = deadlines.arm(t0 + Duration::from_millis(5));
        let late = deadlines.arm(t0 + Duration::from_secs(60));
        let dropped = deadlines.arm(t0 + Duration::from_millis(1));
        drop(dropped);
        assert_eq!(deadlines.len(), 3);
        deadlines.fire_due(t0 + Duration::from_millis(4));
        assert!(!early.expired.is_cancelled());
        deadlines.fire_due(t0 + Duration::from_millis(5));
        assert!(early.expired.is_cancelled() && same.expired.is_cancelled());
        assert!(!late.expired.is_cancelled());
        assert_eq!(deadlines.len(), 1);
        drop((early, same, late));
        assert_eq!(deadlines.len(), 0);
    }
}
