//! The tokio runtime a networked backend (PostgreSQL, S3) owns: its
//! connections belong to this runtime's reactor, so a call makes progress
//! whichever thread waits for it — a blocking thread in `store::wait`, or
//! a current-thread runtime whose only thread is the one waiting.

use std::future::Future;
use std::sync::Arc;

use super::StoreError;

/// A small multi-threaded runtime, shut down without waiting when the last
/// handle goes (a runtime may not be dropped where blocking is not allowed).
pub(crate) struct IoRuntime {
    runtime: Option<tokio::runtime::Runtime>,
    name: &'static str,
}

impl IoRuntime {
    /// Starts `threads` worker threads named `name`.
    pub(crate) fn start(name: &'static str, threads: usize) -> Result<Arc<IoRuntime>, StoreError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name(name)
            .enable_all()
            .build()
            .map_err(|e| StoreError::Backend(format!("cannot start the {name} runtime: {e}")))?;
        Ok(Arc::new(IoRuntime { runtime: Some(runtime), name }))
    }

    /// The runtime's handle (to spawn a task that outlives one call).
    pub(crate) fn handle(&self) -> Result<&tokio::runtime::Handle, StoreError> {
        self.runtime.as_ref().map(tokio::runtime::Runtime::handle).ok_or_else(|| StoreError::Backend(format!("the {} runtime has stopped", self.name)))
    }

    /// Runs `call` on this runtime and awaits its result (from any thread,
    /// any runtime).
    pub(crate) async fn run<T: Send + 'static>(&self, call: impl Future<Output = Result<T, StoreError>> + Send + 'static) -> Result<T, StoreError> {
        self.handle()?.spawn(call).await.map_err(|e| StoreError::Backend(format!("{}: {e}", self.name)))?
    }
}

impl Drop for IoRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A job's execution thread waits for hundreds of store calls inside
    /// one poll of its runtime's task (a node saving many files): each is
    /// answered, however many (past tokio's cooperative budget of 128).
    #[test]
    fn many_waits_inside_one_task_poll_are_all_answered() {
        let io = IoRuntime::start("kiln-test-io", 1).unwrap();
        let (done, answered) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async {
                for i in 0..400u32 {
                    let answer = crate::store::wait(io.run(async move { Ok(i) })).unwrap();
                    assert_eq!(answer, i);
                }
            });
            let _ = done.send(());
        });
        answered.recv_timeout(std::time::Duration::from_secs(60)).expect("400 calls answered within 60 s");
    }
}
