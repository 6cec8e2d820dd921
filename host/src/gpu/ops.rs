//! The host's pixel kernels on the GPU: the same results as `kiln-kernels`
//! (within float rounding) for affine maps, separable convolution and the
//! linear resampling methods, written in WGSL and run through the same
//! validation, cache and bounds as plugins' kernels, but binding a window of
//! each tensor per band (a plugin's kernel binds whole tensors), so their
//! tensors may be larger than one binding. Arguments are checked by the
//! caller with `kiln-kernels`' own checks (one home per rule). Tensors
//! index in 32 bits: one of 2³² values or more is refused (the CPU runs it).
//!
//! Every kernel here runs in bands, like the CPU kernels: a band is a range
//! of output values (whole rows for a convolution), its offset passed as a
//! uniform; each band is one submission, waited for before the next, and
//! the node's [`Cutoff`] (deadline, cancellation) is asked between bands.
//! The last band is submitted and not waited for: the next reader of the
//! result (the next kernel's first band, a read-back) waits for it, in
//! queue order, so a chain of GPU nodes pays one round trip to the device;
//! a small last band is not even submitted alone but recorded for the
//! device's next submission (`super::batch`), so such a chain pays one
//! submission per [`super::batch::MAX_RECORDED`] kernels.
//! A submitted dispatch runs to its end whether anyone waits or not (a
//! driver may even run it inside `submit`), so a band is all that can run
//! past the deadline: one huge dispatch had the node fail in time on
//! lavapipe while the rest of the blur kept the queue busy for seconds. Bands are sized by work — output values × taps read
//! per value — see [`BandSizer`]: the first is [`FIRST_BAND_WORK`], each
//! next one aims at [`BAND_TIME`] at the rate the last one ran (never below
//! [`MIN_BAND_WORK`], at most [`BAND_GROWTH`] times the last). A real GPU
//! thus does an image up to 4096² at radius 31 in at most 4 submissions
//! (2²⁴, 2²⁸, 2³² multiply-adds, the rest), a slow adapter in bands of
//! about 50 ms.

use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kiln_kernels::Dims;
use kiln_kernels::convolve::Finish;
use kiln_kernels::resample::{Method, tap_table};

use super::dispatch::{Bound, Cutoff, Dispatch, When, submit};
use super::kernel::compile;
use super::{Device, DeviceBuffer, GpuError, GpuLimits};

const AFFINE: &str = include_str!("shaders/affine.wgsl");
const AFFINE4: &str = include_str!("shaders/affine4.wgsl");
const CONVOLVE: &str = include_str!("shaders/convolve.wgsl");
const RESAMPLE: &str = include_str!("shaders/resample.wgsl");
const TO_U8: &str = include_str!("shaders/to_u8.wgsl");

/// Threads per workgroup of every kernel here (`@workgroup_size(256)`).
const GROUP: u64 = 256;

/// Work (output values × taps per value) of a kernel's first band: about
/// 50 ms on lavapipe with two busy cores (~3.7·10⁸ per second measured),
/// tens of microseconds on a GPU.
pub const FIRST_BAND_WORK: u64 = 1 << 24;

/// The least work of a band however slowly the last one ran, so a stalled
/// band does not leave the rest of the kernel in tiny submissions.
pub const MIN_BAND_WORK: u64 = 1 << 22;

/// The most work a kernel's last band may have and still be recorded for
/// the device's next submission rather than submitted alone (see
/// `super::batch`): one first band, tens of microseconds on a GPU.
pub const DEFER_WORK: u64 = FIRST_BAND_WORK;

/// A recorded last band of at least this much work is submitted at once
/// when the GPU is idle (it would otherwise wait for work that is ready):
/// about 10 µs on a GPU, half a submission's own cost. Smaller ones wait
/// for the next submission whatever the GPU does.
pub const IDLE_SUBMIT_WORK: u64 = 1 << 22;

/// How long a band should take: what may run past the node's deadline.
pub const BAND_TIME: Duration = Duration::from_millis(50);

/// How much larger than the last band the next may be: one fast band (a
/// timing fluke) cannot make the next one unbounded.
pub const BAND_GROWTH: u64 = 16;

/// Sizes the bands of one kernel run: ranges of output values in multiples
/// of `granule` (whole rows where a band needs them), each of about
/// [`BAND_TIME`] at the rate the previous one ran.
#[derive(Debug, Clone)]
pub(crate) struct BandSizer {
    /// Every band but the last is a whole number of these values.
    pub(crate) granule: usize,
    /// Taps read per output value (at least 1).
    cost: u64,
    /// The next band's work.
    work: u64,
}

impl BandSizer {
    pub(crate) fn new(granule: usize, cost: u64) -> BandSizer {
        BandSizer { granule: granule.max(1), cost: cost.max(1), work: FIRST_BAND_WORK }
    }

    /// The end of the band starting at `first`, of `len` values in all:
    /// at least one granule, whole granules, never past `len`.
    pub(crate) fn end(&self, first: usize, len: usize) -> usize {
        let values = usize::try_from(self.work / self.cost).unwrap_or(usize::MAX);
        let values = (values / self.granule).max(1).saturating_mul(self.granule);
        first.saturating_add(values).min(len)
    }

    /// Records that a band of `values` took `elapsed`; sizes the next.
    pub(crate) fn ran(&mut self, values: usize, elapsed: Duration) {
        let done = (values as u64).saturating_mul(self.cost);
        let rate = done as f64 / elapsed.as_secs_f64().max(1e-6);
        let aim = (rate * BAND_TIME.as_secs_f64()).min(u64::MAX as f64) as u64;
        self.work = aim.clamp(MIN_BAND_WORK, done.saturating_mul(BAND_GROWTH).max(MIN_BAND_WORK));
    }
}

/// The values of each tensor a band reads or writes, in binding order:
/// what the band binds (its windows, see [`window`]).
type Spans<const N: usize> = [Range<usize>; N];

/// `values` as a binding window: its start rounded down to where a binding
/// may start on `device` (and to whole `vec4`s).
fn window(device: &Device, values: Range<usize>) -> Range<usize> {
    let step = usize::try_from(device.binding_alignment() / 4).unwrap_or(1).max(1).next_multiple_of(4);
    (values.start / step * step)..values.end
}

/// Runs `len` output values band by band: `band(first, end, spans, when)`
/// submits one band, binding the windows `spans(first, end)` of its tensors
/// (each within the device's binding limit: a band is cut down, whole
/// granules at a time, until they fit, so a tensor larger than the GPU binds
/// is processed a window at a time). A band is waited for (all but the
/// last; a last band of at most [`DEFER_WORK`] is recorded for the next
/// submission, or submitted at once on an idle GPU from
/// [`IDLE_SUBMIT_WORK`] up: `when` says); between bands the `cutoff` is
/// asked, and past it the kernel stops with [`GpuError::Timeout`]. `cost`:
/// taps per value.
#[allow(clippy::too_many_arguments)]
fn in_bands<const N: usize>(
    device: &Device,
    len: usize,
    granule: usize,
    cost: u64,
    cutoff: &Cutoff<'_>,
    spans: impl Fn(usize, usize) -> Spans<N>,
    mut band: impl FnMut(usize, usize, Spans<N>, When) -> Result<Option<wgpu::SubmissionIndex>, GpuError>,
) -> Result<(), GpuError> {
    let mut sizer = BandSizer::new(granule, cost);
    let max_values = usize::try_from(device.max_binding_bytes() / 4).unwrap_or(usize::MAX);
    let (started, mut first, mut bands) = (Instant::now(), 0, 0);
    while first < len {
        if cutoff.reached() {
            tracing::debug!(bands, done = first, values = len, elapsed = ?started.elapsed(), "GPU kernel stopped between bands");
            return Err(GpuError::Timeout);
        }
        let mut end = sizer.end(first, len);
        let mut windows = spans(first, end);
        while windows.iter().any(|w| w.len() > max_values) {
            let half = (end - first) / 2 / sizer.granule * sizer.granule;
            if half == 0 {
                return Err(GpuError::InvalidDispatch(format!("one band of {} values reads more than the GPU binds at once", sizer.granule)));
            }
            end = first + half;
            windows = spans(first, end);
        }
        let band_started = Instant::now();
        // The last band is not waited for: whoever reads the result next
        // (a read-back, the next kernel's first band) waits for it, so a
        // chain of GPU nodes pays one round trip, not one per node.
        let work = ((end - first) as u64).saturating_mul(cost.max(1));
        let when = match work {
            _ if end < len => When::Now,
            w if w < IDLE_SUBMIT_WORK => When::WithNext,
            w if w <= DEFER_WORK => When::Soon,
            _ => When::Now,
        };
        match band(first, end, windows, when)? {
            Some(submission) if end < len => device.wait(submission, cutoff.deadline)?,
            _ => {}
        }
        sizer.ran(end - first, band_started.elapsed());
        first = end;
        bands += 1;
    }
    tracing::debug!(bands, values = len, elapsed = ?started.elapsed(), "GPU kernel done");
    Ok(())
}

/// Workgroups covering `len` values, folded into two dimensions: `(x, y)`.
fn groups(len: usize, limits: &GpuLimits) -> Result<(u32, u32), GpuError> {
    let total = (len as u64).div_ceil(GROUP).max(1);
    let x = total.min(u64::from(limits.max_workgroups_per_dim.max(1)));
    let y = total.div_ceil(x);
    let y = u32::try_from(y).map_err(|_| GpuError::InvalidDispatch(format!("{len} values are too many for one dispatch")))?;
    Ok((x as u32, y))
}

/// The host's own kernels are trusted: their loops (bounded by their
/// uniforms) get the whole per-invocation budget however large the dispatch.
fn trusted(limits: &GpuLimits) -> GpuLimits {
    GpuLimits { max_dispatch_iterations: u64::MAX, ..*limits }
}

/// `windows`' starts (values) as uniform words.
fn starts_of<const N: usize>(windows: &Spans<N>) -> Result<[u32; N], GpuError> {
    let mut starts = [0; N];
    for (start, w) in starts.iter_mut().zip(windows) {
        *start = as_u32(w.start)?;
    }
    Ok(starts)
}

/// A band's binding of `buffer` at `index` over `window`.
fn bound(index: u32, buffer: &DeviceBuffer, writable: bool, window: Range<usize>) -> Bound<'_> {
    Bound { index, buffer, writable, window: Some(window) }
}

fn words_of(values: &[u32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn as_u32(v: usize) -> Result<u32, GpuError> {
    u32::try_from(v).map_err(|_| GpuError::InvalidDispatch(format!("{v} is too large for a GPU index")))
}

/// A dispatch's workgroups, `(x, y, z)`.
type Workgroups = (u32, u32, u32);

/// A band's first three uniform words: its first value, its end and the
/// workgroups along x; and its workgroups.
fn band_header(first: usize, end: usize, limits: &GpuLimits) -> Result<([u32; 3], Workgroups), GpuError> {
    let (gx, gy) = groups(end - first, limits)?;
    Ok(([as_u32(first)?, as_u32(end)?, gx], (gx, gy, 1)))
}

/// `scale·v + offset` for every value of `src`: four values per invocation
/// when the length is a multiple of 4 (whole `vec4` loads and stores), one
/// otherwise.
pub fn affine(device: &Arc<Device>, limits: &GpuLimits, src: &DeviceBuffer, scale: f32, offset: f32, cutoff: &Cutoff<'_>) -> Result<DeviceBuffer, GpuError> {
    as_u32(src.len())?;
    let (source, width) = if src.len().is_multiple_of(4) { (AFFINE4, 4) } else { (AFFINE, 1) };
    let kernel = compile(device, limits, source, "main")?;
    let dst = device.for_overwrite(src.len())?;
    let limits = trusted(limits);
    // Bands count the kernel's elements (vec4s or values), each `width`
    // values of work; source and result share one window.
    let spans = |first: usize, end: usize| [window(device, first * width..end * width)];
    in_bands(device, src.len() / width, 1, width as u64, cutoff, spans, |first, end, [w], when| {
        let (header, groups) = band_header(first, end, &limits)?;
        let base = as_u32(w.start / width)?;
        let uniforms = words_of(&[header[0], header[1], header[2], scale.to_bits(), offset.to_bits(), base]);
        let bindings = [bound(1, src, false, w.clone()), bound(2, &dst, true, w)];
        submit(device, &[Dispatch { kernel: &kernel, bindings: &bindings, uniforms: &uniforms, groups }], &limits, when)
    })?;
    Ok(dst)
}

/// The 8-bit values of `count` values of `src` from `base` (one image of a
/// batch), as `kiln_kernels::convert::to_u8` computes them, packed four to
/// a word: a buffer of `count.div_ceil(4)` words whose bytes, in order, are
/// the image's (the last word padded with zeros).
pub fn to_u8(device: &Arc<Device>, limits: &GpuLimits, src: &DeviceBuffer, base: usize, count: usize, cutoff: &Cutoff<'_>) -> Result<DeviceBuffer, GpuError> {
    if base.checked_add(count).is_none_or(|end| end > src.len()) || count == 0 {
        return Err(GpuError::InvalidDispatch(format!("{count} values from {base} of {}", src.len())));
    }
    as_u32(src.len())?;
    let kernel = compile(device, limits, TO_U8, "main")?;
    let words = count.div_ceil(4);
    let dst = device.for_overwrite(words)?;
    let limits = trusted(limits);
    // A band of words reads four values each (fewer at the image's end).
    let spans = |first: usize, end: usize| [window(device, base + 4 * first..base + (4 * end).min(count)), window(device, first..end)];
    let (base_word, count_word) = (as_u32(base)?, as_u32(count)?);
    in_bands(device, words, 1, 4, cutoff, spans, |first, end, windows, when| {
        let (header, groups) = band_header(first, end, &limits)?;
        let [src_start, dst_start] = starts_of(&windows)?;
        let uniforms = words_of(&[header[0], header[1], header[2], base_word, count_word, src_start, dst_start]);
        let [ws, wd] = windows;
        let bindings = [bound(1, src, false, ws), bound(2, &dst, true, wd)];
        submit(device, &[Dispatch { kernel: &kernel, bindings: &bindings, uniforms: &uniforms, groups }], &limits, when)
    })?;
    Ok(dst)
}

/// Separable convolution of every image of `src` (`dims`) with `taps` under
/// reflect padding, finished as `finish`. Like the CPU kernel, the taps'
/// left half is used (mirrored), so both read the same kernel.
pub fn convolve(
    device: &Arc<Device>,
    limits: &GpuLimits,
    src: &DeviceBuffer,
    dims: Dims,
    taps: &[f32],
    finish: Finish,
    cutoff: &Cutoff<'_>,
) -> Result<DeviceBuffer, GpuError> {
    as_u32(src.len())?;
    // One band is at least one row, which reads `radius` rows either side.
    let row = dims.width.saturating_mul(dims.channels).max(1);
    let reach = taps.len() / 2;
    if (2 * reach + 1).saturating_mul(row) as u64 > device.max_binding_bytes() / 4 {
        return Err(GpuError::InvalidDispatch(format!("one row of {row} values at radius {reach} reads more than the GPU binds at once")));
    }
    let vertical = compile(device, limits, CONVOLVE, "vertical")?;
    let horizontal = compile(device, limits, CONVOLVE, "horizontal")?;
    let mirrored: Vec<f32> = (0..taps.len()).map(|j| taps[j.min(taps.len() - 1 - j)]).collect();
    let tap_buffer = device.upload(&mirrored)?;
    let tmp = device.for_overwrite(src.len())?;
    let dst = device.for_overwrite(src.len())?;
    let (mode, strength) = match finish {
        Finish::Blur => (0, 0.0f32),
        Finish::Sharpen(s) => (1, s),
    };
    let limits = trusted(limits);
    let (height, width, channels, radius) = (as_u32(dims.height)?, as_u32(dims.width)?, as_u32(dims.channels)?, as_u32(taps.len() / 2)?);
    // A band is whole rows: the horizontal pass reads the vertical pass's
    // results of the same row only, so both passes go in one submission.
    // The vertical pass reads `radius` rows either side (reflected inside
    // the image, so never further), the sharpen the band's own values.
    let rows = src.len() / row;
    let spans = |first: usize, end: usize| {
        let read = (first / row).saturating_sub(reach) * row..(end / row).saturating_add(reach).min(rows) * row;
        [window(device, read), window(device, first..end)]
    };
    in_bands(device, src.len(), row, 2 * taps.len() as u64, cutoff, spans, |first, end, windows, when| {
        let (header, groups) = band_header(first, end, &limits)?;
        let [src_start, band_start] = starts_of(&windows)?;
        let uniforms = words_of(&[header[0], header[1], header[2], height, width, channels, radius, mode, strength.to_bits(), src_start, band_start]);
        let [read, own] = windows;
        let taps = Bound::whole(2, &tap_buffer, false);
        let vertical_bindings = [bound(1, src, false, read.clone()), taps, bound(3, &tmp, true, own.clone())];
        let taps = Bound::whole(2, &tap_buffer, false);
        let horizontal_bindings = [bound(1, src, false, read), taps, bound(3, &tmp, true, own.clone()), bound(4, &dst, true, own)];
        let passes = [
            Dispatch { kernel: &vertical, bindings: &vertical_bindings, uniforms: &uniforms, groups },
            Dispatch { kernel: &horizontal, bindings: &horizontal_bindings, uniforms: &uniforms, groups },
        ];
        submit(device, &passes, &limits, when)
    })?;
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
    cutoff: &Cutoff<'_>,
) -> Result<DeviceBuffer, GpuError> {
    if method == Method::Lanczos {
        return Err(GpuError::InvalidDispatch("lanczos has no GPU kernel".into()));
    }
    let (x0, y0, cw, ch) = region;
    let (nx, xi, xw) = tap_table(cw, out.width, method);
    let (ny, yi, yw) = tap_table(ch, out.height, method);
    let rows = tap_rows(&yi, ny, out.height);
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
    as_u32(len.max(src.len()))?;
    let kernel = compile(device, limits, RESAMPLE, "main")?;
    let tables = device.words(&table)?;
    let dst = device.for_overwrite(len)?;
    let shape = [dims.channels, dims.height, dims.width, x0, y0, out.height, out.width, nx, ny].map(as_u32);
    let mut shape_words = Vec::with_capacity(shape.len() + 2);
    for w in shape {
        shape_words.push(w?);
    }
    let limits = trusted(limits);
    let spans = |first: usize, end: usize| {
        let read = source_rows(&rows, (first, end), (dims, y0), out);
        [window(device, read), window(device, first..end)]
    };
    in_bands(device, len, 1, (nx as u64).saturating_mul(ny as u64), cutoff, spans, |first, end, windows, when| {
        let (header, groups) = band_header(first, end, &limits)?;
        let [src_start, dst_start] = starts_of(&windows)?;
        let uniforms = words_of(&[&header[..], &shape_words, &[src_start, dst_start]].concat());
        let [read, own] = windows;
        let bindings = [bound(1, src, false, read), Bound::whole(2, &tables, false), bound(3, &dst, true, own)];
        submit(device, &[Dispatch { kernel: &kernel, bindings: &bindings, uniforms: &uniforms, groups }], &limits, when)
    })?;
    Ok(dst)
}

/// The source rows (of the crop, first and last) each output row's taps read.
fn tap_rows(indices: &[usize], taps: usize, out_rows: usize) -> Vec<(usize, usize)> {
    (0..out_rows)
        .map(|oy| {
            let read = indices.get(oy * taps..(oy + 1) * taps).unwrap_or(&[]);
            (read.iter().copied().min().unwrap_or(0), read.iter().copied().max().unwrap_or(0))
        })
        .collect()
}

/// The source values a resize's band of output values `band` reads: from the
/// first tap row of its first output row to the last tap row of its last,
/// whole source rows (`rows`: [`tap_rows`]; `y0`: the crop's top).
fn source_rows(rows: &[(usize, usize)], band: (usize, usize), (dims, y0): (Dims, usize), out: Dims) -> Range<usize> {
    let out_row = out.width.saturating_mul(out.channels).max(1);
    let out_height = out.height.max(1);
    let (g0, g1) = (band.0 / out_row, band.1.saturating_sub(1) / out_row);
    let (f0, f1) = (g0 / out_height, g1 / out_height);
    let (oy0, oy1) = (g0 % out_height, g1 % out_height);
    // Rows of the first frame the band covers, and of its last.
    let first_rows = if f0 == f1 { oy0..=oy1 } else { oy0..=out_height - 1 };
    let last_rows = if f0 == f1 { oy0..=oy1 } else { 0..=oy1 };
    let lo = rows.get(first_rows).and_then(|r| r.iter().map(|r| r.0).min()).unwrap_or(0);
    let hi = rows.get(last_rows).and_then(|r| r.iter().map(|r| r.1).max()).unwrap_or(0);
    let in_row = dims.width.saturating_mul(dims.channels);
    let at = |frame: usize, y: usize| frame.saturating_mul(dims.height).saturating_add(y0 + y).saturating_mul(in_row);
    at(f0, lo)..at(f1, hi + 1)
}
