//! What one job may consume, and what it holds now.
//!
//! A [`JobBudget`] is shared by every node call of one run. Memory is
//! charged by whoever allocates on the job's behalf — a tensor a node
//! creates or a kernel computes, a host copy made for a node, a node's
//! linear memory as it grows — through a [`MemoryCharge`] that gives the
//! bytes back when it is dropped, so the account follows the allocation's
//! real lifetime (a node result is released when its last reader is done
//! with it). Saved files are charged by count and by bytes (names
//! included) and never given back within the run. Every refusal is a
//! [`BudgetError`] naming the setting that bounds it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// The bounds of one job (config `job_memory_mb`, `job_max_files`,
/// `job_output_mb`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobLimits {
    /// Live memory: tensors, host copies and linear memories.
    pub memory_bytes: u64,
    /// Files saved.
    pub max_files: u64,
    /// Bytes of files saved, names included.
    pub output_bytes: u64,
}

impl JobLimits {
    /// No bound at all (tests and callers that bound elsewhere).
    pub const UNLIMITED: JobLimits = JobLimits { memory_bytes: u64::MAX, max_files: u64::MAX, output_bytes: u64::MAX };

    /// The bounds `config` sets.
    pub fn from_config(config: &crate::config::Config) -> JobLimits {
        JobLimits {
            memory_bytes: config.job_memory_mb.saturating_mul(1 << 20),
            max_files: config.job_max_files,
            output_bytes: config.job_output_mb.saturating_mul(1 << 20),
        }
    }
}

/// Why the job may not have more.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BudgetError {
    #[error("the job's memory limit of {} MiB (job_memory_mb) is reached: {} MiB in use, {} MiB more asked", .limit >> 20, .used >> 20, .asked.div_ceil(1 << 20))]
    Memory { limit: u64, used: u64, asked: u64 },
    #[error("the job may save at most {limit} files (job_max_files)")]
    Files { limit: u64 },
    #[error("the job may save at most {} MiB of files (job_output_mb)", .limit >> 20)]
    OutputBytes { limit: u64 },
}

/// The account of one job.
#[derive(Debug)]
pub struct JobBudget {
    limits: JobLimits,
    memory: AtomicU64,
    peak: AtomicU64,
    files: AtomicU64,
    output_bytes: AtomicU64,
}

impl JobBudget {
    /// A fresh account under `limits`.
    pub fn new(limits: JobLimits) -> Arc<JobBudget> {
        Arc::new(JobBudget { limits, memory: AtomicU64::new(0), peak: AtomicU64::new(0), files: AtomicU64::new(0), output_bytes: AtomicU64::new(0) })
    }

    /// The bounds.
    pub fn limits(&self) -> JobLimits {
        self.limits
    }

    /// Bytes held now.
    pub fn memory_in_use(&self) -> u64 {
        self.memory.load(Ordering::Relaxed)
    }

    /// The most bytes held at once so far.
    pub fn peak_memory(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }

    /// Takes `bytes` of memory until the returned charge is dropped.
    pub fn reserve(self: &Arc<Self>, bytes: u64) -> Result<MemoryCharge, BudgetError> {
        let mut used = self.memory.load(Ordering::Relaxed);
        loop {
            let next = used.saturating_add(bytes);
            if next > self.limits.memory_bytes {
                return Err(BudgetError::Memory { limit: self.limits.memory_bytes, used, asked: bytes });
            }
            match self.memory.compare_exchange_weak(used, next, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => {
                    self.peak.fetch_max(next, Ordering::Relaxed);
                    return Ok(MemoryCharge { budget: Some(self.clone()), bytes });
                }
                Err(now) => used = now,
            }
        }
    }

    /// Counts one saved file of `bytes` (content and name).
    pub fn charge_file(&self, bytes: u64) -> Result<(), BudgetError> {
        let files = self.files.fetch_add(1, Ordering::AcqRel);
        if files >= self.limits.max_files {
            self.files.fetch_sub(1, Ordering::AcqRel);
            return Err(BudgetError::Files { limit: self.limits.max_files });
        }
        let before = self.output_bytes.fetch_add(bytes, Ordering::AcqRel);
        if before.saturating_add(bytes) > self.limits.output_bytes {
            self.output_bytes.fetch_sub(bytes, Ordering::AcqRel);
            self.files.fetch_sub(1, Ordering::AcqRel);
            return Err(BudgetError::OutputBytes { limit: self.limits.output_bytes });
        }
        Ok(())
    }

    fn release(&self, bytes: u64) {
        self.memory.fetch_sub(bytes, Ordering::AcqRel);
    }
}

/// Bytes held against a job's memory limit until dropped.
#[derive(Debug, Default)]
pub struct MemoryCharge {
    budget: Option<Arc<JobBudget>>,
    bytes: u64,
}

impl MemoryCharge {
    /// A charge against nothing (allocations no job pays for).
    pub fn none() -> MemoryCharge {
        MemoryCharge::default()
    }

    /// The bytes held.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Adds `bytes` to this charge (a memory that grows); on refusal the
    /// charge is unchanged. A charge against nothing grows freely.
    pub fn grow(&mut self, bytes: u64) -> Result<(), BudgetError> {
        if let Some(budget) = &self.budget {
            // Folded into this charge, which gives the bytes back.
            let mut more = budget.reserve(bytes)?;
            more.budget = None;
        }
        self.bytes = self.bytes.saturating_add(bytes);
        Ok(())
    }
}

impl Drop for MemoryCharge {
    fn drop(&mut self) {
        if let Some(budget) = self.budget.take() {
            budget.release(self.bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn memory_is_held_until_the_charge_drops_and_refusals_name_the_setting() {
        let budget = JobBudget::new(JobLimits { memory_bytes: 10 * MIB, ..JobLimits::UNLIMITED });
        let a = budget.reserve(6 * MIB).unwrap();
        let err = budget.reserve(5 * MIB).unwrap_err();
        assert_eq!(err, BudgetError::Memory { limit: 10 * MIB, used: 6 * MIB, asked: 5 * MIB });
        assert!(err.to_string().contains("job_memory_mb"), "{err}");
        let b = budget.reserve(4 * MIB).unwrap();
        assert_eq!(budget.memory_in_use(), 10 * MIB);
        drop(a);
        assert_eq!(budget.memory_in_use(), 4 * MIB);
        drop(b);
        assert_eq!((budget.memory_in_use(), budget.peak_memory()), (0, 10 * MIB));
    }

    #[test]
    fn a_growing_charge_is_bounded_and_released_whole() {
        let budget = JobBudget::new(JobLimits { memory_bytes: 8 * MIB, ..JobLimits::UNLIMITED });
        let mut memory = budget.reserve(MIB).unwrap();
        memory.grow(5 * MIB).unwrap();
        assert!(memory.grow(3 * MIB).is_err());
        assert_eq!((memory.bytes(), budget.memory_in_use()), (6 * MIB, 6 * MIB));
        drop(memory);
        assert_eq!(budget.memory_in_use(), 0);
        let mut free = MemoryCharge::none();
        free.grow(u64::MAX).unwrap();
    }

    #[test]
    fn files_are_bounded_by_count_and_bytes() {
        let budget = JobBudget::new(JobLimits { memory_bytes: 0, max_files: 3, output_bytes: 100 });
        budget.charge_file(60).unwrap();
        assert_eq!(budget.charge_file(41).unwrap_err(), BudgetError::OutputBytes { limit: 100 });
        budget.charge_file(40).unwrap();
        budget.charge_file(0).unwrap();
        assert_eq!(budget.charge_file(0).unwrap_err(), BudgetError::Files { limit: 3 });
    }
}
