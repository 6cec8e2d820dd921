// ComfyUI's conversion before encoding, `uint8(clip(255·v, 0, 255))`
// (truncation; NaN becomes 0), as kiln-kernels' `convert::to_u8`, of the
// `count` values from `base`, four bytes per u32 word (little-endian), for
// the band of words first..end. A read-back then moves a quarter of the bytes.
// src is bound from value src_start on, dst from word dst_start on.
struct Params { first: u32, end: u32, groups_x: u32, base: u32, count: u32, src_start: u32, dst_start: u32 }
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read_write> dst: array<u32>;

fn byte_of(v: f32) -> u32 {
    let x = v * 255.0;
    // NaN compares unequal to itself.
    let finite = select(0.0, x, x == x);
    return u32(clamp(finite, 0.0, 255.0));
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let w = p.first + (wg.y * p.groups_x + wg.x) * 256u + li;
    if (w >= p.end) { return; }
    var word = 0u;
    for (var k = 0u; k < 4u; k++) {
        let at = w * 4u + k;
        if (at < p.count) { word = word | (byte_of(src[p.base + at - p.src_start]) << (8u * k)); }
    }
    dst[w - p.dst_start] = word;
}
