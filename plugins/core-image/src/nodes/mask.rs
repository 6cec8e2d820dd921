//! Mask nodes: conversions between images and masks, solid masks, and the
//! per-pixel and morphological mask operations.

use kiln_sdk::prelude::*;

const CHANNELS: [&str; 4] = ["red", "green", "blue", "alpha"];

/// `ImageToMask`: one channel of an image.
#[node(class = "ImageToMask", category = "mask", display_name = "Convert Image to Mask")]
pub fn image_to_mask_node(image: &Image, #[input(choices = CHANNELS)] channel: &str) -> Result<Mask> {
    image_to_mask(image, channel_index(channel)?)
}

/// The index of a `channel` combo value (`red` 0 … `alpha` 3).
pub fn channel_index(channel: &str) -> Result<usize> {
    CHANNELS.iter().position(|n| *n == channel).ok_or_else(|| Error::invalid(format!("unknown channel `{channel}`")))
}

/// Channel `c` of every pixel.
pub fn image_to_mask(image: &Image, c: usize) -> Result<Mask> {
    if c >= image.channels {
        return Err(Error::invalid(format!("the image has {} channels; channel {c} does not exist", image.channels)));
    }
    let data = image.data.chunks_exact(image.channels).map(|px| px[c]).collect();
    Ok(Mask { batch: image.batch, height: image.height, width: image.width, data })
}

/// `ImageColorToMask`: 1 where the pixel's 8-bit colour equals `color`.
/// 1.0 where `round(clamp(x)·255)` packed as `R<<16 | G<<8 | B` equals `color`.
#[node(class = "ImageColorToMask", category = "mask")]
pub fn image_color_to_mask(image: &Image, #[input(default = 0, min = 0, max = 16777215, step = 1, display = "number")] color: i64) -> Result<Mask> {
    if image.channels < 3 {
        return Err(Error::invalid("ImageColorToMask needs an RGB image"));
    }
    let q = |v: f32| (v.clamp(0.0, 1.0) * 255.0).round_ties_even() as i64;
    let data = image.data.chunks_exact(image.channels).map(|px| if (q(px[0]) << 16) + (q(px[1]) << 8) + q(px[2]) == color { 1.0 } else { 0.0 }).collect();
    Ok(Mask { batch: image.batch, height: image.height, width: image.width, data })
}

/// `MaskToImage`: a grey RGB image from a mask, each value repeated into R, G and B.
#[node(class = "MaskToImage", category = "mask", display_name = "Convert Mask to Image")]
pub fn mask_to_image(mask: &Mask) -> Image {
    let data = mask.data.iter().flat_map(|&v| [v, v, v]).collect();
    Image { batch: mask.batch, height: mask.height, width: mask.width, channels: 3, data }
}

/// `SolidMask`: a `[1, height, width]` mask filled with `value`.
#[node(class = "SolidMask", category = "mask")]
pub fn solid_mask(
    #[input(default = 1.0, min = 0.0, max = 1.0, step = 0.01)] value: f64,
    #[input(default = 512, min = 1, max = 16384, step = 1)] width: usize,
    #[input(default = 512, min = 1, max = 16384, step = 1)] height: usize,
) -> Result<Mask> {
    if width == 0 || height == 0 || width > 16384 || height > 16384 {
        return Err(Error::invalid(format!("SolidMask size {width}×{height} is outside 1..=16384")));
    }
    Ok(Mask::filled(1, height, width, value as f32))
}

/// `InvertMask`: `1 − m`.
#[node(class = "InvertMask", category = "mask")]
pub fn invert_mask_node(mask: MaskHandle) -> Result<MaskHandle> {
    if mask.is_unbatched() {
        // An [H, W] mask becomes [1, H, W] on the way in.
        return MaskHandle::from_mask(&invert_mask(mask.read()?));
    }
    // On the host, bit for bit `1 − m` (see ImageInvert).
    Ok(MaskHandle::new(kiln_sdk::kernels::affine(mask.tensor(), -1.0, 1.0)?))
}

/// `1 − m`, in place.
pub fn invert_mask(mut mask: Mask) -> Mask {
    mask.data.iter_mut().for_each(|v| *v = 1.0 - *v);
    mask
}

/// `CropMask`: the `width × height` region at (x, y), with Python-slice
/// semantics: `m[:, y:y+h, x:x+w]`, cut at the border.
#[node(class = "CropMask", category = "mask")]
pub fn crop_mask(
    mask: &Mask,
    #[input(default = 0, min = 0, max = 16384, step = 1)] x: usize,
    #[input(default = 0, min = 0, max = 16384, step = 1)] y: usize,
    #[input(default = 512, min = 1, max = 16384, step = 1)] width: usize,
    #[input(default = 512, min = 1, max = 16384, step = 1)] height: usize,
) -> Result<Mask> {
    let (x1, y1) = (x.saturating_add(width).min(mask.width), y.saturating_add(height).min(mask.height));
    if x >= x1 || y >= y1 {
        return Err(Error::invalid(format!("crop at ({x}, {y}) lies outside the {}×{} mask", mask.width, mask.height)));
    }
    let mut data = Vec::with_capacity(mask.batch * (y1 - y) * (x1 - x));
    for b in 0..mask.batch {
        for row in y..y1 {
            let start = mask.index(b, row, x);
            data.extend_from_slice(&mask.data[start..start + (x1 - x)]);
        }
    }
    Ok(Mask { batch: mask.batch, height: y1 - y, width: x1 - x, data })
}

const OPERATIONS: [&str; 6] = ["multiply", "add", "subtract", "and", "or", "xor"];

/// `MaskComposite`: combines `source` into `destination` at (x, y), on the
/// GPU when there is one.
#[node(class = "MaskComposite", category = "mask")]
pub fn mask_composite_node(
    destination: MaskHandle,
    source: MaskHandle,
    #[input(default = 0, min = 0, max = 16384, step = 1)] x: usize,
    #[input(default = 0, min = 0, max = 16384, step = 1)] y: usize,
    #[input(choices = OPERATIONS)] operation: &str,
) -> Result<MaskHandle> {
    let on_cpu = || mask_composite(&destination.read()?, &source.read()?, x, y, operation);
    match crate::gpu::mask_composite(destination.tensor(), source.tensor(), x, y, operation, || on_cpu()?.to_tensor()) {
        Some(out) => Ok(MaskHandle::new(out?)),
        None => MaskHandle::from_mask(&on_cpu()?),
    }
}

/// The destination with the visible part of `src` combined in, clamped to 0..1.
/// Logic operations work on values rounded half-to-even, as torch does. A one-mask source applies to
/// every destination mask.
pub fn mask_composite(dst: &Mask, src: &Mask, x: usize, y: usize, op: &str) -> Result<Mask> {
    let f: fn(f32, f32) -> f32 = match op {
        "multiply" => |d, s| d * s,
        "add" => |d, s| d + s,
        "subtract" => |d, s| d - s,
        "and" => |d, s| ((d.round_ties_even() != 0.0) && (s.round_ties_even() != 0.0)) as u8 as f32,
        "or" => |d, s| ((d.round_ties_even() != 0.0) || (s.round_ties_even() != 0.0)) as u8 as f32,
        "xor" => |d, s| ((d.round_ties_even() != 0.0) ^ (s.round_ties_even() != 0.0)) as u8 as f32,
        other => return Err(Error::invalid(format!("unknown operation `{other}`"))),
    };
    if src.batch != 1 && src.batch != dst.batch {
        return Err(Error::invalid(format!("source batch {} does not match destination batch {}", src.batch, dst.batch)));
    }
    let mut out = dst.clone();
    let visible_w = src.width.min(dst.width.saturating_sub(x));
    let visible_h = src.height.min(dst.height.saturating_sub(y));
    for b in 0..dst.batch {
        let sb = if src.batch == 1 { 0 } else { b };
        for row in 0..visible_h {
            for col in 0..visible_w {
                let i = out.index(b, y + row, x + col);
                out.data[i] = f(out.data[i], src.get(sb, row, col));
            }
        }
    }
    out.data.iter_mut().for_each(|v| *v = v.clamp(0.0, 1.0));
    Ok(out)
}

/// `FeatherMask`: linear ramps towards each edge, on the GPU when there is one.
#[node(class = "FeatherMask", category = "mask")]
pub fn feather_mask_node(
    mask: MaskHandle,
    #[input(default = 0, min = 0, max = 16384, step = 1)] left: usize,
    #[input(default = 0, min = 0, max = 16384, step = 1)] top: usize,
    #[input(default = 0, min = 0, max = 16384, step = 1)] right: usize,
    #[input(default = 0, min = 0, max = 16384, step = 1)] bottom: usize,
) -> Result<MaskHandle> {
    let on_cpu = || -> Result<Mask> {
        let mut values = mask.read()?;
        feather_mask(&mut values, left, top, right, bottom);
        Ok(values)
    };
    match crate::gpu::feather(mask.tensor(), left, top, right, bottom, || on_cpu()?.to_tensor()) {
        Some(out) => Ok(MaskHandle::new(out?)),
        None => MaskHandle::from_mask(&on_cpu()?),
    }
}

/// ComfyUI's feathering: column/row `i` from the left/top edge is scaled by
/// `(i+1)/n`; the right/bottom ramps index from the end with `-i`, so their
/// first step (`-0`) lands on column/row 0 — kept for parity.
pub fn feather_mask(mask: &mut Mask, left: usize, top: usize, right: usize, bottom: usize) {
    let (w, h) = (mask.width, mask.height);
    let (left, right, top, bottom) = (left.min(w), right.min(w), top.min(h), bottom.min(h));
    let from_end = |i: usize, n: usize| if i == 0 { 0 } else { n - i };
    for b in 0..mask.batch {
        let mut scale_col = |col: usize, rate: f32| {
            for row in 0..h {
                let i = mask.index(b, row, col);
                mask.data[i] *= rate;
            }
        };
        for x in 0..left {
            scale_col(x, (x as f32 + 1.0) / left as f32);
        }
        for x in 0..right {
            scale_col(from_end(x, w), (x as f32 + 1.0) / right as f32);
        }
        let mut scale_row = |row: usize, rate: f32| {
            let start = mask.index(b, row, 0);
            mask.data[start..start + w].iter_mut().for_each(|v| *v *= rate);
        };
        for y in 0..top {
            scale_row(y, (y as f32 + 1.0) / top as f32);
        }
        for y in 0..bottom {
            scale_row(from_end(y, h), (y as f32 + 1.0) / bottom as f32);
        }
    }
}

/// `GrowMask`: grey dilation (expand > 0) or erosion (< 0), |expand| times,
/// on the GPU when there is one.
#[node(class = "GrowMask", category = "mask", display_name = "Grow Mask")]
pub fn grow_mask_node(
    mask: MaskHandle,
    #[input(default = 0, min = -16384, max = 16384, step = 1)] expand: i64,
    #[input(default = true)] tapered_corners: bool,
) -> Result<MaskHandle> {
    let on_cpu = || -> Result<Mask> { Ok(grow_mask(&mask.read()?, expand, tapered_corners)) };
    match crate::gpu::grow(mask.tensor(), expand, tapered_corners, || on_cpu()?.to_tensor()) {
        Some(out) => Ok(MaskHandle::new(out?)),
        None => MaskHandle::from_mask(&on_cpu()?),
    }
}

/// Max (or min) over a 3×3 neighbourhood — a cross when `tapered` — repeated
/// |expand| times. Pixels outside the mask do not take part (the same as
/// edge-reflecting for a footprint that contains its centre).
pub fn grow_mask(mask: &Mask, expand: i64, tapered: bool) -> Mask {
    let (w, h) = (mask.width, mask.height);
    let dilate = expand > 0;
    let mut cur = mask.clone();
    let mut next = mask.clone();
    // Growing by more than the image's extent changes nothing further.
    let steps = expand.unsigned_abs().min((w + h) as u64);
    for _ in 0..steps {
        for b in 0..mask.batch {
            for y in 0..h {
                for x in 0..w {
                    let mut acc = cur.get(b, y, x);
                    for (dy, dx) in [(-1i64, -1i64), (-1, 0), (-1, 1), (0, -1), (0, 1), (1, -1), (1, 0), (1, 1)] {
                        if tapered && dy != 0 && dx != 0 {
                            continue;
                        }
                        let (ny, nx) = (y as i64 + dy, x as i64 + dx);
                        if ny < 0 || nx < 0 || ny >= h as i64 || nx >= w as i64 {
                            continue;
                        }
                        let v = cur.get(b, ny as usize, nx as usize);
                        acc = if dilate { acc.max(v) } else { acc.min(v) };
                    }
                    let i = next.index(b, y, x);
                    next.data[i] = acc;
                }
            }
        }
        std::mem::swap(&mut cur, &mut next);
    }
    cur
}

/// `ThresholdMask`: 1 where `m > value`, else 0, on the GPU when there is one.
#[node(class = "ThresholdMask", category = "mask")]
pub fn threshold_mask_node(mask: MaskHandle, #[input(default = 0.5, min = 0.0, max = 1.0, step = 0.01)] value: f64) -> Result<MaskHandle> {
    let on_cpu = || -> Result<Mask> { Ok(threshold_mask(mask.read()?, value)) };
    match crate::gpu::threshold(mask.tensor(), value as f32, || on_cpu()?.to_tensor()) {
        Some(out) => Ok(MaskHandle::new(out?)),
        None => MaskHandle::from_mask(&on_cpu()?),
    }
}

/// 1 where `m > value`, else 0; the comparison is in f32, as torch compares
/// a float32 tensor with a Python float.
pub fn threshold_mask(mut mask: Mask, value: f64) -> Mask {
    let t = value as f32;
    mask.data.iter_mut().for_each(|v| *v = if *v > t { 1.0 } else { 0.0 });
    mask
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(w: usize, h: usize, data: &[f32]) -> Mask {
        Mask::from_vec(1, h, w, data.to_vec()).unwrap()
    }

    #[test]
    fn feather_right_ramp_starts_at_column_zero() {
        let mut mask = Mask::filled(1, 1, 4, 1.0);
        feather_mask(&mut mask, 0, 0, 2, 0);
        // x=0 scales column 0 by 1/2, x=1 scales column 3 by 2/2.
        assert_eq!(mask.data, vec![0.5, 1.0, 1.0, 1.0]);
        let mut mask = Mask::filled(1, 1, 4, 1.0);
        feather_mask(&mut mask, 2, 0, 0, 0);
        assert_eq!(mask.data, vec![0.5, 1.0, 1.0, 1.0]);
    }

    #[test]
    fn grow_and_shrink_with_both_kernels() {
        let dot = m(3, 3, &[0., 0., 0., 0., 1., 0., 0., 0., 0.]);
        assert_eq!(grow_mask(&dot, 1, true).data, vec![0., 1., 0., 1., 1., 1., 0., 1., 0.]);
        assert_eq!(grow_mask(&dot, 1, false).data, vec![1.; 9]);
        assert_eq!(grow_mask(&grow_mask(&dot, 1, false), -1, false).data, vec![1.; 9], "erosion ignores outside pixels");
        assert_eq!(grow_mask(&dot, -1, true).data, vec![0.; 9]);
    }

    #[test]
    fn composite_clips_and_clamps() {
        let dst = m(3, 2, &[0.5; 6]);
        let src = m(2, 2, &[0.75; 4]);
        let out = mask_composite(&dst, &src, 2, 1, "add").unwrap();
        assert_eq!(out.data, vec![0.5, 0.5, 0.5, 0.5, 0.5, 1.0]);
        let out = mask_composite(&dst, &src, 0, 0, "xor").unwrap();
        // 0.5 rounds to 0 (half to even), 0.75 to 1.
        assert_eq!(out.data, vec![1.0, 1.0, 0.5, 1.0, 1.0, 0.5]);
        assert!(mask_composite(&dst, &src, 0, 0, "nand").is_err());
    }

    #[test]
    fn crop_cuts_at_the_border_and_refuses_empty() {
        let mask = m(3, 2, &[1., 2., 3., 4., 5., 6.]);
        assert_eq!(crop_mask(&mask, 1, 1, 5, 5).unwrap().data, vec![5., 6.]);
        assert!(crop_mask(&mask, 3, 0, 1, 1).is_err());
    }

    #[test]
    fn color_to_mask_rounds_to_8_bit() {
        let image = Image::from_vec(1, 1, 2, 3, vec![1.0, 0.5, 0.0, 1.0, 0.49, 0.0]).unwrap();
        // 0.5·255 = 127.5 rounds to 128 (0x80); 0.49·255 = 124.95 → 125.
        assert_eq!(image_color_to_mask(&image, 0xff8000).unwrap().data, vec![1.0, 0.0]);
    }
}
