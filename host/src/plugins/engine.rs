//! The one wasmtime `Engine` of the process: its configuration, the pooling
//! allocator (with an on-demand fallback) and its per-component limits, the
//! compile-only engine of `kiln compile-component`, and the epoch ticker
//! that bounds guest CPU time and fires node deadlines.

use std::sync::Arc;
use std::time::Duration;

use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use super::deadlines::Deadlines;

/// How often the epoch advances: the granularity of timeouts and cancellation.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);

/// Most core instances one component may instantiate. A Rust
/// `wasm32-wasip2` plugin has 3 (the program and wit-component's two shims);
/// each limit below is at least twice what the bundled plugins use
/// (`bundled_plugins_fit_the_per_component_limits` prints the counts).
pub const CORE_INSTANCES_PER_COMPONENT: u32 = 8;
/// Most linear memories one component may define (a bundled plugin: 1).
pub const MEMORIES_PER_COMPONENT: u32 = 2;
/// Most tables one component may define (a bundled plugin: 2, the
/// program's and a shim's).
pub const TABLES_PER_COMPONENT: u32 = 4;

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
    // Each component instance may take at most its share of the pool's
    // core instances, memories and tables, and the totals are those shares
    // times the slots: one plugin (say, one defining a thousand memories)
    // is refused when it loads instead of taking every slot, and a call
    // holding a slot's permit always finds room. Per module, the defaults
    // (one memory, one table) are stated here so they are not changed by
    // accident.
    pool.total_component_instances(max_instances)
        .max_core_instances_per_component(CORE_INSTANCES_PER_COMPONENT)
        .max_memories_per_component(MEMORIES_PER_COMPONENT)
        .max_tables_per_component(TABLES_PER_COMPONENT)
        .max_memories_per_module(1)
        .max_tables_per_module(1)
        .total_core_instances(max_instances * CORE_INSTANCES_PER_COMPONENT)
        .total_memories(max_instances * MEMORIES_PER_COMPONENT)
        .total_tables(max_instances * TABLES_PER_COMPONENT)
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

/// An engine that only compiles, for `kiln compile-component`: the same
/// compilation settings as [`build_engine`]'s (so its artifacts load there;
/// the allocator and the profiler are not compilation settings), nothing
/// reserved for instances.
pub fn compile_engine() -> wasmtime::Result<Engine> {
    Engine::new(&base_config(false))
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

#[cfg(test)]
mod tests {
    use super::*;

    /// What one component defines, as the pooling allocator counts it:
    /// (core instances, memories, tables). Measured by loading it into a
    /// pool allowing 0 of one kind, whose refusal states the count.
    fn counts(artifact: &[u8]) -> [u32; 3] {
        let mut found = [0; 3];
        for (kind, count) in found.iter_mut().enumerate() {
            let mut pool = PoolingAllocationConfig::default();
            pool.total_component_instances(1).total_core_instances(64).total_memories(16).total_tables(16).total_stacks(1).max_memory_size(1 << 26);
            pool.max_core_instances_per_component(if kind == 0 { 0 } else { 64 })
                .max_memories_per_component(if kind == 1 { 0 } else { 16 })
                .max_tables_per_component(if kind == 2 { 0 } else { 16 });
            let engine = Engine::new(base_config(false).allocation_strategy(InstanceAllocationStrategy::Pooling(pool))).unwrap();
            // SAFETY: `artifact` was produced by `precompile_component` in this test.
            let refused = unsafe { wasmtime::component::Component::deserialize(&engine, artifact) }.err().map(|e| e.to_string()).unwrap_or_default();
            *count = refused.split("contains ").nth(1).and_then(|rest| rest.split(' ').next()).and_then(|n| n.parse().ok()).unwrap_or(0);
        }
        found
    }

    /// The per-component limits leave the bundled plugins at least twice
    /// what they use (printed: `cargo test -p kiln --lib engine -- --nocapture`).
    #[test]
    fn bundled_plugins_fit_the_per_component_limits() {
        let compiler = compile_engine().unwrap();
        for bundled in super::super::bundled::BUNDLED {
            let artifact = compiler.precompile_component(bundled.wasm).unwrap();
            let [core, memories, tables] = counts(&artifact);
            let name = bundled.manifest.lines().find(|l| l.starts_with("name")).unwrap_or_default();
            println!("{name}: {core} core instances, {memories} memories, {tables} tables");
            assert!(core > 0 && memories > 0, "measured nothing: {core} {memories} {tables}");
            assert!(2 * core <= CORE_INSTANCES_PER_COMPONENT, "{name}: {core} core instances");
            assert!(2 * memories <= MEMORIES_PER_COMPONENT, "{name}: {memories} memories");
            assert!(2 * tables <= TABLES_PER_COMPONENT, "{name}: {tables} tables");
        }
    }

    /// Artifacts of `kiln compile-component`'s engine load in the pooled
    /// engine: compilation settings are the same.
    #[test]
    fn the_compile_engine_matches_the_pooled_engine() {
        use std::hash::{Hash, Hasher};
        let hash = |engine: &Engine| {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            engine.precompile_compatibility_hash().hash(&mut h);
            h.finish()
        };
        let sizing = PoolSizing { instances: 2, max_memory_bytes: 1 << 30, decommit_batch: 1, keep_resident_bytes: 0 };
        let (pooled, _) = build_engine(sizing, true).unwrap();
        assert_eq!(hash(&compile_engine().unwrap()), hash(&pooled));
    }
}
