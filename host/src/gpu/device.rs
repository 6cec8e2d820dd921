//! The wgpu device and queue, whether it was lost, and device buffers.
//!
//! Errors never reach wgpu's default handler (which panics): every
//! operation a kernel can influence runs inside error scopes ([`Device::scoped`]),
//! and anything that escapes them is logged by the uncaptured-error handler.
//! A lost device is flagged by its callback; [`super::Gpu::device`] then
//! builds a new one, and buffers of the old one answer `DeviceLost`.
//! Buffers come from and go back to the device's [`Pool`]; small work may be
//! recorded for the next submission ([`Batch`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use lru::LruCache;
use parking_lot::Mutex;

use super::batch::Batch;
use super::pool::{Pool, Usage, class_of};
use super::{GpuError, GpuLimits, Kernel};

/// One wgpu device: the queue, its compiled kernels and whether it was lost.
pub struct Device {
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    lost: Arc<AtomicBool>,
    generation: u64,
    pub(crate) kernels: Mutex<LruCache<blake3::Hash, Arc<Kernel>>>,
    /// Kernels compiled (not fetched from the cache) on this device.
    pub(crate) compiled: AtomicU64,
    /// Most bytes one binding may span: the adapter's storage-binding
    /// limit, capped by `gpu_max_buffer_mb`. A plugin's kernel binds whole
    /// tensors, so its tensors stay within it; the host's kernels bind a
    /// window of each tensor per band (see `super::ops`), so theirs may be
    /// as large as a buffer.
    max_binding_bytes: AtomicU64,
    /// Largest buffer the device allocates (staging included): the
    /// adapter's, capped by `gpu_max_buffer_mb`.
    max_buffer_bytes: u64,
    /// Where a binding may start in a buffer: a multiple of this many bytes.
    binding_alignment: u64,
    /// Idle buffers for reuse.
    pub(crate) pool: Pool,
    /// Held by each poll and each submission (which polls too): wgpu-core
    /// 30.0.2 panics (an assertion in `Device::maintain`; the map callbacks
    /// that poll retired are dropped uncalled) when one thread's timed wait
    /// runs out while another thread's poll retires the queue (fixed
    /// upstream after that release, gfx-rs/wgpu#9958). Waits poll in
    /// slices of at most [`POLL_SLICE`], so no thread holds it for long.
    poll_lock: Mutex<()>,
    /// Commands recorded for the next submission, and the buffers parked
    /// behind them.
    batch: Batch,
    /// Submissions made to the queue.
    submissions: AtomicU64,
    /// Test hook: read-back callbacks fire this many ms late, from another
    /// thread (as when another thread's poll collects them).
    #[cfg(test)]
    pub(crate) late_callbacks_ms: AtomicU64,
}

/// The longest one poll of a wait holds the device's other pollers and
/// submitters back.
const POLL_SLICE: Duration = Duration::from_millis(1);

/// Unique ids for device buffers (which node may write which).
static NEXT_BUFFER: AtomicU64 = AtomicU64::new(1);

impl Device {
    /// Opens a device on `adapter` with the adapter's own buffer limits
    /// (capped by `limits`), wired so errors and loss never panic.
    pub(crate) fn create(adapter: &wgpu::Adapter, limits: &GpuLimits, generation: u64) -> Result<Device, String> {
        let supported = adapter.limits();
        let required = wgpu::Limits {
            max_buffer_size: supported.max_buffer_size.min(limits.max_buffer_bytes),
            max_storage_buffer_binding_size: supported.max_storage_buffer_binding_size.min(limits.max_buffer_bytes),
            max_storage_buffers_per_shader_stage: supported.max_storage_buffers_per_shader_stage.min(16),
            max_compute_workgroups_per_dimension: supported.max_compute_workgroups_per_dimension,
            max_compute_invocations_per_workgroup: supported.max_compute_invocations_per_workgroup,
            max_compute_workgroup_size_x: supported.max_compute_workgroup_size_x,
            max_compute_workgroup_size_y: supported.max_compute_workgroup_size_y,
            max_compute_workgroup_size_z: supported.max_compute_workgroup_size_z,
            max_compute_workgroup_storage_size: supported.max_compute_workgroup_storage_size,
            ..wgpu::Limits::downlevel_defaults()
        };
        let max_binding_bytes = required.max_storage_buffer_binding_size.min(required.max_buffer_size);
        let max_buffer_bytes = required.max_buffer_size;
        let required_alignment = required.min_storage_buffer_offset_alignment.max(4);
        let descriptor = wgpu::DeviceDescriptor { label: Some("kiln"), required_limits: required, ..Default::default() };
        let (device, queue) = pollster::block_on(adapter.request_device(&descriptor)).map_err(|e| format!("cannot open the GPU device: {e}"))?;
        device.on_uncaptured_error(Arc::new(|e: wgpu::Error| tracing::warn!(error = %e, "GPU error outside any operation")));
        let lost = Arc::new(AtomicBool::new(false));
        let flag = lost.clone();
        device.set_device_lost_callback(move |reason, message| {
            tracing::warn!(?reason, detail = %message, "GPU device lost");
            flag.store(true, Ordering::Release);
        });
        let capacity = std::num::NonZeroUsize::new(limits.max_cached_kernels.max(1)).unwrap_or(std::num::NonZeroUsize::MIN);
        Ok(Device {
            device,
            queue,
            lost,
            generation,
            kernels: Mutex::new(LruCache::new(capacity)),
            compiled: AtomicU64::new(0),
            max_binding_bytes: AtomicU64::new(max_binding_bytes),
            max_buffer_bytes,
            binding_alignment: u64::from(required_alignment),
            pool: Pool::new(limits.max_idle_bytes),
            poll_lock: Mutex::new(()),
            batch: Batch::new(limits.max_idle_bytes / 2),
            submissions: AtomicU64::new(0),
            #[cfg(test)]
            late_callbacks_ms: AtomicU64::new(0),
        })
    }

    /// Whether the device was lost (its buffers are gone).
    pub fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }

    /// Which device this is since start (0, then 1 after a first loss…).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Kernels compiled on this device so far (cache hits do not count).
    pub fn kernels_compiled(&self) -> u64 {
        self.compiled.load(Ordering::Relaxed)
    }

    /// Runs `f` inside validation, out-of-memory and internal error scopes;
    /// the first error captured becomes the result.
    pub(crate) fn scoped<T>(&self, f: impl FnOnce() -> T) -> Result<T, GpuError> {
        if self.is_lost() {
            return Err(GpuError::DeviceLost);
        }
        let internal = self.device.push_error_scope(wgpu::ErrorFilter::Internal);
        let memory = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let validation = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let value = f();
        let errors = [validation.pop(), memory.pop(), internal.pop()].map(pollster::block_on);
        if self.is_lost() {
            return Err(GpuError::DeviceLost);
        }
        match errors.into_iter().flatten().next() {
            Some(e) => Err(GpuError::Driver(error_text(&e))),
            None => Ok(value),
        }
    }

    /// Waits for `submission` until `deadline`, a slice at a time (see
    /// `poll_lock`).
    pub fn wait(&self, submission: wgpu::SubmissionIndex, deadline: Instant) -> Result<(), GpuError> {
        loop {
            let slice = deadline.saturating_duration_since(Instant::now()).clamp(Duration::from_millis(1), POLL_SLICE);
            let waited = {
                let _one = self.poll_lock.lock();
                self.device.poll(wgpu::PollType::Wait { submission_index: Some(submission.clone()), timeout: Some(slice) })
            };
            if self.is_lost() {
                return Err(GpuError::DeviceLost);
            }
            match waited {
                Ok(_) => return Ok(()),
                Err(wgpu::PollError::Timeout) if Instant::now() < deadline => continue,
                Err(wgpu::PollError::Timeout) => return Err(GpuError::Timeout),
                Err(e) => return Err(GpuError::Driver(e.to_string())),
            }
        }
    }

    /// Waits until `deadline` for all work submitted so far (an empty
    /// submission, waited for: the queue runs in order).
    pub fn finish(&self, deadline: Instant) -> Result<(), GpuError> {
        let submission = self.submit([]);
        self.wait(submission, deadline)
    }

    /// Submits command buffers (one poller at a time: see `poll_lock`),
    /// after the commands recorded so far (with none given, the recorded
    /// ones are the submission).
    pub(crate) fn submit<I: IntoIterator<Item = wgpu::CommandBuffer>>(&self, buffers: I) -> wgpu::SubmissionIndex {
        let buffers: Vec<wgpu::CommandBuffer> = buffers.into_iter().collect();
        let mut open = self.batch.lock();
        let taken = open.take();
        let index = {
            let _one = self.poll_lock.lock();
            let recorded = taken.commands.map(|commands| self.submit_recorded(commands));
            match recorded {
                Some(index) if buffers.is_empty() => index,
                _ => {
                    self.submissions.fetch_add(1, Ordering::Relaxed);
                    self.queue.submit(buffers)
                }
            }
        };
        drop(open);
        self.pool_parked(taken.parked);
        index
    }

    /// Records `dispatches` dispatches with `f` for the next submission
    /// (see [`Batch`]), submitting them now once the batch is full, or when
    /// `if_idle` and the GPU has finished all it was given (it would
    /// otherwise wait for work already recorded).
    pub(crate) fn record(&self, dispatches: u32, if_idle: bool, f: impl FnOnce(&mut wgpu::CommandEncoder)) {
        let open = || self.device.create_command_encoder(&wgpu::CommandEncoderDescriptor::default());
        let full = self.batch.lock().record(open, dispatches, f);
        if full || (if_idle && self.queue_idle()) {
            self.flush();
        }
    }

    /// Whether every submission so far has finished (a poll that does not
    /// wait).
    fn queue_idle(&self) -> bool {
        let _one = self.poll_lock.lock();
        matches!(self.device.poll(wgpu::PollType::Poll), Ok(status) if status.is_queue_empty())
    }

    /// Submits the recorded commands, if any.
    pub(crate) fn flush(&self) {
        let mut open = self.batch.lock();
        let taken = open.take();
        if let Some(commands) = taken.commands {
            let _one = self.poll_lock.lock();
            let _ = self.submit_recorded(commands);
        }
        drop(open);
        self.pool_parked(taken.parked);
    }

    /// Submits recorded commands inside their own error scopes. An error
    /// there belongs to work whose node has already returned and whose
    /// results were never written, so the device is treated as lost (its
    /// buffers answer `DeviceLost`, the next use opens a new one) rather
    /// than let a reader see a reused buffer's old contents. Recorded work
    /// is the host's own, checked like every dispatch: this is not expected.
    fn submit_recorded(&self, commands: wgpu::CommandEncoder) -> wgpu::SubmissionIndex {
        let internal = self.device.push_error_scope(wgpu::ErrorFilter::Internal);
        let memory = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let validation = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        self.submissions.fetch_add(1, Ordering::Relaxed);
        let index = self.queue.submit([commands.finish()]);
        let errors = [validation.pop(), memory.pop(), internal.pop()].map(pollster::block_on);
        if let Some(e) = errors.into_iter().flatten().next() {
            tracing::error!(error = %error_text(&e), "recorded GPU work failed: the device is dropped");
            self.lost.store(true, Ordering::Release);
        }
        index
    }

    /// Pools buffers that were parked behind submitted commands.
    fn pool_parked(&self, parked: Vec<Pooled>) {
        if self.is_lost() {
            return;
        }
        for p in parked {
            self.pool.give(p.usage, p.class, p.buffer);
        }
    }

    /// Submissions made to the queue since the device opened.
    pub fn submissions(&self) -> u64 {
        self.submissions.load(Ordering::Relaxed)
    }

    /// Processes finished work without blocking: runs the callbacks due.
    pub(crate) fn poll_now(&self) -> Result<(), GpuError> {
        let polled = {
            let _one = self.poll_lock.lock();
            self.device.poll(wgpu::PollType::Poll)
        };
        if self.is_lost() {
            return Err(GpuError::DeviceLost);
        }
        polled.map(|_| ()).map_err(|e| GpuError::Driver(e.to_string()))
    }

    /// Most bytes one binding may span (a plugin's whole tensor; one
    /// window of a host kernel's).
    pub fn max_binding_bytes(&self) -> u64 {
        self.max_binding_bytes.load(Ordering::Relaxed)
    }

    /// Where a binding may start in a buffer: a multiple of this many bytes.
    pub fn binding_alignment(&self) -> u64 {
        self.binding_alignment
    }

    /// Largest device tensor, bytes.
    pub fn max_buffer_bytes(&self) -> u64 {
        self.max_buffer_bytes
    }

    /// Test hook: bindings span at most `bytes` from now on, so small
    /// tensors take the tiled path the adapter's limit gives large ones.
    #[cfg(test)]
    pub(crate) fn cap_bindings(&self, bytes: u64) {
        self.max_binding_bytes.store(bytes, Ordering::Relaxed);
    }

    /// Buffers the driver allocated on this device, and buffers reused
    /// instead (from its pool, or parked behind recorded commands).
    pub fn buffer_counts(&self) -> (u64, u64) {
        self.pool.counts()
    }

    /// Bytes of idle pooled buffers now.
    pub fn idle_bytes(&self) -> u64 {
        self.pool.idle_bytes()
    }

    /// A buffer of `usage` holding at least `bytes`: from the pool, else
    /// allocated (inside error scopes: out of memory is an error, not a
    /// panic). `fresh`: allocated now, so wgpu cleared it.
    pub(crate) fn buffer(&self, usage: Usage, bytes: u64, first_write: FirstWrite) -> Result<Pooled, GpuError> {
        if self.is_lost() {
            return Err(GpuError::DeviceLost);
        }
        // A size class over the device's largest buffer: exactly the size
        // asked (pooled under that size alone).
        let class = class_of(bytes)
            .filter(|&c| c <= self.max_buffer_bytes)
            .or_else(|| bytes.checked_next_multiple_of(4))
            .ok_or_else(|| GpuError::InvalidDispatch(format!("a buffer of {bytes} bytes")))?;
        if first_write == FirstWrite::Commands
            && let Some(parked) = self.batch.lock().unpark(usage, class)
        {
            self.pool.count_reused();
            return Ok(Pooled { fresh: false, ..parked });
        }
        if let Some(buffer) = self.pool.take(usage, class) {
            return Ok(Pooled { buffer, usage, class, fresh: false });
        }
        let create =
            || self.scoped(|| self.device.create_buffer(&wgpu::BufferDescriptor { label: None, size: class, usage: usage.wgpu(), mapped_at_creation: false }));
        let buffer = match create() {
            // Out of device memory with idle buffers kept: release them, once.
            Err(GpuError::Driver(_)) if self.pool.idle_bytes() > 0 => {
                self.pool.release_all();
                create()?
            }
            other => other?,
        };
        self.pool.count_created();
        Ok(Pooled { buffer, usage, class, fresh: true })
    }

    /// Gives `pooled` back for reuse (not on a lost device): parked while
    /// recorded commands may use it (see [`Batch`]).
    pub(crate) fn recycle(&self, pooled: Pooled) {
        if self.is_lost() {
            return;
        }
        let parked = self.batch.lock().park(pooled);
        match parked {
            Err(pooled) => self.pool.give(pooled.usage, pooled.class, pooled.buffer),
            Ok(true) => self.flush(),
            Ok(false) => {}
        }
    }

    /// A storage buffer of `len` f32 values whose contents are undefined:
    /// for a result every value of which the caller writes with GPU commands
    /// before anything reads it (the host's kernels write every value of
    /// their results).
    pub(crate) fn for_overwrite(self: &Arc<Self>, len: usize) -> Result<DeviceBuffer, GpuError> {
        self.storage(len, FirstWrite::Commands)
    }

    /// A storage buffer of `len` f32 values, first written as `first_write`
    /// says: at most the device's largest buffer (the host's kernels bind
    /// larger-than-binding tensors a window at a time).
    fn storage(self: &Arc<Self>, len: usize, first_write: FirstWrite) -> Result<DeviceBuffer, GpuError> {
        let size = byte_size(len)?;
        if size > self.max_buffer_bytes {
            return Err(GpuError::InvalidDispatch(format!(
                "a {} MiB tensor: the GPU holds at most {} MiB in one buffer (the adapter's limit, or gpu_max_buffer_mb)",
                size.div_ceil(1 << 20),
                self.max_buffer_bytes >> 20
            )));
        }
        let pooled = self.buffer(Usage::Storage, size, first_write)?;
        Ok(DeviceBuffer::new(pooled, len, self.clone()))
    }

    /// A zero-filled storage buffer of `len` f32 values for a plugin's
    /// kernels, which bind it whole: at most the binding limit. A reused
    /// one is cleared on the GPU first (queued before any later work), so
    /// no job sees another's data.
    pub fn zeroed(self: &Arc<Self>, len: usize) -> Result<DeviceBuffer, GpuError> {
        check_binding(byte_size(len)?, self.max_binding_bytes())?;
        let buffer = self.for_overwrite(len)?;
        if !buffer.fresh {
            let size = byte_size(len)?;
            self.scoped(|| {
                let mut encoder = self.device.create_command_encoder(&wgpu::CommandEncoderDescriptor::default());
                encoder.clear_buffer(buffer.raw(), 0, Some(size));
                self.submit([encoder.finish()]);
            })?;
        }
        Ok(buffer)
    }

    /// A storage buffer holding `data` (queued before any later work).
    pub fn upload(self: &Arc<Self>, data: &[f32]) -> Result<DeviceBuffer, GpuError> {
        let buffer = self.storage(data.len(), FirstWrite::Queue)?;
        self.scoped(|| self.queue.write_buffer(buffer.raw(), 0, bytemuck::cast_slice(data)))?;
        Ok(buffer)
    }

    /// A small read-only storage buffer of `u32`/`f32` words (tap tables).
    pub(crate) fn words(self: &Arc<Self>, words: &[u32]) -> Result<DeviceBuffer, GpuError> {
        let floats: &[f32] = bytemuck::cast_slice(words);
        self.upload(floats)
    }
}

/// A buffer taken from (or made for) a device's pool.
pub(crate) struct Pooled {
    pub(crate) buffer: wgpu::Buffer,
    usage: Usage,
    class: u64,
    /// Allocated now (wgpu cleared it), not reused.
    fresh: bool,
}

impl Pooled {
    /// Its size class, bytes.
    pub(crate) fn class(&self) -> u64 {
        self.class
    }

    /// What it is for.
    pub(crate) fn usage(&self) -> Usage {
        self.usage
    }
}

/// How a buffer taken for a new holder is first written, which decides
/// whether a buffer parked behind recorded commands will do (see [`Batch`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FirstWrite {
    /// By commands (a kernel, a clear, a copy), which the queue runs after
    /// the recorded ones: a parked buffer will do.
    Commands,
    /// By `write_buffer`, which the queue runs before recorded commands:
    /// only a pooled buffer.
    Queue,
}

/// Refuses a binding of `bytes` over `max` (the device's binding limit).
pub(crate) fn check_binding(bytes: u64, max: u64) -> Result<(), GpuError> {
    if bytes > max {
        return Err(GpuError::InvalidDispatch(format!(
            "a {} MiB tensor: the GPU binds at most {} MiB to a kernel (the adapter's limit, or gpu_max_buffer_mb)",
            bytes.div_ceil(1 << 20),
            max >> 20
        )));
    }
    Ok(())
}

pub(crate) fn byte_size(len: usize) -> Result<u64, GpuError> {
    (len as u64).checked_mul(4).filter(|&b| b > 0).ok_or_else(|| GpuError::InvalidDispatch(format!("a buffer of {len} values")))
}

fn error_text(e: &wgpu::Error) -> String {
    match e {
        wgpu::Error::OutOfMemory { .. } => "out of device memory".to_string(),
        // The description's first line is a heading ("Validation Error"); the
        // cause follows. One line, bounded.
        wgpu::Error::Validation { description, .. } | wgpu::Error::Internal { description, .. } => {
            let text = description.split_whitespace().collect::<Vec<_>>().join(" ");
            text.chars().take(2000).collect()
        }
    }
}

/// A device tensor's storage: `len` f32 values on one device, in a pooled
/// buffer that goes back to the pool when this is dropped.
pub struct DeviceBuffer {
    buffer: wgpu::Buffer,
    usage: Usage,
    class: u64,
    fresh: bool,
    len: usize,
    id: u64,
    device: Arc<Device>,
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // `wgpu::Buffer` is a shared handle: the pool keeps a clone.
        let pooled = Pooled { buffer: self.buffer.clone(), usage: self.usage, class: self.class, fresh: false };
        self.device.recycle(pooled);
    }
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceBuffer({} values, #{})", self.len, self.id)
    }
}

impl DeviceBuffer {
    fn new(pooled: Pooled, len: usize, device: Arc<Device>) -> DeviceBuffer {
        let Pooled { buffer, usage, class, fresh } = pooled;
        DeviceBuffer { buffer, usage, class, fresh, len, id: NEXT_BUFFER.fetch_add(1, Ordering::Relaxed), device }
    }

    /// The whole wgpu buffer (its size class: more than this tensor's bytes).
    pub(crate) fn raw(&self) -> &wgpu::Buffer {
        &self.buffer
    }

    /// Values `window` of this tensor (all of them when `None`), for a
    /// bind group: never the class's slack, so a kernel's out-of-bounds
    /// accesses stay inside its own values. The caller checked the window
    /// (`super::dispatch::check`).
    pub(crate) fn binding(&self, window: Option<&std::ops::Range<usize>>) -> wgpu::BindingResource<'_> {
        let (offset, len) = window.map_or((0, self.len), |w| (w.start, w.len()));
        let size = std::num::NonZeroU64::new(len as u64 * 4);
        wgpu::BindingResource::Buffer(wgpu::BufferBinding { buffer: &self.buffer, offset: offset as u64 * 4, size })
    }

    /// Number of f32 values.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer holds nothing (never: sizes are checked).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A process-unique id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The device holding it.
    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }
}
