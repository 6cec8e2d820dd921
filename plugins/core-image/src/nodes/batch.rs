//! Batch nodes: ImageBatch, RepeatImageBatch, ImageFromBatch, GetImageSize.

use kiln_sdk::prelude::*;

use super::filters::match_channels;
use crate::ops::resample::{Method, resize_image};

/// `ImageBatch`: `image2` (channels equalized, resized bilinear with centre
/// crop to `image1`) appended to `image1`.
pub const IMAGE_BATCH: NodeClass = NodeClass {
    class_type: "ImageBatch",
    define: || {
        NodeDef::new("image")
            .display_name("Batch Images")
            .required("image1", Kind::link("IMAGE"))
            .required("image2", Kind::link("IMAGE"))
            .output("IMAGE", "IMAGE")
            .deprecated()
    },
    run: |inputs| Ok(vec![Output::Image(image_batch(inputs.image("image1")?, inputs.image("image2")?))]),
};

/// The two batches concatenated (see [`IMAGE_BATCH`]).
pub fn image_batch(i1: Image, i2: Image) -> Image {
    let channels = i1.channels.max(i2.channels);
    let mut i1 = match_channels(i1, channels);
    let mut i2 = match_channels(i2, channels);
    if (i2.width, i2.height) != (i1.width, i1.height) {
        i2 = resize_image(&i2, i1.width, i1.height, Method::Bilinear, true);
    }
    i1.data.append(&mut i2.data);
    i1.batch += i2.batch;
    i1
}

/// `RepeatImageBatch`: the batch tiled `amount` times.
pub const REPEAT_IMAGE_BATCH: NodeClass = NodeClass {
    class_type: "RepeatImageBatch",
    define: || {
        NodeDef::new("image/batch")
            .required("image", Kind::link("IMAGE"))
            .required("amount", Kind::int().default(1).min(1.0).max(4096.0))
            .output("IMAGE", "IMAGE")
    },
    run: |inputs| {
        let image = inputs.image("image")?;
        let amount = inputs.usize("amount")?.max(1);
        let data = image.data.repeat(amount);
        Ok(vec![Output::Image(Image { batch: image.batch * amount, data, ..image })])
    },
};

/// `ImageFromBatch`: `length` images from `batch_index`, both clamped.
pub const IMAGE_FROM_BATCH: NodeClass = NodeClass {
    class_type: "ImageFromBatch",
    define: || {
        NodeDef::new("image/batch")
            .required("image", Kind::link("IMAGE"))
            .required("batch_index", Kind::int().default(0).min(0.0).max(4095.0))
            .required("length", Kind::int().default(1).min(1.0).max(4096.0))
            .output("IMAGE", "IMAGE")
    },
    run: |inputs| {
        let image = inputs.image("image")?;
        let index = inputs.usize("batch_index")?.min(image.batch - 1);
        let length = inputs.usize("length")?.min(image.batch - index).max(1);
        let frame = image.height * image.width * image.channels;
        let data = image.data[index * frame..(index + length) * frame].to_vec();
        Ok(vec![Output::Image(Image { batch: length, data, ..image })])
    },
};

/// `GetImageSize`: width, height and batch size.
pub const GET_IMAGE_SIZE: NodeClass = NodeClass {
    class_type: "GetImageSize",
    define: || {
        NodeDef::new("image")
            .display_name("Get Image Size")
            .description("Returns width and height of the image, and passes it through unchanged.")
            .required("image", Kind::link("IMAGE"))
            .hidden(Hidden::UniqueId)
            .output("width", "INT")
            .output("height", "INT")
            .output("batch_size", "INT")
    },
    run: |inputs| {
        let shape = inputs.tensor("image")?.shape();
        match shape[..] {
            [b, h, w, _] => Ok(vec![Output::Int(w as i64), Output::Int(h as i64), Output::Int(b as i64)]),
            _ => Err(Error::invalid(format!("`image` has shape {shape:?}, not [B,H,W,C]"))),
        }
    },
};
