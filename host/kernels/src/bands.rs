//! Splitting an output into bands of whole rows and running them, on rayon's
//! pool with the `parallel` feature and on the calling thread otherwise.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::KernelError;

/// Asked between bands; `true` stops the kernel with [`KernelError::Stopped`].
pub type Stop<'a> = &'a (dyn Fn() -> bool + Sync);

/// Target values per band: big enough that per-band setup (a resampler's
/// first rows, a task hand-off) is noise, small enough for every core to get
/// many bands.
const BAND_VALUES: usize = 1 << 18;

/// Below this many values in all, the bands run on the calling thread: a
/// hand-off to the pool costs more than the work.
#[cfg(feature = "parallel")]
const PARALLEL_MIN_VALUES: usize = 1 << 16;

/// Runs `f(frame, first_row, band)` over `out`, cut into frames of
/// `frame_len` values and those into bands of whole rows of `row_len`
/// values. Stops early (and returns [`KernelError::Stopped`]) once `stop`
/// says so.
pub(crate) fn for_each_band<T, F>(out: &mut [T], frame_len: usize, row_len: usize, stop: Stop<'_>, f: F) -> Result<(), KernelError>
where
    T: Send,
    F: Fn(usize, usize, &mut [T]) + Sync,
{
    if out.is_empty() || frame_len == 0 || row_len == 0 {
        return Ok(());
    }
    let rows_per_band = (BAND_VALUES / row_len).max(1);
    let band_len = rows_per_band * row_len;
    let stopped = AtomicBool::new(false);
    let band = |frame: usize, index: usize, values: &mut [T]| {
        if stopped.load(Ordering::Relaxed) || stop() {
            stopped.store(true, Ordering::Relaxed);
            return;
        }
        f(frame, index * rows_per_band, values);
    };
    #[cfg(feature = "parallel")]
    if out.len() >= PARALLEL_MIN_VALUES {
        use rayon::prelude::*;
        out.par_chunks_mut(frame_len).enumerate().for_each(|(frame, values)| {
            values.par_chunks_mut(band_len).enumerate().for_each(|(i, b)| band(frame, i, b));
        });
        return finish(&stopped);
    }
    for (frame, values) in out.chunks_mut(frame_len).enumerate() {
        for (i, b) in values.chunks_mut(band_len).enumerate() {
            band(frame, i, b);
        }
    }
    finish(&stopped)
}

fn finish(stopped: &AtomicBool) -> Result<(), KernelError> {
    if stopped.load(Ordering::Relaxed) { Err(KernelError::Stopped) } else { Ok(()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_is_visited_once_with_its_frame_and_row() {
        // 3 frames of 700 rows of 500 values: several bands per frame, a short last band.
        let (frames, rows, row_len) = (3, 700, 500);
        let mut out = vec![(usize::MAX, usize::MAX); frames * rows * row_len];
        for_each_band(&mut out, rows * row_len, row_len, &|| false, |frame, first_row, band| {
            for (i, v) in band.iter_mut().enumerate() {
                *v = (frame, first_row + i / row_len);
            }
        })
        .unwrap();
        for (i, &(frame, row)) in out.iter().enumerate() {
            assert_eq!((frame, row), (i / (rows * row_len), (i / row_len) % rows));
        }
    }

    #[test]
    fn stop_is_honoured() {
        let mut out = vec![0u8; 1 << 20];
        assert_eq!(for_each_band(&mut out, 1 << 20, 1024, &|| true, |_, _, b| b.fill(1)), Err(KernelError::Stopped));
        assert!(out.iter().all(|&v| v == 0));
    }
}
