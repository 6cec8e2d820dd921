//! HTTP connections are bounded: the real `kiln serve` binary on loopback,
//! held open, half-sent to and flooded with raw TCP the way a red team did
//! (idle connections and half-sent requests stayed open for good, 1,100 of
//! them took the process's descriptors and health checks with them, and a
//! declared body over the limit was waited for). Every figure a test
//! measures is printed for RELIABILITY.md.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const HOSTILE_WASM: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/kiln_hostile_guests.wasm"));
const HOSTILE_MANIFEST: &str = include_str!("../../tests/guests/hostile/kiln-plugin.toml");

struct Kiln {
    child: Child,
    root: String,
    addr: SocketAddr,
    http: reqwest::Client,
    _dirs: [tempfile::TempDir; 2],
}

impl Drop for Kiln {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `kiln serve` with the hostile test plugin (for a job that runs until it
/// is canceled), `env` on top, stderr to `stderr`; with `open_files`, under
/// that limit on open files (soft and hard, so the server cannot raise it).
fn spawn(env: &[(&str, &str)], open_files: Option<u32>, stderr: Stdio) -> Kiln {
    let data = tempfile::tempdir().unwrap();
    let plugins = tempfile::tempdir().unwrap();
    let dir = plugins.path().join("hostile");
    std::fs::create_dir_all(&dir).unwrap();
    // Its nodes may run 30 s (HostileSleeper: until canceled).
    std::fs::write(dir.join("kiln-plugin.toml"), HOSTILE_MANIFEST.replace("timeout_ms = 2000", "timeout_ms = 30000")).unwrap();
    std::fs::write(dir.join("kiln_hostile_guests.wasm"), HOSTILE_WASM).unwrap();
    let kiln = env!("CARGO_BIN_EXE_kiln");
    let mut cmd = match open_files {
        Some(n) => {
            let mut sh = Command::new("sh");
            sh.arg("-c").arg(format!("ulimit -n {n} && exec \"$0\" \"$@\"")).arg(kiln);
            sh
        }
        None => Command::new(kiln),
    };
    cmd.args(["serve", "--port", "0", "--data-dir"])
        .arg(data.path())
        .env("KILN_CACHE_DIR", Path::new(env!("CARGO_TARGET_TMPDIR")).join("kiln-artifacts"))
        .env("KILN_PLUGIN_DIRS", plugins.path())
        .env("KILN_SECRET_PLUGINS", dir.canonicalize().unwrap())
        .env("KILN_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(stderr);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("kiln serve starts");
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().unwrap()), &mut line).unwrap();
    let root = line.trim().strip_prefix("kiln listening on ").unwrap_or_else(|| panic!("unexpected first line {line:?}")).to_string();
    let addr = root.trim_start_matches("http://").parse().unwrap();
    // A fresh connection per request: the tests count connections.
    let http = reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap();
    Kiln { child, root, addr, http, _dirs: [data, plugins] }
}

impl Kiln {
    fn connect(&self) -> TcpStream {
        let stream = TcpStream::connect(self.addr).unwrap();
        stream.set_nodelay(true).unwrap();
        stream
    }

    /// `GET /api/v2/health` on a fresh connection: its status and how long it took.
    async fn health(&self) -> (u16, Duration) {
        let start = Instant::now();
        let resp = self.http.get(format!("{}/api/v2/health", self.root)).timeout(Duration::from_secs(10)).send().await;
        (resp.map_or(0, |r| r.status().as_u16()), start.elapsed())
    }
}

/// Reads `stream` until the server closes it (or `limit` passes: `None`);
/// what it read and when the close came.
fn read_until_closed(stream: &mut TcpStream, limit: Duration) -> (String, Option<Duration>) {
    let start = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let left = limit.saturating_sub(start.elapsed());
        if left.is_zero() {
            return (String::from_utf8_lossy(&got).into_owned(), None);
        }
        stream.set_read_timeout(Some(left)).unwrap();
        match stream.read(&mut buf) {
            Ok(0) => return (String::from_utf8_lossy(&got).into_owned(), Some(start.elapsed())),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => return (String::from_utf8_lossy(&got).into_owned(), Some(start.elapsed())), // reset: closed
        }
    }
}

/// Reads one response head (and what came with it) from `stream`.
fn read_head(stream: &mut TcpStream, limit: Duration) -> String {
    stream.set_read_timeout(Some(limit)).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&got).into_owned()
}

/// (a), (b), (c): an idle kept-alive connection, a request whose headers
/// never end (bytes keep coming, or none at all), a body that stalls.
#[tokio::test]
async fn idle_connections_half_sent_requests_and_stalled_bodies_are_closed() {
    let kiln = spawn(&[("KILN_HTTP_HEADER_TIMEOUT_S", "1"), ("KILN_HTTP_IDLE_TIMEOUT_S", "2"), ("KILN_HTTP_BODY_TIMEOUT_S", "1")], None, Stdio::inherit());
    let limit = Duration::from_secs(6);

    // (a) A request answered, then nothing: closed after the idle timeout
    // (2 s), not the header timeout (1 s).
    let mut idle = kiln.connect();
    idle.write_all(b"GET /api/v2/health HTTP/1.1\r\nHost: kiln\r\n\r\n").unwrap();
    assert!(read_head(&mut idle, limit).starts_with("HTTP/1.1 200"));
    let (_, closed) = read_until_closed(&mut idle, limit);
    let closed = closed.expect("an idle connection is closed");
    eprintln!("(a) idle kept-alive connection closed after {} ms (http_idle_timeout_s = 2)", closed.as_millis());
    assert!(closed >= Duration::from_millis(1700) && closed < Duration::from_millis(3500), "{closed:?}");

    // (b) Headers that never end, a header line every 200 ms: closed 1 s
    // after the opening although bytes keep arriving.
    let mut slow = kiln.connect();
    let start = Instant::now();
    slow.write_all(b"GET /api/v2/health HTTP/1.1\r\nHost: kiln\r\n").unwrap();
    let mut closed = None;
    while start.elapsed() < limit {
        std::thread::sleep(Duration::from_millis(200));
        if slow.write_all(b"X-Slow: still-coming\r\n").is_err() {
            closed = Some(start.elapsed());
            break;
        }
        slow.set_read_timeout(Some(Duration::from_millis(1))).unwrap();
        if matches!(slow.read(&mut [0u8; 256]), Ok(0)) {
            closed = Some(start.elapsed());
            break;
        }
    }
    let closed = closed.expect("a half-sent request is closed");
    eprintln!("(b) request whose headers trickle in closed after {} ms (http_header_timeout_s = 1)", closed.as_millis());
    assert!(closed >= Duration::from_millis(800) && closed < Duration::from_millis(2500), "{closed:?}");
    // Nothing sent at all: the same deadline from the opening.
    let mut silent = kiln.connect();
    let (_, closed) = read_until_closed(&mut silent, limit);
    let closed = closed.expect("a silent connection is closed");
    eprintln!("(b) connection that sends nothing closed after {} ms", closed.as_millis());
    assert!(closed >= Duration::from_millis(800) && closed < Duration::from_millis(2500), "{closed:?}");
    // A second request's headers, begun after a kept-alive gap, get 1 s too.
    let mut second = kiln.connect();
    second.write_all(b"GET /api/v2/health HTTP/1.1\r\nHost: kiln\r\n\r\n").unwrap();
    assert!(read_head(&mut second, limit).starts_with("HTTP/1.1 200"));
    std::thread::sleep(Duration::from_millis(500));
    let start = Instant::now();
    second.write_all(b"GET /api/v2/health HTTP/1.1\r\n").unwrap();
    let (_, closed) = read_until_closed(&mut second, limit);
    let closed = closed.expect("a half-sent second request is closed");
    eprintln!("(b) half-sent second request closed {} ms after its first byte", closed.as_millis());
    assert!(start.elapsed() < Duration::from_millis(2000), "{closed:?}");

    // (c) A body that stops: 10 of 100 declared bytes, then nothing. The
    // request fails 408 `request_timeout` after 1 s and the connection closes.
    let mut stalled = kiln.connect();
    let start = Instant::now();
    stalled.write_all(b"POST /api/v2/jobs HTTP/1.1\r\nHost: kiln\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"workflow").unwrap();
    let (answer, closed) = read_until_closed(&mut stalled, limit);
    let closed = closed.expect("a stalled body's connection is closed");
    eprintln!("(c) stalled body answered and closed after {} ms (http_body_timeout_s = 1)", closed.as_millis());
    assert!(answer.starts_with("HTTP/1.1 408") && answer.contains("request_timeout"), "{answer}");
    assert!(start.elapsed() >= Duration::from_millis(800) && closed < Duration::from_millis(2500), "{closed:?}");

    // A response the client stops reading: a 16 MiB download into a 4 KiB
    // receive buffer, not read for 3 s, is cut (1 s without write progress).
    let size = 16 << 20;
    let form = reqwest::multipart::Form::new()
        .text("file_path", "big.bin")
        .part("file", reqwest::multipart::Part::bytes((0..size).map(|i| (i * 7919 % 251) as u8).collect::<Vec<u8>>()).file_name("big.bin"));
    let asset: Value = kiln.http.post(format!("{}/api/v2/assets", kiln.root)).multipart(form).send().await.unwrap().json().await.unwrap();
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut reader = socket.connect(kiln.addr).await.unwrap().into_std().unwrap();
    reader.set_nonblocking(false).unwrap();
    write!(reader, "GET /api/v2/assets/{}/content HTTP/1.1\r\nHost: kiln\r\n\r\n", asset["id"].as_str().unwrap()).unwrap();
    std::thread::sleep(Duration::from_secs(3));
    let (got, closed) = read_until_closed(&mut reader, limit);
    eprintln!("(c) a 16 MiB download not read for 3 s: cut after {} bytes (http_body_timeout_s = 1)", got.len());
    assert!(closed.is_some() && got.len() < size, "{} bytes", got.len());

    // A client that is merely slow but steady gets through.
    let mut steady = kiln.connect();
    let body = br#"{"workflow": {"1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 0}}, "2": {"class_type": "PreviewImage", "inputs": {"images": ["1", 0]}}}}"#;
    write!(steady, "POST /api/v2/jobs HTTP/1.1\r\nHost: kiln\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n", body.len()).unwrap();
    for chunk in body.chunks(body.len() / 4 + 1) {
        std::thread::sleep(Duration::from_millis(600));
        steady.write_all(chunk).unwrap();
    }
    assert!(read_head(&mut steady, limit).starts_with("HTTP/1.1 201"), "a body arriving every 0.6 s is not stalled");
}

/// (d) 80 half-open connections against `max_connections = 50`, then 40
/// more: health checks still answer at once, other requests over the cap
/// get 503 `too_many_connections`, and once the client lets go everything
/// works again.
#[tokio::test]
async fn at_the_connection_cap_health_still_answers_and_the_rest_are_refused() {
    let kiln = spawn(&[("KILN_MAX_CONNECTIONS", "50"), ("KILN_HTTP_HEADER_TIMEOUT_S", "60")], None, Stdio::inherit());
    assert_eq!(kiln.health().await.0, 200);
    tokio::time::sleep(Duration::from_millis(200)).await; // its connection is closed
    let mut held: Vec<TcpStream> = (0..80)
        .map(|_| {
            let mut s = kiln.connect();
            s.write_all(b"GET /api/v2/jobs HTTP/1.1\r\nHost: kiln\r\n").unwrap();
            s
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, took) = kiln.health().await;
    eprintln!("(d) health with 80 half-open connections (cap 50): {status} in {} ms", took.as_millis());
    assert_eq!(status, 200);
    assert!(took < Duration::from_secs(1), "{took:?}");
    // 40 more fill the reserve: the oldest waiting ones make room.
    held.extend((0..40).map(|_| {
        let mut s = kiln.connect();
        s.write_all(b"GET /api/v2/jobs HTTP/1.1\r\nHost: kiln\r\n").unwrap();
        s
    }));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut worst = Duration::ZERO;
    for _ in 0..5 {
        let (status, took) = kiln.health().await;
        assert_eq!(status, 200);
        worst = worst.max(took);
    }
    eprintln!("(d) health with 120 half-open connections (cap 50, reserve 32): 5 × 200, slowest {} ms", worst.as_millis());
    assert!(worst < Duration::from_secs(1), "{worst:?}");
    // Anything else over the cap: 503 in the envelope, the connection closed.
    let resp = kiln.http.get(format!("{}/api/v2/jobs", kiln.root)).send().await.unwrap();
    assert_eq!(resp.status(), 503);
    assert_eq!(resp.headers().get("connection").and_then(|v| v.to_str().ok()), Some("close"));
    assert!(resp.headers().contains_key("retry-after"));
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "too_many_connections", "{body}");
    // The 50 under the cap stay open (their headers have 60 s); those over
    // it were closed within the reserve's 2 s, or for newer ones.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let open = held
        .iter()
        .filter(|s| {
            s.set_nonblocking(true).unwrap();
            let open = matches!((&mut &**s).read(&mut [0u8; 64]), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
            s.set_nonblocking(false).unwrap();
            open
        })
        .count();
    eprintln!("(d) after 2.5 s: {open} of 120 half-open connections still open");
    assert_eq!(open, 50);
    drop(held);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let resp = kiln.http.get(format!("{}/api/v2/jobs", kiln.root)).send().await.unwrap();
    assert_eq!(resp.status(), 200, "the client let go: served again");
}

/// (e) One address at its `max_connections_per_ip` cannot open more (its
/// next request is 503, its health check still answers); another address
/// (127.0.0.2, also loopback on Linux) is served as usual.
#[tokio::test]
async fn one_address_at_its_cap_does_not_affect_another() {
    let kiln = spawn(&[("KILN_MAX_CONNECTIONS_PER_IP", "5"), ("KILN_HTTP_HEADER_TIMEOUT_S", "60")], None, Stdio::inherit());
    let _held: Vec<TcpStream> = (0..5)
        .map(|_| {
            let mut s = kiln.connect();
            s.write_all(b"GET /api/v2/jobs HTTP/1.1\r\nHost: kiln\r\n").unwrap();
            s
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let resp = kiln.http.get(format!("{}/api/v2/jobs", kiln.root)).send().await.unwrap();
    assert_eq!(resp.status(), 503, "127.0.0.1 is at its cap");
    assert_eq!(resp.json::<Value>().await.unwrap()["error"]["code"], "too_many_connections");
    assert_eq!(kiln.health().await.0, 200, "its health check still answers");
    let other = reqwest::Client::builder().local_address(IpAddr::from([127, 0, 0, 2])).pool_max_idle_per_host(0).build().unwrap();
    for _ in 0..10 {
        let resp = other.get(format!("{}/api/v2/jobs", kiln.root)).send().await.unwrap();
        assert_eq!(resp.status(), 200, "127.0.0.2 is not affected");
    }
    eprintln!("(e) 127.0.0.1 at max_connections_per_ip = 5: 503; 127.0.0.2: 10 × 200");
}

/// (f) A declared `Content-Length` over the route's limit is answered at
/// once, without reading the body, and with `Expect: 100-continue` never
/// with a `100`: on a plugin route, the job submission and the uploads.
#[tokio::test]
async fn a_declared_body_over_the_limit_is_refused_before_it_is_sent() {
    let kiln = spawn(&[], None, Stdio::inherit());
    let cases: [(&str, u64, &str, &str); 5] = [
        // (path, declared length, expected status line, expected code)
        ("/proxy/partner/v1/ai/skin-enhancer/flexible", (64 << 20) + 1, "HTTP/1.1 413", "payload_too_large"),
        // The Jobs API's contract: a submission over the size limit is an
        // invalid workflow naming `max_workflow_kb` (as when it is counted).
        ("/api/v2/jobs", (8 << 20) + 1, "HTTP/1.1 422", "max_workflow_kb"),
        ("/api/v2/assets", 200 << 20, "HTTP/1.1 413", "payload_too_large"),
        ("/upload/image", 200 << 20, "HTTP/1.1 413", "payload_too_large"),
        ("/api/userdata/workflows%2Fbig.json", 17 << 20, "HTTP/1.1 413", "payload_too_large"),
    ];
    for (path, length, status, says) in cases {
        for expect in [true, false] {
            let mut s = kiln.connect();
            let start = Instant::now();
            let expect_line = if expect { "Expect: 100-continue\r\n" } else { "" };
            write!(s, "POST {path} HTTP/1.1\r\nHost: kiln\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n{expect_line}\r\n").unwrap();
            let (answer, closed) = read_until_closed(&mut s, Duration::from_secs(5));
            let took = start.elapsed();
            eprintln!("(f) POST {path} declaring {length} bytes (expect: {expect}): {} in {} ms", answer.lines().next().unwrap_or(""), took.as_millis());
            assert!(answer.starts_with(status) && answer.contains(says), "{path}: {answer}");
            assert!(!answer.contains("100 Continue"), "{path}: no 100 before the refusal: {answer}");
            assert!(answer.to_ascii_lowercase().contains("connection: close"), "{answer}");
            assert!(closed.is_some() && took < Duration::from_secs(1), "{path}: answered and closed at once ({took:?})");
        }
    }
    // A client that sends the whole body anyway (no `Expect`) reads the
    // answer, not a reset: the server reads and discards for a while after it.
    let start = Instant::now();
    let resp = kiln.http.post(format!("{}/proxy/partner/v1/ai/skin-enhancer/flexible", kiln.root)).body(vec![b' '; (64 << 20) + 1]).send().await.unwrap();
    eprintln!("(f) 64 MiB + 1 sent whole to the proxy route: {} after {} ms", resp.status(), start.elapsed().as_millis());
    assert_eq!(resp.status(), 413);
    // Within the limit, `Expect: 100-continue` still gets its 100.
    let mut s = kiln.connect();
    s.write_all(b"POST /api/v2/jobs HTTP/1.1\r\nHost: kiln\r\nContent-Type: application/json\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n").unwrap();
    assert!(read_head(&mut s, Duration::from_secs(5)).starts_with("HTTP/1.1 100"), "a body within the limit is asked for");
}

/// (g) What is in flight is never idle: an event stream keeps streaming
/// and a WebSocket keeps delivering past a 1 s idle and header timeout.
#[tokio::test]
async fn event_streams_and_websockets_outlive_the_idle_timeout() {
    let kiln = spawn(&[("KILN_HTTP_IDLE_TIMEOUT_S", "1"), ("KILN_HTTP_HEADER_TIMEOUT_S", "1"), ("KILN_SSE_KEEPALIVE_S", "1")], None, Stdio::inherit());
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("{}/ws?clientId=idle", kiln.root.replace("http://", "ws://"))).await.unwrap();
    // A job that runs until canceled (it sleeps in a host call).
    let sleeper = json!({ "workflow": { "1": { "class_type": "HostileSleeper", "inputs": { "trigger": 1 } } } });
    let job: Value = kiln.http.post(format!("{}/api/v2/jobs", kiln.root)).json(&sleeper).send().await.unwrap().json().await.unwrap();
    let id = job["id"].as_str().unwrap_or_else(|| panic!("{job}")).to_string();
    let mut events = kiln.http.get(format!("{}/api/v2/jobs/{id}/events", kiln.root)).send().await.unwrap();
    assert_eq!(events.status(), 200);
    let start = Instant::now();
    let mut keepalives = 0;
    while start.elapsed() < Duration::from_secs(3) {
        let chunk = tokio::time::timeout(Duration::from_secs(2), events.chunk()).await.expect("the stream keeps sending").unwrap();
        let chunk = chunk.unwrap_or_else(|| panic!("the stream ended after {:?}", start.elapsed()));
        keepalives += String::from_utf8_lossy(&chunk).matches("keepalive").count();
    }
    eprintln!("(g) event stream open {} ms with idle/header timeouts of 1 s: {keepalives} keepalives", start.elapsed().as_millis());
    assert!(keepalives >= 2, "{keepalives}");
    // The WebSocket, quiet for 3 s, still delivers: the cancel's messages.
    use futures_util::StreamExt;
    // Drain what was already sent.
    loop {
        match tokio::time::timeout(Duration::from_millis(100), ws.next()).await {
            Ok(Some(Ok(_))) => continue,
            Ok(other) => panic!("the WebSocket ended: {other:?}"),
            Err(_) => break,
        }
    }
    let resp = kiln.http.post(format!("{}/api/v2/jobs/{id}/cancel", kiln.root)).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let message = tokio::time::timeout(Duration::from_secs(5), ws.next()).await.expect("the WebSocket is open").expect("a message").unwrap();
    eprintln!("(g) WebSocket after {} ms: {}", start.elapsed().as_millis(), message.to_text().map(|t| &t[..t.len().min(80)]).unwrap_or("binary"));
}

/// The red team's finding, scaled down: `kiln serve` under a 512-file limit
/// it cannot raise, 600 half-sent requests (more than its descriptors). It
/// lowers `max_connections` to fit, says so, and health checks answer all
/// along; once the client lets go, normal requests work.
#[tokio::test]
async fn more_half_sent_requests_than_descriptors_do_not_take_health_checks_down() {
    let log = tempfile::NamedTempFile::new().unwrap();
    let kiln = spawn(&[("KILN_HTTP_HEADER_TIMEOUT_S", "60")], Some(512), Stdio::from(log.reopen().unwrap()));
    let mut held = Vec::new();
    for _ in 0..600 {
        match TcpStream::connect(kiln.addr) {
            Ok(mut s) => {
                let _ = s.write_all(b"POST /api/v2/jobs HTTP/1.1\r\nHost: kiln\r\nContent-Length: 10\r\n");
                held.push(s);
            }
            Err(e) => panic!("connect: {e}"),
        }
    }
    let mut worst = Duration::ZERO;
    for _ in 0..5 {
        let (status, took) = kiln.health().await;
        assert_eq!(status, 200, "health with 600 half-sent requests");
        worst = worst.max(took);
    }
    let stderr = std::fs::read_to_string(log.path()).unwrap();
    eprintln!("(red team) 600 half-sent requests, RLIMIT_NOFILE 512: health 5 × 200, slowest {} ms", worst.as_millis());
    assert!(worst < Duration::from_secs(1), "{worst:?}");
    assert!(stderr.contains("max_connections lowered") && !stderr.contains("Too many open files"), "{stderr}");
    drop(held);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let resp = kiln.http.get(format!("{}/api/v2/jobs", kiln.root)).send().await.unwrap();
    assert_eq!(resp.status(), 200);
}
