// Builds WebAssembly guest crates of this workspace for wasm32-wasip2 from a
// build script, with a nested `cargo build` into its own target directory
// (shared by every build of the host, so guests compile once per change).
// Included by `host/build.rs` and `tests/build.rs`.

use std::path::{Path, PathBuf};
use std::process::Command;

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
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(&root).args(["build", "--target", "wasm32-wasip2", "--profile", "guest"]).arg("--target-dir").arg(&target_dir);
    for (package, _) in packages {
        cmd.args(["-p", package]);
    }
    // The outer build's settings are for the host, not for the guests.
    for var in
        ["CARGO_TARGET_DIR", "CARGO_BUILD_TARGET", "RUSTFLAGS", "CARGO_ENCODED_RUSTFLAGS", "RUSTC_WRAPPER", "RUSTC_WORKSPACE_WRAPPER", "CARGO_BUILD_RUSTFLAGS"]
    {
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
    assert!(status.success(), "building the wasm guests failed (is the wasm32-wasip2 target installed? `rustup target add wasm32-wasip2`)");
    for (_, artifact) in packages {
        let from = target_dir.join("wasm32-wasip2/guest").join(format!("{artifact}.wasm"));
        let to = out_dir.join(format!("{artifact}.wasm"));
        std::fs::copy(&from, &to).unwrap_or_else(|e| panic!("copying {} to {}: {e}", from.display(), to.display()));
    }
}

/// The target directory of the outer build: the nearest ancestor of `OUT_DIR`
/// that cargo marked with `CACHEDIR.TAG`.
fn cargo_target_dir(out_dir: &Path) -> PathBuf {
    out_dir.ancestors().find(|p| p.join("CACHEDIR.TAG").is_file()).map(Path::to_path_buf).unwrap_or_else(|| out_dir.join("guest-target"))
}
