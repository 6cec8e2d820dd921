//! Batch nodes: ImageBatch, RepeatImageBatch, ImageFromBatch, GetImageSize.

use kiln_sdk::prelude::*;

use super::check_nonempty;
use super::filters::match_channels;
use crate::ops::resample::{Method, resize_image};

/// `ImageBatch`: `image2` (channels equalized, resized bilinear with centre
/// crop to `image1`) appended to `image1`.
#[node(class = "ImageBatch", category = "image", display_name = "Batch Images", deprecated)]
pub fn image_batch(#[input(name = "image1")] i1: Image, #[input(name = "image2")] i2: Image) -> Result<Image> {
    check_nonempty(&i1)?;
    check_nonempty(&i2)?;
    let channels = i1.channels.max(i2.channels);
    let mut i1 = match_channels(i1, channels);
    let mut i2 = match_channels(i2, channels);
    if (i2.width, i2.height) != (i1.width, i1.height) {
        i2 = resize_image(&i2, i1.width, i1.height, Method::Bilinear, true)?;
    }
    i1.data.append(&mut i2.data);
    i1.batch += i2.batch;
    Ok(i1)
}

/// `RepeatImageBatch`: the batch repeated `amount` times
/// (`image.repeat((amount, 1, 1, 1))`); an amount below 1 counts as 1.
#[node(class = "RepeatImageBatch", category = "image/batch")]
pub fn repeat_image_batch(image: &Image, #[input(default = 1, min = 1, max = 4096)] amount: usize) -> Result<Image> {
    check_nonempty(image)?;
    let amount = amount.clamp(1, 4096);
    Ok(Image { batch: image.batch * amount, data: image.data.repeat(amount), ..image.clone() })
}

/// `ImageFromBatch`: `length` images from `batch_index`, both clamped.
/// `length` images from `batch_index`: a negative index counts from the end
/// (as ComfyUI 0.27 does; the reference definition's minimum is 0), the index
/// is clamped to the batch and the length to what is left (at least one).
#[node(class = "ImageFromBatch", category = "image/batch")]
pub fn image_from_batch(
    image: Image,
    #[input(default = 0, min = 0, max = 4095)] batch_index: i64,
    #[input(default = 1, min = 1, max = 4096)] length: usize,
) -> Result<Image> {
    check_nonempty(&image)?;
    let n = image.batch as i64;
    let index = if batch_index < 0 { batch_index + n } else { batch_index }.clamp(0, n - 1) as usize;
    let length = length.clamp(1, image.batch - index);
    let frame = image.height * image.width * image.channels;
    if index == 0 && length == image.batch {
        return Ok(image);
    }
    let data = image.data[index * frame..(index + length) * frame].to_vec();
    Ok(Image { batch: length, data, ..image })
}

/// `GetImageSize`: width, height and batch size. Only the shape is needed:
/// it is read from the host handle, no pixel copy.
#[node(
    class = "GetImageSize",
    category = "image",
    display_name = "Get Image Size",
    description = "Returns width and height of the image, and passes it through unchanged.",
    outputs = ["width", "height", "batch_size"]
)]
pub fn get_image_size(image: ImageHandle, #[hidden] _unique_id: Option<String>) -> Result<(i64, i64, i64)> {
    let [w, h, b] = image_size(&image.shape()?)?;
    Ok((w, h, b))
}

/// `[width, height, batch_size]` of an IMAGE of shape `[B, H, W, C]`.
pub fn image_size(shape: &[usize]) -> Result<[i64; 3]> {
    match *shape {
        [b, h, w, _] => Ok([w as i64, h as i64, b as i64]),
        _ => Err(Error::invalid(format!("`image` has shape {shape:?}, not [B,H,W,C]"))),
    }
}
