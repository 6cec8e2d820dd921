//! Service calls a request starts but must not leave half done, or that
//! wait for a disk or read many records: run to their end on the blocking
//! pool (their store calls awaited there), whether or not the client is
//! still connected.

use std::future::Future;
use std::sync::Arc;

use super::error::ApiError;
use crate::service::{Admitted, Service, Submission, SubmitError};

/// Runs the future `call` makes on the blocking pool, to its end (a client
/// that disconnects does not stop it halfway), and returns its output.
pub async fn on_pool<T, F, Fut>(call: F) -> Result<T, ApiError>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = T>,
    T: Send + 'static,
{
    let runtime = tokio::runtime::Handle::current();
    tokio::task::spawn_blocking(move || crate::store::may_block_here(|| runtime.block_on(call()))).await.map_err(|e| ApiError::internal(&e))
}

/// Submissions up to this size are validated and committed on the HTTP
/// worker that received them; larger ones on the blocking pool.
pub const INLINE_SUBMIT_BYTES: usize = 32 << 10;

/// [`Service::admit`] for a submission whose body had `size` bytes, on
/// either surface. Validation and the store writes run right here for a
/// typical workflow (the commit log's sync too while syncs are quick; a
/// slow one goes to the log's own thread, see `SledMeta::sync_jobs`): a
/// hand-off to the blocking pool and back costs more on a small machine
/// (BENCHMARKS.md, "fewer hand-offs on a job's critical path"), and the
/// job waits for its answer (`StartGate`). A large graph validates on the
/// pool, and so does any submission while the store's writes may wait for
/// a flush of the whole store (a checkpoint): with one HTTP thread, every
/// request would wait with it. (A client that goes away mid-way drops an
/// inline admission between whole store writes: a job written is queued
/// and runs, as when its answer is lost.)
pub async fn admit(service: Arc<Service>, submission: Submission, size: usize) -> Result<Result<Admitted, SubmitError>, ApiError> {
    if size <= INLINE_SUBMIT_BYTES && !service.submit_may_block() {
        Ok(service.admit(submission).await)
    } else {
        on_pool(move || async move { service.admit(submission).await }).await
    }
}
