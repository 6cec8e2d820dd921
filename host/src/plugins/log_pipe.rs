//! Capture of a plugin's stdout and stderr into the job log.
//!
//! Unlike wasmtime-wasi's `MemoryOutputPipe`, a full pipe keeps accepting
//! bytes: a chatty plugin must not fail or trap because its log is full. It
//! keeps the tail — the end of a run says most about how it ended — and
//! records how much of the beginning it shed.

use std::collections::VecDeque;
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
    bytes: VecDeque<u8>,
    capacity: usize,
    dropped: u64,
}

/// What a node wrote: the tail of it, and whether its beginning was shed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CapturedLog {
    pub text: String,
    pub truncated: bool,
}

impl LogPipe {
    /// A pipe keeping the last `capacity` bytes written.
    pub fn new(capacity: usize) -> LogPipe {
        LogPipe { inner: Arc::new(Mutex::new(LogBuffer { bytes: VecDeque::new(), capacity, dropped: 0 })) }
    }

    /// What was kept, lossily decoded, after a note of what was shed.
    pub fn contents(&self) -> CapturedLog {
        let buf = self.inner.lock();
        let (a, b) = buf.bytes.as_slices();
        let mut kept = Vec::with_capacity(a.len() + b.len());
        kept.extend_from_slice(a);
        kept.extend_from_slice(b);
        if buf.dropped == 0 {
            return CapturedLog { text: String::from_utf8_lossy(&kept).into_owned(), truncated: false };
        }
        // The cut may fall inside a character: start at the next one.
        let start = kept.iter().position(|&b| (b & 0xc0) != 0x80).unwrap_or(kept.len());
        let text = format!("[kiln: {} earlier bytes of output dropped]\n{}", buf.dropped, String::from_utf8_lossy(&kept[start..]));
        CapturedLog { text, truncated: true }
    }

    fn append(&self, data: &[u8]) {
        let mut buf = self.inner.lock();
        let capacity = buf.capacity;
        if data.len() >= capacity {
            buf.dropped += (buf.bytes.len() + data.len() - capacity) as u64;
            buf.bytes.clear();
            buf.bytes.extend(&data[data.len() - capacity..]);
            return;
        }
        let over = (buf.bytes.len() + data.len()).saturating_sub(capacity);
        buf.bytes.drain(..over);
        buf.dropped += over as u64;
        buf.bytes.extend(data);
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
    fn keeps_the_tail_and_counts_what_it_shed() {
        let pipe = LogPipe::new(4);
        pipe.append(b"ab");
        assert_eq!(pipe.contents(), CapturedLog { text: "ab".into(), truncated: false });
        pipe.append(b"cdef");
        pipe.append(b"gh");
        let log = pipe.contents();
        assert!(log.truncated);
        assert_eq!(log.text, "[kiln: 4 earlier bytes of output dropped]\nefgh");
        // One write larger than the pipe: its end is kept.
        pipe.append(b"0123456789");
        assert_eq!(pipe.contents().text, "[kiln: 14 earlier bytes of output dropped]\n6789");
        // A cut inside a character starts at the next whole one.
        let pipe = LogPipe::new(4);
        pipe.append("aé€".as_bytes());
        assert_eq!(pipe.contents().text, "[kiln: 2 earlier bytes of output dropped]\n€");
    }
}
