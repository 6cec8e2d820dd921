//! Reusing device memory: idle buffers kept by usage and size class, so a
//! node's tensors, read-back staging and dispatch uniforms cost no driver
//! allocation (and no clearing by wgpu) once one of their class was freed.
//!
//! A buffer is held whole by one holder (a tensor, whose job is charged for
//! it) and comes back here when the holder drops it. Its contents are not
//! cleared on the way back: the next holder either overwrites every byte it
//! can read (an upload, a host kernel's result, a read-back copy) or has it
//! cleared on the GPU ([`super::Device::zeroed`]); bindings and copies span
//! the holder's own bytes, never the class's slack, so no job reads
//! another's data. Reuse needs no wait: every use of a buffer goes through
//! the device's one queue, whose work runs in submission order.
//!
//! Idle memory is bounded (`gpu_pool_mb`, and [`MAX_IDLE_BUFFERS`] buffers):
//! past it the buffers idle longest are released to the driver.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

/// What a pooled buffer is for (its wgpu usages).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Usage {
    /// A tensor: storage, copy source and destination.
    Storage,
    /// A read-back: mappable for reading, copy destination.
    Staging,
    /// A dispatch's uniform block.
    Uniform,
}

impl Usage {
    pub(crate) fn wgpu(self) -> wgpu::BufferUsages {
        use wgpu::BufferUsages as U;
        match self {
            Usage::Storage => U::STORAGE | U::COPY_SRC | U::COPY_DST,
            Usage::Staging => U::MAP_READ | U::COPY_DST,
            Usage::Uniform => U::UNIFORM | U::COPY_DST,
        }
    }
}

/// Smallest size class, bytes.
pub(crate) const MIN_CLASS: u64 = 256;

/// Most idle buffers kept, whatever their size.
pub(crate) const MAX_IDLE_BUFFERS: usize = 512;

/// The size class of a buffer of `bytes`: the next of 2ᵏ, 1.25·2ᵏ, 1.5·2ᵏ
/// and 1.75·2ᵏ at or above it (at most a quarter more than asked), at
/// least [`MIN_CLASS`]. `None` past `u64`.
pub(crate) fn class_of(bytes: u64) -> Option<u64> {
    if bytes <= MIN_CLASS {
        return Some(MIN_CLASS);
    }
    let power = bytes.checked_next_power_of_two()?;
    let quarter = power / 8;
    // Steps of a quarter of the power below: power/2 + k·power/8, k = 1..4.
    (1..=4).map(|k| power / 2 + k * quarter).find(|&c| c >= bytes)
}

/// Idle buffers of one device, oldest first.
pub(crate) struct Pool {
    idle: Mutex<Idle>,
    max_idle_bytes: u64,
    created: AtomicU64,
    reused: AtomicU64,
}

#[derive(Default)]
struct Idle {
    buffers: VecDeque<(Usage, u64, wgpu::Buffer)>,
    bytes: u64,
}

impl Pool {
    pub(crate) fn new(max_idle_bytes: u64) -> Pool {
        Pool { idle: Mutex::new(Idle::default()), max_idle_bytes, created: AtomicU64::new(0), reused: AtomicU64::new(0) }
    }

    /// An idle buffer of `usage` and `class` (the one freed last), if any.
    pub(crate) fn take(&self, usage: Usage, class: u64) -> Option<wgpu::Buffer> {
        let mut idle = self.idle.lock();
        let at = idle.buffers.iter().rposition(|(u, c, _)| *u == usage && *c == class)?;
        let (_, _, buffer) = idle.buffers.remove(at)?;
        idle.bytes -= class;
        self.reused.fetch_add(1, Ordering::Relaxed);
        Some(buffer)
    }

    /// Keeps `buffer` for reuse, releasing the buffers idle longest past the bounds.
    pub(crate) fn give(&self, usage: Usage, class: u64, buffer: wgpu::Buffer) {
        if class > self.max_idle_bytes {
            return;
        }
        let released = {
            let mut idle = self.idle.lock();
            idle.buffers.push_back((usage, class, buffer));
            idle.bytes += class;
            let mut released = Vec::new();
            while idle.bytes > self.max_idle_bytes || idle.buffers.len() > MAX_IDLE_BUFFERS {
                let Some((_, c, b)) = idle.buffers.pop_front() else { break };
                idle.bytes -= c;
                released.push(b);
            }
            released
        };
        // Released outside the lock: the driver's free may take a while.
        drop(released);
    }

    /// Releases every idle buffer (when the device runs out of memory).
    pub(crate) fn release_all(&self) {
        let released = {
            let mut idle = self.idle.lock();
            idle.bytes = 0;
            std::mem::take(&mut idle.buffers)
        };
        drop(released);
    }

    /// Counts a buffer reused without passing through the pool (one
    /// parked behind recorded commands).
    pub(crate) fn count_reused(&self) {
        self.reused.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a buffer the driver allocated.
    pub(crate) fn count_created(&self) {
        self.created.fetch_add(1, Ordering::Relaxed);
    }

    /// `(created, reused)`: buffers the driver allocated, and buffers taken
    /// from the pool instead, since the device opened.
    pub(crate) fn counts(&self) -> (u64, u64) {
        (self.created.load(Ordering::Relaxed), self.reused.load(Ordering::Relaxed))
    }

    /// Bytes idle now.
    pub(crate) fn idle_bytes(&self) -> u64 {
        self.idle.lock().bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_cover_the_size_and_waste_at_most_a_quarter() {
        assert_eq!(class_of(1), Some(MIN_CLASS));
        assert_eq!(class_of(256), Some(256));
        assert_eq!(class_of(257), Some(320));
        assert_eq!(class_of(64 << 20), Some(64 << 20));
        assert_eq!(class_of((64 << 20) + 1), Some(80 << 20));
        // A 3072² RGB f32 image.
        assert_eq!(class_of(3072 * 3072 * 3 * 4), Some(112 << 20));
        let mut bytes = 1u64;
        while bytes < 1 << 40 {
            for b in [bytes, bytes + 1, bytes * 3 / 2 + 7] {
                let class = class_of(b).unwrap();
                assert!(class >= b && (class <= MIN_CLASS || class - b <= class / 4), "{b} → {class}");
                assert_eq!(class_of(class), Some(class), "a class is its own class");
            }
            bytes = bytes * 2 + 3;
        }
        assert_eq!(class_of(u64::MAX), None);
    }
}
