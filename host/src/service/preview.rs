//! Preview images for event streams: the first image of a node's preview
//! tensor, scaled down to at most [`MAX_SIDE`] pixels on its long side
//! (nearest neighbour) and encoded as an 8-bit PNG.

use crate::tensor::Tensor;

/// Longest side of a preview.
pub const MAX_SIDE: usize = 512;

/// PNG bytes of the preview of `tensor` (`[B, H, W, C]` with C of 1, 3 or
/// 4, or a `[B, H, W]` mask); `None` for other shapes.
pub fn encode(tensor: &Tensor) -> Option<Vec<u8>> {
    let (h, w, c) = match *tensor.shape() {
        [_, h, w, c @ (1 | 3 | 4)] => (h as usize, w as usize, c as usize),
        [_, h, w] => (h as usize, w as usize, 1),
        _ => return None,
    };
    if h == 0 || w == 0 {
        return None;
    }
    let scale = (h.max(w) as f64 / MAX_SIDE as f64).max(1.0);
    let (oh, ow) = (((h as f64 / scale) as usize).max(1), ((w as f64 / scale) as usize).max(1));
    let data = tensor.data().ok()?;
    let mut pixels = Vec::with_capacity(oh * ow * c);
    for y in 0..oh {
        let sy = ((y as f64 * scale) as usize).min(h - 1);
        for x in 0..ow {
            let sx = ((x as f64 * scale) as usize).min(w - 1);
            let at = (sy * w + sx) * c;
            pixels.extend(data[at..at + c].iter().map(|v| (v.clamp(0.0, 1.0) * 255.0).round() as u8));
        }
    }
    let mut out = Vec::new();
    let mut encoder = png::Encoder::new(&mut out, ow as u32, oh as u32);
    encoder.set_color(match c {
        1 => png::ColorType::Grayscale,
        3 => png::ColorType::Rgb,
        _ => png::ColorType::Rgba,
    });
    encoder.set_depth(png::BitDepth::Eight);
    encoder.set_compression(png::Compression::Fast);
    let mut writer = encoder.write_header().ok()?;
    writer.write_image_data(&pixels).ok()?;
    writer.finish().ok()?;
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_the_first_image_downscaled() {
        let t = Tensor::new(vec![2, 1024, 8, 3], vec![0.5; 2 * 1024 * 8 * 3]).unwrap();
        let png = encode(&t).unwrap();
        let decoder = png::Decoder::new(std::io::Cursor::new(png));
        let reader = decoder.read_info().unwrap();
        assert_eq!((reader.info().width, reader.info().height), (4, 512));
        assert!(encode(&Tensor::new(vec![1, 2, 2, 2], vec![0.0; 8]).unwrap()).is_none());
    }
}
