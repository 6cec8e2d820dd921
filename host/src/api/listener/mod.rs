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

mod caps;
mod request;
mod watch;

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use caps::{Admission, Caps, Slot};
use request::ConnService;
use watch::{Activity, Watched};

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

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, SocketAddr};

    use super::caps::client_key;
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
