//! Hostile nodes. Each misbehaves in one way a third-party plugin could; the
//! host suite checks that each is contained with the right failure kind and
//! that the host keeps working afterwards.

use std::hint::black_box;

use kiln_sdk::prelude::*;

fn sink(name: &str) -> NodeDef {
    NodeDef::new("testing/hostile").required("trigger", Kind::int().default(0)).output(name, "INT").output_node()
}

/// Spins forever: must hit the timeout, or be interrupted by cancellation.
pub const INFINITE_LOOP: NodeClass = NodeClass {
    class_type: "HostileInfiniteLoop",
    define: || sink("never"),
    run: |inputs| {
        let mut x = inputs.int("trigger")? as u64;
        loop {
            x = black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
    },
};

/// Allocates until it dies: must report out of memory.
pub const MEMORY_BOMB: NodeClass = NodeClass {
    class_type: "HostileMemoryBomb",
    define: || sink("never"),
    run: |_| {
        let mut hoard: Vec<Vec<u8>> = Vec::new();
        loop {
            hoard.push(black_box(vec![1u8; 16 << 20]));
            black_box(&hoard);
        }
    },
};

fn recurse(depth: u64, pad: [u64; 16]) -> u64 {
    let local = black_box([depth; 16]);
    if black_box(depth) == u64::MAX { pad[0] } else { recurse(depth + 1, local) + local[3] }
}

/// Recurses without bound: must be a contained stack overflow.
pub const DEEP_RECURSION: NodeClass = NodeClass {
    class_type: "HostileDeepRecursion",
    define: || sink("never"),
    run: |inputs| Ok(vec![Output::Int(recurse(inputs.int("trigger")? as u64, [0; 16]) as i64)]),
};

/// Panics: must be reported as a crash with the panic message.
pub const PANIC: NodeClass = NodeClass {
    class_type: "HostilePanic",
    define: || sink("never"),
    run: |inputs| {
        if black_box(inputs.int("trigger")?) >= 0 {
            panic!("hostile node panicked on purpose");
        }
        Ok(vec![Output::Int(0)])
    },
};

/// Creates host tensors far beyond the node's budget (ignoring the errors):
/// must fail with invalid output, without the host allocating them.
pub const OVERSIZED_OUTPUT: NodeClass = NodeClass {
    class_type: "HostileOversizedOutput",
    define: || NodeDef::new("testing/hostile").required("trigger", Kind::int().default(0)).output("IMAGE", "IMAGE").output_node(),
    run: |_| {
        let chunk = vec![0.5f32; 4 << 20]; // 16 MiB
        let mut kept = Vec::new();
        for _ in 0..64 {
            // 1 GiB in total; the test's budget is far smaller.
            if let Ok(t) = kiln_sdk::bindings::kiln::plugin::tensors::create(&[1, 1024, 1024, 4], &chunk) {
                kept.push(t);
            }
        }
        Ok(vec![Output::Tensor(kept.pop().ok_or("budget refused every tensor")?)])
    },
};

/// Returns a value of the wrong type for its declared output.
pub const WRONG_OUTPUT: NodeClass = NodeClass {
    class_type: "HostileWrongOutput",
    define: || NodeDef::new("testing/hostile").required("trigger", Kind::int().default(0)).output("IMAGE", "IMAGE").output_node(),
    run: |_| Ok(vec![Output::String("not an image".into())]),
};

/// Prints far more than the log keeps: must still succeed, log truncated.
pub const CHATTY: NodeClass = NodeClass {
    class_type: "HostileChatty",
    define: || sink("done"),
    run: |_| {
        for i in 0..20_000 {
            println!("line {i} of noise from a chatty plugin");
        }
        Ok(vec![Output::Int(1)])
    },
};

/// Tries to reach the host: files, environment, network. Reports what it saw.
pub const SNOOP: NodeClass = NodeClass {
    class_type: "HostileSnoop",
    define: || NodeDef::new("testing/hostile").required("trigger", Kind::int().default(0)).output("report", "STRING").output_node(),
    run: |_| {
        let mut seen = Vec::new();
        for path in ["/etc/passwd", "/proc/self/environ", ".", "/"] {
            if std::fs::read(path).is_ok() || std::fs::read_dir(path).is_ok() {
                seen.push(format!("read {path}"));
            }
        }
        if std::env::vars().next().is_some() {
            seen.push("environment".into());
        }
        if std::net::TcpStream::connect("127.0.0.1:1").is_ok() || std::net::UdpSocket::bind("127.0.0.1:0").is_ok() {
            seen.push("network".into());
        }
        Ok(vec![Output::String(seen.join(";"))])
    },
};

/// Sleeps on the host clock forever (a guest blocked in a host call).
pub const SLEEPER: NodeClass = NodeClass {
    class_type: "HostileSleeper",
    define: || sink("never"),
    run: |_| loop {
        std::thread::sleep(std::time::Duration::from_secs(3600));
    },
};

/// Calls every host kernel with arguments it must refuse; reports the calls
/// that were not refused (none, if the host validates everything).
pub const KERNEL_ABUSE: NodeClass = NodeClass {
    class_type: "HostileKernelAbuse",
    define: || NodeDef::new("testing/hostile").required("trigger", Kind::int().default(0)).output("report", "STRING").output_node(),
    run: |_| {
        use kiln_sdk::kernels::{self, Finish, Resample};
        let image = kernels::create_from_u8(&[1, 4, 4, 3], &[128; 48])?;
        let mask = kernels::create_from_u8(&[1, 4, 4], &[128; 16])?;
        let mut accepted = Vec::new();
        let mut expect_refused = |what: &str, ok: bool| {
            if ok {
                accepted.push(what.to_string());
            }
        };
        expect_refused("even taps", kernels::convolve(&image, &[0.5, 0.5], Finish::Blur).is_ok());
        expect_refused("asymmetric taps", kernels::convolve(&image, &[0.1, 0.7, 0.2], Finish::Blur).is_ok());
        expect_refused("nan taps", kernels::convolve(&image, &[f32::NAN], Finish::Blur).is_ok());
        expect_refused("radius beyond the image", kernels::convolve(&image, &[0.1; 9], Finish::Blur).is_ok());
        expect_refused("too many taps", kernels::convolve(&image, &vec![0.0; 257], Finish::Blur).is_ok());
        expect_refused("convolve a mask", kernels::convolve(&mask, &[1.0], Finish::Blur).is_ok());
        expect_refused("infinite sharpen", kernels::convolve(&image, &[1.0], Finish::Sharpen(f32::INFINITY)).is_ok());
        expect_refused("resize to zero", kernels::resize_image(&image, 0, 4, Resample::Bilinear, false).is_ok());
        expect_refused("resize beyond the side limit", kernels::resize_image(&image, 200_000, 4, Resample::Bilinear, false).is_ok());
        expect_refused("resize an image as a mask", kernels::resize_mask(&image, 8, 8, Resample::Bilinear).is_ok());
        expect_refused("non-finite affine", kernels::affine(&image, f32::NAN, 1.0).is_ok());
        expect_refused("read past the end", kernels::read_u8(&image, 40, 9).is_ok());
        expect_refused("read at a huge offset", kernels::read_u8(&image, usize::MAX, 1).is_ok());
        expect_refused("bytes not matching the shape", kernels::create_from_u8(&[1, 4, 4, 3], &[0; 47]).is_ok());
        expect_refused("zero-sized shape", kernels::create_from_u8(&[1, 0, 4, 3], &[]).is_ok());
        expect_refused("encode a mask", kernels::encode_png(&mask, 0, &[]).is_ok());
        expect_refused("encode an image past the batch", kernels::encode_png(&image, 1, &[]).is_ok());
        expect_refused("encode with an empty keyword", kernels::encode_png(&image, 0, &[(String::new(), "x".into())]).is_ok());
        expect_refused("encode with a keyword of 80 characters", kernels::encode_png(&image, 0, &[("k".repeat(80), "x".into())]).is_ok());
        // What the host accepts still works after all that.
        let fine = kernels::resize_image(&image, 8, 8, Resample::Bicubic, false)?;
        expect_refused("a valid resize failed", fine.shape() != [1, 8, 8, 3]);
        let png = kernels::encode_png(&image, 0, &[("prompt".into(), "{}".into())])?;
        expect_refused("a valid encode failed", !png.starts_with(b"\x89PNG"));
        Ok(vec![Output::String(accepted.join(";"))])
    },
};

/// One long host kernel: a 255-tap blur of a 2048×1024 RGB image (~3 G
/// multiply-adds), for cancellation while host code runs.
pub const KERNEL_HOG: NodeClass = NodeClass {
    class_type: "HostileKernelHog",
    define: || NodeDef::new("testing/hostile").required("trigger", Kind::int().default(0)).output("IMAGE", "IMAGE").output_node(),
    run: |_| {
        use kiln_sdk::kernels::{self, Finish};
        let pixels: Vec<u8> = (0..2048 * 1024 * 3).map(|i| (i % 251) as u8).collect();
        let image = kernels::create_from_u8(&[1, 1024, 2048, 3], &pixels)?;
        let taps = vec![1.0 / 255.0; 255];
        Ok(vec![Output::Tensor(kernels::convolve(&image, &taps, Finish::Blur)?)])
    },
};

/// A static the previous call may have written (in the module's data image).
static mut STATIC_MARKS: [i64; 4096] = [0; 4096];

/// Tags this node's marks (the allocator's own bookkeeping can leave other
/// non-zero words in a fresh heap block).
const MARK_TAG: i64 = 0x6b69_6c6e << 32;

/// Looks for marks an earlier call left in linear memory — in a static and in
/// a 2 MiB heap block (part of it within the pages the host keeps resident
/// per instance slot, part beyond) — then leaves its own. Reports the first
/// mark found: 0 when every call starts from fresh memory, as it must.
pub const REMEMBER: NodeClass = NodeClass {
    class_type: "HostileRemember",
    define: || NodeDef::new("testing/hostile").required("trigger", Kind::int().default(0)).output("found", "INT").output_node(),
    run: |inputs| {
        let mark = MARK_TAG | (inputs.int("trigger")? & 0xffff_ffff);
        let words = (2 << 20) / 8;
        let layout = std::alloc::Layout::from_size_align(words * 8, 8).map_err(|e| Error::failed(e.to_string()))?;
        let mut found = 0;
        // SAFETY: a wasm guest's memory is plain bytes; reading the block
        // before writing it is the point (volatile, so it is not elided).
        unsafe {
            let block = std::alloc::alloc(layout).cast::<i64>();
            if block.is_null() {
                return Err(Error::failed("no memory"));
            }
            let statics = (&raw mut STATIC_MARKS).cast::<i64>();
            for (base, len) in [(statics, 4096), (block, words)] {
                for i in 0..len {
                    let v = base.add(i).read_volatile();
                    if found == 0 && (v & !0xffff_ffff) == MARK_TAG {
                        found = v & 0xffff_ffff;
                    }
                    base.add(i).write_volatile(mark);
                }
            }
        }
        Ok(vec![Output::Int(found)])
    },
};

/// FNV-1a: lets a test check which secret arrived without writing it down.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf29ce484222325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100000001b3))
}

/// Reads the job's secrets (this plugin's manifest asks for
/// `api_key_svc_org`) and reports what it got — lengths and hashes, never
/// the values — as its output and in a saved text file.
pub const SECRET_PROBE: NodeClass = NodeClass {
    class_type: "HostileSecretProbe",
    define: || NodeDef::new("testing/hostile").required("trigger", Kind::int().default(0)).output("report", "STRING").output_node(),
    run: |inputs| {
        // Trigger 2: a careless partner node, echoing the key in what it
        // prints and in its error.
        if inputs.int("trigger")? == 2 {
            let key = kiln_sdk::host::secret("api_key_svc_org").unwrap_or_default();
            println!("calling the partner with key {key}");
            return Err(Error::failed(format!("partner said 401 for key {key}")));
        }
        let describe = |name: &str| match kiln_sdk::host::secret(name) {
            Some(value) => format!("{name}={}:{:016x}", value.len(), fnv1a(value.as_bytes())),
            None => format!("{name}=none"),
        };
        let report = format!("{} {}", describe("api_key_svc_org"), describe("something_else"));
        kiln_sdk::host::save_file(kiln_sdk::host::FileKind::Output, "secret-probe", "txt", report.as_bytes()).map_err(Error::failed)?;
        Ok(vec![Output::String(report)])
    },
};

/// Saves `trigger` empty files under a prefix of `prefix_kb` KiB, ignoring
/// refusals the way a careless plugin would: names and file counts must be
/// bounded and charged however the plugin behaves.
pub const FILE_FLOOD: NodeClass = NodeClass {
    class_type: "HostileFileFlood",
    define: || {
        NodeDef::new("testing/hostile")
            .required("trigger", Kind::int().default(0))
            .required("prefix_kb", Kind::int().default(0))
            .output("saved", "INT")
            .output_node()
    },
    run: |inputs| {
        let count = inputs.int("trigger")?.max(0);
        let kb = inputs.int("prefix_kb")?.clamp(0, 1 << 10) as usize;
        let prefix = if kb == 0 { "f".to_string() } else { "f".repeat(kb << 10) };
        let mut saved = 0;
        for _ in 0..count {
            if kiln_sdk::host::save_file(kiln_sdk::host::FileKind::Output, &prefix, "bin", &[]).is_ok() {
                saved += 1;
            }
        }
        Ok(vec![Output::Int(saved)])
    },
};

kiln_sdk::export_plugin!(
    FILE_FLOOD,
    SECRET_PROBE,
    INFINITE_LOOP,
    MEMORY_BOMB,
    DEEP_RECURSION,
    PANIC,
    OVERSIZED_OUTPUT,
    WRONG_OUTPUT,
    CHATTY,
    SNOOP,
    SLEEPER,
    KERNEL_ABUSE,
    KERNEL_HOG,
    REMEMBER,
    CLOCK_PROBE,
    PREVIEW_TEXT,
    GPU_ATTACK
);

/// Reports what a watching client is shown: a preview image (a 4×4 tensor
/// of `trigger`'s shade), a line of progress text (`trigger` × 1 KiB of
/// text past the first line, to test the host's bound) and progress.
pub const PREVIEW_TEXT: NodeClass = NodeClass {
    class_type: "HostilePreviewText",
    define: || sink("shown"),
    run: |inputs| {
        let trigger = inputs.int("trigger")?;
        let shade = (trigger.rem_euclid(10) as f32) / 10.0;
        let image = kiln_sdk::bindings::kiln::plugin::tensors::create(&[1, 4, 4, 3], &[shade; 48]).map_err(|e| Error::failed(format!("{e:?}")))?;
        kiln_sdk::host::progress(1, 2);
        kiln_sdk::host::preview(&image);
        let mut text = format!("width: 4, height: 4\n batch size: {trigger}");
        text.push_str(&"x".repeat(trigger.clamp(0, 64) as usize * 1024));
        kiln_sdk::host::progress_text(&text);
        kiln_sdk::host::progress(2, 2);
        Ok(vec![Output::Int(trigger)])
    },
};

/// Reads the wall clock, the monotonic clock (twice), random bytes
/// (`wasi:random/random`, through wasi-libc's `getentropy`) and a hash keyed
/// by std's `RandomState` (seeded from `wasi:random`), and reports them — as
/// its output and in a saved text file. Under the host's virtual clocks and
/// seeded randomness every call with the same inputs reports the same.
pub const CLOCK_PROBE: NodeClass = NodeClass {
    class_type: "HostileClockProbe",
    define: || NodeDef::new("testing/hostile").required("trigger", Kind::int().default(0)).output("report", "STRING").output_node(),
    run: |_| {
        use std::hash::{BuildHasher, Hasher};
        unsafe extern "C" {
            fn getentropy(buffer: *mut u8, len: usize) -> i32;
        }
        let wall = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_err(|e| Error::failed(e.to_string()))?;
        let start = std::time::Instant::now();
        let step = start.elapsed();
        let mut random = [0u8; 16];
        // SAFETY: writes `random.len()` bytes into `random`.
        if unsafe { getentropy(random.as_mut_ptr(), random.len()) } != 0 {
            return Err(Error::failed("getentropy failed"));
        }
        let mut keyed = std::collections::hash_map::RandomState::new().build_hasher();
        keyed.write_u64(42);
        let hex: String = random.iter().map(|b| format!("{b:02x}")).collect();
        let report = format!("wall={}.{:09} step={} random={hex} keyed={:016x}", wall.as_secs(), wall.subsec_nanos(), step.as_nanos(), keyed.finish());
        kiln_sdk::host::save_file(kiln_sdk::host::FileKind::Output, "clock-probe", "txt", report.as_bytes()).map_err(Error::failed)?;
        Ok(vec![Output::String(report)])
    },
};

/// Attacks the host's GPU one way per `attack` and reports what happened
/// (`unavailable` without a GPU; `refused: …` with the host's error):
/// - `spin`: a kernel that loops forever; reports the value it wrote.
/// - `oob`: writes far outside its buffer; reports whether a neighbouring
///   tensor changed and what its own buffer holds.
/// - `huge_dispatch`: 65535³ workgroups.
/// - `bad_kernel`: WGSL that does not parse.
/// - `write_input`: binds a tensor it did not allocate as read-write.
/// - `huge_buffer`: allocates a 64 GiB tensor.
pub const GPU_ATTACK: NodeClass = NodeClass {
    class_type: "HostileGpu",
    define: || {
        NodeDef::new("testing/hostile")
            .required("attack", Kind::combo(&["spin", "oob", "huge_dispatch", "bad_kernel", "write_input", "huge_buffer"]))
            .output("report", "STRING")
            .output_node()
    },
    run: |inputs| {
        use kiln_sdk::bindings::kiln::plugin::{gpu, tensors};
        if !gpu::available() {
            return Ok(vec![Output::String("unavailable".into())]);
        }
        let refused = |e: gpu::GpuError| format!("refused: {e:?}");
        let report = match inputs.string("attack")? {
            "spin" => {
                let src = "@group(0) @binding(1) var<storage, read_write> out: array<f32>;
                    @compute @workgroup_size(64) fn main(@builtin(global_invocation_id) id: vec3<u32>) {
                        var n = 0.0; loop { n += 1.0; } out[id.x] = n; }";
                match gpu::compile(src, "main").and_then(|k| {
                    let out = gpu::allocate(&[64])?;
                    gpu::dispatch(&k, &[gpu::Binding { index: 1, tensor: &out, access: gpu::Access::ReadWrite }], &[], (1, 1, 1))?;
                    Ok(out.read()[0])
                }) {
                    Ok(v) => format!("finished: {v}"),
                    Err(e) => refused(e),
                }
            }
            "oob" => {
                let canary = tensors::create(&[1024], &[1.0; 1024]).map_err(|e| Error::failed(format!("{e:?}")))?;
                let src = "@group(0) @binding(1) var<storage, read_write> small: array<f32>;
                    @group(0) @binding(2) var<storage, read> canary: array<f32>;
                    @compute @workgroup_size(1) fn main() {
                        for (var i = 0u; i < 4096u; i++) { small[i * 7919u + 1000000u] = canary[i] * 42.0; }
                        small[arrayLength(&small) + 3u] = 42.0; }";
                match gpu::compile(src, "main").and_then(|k| {
                    let small = gpu::allocate(&[16])?;
                    let bindings = [
                        gpu::Binding { index: 1, tensor: &small, access: gpu::Access::ReadWrite },
                        gpu::Binding { index: 2, tensor: &canary, access: gpu::Access::Read },
                    ];
                    gpu::dispatch(&k, &bindings, &[], (1, 1, 1))?;
                    Ok(small.read())
                }) {
                    Ok(small) => {
                        let intact = canary.read().iter().all(|&v| v == 1.0);
                        let own = small.iter().all(|&v| v == 0.0 || v == 42.0);
                        format!("canary intact: {intact}; own buffer only 0 or 42: {own}")
                    }
                    Err(e) => refused(e),
                }
            }
            "huge_dispatch" => {
                let src = "@group(0) @binding(1) var<storage, read_write> out: array<f32>;
                    @compute @workgroup_size(256) fn main(@builtin(global_invocation_id) id: vec3<u32>) { out[id.x] = 1.0; }";
                match gpu::compile(src, "main").and_then(|k| {
                    let out = gpu::allocate(&[16])?;
                    gpu::dispatch(&k, &[gpu::Binding { index: 1, tensor: &out, access: gpu::Access::ReadWrite }], &[], (65_535, 65_535, 65_535))
                }) {
                    Ok(()) => "dispatched".into(),
                    Err(e) => refused(e),
                }
            }
            "bad_kernel" => match gpu::compile("@compute @workgroup_size(1) fn main( {", "main") {
                Ok(_) => "compiled".into(),
                Err(e) => refused(e),
            },
            "write_input" => {
                let input = tensors::create(&[4], &[1.0; 4]).map_err(|e| Error::failed(format!("{e:?}")))?;
                let src = "@group(0) @binding(1) var<storage, read_write> t: array<f32>;
                    @compute @workgroup_size(1) fn main() { t[0] = 9.0; }";
                match gpu::compile(src, "main")
                    .and_then(|k| gpu::dispatch(&k, &[gpu::Binding { index: 1, tensor: &input, access: gpu::Access::ReadWrite }], &[], (1, 1, 1)))
                {
                    Ok(()) => format!("written: {}", input.read()[0]),
                    Err(e) => refused(e),
                }
            }
            "huge_buffer" => match gpu::allocate(&[1 << 16, 1 << 16, 4]) {
                Ok(_) => "allocated".into(),
                Err(e) => refused(e),
            },
            other => return Err(Error::invalid(format!("unknown attack `{other}`"))),
        };
        Ok(vec![Output::String(report)])
    },
};
