//! GPU benchmark: the four workflows of the GPU path under `gpu = off`,
//! `auto` and `required` in one process (whole-run and per-node medians),
//! then the device on its own: the fixed cost of a host kernel call, the
//! driver allocations per call, the resident 4096² invert in GB/s (one
//! call, and many dispatches in one submission), and read-back throughput.
//!
//! `cargo bench -p kiln-tests --bench gpu`; `KILN_BENCH_BANDWIDTH_GBS`: the
//! device's memory bandwidth, to print the invert as a fraction of it;
//! `KILN_BENCH_WRITE_INPUTS=DIR`: only write the input PNGs (64², 2048²,
//! 4096²) for whole-process runs (`tests/benches/gpu-box.sh`);
//! `KILN_BENCH_DEVICE_ONLY=1`: only the device figures;
//! `KILN_BENCH_PROFILE_CALLS=N` (with it): only N chained host kernel calls,
//! for a profiler. Figures go to
//! BENCHMARKS.md.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kiln::config::Config;
use kiln::executor::Executor;
use kiln::files::NamedInputs;
use kiln::gpu::dispatch::{Bound, Cutoff, Dispatch, When, submit};
use kiln::gpu::{Gpu, GpuLimits, GpuMode};
use kiln::plugins::{NodeRegistry, PluginRuntime};
use serde_json::{Value, json};

mod common;
use common::{run_timed, write_input};

/// The workflows: name, input side, runs, workflow (its input is `input.png`).
fn workflows() -> Vec<(&'static str, u32, usize, Value)> {
    let load = json!({"class_type": "LoadImage", "inputs": {"image": "input.png"}});
    let heavy = json!({
        "1": load,
        "2": {"class_type": "ImageScaleBy", "inputs": {"image": ["1", 0], "upscale_method": "bilinear", "scale_by": 1.5}},
        "3": {"class_type": "ImageBlur", "inputs": {"image": ["2", 0], "blur_radius": 8, "sigma": 4.0}},
        "4": {"class_type": "ImageSharpen", "inputs": {"image": ["3", 0], "sharpen_radius": 2, "sigma": 1.0, "alpha": 1.0}},
        "5": {"class_type": "SaveImage", "inputs": {"images": ["4", 0], "filename_prefix": "heavy"}}
    });
    let blur_chain = json!({
        "1": load,
        "2": {"class_type": "ImageBlur", "inputs": {"image": ["1", 0], "blur_radius": 31, "sigma": 10.0}},
        "3": {"class_type": "ImageSharpen", "inputs": {"image": ["2", 0], "sharpen_radius": 2, "sigma": 1.0, "alpha": 1.0}},
        "4": {"class_type": "ImageInvert", "inputs": {"image": ["3", 0]}},
        "5": {"class_type": "ImageScaleBy", "inputs": {"image": ["4", 0], "upscale_method": "bilinear", "scale_by": 0.25}},
        "6": {"class_type": "SaveImage", "inputs": {"images": ["5", 0], "filename_prefix": "blur-chain"}}
    });
    let trivial = json!({"1": load, "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "trivial"}}});
    vec![("trivial 64²", 64, 10, trivial), ("heavy 2048²", 2048, 5, heavy.clone()), ("heavy 4096²", 4096, 3, heavy), ("blur chain 4096²", 4096, 3, blur_chain)]
}

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

fn main() {
    if let Some(dir) = std::env::var_os("KILN_BENCH_WRITE_INPUTS") {
        let dir = Path::new(&dir);
        std::fs::create_dir_all(dir).expect("input dir");
        for side in [64, 2048, 4096] {
            write_input(&dir.join(format!("input-{side}.png")), side, side);
        }
        return;
    }
    kiln::memory::tune_allocator();
    if std::env::var_os("KILN_BENCH_DEVICE_ONLY").is_none() {
        let rt = tokio::runtime::Runtime::new().expect("tokio");
        rt.block_on(workflows_in_process());
    }
    device_figures();
}

/// Each workflow under each mode, one executor per mode (so `auto`'s tally
/// carries over from run to run, as in a server).
async fn workflows_in_process() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("out");
    for mode in [GpuMode::Off, GpuMode::Auto, GpuMode::Required] {
        let config = Config { cache_dir: Some(dir.path().join("artifacts")), decommit_batch: 16, gpu: mode, ..Config::default() };
        let runtime_config = kiln::plugins::RuntimeConfig::from_config(&config).expect("config");
        let gpu = runtime_config.gpu.clone();
        let runtime = Arc::new(PluginRuntime::new(runtime_config).expect("runtime"));
        let registry = Arc::new(NodeRegistry::load_all(&runtime, &[]).await.expect("plugins"));
        let executor = Executor::new(runtime, 0, config.max_concurrency as usize);
        for (name, side, runs, workflow) in workflows() {
            let input = dir.path().join(format!("input-{side}.png"));
            if !input.exists() {
                write_input(&input, side, side);
            }
            let mut named = NamedInputs::new();
            named.insert("input.png", &input);
            let named = Arc::new(named);
            let _ = run_timed(&executor, &registry, &workflow, &named, &out).await;
            let (mut walls, mut per_class) = (Vec::new(), BTreeMap::<String, Vec<f64>>::new());
            for _ in 0..runs {
                let (wall, nodes) = run_timed(&executor, &registry, &workflow, &named, &out).await;
                walls.push(wall.as_secs_f64() * 1e3);
                for (class, ms) in nodes {
                    per_class.entry(class).or_default().push(ms);
                }
            }
            let nodes: Vec<String> = per_class.into_iter().map(|(class, ms)| format!("{class} {:.1}", median(ms))).collect();
            let device =
                gpu.as_ref().map_or("no device".to_string(), |g| format!("device opened: {}, forgone {:.0} ms", g.opened(), g.forgone_ns() as f64 / 1e6));
            println!("{name}, gpu = {mode:?} ({device}): median {:.1} ms over {runs}; per node (ms): {}", median(walls), nodes.join(", "));
        }
    }
}

/// The same with four values per invocation (`vec4` loads and stores).
const INVERT4: &str = "@group(0) @binding(1) var<storage, read> src: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> dst: array<vec4<f32>>;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) id: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = id.y * groups.x * 256u + id.x;
    if (i < arrayLength(&dst)) { dst[i] = vec4<f32>(1.0) - src[i]; }
}";

/// A bench-local invert kernel over `n` values (one value per invocation).
const INVERT: &str = "@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read_write> dst: array<f32>;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) id: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = id.y * groups.x * 256u + id.x;
    if (i < arrayLength(&dst)) { dst[i] = 1.0 - src[i]; }
}";

fn device_figures() {
    let Ok(Some(gpu)) = Gpu::start(GpuMode::Required, GpuLimits::default(), None) else {
        println!("no GPU adapter: no device figures");
        return;
    };
    let device = gpu.device().expect("device");
    let limits = *gpu.limits();
    let info = gpu.info().expect("an adapter");
    let cutoff = || Cutoff::at(Instant::now() + Duration::from_secs(120));
    println!("device: {info}; binds at most {} MiB, buffers of at most {} MiB", device.max_binding_bytes() >> 20, device.max_buffer_bytes() >> 20);

    // The fixed cost of a host kernel call: an invert of 256 resident
    // values. Pipelined: calls one after another, each reading the last's
    // result (a chain of GPU nodes), one read at the end; round trip: each
    // call's result read back.
    let tiny = device.upload(&vec![0.25; 256]).expect("upload");
    for _ in 0..20 {
        drop(kiln::gpu::ops::affine(&device, &limits, &tiny, -1.0, 1.0, &cutoff()).expect("warm-up"));
    }
    // `KILN_BENCH_PROFILE_CALLS=N`: only N chained calls, for a profiler.
    if let Some(n) = std::env::var("KILN_BENCH_PROFILE_CALLS").ok().and_then(|v| v.parse::<usize>().ok()) {
        let mut last = kiln::gpu::ops::affine(&device, &limits, &tiny, -1.0, 1.0, &cutoff()).expect("tiny invert");
        for _ in 1..n {
            last = kiln::gpu::ops::affine(&device, &limits, &last, -1.0, 1.0, &cutoff()).expect("tiny invert");
        }
        drop(last.read().expect("read"));
        return;
    }
    let calls = 500;
    let (created, reused) = device.buffer_counts();
    let submitted = device.submissions();
    let start = Instant::now();
    let mut last = kiln::gpu::ops::affine(&device, &limits, &tiny, -1.0, 1.0, &cutoff()).expect("tiny invert");
    for _ in 1..calls {
        last = kiln::gpu::ops::affine(&device, &limits, &last, -1.0, 1.0, &cutoff()).expect("tiny invert");
    }
    let chained = last.read().expect("read");
    let per_call = start.elapsed().as_secs_f64() / calls as f64;
    // An even number of inverts of 0.25: 0.25 again (an odd one: 0.75).
    assert!(chained.iter().all(|&v| (v - 0.25).abs() < 1e-6), "the chain computed");
    let (created2, reused2) = device.buffer_counts();
    println!(
        "host kernel call on 256 resident values, chained (result buffer + uniforms + dispatch; one read at the end): {:.1} µs per call; driver allocations per call {:.3}, pooled buffers per call {:.2}, submissions per call {:.3}",
        per_call * 1e6,
        (created2 - created) as f64 / calls as f64,
        (reused2 - reused) as f64 / calls as f64,
        (device.submissions() - submitted) as f64 / calls as f64
    );
    let start = Instant::now();
    for _ in 0..200 {
        std::hint::black_box(kiln::gpu::ops::affine(&device, &limits, &tiny, -1.0, 1.0, &cutoff()).expect("tiny invert").read().expect("read"));
    }
    println!(
        "host kernel call on 256 resident values with its read-back (two submissions, two waits): {:.1} µs per call",
        start.elapsed().as_secs_f64() / 200.0 * 1e6
    );
    let start = Instant::now();
    for _ in 0..200 {
        let out = kiln::gpu::ops::affine(&device, &limits, &tiny, -1.0, 1.0, &cutoff()).expect("tiny invert");
        device.finish(Instant::now() + Duration::from_secs(60)).expect("finish");
        drop(out);
    }
    println!("host kernel call on 256 resident values and a wait for it (round trip): {:.1} µs per call", start.elapsed().as_secs_f64() / 200.0 * 1e6);

    // The resident 4096² one-channel invert (64 MiB in, 64 MiB out).
    let values = 4096 * 4096;
    let data: Vec<f32> = (0..values).map(|i| (i % 251) as f32 / 251.0).collect();
    let bytes = (values * 4 * 2) as f64;
    let bandwidth = std::env::var("KILN_BENCH_BANDWIDTH_GBS").ok().and_then(|v| v.parse::<f64>().ok());
    // One line per figure of the resident invert: its time, its GB/s and,
    // given the device's bandwidth, the share of it.
    let report = |what: &str, t: f64| {
        let gbs = bytes / t / 1e9;
        let share = bandwidth.map_or(String::new(), |b| format!(" ({:.0} % of {b:.0} GB/s)", 100.0 * gbs / b));
        println!("invert 4096² (one channel) resident, {what}: {:.3} ms, {gbs:.1} GB/s{share}", t * 1e3);
    };
    let never = || false;
    let start = Instant::now();
    for _ in 0..5 {
        std::hint::black_box(kiln_kernels::convert::affine(&data, -1.0, 1.0, &never).expect("affine"));
    }
    let cpu = start.elapsed().as_secs_f64() / 5.0;
    println!("invert 4096² (one channel) on the CPU kernel, all cores: {:.2} ms, {:.1} GB/s", cpu * 1e3, bytes / cpu / 1e9);
    let src = device.upload(&data).expect("upload");
    for _ in 0..3 {
        drop(kiln::gpu::ops::affine(&device, &limits, &src, -1.0, 1.0, &cutoff()).expect("warm-up"));
    }
    // One host kernel call and a wait for it, median of 20.
    let call_and_wait = || {
        let samples = (0..20)
            .map(|_| {
                let start = Instant::now();
                let out = kiln::gpu::ops::affine(&device, &limits, &src, -1.0, 1.0, &cutoff()).expect("invert");
                device.finish(Instant::now() + Duration::from_secs(60)).expect("finish");
                drop(out);
                start.elapsed().as_secs_f64()
            })
            .collect();
        median(samples)
    };
    let t = call_and_wait();
    report("one host kernel call and a wait for it (pooled result + dispatch + wait)", t);

    // Many dispatches in one submission: the kernel's own throughput, after
    // a second of work (the device leaves its idle clocks), one value and
    // four values per invocation.
    let dst = device.zeroed(values).expect("dst");
    let bindings = [Bound::whole(1, &src, false), Bound::whole(2, &dst, true)];
    for (label, source, per_invocation) in [("one value", INVERT, 1), ("four values (vec4)", INVERT4, 4)] {
        let kernel = kiln::gpu::kernel::compile(&device, &limits, source, "main").expect("compile");
        let groups_needed = (values / per_invocation) as u32 / 256;
        let groups = (groups_needed.min(limits.max_workgroups_per_dim), groups_needed.div_ceil(limits.max_workgroups_per_dim), 1);
        let batch = 50;
        let dispatches: Vec<Dispatch<'_>> = (0..batch).map(|_| Dispatch { kernel: &kernel, bindings: &bindings, uniforms: &[], groups }).collect();
        let run_batch = || {
            let submission = submit(&device, &dispatches, &limits, When::Now).expect("submit").expect("work");
            device.wait(submission, Instant::now() + Duration::from_secs(60)).expect("wait");
        };
        let warm = Instant::now();
        while warm.elapsed() < Duration::from_secs(1) {
            run_batch();
        }
        let mut samples = Vec::new();
        for _ in 0..5 {
            let start = Instant::now();
            run_batch();
            samples.push(start.elapsed().as_secs_f64() / batch as f64);
        }
        let t = median(samples);
        report(&format!("{label} per invocation, {batch} dispatches per submission, per dispatch"), t);
        let expected = 1.0 - data[12345];
        assert!((dst.read().expect("read")[12345] - expected).abs() < 1e-6, "the batch computed the invert");
    }
    // The kernel alone again, each dispatch reading the last one's result
    // (two buffers in turn): what a chain of dependent kernels can reach
    // on the device, whoever submits them.
    {
        let kernel = kiln::gpu::kernel::compile(&device, &limits, INVERT4, "main").expect("compile");
        let (p, q) = (device.zeroed(values).expect("p"), device.zeroed(values).expect("q"));
        let forth = [Bound::whole(1, &p, false), Bound::whole(2, &q, true)];
        let back = [Bound::whole(1, &q, false), Bound::whole(2, &p, true)];
        let groups_needed = (values / 4) as u32 / 256;
        let groups = (groups_needed.min(limits.max_workgroups_per_dim), groups_needed.div_ceil(limits.max_workgroups_per_dim), 1);
        let batch = 50;
        let dispatches: Vec<Dispatch<'_>> =
            (0..batch).map(|i| Dispatch { kernel: &kernel, bindings: if i % 2 == 0 { &forth } else { &back }, uniforms: &[], groups }).collect();
        let run_batch = || {
            let submission = submit(&device, &dispatches, &limits, When::Now).expect("submit").expect("work");
            device.wait(submission, Instant::now() + Duration::from_secs(60)).expect("wait");
        };
        run_batch();
        let t = median(
            (0..5)
                .map(|_| {
                    let start = Instant::now();
                    run_batch();
                    start.elapsed().as_secs_f64() / batch as f64
                })
                .collect(),
        );
        report(&format!("four values (vec4) per invocation, {batch} dependent dispatches (each reads the last's result) per submission, per dispatch"), t);
    }
    // Host kernel calls on the resident image that do not depend on each
    // other (each inverts the same source, as a fan-out does), one wait.
    let independent = |calls: usize| {
        let start = Instant::now();
        let outs: Vec<_> = (0..calls).map(|_| kiln::gpu::ops::affine(&device, &limits, &src, -1.0, 1.0, &cutoff()).expect("invert")).collect();
        device.finish(Instant::now() + Duration::from_secs(60)).expect("finish");
        let t = start.elapsed().as_secs_f64() / calls as f64;
        drop(outs);
        t
    };
    independent(20);
    let t = median((0..5).map(|_| independent(20)).collect());
    report("20 independent host kernel calls (each from the same source), one wait, per call", t);
    // Host kernel calls chained on the resident image (each inverts the
    // last's result, as GPU nodes in a chain do), one wait at the end.
    let chained = |calls: usize| {
        let start = Instant::now();
        let mut last = kiln::gpu::ops::affine(&device, &limits, &src, -1.0, 1.0, &cutoff()).expect("invert");
        for _ in 1..calls {
            last = kiln::gpu::ops::affine(&device, &limits, &last, -1.0, 1.0, &cutoff()).expect("invert");
        }
        device.finish(Instant::now() + Duration::from_secs(60)).expect("finish");
        start.elapsed().as_secs_f64() / calls as f64
    };
    chained(20);
    let submitted = device.submissions();
    let t = median((0..5).map(|_| chained(20)).collect());
    let per_call = (device.submissions() - submitted) as f64 / 100.0;
    report(&format!("host kernel calls chained 20 deep, one wait ({per_call:.2} submissions per call), per call"), t);
    let t = median((0..3).map(|_| chained(200)).collect());
    report("host kernel calls chained 200 deep, one wait, per call", t);
    // The host kernel call again, now that the clocks are up.
    let t = call_and_wait();
    report("host kernel call after the warm-up", t);

    // Read-back of a 3072² RGB result (113 MB) through pooled staging.
    let big = device.upload(&vec![0.25; 3072 * 3072 * 3]).expect("upload");
    let _ = big.read().expect("warm-up");
    let mut samples = Vec::new();
    for _ in 0..5 {
        let start = Instant::now();
        std::hint::black_box(big.read().expect("read"));
        samples.push(start.elapsed().as_secs_f64());
    }
    let t = median(samples);
    println!("read-back of 3072² RGB (113 MB): median {:.1} ms, {:.1} GB/s; upload of the same: see the workflows' ImageScaleBy", t * 1e3, 113.2e6 / t / 1e9);
    drop(big);
    encode_after_read_back(&device, &limits);
    let (created, reused) = device.buffer_counts();
    println!("device buffers: {created} allocated by the driver, {reused} reused from the pool; {} MiB idle", device.idle_bytes() >> 20);
}

/// SaveImage's path for a 6144² RGB result on the device (the heavy
/// 4096² workflow's): its 8 bits read back whole and then encoded, against
/// read back in parts with each part compressed as it lands; and the
/// encode alone from host memory (the floor).
fn encode_after_read_back(device: &Arc<kiln::gpu::Device>, limits: &GpuLimits) {
    use kiln_kernels::codec;
    let dims = kiln_kernels::Dims { batch: 1, height: 6144, width: 6144, channels: 3 };
    let frame = dims.frame_len();
    // A smooth picture with a little texture: about what a blurred photograph compresses to.
    let values: Vec<f32> = (0..frame).map(|i| ((i / 3 % 6144) as f32 / 6144.0 + ((i * 7919) % 13) as f32 / 400.0).min(1.0)).collect();
    let src = device.upload(&values).expect("upload");
    drop(values);
    let packed = kiln::gpu::ops::to_u8(device, limits, &src, 0, frame, &Cutoff::at(Instant::now() + Duration::from_secs(120))).expect("to_u8");
    let never = || false;
    let whole = || {
        packed.map_read(Instant::now() + Duration::from_secs(60), |words| {
            let bytes: &[u8] = bytemuck::cast_slice(words);
            codec::encode_png_u8(&bytes[..frame], dims, Vec::new(), &never).expect("encode").len()
        })
    };
    let in_parts = || {
        packed.read_in_parts(frame, dims.row_len(), kiln::gpu::readback::READ_PART_BYTES, Instant::now() + Duration::from_secs(60), |parts| {
            let parts = parts.map(|p| p.map_err(|e| kiln_kernels::KernelError::Invalid(e.to_string())));
            codec::encode_png_parts(parts, dims, Vec::new(), &never).expect("encode").len()
        })
    };
    let host = packed.map_read(Instant::now() + Duration::from_secs(60), |words| bytemuck::cast_slice::<f32, u8>(words)[..frame].to_vec()).expect("read");
    let alone = || codec::encode_png_u8(&host, dims, Vec::new(), &never).expect("encode").len();
    let time = |f: &dyn Fn() -> usize| {
        f();
        median(
            (0..5)
                .map(|_| {
                    let start = Instant::now();
                    std::hint::black_box(f());
                    start.elapsed().as_secs_f64() * 1e3
                })
                .collect(),
        )
    };
    let (t_whole, t_parts, t_alone) = (time(&|| whole().expect("read")), time(&|| in_parts().expect("read")), time(&alone));
    println!(
        "SaveImage of a 6144² RGB result on the device (113 MB of 8 bits): read back whole then encoded {t_whole:.1} ms; read back in parts, each compressed as it lands {t_parts:.1} ms; the encode alone from host memory {t_alone:.1} ms ({} threads)",
        kiln_kernels::threads()
    );
}
