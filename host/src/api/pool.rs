//! Service calls a request starts but must not leave half done, or that
//! wait for a disk or read many records: run to their end on the blocking
//! pool (their store calls awaited there), whether or not the client is
//! still connected.

use std::future::Future;

use super::error::ApiError;

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
