//! An `LD_PRELOAD` library built from one source file with plain `rustc`
//! (no dependencies): the power-cut image (`tests/powercut/preload.rs`) and
//! the bench's slow disk (`benches/service/slow_sync.rs`).

use std::path::Path;
use std::process::Command;

/// Compiles `src` (relative to the `kiln` package) into the shared library
/// `out`.
pub fn compile(src: &str, crate_name: &str, out: &Path) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(src);
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let status = Command::new(rustc)
        .args(["--edition", "2024", "--crate-type", "cdylib", "--crate-name", crate_name, "-C", "opt-level=1", "-C", "panic=abort", "-o"])
        .arg(out)
        .arg(&src)
        .status()
        .expect("rustc runs");
    assert!(status.success(), "{} compiles", src.display());
}
