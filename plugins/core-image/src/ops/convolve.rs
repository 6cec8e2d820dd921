//! Gaussian convolution with reflect padding, as ComfyUI's ImageBlur and
//! ImageSharpen compute it, done separably.
//!
//! ComfyUI samples `exp(-d²/2σ²)` on a `(2r+1)²` grid over [-1, 1]² and
//! normalizes it; that kernel is the outer product of the normalized 1-D
//! kernel, so a horizontal and a vertical pass give the same result in
//! `O(r)` instead of `O(r²)` per pixel. Both passes run over contiguous
//! slices (the horizontal one over a reflect-padded copy of each row) so the
//! inner loops vectorize.

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

/// Convolves every image of the batch with the separable kernel `k`
/// (odd length) under reflect padding. Requires `k.len()/2 < width, height`.
pub fn convolve_separable(img: &Image, k: &[f32]) -> Image {
    let r = k.len() / 2;
    let (h, w, c) = (img.height, img.width, img.channels);
    let row_len = w * c;
    let mut out = Vec::with_capacity(img.data.len());
    let mut tmp = vec![0.0f32; h * row_len];
    let mut padded = vec![0.0f32; (w + 2 * r) * c];
    for b in 0..img.batch {
        let frame = &img.data[b * h * row_len..(b + 1) * h * row_len];
        // Horizontal: pad each row by reflection, then sum shifted copies.
        for y in 0..h {
            let row = &frame[y * row_len..(y + 1) * row_len];
            // The row in the middle in one copy; only the 2r reflected pixels one by one.
            padded[r * c..r * c + row_len].copy_from_slice(row);
            for p in (0..r).chain(w + r..w + 2 * r) {
                let s = reflect(p as isize - r as isize, w);
                padded[p * c..(p + 1) * c].copy_from_slice(&row[s * c..(s + 1) * c]);
            }
            let dst = &mut tmp[y * row_len..(y + 1) * row_len];
            weighted_sum(dst, k, |j| &padded[j * c..j * c + row_len]);
        }
        // Vertical: each output row is a weighted sum of whole rows.
        let start = out.len();
        out.resize(start + h * row_len, 0.0);
        for y in 0..h {
            let dst = &mut out[start + y * row_len..start + (y + 1) * row_len];
            let rows: Vec<&[f32]> = (0..k.len())
                .map(|j| {
                    let s = reflect(y as isize + j as isize - r as isize, h);
                    &tmp[s * row_len..(s + 1) * row_len]
                })
                .collect();
            weighted_sum(dst, k, |j| rows[j]);
        }
    }
    Image { data: out, ..img.clone() }
}

/// `dst[i] = Σ_j k[j]·src(j)[i]`, eight outputs at a time kept in registers
/// so each output is stored once rather than once per tap. The kernel is
/// symmetric, so taps `j` and `n−1−j` share one multiply.
fn weighted_sum<'a>(dst: &mut [f32], k: &[f32], src: impl Fn(usize) -> &'a [f32]) {
    const B: usize = 8;
    let n = dst.len();
    let taps = k.len();
    let half = taps / 2;
    let blocks = n / B * B;
    let srcs: Vec<&[f32]> = (0..taps).map(|j| &src(j)[..n]).collect();
    let block = |s: &[f32], i: usize| -> [f32; B] {
        let mut v = [0.0; B];
        v.copy_from_slice(&s[i..i + B]);
        v
    };
    for (bi, out) in dst[..blocks].chunks_exact_mut(B).enumerate() {
        let i = bi * B;
        let centre = block(srcs[half], i);
        let mut acc: [f32; B] = std::array::from_fn(|l| k[half] * centre[l]);
        for j in 0..half {
            let (a, b) = (block(srcs[j], i), block(srcs[taps - 1 - j], i));
            for l in 0..B {
                acc[l] += k[j] * (a[l] + b[l]);
            }
        }
        out.copy_from_slice(&acc);
    }
    for i in blocks..n {
        let mut acc = k[half] * srcs[half][i];
        for j in 0..half {
            acc += k[j] * (srcs[j][i] + srcs[taps - 1 - j][i]);
        }
        dst[i] = acc;
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

    #[test]
    fn separable_matches_direct_2d_convolution() {
        let (h, w, c, r) = (5usize, 6usize, 2usize, 2usize);
        let data: Vec<f32> = (0..h * w * c).map(|i| ((i * 37) % 17) as f32 / 17.0).collect();
        let img = Image::from_vec(1, h, w, c, data).unwrap();
        let k = gaussian_1d(r, 1.3);
        let sep = convolve_separable(&img, &k);
        for y in 0..h {
            for x in 0..w {
                for ch in 0..c {
                    let mut acc = 0.0;
                    for dy in 0..=2 * r {
                        for dx in 0..=2 * r {
                            let sy = reflect(y as isize + dy as isize - r as isize, h);
                            let sx = reflect(x as isize + dx as isize - r as isize, w);
                            acc += k[dy] * k[dx] * img.get(0, sy, sx, ch);
                        }
                    }
                    assert!((sep.get(0, y, x, ch) - acc).abs() < 1e-5);
                }
            }
        }
    }
}
