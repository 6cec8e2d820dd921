//! An example plugin: one node that posterizes, with progress per image and a preview.
use kiln_sdk::prelude::*;

#[node(class = "ExamplePosterize", category = "examples", display_name = "Posterize (example)")]
pub fn posterize(mut image: Image, #[input(default = 4, min = 2, max = 256, step = 1)] levels: i64) -> Result<ImageHandle> {
    let (steps, frame) = ((levels - 1) as f32, (image.height * image.width * image.channels).max(1));
    for (b, pixels) in image.data.chunks_mut(frame).enumerate() {
        pixels.iter_mut().for_each(|v| *v = (v.clamp(0.0, 1.0) * steps).round() / steps);
        host::progress(b as u64 + 1, image.batch as u64);
    }
    let result = ImageHandle::from_image(&image)?;
    host::preview(result.tensor());
    Ok(result)
}
kiln_sdk::export_plugin!(POSTERIZE);
