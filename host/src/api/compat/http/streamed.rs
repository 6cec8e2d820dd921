//! Listings written as they are rendered: ComfyUI's `/history` and
//! `/queue` carry each job's whole workflow, so a listing of many jobs
//! with large workflows would be gigabytes if built in memory first. The
//! body is written on the blocking pool into a small channel and sent as
//! it fills, one job's workflow in memory at a time; a client that stops
//! reading stops the writer.

use std::io::Write;

use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use tokio::sync::mpsc;

use crate::service::ServiceError;

/// Bytes gathered before they are sent.
const CHUNK: usize = 64 << 10;
/// Chunks in flight between the writer and the connection.
const IN_FLIGHT: usize = 4;

/// Where a streamed body is written (`std::io::Write`, so serde writes
/// straight into it).
pub struct Sink {
    buffer: Vec<u8>,
    tx: mpsc::Sender<Result<Bytes, std::io::Error>>,
}

impl Sink {
    fn send(&mut self) -> std::io::Result<()> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::replace(&mut self.buffer, Vec::with_capacity(CHUNK)));
        self.tx.blocking_send(Ok(chunk)).map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the client went away"))
    }

    /// Writes `value` as JSON.
    pub fn json<T: serde::Serialize + ?Sized>(&mut self, value: &T) -> Result<(), ServiceError> {
        serde_json::to_writer(&mut *self, value).map_err(|e| ServiceError::Store(crate::store::StoreError::Backend(e.to_string())))
    }

    /// Writes JSON text as it is.
    pub fn raw(&mut self, text: &[u8]) -> Result<(), ServiceError> {
        self.write_all(text).map_err(|e| ServiceError::Store(crate::store::StoreError::Backend(e.to_string())))
    }
}

impl Write for Sink {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.buffer.extend_from_slice(data);
        if self.buffer.len() >= CHUNK {
            self.send()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.send()
    }
}

/// A `200 application/json` response whose body `write` produces on the
/// blocking pool. A failure after the first bytes went out can only cut
/// the body short (the client sees a truncated response); it is logged.
pub fn json(write: impl FnOnce(&mut Sink) -> Result<(), ServiceError> + Send + 'static) -> Response {
    let (tx, mut rx) = mpsc::channel(IN_FLIGHT);
    tokio::task::spawn_blocking(move || {
        let mut sink = Sink { buffer: Vec::with_capacity(CHUNK), tx };
        let written = write(&mut sink).and_then(|()| sink.flush().map_err(|e| ServiceError::Store(crate::store::StoreError::Backend(e.to_string()))));
        if let Err(e) = written {
            tracing::warn!(error = %e, "a streamed listing was cut short");
            let _ = sink.tx.blocking_send(Err(std::io::Error::other(e.to_string())));
        }
    });
    let stream = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx));
    ([(header::CONTENT_TYPE, "application/json")], Body::from_stream(stream)).into_response()
}
