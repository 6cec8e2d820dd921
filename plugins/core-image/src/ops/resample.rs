//! Resampling of CPU images and masks, for nodes that already hold pixels
//! (ImageBatch, ImageBlend, ImageCompositeMasked): the host's kernels from
//! `kiln-kernels`, run here single-threaded, so both paths give the same
//! values. Nodes that only resize use [`kiln_sdk::kernels`] on the host.

use kiln_kernels::Dims;
pub use kiln_kernels::resample::{METHODS, Method, center_crop};
use kiln_sdk::kernels::Resample;
use kiln_sdk::{Error, Image, Mask, Result};

fn never() -> bool {
    false
}

fn dims(img: &Image) -> Dims {
    Dims { batch: img.batch, height: img.height, width: img.width, channels: img.channels }
}

/// The host kernel's name for `method`.
pub fn resample(method: Method) -> Resample {
    match method {
        Method::NearestExact => Resample::NearestExact,
        Method::Bilinear => Resample::Bilinear,
        Method::Area => Resample::Area,
        Method::Bicubic => Resample::Bicubic,
        Method::Lanczos => Resample::Lanczos,
    }
}

/// The `cw × ch` region at (x, y) of every image.
pub fn crop_image(img: &Image, x: usize, y: usize, cw: usize, ch: usize) -> Result<Image> {
    let (data, d) = kiln_kernels::resample::crop(&img.data, dims(img), x, y, cw, ch)
        .ok_or_else(|| Error::invalid(format!("crop {cw}×{ch} at ({x}, {y}) is outside the {}×{} image", img.width, img.height)))?;
    Ok(Image { batch: d.batch, height: d.height, width: d.width, channels: d.channels, data })
}

/// Resizes every image of the batch (see `kiln_kernels::resample::resize_image`).
pub fn resize_image(img: &Image, width: usize, height: usize, method: Method, crop_center: bool) -> Result<Image> {
    let (data, d) =
        kiln_kernels::resample::resize_image(&img.data, dims(img), width, height, method, crop_center, &never).map_err(|e| Error::invalid(e.to_string()))?;
    Ok(Image { batch: d.batch, height: d.height, width: d.width, channels: d.channels, data })
}

/// Resizes every mask of the batch.
pub fn resize_mask(m: &Mask, width: usize, height: usize, method: Method) -> Result<Mask> {
    let d = Dims { batch: m.batch, height: m.height, width: m.width, channels: 1 };
    let (data, d) = kiln_kernels::resample::resize_mask(&m.data, d, width, height, method, &never).map_err(|e| Error::invalid(e.to_string()))?;
    Ok(Mask { batch: d.batch, height: d.height, width: d.width, data })
}
