//! Read-backs in parts: each part whole units and landed before it is
//! handed over, the image encoded from them the CPU path's PNG, and a part
//! that does not land in time the read-back's error.

use super::*;

/// Parts of 8 MiB (SaveImage's are larger: `READ_PART_BYTES`).
const PART: usize = 8 << 20;

#[test]
fn a_read_back_in_parts_hands_over_whole_units_in_order() {
    // Limits of its own: the late-callback hook is this device's only.
    let Some(gpu) = gpu_with(GpuLimits { max_cached_kernels: 19, ..GpuLimits::default() }) else { return };
    let device = gpu.device().unwrap();
    device.late_callbacks_ms.store(5, std::sync::atomic::Ordering::Relaxed);
    let values = pattern(6 << 20, 21);
    let buffer = device.upload(&values).unwrap();
    let all: &[u8] = bytemuck::cast_slice(&values);
    // An odd unit (rows of 3003 bytes), and bytes that end inside a word.
    let (unit, bytes) = (3003, 3003 * 7001);
    let sizes = buffer
        .read_in_parts(bytes, unit, PART, soon(), |parts| {
            let mut at = 0;
            let mut sizes = Vec::new();
            for part in parts {
                let part = part.unwrap();
                let part = part.as_ref();
                assert_eq!(part, &all[at..at + part.len()], "the part from byte {at}");
                assert!(part.len().is_multiple_of(unit), "whole units");
                at += part.len();
                sizes.push(part.len());
            }
            assert_eq!(at, bytes);
            sizes
        })
        .unwrap();
    assert!(sizes.len() >= 2 && sizes.iter().all(|&s| s <= PART), "parts of at most {PART} bytes: {sizes:?}");
    // The staging buffers went back to the pool: the same read again allocates none.
    let (created, _) = device.buffer_counts();
    let again = buffer.read_in_parts(bytes, unit, PART, soon(), |parts| parts.map(|p| p.unwrap().as_ref().to_vec()).collect::<Vec<_>>().concat()).unwrap();
    assert_eq!(again, &all[..bytes]);
    assert_eq!(device.buffer_counts().0, created, "staging reused");
}

#[test]
fn a_part_that_does_not_land_in_time_is_the_read_backs_error() {
    let Some(gpu) = gpu_with(GpuLimits { max_cached_kernels: 23, ..GpuLimits::default() }) else { return };
    let device = gpu.device().unwrap();
    // Callbacks fire 300 ms late; the deadline is 50 ms away.
    device.late_callbacks_ms.store(300, std::sync::atomic::Ordering::Relaxed);
    let buffer = device.upload(&pattern(1 << 20, 22)).unwrap();
    let mut seen = Vec::new();
    let result = buffer.read_in_parts(4 << 20, 4096, 1 << 20, Instant::now() + Duration::from_millis(50), |parts| {
        for part in parts {
            seen.push(part.map(|p| p.as_ref().len()));
        }
    });
    assert_eq!(result.unwrap_err(), GpuError::Timeout);
    assert_eq!(seen, vec![Err(GpuError::Timeout)], "the first part failed and ended the parts");
}

#[test]
fn an_image_encoded_from_a_read_back_in_parts_is_the_cpu_paths_png() {
    let Some(gpu) = gpu() else { return };
    let device = gpu.device().unwrap();
    // 2 images of 1800×1700 RGB: the second's 9.2 MB of bytes, in parts of 4 MiB.
    let dims = Dims { batch: 2, height: 1700, width: 1800, channels: 3 };
    let data = pattern(dims.len().unwrap(), 23);
    let src = device.upload(&data).unwrap();
    let frame = dims.frame_len();
    let packed = ops::to_u8(&device, gpu.limits(), &src, frame, frame, &in_time()).unwrap();
    let mut parts_seen = 0;
    let png = packed
        .read_in_parts(frame, dims.row_len(), 4 << 20, soon(), |parts| {
            let parts = parts.inspect(|_| parts_seen += 1).map(|p| p.map_err(|e| kiln_kernels::KernelError::Invalid(e.to_string())));
            kiln_kernels::codec::encode_png_parts(parts, dims, vec![("prompt".into(), "{}".into())], &never)
        })
        .unwrap()
        .unwrap();
    assert!(parts_seen >= 2, "{parts_seen} parts");
    let cpu = kiln_kernels::codec::encode_png(&data, dims, 1, vec![("prompt".into(), "{}".into())], &never).unwrap();
    let decode = |bytes: &[u8]| {
        let mut reader = png::Decoder::new(std::io::Cursor::new(bytes)).read_info().unwrap();
        let mut out = vec![0; reader.output_buffer_size().unwrap()];
        reader.next_frame(&mut out).unwrap();
        out
    };
    assert_eq!(decode(&png), decode(&cpu), "the same pixels");
    assert_eq!(decode(&png), kiln_kernels::convert::to_u8(&data[frame..], &never).unwrap());
}
