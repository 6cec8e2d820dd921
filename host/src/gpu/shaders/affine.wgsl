// dst[i] = scale * src[i] + offset (kiln-kernels' convert::affine), for the
// band of values first..end, bound from value `base` on (src and dst share
// the band's window).
struct Params { first: u32, end: u32, groups_x: u32, scale: f32, offset: f32, base: u32 }
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read_write> dst: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let i = p.first + (wg.y * p.groups_x + wg.x) * 256u + li;
    if (i >= p.end) { return; }
    dst[i - p.base] = p.scale * src[i - p.base] + p.offset;
}
