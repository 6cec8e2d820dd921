//! The host side of `kiln:plugin/gpu`: plugins' WGSL kernels over host
//! tensors on the host's device (see [`crate::gpu`] for the rules). Only
//! plugins whose manifest asks (`[capabilities] gpu = true`) get it.
//!
//! A node may bind read-write only the tensors it allocated itself
//! (`gpu.allocate`): every other tensor is immutable — it may be another
//! node's output, a cached result or a client's input. Device memory is
//! charged like host tensors: to the node's tensor budget and the job's
//! memory. Any other tensor a kernel reads is uploaded once and kept with it.

use std::collections::HashSet;
use std::sync::Arc;

use wasmtime::component::Resource;

use super::bindings::kiln::plugin::gpu as wit;
use super::state::{NodeState, Stopped};
use crate::gpu::dispatch::{Bound, run};
use crate::gpu::{Estimate, Gpu, GpuError, Kernel, check_binding, kernel};
use crate::tensor::{Tensor, TensorError, element_count};

/// The `kernel` resource: a compiled kernel shared with the device's cache.
pub struct KernelHandle(pub(crate) Arc<Kernel>);

/// A node call's view of the GPU.
#[derive(Default)]
pub struct NodeGpu {
    /// The host's GPU (host kernels may use it whatever the plugin asked).
    pub(crate) gpu: Option<Arc<Gpu>>,
    /// The plugin's manifest asks for the GPU (`capabilities.gpu`).
    pub(crate) granted: bool,
    /// Device buffers this node allocated (the only ones it may write).
    writable: HashSet<u64>,
    /// Whether any work of the node ran on the GPU.
    pub(crate) ran: bool,
}

impl From<TensorError> for GpuError {
    fn from(e: TensorError) -> GpuError {
        GpuError::InvalidDispatch(e.to_string())
    }
}

fn to_wit(e: GpuError) -> wit::GpuError {
    match e {
        GpuError::Unavailable => wit::GpuError::Unavailable,
        GpuError::InvalidKernel(m) => wit::GpuError::InvalidKernel(m),
        GpuError::InvalidDispatch(m) => wit::GpuError::InvalidDispatch(m),
        GpuError::Driver(m) => wit::GpuError::InvalidDispatch(format!("the GPU reported: {m}")),
        GpuError::Timeout => wit::GpuError::Timeout,
        GpuError::DeviceLost => wit::GpuError::DeviceLost,
    }
}

type GpuResult<T> = wasmtime::Result<Result<T, wit::GpuError>>;

impl NodeState {
    /// The GPU, if this node may use it: its plugin asked, and the host
    /// offers it (see `Gpu::offered`).
    fn gpu(&self) -> Result<Arc<Gpu>, GpuError> {
        self.gpu.gpu.clone().filter(|gpu| self.gpu.granted && gpu.offered()).ok_or(GpuError::Unavailable)
    }

    fn allocate_on_gpu(&mut self, shape: Vec<u32>) -> Result<Tensor, GpuError> {
        let gpu = self.gpu()?;
        let values = element_count(&shape)?;
        let bytes = values.saturating_mul(4);
        if bytes > gpu.limits().max_buffer_bytes {
            return Err(GpuError::InvalidDispatch(format!(
                "a {} MiB tensor: at most {} MiB on the GPU (gpu_max_buffer_mb)",
                bytes >> 20,
                gpu.limits().max_buffer_bytes >> 20
            )));
        }
        let charge = self.charge(bytes).map_err(GpuError::InvalidDispatch)?;
        let made = gpu.device().and_then(|device| device.zeroed(values as usize)).and_then(|buffer| {
            let id = buffer.id();
            Ok((Tensor::on_device(shape, buffer)?, id))
        });
        match made {
            Ok((tensor, id)) => {
                tensor.attach_charge(charge);
                self.gpu.writable.insert(id);
                Ok(tensor)
            }
            Err(e) => {
                self.tensor_bytes -= bytes;
                Err(e)
            }
        }
    }

    fn dispatch_on_gpu(&mut self, kernel: &Kernel, tensors: &[(u32, Tensor, bool)], uniforms: &[u8], groups: (u32, u32, u32)) -> Result<(), GpuError> {
        let gpu = self.gpu()?;
        let device = gpu.device()?;
        let mut bound = Vec::with_capacity(tensors.len());
        for (index, tensor, write) in tensors {
            // A kernel binds its tensors whole: one over the limit is refused
            // before a host tensor is uploaded for it.
            check_binding(tensor.byte_len(), device.max_binding_bytes())?;
            let buffer = tensor.device_or_upload(|data| device.upload(data))?;
            if *write && !self.gpu.writable.contains(&buffer.id()) {
                return Err(GpuError::InvalidDispatch(format!("@binding({index}): only tensors this node allocated may be bound read-write")));
            }
            bound.push(Bound::whole(*index, buffer, *write));
        }
        run(&device, kernel, &bound, uniforms, groups, gpu.limits(), self.stop.deadline)?;
        self.gpu.ran = true;
        Ok(())
    }
}

impl wit::Host for NodeState {
    fn available(&mut self) -> wasmtime::Result<bool> {
        Ok(self.gpu().is_ok())
    }

    fn prefers(&mut self, elements: u64, inputs: Vec<Resource<Tensor>>) -> wasmtime::Result<bool> {
        // Not `self.gpu()`: under `auto` its `offered` probes the adapter,
        // which a small result must not cost; `Gpu::prefers` probes only
        // for a GPU-sized one.
        let Some(gpu) = self.gpu.gpu.clone().filter(|_| self.gpu.granted) else { return Ok(false) };
        // A plugin's kernel is priced as one read per input value and result
        // value: its inputs on the host must be worth their upload.
        let (mut resident, mut upload_bytes) = (false, 0u64);
        for input in &inputs {
            let t = self.table.get(input)?;
            match t.device().filter(|b| !b.device().is_lost()) {
                Some(_) => resident = true,
                None => upload_bytes = upload_bytes.saturating_add((t.len() as u64).saturating_mul(4)),
            }
        }
        // The plugin's own claim, bounded by the largest result it could
        // make (its tensor budget): an absurd count cannot buy the device's
        // opening for the whole process.
        let values = elements.min(self.limits.tensor_bytes / 4);
        Ok(gpu.prefers(&Estimate { values, taps: 1, upload_bytes, resident }))
    }

    fn compile(&mut self, wgsl: String, entry_point: String) -> GpuResult<Resource<KernelHandle>> {
        let compiled = self.gpu().and_then(|gpu| gpu.device().and_then(|device| kernel::compile(&device, gpu.limits(), &wgsl, &entry_point)));
        match compiled {
            Ok(k) => Ok(Ok(self.table.push(KernelHandle(k))?)),
            Err(e) => Ok(Err(to_wit(e))),
        }
    }

    fn allocate(&mut self, shape: Vec<u32>) -> GpuResult<Resource<Tensor>> {
        match self.allocate_on_gpu(shape) {
            Ok(t) => Ok(Ok(self.table.push(t)?)),
            Err(e) => Ok(Err(to_wit(e))),
        }
    }

    fn dispatch(&mut self, kernel: Resource<KernelHandle>, bindings: Vec<wit::Binding>, uniforms: Vec<u8>, workgroups: (u32, u32, u32)) -> GpuResult<()> {
        let kernel = self.table.get(&kernel)?.0.clone();
        let mut tensors = Vec::with_capacity(bindings.len());
        for b in bindings {
            tensors.push((b.index, self.table.get(&b.tensor)?.clone(), b.access == wit::Access::ReadWrite));
        }
        match self.dispatch_on_gpu(&kernel, &tensors, &uniforms, workgroups) {
            Ok(()) => Ok(Ok(())),
            Err(GpuError::Timeout) if self.stop.cancel.is_cancelled() => {
                self.stop.stopped = Some(Stopped::Cancelled);
                Err(wasmtime::Error::msg("GPU kernel stopped"))
            }
            Err(e) => Ok(Err(to_wit(e))),
        }
    }
}

impl wit::HostKernel for NodeState {
    fn id(&mut self, this: Resource<KernelHandle>) -> wasmtime::Result<String> {
        Ok(format!("blake3:{}", self.table.get(&this)?.0.id.to_hex()))
    }
    fn drop(&mut self, this: Resource<KernelHandle>) -> wasmtime::Result<()> {
        self.table.delete(this)?;
        Ok(())
    }
}
