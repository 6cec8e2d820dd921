//! Resampling with the semantics ComfyUI gets from `torch.nn.functional.interpolate`
//! (antialias off, `align_corners=False`) and from Pillow for lanczos.
//!
//! Every method here is separable: a resize is a horizontal pass over each
//! interleaved row followed by a vertical pass that blends whole rows (a
//! contiguous loop LLVM vectorizes). Each pass is described by [`Taps`]: for
//! every output position, the source indices and weights it reads.

use kiln_sdk::{Image, Mask};

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

/// Resizes one `h × w × c` plane (interleaved) to `oh × ow × c`, appending
/// it to `out`.
///
/// Both passes stream row by row, so besides the output only a few rows are
/// allocated (no full-size intermediate image, which inside the sandbox
/// would cost as much in page faults as the arithmetic):
/// * horizontal first: each output row blends horizontally resized source
///   rows, kept in a small cache (taps move monotonically down the image, so
///   every source row is resized once);
/// * vertical first: each output row is the vertical blend of source rows,
///   then resized horizontally.
///
/// For the linear methods both orders give the same values (up to float
/// rounding), so the cheaper one is taken. Lanczos goes through Pillow, which
/// rounds to 8 bits after each pass, so its order is Pillow's: horizontal
/// first, except vertical first when the width grows and the height shrinks.
#[allow(clippy::too_many_arguments)]
fn resize_plane(src: &[f32], h: usize, w: usize, c: usize, oh: usize, ow: usize, method: Method, out: &mut Vec<f32>) {
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
    let (row_in, row_out) = (w * c, ow * c);
    // Each output row is built in a small buffer and appended: the output's
    // fresh pages are written once, not zero-filled first.
    out.reserve(oh * row_out);
    let mut d = vec![0.0f32; row_out];
    match (&tx, &ty) {
        (None, None) => out.extend_from_slice(&src[..h * row_in]),
        (Some(tx), None) => {
            for s in src.chunks_exact(row_in) {
                horizontal(s, &mut d, c, tx);
                if quantize {
                    quantize_8bit(&mut d);
                }
                out.extend_from_slice(&d);
            }
        }
        (None, Some(ty)) => {
            for y in 0..oh {
                vertical(&mut d, ty, y, |i| &src[i * row_in..(i + 1) * row_in]);
                if quantize {
                    quantize_8bit(&mut d);
                }
                out.extend_from_slice(&d);
            }
        }
        (Some(tx), Some(ty)) if vertical_first => {
            let mut tall = vec![0.0f32; row_in];
            for y in 0..oh {
                vertical(&mut tall, ty, y, |i| &src[i * row_in..(i + 1) * row_in]);
                if quantize {
                    quantize_8bit(&mut tall);
                }
                horizontal(&tall, &mut d, c, tx);
                if quantize {
                    quantize_8bit(&mut d);
                }
                out.extend_from_slice(&d);
            }
        }
        (Some(tx), Some(ty)) => {
            // Cache slot `i % n` holds horizontally resized source row i: one
            // output's taps are a run of at most n consecutive rows, so they
            // never collide.
            let slots = ty.n;
            let mut cache = vec![0.0f32; slots * row_out];
            let mut tag = vec![usize::MAX; slots];
            for y in 0..oh {
                for &i in ty.of(y).0 {
                    let slot = i % slots;
                    if tag[slot] != i {
                        let row = &mut cache[slot * row_out..(slot + 1) * row_out];
                        horizontal(&src[i * row_in..(i + 1) * row_in], row, c, tx);
                        if quantize {
                            quantize_8bit(row);
                        }
                        tag[slot] = i;
                    }
                }
                vertical(&mut d, ty, y, |i| &cache[(i % slots) * row_out..(i % slots + 1) * row_out]);
                if quantize {
                    quantize_8bit(&mut d);
                }
                out.extend_from_slice(&d);
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
        x = super::py_round((w as f64 - w as f64 * (new / old)) / 2.0).max(0) as usize;
    } else if old < new {
        y = super::py_round((h as f64 - h as f64 * (old / new)) / 2.0).max(0) as usize;
    }
    let cw = w.saturating_sub(2 * x).max(1);
    let ch = h.saturating_sub(2 * y).max(1);
    (x.min(w - 1), y.min(h - 1), cw, ch)
}

/// The `cw × ch` region at (x, y) of every image; the region must lie inside.
pub fn crop_image(img: &Image, x: usize, y: usize, cw: usize, ch: usize) -> Image {
    let c = img.channels;
    let mut data = Vec::with_capacity(img.batch * ch * cw * c);
    for b in 0..img.batch {
        for row in y..y + ch {
            let s = img.index(b, row, x, 0);
            data.extend_from_slice(&img.data[s..s + cw * c]);
        }
    }
    Image { batch: img.batch, height: ch, width: cw, channels: c, data }
}

/// Resizes every image of the batch to `width × height`, optionally center-
/// cropping to the target aspect ratio first. Lanczos works on 8-bit values
/// as ComfyUI does (it goes through Pillow): the source is truncated to 8 bits
/// and each pass is rounded to 8 bits.
pub fn resize_image(img: &Image, width: usize, height: usize, method: Method, crop_center: bool) -> Image {
    let cropped;
    let src = if crop_center {
        let (x, y, cw, ch) = center_crop(img.width, img.height, width, height);
        cropped = crop_image(img, x, y, cw, ch);
        &cropped
    } else {
        img
    };
    let truncated;
    let src = if method == Method::Lanczos {
        let data = src.data.iter().map(|v| (v * 255.0).clamp(0.0, 255.0).floor() / 255.0).collect();
        truncated = Image { data, ..src.clone() };
        &truncated
    } else {
        src
    };
    let c = src.channels;
    let frame = src.height * src.width * c;
    let premultiply = method == Method::Lanczos && c == 4;
    let mut data = Vec::with_capacity(src.batch * height * width * c);
    for b in 0..src.batch {
        let plane = &src.data[b * frame..(b + 1) * frame];
        if premultiply {
            let start = data.len();
            resize_plane(&premultiplied(plane), src.height, src.width, c, height, width, method, &mut data);
            unpremultiply(&mut data[start..]);
        } else {
            resize_plane(plane, src.height, src.width, c, height, width, method, &mut data);
        }
    }
    Image { batch: src.batch, height, width, channels: c, data }
}

/// Pillow resizes RGBA as premultiplied 8-bit `RGBa`: `round(v·a/255)`.
fn premultiplied(rgba: &[f32]) -> Vec<f32> {
    let mut out = rgba.to_vec();
    for px in out.chunks_exact_mut(4) {
        let a = (px[3] * 255.0).round() as u32;
        for v in &mut px[..3] {
            let t = (*v * 255.0).round() as u32 * a + 128;
            *v = (((t >> 8) + t) >> 8) as f32 / 255.0;
        }
    }
    out
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

/// Resizes every mask of the batch to `width × height`.
pub fn resize_mask(m: &Mask, width: usize, height: usize, method: Method) -> Mask {
    let frame = m.height * m.width;
    let mut data = Vec::with_capacity(m.batch * height * width);
    for b in 0..m.batch {
        resize_plane(&m.data[b * frame..(b + 1) * frame], m.height, m.width, 1, height, width, method, &mut data);
    }
    Mask { batch: m.batch, height, width, data }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(values: &[f32]) -> Image {
        Image::from_vec(1, 1, values.len(), 1, values.to_vec()).unwrap()
    }

    #[test]
    fn bilinear_upsamples_like_torch() {
        // torch: interpolate([0, 1], size=4, bilinear, align_corners=False) = [0, .25, .75, 1]
        assert_eq!(resize_image(&row(&[0.0, 1.0]), 4, 1, Method::Bilinear, false).data, vec![0.0, 0.25, 0.75, 1.0]);
    }

    #[test]
    fn nearest_exact_uses_f32_indices() {
        let src: Vec<f32> = (0..14).map(|i| i as f32).collect();
        let out = resize_image(&row(&src), 23, 1, Method::NearestExact, false);
        assert_eq!(out.data[11], 6.0);
    }

    #[test]
    fn area_averages_windows() {
        assert_eq!(resize_image(&row(&[1.0, 3.0, 5.0, 7.0]), 2, 1, Method::Area, false).data, vec![2.0, 6.0]);
    }

    #[test]
    fn center_crop_matches_comfy() {
        // 12×6 → 8×4 keeps the aspect: no crop. 12×6 → 4×4 crops x by 3.
        assert_eq!(center_crop(12, 6, 8, 4), (0, 0, 12, 6));
        assert_eq!(center_crop(12, 6, 4, 4), (3, 0, 6, 6));
    }

    #[test]
    fn constant_images_stay_constant() {
        let img = Image::filled(2, 5, 7, 3, 0.25);
        for m in [Method::NearestExact, Method::Bilinear, Method::Area, Method::Bicubic] {
            let out = resize_image(&img, 11, 3, m, false);
            assert!(out.data.iter().all(|v| (v - 0.25).abs() < 1e-6), "{m:?}");
        }
    }
}
