// Resampling by tap tables (kiln-kernels' resample taps): each output value
// is the weighted sum over its row taps × column taps of the (cropped) source.
// `tables` holds, as words: x indices, x weights (ow·nx each), then
// y indices, y weights (oh·ny each); weights are f32 bits. For the band of
// values first..end. src is bound from value src_start on (the rows the band's
// taps read), dst from dst_start on (the band's own values).
struct Params {
    first: u32, end: u32, groups_x: u32, channels: u32,
    in_height: u32, in_width: u32, x0: u32, y0: u32,
    out_height: u32, out_width: u32, nx: u32, ny: u32,
    src_start: u32, dst_start: u32,
}
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read> tables: array<u32>;
@group(0) @binding(3) var<storage, read_write> dst: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let i = p.first + (wg.y * p.groups_x + wg.x) * 256u + li;
    if (i >= p.end) { return; }
    let c = i % p.channels;
    let ox = (i / p.channels) % p.out_width;
    let oy = (i / (p.channels * p.out_width)) % p.out_height;
    let frame = i / (p.channels * p.out_width * p.out_height);
    let xs = p.out_width * p.nx;
    let ys = p.out_height * p.ny;
    var acc = 0.0;
    for (var ky = 0u; ky < p.ny; ky++) {
        let t = oy * p.ny + ky;
        let wy = bitcast<f32>(tables[2u * xs + ys + t]);
        if (wy == 0.0) { continue; }
        let sy = p.y0 + tables[2u * xs + t];
        let row = (frame * p.in_height + sy) * p.in_width;
        var line = 0.0;
        for (var kx = 0u; kx < p.nx; kx++) {
            let u = ox * p.nx + kx;
            let sx = p.x0 + tables[u];
            line += bitcast<f32>(tables[xs + u]) * src[(row + sx) * p.channels + c - p.src_start];
        }
        acc += wy * line;
    }
    dst[i - p.dst_start] = acc;
}
