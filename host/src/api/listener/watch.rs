//! What a connection is doing, as its watchdog reads it: requests in
//! flight, reads and blocked writes, timed from the connection's opening;
//! and the socket wrapper that feeds it (and lingers on close).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use super::LINGER;
use super::caps::Slot;

/// What a connection is doing, as its watchdog reads it. HTTP/1 serves one
/// request at a time, and the socket, the service and the response body
/// are all polled by the connection's task, so these are only written
/// there; atomics make them shareable. Times are milliseconds since
/// `opened`.
pub(super) struct Activity {
    pub(super) opened: Instant,
    /// Requests whose response has not been sent (0 or 1; an upgrade's 101 included).
    pub(super) in_flight: AtomicU32,
    /// When the last response was sent (0: the opening).
    pub(super) idle_since: AtomicU64,
    /// When bytes were last read while no request was in flight.
    pub(super) last_read: AtomicU64,
    /// When the pending request's first byte was read; [`NONE`] when no
    /// request has begun. The opening counts as the first request's start.
    pub(super) head_since: AtomicU64,
    /// The current request's body stalled past the body timeout.
    pub(super) body_stalled: AtomicBool,
    /// Since when a write has waited for the client to read; [`NONE`]
    /// while writes go through.
    pub(super) write_blocked_since: AtomicU64,
    /// The current request has a body not read to its end.
    pub(super) body_unread: AtomicBool,
}

pub(super) const NONE: u64 = u64::MAX;

impl Activity {
    pub(super) fn new() -> Activity {
        Activity {
            opened: Instant::now(),
            in_flight: AtomicU32::new(0),
            idle_since: AtomicU64::new(0),
            last_read: AtomicU64::new(0),
            head_since: AtomicU64::new(0),
            body_stalled: AtomicBool::new(false),
            write_blocked_since: AtomicU64::new(NONE),
            body_unread: AtomicBool::new(false),
        }
    }

    pub(super) fn now_ms(&self) -> u64 {
        u64::try_from(self.opened.elapsed().as_millis()).unwrap_or(NONE - 1)
    }

    /// Bytes arrived on the socket.
    pub(super) fn on_read(&self) {
        if self.in_flight.load(Ordering::Relaxed) != 0 {
            return; // a body being read: the body timeout's business
        }
        let now = self.now_ms();
        self.last_read.store(now, Ordering::Relaxed);
        if self.head_since.load(Ordering::Relaxed) == NONE {
            self.head_since.store(now, Ordering::Relaxed);
        }
    }

    /// A write waits for the client to read (`blocked`) or went through.
    pub(super) fn on_write(&self, blocked: bool) {
        let since = self.write_blocked_since.load(Ordering::Relaxed);
        if blocked && since == NONE {
            self.write_blocked_since.store(self.now_ms(), Ordering::Relaxed);
        } else if !blocked && since != NONE {
            self.write_blocked_since.store(NONE, Ordering::Relaxed);
        }
    }

    /// A request's headers arrived: it is in flight until the returned
    /// guard (carried by its response body) is dropped.
    pub(super) fn request_started(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.head_since.store(NONE, Ordering::Relaxed);
        self.body_stalled.store(false, Ordering::Relaxed);
        InFlight(self.clone())
    }

    /// Whether the connection waits for a request that has not arrived
    /// (a reserve connection that may be closed for a newer one).
    pub(super) fn waiting_for_headers(&self) -> bool {
        self.in_flight.load(Ordering::Relaxed) == 0 && self.head_since.load(Ordering::Relaxed) != NONE
    }

    /// When the connection is to be closed: when no request arrives in
    /// time, or a blocked write makes no progress for `stall_timeout`;
    /// `None` while a request is in flight and its writes go through.
    pub(super) fn deadline(&self, header_timeout: Duration, idle_timeout: Duration, stall_timeout: Duration) -> Option<Instant> {
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(NONE / 2);
        let blocked = self.write_blocked_since.load(Ordering::Relaxed);
        let mut at = (blocked != NONE).then(|| blocked.saturating_add(ms(stall_timeout)));
        if self.in_flight.load(Ordering::Relaxed) == 0 {
            let quiet_since = self.idle_since.load(Ordering::Relaxed).max(self.last_read.load(Ordering::Relaxed));
            let mut idle_at = quiet_since.saturating_add(ms(idle_timeout));
            let head = self.head_since.load(Ordering::Relaxed);
            if head != NONE {
                idle_at = idle_at.min(head.saturating_add(ms(header_timeout)));
            }
            at = Some(at.map_or(idle_at, |a| a.min(idle_at)));
        }
        at.map(|at| self.opened + Duration::from_millis(at))
    }
}

/// A request in flight; dropped with its response body, once sent.
pub(super) struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let activity = &self.0;
        if activity.in_flight.fetch_sub(1, Ordering::Relaxed) == 1 {
            activity.idle_since.store(activity.now_ms(), Ordering::Relaxed);
            activity.head_since.store(NONE, Ordering::Relaxed);
        }
    }
}

/// The socket, noting reads for the watchdog, and holding the connection's
/// place under the caps for as long as it is open.
pub(super) struct Watched {
    pub(super) stream: TcpStream,
    pub(super) activity: Arc<Activity>,
    /// Given back when the socket closes (after [`linger`], if it lingers).
    pub(super) slot: Option<Slot>,
}

impl Drop for Watched {
    /// A connection closed with its request's body unread lingers (see
    /// [`LINGER`]) on a duplicate of the socket, still holding its place.
    fn drop(&mut self) {
        use std::os::fd::AsFd;
        if !self.activity.body_unread.load(Ordering::Relaxed) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let Ok(fd) = self.stream.as_fd().try_clone_to_owned() else { return };
        let slot = self.slot.take();
        runtime.spawn(async move {
            if let Ok(stream) = TcpStream::from_std(std::net::TcpStream::from(fd)) {
                linger(stream).await;
            }
            drop(slot);
        });
    }
}

/// Ends the answer (FIN), then reads and discards what the client still
/// sends, until it closes or [`LINGER`] passes.
pub(super) async fn linger(mut stream: TcpStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let _ = stream.shutdown().await;
    let mut discard = vec![0u8; 16 << 10];
    let _ = tokio::time::timeout(LINGER, async { while matches!(stream.read(&mut discard).await, Ok(n) if n > 0) {} }).await;
}

impl AsyncRead for Watched {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.on_read();
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.activity.on_write(polled.is_pending());
        polled
    }
    fn poll_write_vectored(mut self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        self.activity.on_write(polled.is_pending());
        polled
    }
    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}
