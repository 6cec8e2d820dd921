//! Nodes that cross the sandbox edge: loading uploaded images, saving and
//! previewing results. Decoding and encoding run here, inside the sandbox, so
//! a hostile file can at worst crash this disposable instance.

use kiln_sdk::host::{self, FileKind};
use kiln_sdk::prelude::*;

/// `LoadImage`: decodes an uploaded image into IMAGE and MASK (1 − alpha).
pub const LOAD_IMAGE: NodeClass = NodeClass {
    class_type: "LoadImage",
    define: || {
        NodeDef::new("image")
            .display_name("Load Image")
            .required("image", Kind::input_image())
            .output("IMAGE", "IMAGE")
            .output("MASK", "MASK")
            .search_aliases(&["load image", "open image", "import image", "image input", "upload image", "read image", "image loader"])
    },
    run: |inputs| {
        let decoded = decode(inputs.string("image")?)?;
        let mask = match &decoded.alpha {
            // ComfyUI's LoadImage returns a 64×64 zero mask for images without alpha.
            None => Mask::filled(1, 64, 64, 0.0),
            Some(alpha) => Mask { batch: 1, height: decoded.rgb.height, width: decoded.rgb.width, data: alpha.iter().map(|a| 1.0 - a).collect() },
        };
        Ok(vec![Output::Image(decoded.rgb), Output::Mask(mask)])
    },
};

/// `LoadImageMask`: one channel of an uploaded image as a MASK.
pub const LOAD_IMAGE_MASK: NodeClass = NodeClass {
    class_type: "LoadImageMask",
    define: || {
        NodeDef::new("mask")
            .display_name("Load Image (as Mask)")
            .required("image", Kind::input_image())
            .required("channel", Kind::combo(&["alpha", "red", "green", "blue"]))
            .output("MASK", "MASK")
    },
    run: |inputs| {
        let decoded = decode(inputs.string("image")?)?;
        let (h, w) = (decoded.rgb.height, decoded.rgb.width);
        let data = match inputs.string("channel")? {
            "alpha" => match decoded.alpha {
                Some(alpha) => alpha.iter().map(|a| 1.0 - a).collect(),
                None => vec![0.0; h * w],
            },
            channel => {
                let c = ["red", "green", "blue"].iter().position(|n| *n == channel).ok_or_else(|| Error::invalid(format!("unknown channel `{channel}`")))?;
                decoded.rgb.data.chunks_exact(3).map(|px| px[c]).collect()
            }
        };
        Ok(vec![Output::Mask(Mask { batch: 1, height: h, width: w, data })])
    },
};

/// `SaveImage`: writes each image of the batch as a PNG with the workflow in
/// its text chunks.
pub const SAVE_IMAGE: NodeClass = NodeClass {
    class_type: "SaveImage",
    define: || {
        NodeDef::new("image")
            .display_name("Save Image")
            .description("Saves the input images to your ComfyUI output directory.")
            .required("images", Kind::link("IMAGE"))
            .tooltip("The images to save.")
            .required("filename_prefix", Kind::string().default("ComfyUI"))
            .tooltip("The prefix for the file to save. This may include formatting information such as %date:yyyy-MM-dd% or %Empty Latent Image.width% to include values from nodes.")
            .hidden(Hidden::Prompt)
            .hidden(Hidden::ExtraPnginfo)
            .output_node()
            .search_aliases(&["save", "save image", "export image", "output image", "write image", "download"])
    },
    run: |inputs| {
        let images = inputs.image("images")?;
        let prefix = inputs.string("filename_prefix")?.to_string();
        let text = png_text(inputs);
        save_all(&images, FileKind::Output, &prefix, &text)?;
        Ok(vec![])
    },
};

/// `PreviewImage`: like SaveImage, into the temporary area.
pub const PREVIEW_IMAGE: NodeClass = NodeClass {
    class_type: "PreviewImage",
    define: || {
        NodeDef::new("image")
            .display_name("Preview Image")
            .description("Saves the input images to your ComfyUI output directory.")
            .required("images", Kind::link("IMAGE"))
            .hidden(Hidden::Prompt)
            .hidden(Hidden::ExtraPnginfo)
            .output_node()
    },
    run: |inputs| {
        let images = inputs.image("images")?;
        let text = png_text(inputs);
        save_all(&images, FileKind::Temp, "ComfyUI_temp", &text)?;
        Ok(vec![])
    },
};

/// A decoded image: RGB values and, when the file has alpha, the alpha plane.
struct Decoded {
    rgb: Image,
    alpha: Option<Vec<f32>>,
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
    let to_f32 = |v: &u8| *v as f32 / 255.0;
    if has_alpha {
        let rgba = img.to_rgba8();
        let raw = rgba.as_raw();
        let mut rgb = Vec::with_capacity(w * h * 3);
        let mut alpha = Vec::with_capacity(w * h);
        for px in raw.chunks_exact(4) {
            rgb.extend(px[..3].iter().map(to_f32));
            alpha.push(to_f32(&px[3]));
        }
        Ok(Decoded { rgb: Image { batch: 1, height: h, width: w, channels: 3, data: rgb }, alpha: Some(alpha) })
    } else {
        let rgb = img.to_rgb8();
        let data = rgb.as_raw().iter().map(to_f32).collect();
        Ok(Decoded { rgb: Image { batch: 1, height: h, width: w, channels: 3, data }, alpha: None })
    }
}

/// PNG text chunks: `prompt` and each key of `extra_pnginfo`, JSON-encoded.
fn png_text(inputs: &Inputs) -> Vec<(String, String)> {
    let mut text = Vec::new();
    if let Ok(prompt) = inputs.string("prompt") {
        text.push(("prompt".to_string(), prompt.to_string()));
    }
    if let Ok(extra) = inputs.string("extra_pnginfo")
        && let Ok(serde_json::Value::Object(map)) = serde_json::from_str::<serde_json::Value>(extra)
    {
        for (key, value) in map {
            text.push((key, value.to_string()));
        }
    }
    text
}

fn save_all(images: &Image, kind: FileKind, prefix: &str, text: &[(String, String)]) -> Result<()> {
    for b in 0..images.batch {
        let png = encode_png(images, b, text)?;
        host::save_file(kind, prefix, "png", &png).map_err(Error::failed)?;
        host::progress(b as u64 + 1, images.batch as u64);
    }
    Ok(())
}

/// Encodes image `b` of the batch as an 8-bit PNG, quantizing by truncation
/// (`uint8(clip(255·x, 0, 255))`) as ComfyUI does.
pub fn encode_png(images: &Image, b: usize, text: &[(String, String)]) -> Result<Vec<u8>> {
    let color = match images.channels {
        1 => png::ColorType::Grayscale,
        3 => png::ColorType::Rgb,
        4 => png::ColorType::Rgba,
        c => return Err(Error::invalid(format!("cannot save an image with {c} channels"))),
    };
    let pixels: Vec<u8> = images.frame(b).iter().map(|v| (v * 255.0).clamp(0.0, 255.0) as u8).collect();
    let mut out = Vec::with_capacity(pixels.len() / 2);
    let mut encoder = png::Encoder::new(&mut out, images.width as u32, images.height as u32);
    encoder.set_color(color);
    encoder.set_depth(png::BitDepth::Eight);
    // fdeflate with a fixed Up filter: the adaptive filter that `Fast` picks
    // costs more than the compression it buys on photographs.
    encoder.set_compression(png::Compression::Fast);
    encoder.set_filter(png::Filter::Up);
    for (key, value) in text {
        encoder.add_text_chunk(key.clone(), value.clone()).map_err(|e| Error::failed(format!("png text: {e}")))?;
    }
    let mut writer = encoder.write_header().map_err(|e| Error::failed(format!("png: {e}")))?;
    writer.write_image_data(&pixels).map_err(|e| Error::failed(format!("png: {e}")))?;
    writer.finish().map_err(|e| Error::failed(format!("png: {e}")))?;
    Ok(out)
}
