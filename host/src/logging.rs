//! Where the process's log lines go: stderr, in batches.
//!
//! A log line is appended to an in-memory buffer, and a thread writes the
//! buffer out every [`FLUSH_INTERVAL`]. So logging costs a request or a job
//! its formatting and a copy — no system call, and no wake-up of another
//! thread per line (a writer thread fed by a channel woke once per line,
//! which on a small VM cost more than the line: BENCHMARKS.md, "fewer hand-offs on a job's critical path").
//! A slow terminal or pipe holds up only the flushing thread; if it falls
//! more than [`MAX_PENDING`] behind, new lines are dropped and counted.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

/// How log lines are written (`log_format`, `KILN_LOG_FORMAT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// One human-readable line per event.
    #[default]
    Text,
    /// One JSON object per line: the event's fields, and those of the
    /// spans it happened in (job, node, account, request ids) under `span`
    /// and `spans`.
    Json,
}

/// How often buffered lines are written out.
pub const FLUSH_INTERVAL: Duration = Duration::from_millis(50);
/// Most bytes waiting to be written; lines beyond it are dropped.
pub const MAX_PENDING: usize = 4 << 20;

#[derive(Default)]
struct Pending {
    bytes: Vec<u8>,
    dropped: u64,
    closed: bool,
}

#[derive(Default)]
struct Shared {
    pending: Mutex<Pending>,
    wake: Condvar,
}

/// A `MakeWriter` for `tracing_subscriber` whose lines a flushing thread
/// writes to `sink`.
#[derive(Clone)]
pub struct BatchedWriter {
    shared: Arc<Shared>,
}

/// Stops the flushing thread and writes what is left when dropped.
pub struct FlushGuard {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl BatchedWriter {
    /// A writer whose lines go to `sink` (e.g. stderr), and the guard that
    /// writes the rest at exit.
    pub fn new(mut sink: impl Write + Send + 'static) -> std::io::Result<(BatchedWriter, FlushGuard)> {
        let shared = Arc::new(Shared::default());
        let flusher = shared.clone();
        let thread = std::thread::Builder::new().name("kiln-log".into()).spawn(move || {
            loop {
                let (bytes, dropped, closed) = {
                    let mut pending = flusher.pending.lock();
                    if !pending.closed {
                        flusher.wake.wait_for(&mut pending, FLUSH_INTERVAL);
                    }
                    (std::mem::take(&mut pending.bytes), std::mem::take(&mut pending.dropped), pending.closed)
                };
                // Errors writing the log have nowhere to be reported.
                let _ = sink.write_all(&bytes);
                if dropped > 0 {
                    let _ = writeln!(sink, "[kiln: {dropped} bytes of log lines dropped: the log output fell behind]");
                }
                let _ = sink.flush();
                if closed {
                    return;
                }
            }
        })?;
        Ok((BatchedWriter { shared: shared.clone() }, FlushGuard { shared, thread: Some(thread) }))
    }

    fn append(&self, buf: &[u8]) {
        let mut pending = self.shared.pending.lock();
        if pending.bytes.len() + buf.len() > MAX_PENDING {
            pending.dropped += buf.len() as u64;
        } else {
            pending.bytes.extend_from_slice(buf);
        }
    }
}

impl Drop for FlushGuard {
    fn drop(&mut self) {
        self.shared.pending.lock().closed = true;
        self.shared.wake.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// One event's writes.
pub struct LineWriter<'a>(&'a BatchedWriter);

impl Write for LineWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.append(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for BatchedWriter {
    type Writer = LineWriter<'a>;
    fn make_writer(&'a self) -> LineWriter<'a> {
        LineWriter(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sink the test can read back.
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn lines_arrive_in_order_within_an_interval_and_all_at_exit() {
        let sink = Sink::default();
        let (writer, guard) = BatchedWriter::new(sink.clone()).unwrap();
        use tracing_subscriber::fmt::MakeWriter;
        writer.make_writer().write_all(b"one\n").unwrap();
        writer.make_writer().write_all(b"two\n").unwrap();
        let deadline = std::time::Instant::now() + 20 * FLUSH_INTERVAL;
        while sink.0.lock().len() < 8 && std::time::Instant::now() < deadline {
            std::thread::sleep(FLUSH_INTERVAL / 5);
        }
        assert_eq!(sink.0.lock().as_slice(), b"one\ntwo\n", "flushed by the thread");
        writer.make_writer().write_all(b"three\n").unwrap();
        drop(guard);
        assert_eq!(sink.0.lock().as_slice(), b"one\ntwo\nthree\n", "the rest at exit");
    }

    #[test]
    fn a_backlog_beyond_the_limit_is_dropped_and_counted() {
        let sink = Sink::default();
        let (writer, guard) = BatchedWriter::new(sink.clone()).unwrap();
        // Hold the buffer so the flusher cannot drain it meanwhile.
        {
            let mut pending = writer.shared.pending.lock();
            pending.bytes.resize(MAX_PENDING - 3, b'.');
        }
        writer.append(b"ok\n");
        writer.append(b"lost\n");
        drop(guard);
        let text = String::from_utf8(sink.0.lock().clone()).unwrap();
        assert!(text.contains("ok\n") && !text.contains("lost"), "{}", &text[text.len() - 100..]);
        assert!(text.ends_with("[kiln: 5 bytes of log lines dropped: the log output fell behind]\n"), "{}", &text[text.len() - 100..]);
    }
}
