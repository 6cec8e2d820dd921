//! Gaussian convolution with reflect padding, as ComfyUI's ImageBlur and
//! ImageSharpen compute it, done separably.
//!
//! ComfyUI samples `exp(-d²/2σ²)` on a `(2r+1)²` grid over [-1, 1]² and
//! normalizes it; since `d² = x² + y²` that kernel is the outer product of the
//! normalized 1-D kernel, so a vertical and a horizontal pass give the same
//! result in `O(r)` instead of `O(r²)` per pixel.
//!
//! Each output row is independent: the vertical sum of input rows `y−r ..=
//! y+r` goes into a reflect-padded row buffer, and the horizontal pass over
//! that buffer writes the output row. Bands of rows run in parallel.
//!
//! Speed: both passes are "weighted sum of shifted slices", computed over
//! short strips whose accumulator stays in L1; the loops are plain zipped
//! slices, so LLVM vectorizes them. The kernel is symmetric, so taps `j` and
//! `2r−j` share one multiply.

use crate::bands::{Stop, for_each_band};
use crate::{Dims, KernelError};

/// Most taps a kernel may have (ComfyUI's radius limit is 31, 63 taps).
pub const MAX_TAPS: usize = 255;

/// How far apart taps `j` and `n−1−j` may be, relative to the largest tap.
pub const SYMMETRY_TOLERANCE: f32 = 1e-5;

/// The normalized 1-D Gaussian of `2·radius+1` taps over [-1, 1] (f32, like
/// `torch.linspace`, which computes the first half from -1 and the second
/// from 1, so the taps are exactly symmetric).
pub fn gaussian_1d(radius: usize, sigma: f32) -> Vec<f32> {
    let n = 2 * radius + 1;
    let step = if n > 1 { 2.0 / (n - 1) as f32 } else { 0.0 };
    let g: Vec<f32> = (0..n)
        .map(|i| {
            let x = if i < n / 2 { -1.0 + step * i as f32 } else { 1.0 - step * (n - 1 - i) as f32 };
            (-(x * x) / (2.0 * sigma * sigma)).exp()
        })
        .collect();
    let total: f32 = g.iter().sum();
    g.into_iter().map(|v| v / total).collect()
}

/// `torch`'s reflect padding index (no edge repeat); `i` may be out of range
/// by less than `n`.
fn reflect(i: isize, n: usize) -> usize {
    let n = n as isize;
    let r = if i < 0 {
        -i
    } else if i >= n {
        2 * (n - 1) - i
    } else {
        i
    };
    r as usize
}

/// What the horizontal pass writes for an original value `x` and its blur `b`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Finish {
    /// `b`: a plain blur.
    Blur,
    /// `clamp((1+s)·x − s·b, 0, 1)`: ImageSharpen with `s = 10·alpha`.
    Sharpen(f32),
}

/// Convolves every image of `src` with the separable kernel `k` (odd length,
/// symmetric up to rounding — the left half is used —, at most [`MAX_TAPS`]) under reflect padding and applies
/// `finish`. The radius `k.len()/2` must be smaller than the width and the
/// height (torch's reflect-padding limit).
pub fn separable(src: &[f32], dims: Dims, k: &[f32], finish: Finish, stop: Stop<'_>) -> Result<Vec<f32>, KernelError> {
    dims.check(src)?;
    check(dims, k, finish)?;
    let mut out = vec![0.0f32; src.len()];
    let (frame_len, row_len) = (dims.frame_len(), dims.row_len());
    for_each_band(&mut out, frame_len, row_len, stop, |frame, first_row, band| {
        let frame = &src[frame * frame_len..(frame + 1) * frame_len];
        convolve_rows(frame, dims, k, finish, first_row, band);
    })?;
    Ok(out)
}

/// Whether [`separable`] accepts the kernel `k` and `finish` for images of `dims`.
pub fn check(dims: Dims, k: &[f32], finish: Finish) -> Result<(), KernelError> {
    if k.len().is_multiple_of(2) || k.len() > MAX_TAPS {
        return Err(KernelError::Invalid(format!("a kernel has an odd number of taps up to {MAX_TAPS}, got {}", k.len())));
    }
    // Symmetric up to float rounding, measured against the largest tap: a
    // sampled Gaussian built another way (an older SDK's taps) is not
    // bit-exact, and its tails, up to 1e-23 of the centre at radius 31 and
    // sigma 0.1, differ relatively by far more than 1e-5 while mattering
    // not at all. The passes use the left half; within this tolerance that
    // moves an output by at most 1e-5 of the largest tap per tap.
    if k.iter().any(|v| !v.is_finite()) {
        return Err(KernelError::Invalid("kernel taps must be finite and symmetric".into()));
    }
    let largest = k.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    if k.iter().zip(k.iter().rev()).any(|(a, b)| (a - b).abs() > SYMMETRY_TOLERANCE * largest) {
        return Err(KernelError::Invalid("kernel taps must be finite and symmetric".into()));
    }
    if let Finish::Sharpen(s) = finish
        && !s.is_finite()
    {
        return Err(KernelError::Invalid(format!("sharpen strength {s} is not finite")));
    }
    let r = k.len() / 2;
    if r >= dims.width || r >= dims.height {
        return Err(KernelError::Invalid(format!(
            "radius {r} must be smaller than the image ({}×{}): padding size should be less than the corresponding input dimension",
            dims.width, dims.height
        )));
    }
    Ok(())
}

/// Output rows `first_row..` of one frame into `band` (whole rows).
fn convolve_rows(frame: &[f32], dims: Dims, k: &[f32], finish: Finish, first_row: usize, band: &mut [f32]) {
    let (h, w, c) = (dims.height, dims.width, dims.channels);
    let row_len = w * c;
    let r = k.len() / 2;
    let row = |y: usize| &frame[y * row_len..(y + 1) * row_len];
    // The vertical result of one row, reflect-padded by r pixels each side.
    let mut padded = vec![0.0f32; (w + 2 * r) * c];
    for (i, dst) in band.chunks_exact_mut(row_len).enumerate() {
        let y = first_row + i;
        {
            let rows: Vec<&[f32]> = (0..k.len()).map(|j| row(reflect(y as isize + j as isize - r as isize, h))).collect();
            weighted_sum(&mut padded[r * c..r * c + row_len], k, &rows, store);
        }
        // Reflect-pad the row: pixel p of the padded row is pixel p−r.
        for p in (0..r).chain(w + r..w + 2 * r) {
            let s = reflect(p as isize - r as isize, w) + r;
            padded.copy_within(s * c..(s + 1) * c, p * c);
        }
        let taps: Vec<&[f32]> = (0..k.len()).map(|j| &padded[j * c..j * c + row_len]).collect();
        match finish {
            Finish::Blur => weighted_sum(dst, k, &taps, store),
            Finish::Sharpen(s) => {
                let orig = row(y);
                weighted_sum(dst, k, &taps, |d: &mut [f32], acc: &[f32], start: usize| {
                    for ((d, &b), &x) in d.iter_mut().zip(acc).zip(&orig[start..]) {
                        // Compare-and-select rather than `clamp`: cheap
                        // min/max instructions instead of NaN-propagating ones.
                        let v = (1.0 + s) * x - s * b;
                        let v = if v < 0.0 { 0.0 } else { v };
                        *d = if v > 1.0 { 1.0 } else { v };
                    }
                })
            }
        }
    }
}

/// The strip length: the accumulator (2 KiB) stays in L1 while every tap
/// streams through it.
const STRIP: usize = 512;

/// [`weighted_sum`]'s plain finish: the sums themselves.
fn store(dst: &mut [f32], acc: &[f32], _start: usize) {
    dst.copy_from_slice(acc);
}

/// `Σ_j k[j]·srcs[j][i]` for a symmetric `k`, handed strip by strip to
/// `finish(dst strip, sums, strip start)` (generic, so each finish is
/// compiled into the loop); every `srcs[j]` is at least `dst.len()` long.
fn weighted_sum(dst: &mut [f32], k: &[f32], srcs: &[&[f32]], finish: impl Fn(&mut [f32], &[f32], usize)) {
    let n = dst.len();
    let half = k.len() / 2;
    let mut acc = [0.0f32; STRIP];
    let mut start = 0;
    while start < n {
        let len = STRIP.min(n - start);
        let range = start..start + len;
        let acc = &mut acc[..len];
        let centre = &srcs[half][range.clone()];
        let kc = k[half];
        acc.iter_mut().zip(centre).for_each(|(a, &x)| *a = kc * x);
        // Up to four symmetric pairs per sweep: one accumulator load/store
        // per eight taps.
        let mut j = 0;
        while j + 3 < half {
            let ks = [k[j], k[j + 1], k[j + 2], k[j + 3]];
            let pair = |t: usize| (&srcs[j + t][range.clone()], &srcs[k.len() - 1 - j - t][range.clone()]);
            let ((a0, b0), (a1, b1), (a2, b2), (a3, b3)) = (pair(0), pair(1), pair(2), pair(3));
            let rows = a0.iter().zip(b0).zip(a1.iter().zip(b1)).zip(a2.iter().zip(b2).zip(a3.iter().zip(b3)));
            for (acc, (((&a0, &b0), (&a1, &b1)), ((&a2, &b2), (&a3, &b3)))) in acc.iter_mut().zip(rows) {
                *acc += ks[0] * (a0 + b0) + ks[1] * (a1 + b1) + ks[2] * (a2 + b2) + ks[3] * (a3 + b3);
            }
            j += 4;
        }
        while j + 1 < half {
            let (k0, k1) = (k[j], k[j + 1]);
            let (a0, b0) = (&srcs[j][range.clone()], &srcs[k.len() - 1 - j][range.clone()]);
            let (a1, b1) = (&srcs[j + 1][range.clone()], &srcs[k.len() - 2 - j][range.clone()]);
            for ((((acc, &a0), &b0), &a1), &b1) in acc.iter_mut().zip(a0).zip(b0).zip(a1).zip(b1) {
                *acc += k0 * (a0 + b0) + k1 * (a1 + b1);
            }
            j += 2;
        }
        if j < half {
            let k0 = k[j];
            let (a0, b0) = (&srcs[j][range.clone()], &srcs[k.len() - 1 - j][range.clone()]);
            for ((acc, &a0), &b0) in acc.iter_mut().zip(a0).zip(b0) {
                *acc += k0 * (a0 + b0);
            }
        }
        finish(&mut dst[range], acc, start);
        start += len;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn never() -> bool {
        false
    }

    #[test]
    fn kernel_is_normalized_and_symmetric() {
        let k = gaussian_1d(3, 0.7);
        assert!((k.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!((k[0] - k[6]).abs() < 1e-7 && k[3] > k[2]);
    }

    #[test]
    fn reflect_has_no_edge_repeat() {
        assert_eq!([reflect(-2, 5), reflect(-1, 5), reflect(5, 5), reflect(6, 5)], [2, 1, 3, 2]);
    }

    fn at(d: Dims, b: usize, y: usize, x: usize, ch: usize) -> usize {
        ((b * d.height + y) * d.width + x) * d.channels + ch
    }

    /// The direct 2-D convolution the separable one must equal.
    fn direct(img: &[f32], d: Dims, k: &[f32]) -> Vec<f32> {
        let r = k.len() / 2;
        let mut out = img.to_vec();
        for b in 0..d.batch {
            for y in 0..d.height {
                for x in 0..d.width {
                    for ch in 0..d.channels {
                        let mut acc = 0.0;
                        for dy in 0..=2 * r {
                            for dx in 0..=2 * r {
                                let sy = reflect(y as isize + dy as isize - r as isize, d.height);
                                let sx = reflect(x as isize + dx as isize - r as isize, d.width);
                                acc += k[dy] * k[dx] * img[at(d, b, sy, sx, ch)];
                            }
                        }
                        out[at(d, b, y, x, ch)] = acc;
                    }
                }
            }
        }
        out
    }

    fn sample(d: Dims) -> Vec<f32> {
        (0..d.len().unwrap()).map(|i| ((i * 37) % 17) as f32 / 17.0).collect()
    }

    #[test]
    fn separable_matches_direct_2d_convolution() {
        // Radii up to the side limit (reflect at both ends), odd and even pair
        // counts, strips longer than one, several bands and frames.
        for (batch, height, width, channels, r) in [(1, 5, 6, 2, 2), (2, 9, 7, 3, 4), (1, 6, 200, 4, 5), (1, 12, 5, 1, 3), (1, 4, 4, 3, 1), (2, 120, 700, 3, 8)]
        {
            let d = Dims { batch, height, width, channels };
            let img = sample(d);
            let k = gaussian_1d(r, 1.3);
            let want = direct(&img, d, &k);
            let got = separable(&img, d, &k, Finish::Blur, &never).unwrap();
            let err = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
            assert!(err < 1e-5, "{d:?} r{r}: {err}");
        }
    }

    #[test]
    fn sharpen_finish_is_the_comfy_kernel() {
        // K = −s·G2 with the centre raised so ΣK = 1, applied directly.
        let d = Dims { batch: 1, height: 7, width: 9, channels: 3 };
        let img = sample(d);
        let (r, s) = (2, 3.0f32);
        let k = gaussian_1d(r, 0.8);
        let blurred = direct(&img, d, &k);
        let got = separable(&img, d, &k, Finish::Sharpen(s), &never).unwrap();
        for y in 0..7 {
            for x in 0..9 {
                for ch in 0..3 {
                    let mut acc = 0.0;
                    let mut centre = 1.0f32;
                    for dy in 0..=2 * r {
                        for dx in 0..=2 * r {
                            let kv = -s * k[dy] * k[dx];
                            centre -= kv;
                            let sy = reflect(y as isize + dy as isize - r as isize, 7);
                            let sx = reflect(x as isize + dx as isize - r as isize, 9);
                            acc += kv * img[at(d, 0, sy, sx, ch)];
                        }
                    }
                    let i = at(d, 0, y, x, ch);
                    let want = (acc + centre * img[i]).clamp(0.0, 1.0);
                    assert!((got[i] - want).abs() < 1e-4, "{y},{x}");
                    let alt = ((1.0 + s) * img[i] - s * blurred[i]).clamp(0.0, 1.0);
                    assert!((got[i] - alt).abs() < 1e-5);
                }
            }
        }
    }

    /// The taps as kiln built them before they followed `torch.linspace`
    /// (what a plugin built against an older SDK still sends): `-1 + step·i`
    /// throughout, so the right half is off by a rounding.
    fn gaussian_from_the_left(radius: usize, sigma: f32) -> Vec<f32> {
        let n = 2 * radius + 1;
        let step = if n > 1 { 2.0 / (n - 1) as f32 } else { 0.0 };
        let g: Vec<f32> = (0..n).map(|i| -1.0 + step * i as f32).map(|x| (-(x * x) / (2.0 * sigma * sigma)).exp()).collect();
        let total: f32 = g.iter().sum();
        g.into_iter().map(|v| v / total).collect()
    }

    #[test]
    fn every_kernel_comfyui_accepts_passes_the_check() {
        // ComfyUI's ranges: radius 1..=31, sigma 0.1..=10 (ImageBlur steps
        // 0.1, ImageSharpen 0.01), alpha 0..=5 (strength 10·alpha).
        let d = Dims { batch: 1, height: 64, width: 64, channels: 3 };
        let mut sigmas: Vec<f64> = (1..=100).map(|i| f64::from(i) / 10.0).collect();
        sigmas.extend((10..=30).map(|i| f64::from(i) / 100.0));
        for radius in 1..=31 {
            for &sigma in &sigmas {
                let k = gaussian_1d(radius, sigma as f32);
                assert!(k.iter().zip(k.iter().rev()).all(|(a, b)| a == b), "r{radius} sigma {sigma}: exactly symmetric");
                for finish in [Finish::Blur, Finish::Sharpen(0.0), Finish::Sharpen(50.0)] {
                    assert_eq!(check(d, &k, finish), Ok(()), "r{radius} sigma {sigma} {finish:?}");
                }
                let old = gaussian_from_the_left(radius, sigma as f32);
                assert_eq!(check(d, &old, Finish::Blur), Ok(()), "older taps, r{radius} sigma {sigma}");
            }
        }
        // The case that used to be refused: tails ~1e-23 of the centre.
        let old = gaussian_from_the_left(31, 0.1);
        assert!(old.iter().zip(old.iter().rev()).any(|(a, b)| (a - b).abs() > 1e-5 * a.abs().max(b.abs())), "the tails differ relatively");
    }

    #[test]
    fn the_extreme_kernels_convolve_like_the_direct_2d_sum() {
        let d = Dims { batch: 1, height: 33, width: 35, channels: 2 };
        let img = sample(d);
        for (r, sigma) in [(31, 0.1), (31, 10.0), (1, 0.1), (1, 10.0)] {
            let k = gaussian_1d(r, sigma);
            let want = direct(&img, d, &k);
            let got = separable(&img, d, &k, Finish::Blur, &never).unwrap();
            let err = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
            assert!(err < 1e-5, "r{r} sigma {sigma}: {err}");
        }
    }

    #[test]
    fn bad_arguments_are_errors_not_panics() {
        let d = Dims { batch: 1, height: 4, width: 4, channels: 3 };
        let img = sample(d);
        let bad = |k: &[f32], dims: Dims, data: &[f32]| matches!(separable(data, dims, k, Finish::Blur, &never), Err(KernelError::Invalid(_)));
        assert!(bad(&[0.5, 0.5], d, &img), "even tap count");
        assert!(bad(&gaussian_1d(4, 1.0), d, &img), "radius as large as the image");
        assert!(bad(&[0.1, 0.8, 0.2], d, &img), "asymmetric");
        assert!(bad(&[1e-3, 1.0, 0.0], d, &img), "asymmetric in a tail, by more than a rounding of the centre");
        assert!(bad(&[1.0, 1.0, f32::INFINITY], d, &img), "not finite in a tail");
        assert!(bad(&[f32::NAN], d, &img), "not finite");
        assert!(bad(&[1.0], Dims { width: 5, ..d }, &img), "dims not matching the data");
        assert!(bad(&vec![0.0; MAX_TAPS + 2], d, &img), "too many taps");
        assert!(matches!(separable(&img, d, &[1.0], Finish::Sharpen(f32::INFINITY), &never), Err(KernelError::Invalid(_))));
    }
}
