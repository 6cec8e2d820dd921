//! Geometry nodes: ImageCrop, ImageRotate, ImageFlip, ImagePadForOutpaint.

use kiln_sdk::prelude::*;

use super::check_nonempty;
use crate::ops::resample::crop_image;

/// `ImageCrop`: `width × height` at (x, y); x and y clamp inside the image and
/// the region is cut at the border.
#[node(class = "ImageCrop", category = "image/transform", display_name = "Image Crop")]
pub fn image_crop(
    image: &Image,
    #[input(default = 512, min = 1, max = 16384, step = 1)] width: usize,
    #[input(default = 512, min = 1, max = 16384, step = 1)] height: usize,
    #[input(default = 0, min = 0, max = 16384, step = 1)] x: usize,
    #[input(default = 0, min = 0, max = 16384, step = 1)] y: usize,
) -> Result<Image> {
    crop(image, x, y, width, height)
}

/// ComfyUI's crop: `x = min(x, W−1)`, `y = min(y, H−1)`, then a slice that
/// may be smaller at the border (at least one pixel).
pub fn crop(image: &Image, x: usize, y: usize, width: usize, height: usize) -> Result<Image> {
    check_nonempty(image)?;
    let (x, y) = (x.min(image.width - 1), y.min(image.height - 1));
    let (w, h) = (width.min(image.width - x).max(1), height.min(image.height - y).max(1));
    crop_image(image, x, y, w, h)
}

const ROTATIONS: [&str; 4] = ["none", "90 degrees", "180 degrees", "270 degrees"];

/// `ImageRotate`: by multiples of 90° (clockwise on screen).
#[node(class = "ImageRotate", category = "image/transform")]
pub fn image_rotate(image: ImageHandle, #[input(choices = ROTATIONS)] rotation: &str) -> Result<ImageHandle> {
    match rotation_turns(rotation)? {
        // Unchanged: hand the host's tensor back without copying it.
        0 => Ok(image),
        turns => ImageHandle::from_image(&rotate(image.read()?, turns)),
    }
}

/// Clockwise quarter turns for a `rotation` combo value.
pub fn rotation_turns(rotation: &str) -> Result<usize> {
    Ok(match rotation {
        "none" => 0,
        "90 degrees" => 1,
        "180 degrees" => 2,
        "270 degrees" => 3,
        other => return Err(Error::invalid(format!("unknown rotation `{other}`"))),
    })
}

/// The image turned clockwise `turns` quarter turns.
pub fn rotate(image: Image, turns: usize) -> Image {
    match turns % 4 {
        0 => image,
        // Half a turn is both flips: one pass instead of two quarter turns.
        2 => flip(&flip(&image, true), false),
        t => (0..t).fold(image, |img, _| rotate_90(&img)),
    }
}

/// One clockwise quarter turn: `new[y][x] = old[H−1−x][y]` (torch `rot90`
/// with dims `[2, 1]`).
pub fn rotate_90(image: &Image) -> Image {
    let (h, w, c) = (image.height, image.width, image.channels);
    let mut data = Vec::with_capacity(image.data.len());
    for b in 0..image.batch {
        for y in 0..w {
            for x in 0..h {
                let s = image.index(b, h - 1 - x, y, 0);
                data.extend_from_slice(&image.data[s..s + c]);
            }
        }
    }
    Image { batch: image.batch, height: w, width: h, channels: c, data }
}

const FLIP_METHODS: [&str; 2] = ["x-axis: vertically", "y-axis: horizontally"];

/// `ImageFlip`: rows ("x-axis: vertically") or columns ("y-axis: horizontally").
#[node(class = "ImageFlip", category = "image/transform")]
pub fn image_flip(image: &Image, #[input(choices = FLIP_METHODS)] flip_method: &str) -> Result<Image> {
    Ok(flip(image, flip_is_vertical(flip_method)?))
}

/// Whether a `flip_method` combo value flips rows (`x-axis: vertically`)
/// rather than columns (`y-axis: horizontally`).
pub fn flip_is_vertical(method: &str) -> Result<bool> {
    match method {
        "x-axis: vertically" => Ok(true),
        "y-axis: horizontally" => Ok(false),
        other => Err(Error::invalid(format!("unknown flip method `{other}`"))),
    }
}

/// Flips rows (`vertical`: whole rows copied in reverse order) or columns.
pub fn flip(image: &Image, vertical: bool) -> Image {
    let (h, c) = (image.height, image.channels);
    let row = image.width * c;
    if h == 0 || row == 0 {
        return image.clone();
    }
    let mut data = Vec::with_capacity(image.data.len());
    for frame in image.data.chunks_exact(h * row) {
        if vertical {
            frame.chunks_exact(row).rev().for_each(|r| data.extend_from_slice(r));
        } else {
            for r in frame.chunks_exact(row) {
                r.chunks_exact(c).rev().for_each(|px| data.extend_from_slice(px));
            }
        }
    }
    Image { data, ..image.clone() }
}

/// `ImagePadForOutpaint`: a grey border, and a mask of the border with a
/// feathered band inside the original image: the padded image (0.5 grey,
/// every channel) and its `[1, H', W']` mask.
#[node(class = "ImagePadForOutpaint", category = "image", display_name = "Pad Image for Outpainting")]
/// The padded image (0.5 grey, every channel) and its `[1, H', W']` mask.
pub fn pad_for_outpaint(
    image: &Image,
    #[input(default = 0, min = 0, max = 16384, step = 8)] left: usize,
    #[input(default = 0, min = 0, max = 16384, step = 8)] top: usize,
    #[input(default = 0, min = 0, max = 16384, step = 8)] right: usize,
    #[input(default = 0, min = 0, max = 16384, step = 8)] bottom: usize,
    #[input(default = 40, min = 0, max = 16384, step = 1)] feathering: usize,
) -> (Image, Mask) {
    let (h, w, c) = (image.height, image.width, image.channels);
    let (nh, nw) = (h + top + bottom, w + left + right);
    let mut out = Image::filled(image.batch, nh, nw, c, 0.5);
    for b in 0..image.batch {
        for y in 0..h {
            let s = image.index(b, y, 0, 0);
            let d = out.index(b, y + top, left, 0);
            out.data[d..d + w * c].copy_from_slice(&image.data[s..s + w * c]);
        }
    }
    let mut mask = Mask::filled(1, nh, nw, 1.0);
    let feather = feathering > 0 && feathering * 2 < h && feathering * 2 < w;
    for i in 0..h {
        for j in 0..w {
            let mut v = 0.0;
            if feather {
                let dt = if top != 0 { i } else { h };
                let db = if bottom != 0 { h - i } else { h };
                let dl = if left != 0 { j } else { w };
                let dr = if right != 0 { w - j } else { w };
                let d = dt.min(db).min(dl).min(dr);
                if d < feathering {
                    let r = (feathering - d) as f32 / feathering as f32;
                    v = r * r;
                }
            }
            let k = mask.index(0, i + top, j + left);
            mask.data[k] = v;
        }
    }
    (out, mask)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn numbered(h: usize, w: usize) -> Image {
        Image::from_vec(1, h, w, 1, (0..h * w).map(|i| i as f32).collect()).unwrap()
    }

    #[test]
    fn quarter_turn_is_clockwise() {
        // [[0,1,2],[3,4,5]] turned clockwise is [[3,0],[4,1],[5,2]].
        let r = rotate_90(&numbered(2, 3));
        assert_eq!((r.height, r.width), (3, 2));
        assert_eq!(r.data, vec![3., 0., 4., 1., 5., 2.]);
    }

    #[test]
    fn flips_and_crops() {
        assert_eq!(flip(&numbered(2, 2), true).data, vec![2., 3., 0., 1.]);
        assert_eq!(flip(&numbered(2, 2), false).data, vec![1., 0., 3., 2.]);
        assert_eq!(crop(&numbered(3, 3), 5, 1, 2, 9).unwrap().data, vec![5., 8.]);
    }

    #[test]
    fn outpaint_mask_is_one_on_the_border() {
        let (img, mask) = pad_for_outpaint(&Image::filled(1, 2, 2, 3, 0.0), 1, 0, 0, 1, 0);
        assert_eq!((img.height, img.width), (3, 3));
        assert_eq!(mask.data, vec![1., 0., 0., 1., 0., 0., 1., 1., 1.]);
        assert_eq!(img.get(0, 0, 0, 0), 0.5);
    }
}
