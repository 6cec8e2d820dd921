// ImageBlend: clamp(a·(1−f) + mode(a, b)·f, 0, 1); image2 broadcasts when its batch is 1.
struct P { len: u32, groups_x: u32, frame: u32, broadcast: u32, factor: f32, mode: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> i1: array<f32>;
@group(0) @binding(2) var<storage, read> i2: array<f32>;
@group(0) @binding(3) var<storage, read_write> dst: array<f32>;

fn blended(a: f32, b: f32) -> f32 {
    switch p.mode {
        case 0u: { return b; }
        case 1u: { return a * b; }
        case 2u: { return 1.0 - (1.0 - a) * (1.0 - b); }
        case 3u: { if (a <= 0.5) { return 2.0 * a * b; } return 1.0 - 2.0 * (1.0 - a) * (1.0 - b); }
        case 4u: {
            var g = sqrt(a);
            if (a <= 0.25) { g = ((16.0 * a - 12.0) * a + 4.0) * a; }
            if (b <= 0.5) { return a - (1.0 - 2.0 * b) * a * (1.0 - a); }
            return a + (2.0 * b - 1.0) * (g - a);
        }
        default: { return a - b; }
    }
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let i = (wg.y * p.groups_x + wg.x) * 256u + li;
    if (i >= p.len) { return; }
    var j = i;
    if (p.broadcast == 1u) { j = i % p.frame; }
    let a = i1[i];
    dst[i] = clamp(a * (1.0 - p.factor) + blended(a, i2[j]) * p.factor, 0.0, 1.0);
}
