//! Small work recorded for the next submission (`gpu/batch.rs`): when it
//! reaches the queue, and the buffers parked behind it.

use super::*;
use crate::gpu::batch::MAX_RECORDED;

#[test]
fn small_host_kernels_wait_for_the_next_submission_in_order() {
    // A device of its own: it counts submissions.
    let Some(gpu) = gpu_with(GpuLimits { max_cached_kernels: 16, ..GpuLimits::default() }) else { return };
    let device = gpu.device().unwrap();
    let src = device.upload(&[0.25; 256]).unwrap();
    let first = ops::affine(&device, gpu.limits(), &src, -1.0, 1.0, &in_time()).unwrap();
    let before = device.submissions();
    // Ten more inverts, each reading the last: recorded, nothing submitted.
    let mut last = first;
    for _ in 0..10 {
        last = ops::affine(&device, gpu.limits(), &last, -1.0, 1.0, &in_time()).unwrap();
    }
    assert_eq!(device.submissions(), before, "small last bands are recorded, not submitted");
    // The read-back submits them first, in order: eleven inverts of 0.25.
    assert!(last.read().unwrap().iter().all(|&v| v == 0.75));
    let used = device.submissions() - before;
    assert!((1..=2).contains(&used), "the recorded kernels and the copy took {used} submissions");
    // A full batch goes at once.
    let before = device.submissions();
    for _ in 0..MAX_RECORDED {
        last = ops::affine(&device, gpu.limits(), &last, -1.0, 1.0, &in_time()).unwrap();
    }
    assert_eq!(device.submissions() - before, 1, "{} recorded dispatches are submitted together", MAX_RECORDED);
    assert!(last.read().unwrap().iter().all(|&v| v == 0.75), "an even number more");
}

#[test]
fn a_buffer_freed_behind_recorded_work_is_not_reused_before_that_work_runs() {
    let Some(gpu) = gpu_with(GpuLimits { max_cached_kernels: 17, ..GpuLimits::default() }) else { return };
    let device = gpu.device().unwrap();
    let x = pattern(4096, 21);
    let y = pattern(4096, 22);
    let a = device.upload(&x).unwrap();
    // Reads `a` later, when something is submitted.
    let b = ops::affine(&device, gpu.limits(), &a, -1.0, 1.0, &in_time()).unwrap();
    drop(a);
    // Pooled at once, `a`'s buffer would take `y` before the invert ran.
    let c = device.upload(&y).unwrap();
    let want: Vec<f32> = x.iter().map(|v| 1.0 - v).collect();
    assert!(b.read().unwrap() == want, "the invert read its own input");
    assert!(c.read().unwrap() == y);
    // Once submitted, the parked buffer is pooled again.
    let (created, _) = device.buffer_counts();
    drop(device.upload(&x).unwrap());
    assert_eq!(device.buffer_counts().0, created, "the parked buffer went back to the pool");
}

#[test]
fn a_kernel_result_may_take_a_buffer_parked_behind_recorded_work() {
    let Some(gpu) = gpu_with(GpuLimits { max_cached_kernels: 18, ..GpuLimits::default() }) else { return };
    let device = gpu.device().unwrap();
    let x = pattern(4096, 23);
    let a = device.upload(&x).unwrap();
    let parked = a.raw().clone();
    let b = ops::affine(&device, gpu.limits(), &a, -1.0, 1.0, &in_time()).unwrap();
    drop(a);
    // Recorded after the invert that reads `a`'s buffer, so it writes there
    // after that read: the buffer is taken from the parked ones.
    let c = ops::affine(&device, gpu.limits(), &b, -1.0, 1.0, &in_time()).unwrap();
    assert!(*c.raw() == parked, "the second invert's result took the parked buffer");
    assert!(c.read().unwrap() == x, "two inverts give the input back");
    assert!(b.read().unwrap() == x.iter().map(|v| 1.0 - v).collect::<Vec<_>>());
}
