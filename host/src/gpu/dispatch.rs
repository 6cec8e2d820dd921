//! Running a kernel: the bindings and sizes it is given are checked against
//! what it declares and the host's bounds, then it is submitted inside error
//! scopes and waited for until the node's deadline. A plugin's dispatch is
//! one submission; the host's own kernels submit theirs band by band
//! ([`super::ops`]) and stop between bands at the node's [`Cutoff`].

use std::ops::Range;
use std::time::Instant;

use super::device::{FirstWrite, Pooled, check_binding};
use super::kernel::{Kernel, Slot};
use super::pool::Usage;
use super::{Device, DeviceBuffer, GpuError, GpuLimits};

/// Largest uniform block, bytes.
pub const MAX_UNIFORM_BYTES: usize = 64 << 10;

/// A tensor bound to `@binding(index)`; `writable` when the caller may let
/// the kernel write it; `window`: the values bound (the host's kernels bind
/// a window per band, see [`super::ops`]), else the whole tensor.
pub struct Bound<'a> {
    pub index: u32,
    pub buffer: &'a DeviceBuffer,
    pub writable: bool,
    pub window: Option<Range<usize>>,
}

impl<'a> Bound<'a> {
    /// `buffer` bound whole at `index`.
    pub fn whole(index: u32, buffer: &'a DeviceBuffer, writable: bool) -> Bound<'a> {
        Bound { index, buffer, writable, window: None }
    }

    /// Checks that the binding fits the device: a window inside the tensor,
    /// starting at the device's binding alignment, and no more bytes than
    /// one binding may span.
    fn check(&self, device: &Device) -> Result<(), GpuError> {
        let Some(window) = &self.window else {
            return check_binding(self.buffer.len() as u64 * 4, device.max_binding_bytes());
        };
        let aligned = (window.start as u64 * 4).is_multiple_of(device.binding_alignment());
        if window.is_empty() || window.end > self.buffer.len() || !aligned {
            return Err(GpuError::InvalidDispatch(format!("values {window:?} of a {}-value tensor cannot be bound", self.buffer.len())));
        }
        check_binding(window.len() as u64 * 4, device.max_binding_bytes())
    }
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
            [b] => b.check(device)?,
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

/// One dispatch of a kernel: the tensors it binds, its uniform bytes and
/// its workgroups.
pub struct Dispatch<'a> {
    pub kernel: &'a Kernel,
    pub bindings: &'a [Bound<'a>],
    pub uniforms: &'a [u8],
    pub groups: (u32, u32, u32),
}

/// When a node's GPU work must stop: every wait ends at its `deadline`, and
/// the host's kernels ask [`Cutoff::reached`] between bands (the node's
/// deadline or its cancellation).
#[derive(Clone, Copy)]
pub struct Cutoff<'a> {
    pub deadline: Instant,
    pub cancelled: &'a dyn Fn() -> bool,
}

fn never_cancelled() -> bool {
    false
}

impl Cutoff<'static> {
    /// A cutoff at `deadline` only.
    pub fn at(deadline: Instant) -> Cutoff<'static> {
        Cutoff { deadline, cancelled: &never_cancelled }
    }
}

impl Cutoff<'_> {
    /// Whether the work should stop now.
    pub fn reached(&self) -> bool {
        (self.cancelled)() || Instant::now() >= self.deadline
    }
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
    match submit(device, &[Dispatch { kernel, bindings, uniforms, groups }], limits, When::Now)? {
        Some(submission) => device.wait(submission, deadline),
        None => Ok(()),
    }
}

/// When dispatches reach the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    /// In a submission of their own, now.
    Now,
    /// Recorded, and submitted with the device's next submission (small
    /// work only: see `super::batch`).
    WithNext,
    /// Recorded, and submitted at once when the GPU has nothing else to do
    /// (work that an idle GPU should not wait on), else with the next
    /// submission.
    Soon,
}

/// Checks every dispatch (see [`check`]), then submits them as one
/// submission (or records them, `when` says), in order (each sees what the
/// previous ones wrote), inside error scopes; does not wait. `None`:
/// nothing was submitted now (no workgroups, or recorded).
pub fn submit(device: &Device, dispatches: &[Dispatch<'_>], limits: &GpuLimits, when: When) -> Result<Option<wgpu::SubmissionIndex>, GpuError> {
    for d in dispatches {
        check(device, d.kernel, d.bindings, d.uniforms, d.groups, limits)?;
    }
    let dispatches: Vec<&Dispatch<'_>> = dispatches.iter().filter(|d| d.groups.0 > 0 && d.groups.1 > 0 && d.groups.2 > 0).collect();
    if dispatches.is_empty() {
        return Ok(None);
    }
    let mut uniforms = Vec::new();
    let submission = device.scoped(|| -> Result<Option<wgpu::SubmissionIndex>, GpuError> {
        let mut groups = Vec::with_capacity(dispatches.len());
        for d in &dispatches {
            groups.push(bind_group(device, d, limits, &mut uniforms)?);
        }
        let encode = |encoder: &mut wgpu::CommandEncoder| {
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
            for (d, group) in dispatches.iter().zip(&groups) {
                pass.set_pipeline(&d.kernel.pipeline);
                if let Some(group) = group {
                    pass.set_bind_group(0, group, &[]);
                }
                pass.dispatch_workgroups(d.groups.0, d.groups.1, d.groups.2);
            }
        };
        match when {
            When::Now => {
                let mut encoder = device.device.create_command_encoder(&wgpu::CommandEncoderDescriptor::default());
                encode(&mut encoder);
                Ok(Some(device.submit([encoder.finish()])))
            }
            When::WithNext | When::Soon => {
                device.record(dispatches.len() as u32, when == When::Soon, encode);
                Ok(None)
            }
        }
    });
    // Reusable once submitted (later writes to them run after): recorded
    // commands keep them parked until then.
    for u in uniforms {
        device.recycle(u);
    }
    submission?
}

/// Writes a uniform block into a pooled buffer kept in `uniforms`: its index
/// there and its size (padded to 16 bytes with zeros: blocks are read whole).
fn uniform_block(device: &Device, bytes: &[u8], uniforms: &mut Vec<Pooled>) -> Result<(usize, usize), GpuError> {
    let mut padded = bytes.to_vec();
    padded.resize(bytes.len().next_multiple_of(16), 0);
    let pooled = device.buffer(Usage::Uniform, padded.len() as u64, FirstWrite::Queue)?;
    device.queue.write_buffer(&pooled.buffer, 0, &padded);
    uniforms.push(pooled);
    Ok((uniforms.len() - 1, padded.len()))
}

/// The bind group of one dispatch: its tensors, its uniforms and (for a
/// kernel with loops) its loop budget, the uniform blocks in pooled buffers
/// (kept in `uniforms` until submitted). Runs inside [`Device::scoped`].
fn bind_group(device: &Device, d: &Dispatch<'_>, limits: &GpuLimits, uniforms: &mut Vec<Pooled>) -> Result<Option<wgpu::BindGroup>, GpuError> {
    let uniform = if d.uniforms.is_empty() { None } else { Some(uniform_block(device, d.uniforms, uniforms)?) };
    // A kernel with loops reads its per-invocation budget (see `loops`).
    let budget = if d.kernel.bounded {
        let value = loop_budget(limits, invocations(d.kernel, d.groups));
        Some(uniform_block(device, &value.to_le_bytes(), uniforms)?)
    } else {
        None
    };
    let block = |(at, len): (usize, usize)| {
        wgpu::BindingResource::Buffer(wgpu::BufferBinding { buffer: &uniforms[at].buffer, offset: 0, size: std::num::NonZeroU64::new(len as u64) })
    };
    let mut entries: Vec<wgpu::BindGroupEntry<'_>> =
        d.bindings.iter().map(|b| wgpu::BindGroupEntry { binding: b.index, resource: b.buffer.binding(b.window.as_ref()) }).collect();
    if let Some(b) = budget {
        entries.push(wgpu::BindGroupEntry { binding: super::loops::BUDGET_BINDING, resource: block(b) });
    }
    if let Some(u) = uniform {
        entries.push(wgpu::BindGroupEntry { binding: 0, resource: block(u) });
    }
    Ok(d.kernel.layout.as_ref().map(|layout| device.device.create_bind_group(&wgpu::BindGroupDescriptor { label: None, layout, entries: &entries })))
}
