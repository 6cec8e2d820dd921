//! Compositing nodes: pasting a source image over a destination through a
//! mask, and splitting/joining an image's alpha channel.

use kiln_sdk::prelude::*;

use super::filters::match_channels;
use super::{check_mask_nonempty, check_nonempty};
use crate::ops::resample::{Method, resize_image, resize_mask};

/// `ImageCompositeMasked`: `source` over `destination` at (x, y) through
/// `mask`, on the GPU when there is one.
#[node(class = "ImageCompositeMasked", category = "image")]
pub fn image_composite_masked(
    destination: ImageHandle,
    source: ImageHandle,
    #[input(default = 0, min = 0, max = 16384, step = 1)] x: usize,
    #[input(default = 0, min = 0, max = 16384, step = 1)] y: usize,
    #[input(default = false)] resize_source: bool,
    mask: Option<MaskHandle>,
) -> Result<ImageHandle> {
    let on_cpu = || composite_masked(destination.read()?, source.read()?, x, y, resize_source, mask.as_ref().map(MaskHandle::read).transpose()?.as_ref());
    let gpu =
        crate::gpu::composite(destination.tensor(), source.tensor(), mask.as_ref().map(MaskHandle::tensor), x, y, resize_source, || on_cpu()?.to_tensor());
    match gpu {
        Some(out) => Ok(ImageHandle::new(out?)),
        None => ImageHandle::from_image(&on_cpu()?),
    }
}

/// Index `i` of a batch repeated (or cut) to another batch size, as
/// `comfy.utils.repeat_to_batch_size` tiles it.
fn batch_index(i: usize, batch: usize) -> usize {
    i % batch
}

/// `dst[y.., x..] = mask·src + (1 − mask)·dst` on the visible region. The
/// source takes the destination's channel count (cut, or alpha 1 added), is
/// optionally resized to the destination (bilinear) and repeated to its
/// batch; the mask (default all ones) is resized to the source (bilinear)
/// and repeated to the destination's batch.
pub fn composite_masked(mut dst: Image, src: Image, x: usize, y: usize, resize_source: bool, mask: Option<&Mask>) -> Result<Image> {
    check_nonempty(&dst)?;
    check_nonempty(&src)?;
    if let Some(m) = mask {
        check_mask_nonempty(m)?;
    }
    let mut src = match_channels(src, dst.channels);
    if resize_source && (src.width, src.height) != (dst.width, dst.height) {
        src = resize_image(&src, dst.width, dst.height, Method::Bilinear, false)?;
    }
    let mask = match mask {
        Some(m) if (m.width, m.height) != (src.width, src.height) => Some(resize_mask(m, src.width, src.height, Method::Bilinear)?),
        other => other.cloned(),
    };
    let visible_w = src.width.min(dst.width.saturating_sub(x));
    let visible_h = src.height.min(dst.height.saturating_sub(y));
    if visible_w == 0 || visible_h == 0 {
        return Ok(dst);
    }
    let c = dst.channels;
    for b in 0..dst.batch {
        let sb = batch_index(b, src.batch);
        for row in 0..visible_h {
            let d0 = dst.index(b, y + row, x, 0);
            let s0 = src.index(sb, row, 0, 0);
            let d = &mut dst.data[d0..d0 + visible_w * c];
            let s = &src.data[s0..s0 + visible_w * c];
            match &mask {
                None => d.copy_from_slice(s),
                Some(m) => {
                    let m0 = m.index(batch_index(b, m.batch), row, 0);
                    let mrow = &m.data[m0..m0 + visible_w];
                    for ((dp, sp), &mv) in d.chunks_exact_mut(c).zip(s.chunks_exact(c)).zip(mrow) {
                        for (dv, &sv) in dp.iter_mut().zip(sp) {
                            *dv = mv * sv + (1.0 - mv) * *dv;
                        }
                    }
                }
            }
        }
    }
    Ok(dst)
}

/// `SplitImageWithAlpha`: RGB and `1 − alpha` (all zeros without alpha).
/// The first three channels and `1 − alpha`.
#[node(class = "SplitImageWithAlpha", category = "mask/compositing", display_name = "Split Image with Alpha")]
pub fn split_alpha(image: &Image) -> Result<(Image, Mask)> {
    if image.channels < 3 {
        return Err(Error::invalid("SplitImageWithAlpha needs an RGB or RGBA image"));
    }
    let mut rgb = Vec::with_capacity(image.data.len() / image.channels * 3);
    let mut mask = Vec::with_capacity(image.data.len() / image.channels);
    for px in image.data.chunks_exact(image.channels) {
        rgb.extend_from_slice(&px[..3]);
        mask.push(1.0 - if image.channels > 3 { px[3] } else { 1.0 });
    }
    Ok((Image { channels: 3, data: rgb, ..image.clone() }, Mask { batch: image.batch, height: image.height, width: image.width, data: mask }))
}

/// `JoinImageWithAlpha`: appends `1 − mask` (resized to the image) as alpha.
/// RGB of `image` plus `1 − alpha` as a fourth channel; the smaller batch is
/// repeated to the larger.
#[node(class = "JoinImageWithAlpha", category = "mask/compositing", display_name = "Join Image with Alpha")]
pub fn join_alpha(image: &Image, alpha: &Mask) -> Result<Image> {
    if image.channels < 3 {
        return Err(Error::invalid("JoinImageWithAlpha needs an RGB image"));
    }
    check_nonempty(image)?;
    check_mask_nonempty(alpha)?;
    let alpha = if (alpha.width, alpha.height) == (image.width, image.height) {
        alpha.clone()
    } else {
        resize_mask(alpha, image.width, image.height, Method::Bilinear)?
    };
    let batch = image.batch.max(alpha.batch);
    let pixels = image.height * image.width;
    let mut data = Vec::with_capacity(batch * pixels * 4);
    for b in 0..batch {
        let (bi, ba) = (batch_index(b, image.batch), batch_index(b, alpha.batch));
        for p in 0..pixels {
            let px = &image.data[(bi * pixels + p) * image.channels..][..3];
            data.extend_from_slice(px);
            data.push(1.0 - alpha.data[ba * pixels + p]);
        }
    }
    Ok(Image { batch, height: image.height, width: image.width, channels: 4, data })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn composite_pastes_through_the_mask_and_clips() {
        let dst = Image::filled(1, 2, 3, 3, 0.0);
        let src = Image::filled(1, 2, 2, 3, 1.0);
        let mask = Mask::from_vec(1, 2, 2, vec![1.0, 0.5, 0.0, 1.0]).unwrap();
        let out = composite_masked(dst, src, 2, 0, false, Some(&mask)).unwrap();
        let red: Vec<f32> = out.data.chunks(3).map(|p| p[0]).collect();
        assert_eq!(red, vec![0.0, 0.0, 1.0, 0.0, 0.0, 0.0]);
    }

    #[test]
    fn split_and_join_round_trip() {
        let image = Image::from_vec(1, 1, 2, 4, vec![0.1, 0.2, 0.3, 1.0, 0.4, 0.5, 0.6, 0.25]).unwrap();
        let (rgb, mask) = split_alpha(&image).unwrap();
        assert_eq!(mask.data, vec![0.0, 0.75]);
        assert_eq!(join_alpha(&rgb, &mask).unwrap(), image);
    }
}
