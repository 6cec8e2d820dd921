//! kiln's accept loop: which connections the HTTP edge holds, and for how
//! long. axum's router answers the requests; this module owns everything
//! about the connections that carry them:
//!
//! - **Caps.** At most `max_connections` connections at once, and
//!   `max_connections_per_ip` from one client address (an IPv6 client: its
//!   /64). A connection over either cap is still accepted — the accept
//!   queue never stalls — and takes a place in a small reserve
//!   ([`HEALTH_RESERVE`]) that serves one request, health checks only
//!   (anything else is 503 `too_many_connections`), with a short header
//!   timeout. When the reserve is full, its oldest connection still waiting
//!   for headers is closed for the newcomer, so half-open connections
//!   cannot hold it either. A connection's place is given back when its
//!   socket closes (an upgraded WebSocket keeps it).
//! - **Clocks**, kept by a watchdog per connection that reads what the
//!   connection is doing ([`Activity`]): a request's headers must arrive
//!   within `http_header_timeout_s` (from the opening for the first
//!   request, from its first byte for later ones); a kept-alive connection
//!   with no request in flight and nothing read is closed after
//!   `http_idle_timeout_s`; a request body that a handler waits on and
//!   that brings nothing for `http_body_timeout_s` fails the request (408
//!   `request_timeout`) and closes the connection; so does a response the
//!   client stops reading (no write progress for as long). A request in
//!   flight — an event stream, a slow job submission — is never cut by the
//!   header and idle timeouts.
//!   hyper's own `header_read_timeout` is off: in hyper 1.12 its timer runs
//!   whenever hyper waits for a request head, the gap between kept-alive
//!   requests included, so it cannot tell a slow request from an idle
//!   connection.
//! - **Closing.** A connection that ends with its request's body unread
//!   (refused for its declared length, timed out) lingers: its answer and
//!   a FIN go out, then what the client still sends is read and discarded
//!   for up to [`LINGER`], so a client sending the whole body reads the
//!   answer rather than a reset.
//! - **Shutdown.** When `shutdown` fires, no connection is accepted any
//!   more, idle ones close and in-flight requests finish; [`serve`] returns
//!   once every connection served over HTTP has ended (WebSockets end on
//!   the same signal, in their own tasks).
//!
//! Each connection is HTTP/1.1 served by hyper with upgrades (the
//! WebSocket at `/ws`), with `TCP_NODELAY`.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, Request, Response, header};
use axum::response::IntoResponse;
use hyper::body::{Body as HttpBody, Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use super::error::ApiError;
use crate::config::Config;

/// Connections beyond the caps that may carry one health check each.
pub const HEALTH_RESERVE: usize = 32;
/// Most time a reserve connection gets for its request's headers.
pub const RESERVE_HEADER_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a connection closed with its request's body unread (refused
/// for its declared length, timed out) keeps reading and discarding it
/// after the answer, so that a client still sending reads that answer
/// instead of a reset.
pub const LINGER: Duration = Duration::from_secs(2);
/// Open files kept for the rest of the process (the store, plugins and
/// their compiled artifacts, the GPU device, logs) when the connection cap
/// is fitted under the open-file limit.
pub const RESERVED_DESCRIPTORS: u64 = 128;

/// The connection settings of `Config`, as durations and counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// `http_header_timeout_s`.
    pub header_timeout: Duration,
    /// `http_idle_timeout_s`.
    pub idle_timeout: Duration,
    /// `http_body_timeout_s`.
    pub body_timeout: Duration,
    /// `max_connections`.
    pub max_connections: usize,
    /// `max_connections_per_ip`.
    pub max_per_ip: usize,
}

impl ConnectionLimits {
    pub fn from_config(config: &Config) -> ConnectionLimits {
        // At least a second; at most a year (deadlines stay representable).
        let secs = |s: u64| Duration::from_secs(s.clamp(1, 365 * 86_400));
        ConnectionLimits {
            header_timeout: secs(config.http_header_timeout_s),
            idle_timeout: secs(config.http_idle_timeout_s),
            body_timeout: secs(config.http_body_timeout_s),
            max_connections: config.max_connections.max(1),
            max_per_ip: config.max_connections_per_ip.max(1),
        }
    }

    /// These limits with `max_connections` lowered, when needed, so that the
    /// connections (reserve included) and a file each (an upload or a
    /// download in flight) fit in `open_files` after
    /// [`RESERVED_DESCRIPTORS`]. The second value says whether it was lowered.
    pub fn within_open_files(self, open_files: u64) -> (ConnectionLimits, bool) {
        let fit = open_files.saturating_sub(RESERVED_DESCRIPTORS) / 2;
        let fit = usize::try_from(fit).unwrap_or(usize::MAX).saturating_sub(HEALTH_RESERVE).max(1);
        if self.max_connections <= fit {
            return (self, false);
        }
        (ConnectionLimits { max_connections: fit, max_per_ip: self.max_per_ip.min(fit), ..self }, true)
    }
}

/// The soft limit on open files of this process (`RLIMIT_NOFILE`), if known.
pub fn open_file_limit() -> Option<u64> {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes one rlimit to a valid, exclusive pointer.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0;
    (ok && limit.rlim_cur != libc::RLIM_INFINITY).then_some(limit.rlim_cur)
}

/// Serves `router` on `listener` under `limits` until `shutdown` is
/// cancelled, then lets in-flight requests finish (see the module docs).
pub async fn serve(listener: TcpListener, router: Router, limits: ConnectionLimits, shutdown: CancellationToken) -> io::Result<()> {
    let caps = Arc::new(Caps::new(limits));
    let router = TowerToHyperService::new(router);
    // Every connection task holds a receiver: `closed()` waits for them all.
    let (done_tx, done_rx) = tokio::sync::watch::channel(());
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    accept_failed(e).await;
                    continue;
                }
            },
            () = shutdown.cancelled() => break,
        };
        // Small writes (SSE frames, JSON replies) must not wait for Nagle.
        let _ = stream.set_nodelay(true);
        let activity = Arc::new(Activity::new());
        let (slot, reserve) = match caps.admit(peer, &activity) {
            Admission::Served(slot) => (slot, None),
            Admission::Reserve(slot, evicted) => (slot, Some(evicted)),
            Admission::Refused => continue, // dropped: closed at once
        };
        let connection = Connection { router: router.clone(), limits, activity, reserve, shutdown: shutdown.clone() };
        let done = done_rx.clone();
        tokio::spawn(async move {
            connection.run(stream, slot).await;
            drop(done);
        });
    }
    drop(listener);
    drop(done_rx);
    done_tx.closed().await;
    Ok(())
}

/// An `accept` that failed: a connection the client gave up on is skipped;
/// anything else (out of descriptors) is logged and retried after a pause,
/// rather than spun on.
async fn accept_failed(e: io::Error) {
    use io::ErrorKind as K;
    if matches!(e.kind(), K::ConnectionAborted | K::ConnectionReset | K::ConnectionRefused | K::Interrupted) {
        return;
    }
    static LAST_LOGGED: AtomicU64 = AtomicU64::new(0);
    if should_log(&LAST_LOGGED) {
        tracing::error!(error = %e, "accept failed (logged at most every 10 s)");
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
}

/// Whether a rate-limited warning may be logged now (at most every 10 s).
fn should_log(last: &AtomicU64) -> bool {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let now = START.get_or_init(Instant::now).elapsed().as_secs() + 10;
    let before = last.load(Ordering::Relaxed);
    now >= before + 10 && last.compare_exchange(before, now, Ordering::Relaxed, Ordering::Relaxed).is_ok()
}

/// One accepted connection and what it needs to be served.
struct Connection {
    router: TowerToHyperService<Router>,
    limits: ConnectionLimits,
    activity: Arc<Activity>,
    /// A reserve connection (health checks only): cancelled when a newer
    /// one takes its place.
    reserve: Option<CancellationToken>,
    shutdown: CancellationToken,
}

impl Connection {
    async fn run(self, stream: TcpStream, slot: Slot) {
        let Connection { router, limits, activity, reserve, shutdown } = self;
        let health_only = reserve.is_some();
        let header_timeout = if health_only { limits.header_timeout.min(RESERVE_HEADER_TIMEOUT) } else { limits.header_timeout };
        let io = TokioIo::new(Watched { stream, activity: activity.clone(), slot: Some(slot) });
        let service = ConnService { router, activity: activity.clone(), body_timeout: limits.body_timeout, health_only };
        let mut builder = hyper::server::conn::http1::Builder::new();
        // Headers are timed by the watchdog below (see the module docs).
        builder.timer(TokioTimer::new()).header_read_timeout(None).keep_alive(!health_only);
        let conn = builder.serve_connection(io, service).with_upgrades();
        tokio::pin!(conn);
        let evicted = reserve.unwrap_or_default();
        // While a request is in flight nothing expires; look again this often.
        let busy_check = header_timeout.min(limits.idle_timeout).min(limits.body_timeout);
        let mut next_check = tokio::time::Instant::now() + busy_check;
        let mut draining = false;
        loop {
            tokio::select! {
                result = conn.as_mut() => {
                    if let Err(e) = result {
                        tracing::trace!(error = %e, "connection ended");
                    }
                    return;
                }
                () = shutdown.cancelled(), if !draining => {
                    draining = true;
                    conn.as_mut().graceful_shutdown();
                }
                () = evicted.cancelled() => return,
                () = tokio::time::sleep_until(next_check) => {
                    match activity.deadline(header_timeout, limits.idle_timeout, limits.body_timeout) {
                        None => next_check = tokio::time::Instant::now() + busy_check,
                        Some(at) => {
                            let at = tokio::time::Instant::from_std(at);
                            if at <= tokio::time::Instant::now() {
                                tracing::debug!("closing a connection: no request within its header or idle timeout, or its response not read");
                                return;
                            }
                            next_check = at;
                        }
                    }
                }
            }
        }
    }
}

/// What a connection is doing, as its watchdog reads it. HTTP/1 serves one
/// request at a time, and the socket, the service and the response body
/// are all polled by the connection's task, so these are only written
/// there; atomics make them shareable. Times are milliseconds since
/// `opened`.
struct Activity {
    opened: Instant,
    /// Requests whose response has not been sent (0 or 1; an upgrade's 101 included).
    in_flight: AtomicU32,
    /// When the last response was sent (0: the opening).
    idle_since: AtomicU64,
    /// When bytes were last read while no request was in flight.
    last_read: AtomicU64,
    /// When the pending request's first byte was read; [`NONE`] when no
    /// request has begun. The opening counts as the first request's start.
    head_since: AtomicU64,
    /// The current request's body stalled past the body timeout.
    body_stalled: AtomicBool,
    /// Since when a write has waited for the client to read; [`NONE`]
    /// while writes go through.
    write_blocked_since: AtomicU64,
    /// The current request has a body not read to its end.
    body_unread: AtomicBool,
}

const NONE: u64 = u64::MAX;

impl Activity {
    fn new() -> Activity {
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

    fn now_ms(&self) -> u64 {
        u64::try_from(self.opened.elapsed().as_millis()).unwrap_or(NONE - 1)
    }

    /// Bytes arrived on the socket.
    fn on_read(&self) {
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
    fn on_write(&self, blocked: bool) {
        let since = self.write_blocked_since.load(Ordering::Relaxed);
        if blocked && since == NONE {
            self.write_blocked_since.store(self.now_ms(), Ordering::Relaxed);
        } else if !blocked && since != NONE {
            self.write_blocked_since.store(NONE, Ordering::Relaxed);
        }
    }

    /// A request's headers arrived: it is in flight until the returned
    /// guard (carried by its response body) is dropped.
    fn request_started(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.head_since.store(NONE, Ordering::Relaxed);
        self.body_stalled.store(false, Ordering::Relaxed);
        InFlight(self.clone())
    }

    /// Whether the connection waits for a request that has not arrived
    /// (a reserve connection that may be closed for a newer one).
    fn waiting_for_headers(&self) -> bool {
        self.in_flight.load(Ordering::Relaxed) == 0 && self.head_since.load(Ordering::Relaxed) != NONE
    }

    /// When the connection is to be closed: when no request arrives in
    /// time, or a blocked write makes no progress for `stall_timeout`;
    /// `None` while a request is in flight and its writes go through.
    fn deadline(&self, header_timeout: Duration, idle_timeout: Duration, stall_timeout: Duration) -> Option<Instant> {
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
struct InFlight(Arc<Activity>);

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
struct Watched {
    stream: TcpStream,
    activity: Arc<Activity>,
    /// Given back when the socket closes (after [`linger`], if it lingers).
    slot: Option<Slot>,
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
async fn linger(mut stream: TcpStream) {
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

/// Each request of one connection: timed body in, router, tracked body out.
#[derive(Clone)]
struct ConnService {
    router: TowerToHyperService<Router>,
    activity: Arc<Activity>,
    body_timeout: Duration,
    /// A reserve connection: health checks only.
    health_only: bool,
}

type Responding = Pin<Box<dyn Future<Output = Result<Response<Tracked>, Infallible>> + Send>>;

impl hyper::service::Service<Request<Incoming>> for ConnService {
    type Response = Response<Tracked>;
    type Error = Infallible;
    type Future = Responding;

    fn call(&self, request: Request<Incoming>) -> Responding {
        let in_flight = self.activity.request_started();
        self.activity.body_unread.store(!request.body().is_end_stream(), Ordering::Relaxed);
        if self.health_only && !is_health_check(request.uri().path()) {
            let mut response = ApiError::too_many_connections().into_response();
            response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
            return Box::pin(std::future::ready(Ok(response.map(|body| Tracked { body, _in_flight: in_flight }))));
        }
        let body_timeout = self.body_timeout;
        let activity = self.activity.clone();
        let request =
            request.map(|body| Body::new(StallGuard { body, timeout: body_timeout, timer: None, armed: false, failed: false, activity: activity.clone() }));
        let responding = hyper::service::Service::call(&self.router, request);
        Box::pin(async move {
            let mut response = match responding.await {
                Ok(response) => response,
                Err(never) => match never {},
            };
            if activity.body_stalled.load(Ordering::Relaxed) {
                // Whatever the handler made of the failed read: the request
                // timed out, and the connection (its body unread) closes.
                response = ApiError::request_timeout(body_timeout).into_response();
                response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            Ok(response.map(|body| Tracked { body, _in_flight: in_flight }))
        })
    }
}

/// The health check: the Jobs API's, at any mount or deployment prefix.
fn is_health_check(path: &str) -> bool {
    path.ends_with("/api/v2/health")
}

/// A response body that keeps its request in flight until it is sent
/// (or dropped): an event stream is a request in flight for as long as it
/// streams.
struct Tracked {
    body: Body,
    _in_flight: InFlight,
}

impl HttpBody for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }
    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }
    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// A request body that fails when, while it is being waited on, nothing
/// arrives for `timeout`.
struct StallGuard {
    body: Incoming,
    timeout: Duration,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    /// Whether `timer` runs for the current wait.
    armed: bool,
    failed: bool,
    activity: Arc<Activity>,
}

/// The error a stalled body ends with.
#[derive(Debug, thiserror::Error)]
#[error("the request body stalled (http_body_timeout_s)")]
struct BodyStalled;

impl HttpBody for StallGuard {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        if this.failed {
            return Poll::Ready(None);
        }
        if let Poll::Ready(frame) = Pin::new(&mut this.body).poll_frame(cx) {
            this.armed = false;
            if frame.is_none() || this.body.is_end_stream() {
                this.activity.body_unread.store(false, Ordering::Relaxed);
            }
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        let deadline = tokio::time::Instant::now() + this.timeout;
        let timer = match &mut this.timer {
            Some(timer) => {
                if !this.armed {
                    timer.as_mut().reset(deadline);
                }
                timer
            }
            None => this.timer.insert(Box::pin(tokio::time::sleep_until(deadline))),
        };
        this.armed = true;
        if timer.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        this.failed = true;
        this.activity.body_stalled.store(true, Ordering::Relaxed);
        Poll::Ready(Some(Err(Box::new(BodyStalled))))
    }
    fn is_end_stream(&self) -> bool {
        self.failed || self.body.is_end_stream()
    }
    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// Connections held, under one lock taken once per accept and per close.
struct Caps {
    limits: ConnectionLimits,
    held: parking_lot::Mutex<Held>,
}

#[derive(Default)]
struct Held {
    total: usize,
    per_client: HashMap<IpAddr, usize>,
    /// Reserve connections, oldest first.
    reserve: VecDeque<ReserveEntry>,
    next_id: u64,
}

struct ReserveEntry {
    id: u64,
    activity: Arc<Activity>,
    evict: CancellationToken,
}

enum Admission {
    /// Under both caps.
    Served(Slot),
    /// Over a cap, in the reserve; the token is cancelled to evict it.
    Reserve(Slot, CancellationToken),
    /// Over a cap with the reserve full of requests being answered.
    Refused,
}

/// A connection's place, given back when dropped.
struct Slot {
    caps: Arc<Caps>,
    kind: SlotKind,
}

enum SlotKind {
    Counted(IpAddr),
    Reserve(u64),
}

impl Caps {
    fn new(limits: ConnectionLimits) -> Caps {
        Caps { limits, held: Default::default() }
    }

    fn admit(self: &Arc<Self>, peer: SocketAddr, activity: &Arc<Activity>) -> Admission {
        let client = client_key(peer.ip());
        let mut held = self.held.lock();
        let of_client = held.per_client.get(&client).copied().unwrap_or(0);
        if held.total < self.limits.max_connections && of_client < self.limits.max_per_ip {
            held.total += 1;
            *held.per_client.entry(client).or_insert(0) += 1;
            return Admission::Served(Slot { caps: self.clone(), kind: SlotKind::Counted(client) });
        }
        static LAST_WARNED: AtomicU64 = AtomicU64::new(0);
        if should_log(&LAST_WARNED) {
            let cap = if held.total >= self.limits.max_connections { "max_connections" } else { "max_connections_per_ip" };
            tracing::warn!(client = %client, connections = held.total, cap, "connection cap reached: new connections get health checks only (logged at most every 10 s)");
        }
        if held.reserve.len() >= HEALTH_RESERVE {
            // The oldest connection still waiting for its headers makes room.
            let Some(oldest) = held.reserve.iter().position(|e| e.activity.waiting_for_headers()) else { return Admission::Refused };
            if let Some(entry) = held.reserve.remove(oldest) {
                entry.evict.cancel();
            }
        }
        let id = held.next_id;
        held.next_id += 1;
        let evict = CancellationToken::new();
        held.reserve.push_back(ReserveEntry { id, activity: activity.clone(), evict: evict.clone() });
        Admission::Reserve(Slot { caps: self.clone(), kind: SlotKind::Reserve(id) }, evict)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut held = self.caps.held.lock();
        match self.kind {
            SlotKind::Counted(client) => {
                held.total -= 1;
                if let Some(n) = held.per_client.get_mut(&client) {
                    *n -= 1;
                    if *n == 0 {
                        held.per_client.remove(&client);
                    }
                }
            }
            SlotKind::Reserve(id) => {
                if let Some(at) = held.reserve.iter().position(|e| e.id == id) {
                    held.reserve.remove(at);
                }
            }
        }
    }
}

/// The address a per-client cap counts: IPv4 as is (also when mapped into
/// IPv6), IPv6 by its /64 network (what one subscriber is usually given).
fn client_key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !((1u128 << 64) - 1))),
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max_connections: usize, max_per_ip: usize) -> ConnectionLimits {
        ConnectionLimits {
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            body_timeout: Duration::from_secs(30),
            max_connections,
            max_per_ip,
        }
    }

    #[test]
    fn the_cap_fits_under_the_open_file_limit() {
        let (same, lowered) = limits(4096, 256).within_open_files(1 << 20);
        assert_eq!((same.max_connections, lowered), (4096, false));
        // 1024 descriptors: (1024 - 128) / 2 = 448, less the reserve.
        let (fitted, lowered) = limits(4096, 256).within_open_files(1024);
        assert_eq!((fitted.max_connections, fitted.max_per_ip, lowered), (448 - HEALTH_RESERVE, 256, true));
        assert_eq!(limits(4096, 256).within_open_files(100).0.max_connections, 1, "never zero");
    }

    #[test]
    fn clients_are_counted_by_address_and_ipv6_by_network() {
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:bbbb::2".parse().unwrap();
        assert_eq!(client_key(a), client_key(b));
        assert_ne!(client_key(a), client_key("2001:db8:1:3::1".parse().unwrap()));
        assert_eq!(client_key("::ffff:10.0.0.1".parse().unwrap()), "10.0.0.1".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn over_a_cap_connections_go_to_the_reserve_and_the_oldest_waiting_one_makes_room() {
        let caps = Arc::new(Caps::new(limits(2, 1)));
        let peer = |ip: &str| SocketAddr::new(ip.parse().unwrap(), 1);
        let activity = || Arc::new(Activity::new());
        let a = caps.admit(peer("10.0.0.1"), &activity());
        assert!(matches!(a, Admission::Served(_)));
        assert!(matches!(caps.admit(peer("10.0.0.1"), &activity()), Admission::Reserve(..)), "over the per-address cap");
        let b = caps.admit(peer("10.0.0.2"), &activity());
        assert!(matches!(b, Admission::Served(_)));
        // The reserve fills; each newcomer evicts the oldest waiting one.
        let mut reserve = Vec::new();
        for _ in 0..=HEALTH_RESERVE {
            reserve.push(caps.admit(peer("10.0.0.3"), &activity()));
        }
        let first_evicted = match &reserve[0] {
            Admission::Reserve(_, evict) => evict.is_cancelled(),
            _ => panic!("reserve"),
        };
        assert!(first_evicted, "the reserve is {HEALTH_RESERVE} connections");
        // Connections being answered are not evicted: with all of them
        // answering, a newcomer is refused.
        let busy: Vec<_> = caps.held.lock().reserve.iter().map(|e| e.activity.request_started()).collect();
        assert!(matches!(caps.admit(peer("10.0.0.4"), &activity()), Admission::Refused));
        drop(busy);
        drop(reserve);
        drop(a);
        let again = caps.admit(peer("10.0.0.1"), &activity());
        assert!(matches!(again, Admission::Served(_)), "a place given back is free again");
        drop(b);
        let held = caps.held.lock();
        assert_eq!((held.total, held.per_client.len()), (1, 1));
    }

    #[test]
    fn headers_are_timed_from_the_opening_then_from_the_first_byte_idle_from_the_last_response_and_writes_while_blocked() {
        let activity = Arc::new(Activity::new());
        let (header, idle, stall) = (Duration::from_secs(10), Duration::from_secs(60), Duration::from_secs(30));
        let opened = activity.opened;
        assert_eq!(activity.deadline(header, idle, stall), Some(opened + header), "first request: from the opening");
        let request = activity.request_started();
        activity.on_read(); // its body: not the watchdog's
        assert_eq!(activity.deadline(header, idle, stall), None, "in flight");
        activity.on_write(true);
        let blocked = activity.write_blocked_since.load(Ordering::Relaxed);
        assert_eq!(activity.deadline(header, idle, stall), Some(opened + Duration::from_millis(blocked) + stall), "a response not read");
        activity.on_write(false);
        assert_eq!(activity.deadline(header, idle, stall), None, "read again");
        drop(request);
        let idle_since = activity.idle_since.load(Ordering::Relaxed);
        assert_eq!(activity.deadline(header, idle, stall), Some(opened + Duration::from_millis(idle_since) + idle), "kept alive: idle");
        activity.on_read();
        let head = activity.head_since.load(Ordering::Relaxed);
        let deadline = activity.deadline(header, idle, stall).unwrap();
        assert_eq!(deadline, opened + Duration::from_millis(head) + header, "a request begun: its headers' deadline");
        activity.on_read();
        assert_eq!(activity.deadline(header, idle, stall), Some(deadline), "more bytes do not extend it");
    }
}
