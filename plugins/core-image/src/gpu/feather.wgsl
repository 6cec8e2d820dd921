// FeatherMask: each value scaled by its column's and its row's ramps, as
// `nodes::mask::feather_mask` applies them on the CPU (ComfyUI's quirk kept:
// the right and bottom ramps' first step lands on column / row 0).
struct P { len: u32, groups_x: u32, height: u32, width: u32, left: u32, top: u32, right: u32, bottom: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read_write> dst: array<f32>;

// The scale of position `at` of `n` under a ramp of `near` steps from the
// start and `far` steps from the end.
fn ramps(at: u32, n: u32, near: u32, far: u32) -> f32 {
    var rate = 1.0;
    if (at < near) { rate *= f32(at + 1u) / f32(near); }
    if (far > 0u) {
        if (at == 0u) { rate *= 1.0 / f32(far); }
        if (at >= 1u && n - at < far) { rate *= f32(n - at + 1u) / f32(far); }
    }
    return rate;
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let i = (wg.y * p.groups_x + wg.x) * 256u + li;
    if (i >= p.len) { return; }
    let x = i % p.width;
    let y = (i / p.width) % p.height;
    dst[i] = src[i] * ramps(x, p.width, p.left, p.right) * ramps(y, p.height, p.top, p.bottom);
}
