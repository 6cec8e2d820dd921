// ThresholdMask: 1 where m > value, else 0 (compared in f32).
struct P { len: u32, groups_x: u32, value: f32, pad: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read_write> dst: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let i = (wg.y * p.groups_x + wg.x) * 256u + li;
    if (i >= p.len) { return; }
    dst[i] = select(0.0, 1.0, src[i] > p.value);
}
