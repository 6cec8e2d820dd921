//! Upscale nodes: ImageScale, ImageScaleBy, ImageScaleToTotalPixels.

use kiln_sdk::prelude::*;

use kiln_sdk::kernels;

use super::check_nonempty;
use crate::ops::py_round;
use crate::ops::resample::{METHODS, Method, resample, resize_image};

/// Width and height of a non-empty IMAGE, from its host tensor (no copy).
fn input_size(image: &ImageHandle) -> Result<(usize, usize)> {
    match image.shape()? {
        [b, h, w, c] if b > 0 && h > 0 && w > 0 && c > 0 => Ok((w, h)),
        shape => Err(Error::invalid(format!("input `image` has shape {shape:?}, not a non-empty IMAGE [B,H,W,C]"))),
    }
}

/// Resizes `image` on the host to `w × h`.
fn resize_on_host(image: &ImageHandle, method: &str, w: usize, h: usize, crop: bool) -> Result<ImageHandle> {
    Ok(ImageHandle::new(kernels::resize_image(image.tensor(), w, h, resample(parse_method(method)?), crop)?))
}

const CROPS: [&str; 2] = ["disabled", "center"];

fn parse_crop(crop: &str) -> Result<bool> {
    match crop {
        "disabled" => Ok(false),
        "center" => Ok(true),
        other => Err(Error::invalid(format!("unknown crop `{other}`"))),
    }
}

fn size(v: i64, what: &str) -> Result<usize> {
    usize::try_from(v).ok().filter(|&v| (1..=16384 * 8).contains(&v)).ok_or_else(|| Error::invalid(format!("{what} {v} is out of range")))
}

/// `ImageScale`: to `width × height`; a 0 keeps the aspect ratio.
#[node(class = "ImageScale", category = "image/upscaling", display_name = "Upscale Image")]
pub fn image_scale_node(
    image: ImageHandle,
    #[input(choices = METHODS)] upscale_method: &str,
    #[input(default = 512, min = 0, max = 16384, step = 1)] width: usize,
    #[input(default = 512, min = 0, max = 16384, step = 1)] height: usize,
    #[input(choices = CROPS)] crop: &str,
) -> Result<ImageHandle> {
    if width == 0 && height == 0 {
        // Unchanged: hand the host's tensor back without copying it in and out.
        return Ok(image);
    }
    let (iw, ih) = input_size(&image)?;
    let (tw, th) = target_size(iw, ih, width, height)?;
    resize_on_host(&image, upscale_method, tw, th, parse_crop(crop)?)
}

/// The resampling method named by an `upscale_method` combo value.
pub fn parse_method(name: &str) -> Result<Method> {
    Method::parse(name).ok_or_else(|| Error::invalid(format!("unknown upscale method `{name}`")))
}

/// ImageScale's computation: to `width × height` (a zero side follows the
/// aspect ratio, both zero leaves the image unchanged), `crop` being
/// `"disabled"` or `"center"`.
pub fn image_scale(image: &Image, method: &str, width: usize, height: usize, crop: &str) -> Result<Image> {
    let method = parse_method(method)?;
    let crop = parse_crop(crop)?;
    check_nonempty(image)?;
    if width == 0 && height == 0 {
        return Ok(image.clone());
    }
    let (w, h) = target_size(image.width, image.height, width, height)?;
    resize_image(image, w, h, method, crop)
}

/// ImageScale's size rule: a zero side follows the aspect ratio.
pub fn target_size(iw: usize, ih: usize, w: usize, h: usize) -> Result<(usize, usize)> {
    let (w, h) = match (w, h) {
        (0, h) => ((py_round(iw as f64 * h as f64 / ih as f64)).max(1) as usize, h),
        (w, 0) => (w, (py_round(ih as f64 * w as f64 / iw as f64)).max(1) as usize),
        wh => wh,
    };
    Ok((size(w as i64, "width")?, size(h as i64, "height")?))
}

/// `ImageScaleBy`: by a factor, `round(W·s) × round(H·s)`.
#[node(class = "ImageScaleBy", category = "image/upscaling", display_name = "Upscale Image By")]
pub fn image_scale_by_node(
    image: ImageHandle,
    #[input(choices = METHODS)] upscale_method: &str,
    #[input(default = 1.0, min = 0.01, max = 8.0, step = 0.01)] scale_by: f64,
) -> Result<ImageHandle> {
    let (iw, ih) = input_size(&image)?;
    let (w, h) = scale_by_size(iw, ih, scale_by)?;
    resize_on_host(&image, upscale_method, w, h, false)
}

/// ImageScaleBy's computation: `round(W·s) × round(H·s)` (Python rounding), no crop.
pub fn image_scale_by(image: &Image, method: &str, scale_by: f64) -> Result<Image> {
    let method = parse_method(method)?;
    check_nonempty(image)?;
    let (w, h) = scale_by_size(image.width, image.height, scale_by)?;
    resize_image(image, w, h, method, false)
}

/// ImageScaleBy's size rule.
pub fn scale_by_size(iw: usize, ih: usize, scale_by: f64) -> Result<(usize, usize)> {
    Ok((size(py_round(iw as f64 * scale_by), "width")?, size(py_round(ih as f64 * scale_by), "height")?))
}

/// `ImageScaleToTotalPixels`: to about `megapixels` MiP, sides multiples of `resolution_steps`.
#[node(class = "ImageScaleToTotalPixels", category = "image/upscaling")]
pub fn image_scale_to_total_pixels_node(
    image: ImageHandle,
    #[input(choices = METHODS)] upscale_method: &str,
    #[input(default = 1.0, min = 0.01, max = 16.0, step = 0.01)] megapixels: f64,
    #[input(default = 1, min = 1, max = 256)] resolution_steps: usize,
) -> Result<ImageHandle> {
    let (iw, ih) = input_size(&image)?;
    let (w, h) = total_pixels_size(iw, ih, megapixels, resolution_steps)?;
    resize_on_host(&image, upscale_method, w, h, false)
}

/// ImageScaleToTotalPixels' computation: `s = sqrt(megapixels·1024² / (W·H))`,
/// each side `round(side·s / steps)·steps`.
pub fn image_scale_to_total_pixels(image: &Image, method: &str, megapixels: f64, steps: usize) -> Result<Image> {
    let method = parse_method(method)?;
    check_nonempty(image)?;
    let (w, h) = total_pixels_size(image.width, image.height, megapixels, steps)?;
    resize_image(image, w, h, method, false)
}

/// ImageScaleToTotalPixels' size rule.
pub fn total_pixels_size(iw: usize, ih: usize, megapixels: f64, steps: usize) -> Result<(usize, usize)> {
    let steps = steps.max(1) as f64;
    let s = (megapixels * 1024.0 * 1024.0 / (iw * ih) as f64).sqrt();
    let w = size(py_round(iw as f64 * s / steps) * steps as i64, "width")?;
    let h = size(py_round(ih as f64 * s / steps) * steps as i64, "height")?;
    Ok((w, h))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_side_keeps_aspect() {
        assert_eq!(target_size(200, 100, 0, 50).unwrap(), (100, 50));
        assert_eq!(target_size(200, 100, 50, 0).unwrap(), (50, 25));
        // Python rounds halves to even: 5·3/2 = 7.5 → 8, 7·1/2 = 3.5 → 4.
        assert_eq!(target_size(5, 2, 0, 3).unwrap(), (8, 3));
    }
}
