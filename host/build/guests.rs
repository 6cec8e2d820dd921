// Builds WebAssembly guest crates of this workspace for wasm32-wasip2 from a
// build script, with a nested `cargo build` into its own target directory
// (shared by every build of the host, so guests compile once per change).
// Included by `host/build.rs` and `tests/build.rs`.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The target the guests build for.
const TARGET: &str = "wasm32-wasip2";

/// Builds `packages` and copies `<artifact>.wasm` for each into `OUT_DIR`.
pub fn build_guests(packages: &[(&str, &str)]) {
    let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let root = manifest_dir.parent().expect("workspace root").to_path_buf();
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    // host/kernels: the guests link kiln-kernels (the same code the host runs).
    for path in ["wit", "sdk", "plugins", "examples/custom-node", "tests/guests", "host/kernels", "Cargo.lock"] {
        println!("cargo:rerun-if-changed={}", root.join(path).display());
    }
    println!("cargo:rerun-if-env-changed=KILN_GUEST_TARGET_DIR");
    let target_dir = match std::env::var_os("KILN_GUEST_TARGET_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => cargo_target_dir(&out_dir).join("wasm-guests"),
    };
    ensure_target(&target_dir);
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(&root).args(["build", "--target", "wasm32-wasip2", "--profile", "guest"]).arg("--target-dir").arg(&target_dir);
    for (package, _) in packages {
        cmd.args(["-p", package]);
    }
    // The outer build's settings are for the host, not for the guests.
    for var in [
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "CARGO_BUILD_RUSTFLAGS",
        "RUSTC_BOOTSTRAP",
    ] {
        cmd.env_remove(var);
    }
    // 128-bit SIMD: Cranelift compiles it to SSE/AVX, and the pixel loops
    // auto-vectorize. 4 MiB of initial linear memory (the linker's default
    // is the data and 1 MiB of stack, leaving the allocator no heap): a
    // small node call then never grows its memory, and wasmtime need not
    // shrink the instance slot back with `mprotect` before the next call —
    // a TLB shootdown across the process's CPUs each time. Untouched pages
    // cost nothing. LoadImage of a 64² PNG: 84–100 → 70 µs (BENCHMARKS.md).
    cmd.env("CARGO_ENCODED_RUSTFLAGS", "-Ctarget-feature=+simd128\x1f-Clink-arg=--initial-memory=4194304");
    let status = cmd.status().expect("running cargo to build the wasm guests");
    assert!(status.success(), "building the wasm guests failed (see the errors above)");
    for (_, artifact) in packages {
        let from = target_dir.join("wasm32-wasip2/guest").join(format!("{artifact}.wasm"));
        let to = out_dir.join(format!("{artifact}.wasm"));
        std::fs::copy(&from, &to).unwrap_or_else(|e| panic!("copying {} to {}: {e}", from.display(), to.display()));
    }
}

/// Makes sure the toolchain has the standard library for [`TARGET`].
/// rustup installs the targets `rust-toolchain.toml` names only when it
/// installs the toolchain itself, so a machine whose Rust 1.95 came first
/// lacks it, and the guests' build would fail deep inside with "can't find
/// crate for `core`". Under rustup the target is added here (saying so);
/// otherwise, or when that fails (offline), the build stops at once with
/// the one command to run. Concurrent build scripts (the host's and the
/// suites') take turns through a lock file in the guests' target folder.
fn ensure_target(target_dir: &Path) {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let has_target = || {
        let out = Command::new(&rustc).args(["--print", "target-libdir", "--target", TARGET]).output();
        out.ok()
            .filter(|o| o.status.success())
            .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()))
            .is_some_and(|dir| std::fs::read_dir(dir).is_ok_and(|entries| entries.flatten().any(|e| e.file_name().to_string_lossy().starts_with("libcore-"))))
    };
    if has_target() {
        return;
    }
    let toolchain = std::env::var("RUSTUP_TOOLCHAIN").ok();
    let command = match &toolchain {
        Some(t) => format!("rustup target add {TARGET} --toolchain {t}"),
        None => format!("rustup target add {TARGET}"),
    };
    if let Some(toolchain) = &toolchain {
        let _ = std::fs::create_dir_all(target_dir);
        let lock = std::fs::File::create(target_dir.join(".target-install.lock"));
        let _turn = lock.as_ref().ok().map(|f| f.lock());
        if has_target() {
            return;
        }
        println!("cargo:warning=this Rust toolchain ({toolchain}) lacks the {TARGET} target that kiln's plugins build for: installing it (`{command}`)");
        let added = Command::new("rustup").args(["target", "add", TARGET, "--toolchain", toolchain]).status().is_ok_and(|s| s.success());
        if added && has_target() {
            return;
        }
    }
    eprintln!(
        "\nerror: kiln's plugins build for {TARGET}, and this Rust toolchain does not have that target{}.\n\
         Run once:\n\n    {command}\n\nthen build again.\n",
        if toolchain.is_some() { " (installing it through rustup failed; see above)" } else { "" }
    );
    std::process::exit(1);
}

/// The target directory of the outer build: the nearest ancestor of `OUT_DIR`
/// that cargo marked with `CACHEDIR.TAG`.
fn cargo_target_dir(out_dir: &Path) -> PathBuf {
    out_dir.ancestors().find(|p| p.join("CACHEDIR.TAG").is_file()).map(Path::to_path_buf).unwrap_or_else(|| out_dir.join("guest-target"))
}
