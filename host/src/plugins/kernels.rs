//! The host side of `kiln:plugin/kernels`: pixel kernels run natively over
//! host tensors on behalf of a node (see the `kiln-kernels` crate).
//!
//! Every call checks the tensor's rank and the kernel's arguments, charges
//! the result against the node's tensor budget before computing it (given
//! back if the kernel refuses), and runs
//! with a stop check wired to the node's cancellation and deadline: host code
//! is not interrupted by epochs, so a kernel gives up between bands instead,
//! and the node then ends as `interrupted` or `timeout` like any guest code.
//!
//! Affine maps, convolutions and the linear resizes also have GPU versions
//! ([`crate::gpu::ops`]): a call runs there when the host's GPU policy says
//! so (`Gpu::prefers`: the input already on the device, or a result large
//! enough for a real GPU, or always under `gpu = "required"`). Its result
//! stays on the device. The GPU versions run in bands too and ask the same
//! stop check between them (a deadline past or a cancellation ends the node
//! as the CPU path does). A GPU failure other than a timeout falls back to
//! the CPU path.

use std::sync::Arc;
use std::time::Instant;

use kiln_kernels::convolve::{self, Finish};
use kiln_kernels::resample::{self, Method};
use kiln_kernels::{Dims, KernelError};
use kiln_kernels::{codec, convert};
use wasmtime::component::Resource;

use super::bindings::kiln::plugin::kernels;
use super::state::{NodeState, Stopped};
use crate::gpu::dispatch::Cutoff;
use crate::gpu::readback::READ_PART_BYTES;
use crate::gpu::{Device, DeviceBuffer, Estimate, Gpu, GpuError};
use crate::tensor::Tensor;

/// A GPU version of a host kernel: from the device and the input's buffer to
/// the result's, stopping between bands at the node's cutoff.
type GpuOp<'a> = Box<dyn FnOnce(&Arc<Device>, &DeviceBuffer, &Cutoff<'_>) -> Result<DeviceBuffer, GpuError> + 'a>;

type KernelResult<T> = wasmtime::Result<Result<T, kernels::KernelError>>;

/// One image's 8-bit values packed four to a word on the device, and its byte count.
type Packed = (DeviceBuffer, usize);

fn invalid<T>(message: impl Into<String>) -> KernelResult<T> {
    Ok(Err(kernels::KernelError::Invalid(message.into())))
}

/// `B×H×W×C` (rank 4) or, with `mask`, `B×H×W` (rank 3) as [`Dims`].
fn dims_of(t: &Tensor, mask: bool) -> Result<Dims, String> {
    let d: Vec<usize> = t.shape().iter().map(|&v| v as usize).collect();
    match (mask, d.as_slice()) {
        (false, &[batch, height, width, channels]) => Ok(Dims { batch, height, width, channels }),
        (true, &[batch, height, width]) => Ok(Dims { batch, height, width, channels: 1 }),
        _ => Err(format!("expected a {} tensor, got shape {:?}", if mask { "B×H×W mask" } else { "B×H×W×C image" }, t.shape())),
    }
}

fn method(m: kernels::Resample) -> Method {
    match m {
        kernels::Resample::NearestExact => Method::NearestExact,
        kernels::Resample::Bilinear => Method::Bilinear,
        kernels::Resample::Area => Method::Area,
        kernels::Resample::Bicubic => Method::Bicubic,
        kernels::Resample::Lanczos => Method::Lanczos,
    }
}

/// The tensor's elements on the host (read back from the GPU if needed).
fn host_data(t: &Tensor) -> Result<&[f32], KernelError> {
    t.data().map_err(|e| KernelError::Invalid(e.to_string()))
}

fn shape_of(d: Dims, mask: bool) -> Vec<u32> {
    let mut shape = vec![d.batch as u32, d.height as u32, d.width as u32];
    if !mask {
        shape.push(d.channels as u32);
    }
    shape
}

impl NodeState {
    /// Runs `kernel` with this node's stop check; a stop becomes a trap that
    /// [`super::runtime`] reports as `interrupted` or `timeout`.
    fn run_kernel<T>(&mut self, kernel: impl FnOnce(kiln_kernels::Stop<'_>) -> Result<T, KernelError>) -> wasmtime::Result<Result<T, String>> {
        let (cancel, deadline) = (self.stop.cancel.clone(), self.stop.deadline);
        let stop = || cancel.is_cancelled() || Instant::now() >= deadline;
        match kernel(&stop) {
            Ok(v) => Ok(Ok(v)),
            Err(KernelError::Invalid(m)) => Ok(Err(m)),
            Err(KernelError::Stopped) => Err(self.stopped("kernel")),
        }
    }

    /// Ends the node as stopped — cancelled, else past its deadline: the
    /// trap [`super::runtime`] reports as `interrupted` or `timeout`.
    fn stopped(&mut self, what: &str) -> wasmtime::Error {
        let why = if self.stop.cancel.is_cancelled() { Stopped::Cancelled } else { Stopped::Deadline };
        self.stop.stopped = Some(why);
        wasmtime::Error::msg(format!("{what} stopped"))
    }

    /// Charges a result of `values` f32s to the tensor budget before any
    /// work (a refused result costs nothing), runs `kernel`, and stores its
    /// `(shape, data)` as a new tensor; a kernel that fails gives the charge back.
    fn compute(
        &mut self,
        values: Option<usize>,
        kernel: impl FnOnce(kiln_kernels::Stop<'_>) -> Result<(Vec<u32>, Vec<f32>), KernelError>,
    ) -> KernelResult<Resource<Tensor>> {
        let bytes = values.and_then(|v| (v as u64).checked_mul(4)).unwrap_or(u64::MAX);
        let charge = match self.charge(bytes) {
            Ok(charge) => charge,
            Err(m) => return Ok(Err(kernels::KernelError::BudgetExceeded(m))),
        };
        // Kernels work through a buffer as large as their result at most
        // (a separable pass's rows, a resample's first axis): the job pays
        // for it while the kernel runs.
        let scratch = match self.charge_job(bytes) {
            Ok(scratch) => scratch,
            Err(m) => {
                self.tensor_bytes -= bytes;
                return Ok(Err(kernels::KernelError::BudgetExceeded(m)));
            }
        };
        let made = match self.run_kernel(kernel)? {
            Ok((shape, data)) => Tensor::new(shape, data).map_err(|e| e.to_string()),
            Err(m) => Err(m),
        };
        drop(scratch);
        match made {
            Ok(t) => {
                t.attach_charge(charge);
                Ok(Ok(self.table.push(t)?))
            }
            Err(m) => {
                self.tensor_bytes -= bytes;
                invalid(m)
            }
        }
    }
}

impl NodeState {
    /// The GPU a host kernel with a result of `values` elements, reading
    /// `taps` values of `input` for each, runs on, if the policy picks it
    /// (see [`crate::gpu::policy`]).
    fn gpu_for(&self, values: Option<usize>, taps: u64, input: &Tensor) -> Option<Arc<Gpu>> {
        let gpu = self.gpu.gpu.as_ref()?;
        let resident = input.device().is_some_and(|b| !b.device().is_lost());
        let upload_bytes = if resident { 0 } else { (input.len() as u64).saturating_mul(4) };
        let estimate = Estimate { values: values? as u64, taps, upload_bytes, resident };
        gpu.prefers(&estimate).then(|| gpu.clone())
    }

    /// Image `index` of a device tensor converted to 8 bits on its device:
    /// the packed buffer and the image's byte count. `None`: no GPU path
    /// (run the CPU one); `Some(Err)`: the node stopped (deadline, cancel).
    fn gpu_pixels(&mut self, t: &Tensor, dims: Dims, index: usize) -> Option<Result<Packed, KernelResult<Vec<u8>>>> {
        let limits = *self.gpu.gpu.as_ref()?.limits();
        let src = t.device().filter(|b| !b.device().is_lost())?;
        let frame = dims.frame_len();
        let cancel = self.stop.cancel.clone();
        let cancelled = move || cancel.is_cancelled();
        let cutoff = Cutoff { deadline: self.stop.deadline, cancelled: &cancelled };
        match crate::gpu::ops::to_u8(src.device(), &limits, src, index.checked_mul(frame)?, frame, &cutoff) {
            Ok(packed) => Some(Ok((packed, frame))),
            Err(GpuError::Timeout) => Some(Err(Err(self.stopped("GPU kernel")))),
            Err(e) => {
                tracing::warn!(error = %e, "GPU 8-bit conversion failed: converting on the CPU");
                None
            }
        }
    }

    /// Runs `op` on the GPU with the same charges as [`Self::compute`]; the
    /// result stays on the device. `None`: the GPU failed (logged), run the CPU path.
    fn compute_gpu(&mut self, gpu: &Gpu, input: &Tensor, shape: Vec<u32>, op: GpuOp<'_>) -> Option<KernelResult<Resource<Tensor>>> {
        let values = crate::tensor::element_count(&shape).ok()?;
        let bytes = values.saturating_mul(4);
        let charge = match self.charge(bytes) {
            Ok(charge) => charge,
            Err(m) => return Some(Ok(Err(kernels::KernelError::BudgetExceeded(m)))),
        };
        // The device scratch (a convolution's intermediate, tap tables) is
        // at most the result's size.
        let scratch = match self.charge_job(bytes) {
            Ok(scratch) => scratch,
            Err(m) => {
                self.tensor_bytes -= bytes;
                return Some(Ok(Err(kernels::KernelError::BudgetExceeded(m))));
            }
        };
        let cancel = self.stop.cancel.clone();
        let cancelled = move || cancel.is_cancelled();
        let cutoff = Cutoff { deadline: self.stop.deadline, cancelled: &cancelled };
        let made = gpu.device().and_then(|device| {
            let src = input.device_or_upload(|data| device.upload(data))?;
            if src.device().generation() != device.generation() {
                return Err(GpuError::DeviceLost);
            }
            let out = op(&device, src, &cutoff)?;
            Ok(Tensor::on_device(shape, out)?)
        });
        drop(scratch);
        match made {
            Ok(t) => {
                t.attach_charge(charge);
                self.gpu.ran = true;
                Some(self.table.push(t).map(Ok).map_err(wasmtime::Error::from))
            }
            Err(GpuError::Timeout) => Some(Err(self.stopped("GPU kernel"))),
            Err(e) => {
                self.tensor_bytes -= bytes;
                tracing::warn!(error = %e, "GPU kernel failed: running it on the CPU");
                None
            }
        }
    }
}

impl kernels::Host for NodeState {
    fn convolve(&mut self, image: Resource<Tensor>, taps: Vec<f32>, finish: kernels::Finish) -> KernelResult<Resource<Tensor>> {
        let t = self.table.get(&image)?.clone();
        let dims = match dims_of(&t, false) {
            Ok(d) => d,
            Err(m) => return invalid(m),
        };
        let finish = match finish {
            kernels::Finish::Blur => Finish::Blur,
            kernels::Finish::Sharpen(s) => Finish::Sharpen(s),
        };
        if let Err(KernelError::Invalid(m)) = convolve::check(dims, &taps, finish) {
            return invalid(m);
        }
        // Both passes read every tap for each value.
        if let Some(gpu) = self.gpu_for(Some(t.len()), 2 * taps.len() as u64, &t) {
            let limits = *gpu.limits();
            let op: GpuOp<'_> = Box::new(|device, src, cutoff| crate::gpu::ops::convolve(device, &limits, src, dims, &taps, finish, cutoff));
            if let Some(done) = self.compute_gpu(&gpu, &t, t.shape().to_vec(), op) {
                return done;
            }
        }
        self.compute(Some(t.len()), |stop| Ok((t.shape().to_vec(), convolve::separable(host_data(&t)?, dims, &taps, finish, stop)?)))
    }

    fn resize_image(&mut self, image: Resource<Tensor>, width: u32, height: u32, m: kernels::Resample, crop_center: bool) -> KernelResult<Resource<Tensor>> {
        self.resize(image, width, height, method(m), Some(crop_center))
    }

    fn resize_mask(&mut self, mask: Resource<Tensor>, width: u32, height: u32, m: kernels::Resample) -> KernelResult<Resource<Tensor>> {
        self.resize(mask, width, height, method(m), None)
    }

    fn affine(&mut self, t: Resource<Tensor>, scale: f32, offset: f32) -> KernelResult<Resource<Tensor>> {
        let t = self.table.get(&t)?.clone();
        if let Some(gpu) = self.gpu_for(Some(t.len()), 1, &t) {
            let limits = *gpu.limits();
            let op: GpuOp<'_> = Box::new(|device, src, cutoff| crate::gpu::ops::affine(device, &limits, src, scale, offset, cutoff));
            if let Some(done) = self.compute_gpu(&gpu, &t, t.shape().to_vec(), op) {
                return done;
            }
        }
        self.compute(Some(t.len()), |stop| Ok((t.shape().to_vec(), convert::affine(host_data(&t)?, scale, offset, stop)?)))
    }

    fn read_u8(&mut self, t: Resource<Tensor>, offset: u64, len: u32) -> KernelResult<Vec<u8>> {
        let t = self.table.get(&t)?.clone();
        let data = match t.data() {
            Ok(data) => data,
            Err(e) => return invalid(e.to_string()),
        };
        let range = usize::try_from(offset).ok().and_then(|start| start.checked_add(len as usize).map(|end| start..end)).filter(|r| r.end <= data.len());
        let Some(range) = range else { return invalid(format!("{len} elements at {offset} of {}", data.len())) };
        let _copy = match self.charge_job(range.len() as u64) {
            Ok(copy) => copy,
            Err(m) => return Ok(Err(kernels::KernelError::BudgetExceeded(m))),
        };
        Ok(self.run_kernel(|stop| convert::to_u8(&data[range], stop))?.map_err(kernels::KernelError::Invalid))
    }

    fn create_from_u8(&mut self, shape: Vec<u32>, data: Vec<u8>) -> KernelResult<Resource<Tensor>> {
        self.compute(Some(data.len()), |stop| Ok((shape, convert::from_u8(&data, stop)?)))
    }

    fn encode_png(&mut self, images: Resource<Tensor>, index: u32, text: Vec<(String, String)>) -> KernelResult<Vec<u8>> {
        let t = self.table.get(&images)?.clone();
        let dims = match dims_of(&t, false) {
            Ok(d) => d,
            Err(m) => return invalid(m),
        };
        // The 8-bit image and the encoder's output, while the guest takes it in.
        let _buffers = match self.charge_job((dims.len().unwrap_or(usize::MAX) / dims.batch.max(1)) as u64 * 2) {
            Ok(buffers) => buffers,
            Err(m) => return Ok(Err(kernels::KernelError::BudgetExceeded(m))),
        };
        // A result still on the GPU only: converted to 8 bits there and
        // encoded from the mapped read-back of those bytes (a quarter of the
        // f32s, no host copy of the tensor), part by part as they land.
        if !t.is_on_host()
            && let Some(pixels) = self.gpu_pixels(&t, dims, index as usize)
        {
            let (buffer, frame) = match pixels {
                Ok(found) => found,
                Err(stopped) => return stopped,
            };
            let _staging = match self.charge_job(frame as u64) {
                Ok(staging) => staging,
                Err(m) => return Ok(Err(kernels::KernelError::BudgetExceeded(m))),
            };
            let text = text.clone();
            // Rows are compressed as each part of the read-back lands; a
            // failed part's error is the read-back's (below).
            let encoded = buffer.read_in_parts(frame, dims.row_len(), READ_PART_BYTES, self.stop.deadline, |parts| {
                let parts = parts.map(|part| part.map_err(|e| KernelError::Invalid(e.to_string())));
                self.run_kernel(|stop| codec::encode_png_parts(parts, dims, text, stop))
            });
            match encoded {
                Ok(encoded) => return Ok(encoded?.map_err(kernels::KernelError::Invalid)),
                // A driver error may spare the tensor itself: read it back.
                Err(GpuError::Driver(e)) => tracing::warn!(error = %e, "cannot read the GPU result's 8-bit values: reading the tensor back"),
                // The node's deadline (or its cancellation, seen at the deadline) ends it as the CPU path would.
                Err(GpuError::Timeout) => return Err(self.stopped("GPU read-back")),
                // Waiting again would double the wait; a lost device lost the tensor too.
                Err(e) => return invalid(format!("cannot read the image back from the GPU: {e}")),
            }
        }
        Ok(self.run_kernel(|stop| codec::encode_png(host_data(&t)?, dims, index as usize, text, stop))?.map_err(kernels::KernelError::Invalid))
    }
}

impl NodeState {
    /// Resizes an image (`crop_center` given) or a mask (`None`).
    fn resize(&mut self, t: Resource<Tensor>, width: u32, height: u32, method: Method, crop_center: Option<bool>) -> KernelResult<Resource<Tensor>> {
        let t = self.table.get(&t)?.clone();
        let mask = crop_center.is_none();
        let dims = match dims_of(&t, mask) {
            Ok(d) => d,
            Err(m) => return invalid(m),
        };
        let (width, height) = (width as usize, height as usize);
        // A size the kernel refuses anyway is an invalid argument, not a budget overrun.
        if !(1..=resample::MAX_SIDE).contains(&width) || !(1..=resample::MAX_SIDE).contains(&height) {
            return invalid(format!("cannot resize to {width}×{height}: sides are 1 to {}", resample::MAX_SIDE));
        }
        let out = match resample::check_target(dims, width, height) {
            Ok(out) => out,
            Err(e) => return invalid(e.to_string()),
        };
        // The linear methods read about 2 source values per axis.
        if method != Method::Lanczos
            && let Some(gpu) = self.gpu_for(out.len(), 4, &t)
        {
            let region = match crop_center {
                Some(true) => resample::center_crop(dims.width, dims.height, width, height),
                _ => (0, 0, dims.width, dims.height),
            };
            let limits = *gpu.limits();
            let op: GpuOp<'_> = Box::new(move |device, src, cutoff| crate::gpu::ops::resize(device, &limits, src, dims, region, out, method, cutoff));
            if let Some(done) = self.compute_gpu(&gpu, &t, shape_of(out, mask), op) {
                return done;
            }
        }
        self.compute(out.len(), |stop| {
            let (data, out) = match crop_center {
                Some(crop) => resample::resize_image(host_data(&t)?, dims, width, height, method, crop, stop)?,
                None => resample::resize_mask(host_data(&t)?, dims, width, height, method, stop)?,
            };
            Ok((shape_of(out, mask), data))
        })
    }
}
