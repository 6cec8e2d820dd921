//! GPU compute: the one wgpu device the host owns, and the rules every
//! kernel on it runs under.
//!
//! Plugins never see the adapter, its features or its limits: they hand the
//! host WGSL and tensor handles (`kiln:plugin/gpu`), and the host's own pixel
//! kernels (`kiln:plugin/kernels`) run here too when the device is worth it.
//!
//! - [`device`]: the device, its loss and re-creation, device buffers.
//! - [`readback`]: device buffers read back, whole or in parts as they land.
//! - [`pool`]: device buffers reused by size class, idle memory bounded.
//! - [`batch`]: small work recorded for the next submission.
//! - [`policy`]: where `auto` runs a kernel, transfers and the device's opening counted.
//! - [`kernel`]: WGSL validation, loop bounding ([`loops`]), the pipeline cache.
//! - [`dispatch`]: binding checks, bounded dispatch, captured errors.
//! - [`ops`]: the host's WGSL versions of the pixel kernels.

mod batch;
mod device;
pub mod dispatch;
pub mod kernel;
pub mod loops;
pub mod ops;
pub mod policy;
mod pool;
pub mod readback;
#[cfg(test)]
mod tests;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

pub(crate) use device::check_binding;
pub use device::{Device, DeviceBuffer};
pub use kernel::Kernel;
pub use policy::Estimate;
use policy::{Choice, Rates, Tally};

/// Whether kiln uses a GPU (`gpu` in the config, `KILN_GPU`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GpuMode {
    /// Use an adapter when there is one; host kernels run on it when it is a
    /// real GPU and the tensor is large enough (or already on the device).
    #[default]
    Auto,
    /// Never touch a GPU: `gpu.available()` is false, every kernel runs on the CPU.
    Off,
    /// Fail start-up without an adapter (a software one counts); every host
    /// kernel that has a GPU version runs on it.
    Required,
}

/// The bounds on what plugins' kernels may ask of the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GpuLimits {
    /// Largest single device tensor, bytes.
    pub max_buffer_bytes: u64,
    /// Most workgroups along one dispatch dimension.
    pub max_workgroups_per_dim: u32,
    /// Most invocations (workgroups × workgroup size) of one dispatch.
    pub max_invocations: u64,
    /// Most loop iterations one invocation may run, all its loops together:
    /// the host rewrites every loop of a kernel to stop there.
    pub loop_budget: u32,
    /// Most loop iterations one dispatch may run, all its invocations
    /// together: each invocation's budget is this over the dispatch's
    /// invocations (at most `loop_budget`, at least 1), so a looping
    /// kernel's whole dispatch is bounded before it runs.
    pub max_dispatch_iterations: u64,
    /// Longest WGSL source, bytes.
    pub max_source_bytes: usize,
    /// Compiled pipelines kept per device.
    pub max_cached_kernels: usize,
    /// Smallest result (elements) for which `auto` runs a host kernel on a
    /// real GPU when its input is not already there.
    pub min_auto_elements: usize,
    /// Most bytes of idle device buffers kept for reuse.
    pub max_idle_bytes: u64,
}

impl Default for GpuLimits {
    fn default() -> GpuLimits {
        GpuLimits {
            max_buffer_bytes: 1 << 30,
            max_workgroups_per_dim: 65_535,
            max_invocations: 1 << 30,
            loop_budget: 1 << 20,
            max_dispatch_iterations: 1 << 32,
            max_source_bytes: 256 << 10,
            max_cached_kernels: 256,
            min_auto_elements: 1 << 16,
            max_idle_bytes: 1 << 30,
        }
    }
}

/// Why a GPU operation failed. Each maps onto `kiln:plugin/gpu.gpu-error`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GpuError {
    #[error("no GPU is available")]
    Unavailable,
    #[error("invalid kernel: {0}")]
    InvalidKernel(String),
    #[error("invalid dispatch: {0}")]
    InvalidDispatch(String),
    #[error("the GPU work did not finish within the node's time limit")]
    Timeout,
    #[error("the GPU device was lost; the host recreates it")]
    DeviceLost,
    #[error("the GPU reported: {0}")]
    Driver(String),
}

/// What `kiln doctor` and the start-up log say about the adapter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInfo {
    pub name: String,
    pub backend: String,
    pub device_type: String,
    /// A CPU implementation (Mesa lavapipe, SwiftShader).
    pub software: bool,
}

impl std::fmt::Display for GpuInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({}, {})", self.name, self.backend, self.device_type)
    }
}

/// The host's GPU: the adapter (found at start under `required`, on first
/// use under `auto`) and the current device.
pub struct Gpu {
    mode: GpuMode,
    limits: GpuLimits,
    /// The kiln executable that probes the adapter in a child under `auto`
    /// (see [`Gpu::start`]); `None`: probe in this process.
    probe_exe: Option<std::path::PathBuf>,
    /// The adapter to use, found once: `None` inside when there is none to
    /// use (under `auto`: none at all, or only a software one).
    adapter: OnceLock<Option<Adapter>>,
    /// Opened on first use (at start under `required`): under `auto` on a
    /// software adapter nothing uses it, and an idle lavapipe device alone
    /// costs ~70 MiB of RSS.
    current: Mutex<Option<Arc<Device>>>,
    /// A device was opened (under `auto`: the tally reached its cost).
    opened: AtomicBool,
    /// `auto`'s prices, and the time the CPU lost while no device was open.
    rates: OnceLock<Rates>,
    tally: Tally,
}

/// An adapter and what it is.
struct Adapter {
    adapter: wgpu::Adapter,
    info: GpuInfo,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let info = self.adapter.get().map(|a| a.as_ref().map(|a| &a.info));
        f.debug_struct("Gpu").field("mode", &self.mode).field("info", &info).finish_non_exhaustive()
    }
}

/// Why `gpu = "required"` could not be honoured.
#[derive(Debug, Clone, thiserror::Error)]
#[error("gpu = \"required\" but {0}")]
pub struct GpuStartError(pub String);

/// The adapter wgpu offers on this machine: a real GPU when there is one
/// (high-performance preference), else a software Vulkan one; why none otherwise.
pub fn probe() -> Result<(wgpu::Adapter, GpuInfo), String> {
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor { backends: wgpu::Backends::VULKAN, ..wgpu::InstanceDescriptor::new_without_display_handle() });
    let options = wgpu::RequestAdapterOptions { power_preference: wgpu::PowerPreference::HighPerformance, ..Default::default() };
    let adapter = pollster::block_on(instance.request_adapter(&options))
        .map_err(|e| format!("no Vulkan adapter found ({e}); install a GPU driver or Mesa's software Vulkan (Debian: mesa-vulkan-drivers)"))?;
    let raw = adapter.get_info();
    let info = GpuInfo {
        name: raw.name.clone(),
        backend: format!("{:?}", raw.backend).to_lowercase(),
        device_type: format!("{:?}", raw.device_type),
        software: raw.device_type == wgpu::DeviceType::Cpu,
    };
    Ok((adapter, info))
}

/// What `kiln probe-gpu` prints: the adapter `auto` would use (`hardware
/// NAME`), or why there is none (`software NAME`, `none REASON`).
pub fn probe_report() -> String {
    match probe() {
        Ok((_, info)) if info.software => format!("software {info}"),
        Ok((_, info)) => format!("hardware {info}"),
        Err(reason) => format!("none {reason}"),
    }
}

/// The debug log line written when `auto` starts the probe child: tests
/// look for it.
pub const PROBE_CHILD_LOG: &str = "probing the GPU adapter in a child process";

/// Runs `exe probe-gpu` (at most 60 s): `Ok` when it found a real GPU,
/// else why not.
fn probe_in_child(exe: &std::path::Path) -> Result<(), String> {
    tracing::debug!(exe = %exe.display(), "{PROBE_CHILD_LOG}");
    let mut child = std::process::Command::new(exe)
        .arg("probe-gpu")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot run {} probe-gpu: {e}", exe.display()))?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            // Short sleeps: a node waits for this probe (~30–40 ms here).
            Ok(None) if std::time::Instant::now() < deadline => std::thread::sleep(std::time::Duration::from_millis(2)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err("the GPU probe did not finish in 60 s".into());
            }
        }
    }
    let mut out = String::new();
    if let Some(mut stdout) = child.stdout.take() {
        let _ = std::io::Read::read_to_string(&mut std::io::Read::take(&mut stdout, 64 << 10), &mut out);
    }
    match out.lines().next().unwrap_or("none the probe printed nothing").split_once(' ') {
        Some(("hardware", _)) => Ok(()),
        Some(("software", info)) => Err(format!("only a software adapter ({info}); gpu = \"required\" uses it")),
        Some((_, reason)) => Err(reason.to_string()),
        None => Err("the probe printed nothing".into()),
    }
}

/// One GPU per process and setting: devices are expensive, and every
/// runtime of a process shares the adapter (and `auto`'s one probe).
static SHARED: Mutex<Vec<SharedGpu>> = Mutex::new(Vec::new());

/// A setting and the GPU it started.
type SharedGpu = ((GpuMode, GpuLimits), Arc<Gpu>);

impl Gpu {
    /// The GPU for `mode`: `None` when off; an error when `required` finds
    /// no adapter (a software one counts), probed here and logged.
    ///
    /// Under `auto` nothing is probed here: the adapter is looked for the
    /// first time a node would use it ([`Gpu::prefers`] for a large enough
    /// result, [`Gpu::offered`], [`Gpu::device`]), once per process, so a
    /// run whose nodes all stay on the CPU never pays for it (~40 ms here,
    /// ~200 ms on a GPU server). `probe_exe` (the kiln executable, when kiln
    /// runs as one): that probe runs first in a child (`kiln probe-gpu`),
    /// and the driver is loaded into this process only for a real GPU —
    /// loading Mesa's software Vulkan costs ~50 MiB here and keeps ~110 MiB
    /// more of a busy server's memory from returning to the system
    /// (measured by the hostile suite), for an adapter `auto` would not use.
    pub fn start(mode: GpuMode, limits: GpuLimits, probe_exe: Option<&std::path::Path>) -> Result<Option<Arc<Gpu>>, GpuStartError> {
        if mode == GpuMode::Off {
            return Ok(None);
        }
        let mut shared = SHARED.lock();
        if let Some((_, gpu)) = shared.iter().find(|(key, _)| *key == (mode, limits)) {
            return Ok(Some(gpu.clone()));
        }
        let gpu = Gpu {
            mode,
            limits,
            probe_exe: probe_exe.map(|p| p.to_path_buf()),
            adapter: OnceLock::new(),
            current: Mutex::new(None),
            opened: AtomicBool::new(false),
            rates: OnceLock::new(),
            tally: Tally::default(),
        };
        if mode == GpuMode::Required {
            let (adapter, info) = probe().map_err(GpuStartError)?;
            let device = Device::create(&adapter, &limits, 0).map_err(GpuStartError)?;
            tracing::info!(adapter = %info, ?mode, "GPU ready");
            *gpu.current.lock() = Some(Arc::new(device));
            gpu.opened.store(true, Ordering::Release);
            let _ = gpu.adapter.set(Some(Adapter { adapter, info }));
        }
        let gpu = Arc::new(gpu);
        shared.push(((mode, limits), gpu.clone()));
        Ok(Some(gpu))
    }

    /// The adapter to use: under `auto` probed on the first call (the
    /// callers of other threads wait for that one), logged either way.
    fn adapter(&self) -> Option<&Adapter> {
        self.adapter.get_or_init(|| self.find_adapter()).as_ref()
    }

    /// `auto`'s probe: a real GPU or nothing.
    fn find_adapter(&self) -> Option<Adapter> {
        if let Some(exe) = &self.probe_exe
            && let Err(reason) = probe_in_child(exe)
        {
            tracing::info!(%reason, "no GPU to use under gpu = \"auto\": nodes compute on the CPU");
            return None;
        }
        match probe() {
            Ok((_, info)) if info.software => {
                tracing::info!(adapter = %info, "only a software GPU adapter: under gpu = \"auto\" nodes compute on the CPU (gpu = \"required\" uses it)");
                None
            }
            Ok((adapter, info)) => {
                tracing::info!(adapter = %info, mode = ?self.mode, "GPU ready");
                Some(Adapter { adapter, info })
            }
            Err(reason) => {
                tracing::info!(%reason, "no GPU: nodes compute on the CPU");
                None
            }
        }
    }

    /// The adapter in use, `None` when there is none to use; under `auto`
    /// this probes it if nothing has yet.
    pub fn info(&self) -> Option<&GpuInfo> {
        self.adapter().map(|a| &a.info)
    }

    /// The configured mode.
    pub fn mode(&self) -> GpuMode {
        self.mode
    }

    /// The bounds on plugins' kernels.
    pub fn limits(&self) -> &GpuLimits {
        &self.limits
    }

    /// The live device: opened on first use, re-created first if the
    /// current one was lost.
    pub fn device(&self) -> Result<Arc<Device>, GpuError> {
        let adapter = self.adapter().ok_or(GpuError::Unavailable)?;
        let mut current = self.current.lock();
        let generation = match current.as_ref() {
            Some(device) if !device.is_lost() => return Ok(device.clone()),
            Some(lost) => {
                tracing::warn!(generation = lost.generation() + 1, "GPU device lost: recreating it");
                lost.generation() + 1
            }
            None => 0,
        };
        let device = Arc::new(Device::create(&adapter.adapter, &self.limits, generation).map_err(|e| {
            tracing::error!(error = %e, "cannot open the GPU device");
            if generation == 0 { GpuError::Driver(e) } else { GpuError::DeviceLost }
        })?);
        *current = Some(device.clone());
        self.opened.store(true, Ordering::Release);
        Ok(device)
    }

    /// Whether nodes see the GPU at all (`gpu.available()`): under
    /// `required`, or under `auto` on a real GPU (a software adapter is
    /// slower than the host's CPU kernels, so `auto` keeps to the CPU there).
    /// Under `auto` the first call probes the adapter.
    pub fn offered(&self) -> bool {
        match self.mode {
            GpuMode::Off => false,
            GpuMode::Required => true,
            GpuMode::Auto => self.adapter().is_some(),
        }
    }

    /// Whether a kernel call described by `estimate` runs here: always
    /// under `required`; under `auto` when an input already lives on the
    /// device, or for a result of at least `min_auto_elements` that
    /// [`policy`] prices faster here, transfers included, once the device
    /// is open (or the tally of forgone savings reached its opening's cost:
    /// then this call probes the adapter and opens it). A call that stays
    /// on the CPU never probes.
    pub fn prefers(&self, estimate: &Estimate) -> bool {
        match self.mode {
            GpuMode::Off => false,
            GpuMode::Required => true,
            GpuMode::Auto if estimate.resident => true,
            GpuMode::Auto if estimate.values < self.limits.min_auto_elements as u64 => false,
            // Probed, and nothing to use.
            GpuMode::Auto if matches!(self.adapter.get(), Some(None)) => false,
            GpuMode::Auto => match self.tally.choose(estimate, self.rates(), self.opened.load(Ordering::Acquire)) {
                Choice::Cpu => false,
                Choice::Gpu => true,
                Choice::Open => self.adapter().is_some(),
            },
        }
    }

    /// `auto`'s prices, for the kernels' threads (asked on first use: that
    /// starts their pool, which a run that never prices a kernel need not).
    pub fn rates(&self) -> &Rates {
        self.rates.get_or_init(|| Rates::for_cores(kiln_kernels::threads()))
    }

    /// Whether a device was opened (under `auto`, only once worth it).
    pub fn opened(&self) -> bool {
        self.opened.load(Ordering::Acquire)
    }

    /// Nanoseconds the GPU would have saved while no device was open (`auto`).
    pub fn forgone_ns(&self) -> u64 {
        self.tally.forgone_ns()
    }
}

/// How long to wait for GPU work that has no node deadline (read-backs).
pub(crate) const TRANSFER_TIMEOUT: Duration = Duration::from_secs(120);
