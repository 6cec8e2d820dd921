//! Tensors larger than one binding: the host's kernels bind a window of
//! each per band and give the CPU's results; a plugin's kernel, which binds
//! whole tensors, is refused one.

use super::*;

/// A device of its own whose bindings span at most `bytes` (the adapter's
/// limit is far larger than these tests' tensors).
fn capped(bytes: u64) -> Option<(Arc<Gpu>, Arc<Device>)> {
    let gpu = gpu_with(GpuLimits { max_cached_kernels: 17, ..GpuLimits::default() })?;
    let device = gpu.device().unwrap();
    device.cap_bindings(bytes);
    Some((gpu, device))
}

#[test]
fn tensors_over_the_binding_limit_are_processed_a_window_at_a_time() {
    // 16,384 values per binding; two 97×83 RGB images are 48,306 values.
    let Some((gpu, device)) = capped(64 << 10) else { return };
    let limits = gpu.limits();
    let dims = Dims { batch: 2, height: 97, width: 83, channels: 3 };
    let data = pattern(dims.len().unwrap(), 11);
    let src = device.upload(&data).unwrap();
    assert!(src.len() * 4 > 2 * device.max_binding_bytes() as usize, "the tensor spans several bindings");

    let got = ops::affine(&device, limits, &src, -1.0, 1.0, &in_time()).unwrap().read().unwrap();
    assert_close(&got, &kiln_kernels::convert::affine(&data, -1.0, 1.0, &never).unwrap(), "invert, four values per invocation");
    let odd = device.upload(&data[..data.len() - 1]).unwrap();
    let got = ops::affine(&device, limits, &odd, 0.5, 0.25, &in_time()).unwrap().read().unwrap();
    assert_close(&got, &kiln_kernels::convert::affine(&data[..data.len() - 1], 0.5, 0.25, &never).unwrap(), "affine, one value per invocation");

    for (radius, finish) in [(9, Finish::Blur), (4, Finish::Sharpen(3.0)), (20, Finish::Blur)] {
        let taps = gaussian_1d(radius, 3.0);
        let got = ops::convolve(&device, limits, &src, dims, &taps, finish, &in_time()).unwrap().read().unwrap();
        let want = convolve::separable(&data, dims, &taps, finish, &never).unwrap();
        assert_close(&got, &want, &format!("r{radius} {finish:?} in windows"));
    }

    for (method, w, h, crop) in
        [(Method::Bilinear, 41, 48, false), (Method::Bicubic, 160, 190, false), (Method::Area, 60, 30, true), (Method::NearestExact, 83, 97, false)]
    {
        let (want, out) = resample::resize_image(&data, dims, w, h, method, crop, &never).unwrap();
        let region = if crop { resample::center_crop(dims.width, dims.height, w, h) } else { (0, 0, dims.width, dims.height) };
        let got = ops::resize(&device, limits, &src, dims, region, out, method, &in_time()).unwrap().read().unwrap();
        assert_close(&got, &want, &format!("{method:?} to {w}×{h} crop {crop} in windows"));
    }

    // The second image's 8-bit values: a frame over one binding, from the middle of the tensor.
    let frame = dims.frame_len();
    let words = ops::to_u8(&device, limits, &src, frame, frame, &in_time()).unwrap().read().unwrap();
    let bytes: &[u8] = bytemuck::cast_slice(&words);
    assert_eq!(&bytes[..frame], &kiln_kernels::convert::to_u8(&data[frame..], &never).unwrap()[..], "8-bit values in windows");
}

#[test]
fn a_band_that_cannot_fit_one_binding_and_a_whole_oversized_binding_are_refused() {
    let Some((gpu, device)) = capped(64 << 10) else { return };
    let limits = gpu.limits();
    // 249 values a row: radius 40 reads 81 rows (20,169 values) for one row.
    let dims = Dims { batch: 1, height: 200, width: 83, channels: 3 };
    let data = pattern(dims.len().unwrap(), 12);
    let src = device.upload(&data).unwrap();
    let taps = gaussian_1d(40, 10.0);
    let refused = ops::convolve(&device, limits, &src, dims, &taps, Finish::Blur, &in_time());
    assert!(matches!(refused, Err(GpuError::InvalidDispatch(ref m)) if m.contains("binds at once")), "{refused:?}");
    // A plugin's kernel binds whole tensors: one over the limit is refused
    // before any GPU work, with the limit in the message.
    let source = "@group(0) @binding(1) var<storage, read_write> b: array<f32>;
        @compute @workgroup_size(1) fn main() { b[0] = 1.0; }";
    let kernel = compile(&device, limits, source, "main").unwrap();
    let whole = run(&device, &kernel, &[Bound::whole(1, &src, true)], &[], (1, 1, 1), limits, soon());
    assert!(matches!(whole, Err(GpuError::InvalidDispatch(ref m)) if m.contains("binds at most")), "{whole:?}");
    assert!(matches!(device.zeroed(src.len()), Err(GpuError::InvalidDispatch(_))), "a plugin's allocation over one binding");
    // The host's own kernels still take it, a window at a time.
    let got = ops::affine(&device, limits, &src, 1.0, 0.0, &in_time()).unwrap().read().unwrap();
    assert_eq!(got, data);
}
