// Separable convolution with torch's reflect padding (kiln-kernels'
// convolve::separable): `vertical` sums rows into `tmp`, `horizontal` sums
// columns of `tmp` and applies the finish (0: blur, 1: sharpen); both for the
// band of values first..end (whole rows). src is bound from value src_start on
// (the band's rows and `radius` more either side), tmp and dst from
// band_start on (the band's own values).
struct Params {
    first: u32, end: u32, groups_x: u32, height: u32, width: u32, channels: u32, radius: u32, finish: u32, strength: f32,
    src_start: u32, band_start: u32,
}
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read> taps: array<f32>;
@group(0) @binding(3) var<storage, read_write> tmp: array<f32>;
@group(0) @binding(4) var<storage, read_write> dst: array<f32>;

fn reflect(i: i32, n: i32) -> u32 {
    if (i < 0) { return u32(-i); }
    if (i >= n) { return u32(2 * (n - 1) - i); }
    return u32(i);
}

fn index(wg: vec3<u32>, li: u32) -> u32 {
    return p.first + (wg.y * p.groups_x + wg.x) * 256u + li;
}

@compute @workgroup_size(256)
fn vertical(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let i = index(wg, li);
    if (i >= p.end) { return; }
    let row = p.width * p.channels;
    let within = i % row;
    let y = (i / row) % p.height;
    let frame = i / (row * p.height);
    var acc = 0.0;
    let n = 2u * p.radius + 1u;
    for (var j = 0u; j < n; j++) {
        let sy = reflect(i32(y) + i32(j) - i32(p.radius), i32(p.height));
        acc += taps[j] * src[(frame * p.height + sy) * row + within - p.src_start];
    }
    tmp[i - p.band_start] = acc;
}

@compute @workgroup_size(256)
fn horizontal(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let i = index(wg, li);
    if (i >= p.end) { return; }
    let c = i % p.channels;
    let x = (i / p.channels) % p.width;
    let row_start = i - (i % (p.width * p.channels));
    var acc = 0.0;
    let n = 2u * p.radius + 1u;
    for (var j = 0u; j < n; j++) {
        let sx = reflect(i32(x) + i32(j) - i32(p.radius), i32(p.width));
        acc += taps[j] * tmp[row_start + sx * p.channels + c - p.band_start];
    }
    if (p.finish == 1u) {
        acc = clamp((1.0 + p.strength) * src[i - p.src_start] - p.strength * acc, 0.0, 1.0);
    }
    dst[i - p.band_start] = acc;
}
