//! 8-bit conversions at the edges of a workflow: what an encoder needs and
//! what a decoder produces.

use crate::KernelError;
use crate::bands::{Stop, for_each_band};

/// Values per band for the element-wise conversions (they have no rows).
const ROW: usize = 4096;

/// `f` applied to every value of `src`, in bands.
fn map<S: Copy + Sync, T: Copy + Default + Send>(src: &[S], stop: Stop<'_>, f: impl Fn(S) -> T + Sync) -> Result<Vec<T>, KernelError> {
    let mut out = vec![T::default(); src.len()];
    for_each_band(&mut out, src.len(), ROW, stop, |_, first_row, band| {
        for (o, &v) in band.iter_mut().zip(&src[first_row * ROW..]) {
            *o = f(v);
        }
    })?;
    Ok(out)
}

/// `uint8(clip(255·v, 0, 255))`: ComfyUI's conversion before encoding
/// (truncation, not rounding; NaN becomes 0).
pub fn to_u8(src: &[f32], stop: Stop<'_>) -> Result<Vec<u8>, KernelError> {
    map(src, stop, byte_of)
}

/// One value's byte, as `(v·255).clamp(0, 255) as u8`, in a form the
/// compiler vectorizes (the saturating `as` kept the loop scalar: 2.5×
/// slower measured on a 3072² RGB image).
#[inline]
#[allow(clippy::manual_clamp, reason = "`clamp` keeps NaN, which the unchecked conversion must never see")]
fn byte_of(v: f32) -> u8 {
    // `max` returns its other operand for NaN: NaN becomes 0, ±∞ clamp.
    let x = (v * 255.0).max(0.0).min(255.0);
    // SAFETY: `x` is finite and within 0.0..=255.0, so it truncates to an
    // i32 without overflow.
    let whole: i32 = unsafe { x.to_int_unchecked() };
    whole as u8
}

/// `v / 255` for every byte: how decoded 8-bit pixels become a tensor.
pub fn from_u8(src: &[u8], stop: Stop<'_>) -> Result<Vec<f32>, KernelError> {
    map(src, stop, |v| f32::from(v) / 255.0)
}

/// `scale·v + offset` for every value (ImageInvert and InvertMask are
/// `−1·v + 1`, bit for bit `1 − v`). Both must be finite.
pub fn affine(src: &[f32], scale: f32, offset: f32, stop: Stop<'_>) -> Result<Vec<f32>, KernelError> {
    if !scale.is_finite() || !offset.is_finite() {
        return Err(KernelError::Invalid(format!("affine {scale}·v + {offset} is not finite")));
    }
    map(src, stop, |v| scale * v + offset)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncates_and_clamps_like_comfy() {
        let src = [0.0, 0.999 / 255.0, 1.0 / 255.0, 0.5, 1.0, 1.7, -0.2, f32::NAN];
        assert_eq!(to_u8(&src, &|| false).unwrap(), vec![0, 0, 1, 127, 255, 255, 0, 0]);
    }

    #[test]
    fn the_vectorized_byte_is_the_saturating_cast() {
        let mut src = vec![f32::NAN, -f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -0.0, f32::MAX, f32::MIN, f32::MIN_POSITIVE, 1.0, 254.999 / 255.0];
        src.extend((-3000..300_000).map(|i| i as f32 / 255_000.0 * 256.0));
        src.extend((0..256).map(|b| b as f32 / 255.0));
        let got = to_u8(&src, &|| false).unwrap();
        for (v, g) in src.iter().zip(got) {
            assert_eq!(g, (v * 255.0).clamp(0.0, 255.0) as u8, "{v}");
        }
    }

    #[test]
    fn affine_inverts_exactly() {
        let src: Vec<f32> = (0..70_000).map(|i| (i % 1000) as f32 / 999.0).collect();
        let got = affine(&src, -1.0, 1.0, &|| false).unwrap();
        assert!(got.iter().zip(&src).all(|(g, v)| g.to_bits() == (1.0 - v).to_bits()));
        assert!(affine(&src, f32::NAN, 1.0, &|| false).is_err());
    }

    #[test]
    fn round_trips_every_byte_over_many_bands() {
        let bytes: Vec<u8> = (0..100_000u32).map(|i| (i % 256) as u8).collect();
        let f = from_u8(&bytes, &|| false).unwrap();
        assert_eq!(to_u8(&f, &|| false).unwrap(), bytes);
    }
}
