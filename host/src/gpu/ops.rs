//! The host's pixel kernels on the GPU: the same results as `kiln-kernels`
//! (within float rounding) for affine maps, separable convolution and the
//! linear resampling methods, written in WGSL and run through the same
//! validation, cache and bounds as plugins' kernels. Arguments are checked
//! by the caller with `kiln-kernels`' own checks (one home per rule).

use std::sync::Arc;
use std::time::Instant;

use kiln_kernels::Dims;
use kiln_kernels::convolve::Finish;
use kiln_kernels::resample::{Method, tap_table};

use super::dispatch::{Bound, run};
use super::kernel::compile;
use super::{Device, DeviceBuffer, GpuError, GpuLimits};

const AFFINE: &str = include_str!("shaders/affine.wgsl");
const CONVOLVE: &str = include_str!("shaders/convolve.wgsl");
const RESAMPLE: &str = include_str!("shaders/resample.wgsl");

/// Threads per workgroup of every kernel here (`@workgroup_size(256)`).
const GROUP: u64 = 256;

/// Workgroups covering `len` values, folded into two dimensions: `(x, y)`.
/// The host's own kernels are trusted: their loops (bounded by their
/// uniforms) get the whole per-invocation budget however large the dispatch.
fn trusted(limits: &GpuLimits) -> GpuLimits {
    GpuLimits { max_dispatch_iterations: u64::MAX, ..*limits }
}

fn groups(len: usize, limits: &GpuLimits) -> Result<(u32, u32), GpuError> {
    let total = (len as u64).div_ceil(GROUP).max(1);
    let x = total.min(u64::from(limits.max_workgroups_per_dim.max(1)));
    let y = total.div_ceil(x);
    let y = u32::try_from(y).map_err(|_| GpuError::InvalidDispatch(format!("{len} values are too many for one dispatch")))?;
    Ok((x as u32, y))
}

fn words(values: &[u32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn as_u32(v: usize) -> Result<u32, GpuError> {
    u32::try_from(v).map_err(|_| GpuError::InvalidDispatch(format!("{v} is too large for a GPU index")))
}

/// `scale·v + offset` for every value of `src`.
pub fn affine(device: &Arc<Device>, limits: &GpuLimits, src: &DeviceBuffer, scale: f32, offset: f32, deadline: Instant) -> Result<DeviceBuffer, GpuError> {
    let kernel = compile(device, limits, AFFINE, "main")?;
    let dst = device.zeroed(src.len())?;
    let (gx, gy) = groups(src.len(), limits)?;
    let uniforms = words(&[as_u32(src.len())?, gx, scale.to_bits(), offset.to_bits()]);
    let bindings = [Bound { index: 1, buffer: src, writable: false }, Bound { index: 2, buffer: &dst, writable: true }];
    run(device, &kernel, &bindings, &uniforms, (gx, gy, 1), &trusted(limits), deadline)?;
    Ok(dst)
}

/// Separable convolution of every image of `src` (`dims`) with `taps` under
/// reflect padding, finished as `finish`.
pub fn convolve(
    device: &Arc<Device>,
    limits: &GpuLimits,
    src: &DeviceBuffer,
    dims: Dims,
    taps: &[f32],
    finish: Finish,
    deadline: Instant,
) -> Result<DeviceBuffer, GpuError> {
    let vertical = compile(device, limits, CONVOLVE, "vertical")?;
    let horizontal = compile(device, limits, CONVOLVE, "horizontal")?;
    let tap_buffer = device.upload(taps)?;
    let tmp = device.zeroed(src.len())?;
    let dst = device.zeroed(src.len())?;
    let (gx, gy) = groups(src.len(), limits)?;
    let (mode, strength) = match finish {
        Finish::Blur => (0, 0.0f32),
        Finish::Sharpen(s) => (1, s),
    };
    let uniforms =
        words(&[as_u32(src.len())?, gx, as_u32(dims.height)?, as_u32(dims.width)?, as_u32(dims.channels)?, as_u32(taps.len() / 2)?, mode, strength.to_bits()]);
    let bindings = [
        Bound { index: 1, buffer: src, writable: false },
        Bound { index: 2, buffer: &tap_buffer, writable: false },
        Bound { index: 3, buffer: &tmp, writable: true },
    ];
    run(device, &vertical, &bindings, &uniforms, (gx, gy, 1), &trusted(limits), deadline)?;
    let bindings = [
        Bound { index: 1, buffer: src, writable: false },
        Bound { index: 2, buffer: &tap_buffer, writable: false },
        Bound { index: 3, buffer: &tmp, writable: true },
        Bound { index: 4, buffer: &dst, writable: true },
    ];
    run(device, &horizontal, &bindings, &uniforms, (gx, gy, 1), &trusted(limits), deadline)?;
    Ok(dst)
}

/// The region of the source a resize reads: `(x, y, width, height)`.
pub type Region = (usize, usize, usize, usize);

/// Resizes the `region` of every image of `src` (`dims`) to `out` with a
/// linear `method` (lanczos stays on the CPU: it works on 8-bit values).
#[allow(clippy::too_many_arguments)]
pub fn resize(
    device: &Arc<Device>,
    limits: &GpuLimits,
    src: &DeviceBuffer,
    dims: Dims,
    region: Region,
    out: Dims,
    method: Method,
    deadline: Instant,
) -> Result<DeviceBuffer, GpuError> {
    if method == Method::Lanczos {
        return Err(GpuError::InvalidDispatch("lanczos has no GPU kernel".into()));
    }
    let (x0, y0, cw, ch) = region;
    let (nx, xi, xw) = tap_table(cw, out.width, method);
    let (ny, yi, yw) = tap_table(ch, out.height, method);
    let mut table = Vec::with_capacity(2 * (xi.len() + yi.len()));
    for i in xi {
        table.push(as_u32(i)?);
    }
    table.extend(xw.iter().map(|w| w.to_bits()));
    for i in yi {
        table.push(as_u32(i)?);
    }
    table.extend(yw.iter().map(|w| w.to_bits()));
    let len = out.len().ok_or_else(|| GpuError::InvalidDispatch(format!("{out:?} is too large")))?;
    let kernel = compile(device, limits, RESAMPLE, "main")?;
    let tables = device.words(&table)?;
    let dst = device.zeroed(len)?;
    let (gx, gy) = groups(len, limits)?;
    let uniforms = words(&[
        as_u32(len)?,
        gx,
        as_u32(dims.channels)?,
        as_u32(dims.height)?,
        as_u32(dims.width)?,
        as_u32(x0)?,
        as_u32(y0)?,
        as_u32(out.height)?,
        as_u32(out.width)?,
        as_u32(nx)?,
        as_u32(ny)?,
        0,
    ]);
    let bindings = [
        Bound { index: 1, buffer: src, writable: false },
        Bound { index: 2, buffer: &tables, writable: false },
        Bound { index: 3, buffer: &dst, writable: true },
    ];
    run(device, &kernel, &bindings, &uniforms, (gx, gy, 1), &trusted(limits), deadline)?;
    Ok(dst)
}
