//! Where a kernel runs under `gpu = "auto"`: on the GPU only when the
//! estimated time there, transfers included, beats the CPU's, and the
//! device is opened only once the time the CPU lost to it adds up to what
//! opening costs.
//!
//! A call is described by an [`Estimate`]: its result's values, the input
//! values it reads per result value (taps), and the bytes it would first
//! upload (its inputs not on the device yet). The CPU's time is the taps
//! over the host kernels' rate on each of their threads (rayon's pool); the GPU's is the upload over
//! the host-to-device link, plus the taps over the device's rate and a
//! dispatch's fixed cost. The read-back of the result is not counted: a
//! result that stays on the device feeds the next kernel for free, and
//! which consumer comes next is not known here.
//!
//! Opening the device (probing the adapter in a child, loading the driver,
//! creating the device: ~200 ms on a GPU server) is paid once per process.
//! Until then each call whose estimate favours the GPU runs on the CPU and
//! adds what it would have saved to a tally; when the tally reaches the
//! opening's cost, the call that reaches it opens the device (ski rental:
//! at most twice what the best choice in hindsight would have cost). A
//! one-shot `kiln run` of a small or cheap workflow thus never pays for a
//! device, and a server with steady heavy work opens it early.
//!
//! The rates are fixed estimates (see [`Rates::DEFAULT`]), deliberately
//! favouring the CPU: a wrong CPU choice costs at most what the GPU would
//! have saved, a wrong GPU choice can cost a transfer larger than the work.

use std::sync::atomic::{AtomicU64, Ordering};

/// What running one kernel call would cost.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    /// Values of the result.
    pub values: u64,
    /// Input values read per result value (1 for a point-wise map).
    pub taps: u64,
    /// Bytes to upload before the GPU can start (inputs on the host).
    pub upload_bytes: u64,
    /// An input already lives on the device (reading it back for the CPU
    /// costs more than computing there).
    pub resident: bool,
}

impl Estimate {
    /// A point-wise map over `values` whose input is on the host.
    pub fn pointwise(values: u64) -> Estimate {
        Estimate { values, taps: 1, upload_bytes: values.saturating_mul(4), resident: false }
    }

    /// Seconds on the CPU.
    pub fn cpu_secs(&self, rates: &Rates) -> f64 {
        self.values as f64 * self.taps.max(1) as f64 / rates.cpu_taps_per_sec
    }

    /// Seconds on an open device, the upload included.
    pub fn gpu_secs(&self, rates: &Rates) -> f64 {
        self.upload_bytes as f64 / rates.link_bytes_per_sec + self.values as f64 * self.taps.max(1) as f64 / rates.gpu_taps_per_sec + rates.dispatch_secs
    }

    /// Seconds the GPU would save on this call (≤ 0: none).
    pub fn saving(&self, rates: &Rates) -> f64 {
        self.cpu_secs(rates) - self.gpu_secs(rates)
    }
}

/// The throughputs an [`Estimate`] is priced at.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rates {
    /// Taps per second of the host's CPU kernels, all cores together.
    pub cpu_taps_per_sec: f64,
    /// Bytes per second from host memory to the device.
    pub link_bytes_per_sec: f64,
    /// Taps per second of the device's kernels.
    pub gpu_taps_per_sec: f64,
    /// Fixed cost of one kernel call on the device (submission and wait).
    pub dispatch_secs: f64,
    /// Cost of opening the device, once per process.
    pub open_secs: f64,
}

impl Rates {
    /// Measured on the project's machines: the CPU kernels do 5–8·10⁹ taps
    /// per second per core (a 3072² RGB blur of radius 8: 9.6·10⁸ taps in
    /// 62 ms on 2 cores; a bilinear resize 4.9·10⁹ per core), so 4·10⁹ per
    /// core is counted (in favour of the CPU); uploads through `write_buffer`
    /// from pageable memory are counted at 8 GB/s, a real GPU's convolution
    /// at 10¹¹ taps per second (far under its bandwidth), a call at 100 µs,
    /// and opening at 200 ms (a GPU server took ~200 ms more for a trivial
    /// run under `auto` when it opened the device).
    pub const DEFAULT: Rates = Rates { cpu_taps_per_sec: 4e9, link_bytes_per_sec: 8e9, gpu_taps_per_sec: 1e11, dispatch_secs: 1e-4, open_secs: 0.2 };

    /// [`Rates::DEFAULT`] with the CPU rate for `cores` cores.
    pub fn for_cores(cores: usize) -> Rates {
        Rates { cpu_taps_per_sec: Rates::DEFAULT.cpu_taps_per_sec * cores.max(1) as f64, ..Rates::DEFAULT }
    }
}

/// What `auto` decides for one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice {
    /// Compute on the CPU.
    Cpu,
    /// Compute on the (open) device.
    Gpu,
    /// Open the device now (the tally reached the opening's cost), then
    /// compute on it if there is one to use.
    Open,
}

/// `auto`'s tally of the time the CPU lost while the device was closed.
#[derive(Debug, Default)]
pub struct Tally {
    /// Nanoseconds the GPU would have saved, summed.
    forgone_ns: AtomicU64,
}

impl Tally {
    /// The choice for `estimate`: `open` says whether the device is open.
    pub fn choose(&self, estimate: &Estimate, rates: &Rates, open: bool) -> Choice {
        if estimate.resident {
            return Choice::Gpu;
        }
        let saving = estimate.saving(rates);
        if saving <= 0.0 {
            return Choice::Cpu;
        }
        if open {
            return Choice::Gpu;
        }
        let ns = (saving * 1e9).min(u64::MAX as f64) as u64;
        let before = self.forgone_ns.fetch_update(Ordering::AcqRel, Ordering::Acquire, |f| Some(f.saturating_add(ns))).unwrap_or(u64::MAX);
        let forgone = before.saturating_add(ns);
        if forgone as f64 >= rates.open_secs * 1e9 { Choice::Open } else { Choice::Cpu }
    }

    /// Nanoseconds tallied so far.
    pub fn forgone_ns(&self) -> u64 {
        self.forgone_ns.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn estimate(side: u64, channels: u64, taps: u64) -> Estimate {
        let values = side * side * channels;
        Estimate { values, taps, upload_bytes: values * 4, resident: false }
    }

    #[test]
    fn a_pointwise_map_of_host_data_stays_on_the_cpu() {
        // Uploading 4 bytes costs more than one multiply-add on any core count.
        for cores in [1, 2, 16, 128] {
            let rates = Rates::for_cores(cores);
            assert!(Estimate::pointwise(4096 * 4096 * 3).saving(&rates) < 0.0, "{cores} cores");
            assert_eq!(Tally::default().choose(&Estimate::pointwise(1 << 26), &rates, true), Choice::Cpu);
        }
    }

    #[test]
    fn resident_inputs_stay_on_the_gpu() {
        let e = Estimate { resident: true, upload_bytes: 0, ..Estimate::pointwise(16) };
        assert_eq!(Tally::default().choose(&e, &Rates::for_cores(64), false), Choice::Gpu);
    }

    #[test]
    fn a_wide_convolution_goes_to_an_open_device_on_few_cores_only() {
        // 4096² RGB, radius 31: 126 taps per value.
        let blur = estimate(4096, 3, 126);
        assert_eq!(Tally::default().choose(&blur, &Rates::for_cores(2), true), Choice::Gpu);
        assert_eq!(Tally::default().choose(&blur, &Rates::for_cores(256), true), Choice::Cpu);
        // A bilinear resize of a host image is not worth its upload on 16 cores.
        assert_eq!(Tally::default().choose(&estimate(6144, 3, 4), &Rates::for_cores(16), true), Choice::Cpu);
    }

    #[test]
    fn the_device_opens_once_the_forgone_savings_reach_its_cost() {
        let rates = Rates::for_cores(2);
        let blur = estimate(2048, 3, 34);
        let saving = blur.saving(&rates);
        assert!(saving > 0.0 && saving < rates.open_secs, "{saving}");
        let tally = Tally::default();
        let calls_to_open = (rates.open_secs / saving).ceil() as usize;
        for call in 1..calls_to_open {
            assert_eq!(tally.choose(&blur, &rates, false), Choice::Cpu, "call {call}");
        }
        assert_eq!(tally.choose(&blur, &rates, false), Choice::Open);
        // Calls the GPU would not speed up add nothing.
        let before = tally.forgone_ns();
        assert_eq!(tally.choose(&Estimate::pointwise(1 << 20), &rates, false), Choice::Cpu);
        assert_eq!(tally.forgone_ns(), before);
    }
}
