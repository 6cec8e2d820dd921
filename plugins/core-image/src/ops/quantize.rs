//! Palette quantization for ImageQuantize: a median-cut palette (as Pillow's
//! default `quantize`), Pillow's palette lookup, Floyd–Steinberg error
//! diffusion, and ComfyUI's ordered (Bayer) pre-offset.
//!
//! Parity: the colour lookup reproduces Pillow's mapping exactly. Pillow does
//! not search the exactly nearest entry per pixel: its lookup is a cache of
//! 64³ slots (the top six bits of each channel), and a slot holds the entry
//! nearest to the slot's corner `(r & !3, g & !3, b & !3)`, the lowest index
//! winning ties. That is why ~1.5 % of pixels differ from an exact nearest
//! search, and why even a colour that is in the palette can map to a close
//! neighbour (white to #fcfcfc when both are entries: Pillow issue #1852).
//! [`Lookup`] does the same, so given Pillow's palette the result is
//! Pillow's (released versions since 9.2, which fixed the slot pruning).
//!
//! The palette itself is a plain median cut: for images with at most
//! `colors` distinct colours it is exactly those colours (as Pillow's); in
//! general Pillow's median cut splits boxes by its own heuristics, so
//! palettes (and hence pixels) can differ slightly.

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

/// The palette entry nearest to `p` (squared RGB distance, first entry on ties).
pub fn nearest(palette: &[Rgb], p: [i32; 3]) -> Rgb {
    nearest_index(palette, p).map_or([0, 0, 0], |i| palette[i])
}

fn nearest_index(palette: &[Rgb], p: [i32; 3]) -> Option<usize> {
    let dist = |q: &Rgb| (0..3).map(|c| (q[c] as i32 - p[c]).pow(2)).sum::<i32>();
    // `min_by_key` keeps the first of equal minima: Pillow's strict `<` scan.
    palette.iter().enumerate().min_by_key(|(_, q)| dist(q)).map(|(i, _)| i)
}

/// Pillow's cached palette lookup: the entry for a colour is the one nearest
/// to the corner of its 4×4×4 cache slot, filled lazily per slot (which also
/// keeps the per-pixel cost at one table read instead of a palette scan).
pub struct Lookup<'a> {
    palette: &'a [Rgb],
    /// Palette index per slot, `u16::MAX` while not computed yet.
    slots: Vec<u16>,
}

impl<'a> Lookup<'a> {
    /// An empty cache over `palette`.
    pub fn new(palette: &'a [Rgb]) -> Lookup<'a> {
        Lookup { palette, slots: vec![u16::MAX; 64 * 64 * 64] }
    }

    /// The palette entry Pillow maps `p` (each channel 0..=255) to.
    pub fn get(&mut self, p: [u8; 3]) -> Rgb {
        let slot = (p[0] as usize >> 2) | (p[1] as usize >> 2) << 6 | (p[2] as usize >> 2) << 12;
        if self.slots[slot] == u16::MAX {
            let corner = [(p[0] & !3) as i32, (p[1] & !3) as i32, (p[2] & !3) as i32];
            self.slots[slot] = nearest_index(self.palette, corner).unwrap_or(0) as u16;
        }
        self.palette.get(self.slots[slot] as usize).copied().unwrap_or([0, 0, 0])
    }
}

/// Maps `pixels` (`w` wide) to `palette` with Pillow's lookup, diffusing the
/// error Floyd–Steinberg style when `dither`: 7/16 right, 3/16 down-left,
/// 5/16 down, 1/16 down-right, left to right on every row; the accumulated
/// error is divided by 16 with truncation and the sum clipped to 0..=255
/// before the lookup, and the error is taken against that clipped value.
pub fn map_to_palette(pixels: &[Rgb], w: usize, palette: &[Rgb], dither: bool) -> Vec<Rgb> {
    let mut lookup = Lookup::new(palette);
    if !dither {
        return pixels.iter().map(|&p| lookup.get(p)).collect();
    }
    let mut err = vec![[0i32; 3]; pixels.len()];
    let mut out = Vec::with_capacity(pixels.len());
    let h = pixels.len().checked_div(w).unwrap_or(0);
    for (i, p) in pixels.iter().enumerate() {
        let want: [u8; 3] = std::array::from_fn(|c| (p[c] as i32 + err[i][c] / 16).clamp(0, 255) as u8);
        let got = lookup.get(want);
        out.push(got);
        let (x, y) = (i % w, i / w);
        for c in 0..3 {
            let e = want[c] as i32 - got[c] as i32;
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
    fn lookup_uses_the_slot_corner_like_pillow() {
        // (3,0,0) sits in the slot whose corner is (0,0,0): Pillow maps it to
        // (1,0,0), not to the identical entry (3,0,0).
        let pal = [[1, 0, 0], [3, 0, 0]];
        let mut l = Lookup::new(&pal);
        assert_eq!(l.get([3, 0, 0]), [1, 0, 0]);
        assert_eq!(l.get([4, 0, 0]), [3, 0, 0]);
        // Ties go to the lower index: corner (0,0,0) is 2 from both (slot filled once).
        let pal = [[0, 2, 0], [2, 0, 0]];
        assert_eq!(Lookup::new(&pal).get([1, 1, 1]), [0, 2, 0]);
        let pal = [[2, 0, 0], [0, 2, 0]];
        assert_eq!(Lookup::new(&pal).get([1, 1, 1]), [2, 0, 0]);
    }

    #[test]
    fn floyd_steinberg_spreads_error_right_and_down() {
        // One row of mid grey against black/white: 128 maps to 255 (127 away
        // versus 128), error −127; the next pixel sees 128 + (−127·7)/16
        // truncated = 128 − 55 = 73, which maps to 0.
        let pal = [[0, 0, 0], [255, 255, 255]];
        let px = [[128u8; 3], [128u8; 3]];
        assert_eq!(map_to_palette(&px, 2, &pal, true), vec![[255; 3], [0; 3]]);
    }

    #[test]
    fn bayer_2_matches_comfy() {
        assert_eq!(bayer_matrix(1), vec![vec![-0.375, 0.125], vec![0.375, -0.125]]);
    }
}
