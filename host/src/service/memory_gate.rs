//! Server-wide memory that requests hold outside any job: a submission
//! while it is parsed and validated, an uploaded mask while it is decoded,
//! and a queued job's parsed workflow while it waits. Each is estimated
//! before the work (from the request's bytes and value count, or an image's
//! dimensions) and taken from a [`MemoryGate`], a byte budget: a request
//! waits until its estimate fits, so the sum held at once stays within the
//! setting however many requests arrive together; one that could never fit
//! is refused.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The budget's unit: estimates are rounded up to whole KiB.
const UNIT: u64 = 1024;

/// A byte budget shared by concurrent requests.
pub struct MemoryGate {
    permits: Arc<Semaphore>,
    total: u64,
    /// The setting that sizes it, for error messages.
    setting: &'static str,
}

/// An estimate larger than the whole budget.
#[derive(Debug, thiserror::Error)]
#[error("the request needs about {} MiB, more than the server's {} MiB for such work ({setting})", .needed >> 20, .total >> 20)]
pub struct OverBudget {
    pub needed: u64,
    pub total: u64,
    pub setting: &'static str,
}

/// Memory taken from a gate; given back when dropped.
#[derive(Debug)]
pub struct GatePermit {
    _permit: OwnedSemaphorePermit,
}

impl MemoryGate {
    /// A gate of `total` bytes, sized by `setting`.
    pub fn new(total: u64, setting: &'static str) -> MemoryGate {
        let units = (total / UNIT).clamp(1, Semaphore::MAX_PERMITS as u64 / 2);
        MemoryGate { permits: Arc::new(Semaphore::new(units as usize)), total: units * UNIT, setting }
    }

    fn units(&self, bytes: u64) -> Result<u32, OverBudget> {
        let units = bytes.div_ceil(UNIT).max(1);
        if units.saturating_mul(UNIT) > self.total {
            return Err(OverBudget { needed: bytes, total: self.total, setting: self.setting });
        }
        u32::try_from(units).map_err(|_| OverBudget { needed: bytes, total: self.total, setting: self.setting })
    }

    /// Takes `bytes`, waiting (first come, first served) until they fit.
    pub async fn enter(&self, bytes: u64) -> Result<GatePermit, OverBudget> {
        let units = self.units(bytes)?;
        let permit =
            self.permits.clone().acquire_many_owned(units).await.map_err(|_| OverBudget { needed: bytes, total: self.total, setting: self.setting })?;
        Ok(GatePermit { _permit: permit })
    }

    /// Takes `bytes` if they fit now.
    pub fn try_enter(&self, bytes: u64) -> Option<GatePermit> {
        let units = self.units(bytes).ok()?;
        self.permits.clone().try_acquire_many_owned(units).ok().map(|p| GatePermit { _permit: p })
    }

    /// Bytes free now.
    pub fn available(&self) -> u64 {
        self.permits.available_permits() as u64 * UNIT
    }

    /// The budget.
    pub fn total(&self) -> u64 {
        self.total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn holders_wait_until_their_estimate_fits() {
        let gate = Arc::new(MemoryGate::new(10 << 20, "test_mb"));
        let first = gate.enter(6 << 20).await.unwrap();
        assert!(gate.try_enter(6 << 20).is_none(), "two would exceed the budget");
        let waiter = {
            let gate = gate.clone();
            tokio::spawn(async move { gate.enter(6 << 20).await.map(|_| ()) })
        };
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        drop(first);
        waiter.await.unwrap().unwrap();
        assert_eq!(gate.available(), 10 << 20);
    }

    #[test]
    fn an_estimate_over_the_whole_budget_is_refused_naming_the_setting() {
        let gate = MemoryGate::new(1 << 20, "intake_memory_mb");
        assert!(gate.try_enter(2 << 20).is_none());
        let err = tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(gate.enter(2 << 20)).unwrap_err();
        assert!(err.to_string().contains("intake_memory_mb"), "{err}");
        assert!(gate.try_enter(512 << 10).is_some());
    }
}
