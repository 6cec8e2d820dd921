//! Compiling WGSL compute kernels: validation by naga before anything
//! reaches the driver, loop bounding (the budget is bound per dispatch), and
//! a per-device pipeline cache keyed by the hash of the source and entry
//! point (a second compile of the same kernel costs a hash).

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use naga::valid::{Capabilities, ValidationFlags, Validator};

use super::{Device, GpuError, GpuLimits, loops};

/// How a kernel binds one `@group(0)` slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    /// The uniform bytes (binding 0 only).
    Uniform,
    /// A tensor; `writable` when the kernel declares it `read_write`.
    Storage { writable: bool },
}

/// A validated, bounded and compiled compute kernel.
pub struct Kernel {
    /// `blake3` of the source and entry point.
    pub id: blake3::Hash,
    pub(crate) pipeline: wgpu::ComputePipeline,
    /// `None` when the kernel binds nothing.
    pub(crate) layout: Option<wgpu::BindGroupLayout>,
    /// The slots the entry point uses, by binding index.
    pub slots: Vec<(u32, Slot)>,
    /// `@workgroup_size`.
    pub workgroup_size: [u32; 3],
    /// Its loops were bounded: each dispatch binds the loop budget.
    pub(crate) bounded: bool,
    /// The device it was compiled on.
    pub(crate) generation: u64,
}

impl std::fmt::Debug for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Kernel(blake3:{})", self.id.to_hex())
    }
}

impl Kernel {
    /// Invocations per workgroup.
    pub fn invocations_per_group(&self) -> u64 {
        self.workgroup_size.iter().map(|&d| u64::from(d)).product()
    }
}

/// Compiles `wgsl`'s compute entry point `entry` on `device`, or fetches it from the cache.
pub fn compile(device: &Device, limits: &GpuLimits, wgsl: &str, entry: &str) -> Result<Arc<Kernel>, GpuError> {
    if wgsl.len() > limits.max_source_bytes {
        return Err(GpuError::InvalidKernel(format!("the source has {} bytes; at most {} (gpu_max_source_kb)", wgsl.len(), limits.max_source_bytes)));
    }
    let id = {
        let mut h = blake3::Hasher::new();
        h.update(&(wgsl.len() as u64).to_le_bytes());
        h.update(wgsl.as_bytes());
        h.update(entry.as_bytes());
        h.finalize()
    };
    if let Some(kernel) = device.kernels.lock().get(&id) {
        return Ok(kernel.clone());
    }
    let (module, slots, workgroup_size, bounded) = front_end(wgsl, entry)?;
    let kernel = device
        .scoped(|| {
            let shader = device.device.create_shader_module(wgpu::ShaderModuleDescriptor { label: None, source: wgpu::ShaderSource::Naga(Cow::Owned(module)) });
            let pipeline = device.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: None,
                layout: None,
                module: &shader,
                entry_point: Some(entry),
                compilation_options: Default::default(),
                cache: None,
            });
            let layout = (!slots.is_empty() || bounded).then(|| pipeline.get_bind_group_layout(0));
            (pipeline, layout)
        })
        .map_err(|e| match e {
            GpuError::Driver(m) => GpuError::InvalidKernel(m),
            other => other,
        })?;
    let kernel = Arc::new(Kernel { id, pipeline: kernel.0, layout: kernel.1, slots, workgroup_size, bounded, generation: device.generation() });
    device.compiled.fetch_add(1, Ordering::Relaxed);
    device.kernels.lock().put(id, kernel.clone());
    Ok(kernel)
}

/// The bounded module, its slots, its workgroup size, whether it has loops.
type FrontEnd = (naga::Module, Vec<(u32, Slot)>, [u32; 3], bool);

/// Parses and validates on a thread with a large stack (naga's parser
/// recurses over the source's nesting), then checks bindings and bounds loops.
fn front_end(wgsl: &str, entry: &str) -> Result<FrontEnd, GpuError> {
    std::thread::scope(|s| {
        std::thread::Builder::new()
            .name("kiln-wgsl".into())
            .stack_size(64 << 20)
            .spawn_scoped(s, || parse_and_check(wgsl, entry))
            .map_err(|e| GpuError::Driver(format!("cannot start the WGSL compiler thread: {e}")))?
            .join()
            .map_err(|_| GpuError::InvalidKernel("the WGSL front end failed".into()))?
    })
}

fn parse_and_check(wgsl: &str, entry: &str) -> Result<FrontEnd, GpuError> {
    let mut module = naga::front::wgsl::parse_str(wgsl).map_err(|e| GpuError::InvalidKernel(e.emit_to_string(wgsl)))?;
    let info = Validator::new(ValidationFlags::all(), Capabilities::empty()).validate(&module).map_err(|e| GpuError::InvalidKernel(e.emit_to_string(wgsl)))?;
    let (index, point) = module
        .entry_points
        .iter()
        .enumerate()
        .find(|(_, e)| e.name == entry && e.stage == naga::ShaderStage::Compute)
        .ok_or_else(|| GpuError::InvalidKernel(format!("no @compute entry point `{entry}`")))?;
    let workgroup_size = point.workgroup_size;
    let uses = info.get_entry_point(index);
    let mut slots = Vec::new();
    for (handle, global) in module.global_variables.iter() {
        if uses[handle].is_empty() {
            continue;
        }
        let Some(binding) = &global.binding else { continue };
        if binding.binding >= loops::BUDGET_BINDING {
            return Err(GpuError::InvalidKernel(format!("@binding({}): kernels bind below {} (the host's own above)", binding.binding, loops::BUDGET_BINDING)));
        }
        if binding.group != 0 {
            return Err(GpuError::InvalidKernel(format!("binding {} of group {}: kernels bind only @group(0)", binding.binding, binding.group)));
        }
        let slot = match global.space {
            naga::AddressSpace::Uniform if binding.binding == 0 => Slot::Uniform,
            naga::AddressSpace::Storage { access } => Slot::Storage { writable: access.contains(naga::StorageAccess::STORE) },
            _ => return Err(GpuError::InvalidKernel(format!("@binding({}): kernels bind storage buffers, and uniforms at binding 0 only", binding.binding))),
        };
        slots.push((binding.binding, slot));
    }
    slots.sort_by_key(|(i, _)| *i);
    let bounded = loops::bound_loops(&mut module).map_err(GpuError::InvalidKernel)? > 0;
    // The counter's value is the same in every invocation that runs the same
    // loops, so the new branches do not change uniformity; the source itself
    // was checked with every flag above.
    Validator::new(ValidationFlags::all() - ValidationFlags::CONTROL_FLOW_UNIFORMITY, Capabilities::empty())
        .validate(&module)
        .map_err(|e| GpuError::InvalidKernel(format!("after bounding loops: {e}")))?;
    Ok((module, slots, workgroup_size, bounded))
}
