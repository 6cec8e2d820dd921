//! Generation and per-pixel nodes.

use kiln_sdk::prelude::*;

/// `ImageInvert`: `1 − x` on every channel. On the host: `−1·x + 1` is
/// bit for bit `1 − x`, and the pixels never enter the plugin.
#[node(class = "ImageInvert", category = "image", display_name = "Invert Image")]
pub fn image_invert(image: ImageHandle) -> Result<ImageHandle> {
    Ok(ImageHandle::new(kiln_sdk::kernels::affine(image.tensor(), -1.0, 1.0)?))
}

/// `1 − x` in place.
pub fn invert(data: &mut [f32]) {
    data.iter_mut().for_each(|v| *v = 1.0 - *v);
}

/// `EmptyImage`: a `[batch, height, width, 3]` image of colour `0xRRGGBB`.
#[node(class = "EmptyImage", category = "image", display_name = "EmptyImage")]
pub fn empty_image(
    #[input(default = 512, min = 1, max = 16384, step = 1)] width: usize,
    #[input(default = 512, min = 1, max = 16384, step = 1)] height: usize,
    #[input(name = "batch_size", default = 1, min = 1, max = 4096)] batch: usize,
    #[input(default = 0, min = 0, max = 16777215, step = 1, display = "color")] color: i64,
) -> Image {
    let rgb = [((color >> 16) & 0xff) as f32 / 255.0, ((color >> 8) & 0xff) as f32 / 255.0, (color & 0xff) as f32 / 255.0];
    let mut data = Vec::with_capacity(batch * height * width * 3);
    for _ in 0..batch * height * width {
        data.extend_from_slice(&rgb);
    }
    Image { batch, height, width, channels: 3, data }
}
