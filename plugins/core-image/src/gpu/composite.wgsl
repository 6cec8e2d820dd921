// ImageCompositeMasked: the source over the destination at (x, y) on the
// visible region, through the mask when `has_mask` (else a copy; the mask
// binding then holds one unused value).
struct P {
    len: u32, groups_x: u32, channels: u32, dst_h: u32,
    dst_w: u32, src_h: u32, src_w: u32, src_b: u32,
    x: u32, y: u32, vis_w: u32, vis_h: u32,
    mask_b: u32, has_mask: u32, pad1: u32, pad2: u32,
}
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> dst_in: array<f32>;
@group(0) @binding(2) var<storage, read> src: array<f32>;
@group(0) @binding(3) var<storage, read> mask: array<f32>;
@group(0) @binding(4) var<storage, read_write> dst: array<f32>;

struct At { inside: bool, s: u32, m: u32 }

fn locate(i: u32) -> At {
    let ch = i % p.channels;
    let xx = (i / p.channels) % p.dst_w;
    let yy = (i / (p.channels * p.dst_w)) % p.dst_h;
    let b = i / (p.channels * p.dst_w * p.dst_h);
    var at = At(false, 0u, 0u);
    if (xx >= p.x && xx < p.x + p.vis_w && yy >= p.y && yy < p.y + p.vis_h) {
        let sx = xx - p.x;
        let sy = yy - p.y;
        at.inside = true;
        at.s = (((b % p.src_b) * p.src_h + sy) * p.src_w + sx) * p.channels + ch;
        at.m = ((b % max(p.mask_b, 1u)) * p.src_h + sy) * p.src_w + sx;
    }
    return at;
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let i = (wg.y * p.groups_x + wg.x) * 256u + li;
    if (i >= p.len) { return; }
    let at = locate(i);
    var v = dst_in[i];
    if (at.inside) {
        if (p.has_mask == 1u) {
            let m = mask[at.m];
            v = m * src[at.s] + (1.0 - m) * v;
        } else {
            v = src[at.s];
        }
    }
    dst[i] = v;
}
