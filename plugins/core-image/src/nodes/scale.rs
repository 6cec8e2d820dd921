//! Upscale nodes: ImageScale, ImageScaleBy, ImageScaleToTotalPixels.

use kiln_sdk::prelude::*;

use super::check_nonempty;
use crate::ops::py_round;
use crate::ops::resample::{METHODS, Method, resize_image};

fn size(v: i64, what: &str) -> Result<usize> {
    usize::try_from(v).ok().filter(|&v| (1..=16384 * 8).contains(&v)).ok_or_else(|| Error::invalid(format!("{what} {v} is out of range")))
}

/// `ImageScale`: to `width × height`; a 0 keeps the aspect ratio.
pub const IMAGE_SCALE: NodeClass = NodeClass {
    class_type: "ImageScale",
    define: || {
        NodeDef::new("image/upscaling")
            .display_name("Upscale Image")
            .required("image", Kind::link("IMAGE"))
            .required("upscale_method", Kind::combo(&METHODS))
            .required("width", Kind::int().default(512).min(0.0).max(16384.0).step(1.0))
            .required("height", Kind::int().default(512).min(0.0).max(16384.0).step(1.0))
            .required("crop", Kind::combo(&["disabled", "center"]))
            .output("IMAGE", "IMAGE")
    },
    run: |inputs| {
        let (w, h) = (inputs.usize("width")?, inputs.usize("height")?);
        let crop = inputs.string("crop")?.to_owned();
        let method = inputs.string("upscale_method")?.to_owned();
        if w == 0 && h == 0 {
            // Unchanged: hand the host's tensor back without copying it in and out.
            return Ok(vec![Output::Tensor(inputs.take_tensor("image")?)]);
        }
        Ok(vec![Output::Image(image_scale(&inputs.image("image")?, &method, w, h, &crop)?)])
    },
};

/// The resampling method named by an `upscale_method` combo value.
pub fn parse_method(name: &str) -> Result<Method> {
    Method::parse(name).ok_or_else(|| Error::invalid(format!("unknown upscale method `{name}`")))
}

/// ImageScale's computation: to `width × height` (a zero side follows the
/// aspect ratio, both zero leaves the image unchanged), `crop` being
/// `"disabled"` or `"center"`.
pub fn image_scale(image: &Image, method: &str, width: usize, height: usize, crop: &str) -> Result<Image> {
    let method = parse_method(method)?;
    let crop = match crop {
        "disabled" => false,
        "center" => true,
        other => return Err(Error::invalid(format!("unknown crop `{other}`"))),
    };
    check_nonempty(image)?;
    if width == 0 && height == 0 {
        return Ok(image.clone());
    }
    let (w, h) = target_size(image.width, image.height, width, height)?;
    Ok(resize_image(image, w, h, method, crop))
}

/// ImageScale's size rule: a zero side follows the aspect ratio.
pub fn target_size(iw: usize, ih: usize, w: usize, h: usize) -> Result<(usize, usize)> {
    let (w, h) = match (w, h) {
        (0, h) => ((py_round(iw as f64 * h as f64 / ih as f64)).max(1) as usize, h),
        (w, 0) => (w, (py_round(ih as f64 * w as f64 / iw as f64)).max(1) as usize),
        wh => wh,
    };
    Ok((size(w as i64, "width")?, size(h as i64, "height")?))
}

/// `ImageScaleBy`: by a factor, `round(W·s) × round(H·s)`.
pub const IMAGE_SCALE_BY: NodeClass = NodeClass {
    class_type: "ImageScaleBy",
    define: || {
        NodeDef::new("image/upscaling")
            .display_name("Upscale Image By")
            .required("image", Kind::link("IMAGE"))
            .required("upscale_method", Kind::combo(&METHODS))
            .required("scale_by", Kind::float().default(1.0).min(0.01).max(8.0).step(0.01))
            .output("IMAGE", "IMAGE")
    },
    run: |inputs| Ok(vec![Output::Image(image_scale_by(&inputs.image("image")?, inputs.string("upscale_method")?, inputs.float("scale_by")?)?)]),
};

/// ImageScaleBy's computation: `round(W·s) × round(H·s)` (Python rounding), no crop.
pub fn image_scale_by(image: &Image, method: &str, scale_by: f64) -> Result<Image> {
    let method = parse_method(method)?;
    check_nonempty(image)?;
    let w = size(py_round(image.width as f64 * scale_by), "width")?;
    let h = size(py_round(image.height as f64 * scale_by), "height")?;
    Ok(resize_image(image, w, h, method, false))
}

/// `ImageScaleToTotalPixels`: to about `megapixels` MiP, sides multiples of `resolution_steps`.
pub const IMAGE_SCALE_TO_TOTAL_PIXELS: NodeClass = NodeClass {
    class_type: "ImageScaleToTotalPixels",
    define: || {
        NodeDef::new("image/upscaling")
            .required("image", Kind::link("IMAGE"))
            .required("upscale_method", Kind::combo(&METHODS))
            .required("megapixels", Kind::float().default(1.0).min(0.01).max(16.0).step(0.01))
            .required("resolution_steps", Kind::int().default(1).min(1.0).max(256.0))
            .output("IMAGE", "IMAGE")
    },
    run: |inputs| {
        let image = inputs.image("image")?;
        let (mp, steps) = (inputs.float("megapixels")?, inputs.usize("resolution_steps")?);
        Ok(vec![Output::Image(image_scale_to_total_pixels(&image, inputs.string("upscale_method")?, mp, steps)?)])
    },
};

/// ImageScaleToTotalPixels' computation: `s = sqrt(megapixels·1024² / (W·H))`,
/// each side `round(side·s / steps)·steps`.
pub fn image_scale_to_total_pixels(image: &Image, method: &str, megapixels: f64, steps: usize) -> Result<Image> {
    let method = parse_method(method)?;
    check_nonempty(image)?;
    let steps = steps.max(1) as f64;
    let s = (megapixels * 1024.0 * 1024.0 / (image.width * image.height) as f64).sqrt();
    let w = size(py_round(image.width as f64 * s / steps) * steps as i64, "width")?;
    let h = size(py_round(image.height as f64 * s / steps) * steps as i64, "height")?;
    Ok(resize_image(image, w, h, method, false))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_side_keeps_aspect() {
        assert_eq!(target_size(200, 100, 0, 50).unwrap(), (100, 50));
        assert_eq!(target_size(200, 100, 50, 0).unwrap(), (50, 25));
        // Python rounds halves to even: 5·3/2 = 7.5 → 8, 7·1/2 = 3.5 → 4.
        assert_eq!(target_size(5, 2, 0, 3).unwrap(), (8, 3));
    }
}
