// GrowMask, one step: the max (dilate) or min (erode) over each value's 3×3
// neighbourhood inside the mask — a cross when tapered — as
// `nodes::mask::grow_mask` computes it on the CPU.
struct P { len: u32, groups_x: u32, height: u32, width: u32, dilate: u32, tapered: u32, pad0: u32, pad1: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read_write> dst: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let i = (wg.y * p.groups_x + wg.x) * 256u + li;
    if (i >= p.len) { return; }
    let x = i32(i % p.width);
    let y = i32((i / p.width) % p.height);
    let frame = i - (i % (p.width * p.height));
    var acc = src[i];
    for (var dy = -1; dy <= 1; dy++) {
        for (var dx = -1; dx <= 1; dx++) {
            let ny = y + dy;
            let nx = x + dx;
            let corner = dy != 0 && dx != 0;
            let outside = ny < 0 || nx < 0 || ny >= i32(p.height) || nx >= i32(p.width);
            if (!(outside || (corner && p.tapered != 0u))) {
                let v = src[frame + u32(ny) * p.width + u32(nx)];
                acc = select(min(acc, v), max(acc, v), p.dilate != 0u);
            }
        }
    }
    dst[i] = acc;
}
