//! The host side of the plugin imports: tensors and host services (the GPU
//! is `gpu_calls`, pixel kernels `kernels`). Every function checks what the guest passes; refusals are
//! returned to the guest as errors, and budget overruns are also recorded so
//! the node fails with `invalid_output` even if the guest ignores the error.

use wasmtime::component::Resource;

use super::bindings::kiln::plugin::{host, tensors};
use super::state::{NodeSignal, NodeState};
use crate::files::FileKind;
use crate::tensor::{Tensor, TensorError};

/// A progress text line is cut to this many bytes (`host.progress-text`).
pub const MAX_PROGRESS_TEXT: usize = 4 << 10;

/// `text` cut to [`MAX_PROGRESS_TEXT`] bytes at a character boundary.
fn bounded_text(mut text: String) -> String {
    if text.len() > MAX_PROGRESS_TEXT {
        let mut at = MAX_PROGRESS_TEXT;
        while !text.is_char_boundary(at) {
            at -= 1;
        }
        text.truncate(at);
    }
    text
}

fn tensor_error(e: TensorError) -> tensors::TensorError {
    match e {
        TensorError::BadShape(_) => tensors::TensorError::BadShape(e.to_string()),
        TensorError::LengthMismatch { .. } => tensors::TensorError::LengthMismatch(e.to_string()),
        TensorError::Device(_) => tensors::TensorError::OutOfRange(e.to_string()),
    }
}

impl tensors::Host for NodeState {
    fn create(&mut self, shape: Vec<u32>, data: Vec<f32>) -> wasmtime::Result<Result<Resource<Tensor>, tensors::TensorError>> {
        let tensor = match Tensor::new(shape, data) {
            Ok(t) => t,
            Err(e) => return Ok(Err(tensor_error(e))),
        };
        match self.charge(tensor.byte_len()) {
            Ok(charge) => tensor.attach_charge(charge),
            Err(msg) => return Ok(Err(tensors::TensorError::BudgetExceeded(msg))),
        }
        Ok(Ok(self.table.push(tensor)?))
    }
}

impl tensors::HostTensor for NodeState {
    fn shape(&mut self, this: Resource<Tensor>) -> wasmtime::Result<Vec<u32>> {
        Ok(self.table.get(&this)?.shape().to_vec())
    }
    fn read(&mut self, this: Resource<Tensor>) -> wasmtime::Result<Vec<f32>> {
        let tensor = self.table.get(&this)?.clone();
        // The copy is the job's while the guest takes it in (its linear
        // memory, charged as it grows, then holds it).
        let _copy = self.charge_job(tensor.byte_len()).map_err(wasmtime::Error::msg)?;
        Ok(tensor.data().map_err(wasmtime::Error::msg)?.to_vec())
    }
    fn read_range(&mut self, this: Resource<Tensor>, offset: u64, len: u32) -> wasmtime::Result<Result<Vec<f32>, tensors::TensorError>> {
        let tensor = self.table.get(&this)?.clone();
        let data = match tensor.data() {
            Ok(data) => data,
            Err(e) => return Ok(Err(tensor_error(e))),
        };
        let range = usize::try_from(offset).ok().and_then(|start| start.checked_add(len as usize).map(|end| start..end)).filter(|r| r.end <= data.len());
        let Some(range) = range else {
            return Ok(Err(tensors::TensorError::OutOfRange(format!("{len} elements at {offset} of {}", data.len()))));
        };
        let _copy = self.charge_job(range.len() as u64 * 4).map_err(wasmtime::Error::msg)?;
        Ok(Ok(data[range].to_vec()))
    }
    fn drop(&mut self, this: Resource<Tensor>) -> wasmtime::Result<()> {
        self.table.delete(this)?;
        Ok(())
    }
}

impl host::Host for NodeState {
    fn progress(&mut self, step: u64, steps: u64) -> wasmtime::Result<()> {
        if let Some(io) = &self.io
            && steps > 0
        {
            (io.signals)(NodeSignal::Progress { step: step.min(steps), steps });
        }
        Ok(())
    }

    fn secret(&mut self, name: String) -> wasmtime::Result<Option<String>> {
        Ok(self.io.as_ref().and_then(|io| io.secrets.get(&name)).map(str::to_string))
    }

    fn insufficient_funds(&mut self, message: String) -> wasmtime::Result<()> {
        self.insufficient_funds = Some(bounded_text(message));
        Ok(())
    }

    fn preview(&mut self, image: Resource<Tensor>) -> wasmtime::Result<()> {
        let tensor = self.table.get(&image)?.clone();
        if let Some(io) = &self.io {
            (io.signals)(NodeSignal::Preview(tensor));
        }
        Ok(())
    }

    fn progress_text(&mut self, text: String) -> wasmtime::Result<()> {
        if let Some(io) = &self.io {
            (io.signals)(NodeSignal::Text(bounded_text(text)));
        }
        Ok(())
    }

    fn read_input(&mut self, name: String) -> wasmtime::Result<Result<Vec<u8>, String>> {
        let Some(io) = &self.io else { return Ok(Err("no input files in this context".into())) };
        let bytes = match io.inputs.read(&name) {
            Ok(bytes) => bytes,
            Err(e) => return Ok(Err(e.to_string())),
        };
        // The host's copy (at most `MAX_INPUT_BYTES`) is the job's while the
        // guest takes it in.
        let _copy = self.charge_job(bytes.len() as u64).map_err(wasmtime::Error::msg)?;
        Ok(Ok(bytes))
    }

    fn save_file(&mut self, kind: host::FileKind, prefix: String, extension: String, data: Vec<u8>) -> wasmtime::Result<Result<host::SavedFile, String>> {
        let Some(io) = &self.io else { return Ok(Err("no output files in this context".into())) };
        // A refused save fails the node even if the plugin carries on (it
        // is recorded like a budget overrun): a name the host would not
        // store, then the node's and the job's file bounds.
        if let Err(e) = crate::files::check_extension(&extension).and_then(|()| crate::files::split_prefix(&prefix)) {
            let msg = e.to_string();
            self.over_budget = Some(msg.clone());
            return Ok(Err(msg));
        }
        // Content and name are charged: both end up in records and responses.
        let cost = (data.len() + prefix.len() + extension.len()) as u64;
        let refused = if self.saved.len() as u64 >= self.limits.max_files {
            Some(format!("the node may save at most {} files (node_max_files)", self.limits.max_files))
        } else if self.saved_bytes.saturating_add(cost) > self.limits.file_bytes {
            Some(format!("saving {} bytes would exceed the node's file budget of {} MiB", data.len(), self.limits.file_bytes >> 20))
        } else {
            io.budget.charge_file(cost).err().map(|e| e.to_string())
        };
        if let Some(msg) = refused {
            self.over_budget = Some(msg.clone());
            return Ok(Err(msg));
        }
        self.saved_bytes += cost;
        let kind = match kind {
            host::FileKind::Output => FileKind::Output,
            host::FileKind::Temp => FileKind::Temp,
        };
        match io.outputs.save(kind, &prefix, &extension, &data) {
            Ok(saved) => {
                let reply = host::SavedFile {
                    filename: saved.filename.clone(),
                    subfolder: saved.subfolder.clone(),
                    kind: match saved.kind {
                        FileKind::Output => host::FileKind::Output,
                        FileKind::Temp => host::FileKind::Temp,
                    },
                };
                self.saved.push(saved);
                Ok(Ok(reply))
            }
            Err(e) => Ok(Err(e.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_text_is_cut_at_a_character_boundary() {
        assert_eq!(bounded_text("short".into()), "short");
        let long = "é".repeat(MAX_PROGRESS_TEXT); // 2 bytes each
        let cut = bounded_text(long);
        assert_eq!(cut.len(), MAX_PROGRESS_TEXT);
        let odd = format!("a{}", "é".repeat(MAX_PROGRESS_TEXT));
        let cut = bounded_text(odd);
        assert_eq!(cut.len(), MAX_PROGRESS_TEXT - 1, "never half a character");
        assert!(cut.starts_with('a'));
    }
}
