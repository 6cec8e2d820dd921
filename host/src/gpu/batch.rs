//! Small GPU work recorded now and submitted with the device's next
//! submission.
//!
//! A submission has a fixed cost on the GPU as well as on the host: on an
//! H200, host kernels on a resident 4096² tensor ran 59 µs apart when each
//! was its own submission and 39 µs apart fifty to a submission. So a host
//! kernel's last band, when its work is small (see `ops::DEFER_WORK`), is
//! recorded into the device's open command encoder rather than submitted.
//! Whatever submits next — a read-back's copy, a larger band, a plugin's
//! dispatch, a wait for all work — submits the recorded commands first, in
//! the order they were recorded, so a reader still sees its input written.
//! At most [`MAX_RECORDED`] dispatches wait so; work nobody reads may wait
//! until the next submission, which costs nothing but the parked memory.
//!
//! Buffers given back while commands are recorded may still be used by
//! them: they are parked here, not pooled, until those commands are
//! submitted — a pooled buffer may be written at once (`write_buffer`,
//! which the queue runs before the next submission's commands), and the
//! recorded commands must not see that. A taker whose first write is itself
//! a command (a kernel's result, a clear) may have one: its write runs after
//! the recorded commands, in queue order. Parked buffers are idle memory like
//! the pool's: past half the pool's bound (`gpu_pool_mb`) the recorded
//! commands are submitted so they go back.

use parking_lot::{Mutex, MutexGuard};

use super::device::Pooled;
use super::pool::Usage;

/// Most dispatches recorded before they are submitted.
pub(crate) const MAX_RECORDED: u32 = 32;

/// The device's open command encoder and the buffers parked behind it.
pub(crate) struct Batch {
    open: Mutex<Open>,
}

pub(crate) struct Open {
    encoder: Option<wgpu::CommandEncoder>,
    dispatches: u32,
    parked: Vec<Pooled>,
    parked_bytes: u64,
    max_parked_bytes: u64,
}

/// What a submission takes from the batch: the recorded commands and the
/// buffers to pool once they are submitted.
pub(crate) struct Taken {
    pub(crate) commands: Option<wgpu::CommandEncoder>,
    pub(crate) parked: Vec<Pooled>,
}

impl Batch {
    /// An empty batch that submits once `max_parked_bytes` are parked.
    pub(crate) fn new(max_parked_bytes: u64) -> Batch {
        Batch { open: Mutex::new(Open { encoder: None, dispatches: 0, parked: Vec::new(), parked_bytes: 0, max_parked_bytes }) }
    }

    /// Locks the batch: held across a submission, so recorded commands and
    /// the submission that follows them reach the queue in order.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Open> {
        self.open.lock()
    }
}

impl Open {
    /// Records `dispatches` dispatches with `f` into the open encoder
    /// (opened with `open` if none is); whether the batch is now full.
    pub(crate) fn record(&mut self, open: impl FnOnce() -> wgpu::CommandEncoder, dispatches: u32, f: impl FnOnce(&mut wgpu::CommandEncoder)) -> bool {
        f(self.encoder.get_or_insert_with(open));
        self.dispatches = self.dispatches.saturating_add(dispatches);
        self.dispatches >= MAX_RECORDED
    }

    /// Parks `pooled` while commands are recorded (`Ok`: true once the
    /// parked bytes pass their bound), else hands it back to be pooled now.
    pub(crate) fn park(&mut self, pooled: Pooled) -> Result<bool, Pooled> {
        if self.encoder.is_none() {
            return Err(pooled);
        }
        self.parked_bytes = self.parked_bytes.saturating_add(pooled.class());
        self.parked.push(pooled);
        Ok(self.parked_bytes > self.max_parked_bytes)
    }

    /// A parked buffer of `usage` and `class`, for a taker whose first
    /// write is a command recorded or submitted after the commands that may
    /// still use it (so it runs after them, in queue order).
    pub(crate) fn unpark(&mut self, usage: Usage, class: u64) -> Option<Pooled> {
        let at = self.parked.iter().rposition(|p| p.usage() == usage && p.class() == class)?;
        let pooled = self.parked.swap_remove(at);
        self.parked_bytes = self.parked_bytes.saturating_sub(class);
        Some(pooled)
    }

    /// Takes the recorded commands and the parked buffers.
    pub(crate) fn take(&mut self) -> Taken {
        self.dispatches = 0;
        self.parked_bytes = 0;
        Taken { commands: self.encoder.take(), parked: std::mem::take(&mut self.parked) }
    }
}
