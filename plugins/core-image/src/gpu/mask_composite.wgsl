// MaskComposite: the destination with the visible part of the source
// combined in at (x, y), clamped to 0..1. Logic operations compare values
// rounded half to even (WGSL's round, as torch rounds). A one-mask source
// applies to every destination mask.
struct P {
    len: u32, groups_x: u32, dh: u32, dw: u32,
    sh: u32, sw: u32, one_source: u32, x: u32,
    y: u32, vis_w: u32, vis_h: u32, op: u32,
}
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> dst: array<f32>;
@group(0) @binding(2) var<storage, read> src: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

fn truthy(v: f32) -> bool { return round(v) != 0.0; }

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let i = (wg.y * p.groups_x + wg.x) * 256u + li;
    if (i >= p.len) { return; }
    let frame = p.dh * p.dw;
    let b = i / frame;
    let r = (i % frame) / p.dw;
    let c = i % p.dw;
    var v = dst[i];
    if (r >= p.y && c >= p.x && r - p.y < p.vis_h && c - p.x < p.vis_w) {
        let sb = select(b, 0u, p.one_source == 1u);
        let s = src[(sb * p.sh + (r - p.y)) * p.sw + (c - p.x)];
        switch p.op {
            case 0u: { v = v * s; }
            case 1u: { v = v + s; }
            case 2u: { v = v - s; }
            case 3u: { v = select(0.0, 1.0, truthy(v) && truthy(s)); }
            case 4u: { v = select(0.0, 1.0, truthy(v) || truthy(s)); }
            default: { v = select(0.0, 1.0, truthy(v) != truthy(s)); }
        }
    }
    out[i] = clamp(v, 0.0, 1.0);
}
