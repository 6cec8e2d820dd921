//! Host-owned tensors: the pixels that flow between nodes.
//!
//! A [`Tensor`] is an immutable, reference-counted f32 array with a shape.
//! Nodes receive handles to tensors, never copies, unless a plugin chooses to
//! read one into its own memory; fan-out and the result cache share the same
//! allocation.
//!
//! A tensor lives on the host, on the GPU, or both: a GPU kernel's result
//! stays in device memory ([`Tensor::on_device`]) and the next kernel reads it
//! there; its host copy is made once, the first time something reads its
//! elements ([`Tensor::data`]: a plugin reading pixels, an encoder). A host
//! tensor a GPU kernel reads is uploaded once and the device copy kept with it.

use std::fmt;
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use crate::budget::MemoryCharge;
use crate::gpu::DeviceBuffer;

/// Most dimensions a tensor may have.
pub const MAX_RANK: usize = 8;

/// An immutable f32 tensor in row-major order.
#[derive(Clone)]
pub struct Tensor(Arc<TensorData>);

struct TensorData {
    shape: Box<[u32]>,
    /// Number of elements (`shape`'s product).
    len: usize,
    /// The host copy: set at creation, or on the first read of a device tensor.
    host: OnceLock<Box<[f32]>>,
    /// The device copy: set at creation by a GPU kernel, or on a first upload.
    device: OnceLock<DeviceBuffer>,
    /// Serializes the first read-back or upload.
    transfer: Mutex<()>,
    /// The job account that pays for `data`, released with it (or earlier,
    /// when the result cache takes the tensor over: [`Tensor::release_charge`]).
    charge: Mutex<MemoryCharge>,
}

/// Why a tensor could not be built.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum TensorError {
    /// Rank 0, rank above [`MAX_RANK`], or a zero-sized dimension.
    #[error("bad shape {0:?}: a tensor has 1 to {MAX_RANK} non-zero dimensions")]
    BadShape(Vec<u32>),
    /// `data` does not match the element count of the shape.
    #[error("shape {shape:?} holds {expected} elements, got {actual}")]
    LengthMismatch { shape: Vec<u32>, expected: u64, actual: u64 },
    /// A device tensor could not be read back (device lost, budget).
    #[error("cannot read the tensor back from the GPU: {0}")]
    Device(String),
}

impl Tensor {
    /// Builds a tensor, checking that `data` fills `shape` exactly.
    pub fn new(shape: Vec<u32>, data: Vec<f32>) -> Result<Tensor, TensorError> {
        let expected = element_count(&shape)?;
        if expected != data.len() as u64 {
            return Err(TensorError::LengthMismatch { shape, expected, actual: data.len() as u64 });
        }
        let len = data.len();
        Ok(Tensor::build(shape, len, OnceLock::from(data.into_boxed_slice()), OnceLock::new()))
    }
    /// A tensor whose elements are in `buffer` on the GPU (`shape` must
    /// match its element count: the GPU module checks that when it allocates).
    pub fn on_device(shape: Vec<u32>, buffer: DeviceBuffer) -> Result<Tensor, TensorError> {
        let expected = element_count(&shape)?;
        if expected != buffer.len() as u64 {
            return Err(TensorError::LengthMismatch { shape, expected, actual: buffer.len() as u64 });
        }
        let len = buffer.len();
        Ok(Tensor::build(shape, len, OnceLock::new(), OnceLock::from(buffer)))
    }
    fn build(shape: Vec<u32>, len: usize, host: OnceLock<Box<[f32]>>, device: OnceLock<DeviceBuffer>) -> Tensor {
        Tensor(Arc::new(TensorData { shape: shape.into_boxed_slice(), len, host, device, transfer: Mutex::new(()), charge: Mutex::new(MemoryCharge::none()) }))
    }
    /// Makes `charge` pay for this tensor's memory while it lives.
    pub fn attach_charge(&self, charge: MemoryCharge) {
        *self.0.charge.lock() = charge;
    }
    /// Gives the tensor's bytes back to the job that paid for them: another
    /// bound (the result cache's) covers it from now on.
    pub fn release_charge(&self) {
        drop(std::mem::take(&mut *self.0.charge.lock()));
    }
    /// Dimensions, outermost first.
    pub fn shape(&self) -> &[u32] {
        &self.0.shape
    }
    /// All elements, read back from the GPU the first time for a device
    /// tensor (the host copy is charged to whoever pays for the tensor).
    pub fn data(&self) -> Result<&[f32], TensorError> {
        if let Some(data) = self.0.host.get() {
            return Ok(data);
        }
        let _transfer = self.0.transfer.lock();
        if let Some(data) = self.0.host.get() {
            return Ok(data);
        }
        let device = self.0.device.get().ok_or_else(|| TensorError::Device("the tensor has no data".into()))?;
        self.0.charge.lock().grow(self.byte_len()).map_err(|e| TensorError::Device(e.to_string()))?;
        let data = device.read().map_err(|e| TensorError::Device(e.to_string()))?;
        Ok(self.0.host.get_or_init(|| data.into_boxed_slice()))
    }
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.0.len
    }
    /// Whether the tensor has no elements (never: shapes have no zero dimension).
    pub fn is_empty(&self) -> bool {
        self.0.len == 0
    }
    /// The device copy, if the tensor has one.
    pub fn device(&self) -> Option<&DeviceBuffer> {
        self.0.device.get()
    }
    /// Whether the elements are on the host already (reading them costs no transfer).
    pub fn is_on_host(&self) -> bool {
        self.0.host.get().is_some()
    }
    /// The device copy, made by `upload` the first time (its device memory
    /// charged to whoever pays for the tensor).
    pub fn device_or_upload<E: From<TensorError>>(&self, upload: impl FnOnce(&[f32]) -> Result<DeviceBuffer, E>) -> Result<&DeviceBuffer, E> {
        if let Some(buffer) = self.0.device.get() {
            return Ok(buffer);
        }
        let data = self.data()?;
        let _transfer = self.0.transfer.lock();
        if let Some(buffer) = self.0.device.get() {
            return Ok(buffer);
        }
        self.0.charge.lock().grow(self.byte_len()).map_err(|e| TensorError::Device(e.to_string()))?;
        let buffer = upload(data)?;
        Ok(self.0.device.get_or_init(|| buffer))
    }
    /// Size of the elements in bytes.
    pub fn byte_len(&self) -> u64 {
        self.0.len as u64 * 4
    }
    /// Whether two handles share one allocation.
    pub fn ptr_eq(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
    /// A content hash (shape and bits), for cache keys of tensors that did not
    /// come from another node. A device tensor that cannot be read back hashes
    /// to a random key, which matches nothing cached.
    pub fn content_hash(&self) -> blake3::Hash {
        let mut h = blake3::Hasher::new();
        h.update(&(self.0.shape.len() as u64).to_le_bytes());
        for d in self.shape() {
            h.update(&d.to_le_bytes());
        }
        let data = match self.data() {
            Ok(data) => data,
            Err(_) => {
                h.update(b"unreadable");
                h.update(uuid::Uuid::new_v4().as_bytes());
                return h.finalize();
            }
        };
        for chunk in data.chunks(4096) {
            for v in chunk {
                h.update(&v.to_bits().to_le_bytes());
            }
        }
        h.finalize()
    }
}

/// Number of elements `shape` holds, or why it is not a valid shape.
pub fn element_count(shape: &[u32]) -> Result<u64, TensorError> {
    if shape.is_empty() || shape.len() > MAX_RANK || shape.contains(&0) {
        return Err(TensorError::BadShape(shape.to_vec()));
    }
    shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d as u64)).ok_or_else(|| TensorError::BadShape(shape.to_vec()))
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tensor{:?}", self.shape())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_bad_shapes_and_lengths() {
        assert_eq!(Tensor::new(vec![], vec![]).unwrap_err(), TensorError::BadShape(vec![]));
        assert_eq!(Tensor::new(vec![2, 0], vec![]).unwrap_err(), TensorError::BadShape(vec![2, 0]));
        assert!(matches!(Tensor::new(vec![2, 2], vec![0.0; 3]), Err(TensorError::LengthMismatch { expected: 4, actual: 3, .. })));
        assert!(element_count(&[u32::MAX, u32::MAX, u32::MAX]).is_err());
        let t = Tensor::new(vec![1, 2], vec![0.5, 1.0]).unwrap();
        assert_eq!(t.shape(), &[1, 2]);
        assert_eq!(t.byte_len(), 8);
        assert!(t.ptr_eq(&t.clone()));
    }

    #[test]
    fn content_hash_depends_on_shape_and_values() {
        let a = Tensor::new(vec![1, 2], vec![0.5, 1.0]).unwrap();
        let b = Tensor::new(vec![2, 1], vec![0.5, 1.0]).unwrap();
        let c = Tensor::new(vec![1, 2], vec![0.5, 1.0]).unwrap();
        assert_ne!(a.content_hash(), b.content_hash());
        assert_eq!(a.content_hash(), c.content_hash());
    }
}
