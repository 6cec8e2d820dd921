//! Filter nodes: ImageBlur, ImageSharpen, ImageBlend, ImageQuantize.

use kiln_sdk::prelude::*;

use kiln_kernels::Dims;
use kiln_kernels::convolve::{Finish, gaussian_1d, separable};
use kiln_sdk::kernels;

use super::check_nonempty;
use crate::ops::resample::{Method, resize_image};

/// Runs the Gaussian convolution on the host over the input tensor (the
/// pixels never enter the plugin); the host checks the radius against the
/// image and answers with the same error as the CPU path.
fn convolve_on_host(image: &ImageHandle, radius: usize, sigma: f64, finish: kernels::Finish) -> Result<ImageHandle> {
    Ok(ImageHandle::new(kernels::convolve(image.tensor(), &gaussian_1d(radius, sigma as f32), finish)?))
}

/// The same convolution on pixels in this plugin's memory (what the parity
/// tests run natively; the host runs this very code).
fn convolve_here(image: Image, radius: usize, sigma: f64, finish: Finish) -> Result<Image> {
    check_nonempty(&image)?;
    let dims = Dims { batch: image.batch, height: image.height, width: image.width, channels: image.channels };
    let data = separable(&image.data, dims, &gaussian_1d(radius, sigma as f32), finish, &|| false).map_err(|e| Error::invalid(e.to_string()))?;
    Ok(Image { data, ..image })
}

/// `ImageBlur`: Gaussian blur with reflect padding.
#[node(class = "ImageBlur", category = "image/postprocessing")]
pub fn image_blur(
    image: ImageHandle,
    #[input(default = 1, min = 1, max = 31, step = 1)] blur_radius: usize,
    #[input(default = 1.0, min = 0.1, max = 10.0, step = 0.1)] sigma: f64,
) -> Result<ImageHandle> {
    if blur_radius == 0 {
        return Ok(image);
    }
    convolve_on_host(&image, blur_radius, sigma, kernels::Finish::Blur)
}

/// ImageBlur's computation: the image convolved with the normalized
/// `(2r+1)²` Gaussian over [-1, 1]², reflect-padded; radius 0 is the identity.
pub fn blur(image: Image, radius: usize, sigma: f64) -> Result<Image> {
    if radius == 0 {
        return Ok(image);
    }
    convolve_here(image, radius, sigma, Finish::Blur)
}

/// `ImageSharpen`: unsharp masking, `clamp((1+s)·x − s·blur(x))` with `s = 10·alpha`.
#[node(class = "ImageSharpen", category = "image/postprocessing")]
pub fn image_sharpen(
    image: ImageHandle,
    #[input(default = 1, min = 1, max = 31, step = 1)] sharpen_radius: usize,
    #[input(default = 1.0, min = 0.1, max = 10.0, step = 0.01)] sigma: f64,
    #[input(default = 1.0, min = 0.0, max = 5.0, step = 0.01)] alpha: f64,
) -> Result<ImageHandle> {
    if sharpen_radius == 0 {
        return Ok(image);
    }
    convolve_on_host(&image, sharpen_radius, sigma, kernels::Finish::Sharpen((alpha * 10.0) as f32))
}

/// ImageSharpen's computation. ComfyUI's kernel is `K = −s·G` (s = 10·alpha,
/// G the normalized Gaussian) with the centre tap raised by `1 − ΣK = 1 + s`
/// so that K sums to 1, i.e. `K = (1+s)·δ − s·G`. Convolution is linear, so
/// `K∗x = (1+s)·x − s·(G∗x)`: one separable blur plus a per-pixel blend,
/// fused into the blur's last pass, then clamped to 0..1.
pub fn sharpen(image: Image, radius: usize, sigma: f64, alpha: f64) -> Result<Image> {
    if radius == 0 {
        return Ok(image);
    }
    convolve_here(image, radius, sigma, Finish::Sharpen((alpha * 10.0) as f32))
}

use crate::gpu::BLEND_MODES;

/// `ImageBlend`: blends `image2` over `image1` by a mode and a factor, on
/// the GPU when there is one.
#[node(class = "ImageBlend", category = "image/postprocessing")]
pub fn image_blend(
    image1: ImageHandle,
    image2: ImageHandle,
    #[input(default = 0.5, min = 0.0, max = 1.0, step = 0.01)] blend_factor: f64,
    #[input(choices = BLEND_MODES)] blend_mode: &str,
) -> Result<ImageHandle> {
    let factor = blend_factor as f32;
    let on_cpu = || blend(image1.read()?, image2.read()?, factor, blend_mode);
    match crate::gpu::blend(image1.tensor(), image2.tensor(), factor, blend_mode, || on_cpu()?.to_tensor()) {
        Some(out) => Ok(ImageHandle::new(out?)),
        None => ImageHandle::from_image(&on_cpu()?),
    }
}

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

/// `clamp(i1·(1−f) + mode(i1, i2)·f)`; `i2` takes `i1`'s channel count
/// (cut, or alpha 1 added) and is resized (bicubic, centre crop) to `i1`.
/// Batches broadcast as torch's element-wise ops do: equal sizes pair up, a
/// batch of one pairs with every image of the other, anything else fails.
pub fn blend(i1: Image, i2: Image, factor: f32, mode: &str) -> Result<Image> {
    type Mode = fn(f32, f32) -> f32;
    let f: Mode = match mode {
        "normal" => |_, b| b,
        "multiply" => |a, b| a * b,
        "screen" => |a, b| 1.0 - (1.0 - a) * (1.0 - b),
        "overlay" => |a, b| if a <= 0.5 { 2.0 * a * b } else { 1.0 - 2.0 * (1.0 - a) * (1.0 - b) },
        "soft_light" => |a, b| {
            let g = if a <= 0.25 { ((16.0 * a - 12.0) * a + 4.0) * a } else { a.sqrt() };
            if b <= 0.5 { a - (1.0 - 2.0 * b) * a * (1.0 - a) } else { a + (2.0 * b - 1.0) * (g - a) }
        },
        "difference" => |a, b| a - b,
        other => return Err(Error::invalid(format!("unknown blend mode `{other}`"))),
    };
    check_nonempty(&i1)?;
    check_nonempty(&i2)?;
    let batch = match (i1.batch, i2.batch) {
        (a, b) if a == b || b == 1 => a,
        (1, b) => b,
        (a, b) => return Err(Error::invalid(format!("ImageBlend: batch sizes {a} and {b} cannot be broadcast together"))),
    };
    let mut i2 = match_channels(i2, i1.channels);
    if (i2.width, i2.height) != (i1.width, i1.height) {
        i2 = resize_image(&i2, i1.width, i1.height, Method::Bicubic, true)?;
    }
    let frame = i1.height * i1.width * i1.channels;
    // Blend into whichever input already has the output's batch size.
    let (mut out, other, out_is_first) = if i1.batch == batch { (i1, i2, true) } else { (i2, i1, false) };
    for b in 0..batch {
        let ob = if other.batch == 1 { 0 } else { b };
        let (x, y) = (&mut out.data[b * frame..(b + 1) * frame], &other.data[ob * frame..(ob + 1) * frame]);
        for (o, &v) in x.iter_mut().zip(y) {
            let (a, bv) = if out_is_first { (*o, v) } else { (v, *o) };
            *o = (a * (1.0 - factor) + f(a, bv) * factor).clamp(0.0, 1.0);
        }
    }
    Ok(out)
}

const DITHERS: [&str; 6] = ["none", "floyd-steinberg", "bayer-2", "bayer-4", "bayer-8", "bayer-16"];

/// `ImageQuantize`: reduces each image to a palette of `colors` colours.
#[node(class = "ImageQuantize", category = "image/postprocessing")]
pub fn image_quantize(
    image: &Image,
    #[input(default = 256, min = 1, max = 256, step = 1)] colors: usize,
    #[input(choices = DITHERS)] dither: &str,
) -> Result<Image> {
    if !DITHERS.contains(&dither) {
        return Err(Error::invalid(format!("unknown dither `{dither}`")));
    }
    quantize(image, colors.clamp(1, 256), dither)
}

/// Quantizes each image of the batch on its 8-bit RGB values (ComfyUI goes
/// through Pillow, truncating to 8 bits).
pub fn quantize(image: &Image, colors: usize, dither: &str) -> Result<Image> {
    use crate::ops::quantize::{bayer_offset, map_to_palette, median_cut};
    if image.channels < 3 {
        return Err(Error::invalid("ImageQuantize needs an RGB image"));
    }
    check_nonempty(image)?;
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
