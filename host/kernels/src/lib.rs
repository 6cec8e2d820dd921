//! The pixel kernels kiln runs on the host for its plugins.
//!
//! A plugin asks for a kernel through the `kiln:plugin/kernels` import with
//! handles to host tensors; the pixels never enter the sandbox and the work
//! runs natively, split into bands of rows over all cores (feature
//! `parallel`). The same code, single-threaded, is what a guest links when it
//! needs one of these operations on pixels it already holds (e.g. ImageBlend
//! resizing its second input), so both paths give identical values.
//!
//! Every entry point validates its arguments and returns [`KernelError`]
//! rather than panicking: the arguments come from untrusted plugins. Long
//! kernels poll a `stop` callback between bands so that cancellation and the
//! node's deadline still bite while host code runs.

mod bands;
pub mod codec;
pub mod convert;
pub mod convolve;
#[cfg(feature = "parallel")]
mod deflate;
pub mod resample;

pub use bands::Stop;

/// Threads the kernels split their bands over: rayon's pool with the
/// `parallel` feature (`RAYON_NUM_THREADS` sets its size), else 1.
pub fn threads() -> usize {
    #[cfg(feature = "parallel")]
    let threads = rayon::current_num_threads();
    #[cfg(not(feature = "parallel"))]
    let threads = 1;
    threads
}

/// The layout of a `batch × height × width × channels` tensor (row-major,
/// channels last). A MASK is the same with one channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dims {
    /// Images in the batch.
    pub batch: usize,
    /// Rows per image.
    pub height: usize,
    /// Columns per image.
    pub width: usize,
    /// Values per pixel.
    pub channels: usize,
}

impl Dims {
    /// Values in one row.
    pub fn row_len(&self) -> usize {
        self.width * self.channels
    }
    /// Values in one image of the batch.
    pub fn frame_len(&self) -> usize {
        self.height * self.row_len()
    }
    /// Values in the whole tensor, `None` on overflow.
    pub fn len(&self) -> Option<usize> {
        self.batch.checked_mul(self.height)?.checked_mul(self.width)?.checked_mul(self.channels)
    }
    /// Whether any dimension is zero.
    pub fn is_empty(&self) -> bool {
        self.batch == 0 || self.height == 0 || self.width == 0 || self.channels == 0
    }
    /// Checks that `data` is a non-empty tensor of these dimensions.
    pub(crate) fn check(&self, data: &[f32]) -> Result<(), KernelError> {
        if self.is_empty() {
            return Err(KernelError::Invalid(format!("empty tensor {self:?}")));
        }
        match self.len() {
            Some(n) if n == data.len() => Ok(()),
            _ => Err(KernelError::Invalid(format!("{self:?} does not describe {} values", data.len()))),
        }
    }
}

/// Why a kernel did not produce a result.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum KernelError {
    /// Arguments that do not fit the tensor or the kernel's limits.
    #[error("{0}")]
    Invalid(String),
    /// The `stop` callback asked the kernel to give up (cancel or deadline).
    #[error("stopped")]
    Stopped,
}
