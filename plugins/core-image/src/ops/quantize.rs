//! Palette quantization for ImageQuantize: a median-cut palette (as Pillow's
//! default `quantize`), nearest-colour mapping, Floyd–Steinberg error
//! diffusion, and ComfyUI's ordered (Bayer) pre-offset.
//!
//! Parity: for images with at most `colors` distinct colours the palette is
//! exactly those colours and the result equals Pillow's. In general Pillow's
//! median cut splits boxes by its own heuristics and its colour lookup is
//! cached and approximate, so about 1–2 % of pixels may map to a different
//! (close) palette entry.

type Rgb = [u8; 3];

/// A median-cut palette of at most `colors` entries for `pixels`.
pub fn median_cut(pixels: &[Rgb], colors: usize) -> Vec<Rgb> {
    let mut hist: std::collections::HashMap<Rgb, u32> = std::collections::HashMap::new();
    for p in pixels {
        *hist.entry(*p).or_default() += 1;
    }
    let mut boxes: Vec<Vec<(Rgb, u32)>> = vec![hist.into_iter().collect()];
    boxes[0].sort_unstable();
    while boxes.len() < colors.max(1) {
        // Split the most populous box that has more than one colour.
        let Some((i, _)) = boxes.iter().enumerate().filter(|(_, b)| b.len() > 1).max_by_key(|(_, b)| b.iter().map(|(_, n)| *n as u64).sum::<u64>()) else {
            break;
        };
        let mut b = boxes.swap_remove(i);
        let range = |c: usize| {
            let (lo, hi) = b.iter().fold((255u8, 0u8), |(lo, hi), (p, _)| (lo.min(p[c]), hi.max(p[c])));
            hi - lo
        };
        let axis = (0..3).max_by_key(|&c| range(c)).unwrap_or(0);
        b.sort_unstable_by_key(|(p, _)| p[axis]);
        let total: u64 = b.iter().map(|(_, n)| *n as u64).sum();
        let mut acc = 0u64;
        let mut cut = 1;
        for (k, (_, n)) in b.iter().enumerate() {
            acc += *n as u64;
            if acc * 2 >= total {
                cut = (k + 1).clamp(1, b.len() - 1);
                break;
            }
        }
        let rest = b.split_off(cut);
        boxes.push(b);
        boxes.push(rest);
    }
    boxes
        .iter()
        .map(|b| {
            let n: u64 = b.iter().map(|(_, n)| *n as u64).sum();
            let mean = |c: usize| ((b.iter().map(|(p, k)| p[c] as u64 * *k as u64).sum::<u64>() + n / 2) / n.max(1)) as u8;
            [mean(0), mean(1), mean(2)]
        })
        .collect()
}

/// The palette entry nearest to `p` (squared RGB distance).
pub fn nearest(palette: &[Rgb], p: [i32; 3]) -> Rgb {
    let dist = |q: &Rgb| (0..3).map(|c| (q[c] as i32 - p[c]).pow(2)).sum::<i32>();
    palette.iter().copied().min_by_key(dist).unwrap_or([0, 0, 0])
}

/// Maps `pixels` (`w` wide) to `palette`, diffusing the error Floyd–Steinberg style when `dither`.
pub fn map_to_palette(pixels: &[Rgb], w: usize, palette: &[Rgb], dither: bool) -> Vec<Rgb> {
    if !dither {
        return pixels.iter().map(|p| nearest(palette, [p[0] as i32, p[1] as i32, p[2] as i32])).collect();
    }
    let mut err = vec![[0i32; 3]; pixels.len()];
    let mut out = Vec::with_capacity(pixels.len());
    for (i, p) in pixels.iter().enumerate() {
        let want: [i32; 3] = std::array::from_fn(|c| (p[c] as i32 + err[i][c] / 16).clamp(0, 255));
        let got = nearest(palette, want);
        out.push(got);
        let (x, h) = (i % w, pixels.len() / w);
        let y = i / w;
        for c in 0..3 {
            let e = want[c] - got[c] as i32;
            let mut spread = |dx: i64, dy: usize, k: i32| {
                let nx = x as i64 + dx;
                if nx >= 0 && (nx as usize) < w && y + dy < h {
                    err[(y + dy) * w + nx as usize][c] += e * k;
                }
            };
            spread(1, 0, 7);
            spread(-1, 1, 3);
            spread(0, 1, 5);
            spread(1, 1, 1);
        }
    }
    out
}

/// ComfyUI's normalized Bayer matrix of size `2^n`.
pub fn bayer_matrix(n: u32) -> Vec<Vec<f32>> {
    if n == 0 {
        return vec![vec![0.0]];
    }
    let prev = bayer_matrix(n - 1);
    let q = 4f32.powi(n as i32);
    let m = prev.len();
    let mut out = vec![vec![0.0; 2 * m]; 2 * m];
    for y in 0..m {
        for x in 0..m {
            let v = q * prev[y][x];
            out[y][x] = (v - 1.5) / q;
            out[y][x + m] = (v + 0.5) / q;
            out[y + m][x] = (v + 1.5) / q;
            out[y + m][x + m] = (v - 0.5) / q;
        }
    }
    out
}

/// Adds the ordered-dither offset (`spread·bayer + 0.5`, `spread = 512/palette size`) and truncates to 8 bits.
pub fn bayer_offset(pixels: &[Rgb], w: usize, order: usize, palette_len: usize) -> Vec<Rgb> {
    let m = bayer_matrix(order.trailing_zeros());
    let spread = 2.0 * 256.0 / palette_len.max(1) as f32;
    pixels
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let off = spread * m[(i / w) % m.len()][(i % w) % m.len()] + 0.5;
            std::array::from_fn(|c| (p[c] as f32 + off).clamp(0.0, 255.0) as u8)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn palette_holds_every_colour_when_there_are_few() {
        let px = [[255, 0, 0], [0, 255, 0], [255, 0, 0], [0, 0, 255]];
        let mut pal = median_cut(&px, 4);
        pal.sort();
        assert_eq!(pal, vec![[0, 0, 255], [0, 255, 0], [255, 0, 0]]);
        assert_eq!(map_to_palette(&px, 2, &pal, true), px.to_vec());
        assert_eq!(median_cut(&px, 1).len(), 1);
    }

    #[test]
    fn bayer_2_matches_comfy() {
        assert_eq!(bayer_matrix(1), vec![vec![-0.375, 0.125], vec![0.375, -0.125]]);
    }
}
