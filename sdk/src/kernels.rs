//! Host-owned pixel kernels: heavy image operations the host runs natively,
//! on all cores, over tensors that never enter the plugin.
//!
//! Prefer these to reading an [`crate::Image`] and looping over it: a blur of
//! a 3072² image costs a fraction of the CPU version and no copies in or out
//! of the sandbox. Results follow ComfyUI (torch / Pillow) semantics.

use crate::bindings::kiln::plugin::kernels::{self as wit, KernelError};
pub use crate::bindings::kiln::plugin::kernels::{Finish, Resample};
use crate::io::{Error, Result, Tensor};

impl From<KernelError> for Error {
    fn from(e: KernelError) -> Error {
        match e {
            KernelError::Invalid(m) => Error::invalid(m),
            KernelError::BudgetExceeded(m) => Error::failed(format!("tensor budget exceeded: {m}")),
        }
    }
}

fn side(v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| Error::invalid(format!("size {v} is too large")))
}

/// Convolves every image of an IMAGE with the separable, symmetric kernel
/// `taps` (reflect padding), finishing with a plain blur or unsharp masking.
pub fn convolve(image: &Tensor, taps: &[f32], finish: Finish) -> Result<Tensor> {
    Ok(wit::convolve(image, taps, finish)?)
}

/// Resizes every image of an IMAGE, optionally center-cropping to the target aspect first.
pub fn resize_image(image: &Tensor, width: usize, height: usize, method: Resample, crop_center: bool) -> Result<Tensor> {
    Ok(wit::resize_image(image, side(width)?, side(height)?, method, crop_center)?)
}

/// Resizes every mask of a MASK.
pub fn resize_mask(mask: &Tensor, width: usize, height: usize, method: Resample) -> Result<Tensor> {
    Ok(wit::resize_mask(mask, side(width)?, side(height)?, method)?)
}

/// `scale·v + offset` for every element (invert: `affine(t, -1.0, 1.0)`).
pub fn affine(t: &Tensor, scale: f32, offset: f32) -> Result<Tensor> {
    Ok(wit::affine(t, scale, offset)?)
}

/// `len` elements from `offset` as `uint8(clip(255·v, 0, 255))`: what an
/// encoder needs, at a quarter of the bytes of [`Tensor::read`].
pub fn read_u8(t: &Tensor, offset: usize, len: usize) -> Result<Vec<u8>> {
    let len = u32::try_from(len).map_err(|_| Error::invalid(format!("cannot read {len} elements at once")))?;
    Ok(wit::read_u8(t, offset as u64, len)?)
}

/// A tensor of `shape` from 8-bit values (`v / 255` each): what a decoder produces.
pub fn create_from_u8(shape: &[usize], data: &[u8]) -> Result<Tensor> {
    let shape = shape.iter().map(|&d| side(d)).collect::<Result<Vec<u32>>>()?;
    Ok(wit::create_from_u8(&shape, data)?)
}

/// Image `index` of an IMAGE as an 8-bit PNG with `text` as text chunks
/// (`(keyword, text)`), encoded natively by the host: what a save node writes.
pub fn encode_png(images: &Tensor, index: usize, text: &[(String, String)]) -> Result<Vec<u8>> {
    let index = u32::try_from(index).map_err(|_| Error::invalid(format!("image {index} is out of range")))?;
    Ok(wit::encode_png(images, index, text)?)
}
