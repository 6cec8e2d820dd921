//! The wgpu device and queue, whether it was lost, and device buffers.
//!
//! Errors never reach wgpu's default handler (which panics): every
//! operation a kernel can influence runs inside error scopes ([`Device::scoped`]),
//! and anything that escapes them is logged by the uncaptured-error handler.
//! A lost device is flagged by its callback; [`super::Gpu::device`] then
//! builds a new one, and buffers of the old one answer `DeviceLost`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use lru::LruCache;
use parking_lot::Mutex;

use super::{GpuError, GpuLimits, Kernel, TRANSFER_TIMEOUT};

/// One wgpu device: the queue, its compiled kernels and whether it was lost.
pub struct Device {
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    lost: Arc<AtomicBool>,
    generation: u64,
    pub(crate) kernels: Mutex<LruCache<blake3::Hash, Arc<Kernel>>>,
    /// Kernels compiled (not fetched from the cache) on this device.
    pub(crate) compiled: AtomicU64,
    /// Largest buffer a kernel may bind: the adapter's storage-binding
    /// limit, capped by `gpu_max_buffer_mb`.
    max_binding_bytes: u64,
}

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
        let descriptor = wgpu::DeviceDescriptor { label: Some("kiln"), required_limits: required, ..Default::default() };
        let (device, queue) = pollster::block_on(adapter.request_device(&descriptor)).map_err(|e| format!("cannot open the GPU device: {e}"))?;
        device.on_uncaptured_error(Arc::new(|e: wgpu::Error| tracing::warn!(error = %e, "GPU error outside any operation")));
        let lost = Arc::new(AtomicBool::new(false));
        let flag = lost.clone();
        device.set_device_lost_callback(move |reason, message| {
            tracing::warn!(?reason, %message, "GPU device lost");
            flag.store(true, Ordering::Release);
        });
        let capacity = std::num::NonZeroUsize::new(limits.max_cached_kernels.max(1)).unwrap_or(std::num::NonZeroUsize::MIN);
        Ok(Device { device, queue, lost, generation, kernels: Mutex::new(LruCache::new(capacity)), compiled: AtomicU64::new(0), max_binding_bytes })
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

    /// Waits for `submission` until `deadline`.
    pub(crate) fn wait(&self, submission: wgpu::SubmissionIndex, deadline: Instant) -> Result<(), GpuError> {
        let timeout = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
        let waited = self.device.poll(wgpu::PollType::Wait { submission_index: Some(submission), timeout: Some(timeout) });
        if self.is_lost() {
            return Err(GpuError::DeviceLost);
        }
        match waited {
            Ok(_) => Ok(()),
            Err(wgpu::PollError::Timeout) => Err(GpuError::Timeout),
            Err(e) => Err(GpuError::Driver(e.to_string())),
        }
    }

    /// Processes finished work without blocking: runs the callbacks due.
    fn poll_now(&self) -> Result<(), GpuError> {
        let polled = self.device.poll(wgpu::PollType::Poll);
        if self.is_lost() {
            return Err(GpuError::DeviceLost);
        }
        polled.map(|_| ()).map_err(|e| GpuError::Driver(e.to_string()))
    }

    /// Largest tensor a kernel may bind, bytes.
    pub fn max_binding_bytes(&self) -> u64 {
        self.max_binding_bytes
    }

    /// A zero-filled storage buffer of `len` f32 values (wgpu clears every
    /// new buffer before first use, so no job sees another's data).
    pub fn zeroed(self: &Arc<Self>, len: usize) -> Result<DeviceBuffer, GpuError> {
        let size = byte_size(len)?;
        if size > self.max_binding_bytes {
            return Err(GpuError::InvalidDispatch(format!(
                "a {} MiB tensor: the GPU binds at most {} MiB (the adapter's limit, or gpu_max_buffer_mb)",
                size >> 20,
                self.max_binding_bytes >> 20
            )));
        }
        let buffer = self.scoped(|| {
            self.device.create_buffer(&wgpu::BufferDescriptor {
                label: None,
                size,
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        })?;
        Ok(DeviceBuffer::new(buffer, len, self.clone()))
    }

    /// A storage buffer holding `data`.
    pub fn upload(self: &Arc<Self>, data: &[f32]) -> Result<DeviceBuffer, GpuError> {
        let buffer = self.zeroed(data.len())?;
        self.scoped(|| self.queue.write_buffer(&buffer.buffer, 0, bytemuck::cast_slice(data)))?;
        Ok(buffer)
    }

    /// A small read-only storage buffer of `u32`/`f32` words (tap tables).
    pub(crate) fn words(self: &Arc<Self>, words: &[u32]) -> Result<DeviceBuffer, GpuError> {
        let floats: &[f32] = bytemuck::cast_slice(words);
        self.upload(floats)
    }
}

fn byte_size(len: usize) -> Result<u64, GpuError> {
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

/// A device tensor's storage: `len` f32 values on one device.
pub struct DeviceBuffer {
    pub(crate) buffer: wgpu::Buffer,
    len: usize,
    id: u64,
    device: Arc<Device>,
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceBuffer({} values, #{})", self.len, self.id)
    }
}

impl DeviceBuffer {
    fn new(buffer: wgpu::Buffer, len: usize, device: Arc<Device>) -> DeviceBuffer {
        DeviceBuffer { buffer, len, id: NEXT_BUFFER.fetch_add(1, Ordering::Relaxed), device }
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

    /// Copies the values to the host (a staging buffer, mapped and copied).
    pub fn read(&self) -> Result<Vec<f32>, GpuError> {
        let device = &self.device;
        let size = byte_size(self.len)?;
        let (staging, submission) = device.scoped(|| {
            let staging = device.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("read-back"),
                size,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            let mut encoder = device.device.create_command_encoder(&wgpu::CommandEncoderDescriptor::default());
            encoder.copy_buffer_to_buffer(&self.buffer, 0, &staging, 0, size);
            let submission = device.queue.submit([encoder.finish()]);
            (staging, submission)
        })?;
        // The callback, not the poll, says the mapping is done: when another
        // thread polls the device too, it may run the callback after our
        // wait returned.
        let (sender, mapped) = std::sync::mpsc::channel();
        staging.map_async(wgpu::MapMode::Read, .., move |r| {
            let _ = sender.send(r);
        });
        let deadline = Instant::now() + TRANSFER_TIMEOUT;
        device.wait(submission, deadline)?;
        loop {
            match mapped.recv_timeout(Duration::from_millis(1)) {
                Ok(Ok(())) => break,
                Ok(Err(e)) => return Err(GpuError::Driver(e.to_string())),
                Err(_) if device.is_lost() => return Err(GpuError::DeviceLost),
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return Err(GpuError::Driver("the read-back mapping was dropped".into())),
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) if Instant::now() >= deadline => return Err(GpuError::Timeout),
                // Not fired yet: poll so that this thread fires it if no other does.
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => device.poll_now()?,
            }
        }
        let values = {
            let view = staging.get_mapped_range(..).map_err(|e| GpuError::Driver(e.to_string()))?;
            bytemuck::pod_collect_to_vec::<u8, f32>(&view)
        };
        staging.unmap();
        Ok(values)
    }
}
