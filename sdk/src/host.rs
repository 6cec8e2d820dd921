//! Services the host offers a running node: progress, previews, input and
//! output files (GPU kernels: [`crate::gpu`]).

pub use crate::bindings::kiln::plugin::gpu;
use crate::bindings::kiln::plugin::host as wit;
use crate::io::Tensor;

pub use wit::{FileKind, SavedFile};

/// Reports that `step` of `steps` units of this node's work are done.
pub fn progress(step: u64, steps: u64) {
    wit::progress(step, steps)
}

/// Shows an intermediate image to watching clients.
pub fn preview(image: &Tensor) {
    wit::preview(image)
}

/// Shows a line of progress text to watching clients (the host keeps the
/// first 4 KiB).
pub fn progress_text(text: &str) {
    wit::progress_text(text)
}

/// Reads the uploaded input file called `name`.
pub fn read_input(name: &str) -> Result<Vec<u8>, String> {
    wit::read_input(name)
}

/// A secret of the job, e.g. `"api_key_svc_org"` (a partner key from the
/// request's `extra_data`): `None` unless this plugin's manifest asks for
/// it under `[capabilities] secrets` and the operator granted it.
pub fn secret(name: &str) -> Option<String> {
    wit::secret(name)
}

/// Marks the node's coming failure as "insufficient funds" (a partner
/// service answered 402): clients see `InsufficientFundsError`.
pub fn insufficient_funds(message: &str) {
    wit::insufficient_funds(message)
}

/// Stores a file; the host names it `<prefix>_<counter:05>_.<extension>`.
pub fn save_file(kind: FileKind, prefix: &str, extension: &str, data: &[u8]) -> Result<SavedFile, String> {
    wit::save_file(kind, prefix, extension, data)
}
