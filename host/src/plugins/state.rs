//! What a node's `Store` holds: its WASI context, resource table, limits and
//! the job-level services it may reach.

use std::sync::Arc;
use std::time::Instant;

use tokio_util::sync::CancellationToken;
use wasmtime::ResourceLimiter;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

use super::determinism::GuestWorld;
use super::log_pipe::LogPipe;
use super::network::OutboundPolicy;
use super::secrets::JobSecrets;
use crate::budget::{JobBudget, MemoryCharge};
use crate::files::{InputFiles, OutputFiles, SavedFile};
use crate::tensor::Tensor;

/// Something a running node tells the host besides its result.
#[derive(Debug, Clone)]
pub enum NodeSignal {
    /// `step` of `steps` done.
    Progress { step: u64, steps: u64 },
    /// An intermediate image to show watching clients.
    Preview(Tensor),
    /// A line of progress text to show watching clients (bounded by the host).
    Text(String),
}

/// The job-level services one node call may use.
#[derive(Clone)]
pub struct NodeIo {
    /// Uploaded inputs, by name.
    pub inputs: Arc<dyn InputFiles>,
    /// Where saved files go.
    pub outputs: Arc<dyn OutputFiles>,
    /// Receives progress and previews as they happen.
    pub signals: Arc<dyn Fn(NodeSignal) + Send + Sync>,
    /// The job's secrets (the runtime hands a node only what its plugin was granted).
    pub secrets: JobSecrets,
    /// The job's account: memory and saved files of every node call of the run.
    pub budget: Arc<JobBudget>,
    /// The node's cache key, which seeds its virtual randomness (see
    /// `determinism`), so a re-run computes what the cache holds. `None`
    /// (a call outside a run): the seed comes from its class and inputs.
    pub cache_key: Option<blake3::Hash>,
}

/// Limits applied to one store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreLimits {
    /// Ceiling on the sum of the instance's linear memories.
    pub memory_bytes: u64,
    /// Ceiling on the bytes of tensors the node creates on the host.
    pub tensor_bytes: u64,
    /// Ceiling on the bytes of files the node saves.
    pub file_bytes: u64,
    /// Ceiling on the number of files the node saves.
    pub max_files: u64,
    /// Ceiling on captured stdout + stderr.
    pub log_bytes: usize,
}

/// Tracks linear-memory growth across all of an instance's memories, charges
/// it to the job, and records why a grow was refused (so the trap that
/// usually follows can be reported as "out of memory" rather than a crash).
pub struct MemoryLimiter {
    limit: u64,
    used: u64,
    /// The job's share of the linear memories, given back with the store.
    charge: MemoryCharge,
    /// Why a grow was refused: the node's own ceiling (`None` inside) or the job's.
    pub(crate) denied: Option<Option<String>>,
}

impl ResourceLimiter for MemoryLimiter {
    fn memory_growing(&mut self, current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        let grow = desired.saturating_sub(current) as u64;
        if self.used.saturating_add(grow) > self.limit {
            self.denied = Some(None);
            return Ok(false);
        }
        if let Err(e) = self.charge.grow(grow) {
            self.denied = Some(Some(e.to_string()));
            return Ok(false);
        }
        self.used += grow;
        Ok(true)
    }
    fn table_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        Ok(desired <= 100_000)
    }
}

/// Why host code (a kernel) gave up part-way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopped {
    /// The node was cancelled.
    Cancelled,
    /// The node's deadline passed.
    Deadline,
}

/// What host code running on behalf of the node checks to stop early: epochs
/// only interrupt guest code.
pub struct StopState {
    pub(crate) cancel: CancellationToken,
    pub(crate) deadline: Instant,
    /// Set when a kernel stopped; the trap it returned is reported as this.
    pub(crate) stopped: Option<Stopped>,
}

impl StopState {
    /// Stops on `cancel` or at `deadline`.
    pub fn new(cancel: CancellationToken, deadline: Instant) -> StopState {
        StopState { cancel, deadline, stopped: None }
    }
}

/// The data of one node call's `Store`.
pub struct NodeState {
    pub(crate) wasi: WasiCtx,
    pub(crate) http: WasiHttpCtx,
    /// Where the plugin's outbound requests may go (see `network`).
    pub(crate) outbound: OutboundPolicy,
    pub(crate) table: ResourceTable,
    pub(crate) memory: MemoryLimiter,
    pub(crate) limits: StoreLimits,
    pub(crate) tensor_bytes: u64,
    /// Set when the node asked for more host memory (tensors, files) than allowed.
    pub(crate) over_budget: Option<String>,
    /// Set when the job's memory limit refused the node (reported as out of memory).
    pub(crate) job_out_of_memory: Option<String>,
    /// Set by `host.insufficient-funds`: the node's failure is reported as such.
    pub(crate) insufficient_funds: Option<String>,
    pub(crate) io: Option<NodeIo>,
    pub(crate) saved: Vec<SavedFile>,
    /// Bytes of the files in `saved` (kept, not re-summed per save).
    pub(crate) saved_bytes: u64,
    pub(crate) log: LogPipe,
    pub(crate) stop: StopState,
    /// The GPU as this node sees it (set by the runtime).
    pub(crate) gpu: super::gpu_calls::NodeGpu,
}

impl NodeState {
    /// A fresh state: no filesystem, sockets or arguments; the environment
    /// is the plugin's granted configuration (`env`); HTTP only as
    /// `outbound` allows; stdout and stderr go to a bounded log; clocks and
    /// randomness as `world` says.
    pub fn new(limits: StoreLimits, io: Option<NodeIo>, world: GuestWorld, stop: StopState, outbound: OutboundPolicy, env: &[(String, String)]) -> NodeState {
        let log = LogPipe::new(limits.log_bytes);
        let mut wasi = WasiCtx::builder();
        wasi.stdout(log.clone()).stderr(log.clone());
        wasi.envs(env);
        world.apply(&mut wasi);
        let wasi = wasi.build();
        let charge = io.as_ref().map_or_else(MemoryCharge::none, |io| io.budget.reserve(0).unwrap_or_default());
        NodeState {
            wasi,
            http: WasiHttpCtx::new(),
            outbound,
            table: ResourceTable::new(),
            memory: MemoryLimiter { limit: limits.memory_bytes, used: 0, charge, denied: None },
            limits,
            tensor_bytes: 0,
            over_budget: None,
            job_out_of_memory: None,
            insufficient_funds: None,
            io,
            saved: Vec::new(),
            saved_bytes: 0,
            log,
            stop,
            gpu: Default::default(),
        }
    }

    /// Takes `bytes` more of the node's host tensor budget and of the job's
    /// memory, or records and returns why not. The charge pays for the
    /// allocation while it lives: attach it to the tensor, or drop it when a
    /// host copy is gone.
    pub(crate) fn charge(&mut self, bytes: u64) -> Result<MemoryCharge, String> {
        if self.tensor_bytes.saturating_add(bytes) > self.limits.tensor_bytes {
            let msg = format!("a {} MiB tensor would exceed the node's tensor budget of {} MiB", bytes.div_ceil(1 << 20), self.limits.tensor_bytes >> 20);
            self.over_budget = Some(msg.clone());
            return Err(msg);
        }
        let charge = self.charge_job(bytes)?;
        self.tensor_bytes += bytes;
        Ok(charge)
    }

    /// Takes `bytes` of the job's memory for a host allocation made for this
    /// node (a copy, a kernel's scratch), or records and returns why not.
    pub(crate) fn charge_job(&mut self, bytes: u64) -> Result<MemoryCharge, String> {
        let Some(io) = &self.io else { return Ok(MemoryCharge::none()) };
        io.budget.reserve(bytes).map_err(|e| {
            let msg = e.to_string();
            self.job_out_of_memory = Some(msg.clone());
            msg
        })
    }
}

impl WasiView for NodeState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

impl WasiHttpView for NodeState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView { ctx: &mut self.http, table: &mut self.table, hooks: &mut self.outbound }
    }
}
