//! Filter nodes: ImageBlur, ImageSharpen, ImageBlend, ImageQuantize.

use kiln_sdk::prelude::*;

use crate::ops::convolve::{convolve_separable, gaussian_1d};
use crate::ops::resample::{Method, resize_image};

fn check_radius(image: &Image, radius: usize) -> Result<()> {
    if radius >= image.width || radius >= image.height {
        return Err(Error::invalid(format!(
            "radius {radius} must be smaller than the image ({}×{}): padding size should be less than the corresponding input dimension",
            image.width, image.height
        )));
    }
    Ok(())
}

/// `ImageBlur`: Gaussian blur with reflect padding.
pub const IMAGE_BLUR: NodeClass = NodeClass {
    class_type: "ImageBlur",
    define: || {
        NodeDef::new("image/postprocessing")
            .required("image", Kind::link("IMAGE"))
            .required("blur_radius", Kind::int().default(1).min(1.0).max(31.0).step(1.0))
            .required("sigma", Kind::float().default(1.0).min(0.1).max(10.0).step(0.1))
            .output("IMAGE", "IMAGE")
    },
    run: |inputs| {
        let radius = inputs.usize("blur_radius")?;
        if radius == 0 {
            return Ok(vec![Output::Tensor(inputs.take_tensor("image")?)]);
        }
        let image = inputs.image("image")?;
        check_radius(&image, radius)?;
        Ok(vec![Output::Image(convolve_separable(&image, &gaussian_1d(radius, inputs.float("sigma")? as f32)))])
    },
};

/// `ImageSharpen`: unsharp masking, `clamp((1+s)·x − s·blur(x))` with `s = 10·alpha`.
pub const IMAGE_SHARPEN: NodeClass = NodeClass {
    class_type: "ImageSharpen",
    define: || {
        NodeDef::new("image/postprocessing")
            .required("image", Kind::link("IMAGE"))
            .required("sharpen_radius", Kind::int().default(1).min(1.0).max(31.0).step(1.0))
            .required("sigma", Kind::float().default(1.0).min(0.1).max(10.0).step(0.01))
            .required("alpha", Kind::float().default(1.0).min(0.0).max(5.0).step(0.01))
            .output("IMAGE", "IMAGE")
    },
    run: |inputs| {
        let radius = inputs.usize("sharpen_radius")?;
        if radius == 0 {
            return Ok(vec![Output::Tensor(inputs.take_tensor("image")?)]);
        }
        let image = inputs.image("image")?;
        check_radius(&image, radius)?;
        let s = (inputs.float("alpha")? * 10.0) as f32;
        let blurred = convolve_separable(&image, &gaussian_1d(radius, inputs.float("sigma")? as f32));
        Ok(vec![Output::Image(sharpen(image, &blurred, s))])
    },
};

/// ComfyUI's kernel is `−s·G` with the centre raised so it sums to 1, i.e.
/// `−s·G + (1+s)·δ` (G sums to 1): the image times `1+s` minus `s` times its blur.
pub fn sharpen(mut image: Image, blurred: &Image, s: f32) -> Image {
    for (v, &b) in image.data.iter_mut().zip(&blurred.data) {
        *v = ((1.0 + s) * *v - s * b).clamp(0.0, 1.0);
    }
    image
}

const BLEND_MODES: [&str; 6] = ["normal", "multiply", "screen", "overlay", "soft_light", "difference"];

/// `ImageBlend`: blends `image2` over `image1` by a mode and a factor.
pub const IMAGE_BLEND: NodeClass = NodeClass {
    class_type: "ImageBlend",
    define: || {
        NodeDef::new("image/postprocessing")
            .required("image1", Kind::link("IMAGE"))
            .required("image2", Kind::link("IMAGE"))
            .required("blend_factor", Kind::float().default(0.5).min(0.0).max(1.0).step(0.01))
            .required("blend_mode", Kind::combo(&BLEND_MODES))
            .output("IMAGE", "IMAGE")
    },
    run: |inputs| {
        let (i1, i2) = (inputs.image("image1")?, inputs.image("image2")?);
        Ok(vec![Output::Image(blend(i1, i2, inputs.float("blend_factor")? as f32, inputs.string("blend_mode")?)?)])
    },
};

/// Cuts or pads (alpha 1) `img` to `channels`.
pub fn match_channels(img: Image, channels: usize) -> Image {
    if img.channels == channels {
        return img;
    }
    let mut data = Vec::with_capacity(img.data.len() / img.channels * channels);
    for px in img.data.chunks_exact(img.channels) {
        data.extend((0..channels).map(|c| if c < img.channels { px[c] } else { 1.0 }));
    }
    Image { channels, data, ..img }
}

/// `clamp(i1·(1−f) + mode(i1, i2)·f)`; `i2` is resized (bicubic, centre crop)
/// to `i1` and repeated over `i1`'s batch.
pub fn blend(mut i1: Image, i2: Image, factor: f32, mode: &str) -> Result<Image> {
    let g = |x: f32| if x <= 0.25 { ((16.0 * x - 12.0) * x + 4.0) * x } else { x.sqrt() };
    let f: fn(f32, f32) -> f32 = match mode {
        "normal" => |_, b| b,
        "multiply" => |a, b| a * b,
        "screen" => |a, b| 1.0 - (1.0 - a) * (1.0 - b),
        "overlay" => |a, b| if a <= 0.5 { 2.0 * a * b } else { 1.0 - 2.0 * (1.0 - a) * (1.0 - b) },
        "soft_light" => |_, _| 0.0,
        "difference" => |a, b| a - b,
        other => return Err(Error::invalid(format!("unknown blend mode `{other}`"))),
    };
    let mut i2 = match_channels(i2, i1.channels);
    if (i2.width, i2.height) != (i1.width, i1.height) {
        i2 = resize_image(&i2, i1.width, i1.height, Method::Bicubic, true);
    }
    let frame = i1.height * i1.width * i1.channels;
    for b in 0..i1.batch {
        let b2 = b % i2.batch;
        let (x1, x2) = (&mut i1.data[b * frame..(b + 1) * frame], &i2.data[b2 * frame..(b2 + 1) * frame]);
        for (a, &bv) in x1.iter_mut().zip(x2) {
            let blended = if mode == "soft_light" {
                if bv <= 0.5 { *a - (1.0 - 2.0 * bv) * *a * (1.0 - *a) } else { *a + (2.0 * bv - 1.0) * (g(*a) - *a) }
            } else {
                f(*a, bv)
            };
            *a = (*a * (1.0 - factor) + blended * factor).clamp(0.0, 1.0);
        }
    }
    Ok(i1)
}

const DITHERS: [&str; 6] = ["none", "floyd-steinberg", "bayer-2", "bayer-4", "bayer-8", "bayer-16"];

/// `ImageQuantize`: reduces each image to a palette of `colors` colours.
pub const IMAGE_QUANTIZE: NodeClass = NodeClass {
    class_type: "ImageQuantize",
    define: || {
        NodeDef::new("image/postprocessing")
            .required("image", Kind::link("IMAGE"))
            .required("colors", Kind::int().default(256).min(1.0).max(256.0).step(1.0))
            .required("dither", Kind::combo(&DITHERS))
            .output("IMAGE", "IMAGE")
    },
    run: |inputs| {
        let image = inputs.image("image")?;
        let colors = inputs.usize("colors")?.clamp(1, 256);
        let dither = inputs.string("dither")?;
        if !DITHERS.contains(&dither) {
            return Err(Error::invalid(format!("unknown dither `{dither}`")));
        }
        Ok(vec![Output::Image(quantize(&image, colors, dither)?)])
    },
};

/// Quantizes each image of the batch on its 8-bit RGB values (ComfyUI goes
/// through Pillow, truncating to 8 bits).
pub fn quantize(image: &Image, colors: usize, dither: &str) -> Result<Image> {
    use crate::ops::quantize::{bayer_offset, map_to_palette, median_cut};
    if image.channels < 3 {
        return Err(Error::invalid("ImageQuantize needs an RGB image"));
    }
    let (w, pixels) = (image.width, image.width * image.height);
    let mut data = Vec::with_capacity(image.batch * pixels * 3);
    for b in 0..image.batch {
        let frame = &image.data[b * pixels * image.channels..(b + 1) * pixels * image.channels];
        let px: Vec<[u8; 3]> = frame.chunks_exact(image.channels).map(|p| std::array::from_fn(|c| (p[c] * 255.0).clamp(0.0, 255.0) as u8)).collect();
        let palette = median_cut(&px, colors);
        let mapped = match dither {
            "floyd-steinberg" => map_to_palette(&px, w, &palette, true),
            d if d.starts_with("bayer-") => {
                let order = d[6..].parse::<usize>().map_err(|_| Error::invalid(format!("bad dither `{d}`")))?;
                map_to_palette(&bayer_offset(&px, w, order, palette.len()), w, &palette, false)
            }
            _ => map_to_palette(&px, w, &palette, false),
        };
        data.extend(mapped.iter().flat_map(|p| p.iter().map(|&v| v as f32 / 255.0)));
    }
    Ok(Image { batch: image.batch, height: image.height, width: image.width, channels: 3, data })
}
