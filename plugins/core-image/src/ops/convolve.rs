//! Gaussian convolution with reflect padding, as ComfyUI's ImageBlur and
//! ImageSharpen compute it, done separably and in place.
//!
//! ComfyUI samples `exp(-d²/2σ²)` on a `(2r+1)²` grid over [-1, 1]² and
//! normalizes it; since `d² = x² + y²` that kernel is the outer product of the
//! normalized 1-D kernel, so a vertical and a horizontal pass give the same
//! result in `O(r)` instead of `O(r²)` per pixel.
//!
//! Memory: a 3072² RGB image is 113 MB, and inside the sandbox every fresh
//! buffer costs page faults, so the passes run row by row in place: output
//! row `y` is the vertical sum of the original rows `y−r ..= y+r` (rows below
//! `y` are still original in the image; the `r` rows above, already
//! overwritten, are kept in a ring of `r+1` saved rows), followed by the
//! horizontal pass over that one row. Besides the image only `O(r·W)` floats
//! are allocated.
//!
//! Speed: both passes are "weighted sum of shifted slices", computed over
//! short strips whose accumulator stays in L1; the loops are plain zipped
//! slices, so LLVM vectorizes them (f32x4 under wasm simd128). The kernel is
//! symmetric, so taps `j` and `2r−j` share one multiply.

use kiln_sdk::Image;

/// The normalized 1-D Gaussian of `2·radius+1` taps over [-1, 1] (f32, like
/// `torch.linspace`).
pub fn gaussian_1d(radius: usize, sigma: f32) -> Vec<f32> {
    let n = 2 * radius + 1;
    let step = if n > 1 { 2.0 / (n - 1) as f32 } else { 0.0 };
    let g: Vec<f32> = (0..n)
        .map(|i| {
            let x = -1.0 + step * i as f32;
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

/// What the last pass writes for an original value `x` and its blur `b`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Epilogue {
    /// `b`: a plain blur.
    Plain,
    /// `clamp((1+s)·x − s·b, 0, 1)`: ImageSharpen with `s = 10·alpha`.
    Sharpen(f32),
}

/// Convolves every image of the batch in place with the separable kernel `k`
/// (odd length, symmetric) under reflect padding, then applies `epilogue`.
/// Requires `k.len()/2 < width, height` (torch's reflect-padding limit; the
/// nodes check it). A kernel of one tap skips the convolution.
pub fn convolve_separable_in_place(img: &mut Image, k: &[f32], epilogue: Epilogue) {
    let r = k.len() / 2;
    let (h, w, c) = (img.height, img.width, img.channels);
    let row_len = w * c;
    let frame_len = h * row_len;
    if row_len == 0 || h == 0 || r >= w || r >= h {
        return;
    }
    // Original rows y−r ..= y, slot `row % (r+1)`.
    let mut ring = vec![0.0f32; (r + 1) * row_len];
    // The vertical result of one row, reflect-padded by r pixels each side.
    let mut padded = vec![0.0f32; (w + 2 * r) * c];
    for frame in img.data.chunks_exact_mut(frame_len) {
        for y in 0..h {
            let slot = |row: usize| (row % (r + 1)) * row_len;
            ring[slot(y)..slot(y) + row_len].copy_from_slice(&frame[y * row_len..(y + 1) * row_len]);
            // Vertical pass into the middle of `padded`: rows above y come
            // from the ring, rows from y on from the (untouched) frame.
            {
                let rows: Vec<&[f32]> = (0..k.len())
                    .map(|j| {
                        let s = reflect(y as isize + j as isize - r as isize, h);
                        if s <= y { &ring[slot(s)..slot(s) + row_len] } else { &frame[s * row_len..(s + 1) * row_len] }
                    })
                    .collect();
                weighted_sum(&mut padded[r * c..r * c + row_len], k, &rows, store);
            }
            // Reflect-pad the row: pixel p of the padded row is pixel p−r.
            for p in (0..r).chain(w + r..w + 2 * r) {
                let s = reflect(p as isize - r as isize, w) + r;
                padded.copy_within(s * c..(s + 1) * c, p * c);
            }
            // Horizontal pass straight into the image row.
            let taps: Vec<&[f32]> = (0..k.len()).map(|j| &padded[j * c..j * c + row_len]).collect();
            let dst = &mut frame[y * row_len..(y + 1) * row_len];
            match epilogue {
                Epilogue::Plain => weighted_sum(dst, k, &taps, store),
                Epilogue::Sharpen(s) => {
                    let orig = &ring[slot(y)..slot(y) + row_len];
                    weighted_sum(dst, k, &taps, |d: &mut [f32], acc: &[f32], start: usize| {
                        for ((d, &b), &x) in d.iter_mut().zip(acc).zip(&orig[start..]) {
                            // Compare-and-select rather than `clamp`: it lowers to
                            // wasm's cheap pseudo-min/max (`f32x4.pmin/pmax`)
                            // instead of NaN-propagating `f32x4.min/max` sequences.
                            let v = (1.0 + s) * x - s * b;
                            let v = if v < 0.0 { 0.0 } else { v };
                            *d = if v > 1.0 { 1.0 } else { v };
                        }
                    })
                }
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

    /// The direct 2-D convolution the in-place separable one must equal.
    fn direct(img: &Image, k: &[f32]) -> Image {
        let r = k.len() / 2;
        let mut out = img.clone();
        for b in 0..img.batch {
            for y in 0..img.height {
                for x in 0..img.width {
                    for ch in 0..img.channels {
                        let mut acc = 0.0;
                        for dy in 0..=2 * r {
                            for dx in 0..=2 * r {
                                let sy = reflect(y as isize + dy as isize - r as isize, img.height);
                                let sx = reflect(x as isize + dx as isize - r as isize, img.width);
                                acc += k[dy] * k[dx] * img.get(b, sy, sx, ch);
                            }
                        }
                        let i = out.index(b, y, x, ch);
                        out.data[i] = acc;
                    }
                }
            }
        }
        out
    }

    fn sample(b: usize, h: usize, w: usize, c: usize) -> Image {
        let data: Vec<f32> = (0..b * h * w * c).map(|i| ((i * 37) % 17) as f32 / 17.0).collect();
        Image::from_vec(b, h, w, c, data).unwrap()
    }

    #[test]
    fn in_place_separable_matches_direct_2d_convolution() {
        // Radii up to the side limit (ring and reflect at both ends), odd
        // and even pair counts, strips longer than one.
        for (b, h, w, c, r) in [(1, 5, 6, 2, 2), (2, 9, 7, 3, 4), (1, 6, 200, 4, 5), (1, 12, 5, 1, 3), (1, 4, 4, 3, 1)] {
            let img = sample(b, h, w, c);
            let k = gaussian_1d(r, 1.3);
            let want = direct(&img, &k);
            let mut got = img.clone();
            convolve_separable_in_place(&mut got, &k, Epilogue::Plain);
            let err = got.data.iter().zip(&want.data).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
            assert!(err < 1e-5, "{h}x{w}x{c} r{r}: {err}");
        }
    }

    #[test]
    fn sharpen_epilogue_is_the_comfy_kernel() {
        // K = −s·G2 with the centre raised so ΣK = 1, applied directly.
        let img = sample(1, 7, 9, 3);
        let (r, s) = (2, 3.0f32);
        let k = gaussian_1d(r, 0.8);
        let blurred = direct(&img, &k);
        let mut got = img.clone();
        convolve_separable_in_place(&mut got, &k, Epilogue::Sharpen(s));
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
                            acc += kv * img.get(0, sy, sx, ch);
                        }
                    }
                    // The raised centre tap: it sums to 1 − ΣK_other.
                    let want = (acc + centre * img.get(0, y, x, ch)).clamp(0.0, 1.0);
                    assert!((got.get(0, y, x, ch) - want).abs() < 1e-4, "{y},{x}");
                    let alt = ((1.0 + s) * img.get(0, y, x, ch) - s * blurred.get(0, y, x, ch)).clamp(0.0, 1.0);
                    assert!((got.get(0, y, x, ch) - alt).abs() < 1e-5);
                }
            }
        }
    }
}
