//! Pixel operations that run inside the plugin: colour quantization, and
//! resampling of pixels a node already holds (the host's kernels, linked in).

pub mod quantize;
pub mod resample;

pub use kiln_kernels::resample::py_round;
