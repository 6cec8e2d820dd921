//! Pixel nodes, grouped by family. Each node's `run` only reads its inputs
//! and calls a pure function over [`Image`]/[`Mask`] values, so the maths is
//! testable natively (`tests/parity.rs` drives those functions with the
//! parity fixtures).

use kiln_sdk::prelude::*;

pub mod basic;
pub mod batch;
pub mod composite;
pub mod filters;
pub mod mask;
pub mod scale;
pub mod transform;

/// Refuses an image with a zero dimension: index arithmetic such as
/// "clamp x to `W − 1`" is meaningless for it, and the host does not forbid
/// empty tensors.
pub fn check_nonempty(image: &Image) -> Result<()> {
    if image.batch == 0 || image.height == 0 || image.width == 0 || image.channels == 0 {
        return Err(Error::invalid(format!("the image is empty (shape {:?})", image.shape())));
    }
    if image.data.len() != image.batch * image.height * image.width * image.channels {
        return Err(Error::invalid(format!("the image data does not match its shape {:?}", image.shape())));
    }
    Ok(())
}

/// [`check_nonempty`] for a mask.
pub fn check_mask_nonempty(mask: &Mask) -> Result<()> {
    if mask.batch == 0 || mask.height == 0 || mask.width == 0 {
        return Err(Error::invalid(format!("the mask is empty (shape {:?})", mask.shape())));
    }
    if mask.data.len() != mask.batch * mask.height * mask.width {
        return Err(Error::invalid(format!("the mask data does not match its shape {:?}", mask.shape())));
    }
    Ok(())
}
