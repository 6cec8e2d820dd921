//! Generation and per-pixel nodes.

use kiln_sdk::prelude::*;

/// `ImageInvert`: `1 − x` on every channel.
pub const IMAGE_INVERT: NodeClass = NodeClass {
    class_type: "ImageInvert",
    define: || NodeDef::new("image").display_name("Invert Image").required("image", Kind::link("IMAGE")).output("IMAGE", "IMAGE"),
    // On the host: `−1·x + 1` is bit for bit `1 − x`, and the pixels never
    // enter the plugin.
    run: |inputs| Ok(vec![Output::Tensor(kiln_sdk::kernels::affine(inputs.tensor("image")?, -1.0, 1.0)?)]),
};

/// `1 − x` in place.
pub fn invert(data: &mut [f32]) {
    data.iter_mut().for_each(|v| *v = 1.0 - *v);
}

/// `EmptyImage`: a batch filled with a packed `0xRRGGBB` colour.
pub const EMPTY_IMAGE: NodeClass = NodeClass {
    class_type: "EmptyImage",
    define: || {
        NodeDef::new("image")
            .display_name("EmptyImage")
            .required("width", Kind::int().default(512).min(1.0).max(16384.0).step(1.0))
            .required("height", Kind::int().default(512).min(1.0).max(16384.0).step(1.0))
            .required("batch_size", Kind::int().default(1).min(1.0).max(4096.0))
            .required("color", Kind::int().default(0).min(0.0).max(16777215.0).step(1.0).display("color"))
            .output("IMAGE", "IMAGE")
    },
    run: |inputs| {
        let dim = |name: &str| -> Result<usize> { usize::try_from(inputs.int(name)?).map_err(|_| Error::invalid(format!("`{name}` must not be negative"))) };
        Ok(vec![Output::Image(empty_image(dim("width")?, dim("height")?, dim("batch_size")?, inputs.int("color")?))])
    },
};

/// A `[batch, height, width, 3]` image of colour `0xRRGGBB`.
pub fn empty_image(width: usize, height: usize, batch: usize, color: i64) -> Image {
    let rgb = [((color >> 16) & 0xff) as f32 / 255.0, ((color >> 8) & 0xff) as f32 / 255.0, (color & 0xff) as f32 / 255.0];
    let mut data = Vec::with_capacity(batch * height * width * 3);
    for _ in 0..batch * height * width {
        data.extend_from_slice(&rgb);
    }
    Image { batch, height, width, channels: 3, data }
}
