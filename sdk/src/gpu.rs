//! GPU kernels with a CPU fallback.
//!
//! The host owns the GPU: a node hands it a WGSL compute kernel and tensor
//! handles, and gets a new tensor back that stays on the device (the next
//! node's kernel reads it there). [`run_or_cpu`] is the usual shape of such a
//! call: inputs bound read-only at `@binding(1)`, `@binding(2)`, …, a fresh
//! zero-filled output bound read-write at the next binding, uniforms at
//! `@binding(0)`; when the host says no GPU is available to this node (or
//! the device was lost), the node's CPU path runs instead.
//!
//! ```text
//! const INVERT: GpuKernel = GpuKernel { wgsl: "
//!     struct P { len: u32, groups_x: u32 }
//!     @group(0) @binding(0) var<uniform> p: P;
//!     @group(0) @binding(1) var<storage, read> src: array<f32>;
//!     @group(0) @binding(2) var<storage, read_write> dst: array<f32>;
//!     @compute @workgroup_size(256)
//!     fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
//!         let i = (wg.y * p.groups_x + wg.x) * 256u + li;
//!         if (i < p.len) { dst[i] = 1.0 - src[i]; }
//!     }", entry: "main" };
//! let (gx, gy) = groups_for(len, 256);
//! let out = run_or_cpu(&INVERT, &[image], &shape, &Uniforms::new().u32(len as u32).u32(gx), (gx, gy, 1), || cpu_invert(image))?;
//! ```
//!
//! Kernels run under the host's bounds: sizes are checked, device memory
//! counts against the node's tensor budget, and every loop stops after the
//! host's iteration budget.

use crate::bindings::kiln::plugin::gpu as wit;
pub use crate::bindings::kiln::plugin::gpu::GpuError;
use crate::io::{Error, Result, Tensor};

/// A WGSL compute kernel: its source and entry point.
#[derive(Debug, Clone, Copy)]
pub struct GpuKernel {
    /// The WGSL source.
    pub wgsl: &'static str,
    /// The `@compute` entry point.
    pub entry: &'static str,
}

/// Uniform bytes, built a 4-byte little-endian field at a time (the layout
/// of a WGSL struct of `u32`/`i32`/`f32` fields).
#[derive(Debug, Clone, Default)]
pub struct Uniforms(Vec<u8>);

impl Uniforms {
    /// No fields yet.
    pub fn new() -> Uniforms {
        Uniforms::default()
    }
    /// Appends a `u32` field.
    pub fn u32(mut self, v: u32) -> Uniforms {
        self.0.extend(v.to_le_bytes());
        self
    }
    /// Appends an `f32` field.
    pub fn f32(mut self, v: f32) -> Uniforms {
        self.0.extend(v.to_le_bytes());
        self
    }
    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.0
    }
}

/// Workgroups of `group` threads covering `values` invocations, folded into
/// `(x, y)` so no dimension exceeds 65535: a kernel's index is
/// `(wg.y · x + wg.x) · group + local_invocation_index`.
pub fn groups_for(values: usize, group: u32) -> (u32, u32) {
    let total = (values as u64).div_ceil(u64::from(group.max(1))).max(1);
    let x = total.min(65_535);
    (x as u32, total.div_ceil(x).min(u64::from(u32::MAX)) as u32)
}

/// Whether the host lets this node use the GPU now.
pub fn available() -> bool {
    wit::available()
}

/// Whether the host would rather run a kernel producing `elements` values
/// from `inputs` on the GPU (see [`run_or_cpu`]).
pub fn prefers(elements: u64, inputs: &[&Tensor]) -> bool {
    wit::prefers(elements, inputs)
}

impl From<GpuError> for Error {
    fn from(e: GpuError) -> Error {
        match e {
            GpuError::Unavailable => Error::failed("no GPU is available"),
            GpuError::InvalidKernel(m) => Error::failed(format!("invalid GPU kernel: {m}")),
            GpuError::InvalidDispatch(m) => Error::failed(format!("GPU dispatch refused: {m}")),
            GpuError::Timeout => Error::failed("the GPU kernel ran out of time"),
            GpuError::DeviceLost => Error::failed("the GPU device was lost"),
        }
    }
}

/// Runs `kernel` over `inputs` into a new tensor of `shape` (see the module
/// docs for the bindings), or `cpu()` when the host does not prefer the GPU
/// for this size and these inputs (`gpu.prefers`: unavailable, or under
/// `auto` a small result whose inputs are not on the device) or it was lost.
pub fn run_or_cpu(
    kernel: &GpuKernel,
    inputs: &[&Tensor],
    shape: &[usize],
    uniforms: &Uniforms,
    workgroups: (u32, u32, u32),
    cpu: impl FnOnce() -> Result<Tensor>,
) -> Result<Tensor> {
    let elements = shape.iter().try_fold(1u64, |n, &d| n.checked_mul(d as u64)).unwrap_or(u64::MAX);
    if !wit::prefers(elements, inputs) {
        return cpu();
    }
    match run(kernel, inputs, shape, uniforms, workgroups) {
        Err(GpuError::Unavailable | GpuError::DeviceLost) => cpu(),
        other => Ok(other?),
    }
}

/// [`run_or_cpu`] without the fallback.
pub fn run(kernel: &GpuKernel, inputs: &[&Tensor], shape: &[usize], uniforms: &Uniforms, workgroups: (u32, u32, u32)) -> std::result::Result<Tensor, GpuError> {
    let shape = shape
        .iter()
        .map(|&d| u32::try_from(d).map_err(|_| GpuError::InvalidDispatch(format!("dimension {d} is too large"))))
        .collect::<std::result::Result<Vec<u32>, _>>()?;
    let compiled = wit::compile(kernel.wgsl, kernel.entry)?;
    let out = wit::allocate(&shape)?;
    let mut bindings: Vec<wit::Binding<'_>> =
        inputs.iter().enumerate().map(|(i, t)| wit::Binding { index: i as u32 + 1, tensor: t, access: wit::Access::Read }).collect();
    bindings.push(wit::Binding { index: inputs.len() as u32 + 1, tensor: &out, access: wit::Access::ReadWrite });
    wit::dispatch(&compiled, &bindings, uniforms.bytes(), workgroups)?;
    Ok(out)
}
