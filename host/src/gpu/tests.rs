//! The GPU module against the CPU kernels and hostile kernels, on whatever
//! adapter this machine has (Mesa lavapipe in CI). Without an adapter the
//! tests say so and pass, unless `CI` is set: then a missing adapter fails.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kiln_kernels::Dims;
use kiln_kernels::convolve::{self, Finish, gaussian_1d};
use kiln_kernels::resample::{self, Method};

use super::dispatch::{Bound, run};
use super::kernel::compile;
use super::*;

fn gpu_with(limits: GpuLimits) -> Option<Arc<Gpu>> {
    match Gpu::start(GpuMode::Required, limits, None) {
        Ok(gpu) => gpu,
        Err(e) if std::env::var_os("CI").is_some() => panic!("CI needs a GPU adapter (Mesa lavapipe): {e}"),
        Err(e) => {
            eprintln!("skipped: {e}");
            None
        }
    }
}

fn gpu() -> Option<Arc<Gpu>> {
    gpu_with(GpuLimits::default())
}

fn never() -> bool {
    false
}

fn soon() -> Instant {
    Instant::now() + Duration::from_secs(60)
}

/// Deterministic pseudo-random values in 0..1.
fn pattern(n: usize, seed: u32) -> Vec<f32> {
    let mut x = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x >> 8) as f32 / (1u32 << 24) as f32
        })
        .collect()
}

fn assert_close(gpu: &[f32], cpu: &[f32], what: &str) {
    assert_eq!(gpu.len(), cpu.len(), "{what}: lengths");
    let worst = gpu.iter().zip(cpu).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    assert!(worst <= 1.0 / 255.0, "{what}: GPU differs from CPU by {worst}");
}

#[test]
fn affine_matches_the_cpu() {
    let Some(gpu) = gpu() else { return };
    let device = gpu.device().unwrap();
    let data = pattern(1000, 1);
    let src = device.upload(&data).unwrap();
    let out = ops::affine(&device, gpu.limits(), &src, -1.0, 1.0, soon()).unwrap().read().unwrap();
    let want = kiln_kernels::convert::affine(&data, -1.0, 1.0, &never).unwrap();
    assert_close(&out, &want, "invert");
}

#[test]
fn convolutions_match_the_cpu() {
    let Some(gpu) = gpu() else { return };
    let device = gpu.device().unwrap();
    for (dims, radius, finish) in [
        (Dims { batch: 2, height: 37, width: 53, channels: 3 }, 5, Finish::Blur),
        (Dims { batch: 1, height: 64, width: 40, channels: 4 }, 2, Finish::Sharpen(5.0)),
        (Dims { batch: 1, height: 9, width: 17, channels: 1 }, 8, Finish::Blur),
    ] {
        let data = pattern(dims.len().unwrap(), 2);
        let taps = gaussian_1d(radius, 1.5);
        let src = device.upload(&data).unwrap();
        let out = ops::convolve(&device, gpu.limits(), &src, dims, &taps, finish, soon()).unwrap().read().unwrap();
        let want = convolve::separable(&data, dims, &taps, finish, &never).unwrap();
        assert_close(&out, &want, &format!("{dims:?} r{radius} {finish:?}"));
    }
}

#[test]
fn resizes_match_the_cpu_for_every_linear_method() {
    let Some(gpu) = gpu() else { return };
    let device = gpu.device().unwrap();
    let dims = Dims { batch: 2, height: 31, width: 45, channels: 3 };
    let data = pattern(dims.len().unwrap(), 3);
    let src = device.upload(&data).unwrap();
    for method in [Method::NearestExact, Method::Bilinear, Method::Area, Method::Bicubic] {
        for (w, h, crop) in [(90, 62, false), (20, 13, false), (45, 70, false), (32, 32, true), (7, 50, true)] {
            let (want, out) = resample::resize_image(&data, dims, w, h, method, crop, &never).unwrap();
            let region = if crop { resample::center_crop(dims.width, dims.height, w, h) } else { (0, 0, dims.width, dims.height) };
            let got = ops::resize(&device, gpu.limits(), &src, dims, region, out, method, soon()).unwrap().read().unwrap();
            assert_close(&got, &want, &format!("{method:?} to {w}×{h} crop {crop}"));
        }
    }
    let mask_dims = Dims { batch: 1, height: 20, width: 30, channels: 1 };
    let mask = pattern(600, 4);
    let src = device.upload(&mask).unwrap();
    let (want, out) = resample::resize_mask(&mask, mask_dims, 64, 9, Method::Bilinear, &never).unwrap();
    let got = ops::resize(&device, gpu.limits(), &src, mask_dims, (0, 0, 30, 20), out, Method::Bilinear, soon()).unwrap().read().unwrap();
    assert_close(&got, &want, "mask bilinear");
}

#[test]
fn a_second_compile_of_the_same_kernel_is_a_cache_hit() {
    let Some(gpu) = gpu() else { return };
    let device = gpu.device().unwrap();
    let src = "@group(0) @binding(1) var<storage, read_write> a: array<f32>;\n@compute @workgroup_size(1) fn cache_probe() { a[0] = 7.0; }";
    let before = device.kernels_compiled();
    let first = compile(&device, gpu.limits(), src, "cache_probe").unwrap();
    let second = compile(&device, gpu.limits(), src, "cache_probe").unwrap();
    assert!(Arc::ptr_eq(&first, &second));
    assert_eq!(device.kernels_compiled(), before + 1, "the second compile built nothing");
    let other = compile(&device, gpu.limits(), &src.replace("7.0", "8.0"), "cache_probe").unwrap();
    assert_ne!(other.id, first.id);
}

#[test]
fn invalid_wgsl_is_refused_before_the_driver_with_a_location() {
    let Some(gpu) = gpu() else { return };
    let device = gpu.device().unwrap();
    let limits = gpu.limits();
    let err = compile(&device, limits, "@compute @workgroup_size(1) fn main() { let x: u32 = 1.5; }", "main").unwrap_err();
    assert!(matches!(&err, GpuError::InvalidKernel(m) if m.contains("main")), "{err:?}");
    let err = compile(&device, limits, "fn nothing() {}", "main").unwrap_err();
    assert!(matches!(&err, GpuError::InvalidKernel(m) if m.contains("no @compute entry point")), "{err:?}");
    let textured = "@group(0) @binding(1) var t: texture_2d<f32>;\n@compute @workgroup_size(1) fn main() { _ = textureDimensions(t); }";
    assert!(matches!(compile(&device, limits, textured, "main"), Err(GpuError::InvalidKernel(_))));
    let big = format!("// {}\n@compute @workgroup_size(1) fn main() {{}}", "x".repeat(limits.max_source_bytes));
    assert!(matches!(compile(&device, limits, &big, "main"), Err(GpuError::InvalidKernel(m)) if m.contains("gpu_max_source_kb")));
}

/// A kernel that loops forever, then writes how far it got.
const SPIN: &str = "@group(0) @binding(1) var<storage, read_write> out: array<f32>;
    @compute @workgroup_size(64) fn spin(@builtin(global_invocation_id) id: vec3<u32>) {
        var n = 0.0;
        loop { n += 1.0; }
        out[id.x] = n;
    }";

#[test]
fn an_infinite_loop_ends_at_the_loop_budget() {
    let Some(gpu) = gpu_with(GpuLimits { loop_budget: 10_000, ..GpuLimits::default() }) else { return };
    let device = gpu.device().unwrap();
    let kernel = compile(&device, gpu.limits(), SPIN, "spin").unwrap();
    let out = device.zeroed(64 * 4).unwrap();
    let started = Instant::now();
    run(&device, &kernel, &[Bound { index: 1, buffer: &out, writable: true }], &[], (4, 1, 1), gpu.limits(), soon()).unwrap();
    let values = out.read().unwrap();
    assert!(started.elapsed() < Duration::from_secs(30));
    // The loop ran exactly the budget's iterations, then was cut.
    assert!(values.iter().all(|&v| v == 10_000.0), "{:?}", &values[..4]);
}

#[test]
fn a_large_dispatch_shares_the_dispatch_iteration_budget() {
    // 256 invocations sharing 256 × 100 iterations: 100 each, not 10000.
    let limits = GpuLimits { loop_budget: 10_000, max_dispatch_iterations: 256 * 100, ..GpuLimits::default() };
    assert_eq!(super::dispatch::loop_budget(&limits, 256), 100);
    assert_eq!(super::dispatch::loop_budget(&limits, 1), 10_000, "never above loop_budget");
    assert_eq!(super::dispatch::loop_budget(&limits, u64::MAX), 1, "never below one");
    let Some(gpu) = gpu_with(limits) else { return };
    let device = gpu.device().unwrap();
    let kernel = compile(&device, gpu.limits(), SPIN, "spin").unwrap();
    let out = device.zeroed(256).unwrap();
    run(&device, &kernel, &[Bound { index: 1, buffer: &out, writable: true }], &[], (4, 1, 1), gpu.limits(), soon()).unwrap();
    let values = out.read().unwrap();
    assert!(values.iter().all(|&v| v == 100.0), "{:?}", &values[..4]);
    // The host's own binding is not the plugin's to use.
    let reserved = "@group(0) @binding(999) var<storage, read_write> x: array<f32>;\n@compute @workgroup_size(1) fn main() { x[0] = 1.0; }";
    assert!(matches!(compile(&device, gpu.limits(), reserved, "main"), Err(GpuError::InvalidKernel(m)) if m.contains("999")));
}

#[test]
fn out_of_bounds_writes_stay_inside_the_buffer() {
    let Some(gpu) = gpu() else { return };
    let device = gpu.device().unwrap();
    let src = "@group(0) @binding(1) var<storage, read_write> small: array<f32>;
        @compute @workgroup_size(1) fn oob() {
            for (var i = 0u; i < 4096u; i++) { small[i * 997u + 100000000u] = 42.0; }
            small[arrayLength(&small) * 1000u + 7u] = 42.0;
        }";
    let neighbour = device.upload(&[1.0; 1024]).unwrap();
    let small = device.zeroed(16).unwrap();
    let kernel = compile(&device, gpu.limits(), src, "oob").unwrap();
    run(&device, &kernel, &[Bound { index: 1, buffer: &small, writable: true }], &[], (1, 1, 1), gpu.limits(), soon()).unwrap();
    assert!(neighbour.read().unwrap().iter().all(|&v| v == 1.0), "another buffer was written");
    // Clamped accesses land inside the kernel's own buffer.
    assert!(small.read().unwrap().iter().all(|&v| v == 0.0 || v == 42.0));
}

#[test]
fn dispatch_sizes_and_bindings_are_bounded() {
    let Some(gpu) = gpu_with(GpuLimits { max_workgroups_per_dim: 1000, max_invocations: 1 << 20, ..GpuLimits::default() }) else { return };
    let device = gpu.device().unwrap();
    let limits = gpu.limits();
    let src = "@group(0) @binding(0) var<uniform> k: vec4<f32>;
        @group(0) @binding(1) var<storage, read> a: array<f32>;
        @group(0) @binding(2) var<storage, read_write> b: array<f32>;
        @compute @workgroup_size(64) fn main(@builtin(global_invocation_id) id: vec3<u32>) { b[id.x] = a[id.x] * k.x; }";
    let kernel = compile(&device, limits, src, "main").unwrap();
    let a = device.upload(&[2.0; 64]).unwrap();
    let b = device.zeroed(64).unwrap();
    let uniforms = [3.0f32, 0.0, 0.0, 0.0].iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>();
    let ok = [Bound { index: 1, buffer: &a, writable: false }, Bound { index: 2, buffer: &b, writable: true }];
    let refused = |r: Result<(), GpuError>| matches!(r, Err(GpuError::InvalidDispatch(_)));
    assert!(refused(run(&device, &kernel, &ok, &uniforms, (u32::MAX, 1, 1), limits, soon())), "per-dimension bound");
    assert!(refused(run(&device, &kernel, &ok, &uniforms, (1000, 1000, 1), limits, soon())), "invocation bound");
    assert!(refused(run(&device, &kernel, &ok, &[], (1, 1, 1), limits, soon())), "uniforms missing");
    assert!(refused(run(&device, &kernel, &ok[..1], &uniforms, (1, 1, 1), limits, soon())), "binding missing");
    let read_only = [Bound { index: 1, buffer: &a, writable: false }, Bound { index: 2, buffer: &b, writable: false }];
    assert!(refused(run(&device, &kernel, &read_only, &uniforms, (1, 1, 1), limits, soon())), "read_write needs a writable tensor");
    let extra = [ok[0].index, ok[1].index, 5].map(|i| Bound { index: i, buffer: &a, writable: false });
    assert!(refused(run(&device, &kernel, &extra, &uniforms, (1, 1, 1), limits, soon())), "unknown binding");
    run(&device, &kernel, &ok, &uniforms, (1, 1, 1), limits, soon()).unwrap();
    assert_eq!(b.read().unwrap(), vec![6.0; 64]);
    let too_big = (device.max_binding_bytes() / 4 + 1) as usize;
    assert!(matches!(device.zeroed(too_big), Err(GpuError::InvalidDispatch(m)) if m.contains("binds at most")), "tensors over the binding limit are refused");
}

#[test]
fn driver_errors_are_captured_not_panics() {
    let Some(gpu) = gpu() else { return };
    let device = gpu.device().unwrap();
    // A uniform block larger than the bytes given passes the host's checks;
    // wgpu's validation refuses the bind group, inside the error scope.
    let src = "@group(0) @binding(0) var<uniform> k: array<vec4<f32>, 8>;
        @group(0) @binding(1) var<storage, read_write> b: array<f32>;
        @compute @workgroup_size(1) fn main() { b[0] = k[7].x; }";
    let kernel = compile(&device, gpu.limits(), src, "main").unwrap();
    let b = device.zeroed(4).unwrap();
    let err = run(&device, &kernel, &[Bound { index: 1, buffer: &b, writable: true }], &[0; 16], (1, 1, 1), gpu.limits(), soon()).unwrap_err();
    assert!(
        matches!(&err, GpuError::Driver(m) if m.contains("Validation Error") && m.len() > "Validation Error".len() + 10),
        "the cause, not just the heading: {err:?}"
    );
    eprintln!("captured: {err}");
    // The device is still usable afterwards.
    assert_eq!(device.upload(&[5.0]).unwrap().read().unwrap(), vec![5.0]);
}

#[test]
fn fresh_buffers_are_zeroed() {
    let Some(gpu) = gpu() else { return };
    let device = gpu.device().unwrap();
    // Fill and free a buffer, then allocate the same size again.
    drop(device.upload(&vec![9.0; 1 << 16]).unwrap());
    assert!(device.zeroed(1 << 16).unwrap().read().unwrap().iter().all(|&v| v == 0.0));
}

#[test]
fn the_policy_follows_the_mode() {
    let Some(gpu) = gpu() else { return };
    assert!(gpu.prefers(1, false), "required runs everything with a GPU kernel there");
    let auto = Gpu::start(GpuMode::Auto, GpuLimits::default(), None).unwrap();
    assert_eq!(auto.is_some(), !gpu.info().software, "auto keeps a real GPU only");
    if let Some(auto) = auto {
        assert!(auto.offered() && auto.prefers(1, true), "a resident input stays on the device");
        assert!(auto.prefers(1 << 20, false), "large results go to the GPU");
        assert!(!auto.prefers(1, false), "tiny ones stay on the CPU");
    }
    assert!(Gpu::start(GpuMode::Off, GpuLimits::default(), None).unwrap().is_none());
}

#[test]
fn a_lost_device_is_recreated_and_its_buffers_say_so() {
    // Limits of its own: this GPU is not the one the other tests share.
    let Some(gpu) = gpu_with(GpuLimits { max_cached_kernels: 7, ..GpuLimits::default() }) else { return };
    let lost = gpu.device().unwrap();
    let buffer = lost.upload(&[1.0, 2.0]).unwrap();
    lost.device.destroy();
    let _ = lost.device.poll(wgpu::PollType::Poll);
    assert!(lost.is_lost());
    assert_eq!(buffer.read().unwrap_err(), GpuError::DeviceLost);
    let kernel = compile(
        &gpu.device().unwrap(),
        gpu.limits(),
        "@group(0) @binding(1) var<storage, read_write> a: array<f32>;\n@compute @workgroup_size(1) fn main() { a[0] = 1.0; }",
        "main",
    )
    .unwrap();
    let fresh = gpu.device().unwrap();
    assert_eq!(fresh.generation(), lost.generation() + 1);
    assert_eq!(fresh.upload(&[3.0]).unwrap().read().unwrap(), vec![3.0]);
    // A buffer of the lost device cannot be bound on the new one.
    let err = run(&fresh, &kernel, &[Bound { index: 1, buffer: &buffer, writable: true }], &[], (1, 1, 1), gpu.limits(), soon()).unwrap_err();
    assert_eq!(err, GpuError::DeviceLost);
}
