//! Reading device buffers back to the host: a copy into a pooled staging
//! buffer, mapped, and waited for by its own mapping callback (another
//! thread's poll may be the one that fires it) until a deadline. Whole
//! ([`DeviceBuffer::map_read`]), or in parts handed over as each lands
//! ([`DeviceBuffer::read_in_parts`]), so the host works on the first part
//! while the device copies the rest.

use std::marker::PhantomData;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use super::device::{FirstWrite, Pooled, byte_size};
use super::pool::Usage;
use super::{Device, DeviceBuffer, GpuError, TRANSFER_TIMEOUT};

/// Most bytes in one part of SaveImage's read-back in parts: each part is
/// one copy, one submission, one staging buffer and one mapping. Measured
/// on a 6144² RGB image (113 MB of 8-bit values) with staging from the
/// pool (a server's steady state), read back and encoded: lavapipe on 2
/// cores 206 ms whole, 174 ms in parts of 32 MiB, 158 ms for the encode
/// alone; an H200 (16 cores) 29.6, 29.1 and 27.3 ms (its copy is ~2 ms). A
/// fresh process pays for the parts' staging: wgpu suballocates buffers
/// under 128 MiB from blocks of 64–128 MiB of host memory, and a one-shot
/// `kiln run`'s SaveImage of that image was ~20 ms slower on the H200 than
/// with one buffer of the whole (~25 ms with parts of 8 MiB). (A part is
/// whole rows and whole words: larger than this only for a row over it.)
pub const READ_PART_BYTES: usize = 32 << 20;

/// What a buffer mapping's callback reports.
type MapResult = Result<(), wgpu::BufferAsyncError>;

/// A copy of some bytes of a buffer into a staging buffer: submitted, its
/// mapping asked for.
struct Pending {
    staging: Pooled,
    size: u64,
    submission: wgpu::SubmissionIndex,
    mapped: Receiver<MapResult>,
    /// The mapping landed (the staging buffer must be unmapped).
    landed: bool,
}

impl Pending {
    /// Copies `size` bytes of `buffer` from `at` (both multiples of 4).
    fn start(buffer: &DeviceBuffer, at: u64, size: u64) -> Result<Pending, GpuError> {
        let device = buffer.device();
        let staging = device.buffer(Usage::Staging, size, FirstWrite::Commands)?;
        let submission = device.scoped(|| {
            let mut encoder = device.device.create_command_encoder(&wgpu::CommandEncoderDescriptor::default());
            encoder.copy_buffer_to_buffer(buffer.raw(), at, &staging.buffer, 0, size);
            device.submit([encoder.finish()])
        })?;
        let (sender, mapped) = std::sync::mpsc::channel();
        let notify = move |r: MapResult| {
            let _ = sender.send(r);
        };
        #[cfg(test)]
        let notify = late(notify, device.late_callbacks_ms.load(std::sync::atomic::Ordering::Relaxed));
        staging.buffer.map_async(wgpu::MapMode::Read, ..size, notify);
        Ok(Pending { staging, size, submission, mapped, landed: false })
    }

    /// Waits until `deadline` for the copy and then for its mapping.
    fn wait(&mut self, device: &Device, deadline: Instant) -> Result<(), GpuError> {
        device.wait(self.submission.clone(), deadline)?;
        wait_for_mapping(device, &self.mapped, deadline)?;
        self.landed = true;
        Ok(())
    }

    /// The mapped bytes (after [`Pending::wait`]).
    fn view(&self) -> Result<wgpu::BufferView, GpuError> {
        self.staging.buffer.get_mapped_range(..self.size).map_err(|e| GpuError::Driver(e.to_string()))
    }

    /// Gives the staging buffer back once its views are gone: unmapped and
    /// pooled when its mapping landed, else dropped (the mapping may still
    /// be pending).
    fn finish(self, device: &Device) {
        if self.landed {
            self.staging.buffer.unmap();
            device.recycle(self.staging);
        }
    }
}

impl DeviceBuffer {
    /// Copies the values to the host through a pooled staging buffer.
    pub fn read(&self) -> Result<Vec<f32>, GpuError> {
        self.map_read(Instant::now() + TRANSFER_TIMEOUT, |values| values.to_vec())
    }

    /// Runs `f` over the values as they arrive in a mapped staging buffer,
    /// without a host copy of the tensor, waiting for them until `deadline`
    /// (a node's, when a node reads).
    pub fn map_read<T>(&self, deadline: Instant, f: impl FnOnce(&[f32]) -> T) -> Result<T, GpuError> {
        let device = self.device();
        let mut pending = Pending::start(self, 0, byte_size(self.len())?)?;
        pending.wait(device, deadline)?;
        let value = {
            let view = pending.view()?;
            // Mapped ranges are aligned far beyond an f32's 4 bytes; a copy
            // only if a driver ever hands out less.
            match bytemuck::try_cast_slice::<u8, f32>(&view) {
                Ok(values) => f(values),
                Err(_) => f(&bytemuck::pod_collect_to_vec::<u8, f32>(&view)),
            }
        };
        pending.finish(device);
        Ok(value)
    }

    /// Runs `f` over this buffer's first `bytes` bytes as they land on the
    /// host, in parts of whole `unit`s (rows of an image) of at most
    /// `part_bytes` (at least one unit; [`READ_PART_BYTES`] for SaveImage):
    /// every part's copy is queued at once, each in a
    /// submission of its own, and `f`'s iterator waits for a part (until
    /// `deadline`) only when asked for it, so `f` works on the parts that
    /// landed while the device copies the rest. A failed part ends the
    /// iteration, and its error is the result whatever `f` made of it.
    pub fn read_in_parts<T>(
        &self,
        bytes: usize,
        unit: usize,
        part_bytes: usize,
        deadline: Instant,
        f: impl FnOnce(&mut Parts<'_>) -> T,
    ) -> Result<T, GpuError> {
        let total = byte_size(self.len())?;
        if bytes == 0 || unit == 0 || !bytes.is_multiple_of(unit) || bytes as u64 > total {
            return Err(GpuError::InvalidDispatch(format!("{bytes} bytes in units of {unit} from a buffer of {total}")));
        }
        // Copies start and end at multiples of 4 bytes: parts are whole
        // units and whole words (the last one's copy is rounded up to a
        // word, inside the buffer).
        let step = unit / gcd(unit, 4) * 4;
        let part = (part_bytes / step).max(1).saturating_mul(step);
        let mut pending = Vec::with_capacity(bytes.div_ceil(part));
        for at in (0..bytes).step_by(part) {
            let len = part.min(bytes - at);
            let size = (len as u64).next_multiple_of(4).min(total - at as u64);
            pending.push((Pending::start(self, at as u64, size)?, len));
        }
        let mut parts = Parts { device: self.device(), pending, next: 0, error: None, deadline };
        let value = f(&mut parts);
        let Parts { device, pending, error, .. } = parts;
        for (p, _) in pending {
            p.finish(device);
        }
        match error {
            Some(e) => Err(e),
            None => Ok(value),
        }
    }
}

/// The parts of a read-back in parts ([`DeviceBuffer::read_in_parts`]), in
/// order, each waited for when asked for.
pub struct Parts<'a> {
    device: &'a Device,
    pending: Vec<(Pending, usize)>,
    next: usize,
    error: Option<GpuError>,
    deadline: Instant,
}

/// One landed part of a read-back: its bytes, mapped (valid while the
/// read-back's `f` runs).
pub struct Part<'a> {
    view: wgpu::BufferView,
    len: usize,
    lifetime: PhantomData<&'a ()>,
}

impl AsRef<[u8]> for Part<'_> {
    fn as_ref(&self) -> &[u8] {
        &self.view[..self.len]
    }
}

impl<'a> Iterator for Parts<'a> {
    type Item = Result<Part<'a>, GpuError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.error.is_some() {
            return None;
        }
        let (pending, len) = self.pending.get_mut(self.next)?;
        self.next += 1;
        match pending.wait(self.device, self.deadline).and_then(|()| pending.view()) {
            Ok(view) => Some(Ok(Part { view, len: *len, lifetime: PhantomData })),
            Err(e) => {
                self.error = Some(e.clone());
                Some(Err(e))
            }
        }
    }
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// `notify`, run `ms` late on another thread (at once when 0).
#[cfg(test)]
fn late(notify: impl FnOnce(MapResult) + Send + 'static, ms: u64) -> impl FnOnce(MapResult) + Send + 'static {
    move |r| {
        if ms == 0 {
            notify(r)
        } else {
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(ms));
                notify(r)
            });
        }
    }
}

/// Waits until `deadline` for a mapping's callback itself: the poll that
/// saw the copy finish does not prove the callback ran, since another
/// thread polling the same device may collect it and fire it later.
fn wait_for_mapping(device: &Device, mapped: &Receiver<MapResult>, deadline: Instant) -> Result<(), GpuError> {
    loop {
        match mapped.recv_timeout(Duration::from_millis(1)) {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(e)) => return Err(GpuError::Driver(e.to_string())),
            Err(_) if device.is_lost() => return Err(GpuError::DeviceLost),
            Err(RecvTimeoutError::Disconnected) => return Err(GpuError::Driver("the read-back mapping was dropped".into())),
            Err(RecvTimeoutError::Timeout) if Instant::now() >= deadline => return Err(GpuError::Timeout),
            // Not fired yet: poll so that this thread fires it if no other does.
            Err(RecvTimeoutError::Timeout) => device.poll_now()?,
        }
    }
}
