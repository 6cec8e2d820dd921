//! GPU versions of the pixel nodes that have no host kernel: ImageBlend,
//! ImageCompositeMasked, ThresholdMask, MaskComposite, GrowMask, FeatherMask. Each takes the common case (shapes
//! that need no resize or channel change) to the host's GPU through
//! [`kiln_sdk::gpu`], whose results stay on the device; `None` means "not
//! this case" and the node runs its CPU code, which it also does when no GPU
//! is available to it.

use kiln_sdk::Tensor;
use kiln_sdk::gpu::{GpuError, GpuKernel, Uniforms, groups_for, prefers, run_or_cpu};
use kiln_sdk::prelude::*;

const BLEND: GpuKernel = GpuKernel { wgsl: include_str!("blend.wgsl"), entry: "main" };
const COMPOSITE: GpuKernel = GpuKernel { wgsl: include_str!("composite.wgsl"), entry: "main" };
const THRESHOLD: GpuKernel = GpuKernel { wgsl: include_str!("threshold.wgsl"), entry: "main" };
const MASK_COMPOSITE: GpuKernel = GpuKernel { wgsl: include_str!("mask_composite.wgsl"), entry: "main" };
const GROW: GpuKernel = GpuKernel { wgsl: include_str!("grow.wgsl"), entry: "main" };
const FEATHER: GpuKernel = GpuKernel { wgsl: include_str!("feather.wgsl"), entry: "main" };

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

/// ImageBlend when both images have the same channels and image2's batch
/// equals image1's or is 1. An image2 of another size is first resized to
/// image1's (bicubic, centre crop, as the CPU path does) by the host's
/// kernel, on the GPU when the blend will run there.
pub fn blend(i1: &Tensor, i2: &Tensor, factor: f32, mode: &str, cpu: impl FnOnce() -> Result<Tensor>) -> Option<Result<Tensor>> {
    let (s1, s2) = (shape_of(i1), shape_of(i2));
    let mode = BLEND_MODES.iter().position(|m| *m == mode)? as u32;
    if s1.len() != 4 || s2.len() != 4 || s1[3] != s2[3] || !(s2[0] == s1[0] || s2[0] == 1) {
        return None;
    }
    let len = len_of(&s1)?;
    let resized;
    let i2 = if s1[1..3] == s2[1..3] {
        i2
    } else {
        // Only worth it when the blend itself runs on the GPU; else the CPU
        // path resizes and blends in one go.
        if !prefers(u64::from(len), &[i1, i2]) {
            return None;
        }
        resized = match kiln_sdk::kernels::resize_image(i2, s1[2], s1[1], kiln_sdk::kernels::Resample::Bicubic, true) {
            Ok(t) => t,
            Err(e) => return Some(Err(e)),
        };
        &resized
    };
    let frame = len_of(&s1[1..])?;
    let (gx, gy) = groups_for(len as usize, GROUP);
    let uniforms = Uniforms::new().u32(len).u32(gx).u32(frame).u32(u32::from(s2[0] == 1 && s1[0] != 1)).f32(factor).u32(mode);
    Some(run_or_cpu(&BLEND, &[i1, i2], &s1, &uniforms, (gx, gy, 1), cpu))
}

/// ImageCompositeMasked when the source has the destination's channels. A
/// source to resize (`resize_source`) and a mask of another size than the
/// source are first resized (bilinear, as the CPU path does) by the host's
/// kernels, on the GPU when the composite will run there.
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
    use kiln_sdk::kernels::{Resample, resize_image, resize_mask};
    let (d, s) = (shape_of(dst), shape_of(src));
    if d.len() != 4 || s.len() != 4 || d[3] != s[3] || mask.is_some_and(|m| shape_of(m).len() != 3) {
        return None;
    }
    let resize_src = resize_source && d[1..3] != s[1..3];
    let source_hw = if resize_src { &d[1..3] } else { &s[1..3] };
    let resize_msk = mask.is_some_and(|m| shape_of(m)[1..] != *source_hw);
    if (resize_src || resize_msk) && !prefers(u64::from(len_of(&d)?), &[dst, src]) {
        return None;
    }
    let (resized_src, resized_mask);
    let src = if resize_src {
        resized_src = match resize_image(src, d[2], d[1], Resample::Bilinear, false) {
            Ok(t) => t,
            Err(e) => return Some(Err(e)),
        };
        &resized_src
    } else {
        src
    };
    let s = shape_of(src);
    let mask = match mask {
        Some(m) if resize_msk => {
            resized_mask = match resize_mask(m, s[2], s[1], Resample::Bilinear) {
                Ok(t) => t,
                Err(e) => return Some(Err(e)),
            };
            Some(&resized_mask)
        }
        other => other,
    };
    let m = mask.map(shape_of);
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

/// GrowMask over a `B×H×W` mask: |expand| steps (at most H + W: more change
/// nothing), one dispatch each, every step reading the last one's result on
/// the device. Two tensors take turns as input and output, so the node holds
/// (and is charged for) two masks' worth however many steps. `None` for
/// `expand` 0 (the mask itself).
pub fn grow(mask: &Tensor, expand: i64, tapered: bool, cpu: impl FnOnce() -> Result<Tensor>) -> Option<Result<Tensor>> {
    let shape = shape_of(mask);
    if shape.len() != 3 || expand == 0 {
        return None;
    }
    let steps = expand.unsigned_abs().min(shape[1].saturating_add(shape[2]) as u64);
    let len = len_of(&shape)?;
    let (gx, gy) = groups_for(len as usize, GROUP);
    let dims: Vec<u32> = shape.iter().map(|&d| u32::try_from(d).ok()).collect::<Option<_>>()?;
    let fields = [len, gx, dims[1], dims[2], u32::from(expand > 0), u32::from(tapered), 0, 0];
    let uniforms = fields.iter().fold(Uniforms::new(), |u, &v| u.u32(v));
    if !prefers(u64::from(len), &[mask]) {
        return Some(cpu());
    }
    match grow_steps(mask, &dims, steps, &uniforms, (gx, gy, 1)) {
        Ok(out) => Some(Ok(out)),
        Err(GpuError::Unavailable | GpuError::DeviceLost) => Some(cpu()),
        Err(e) => Some(Err(e.into())),
    }
}

/// `steps` (≥ 1) GrowMask steps from `mask` through two device tensors:
/// step `k` writes turn `k % 2`, reading the other (or `mask` first).
fn grow_steps(mask: &Tensor, dims: &[u32], steps: u64, uniforms: &Uniforms, groups: (u32, u32, u32)) -> std::result::Result<Tensor, GpuError> {
    use kiln_sdk::bindings::kiln::plugin::gpu as wit;
    let kernel = wit::compile(GROW.wgsl, GROW.entry)?;
    let turns = [wit::allocate(dims)?, wit::allocate(dims)?];
    for step in 0..steps {
        let out = &turns[usize::from(!step.is_multiple_of(2))];
        let input = if step == 0 { mask } else { &turns[usize::from(step.is_multiple_of(2))] };
        let bindings =
            [wit::Binding { index: 1, tensor: input, access: wit::Access::Read }, wit::Binding { index: 2, tensor: out, access: wit::Access::ReadWrite }];
        wit::dispatch(&kernel, &bindings, uniforms.bytes(), groups)?;
    }
    let [even, odd] = turns;
    Ok(if (steps - 1).is_multiple_of(2) { even } else { odd })
}

/// FeatherMask over a `B×H×W` mask (each ramp at most the side it runs along).
pub fn feather(mask: &Tensor, left: usize, top: usize, right: usize, bottom: usize, cpu: impl FnOnce() -> Result<Tensor>) -> Option<Result<Tensor>> {
    let shape = shape_of(mask);
    if shape.len() != 3 {
        return None;
    }
    let (h, w) = (shape[1], shape[2]);
    let len = len_of(&shape)?;
    let (gx, gy) = groups_for(len as usize, GROUP);
    let sides = [h, w, left.min(w), top.min(h), right.min(w), bottom.min(h)];
    let mut uniforms = Uniforms::new().u32(len).u32(gx);
    for side in sides {
        uniforms = uniforms.u32(u32::try_from(side).ok()?);
    }
    Some(run_or_cpu(&FEATHER, &[mask], &shape, &uniforms, (gx, gy, 1), cpu))
}
