//! Shared pixel kernels: resampling and convolution.

pub mod convolve;
pub mod quantize;
pub mod resample;

/// Python's `round()`: halves go to the even neighbour.
pub fn py_round(v: f64) -> i64 {
    v.round_ties_even() as i64
}
