//! The one wasmtime `Engine` of the process: its configuration, the pooling
//! allocator (with an on-demand fallback) and the epoch ticker that bounds
//! guest CPU time and fires node deadlines.

use std::sync::Arc;
use std::time::Duration;

use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use super::deadlines::Deadlines;

/// How often the epoch advances: the granularity of timeouts and cancellation.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);

/// How instances get their memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allocator {
    /// Pre-reserved slots, copy-on-write memory images: microsecond instantiation.
    Pooling,
    /// mmap per instance; used when the pool's address space cannot be reserved.
    OnDemand,
}

/// How the instance pool is sized and how it recycles memory.
#[derive(Debug, Clone, Copy)]
pub struct PoolSizing {
    /// Live component instances at once.
    pub instances: u32,
    /// Most linear memory of one instance.
    pub max_memory_bytes: u64,
    /// Instance memories released together (see `Config::decommit_batch`).
    pub decommit_batch: usize,
    /// Linear memory a slot keeps resident between instances, reset in place.
    pub keep_resident_bytes: usize,
}

/// Builds the engine for `sizing`; with `perf_map`, JIT code is listed in
/// `/tmp/perf-<pid>.map` so `perf` can name guest functions.
pub fn build_engine(sizing: PoolSizing, perf_map: bool) -> wasmtime::Result<(Engine, Allocator)> {
    let PoolSizing { instances: max_instances, max_memory_bytes, decommit_batch, keep_resident_bytes } = sizing;
    let mut pool = PoolingAllocationConfig::default();
    // A Rust wasm32-wasip2 component instantiates a handful of core modules
    // (the program plus wit-component's shims), so core instances and tables
    // are sized as a multiple of component instances.
    pool.total_component_instances(max_instances)
        .total_core_instances(max_instances * 8)
        .total_memories(max_instances * 2)
        .total_tables(max_instances * 8)
        .total_stacks(max_instances)
        .max_memory_size(max_memory_bytes as usize)
        .table_elements(100_000)
        // Measured on the 200-node chain (BENCHMARKS.md): keeping linear
        // memory resident costs a memset of that size on every drop (slower
        // than the page faults it saves), while keeping tables and async
        // stacks resident saves syscalls per store. Batching decommits saves
        // ~10 µs per node call but keeps the memory of the last instances
        // resident until the batch fills — after a job on large images,
        // hundreds of MiB held by an idle server (measured: 308 vs 120 MiB).
        // The server decommits at once; a one-shot `kiln run` batches.
        .table_keep_resident(1 << 16)
        .async_stack_keep_resident(1 << 16)
        .decommit_batch_size(decommit_batch.max(1));
    // Each finished instance's memory is reset for the next one. By default
    // that unmaps every page it touched (`madvise`), and the next instance
    // faults each one back in: for a small node, the page faults cost as much
    // as its work. With the kernel's PAGEMAP_SCAN (Linux ≥ 6.7) wasmtime
    // finds the pages the instance dirtied and restores just those in place,
    // up to `keep_resident_bytes` per slot; the rest is unmapped as before.
    // Without PAGEMAP_SCAN keeping memory resident means a memset of the
    // whole kept region on every drop, which measured slower than the
    // faults, so it is only turned on with the scan (BENCHMARKS.md).
    if keep_resident_bytes > 0 && PoolingAllocationConfig::is_pagemap_scan_available() {
        pool.linear_memory_keep_resident(keep_resident_bytes).pagemap_scan(wasmtime::Enabled::Yes);
    }
    let pooled = Engine::new(base_config(perf_map).allocation_strategy(InstanceAllocationStrategy::Pooling(pool)));
    match pooled {
        Ok(engine) => Ok((engine, Allocator::Pooling)),
        Err(e) => {
            tracing::warn!(error = %e, "pooling allocator unavailable, falling back to on-demand allocation");
            Ok((Engine::new(&base_config(perf_map))?, Allocator::OnDemand))
        }
    }
}

fn base_config(perf_map: bool) -> Config {
    let mut config = Config::new();
    config.wasm_component_model(true).epoch_interruption(true).memory_init_cow(true).max_wasm_stack(1 << 20).async_stack_size(2 << 20);
    if perf_map {
        config.profiler(wasmtime::ProfilingStrategy::PerfMap);
    }
    config
}

/// Advances the engine's epoch every [`EPOCH_TICK`], and fires the node
/// deadlines that have passed, until the engine is dropped.
pub fn spawn_epoch_ticker(engine: &Engine, deadlines: Arc<Deadlines>) -> std::io::Result<()> {
    let weak = engine.weak();
    std::thread::Builder::new().name("kiln-epoch".into()).spawn(move || {
        loop {
            std::thread::sleep(EPOCH_TICK);
            match weak.upgrade() {
                Some(engine) => engine.increment_epoch(),
                None => break,
            }
            deadlines.fire_due(std::time::Instant::now());
        }
    })?;
    Ok(())
}
