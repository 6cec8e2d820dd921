//! Resampling with the semantics ComfyUI gets from `torch.nn.functional.interpolate`
//! (antialias off, `align_corners=False`) and from Pillow for lanczos.
//!
//! Every method here is separable: a resize is a horizontal pass over each
//! interleaved row followed by a vertical pass that blends whole rows (a
//! contiguous loop LLVM vectorizes). Each pass is described by [`Taps`]: for
//! every output position, the source indices and weights it reads.

use crate::bands::{Stop, for_each_band};
use crate::{Dims, KernelError};

/// An upscale method, by its ComfyUI name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    NearestExact,
    Bilinear,
    Area,
    Bicubic,
    Lanczos,
}

impl Method {
    /// The method named `name` (`"nearest-exact"`, `"bilinear"`, ...).
    pub fn parse(name: &str) -> Option<Method> {
        Some(match name {
            "nearest-exact" => Method::NearestExact,
            "bilinear" => Method::Bilinear,
            "area" => Method::Area,
            "bicubic" => Method::Bicubic,
            "lanczos" => Method::Lanczos,
            _ => return None,
        })
    }
}

/// The ComfyUI upscale method names, in widget order.
pub const METHODS: [&str; 5] = ["nearest-exact", "bilinear", "area", "bicubic", "lanczos"];

/// For each output position, `n` taps (source index, weight) at
/// `o·n .. (o+1)·n` of `index`/`weight`. A fixed stride (positions with fewer
/// taps are padded with zero weights on a valid index) keeps the inner loops
/// free of per-position bounds.
struct Taps {
    n: usize,
    index: Vec<usize>,
    weight: Vec<f32>,
}

impl Taps {
    fn build(out_len: usize, mut taps_for: impl FnMut(usize, &mut Vec<(usize, f32)>)) -> Taps {
        let mut per: Vec<Vec<(usize, f32)>> = Vec::with_capacity(out_len);
        for o in 0..out_len {
            let mut buf = Vec::new();
            taps_for(o, &mut buf);
            per.push(buf);
        }
        let n = per.iter().map(Vec::len).max().unwrap_or(1).max(1);
        let mut t = Taps { n, index: Vec::with_capacity(out_len * n), weight: Vec::with_capacity(out_len * n) };
        for buf in per {
            let pad = buf.last().map_or(0, |&(i, _)| i);
            for k in 0..n {
                let (i, w) = buf.get(k).copied().unwrap_or((pad, 0.0));
                t.index.push(i);
                t.weight.push(w);
            }
        }
        t
    }
    fn of(&self, o: usize) -> (&[usize], &[f32]) {
        let r = o * self.n..(o + 1) * self.n;
        (&self.index[r.clone()], &self.weight[r])
    }
}

fn cubic1(x: f32, a: f32) -> f32 {
    ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
}
fn cubic2(x: f32, a: f32) -> f32 {
    ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a
}

fn sinc(x: f64) -> f64 {
    if x == 0.0 { 1.0 } else { (std::f64::consts::PI * x).sin() / (std::f64::consts::PI * x) }
}

/// The taps resizing `n_in` samples to `n_out` with `method`.
fn taps(n_in: usize, n_out: usize, method: Method) -> Taps {
    let scale = n_in as f32 / n_out as f32;
    let last = n_in - 1;
    match method {
        Method::NearestExact => Taps::build(n_out, |o, t| {
            let src = ((o as f32 + 0.5) * scale).floor() as usize;
            t.push((src.min(last), 1.0));
        }),
        Method::Bilinear => Taps::build(n_out, |o, t| {
            let src = (scale * (o as f32 + 0.5) - 0.5).max(0.0);
            let i0 = (src.floor() as usize).min(last);
            let i1 = if i0 < last { i0 + 1 } else { i0 };
            let l1 = src - i0 as f32;
            t.push((i0, 1.0 - l1));
            t.push((i1, l1));
        }),
        Method::Bicubic => Taps::build(n_out, |o, t| {
            const A: f32 = -0.75;
            let src = scale * (o as f32 + 0.5) - 0.5;
            let i = src.floor();
            let f = src - i;
            let w = [cubic2(f + 1.0, A), cubic1(f, A), cubic1(1.0 - f, A), cubic2(2.0 - f, A)];
            for (k, wk) in w.into_iter().enumerate() {
                let idx = (i as i64 - 1 + k as i64).clamp(0, last as i64) as usize;
                t.push((idx, wk));
            }
        }),
        Method::Area => Taps::build(n_out, |o, t| {
            let start = o * n_in / n_out;
            let end = ((o + 1) * n_in).div_ceil(n_out);
            let w = 1.0 / (end - start) as f32;
            t.extend((start..end).map(|i| (i, w)));
        }),
        Method::Lanczos => Taps::build(n_out, |o, t| {
            // Pillow's resampling: support scales with the reduction factor.
            let scale = n_in as f64 / n_out as f64;
            let filter_scale = scale.max(1.0);
            let support = 3.0 * filter_scale;
            let center = (o as f64 + 0.5) * scale;
            let lo = ((center - support + 0.5) as i64).max(0) as usize;
            let hi = ((center + support + 0.5) as i64).min(n_in as i64) as usize;
            let ws: Vec<f64> = (lo..hi)
                .map(|i| {
                    let x = (i as f64 - center + 0.5) / filter_scale;
                    if x.abs() < 3.0 { sinc(x) * sinc(x / 3.0) } else { 0.0 }
                })
                .collect();
            let total: f64 = ws.iter().sum();
            for (k, w) in ws.into_iter().enumerate() {
                t.push((lo + k, if total != 0.0 { (w / total) as f32 } else { 0.0 }));
            }
        }),
    }
}

/// The taps of resizing `n_in` samples to `n_out` as a table, for other
/// implementations of the same resize (the GPU's): taps per output `n`, then
/// `n` source indices and `n` weights per output position. A size that does
/// not change gives the identity (the CPU skips that pass).
pub fn tap_table(n_in: usize, n_out: usize, method: Method) -> (usize, Vec<usize>, Vec<f32>) {
    if n_in == n_out {
        return (1, (0..n_out).collect(), vec![1.0; n_out]);
    }
    let t = taps(n_in, n_out, method);
    (t.n, t.index, t.weight)
}

/// Most rows or columns a resize may produce: 8× ComfyUI's `MAX_RESOLUTION`
/// (ImageScaleBy's largest factor); the tensor budget bounds the rest.
pub const MAX_SIDE: usize = 16384 * 8;

/// How one `h × w × c` plane becomes `oh × ow × c`: the passes, their order
/// and Pillow's 8-bit rounding for lanczos.
///
/// Both passes stream row by row, so besides the output only a few rows are
/// allocated per band:
/// * horizontal first: each output row blends horizontally resized source
///   rows, kept in a small cache (taps move monotonically down the image, so
///   within a band every source row is resized once);
/// * vertical first: each output row is the vertical blend of source rows,
///   then resized horizontally.
///
/// For the linear methods both orders give the same values (up to float
/// rounding), so the cheaper one is taken. Lanczos goes through Pillow, which
/// rounds to 8 bits after each pass, so its order is Pillow's: horizontal
/// first, except vertical first when the width grows and the height shrinks.
struct Plan {
    c: usize,
    w: usize,
    ow: usize,
    tx: Option<Taps>,
    ty: Option<Taps>,
    vertical_first: bool,
    quantize: bool,
}

impl Plan {
    fn new(h: usize, w: usize, c: usize, oh: usize, ow: usize, method: Method) -> Plan {
        let quantize = method == Method::Lanczos;
        // Pillow and torch both skip a pass whose size does not change (for
        // lanczos that also skips a rounding).
        let tx = (ow != w).then(|| taps(w, ow, method));
        let ty = (oh != h).then(|| taps(h, oh, method));
        let vertical_first = match (&tx, &ty) {
            (Some(tx), Some(ty)) if method == Method::Lanczos => ow > w && oh < h && tx.n > 0 && ty.n > 0,
            // Cost in multiply-adds: horizontal-first resizes h rows and blends at
            // the output width; vertical-first blends at the input width and
            // resizes oh rows.
            (Some(tx), Some(ty)) => oh * w * ty.n + oh * ow * tx.n < h * ow * tx.n + oh * ow * ty.n,
            _ => false,
        };
        Plan { c, w, ow, tx, ty, vertical_first, quantize }
    }

    fn round(&self, row: &mut [f32]) {
        if self.quantize {
            quantize_8bit(row);
        }
    }

    /// Output rows `first..` of the plane `src` into `band` (whole rows).
    fn rows(&self, src: &[f32], first: usize, band: &mut [f32]) {
        let (c, row_in, row_out) = (self.c, self.w * self.c, self.ow * self.c);
        let src_row = |i: usize| &src[i * row_in..(i + 1) * row_in];
        let out_rows = band.chunks_exact_mut(row_out).enumerate().map(|(i, d)| (first + i, d));
        match (&self.tx, &self.ty) {
            (None, None) => {
                for (y, d) in out_rows {
                    d.copy_from_slice(src_row(y));
                }
            }
            (Some(tx), None) => {
                for (y, d) in out_rows {
                    horizontal(src_row(y), d, c, tx);
                    self.round(d);
                }
            }
            (None, Some(ty)) => {
                for (y, d) in out_rows {
                    vertical(d, ty, y, src_row);
                    self.round(d);
                }
            }
            (Some(tx), Some(ty)) if self.vertical_first => {
                let mut tall = vec![0.0f32; row_in];
                for (y, d) in out_rows {
                    vertical(&mut tall, ty, y, src_row);
                    self.round(&mut tall);
                    horizontal(&tall, d, c, tx);
                    self.round(d);
                }
            }
            (Some(tx), Some(ty)) => {
                // Cache slot `i % n` holds horizontally resized source row i: one
                // output's taps are a run of at most n consecutive rows, so they
                // never collide.
                let slots = ty.n;
                let mut cache = vec![0.0f32; slots * row_out];
                let mut tag = vec![usize::MAX; slots];
                for (y, d) in out_rows {
                    for &i in ty.of(y).0 {
                        let slot = i % slots;
                        if tag[slot] != i {
                            let row = &mut cache[slot * row_out..(slot + 1) * row_out];
                            horizontal(src_row(i), row, c, tx);
                            self.round(row);
                            tag[slot] = i;
                        }
                    }
                    vertical(d, ty, y, |i| &cache[(i % slots) * row_out..(i % slots + 1) * row_out]);
                    self.round(d);
                }
            }
        }
    }
}

/// Pillow's 8-bit rounding of an intermediate value: `clip(round(255·v))`.
fn quantize_8bit(row: &mut [f32]) {
    row.iter_mut().for_each(|v| *v = (*v * 255.0 + 0.5).floor().clamp(0.0, 255.0) / 255.0);
}

/// Output row `y` of a vertical pass: `dst = Σ_k w_k · row(i_k)`, whole rows
/// at a time (a contiguous multiply-add LLVM vectorizes).
fn vertical<'a>(dst: &mut [f32], ty: &Taps, y: usize, row: impl Fn(usize) -> &'a [f32]) {
    let (idx, wt) = ty.of(y);
    let n = dst.len();
    let (first, w0) = (row(idx[0]), wt[0]);
    dst.iter_mut().zip(&first[..n]).for_each(|(d, &v)| *d = w0 * v);
    for (&i, &wk) in idx.iter().zip(wt).skip(1) {
        if wk == 0.0 {
            continue;
        }
        dst.iter_mut().zip(&row(i)[..n]).for_each(|(d, &v)| *d += wk * v);
    }
}

/// One row of a horizontal pass, specialized on the channel count.
fn horizontal(src: &[f32], dst: &mut [f32], c: usize, tx: &Taps) {
    match c {
        1 => horizontal_c::<1>(src, dst, tx),
        3 => horizontal_c::<3>(src, dst, tx),
        4 => horizontal_c::<4>(src, dst, tx),
        _ => horizontal_any(src, dst, c, tx),
    }
}

/// The horizontal pass for `C` channels: whole pixels as arrays, so the
/// channel loop unrolls and bounds are checked once per tap.
fn horizontal_c<const C: usize>(src: &[f32], dst: &mut [f32], tx: &Taps) {
    let (pixels, _) = src.as_chunks::<C>();
    let (out_pixels, _) = dst.as_chunks_mut::<C>();
    let taps = tx.index.chunks_exact(tx.n).zip(tx.weight.chunks_exact(tx.n));
    for (out, (idx, wt)) in out_pixels.iter_mut().zip(taps) {
        let mut acc = [0.0f32; C];
        for (&i, &wk) in idx.iter().zip(wt) {
            let p = &pixels[i];
            for ch in 0..C {
                acc[ch] += wk * p[ch];
            }
        }
        *out = acc;
    }
}

fn horizontal_any(src: &[f32], dst: &mut [f32], c: usize, tx: &Taps) {
    let taps = tx.index.chunks_exact(tx.n).zip(tx.weight.chunks_exact(tx.n));
    for (out, (idx, wt)) in dst.chunks_exact_mut(c).zip(taps) {
        out.fill(0.0);
        for (&i, &wk) in idx.iter().zip(wt) {
            for (o, &v) in out.iter_mut().zip(&src[i * c..(i + 1) * c]) {
                *o += wk * v;
            }
        }
    }
}

/// The region ComfyUI's center crop keeps of a `w × h` source for a `tw × th`
/// target: `(x, y, width, height)`.
pub fn center_crop(w: usize, h: usize, tw: usize, th: usize) -> (usize, usize, usize, usize) {
    let old = w as f64 / h as f64;
    let new = tw as f64 / th as f64;
    let (mut x, mut y) = (0usize, 0usize);
    if old > new {
        x = py_round((w as f64 - w as f64 * (new / old)) / 2.0).max(0) as usize;
    } else if old < new {
        y = py_round((h as f64 - h as f64 * (old / new)) / 2.0).max(0) as usize;
    }
    let cw = w.saturating_sub(2 * x).max(1);
    let ch = h.saturating_sub(2 * y).max(1);
    (x.min(w - 1), y.min(h - 1), cw, ch)
}

/// Python's `round` (half to even).
pub fn py_round(v: f64) -> i64 {
    v.round_ties_even() as i64
}

/// The `cw × ch` region at (x, y) of every image; `None` unless it lies inside.
pub fn crop(src: &[f32], dims: Dims, x: usize, y: usize, cw: usize, ch: usize) -> Option<(Vec<f32>, Dims)> {
    dims.check(src).ok()?;
    if cw == 0 || ch == 0 || x.checked_add(cw)? > dims.width || y.checked_add(ch)? > dims.height {
        return None;
    }
    let c = dims.channels;
    let mut data = Vec::with_capacity(dims.batch * ch * cw * c);
    for b in 0..dims.batch {
        for row in y..y + ch {
            let s = ((b * dims.height + row) * dims.width + x) * c;
            data.extend_from_slice(&src[s..s + cw * c]);
        }
    }
    Some((data, Dims { height: ch, width: cw, ..dims }))
}

/// The output of resizing `dims` to `width × height`, or why it cannot be.
pub fn check_target(dims: Dims, width: usize, height: usize) -> Result<Dims, KernelError> {
    if width == 0 || height == 0 || width > MAX_SIDE || height > MAX_SIDE {
        return Err(KernelError::Invalid(format!("cannot resize to {width}×{height}: sides are 1 to {MAX_SIDE}")));
    }
    let out = Dims { width, height, ..dims };
    out.len().ok_or_else(|| KernelError::Invalid(format!("{out:?} is too large")))?;
    Ok(out)
}

/// Resizes every image of a `B×H×W×C` batch to `width × height`, optionally
/// center-cropping to the target aspect ratio first. Lanczos works on 8-bit
/// values as ComfyUI does (it goes through Pillow): the source is truncated to
/// 8 bits, RGBA is premultiplied, and each pass is rounded to 8 bits.
pub fn resize_image(
    src: &[f32],
    dims: Dims,
    width: usize,
    height: usize,
    method: Method,
    crop_center: bool,
    stop: Stop<'_>,
) -> Result<(Vec<f32>, Dims), KernelError> {
    dims.check(src)?;
    let out = check_target(dims, width, height)?;
    let cropped;
    let (src, dims) = if crop_center {
        let (x, y, cw, ch) = center_crop(dims.width, dims.height, width, height);
        cropped = crop(src, dims, x, y, cw, ch).ok_or_else(|| KernelError::Invalid("center crop outside the image".into()))?;
        (&cropped.0[..], cropped.1)
    } else {
        (src, dims)
    };
    let prepared;
    let premultiply = method == Method::Lanczos && dims.channels == 4;
    let src = if method == Method::Lanczos {
        let mut data: Vec<f32> = src.iter().map(|v| (v * 255.0).clamp(0.0, 255.0).floor() / 255.0).collect();
        if premultiply {
            premultiply_rgba(&mut data);
        }
        prepared = data;
        &prepared[..]
    } else {
        src
    };
    let mut data = resize_frames(src, dims, out, method, stop)?;
    if premultiply {
        unpremultiply(&mut data);
    }
    Ok((data, out))
}

/// Resizes every mask of a `B×H×W` batch to `width × height`.
pub fn resize_mask(src: &[f32], dims: Dims, width: usize, height: usize, method: Method, stop: Stop<'_>) -> Result<(Vec<f32>, Dims), KernelError> {
    let dims = Dims { channels: 1, ..dims };
    dims.check(src)?;
    let out = check_target(dims, width, height)?;
    Ok((resize_frames(src, dims, out, method, stop)?, out))
}

fn resize_frames(src: &[f32], dims: Dims, out: Dims, method: Method, stop: Stop<'_>) -> Result<Vec<f32>, KernelError> {
    let plan = Plan::new(dims.height, dims.width, dims.channels, out.height, out.width, method);
    let mut data = vec![0.0f32; out.len().unwrap_or(0)];
    let in_frame = dims.frame_len();
    for_each_band(&mut data, out.frame_len(), out.row_len(), stop, |frame, first_row, band| {
        plan.rows(&src[frame * in_frame..(frame + 1) * in_frame], first_row, band);
    })?;
    Ok(data)
}

/// Pillow resizes RGBA as premultiplied 8-bit `RGBa`: `round(v·a/255)`.
fn premultiply_rgba(rgba: &mut [f32]) {
    for px in rgba.chunks_exact_mut(4) {
        let a = (px[3] * 255.0).round() as u32;
        for v in &mut px[..3] {
            let t = (*v * 255.0).round() as u32 * a + 128;
            *v = (((t >> 8) + t) >> 8) as f32 / 255.0;
        }
    }
}

/// Back from `RGBa`: `min(255, ⌊255·v/a⌋)`, unchanged where `a` is 0 or 255.
fn unpremultiply(rgba: &mut [f32]) {
    for px in rgba.chunks_exact_mut(4) {
        let a = (px[3] * 255.0).round() as u32;
        if a == 0 || a == 255 {
            continue;
        }
        for v in &mut px[..3] {
            *v = ((255 * (*v * 255.0).round() as u32) / a).min(255) as f32 / 255.0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn never() -> bool {
        false
    }

    fn row(values: &[f32], width: usize) -> Vec<f32> {
        let d = Dims { batch: 1, height: 1, width: values.len(), channels: 1 };
        resize_image(values, d, width, 1, Method::Bilinear, false, &never).unwrap().0
    }

    #[test]
    fn bilinear_upsamples_like_torch() {
        // torch: interpolate([0, 1], size=4, bilinear, align_corners=False) = [0, .25, .75, 1]
        assert_eq!(row(&[0.0, 1.0], 4), vec![0.0, 0.25, 0.75, 1.0]);
    }

    #[test]
    fn nearest_exact_uses_f32_indices() {
        let src: Vec<f32> = (0..14).map(|i| i as f32).collect();
        let d = Dims { batch: 1, height: 1, width: 14, channels: 1 };
        let out = resize_image(&src, d, 23, 1, Method::NearestExact, false, &never).unwrap().0;
        assert_eq!(out[11], 6.0);
    }

    #[test]
    fn area_averages_windows() {
        let d = Dims { batch: 1, height: 1, width: 4, channels: 1 };
        assert_eq!(resize_image(&[1.0, 3.0, 5.0, 7.0], d, 2, 1, Method::Area, false, &never).unwrap().0, vec![2.0, 6.0]);
    }

    #[test]
    fn center_crop_matches_comfy() {
        // 12×6 → 8×4 keeps the aspect: no crop. 12×6 → 4×4 crops x by 3.
        assert_eq!(center_crop(12, 6, 8, 4), (0, 0, 12, 6));
        assert_eq!(center_crop(12, 6, 4, 4), (3, 0, 6, 6));
    }

    #[test]
    fn constant_images_stay_constant() {
        let d = Dims { batch: 2, height: 5, width: 7, channels: 3 };
        let img = vec![0.25; d.len().unwrap()];
        for m in [Method::NearestExact, Method::Bilinear, Method::Area, Method::Bicubic] {
            let out = resize_image(&img, d, 11, 3, m, false, &never).unwrap().0;
            assert!(out.iter().all(|v| (v - 0.25).abs() < 1e-6), "{m:?}");
        }
    }

    #[test]
    fn bands_give_the_same_rows_as_one_pass() {
        // Big enough for many bands (and the pool with `parallel`): each band
        // starts its row cache afresh, which must not change any value.
        let d = Dims { batch: 2, height: 300, width: 400, channels: 3 };
        let img: Vec<f32> = (0..d.len().unwrap()).map(|i| ((i * 7919) % 1000) as f32 / 1000.0).collect();
        for m in [Method::Bilinear, Method::Bicubic, Method::Lanczos, Method::Area] {
            let (got, out) = resize_image(&img, d, 600, 450, m, false, &never).unwrap();
            let plan = Plan::new(300, 400, 3, 450, 600, m);
            let prepared: Vec<f32> =
                if m == Method::Lanczos { img.iter().map(|v| (v * 255.0).clamp(0.0, 255.0).floor() / 255.0).collect() } else { img.clone() };
            for b in 0..2 {
                let mut whole = vec![0.0f32; out.frame_len()];
                plan.rows(&prepared[b * d.frame_len()..(b + 1) * d.frame_len()], 0, &mut whole);
                assert_eq!(&got[b * out.frame_len()..(b + 1) * out.frame_len()], &whole[..], "{m:?} frame {b}");
            }
        }
    }

    #[test]
    fn bad_sizes_are_errors() {
        let d = Dims { batch: 1, height: 2, width: 2, channels: 3 };
        let img = vec![0.5; 12];
        assert!(resize_image(&img, d, 0, 4, Method::Bilinear, false, &never).is_err());
        assert!(resize_image(&img, d, MAX_SIDE + 1, 4, Method::Bilinear, false, &never).is_err());
        assert!(resize_image(&img[..11], d, 4, 4, Method::Bilinear, false, &never).is_err());
        assert!(crop(&img, d, 1, 0, 2, 2).is_none());
    }
}
