//! Capture of a plugin's stdout and stderr into the job log.
//!
//! Unlike wasmtime-wasi's `MemoryOutputPipe`, a full pipe keeps accepting (and
//! dropping) bytes: a chatty plugin must not fail or trap because its log is
//! full. The log records that it was truncated.

use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};

/// A bounded, shared buffer that a plugin's output stream appends to.
#[derive(Clone)]
pub struct LogPipe {
    inner: Arc<Mutex<LogBuffer>>,
}

struct LogBuffer {
    bytes: Vec<u8>,
    capacity: usize,
    dropped: u64,
}

impl LogPipe {
    /// A pipe keeping at most `capacity` bytes.
    pub fn new(capacity: usize) -> LogPipe {
        LogPipe { inner: Arc::new(Mutex::new(LogBuffer { bytes: Vec::new(), capacity, dropped: 0 })) }
    }
    /// What was written, lossily decoded, with a note if bytes were dropped.
    pub fn contents(&self) -> String {
        let buf = self.inner.lock();
        let mut text = String::from_utf8_lossy(&buf.bytes).into_owned();
        if buf.dropped > 0 {
            text.push_str(&format!("\n[kiln: log truncated, {} bytes dropped]\n", buf.dropped));
        }
        text
    }
    fn append(&self, data: &[u8]) {
        let mut buf = self.inner.lock();
        let room = buf.capacity.saturating_sub(buf.bytes.len());
        let keep = room.min(data.len());
        buf.bytes.extend_from_slice(&data[..keep]);
        buf.dropped += (data.len() - keep) as u64;
    }
}

impl IsTerminal for LogPipe {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for LogPipe {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }
    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[async_trait::async_trait]
impl Pollable for LogPipe {
    async fn ready(&mut self) {}
}

impl OutputStream for LogPipe {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.append(&bytes);
        Ok(())
    }
    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }
    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(64 * 1024)
    }
}

impl tokio::io::AsyncWrite for LogPipe {
    fn poll_write(self: std::pin::Pin<&mut Self>, _: &mut std::task::Context<'_>, buf: &[u8]) -> std::task::Poll<std::io::Result<usize>> {
        self.append(buf);
        std::task::Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(self: std::pin::Pin<&mut Self>, _: &mut std::task::Context<'_>) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: std::pin::Pin<&mut Self>, _: &mut std::task::Context<'_>) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_capacity_and_counts_dropped() {
        let pipe = LogPipe::new(4);
        pipe.append(b"abcdef");
        pipe.append(b"gh");
        let text = pipe.contents();
        assert!(text.starts_with("abcd"), "{text}");
        assert!(text.contains("4 bytes dropped"), "{text}");
    }
}
