//! Running a kernel: the bindings and sizes it is given are checked against
//! what it declares and the host's bounds, then it is submitted inside error
//! scopes and waited for until the node's deadline.

use std::time::Instant;

use super::kernel::{Kernel, Slot};
use super::{Device, DeviceBuffer, GpuError, GpuLimits};

/// Largest uniform block, bytes.
pub const MAX_UNIFORM_BYTES: usize = 64 << 10;

/// A tensor bound to `@binding(index)`; `writable` when the caller may let
/// the kernel write it.
pub struct Bound<'a> {
    pub index: u32,
    pub buffer: &'a DeviceBuffer,
    pub writable: bool,
}

/// Checks everything a dispatch is given before any GPU work.
pub fn check(device: &Device, kernel: &Kernel, bindings: &[Bound<'_>], uniforms: &[u8], groups: (u32, u32, u32), limits: &GpuLimits) -> Result<(), GpuError> {
    let refuse = |m: String| Err(GpuError::InvalidDispatch(m));
    if kernel.generation != device.generation() {
        return Err(GpuError::DeviceLost);
    }
    let (x, y, z) = groups;
    if [x, y, z].iter().any(|&d| d > limits.max_workgroups_per_dim) {
        return refuse(format!("{x}×{y}×{z} workgroups: at most {} per dimension", limits.max_workgroups_per_dim));
    }
    let invocations = invocations(kernel, groups);
    if invocations > limits.max_invocations {
        return refuse(format!("{invocations} invocations: at most {} per dispatch (gpu_max_invocations)", limits.max_invocations));
    }
    let wants_uniform = kernel.slots.iter().any(|(_, s)| *s == Slot::Uniform);
    if uniforms.len() > MAX_UNIFORM_BYTES {
        return refuse(format!("{} bytes of uniforms: at most {MAX_UNIFORM_BYTES}", uniforms.len()));
    }
    if wants_uniform == uniforms.is_empty() {
        return refuse(if wants_uniform {
            "the kernel reads uniforms at binding 0 but none were given".into()
        } else {
            "uniforms were given but the kernel declares none at binding 0".into()
        });
    }
    for (index, slot) in &kernel.slots {
        let Slot::Storage { writable } = *slot else { continue };
        let given: Vec<&Bound<'_>> = bindings.iter().filter(|b| b.index == *index).collect();
        match given.as_slice() {
            [] => return refuse(format!("the kernel reads @binding({index}) but no tensor is bound there")),
            [b] if writable && !b.writable => {
                return refuse(format!("@binding({index}) is read_write in the kernel: bind a tensor this node allocated, as read-write"));
            }
            [b] if b.buffer.device().generation() != device.generation() => return Err(GpuError::DeviceLost),
            [_] => {}
            _ => return refuse(format!("@binding({index}) is bound twice")),
        }
    }
    if let Some(extra) = bindings.iter().find(|b| !kernel.slots.iter().any(|(i, s)| *i == b.index && matches!(s, Slot::Storage { .. }))) {
        return refuse(format!("@binding({}) is not a storage buffer the kernel uses", extra.index));
    }
    Ok(())
}

/// Invocations of `kernel` over `groups`.
fn invocations(kernel: &Kernel, (x, y, z): (u32, u32, u32)) -> u64 {
    u64::from(x).saturating_mul(u64::from(y)).saturating_mul(u64::from(z)).saturating_mul(kernel.invocations_per_group())
}

/// Loop iterations each of `invocations` may run: the dispatch's cap shared
/// out, at most `loop_budget`, at least 1.
pub fn loop_budget(limits: &GpuLimits, invocations: u64) -> u32 {
    let share = limits.max_dispatch_iterations / invocations.max(1);
    u32::try_from(share.clamp(1, u64::from(limits.loop_budget.max(1)))).unwrap_or(u32::MAX)
}

/// Runs `kernel` (after [`check`]) and waits for it until `deadline`.
pub fn run(
    device: &Device,
    kernel: &Kernel,
    bindings: &[Bound<'_>],
    uniforms: &[u8],
    groups: (u32, u32, u32),
    limits: &GpuLimits,
    deadline: Instant,
) -> Result<(), GpuError> {
    check(device, kernel, bindings, uniforms, groups, limits)?;
    if groups.0 == 0 || groups.1 == 0 || groups.2 == 0 {
        return Ok(());
    }
    let submission = device.scoped(|| {
        // Uniform blocks are read whole: pad to 16 bytes with zeros.
        let uniform = (!uniforms.is_empty()).then(|| {
            let mut bytes = uniforms.to_vec();
            bytes.resize(uniforms.len().next_multiple_of(16), 0);
            let buffer = device.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("uniforms"),
                size: bytes.len() as u64,
                usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            device.queue.write_buffer(&buffer, 0, &bytes);
            buffer
        });
        // A kernel with loops reads its per-invocation budget (see `loops`).
        let budget = kernel.bounded.then(|| {
            let value = loop_budget(limits, invocations(kernel, groups));
            let buffer = device.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("loop budget"),
                size: 16,
                usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            let mut bytes = [0u8; 16];
            bytes[..4].copy_from_slice(&value.to_le_bytes());
            device.queue.write_buffer(&buffer, 0, &bytes);
            buffer
        });
        let mut entries: Vec<wgpu::BindGroupEntry<'_>> =
            bindings.iter().map(|b| wgpu::BindGroupEntry { binding: b.index, resource: b.buffer.buffer.as_entire_binding() }).collect();
        if let Some(b) = &budget {
            entries.push(wgpu::BindGroupEntry { binding: super::loops::BUDGET_BINDING, resource: b.as_entire_binding() });
        }
        if let Some(u) = &uniform {
            entries.push(wgpu::BindGroupEntry { binding: 0, resource: u.as_entire_binding() });
        }
        let group = kernel.layout.as_ref().map(|layout| device.device.create_bind_group(&wgpu::BindGroupDescriptor { label: None, layout, entries: &entries }));
        let mut encoder = device.device.create_command_encoder(&wgpu::CommandEncoderDescriptor::default());
        {
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
            pass.set_pipeline(&kernel.pipeline);
            if let Some(group) = &group {
                pass.set_bind_group(0, group, &[]);
            }
            pass.dispatch_workgroups(groups.0, groups.1, groups.2);
        }
        device.queue.submit([encoder.finish()])
    })?;
    device.wait(submission, deadline)
}
