//! Nodes that cross the sandbox edge: loading uploaded images, saving and
//! previewing results. Decoding runs here, inside the sandbox, so a hostile
//! file can at worst crash this disposable instance; encoding (of pixels the
//! host already holds) is a host kernel.

use kiln_sdk::host::{self, FileKind};
use kiln_sdk::kernels;
use kiln_sdk::prelude::*;

/// `LoadImage`: decodes an uploaded image into IMAGE and MASK (1 − alpha).
#[node(
    class = "LoadImage",
    category = "image",
    display_name = "Load Image",
    search_aliases = ["load image", "open image", "import image", "image input", "upload image", "read image", "image loader"]
)]
pub fn load_image(#[input(image_upload)] image: &str) -> Result<(ImageHandle, Mask)> {
    let decoded = decode(image)?;
    let (h, w) = (decoded.height, decoded.width);
    let mask = match &decoded.alpha {
        // ComfyUI's LoadImage returns a 64×64 zero mask for images without alpha.
        None => Mask::filled(1, 64, 64, 0.0),
        Some(alpha) => Mask { batch: 1, height: h, width: w, data: alpha.iter().map(|&a| 1.0 - f32::from(a) / 255.0).collect() },
    };
    // The host turns the 8-bit pixels into the f32 IMAGE: a quarter of
    // the bytes cross the sandbox edge.
    let image = ImageHandle::new(kernels::create_from_u8(&[1, h, w, 3], &decoded.rgb)?);
    Ok((image, mask))
}

const MASK_CHANNELS: [&str; 4] = ["alpha", "red", "green", "blue"];

/// `LoadImageMask`: one channel of an uploaded image as a MASK.
#[node(class = "LoadImageMask", category = "mask", display_name = "Load Image (as Mask)")]
pub fn load_image_mask(#[input(image_upload)] image: &str, #[input(choices = MASK_CHANNELS)] channel: &str) -> Result<Mask> {
    let decoded = decode(image)?;
    let (h, w) = (decoded.height, decoded.width);
    let data = match channel {
        "alpha" => match decoded.alpha {
            Some(alpha) => alpha.iter().map(|&a| 1.0 - f32::from(a) / 255.0).collect(),
            None => vec![0.0; h * w],
        },
        channel => {
            let c = ["red", "green", "blue"].iter().position(|n| *n == channel).ok_or_else(|| Error::invalid(format!("unknown channel `{channel}`")))?;
            decoded.rgb.chunks_exact(3).map(|px| f32::from(px[c]) / 255.0).collect()
        }
    };
    Ok(Mask { batch: 1, height: h, width: w, data })
}

/// `SaveImage`: writes each image of the batch as a PNG with the workflow in
/// its text chunks.
#[node(
    class = "SaveImage",
    category = "image",
    display_name = "Save Image",
    description = "Saves the input images to your ComfyUI output directory.",
    output_node,
    search_aliases = ["save", "save image", "export image", "output image", "write image", "download"]
)]
pub fn save_image(
    #[input(tooltip = "The images to save.")] images: ImageHandle,
    #[input(
        default = "ComfyUI",
        tooltip = "The prefix for the file to save. This may include formatting information such as %date:yyyy-MM-dd% or %Empty Latent Image.width% to include values from nodes."
    )]
    filename_prefix: &str,
    #[hidden] prompt: Option<String>,
    #[hidden] extra_pnginfo: Option<String>,
) -> Result<()> {
    save_all(&images, FileKind::Output, filename_prefix, &png_text(prompt, extra_pnginfo))
}

/// `PreviewImage`: like SaveImage, into the temporary area.
#[node(
    class = "PreviewImage",
    category = "image",
    display_name = "Preview Image",
    description = "Saves the input images to your ComfyUI output directory.",
    output_node
)]
pub fn preview_image(images: ImageHandle, #[hidden] prompt: Option<String>, #[hidden] extra_pnginfo: Option<String>) -> Result<()> {
    save_all(&images, FileKind::Temp, "ComfyUI_temp", &png_text(prompt, extra_pnginfo))
}

/// A decoded image: 8-bit RGB and, when the file has alpha, the alpha plane.
struct Decoded {
    width: usize,
    height: usize,
    rgb: Vec<u8>,
    alpha: Option<Vec<u8>>,
}

fn decode(name: &str) -> Result<Decoded> {
    use image::ImageDecoder;
    let bytes = host::read_input(name).map_err(Error::invalid)?;
    let reader = image::ImageReader::new(std::io::Cursor::new(&bytes[..])).with_guessed_format().map_err(|e| Error::invalid(format!("{name}: {e}")))?;
    let mut decoder = reader.into_decoder().map_err(|e| Error::invalid(format!("cannot decode {name}: {e}")))?;
    let orientation = decoder.orientation().unwrap_or(image::metadata::Orientation::NoTransforms);
    let mut img = image::DynamicImage::from_decoder(decoder).map_err(|e| Error::invalid(format!("cannot decode {name}: {e}")))?;
    img.apply_orientation(orientation);
    let (w, h) = (img.width() as usize, img.height() as usize);
    let has_alpha = img.color().has_alpha();
    if has_alpha {
        let rgba = img.to_rgba8();
        let raw = rgba.as_raw();
        let mut rgb = Vec::with_capacity(w * h * 3);
        let mut alpha = Vec::with_capacity(w * h);
        for px in raw.chunks_exact(4) {
            rgb.extend_from_slice(&px[..3]);
            alpha.push(px[3]);
        }
        Ok(Decoded { width: w, height: h, rgb, alpha: Some(alpha) })
    } else {
        Ok(Decoded { width: w, height: h, rgb: img.into_rgb8().into_raw(), alpha: None })
    }
}

/// PNG text chunks: `prompt` and each key of `extra_pnginfo`, JSON-encoded.
fn png_text(prompt: Option<String>, extra_pnginfo: Option<String>) -> Vec<(String, String)> {
    let mut text = Vec::new();
    if let Some(prompt) = prompt {
        text.push(("prompt".to_string(), prompt));
    }
    if let Some(extra) = extra_pnginfo
        && let Ok(serde_json::Value::Object(map)) = serde_json::from_str::<serde_json::Value>(&extra)
    {
        for (key, value) in map {
            text.push((key, value.to_string()));
        }
    }
    text
}

/// Encodes (on the host: the pixels never enter this plugin) and saves
/// every image of an IMAGE tensor.
fn save_all(images: &ImageHandle, kind: FileKind, prefix: &str, text: &[(String, String)]) -> Result<()> {
    let [batch, _, _, _] = images.shape()?;
    for b in 0..batch {
        let png = kernels::encode_png(images.tensor(), b, text)?;
        host::save_file(kind, prefix, "png", &png).map_err(Error::failed)?;
        host::progress(b as u64 + 1, batch as u64);
    }
    Ok(())
}
