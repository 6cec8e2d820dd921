//! GPU versions of the pixel nodes that have no host kernel: ImageBlend,
//! ImageCompositeMasked, ThresholdMask, MaskComposite. Each takes the common case (shapes
//! that need no resize or channel change) to the host's GPU through
//! [`kiln_sdk::gpu`], whose results stay on the device; `None` means "not
//! this case" and the node runs its CPU code, which it also does when no GPU
//! is available to it.

use kiln_sdk::Tensor;
use kiln_sdk::gpu::{GpuKernel, Uniforms, groups_for, run_or_cpu};
use kiln_sdk::prelude::*;

const BLEND: GpuKernel = GpuKernel { wgsl: include_str!("blend.wgsl"), entry: "main" };
const COMPOSITE: GpuKernel = GpuKernel { wgsl: include_str!("composite.wgsl"), entry: "main" };
const THRESHOLD: GpuKernel = GpuKernel { wgsl: include_str!("threshold.wgsl"), entry: "main" };
const MASK_COMPOSITE: GpuKernel = GpuKernel { wgsl: include_str!("mask_composite.wgsl"), entry: "main" };

/// Threads per workgroup of the kernels here.
const GROUP: u32 = 256;

fn shape_of(t: &Tensor) -> Vec<usize> {
    t.shape().iter().map(|&d| d as usize).collect()
}

fn len_of(shape: &[usize]) -> Option<u32> {
    shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d)).and_then(|n| u32::try_from(n).ok())
}

/// The blend modes, in the kernel's numbering.
pub const BLEND_MODES: [&str; 6] = ["normal", "multiply", "screen", "overlay", "soft_light", "difference"];

/// ImageBlend when both images have the same size and channels and image2's
/// batch equals image1's or is 1.
pub fn blend(i1: &Tensor, i2: &Tensor, factor: f32, mode: &str, cpu: impl FnOnce() -> Result<Tensor>) -> Option<Result<Tensor>> {
    let (s1, s2) = (shape_of(i1), shape_of(i2));
    let mode = BLEND_MODES.iter().position(|m| *m == mode)? as u32;
    if s1.len() != 4 || s2.len() != 4 || s1[1..] != s2[1..] || !(s2[0] == s1[0] || s2[0] == 1) {
        return None;
    }
    let len = len_of(&s1)?;
    let frame = len_of(&s1[1..])?;
    let (gx, gy) = groups_for(len as usize, GROUP);
    let uniforms = Uniforms::new().u32(len).u32(gx).u32(frame).u32(u32::from(s2[0] == 1 && s1[0] != 1)).f32(factor).u32(mode);
    Some(run_or_cpu(&BLEND, &[i1, i2], &s1, &uniforms, (gx, gy, 1), cpu))
}

/// ImageCompositeMasked when the source has the destination's channels and
/// needs no resize, and the mask (if any) has the source's size.
#[allow(clippy::too_many_arguments)]
pub fn composite(
    dst: &Tensor,
    src: &Tensor,
    mask: Option<&Tensor>,
    x: usize,
    y: usize,
    resize_source: bool,
    cpu: impl FnOnce() -> Result<Tensor>,
) -> Option<Result<Tensor>> {
    let (d, s) = (shape_of(dst), shape_of(src));
    if d.len() != 4 || s.len() != 4 || d[3] != s[3] || (resize_source && d[1..3] != s[1..3]) {
        return None;
    }
    let m = mask.map(shape_of);
    if let Some(m) = &m
        && (m.len() != 3 || m[1..] != s[1..3])
    {
        return None;
    }
    let vis_w = s[2].min(d[2].saturating_sub(x));
    let vis_h = s[1].min(d[1].saturating_sub(y));
    if vis_w == 0 || vis_h == 0 {
        return None;
    }
    let len = len_of(&d)?;
    let (gx, gy) = groups_for(len as usize, GROUP);
    let fields = [
        len,
        gx,
        d[3] as u32,
        d[1] as u32,
        d[2] as u32,
        s[1] as u32,
        s[2] as u32,
        s[0] as u32,
        u32::try_from(x).ok()?,
        u32::try_from(y).ok()?,
        vis_w as u32,
        vis_h as u32,
    ];
    let mut uniforms = fields.iter().fold(Uniforms::new(), |u, &v| u.u32(v));
    uniforms = uniforms.u32(m.as_ref().map_or(1, |m| m[0] as u32)).u32(u32::from(mask.is_some())).u32(0).u32(0);
    let placeholder;
    let mask = match mask {
        Some(mask) => mask,
        None => {
            placeholder = match kiln_sdk::bindings::kiln::plugin::tensors::create(&[1], &[1.0]) {
                Ok(t) => t,
                Err(_) => return None,
            };
            &placeholder
        }
    };
    Some(run_or_cpu(&COMPOSITE, &[dst, src, mask], &d, &uniforms, (gx, gy, 1), cpu))
}

/// ThresholdMask over a `B×H×W` mask.
pub fn threshold(mask: &Tensor, value: f32, cpu: impl FnOnce() -> Result<Tensor>) -> Option<Result<Tensor>> {
    let shape = shape_of(mask);
    if shape.len() != 3 {
        return None;
    }
    let len = len_of(&shape)?;
    let (gx, gy) = groups_for(len as usize, GROUP);
    let uniforms = Uniforms::new().u32(len).u32(gx).f32(value).u32(0);
    Some(run_or_cpu(&THRESHOLD, &[mask], &shape, &uniforms, (gx, gy, 1), cpu))
}

/// MaskComposite's operations, in the kernel's numbering.
pub const MASK_OPS: [&str; 6] = ["multiply", "add", "subtract", "and", "or", "xor"];

/// MaskComposite when the source's batch is 1 or the destination's.
pub fn mask_composite(dst: &Tensor, src: &Tensor, x: usize, y: usize, op: &str, cpu: impl FnOnce() -> Result<Tensor>) -> Option<Result<Tensor>> {
    let (d, s) = (shape_of(dst), shape_of(src));
    let op = MASK_OPS.iter().position(|o| *o == op)? as u32;
    if d.len() != 3 || s.len() != 3 || !(s[0] == 1 || s[0] == d[0]) {
        return None;
    }
    let vis_w = s[2].min(d[2].saturating_sub(x));
    let vis_h = s[1].min(d[1].saturating_sub(y));
    let len = len_of(&d)?;
    let (gx, gy) = groups_for(len as usize, GROUP);
    let fields = [
        len,
        gx,
        u32::try_from(d[1]).ok()?,
        u32::try_from(d[2]).ok()?,
        u32::try_from(s[1]).ok()?,
        u32::try_from(s[2]).ok()?,
        u32::from(s[0] == 1),
        u32::try_from(x).ok()?,
        u32::try_from(y).ok()?,
        u32::try_from(vis_w).ok()?,
        u32::try_from(vis_h).ok()?,
        op,
    ];
    let uniforms = fields.iter().fold(Uniforms::new(), |u, &v| u.u32(v));
    Some(run_or_cpu(&MASK_COMPOSITE, &[dst, src], &d, &uniforms, (gx, gy, 1), cpu))
}
