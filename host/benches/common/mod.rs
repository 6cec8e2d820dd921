//! What the benchmarks against a real `kiln serve` share: starting the
//! server, reading its memory, a machine probe, and a GET-rate measurement.
//! (Included by `service.rs` and `compat.rs` as `mod common;`.)

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A `kiln serve` child process.
pub struct Server {
    pub child: Child,
    pub base: String,
    _data: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn start_with(env: &[(&str, &str)]) -> Server {
    // KILN_BENCH_SERVER: another kiln binary, for back-to-back comparisons.
    let server = std::env::var_os("KILN_BENCH_SERVER").unwrap_or_else(|| env!("CARGO_BIN_EXE_kiln").into());
    start_binary(std::path::Path::new(&server), env)
}

/// [`start_with`] of the `kiln` binary at `server`.
pub fn start_binary(server: &std::path::Path, env: &[(&str, &str)]) -> Server {
    let data = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(server);
    cmd.args(["serve", "--port", "0", "--data-dir"])
        .arg(data.path())
        .env("KILN_RESULT_CACHE_MB", "0")
        .env("KILN_MAX_QUEUED_JOBS", "100000")
        .stdout(Stdio::piped())
        // The server logs every job at its default level (`info`); the
        // lines are written, to nowhere, so the figures include logging.
        .stderr(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("kiln serve");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let base = line.trim().strip_prefix("kiln listening on ").expect("listening line").to_string();
    Server { child, base, _data: data }
}

pub fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.split_whitespace().next()).and_then(|v| v.parse().ok()).unwrap_or(0)
}

pub fn raise_fd_limit() {
    // SAFETY: plain getrlimit/setrlimit on a local struct.
    unsafe {
        let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
            lim.rlim_cur = lim.rlim_max.min(65536);
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

/// How fast this machine is right now (it is a VM whose speed drifts by up
/// to 2× within minutes): single-thread hashing (user CPU) and a loopback
/// TCP ping-pong between two threads (the scheduler and network stack the
/// service's requests go through). Printed before and after the figures.
pub fn machine_probe() -> String {
    use std::io::{Read, Write};
    let data = vec![7u8; 64 << 20];
    let started = Instant::now();
    let _ = std::hint::black_box(blake3::hash(&data));
    let hash_ms = started.elapsed().as_secs_f64() * 1e3;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    const TRIPS: usize = 20_000;
    let echo = std::thread::spawn(move || {
        let (mut peer, _) = listener.accept().unwrap();
        peer.set_nodelay(true).unwrap();
        let mut b = [0u8; 1];
        for _ in 0..TRIPS {
            peer.read_exact(&mut b).unwrap();
            peer.write_all(&b).unwrap();
        }
    });
    let mut client = std::net::TcpStream::connect(addr).unwrap();
    client.set_nodelay(true).unwrap();
    let mut b = [1u8; 1];
    let started = Instant::now();
    for _ in 0..TRIPS {
        client.write_all(&b).unwrap();
        client.read_exact(&mut b).unwrap();
    }
    let trip_us = started.elapsed().as_secs_f64() * 1e6 / TRIPS as f64;
    echo.join().unwrap();
    // Branchy code chasing pointers through 16 MiB: the VM's slow phases
    // (busy neighbours) slow this kind of code — a request's path — by up
    // to ~1.6× while SIMD hashing barely moves.
    const SLOTS: usize = 4 << 20;
    let table: Vec<u32> = (0..SLOTS as u32).map(|i| i.wrapping_mul(2_654_435_761) % SLOTS as u32).collect();
    let started = Instant::now();
    let (mut x, mut acc) = (1u32, 0u64);
    for i in 0..1_000_000u32 {
        x = table[x as usize % SLOTS] ^ (i & 1);
        acc = acc.wrapping_add(match (x ^ i) & 7 {
            0 => 3,
            1 => acc & 0xff,
            2 => 7,
            3 => u64::from(x),
            4 => acc >> 3,
            5 => 11,
            6 => u64::from(i),
            _ => 2,
        });
    }
    std::hint::black_box(acc);
    let chase_ms = started.elapsed().as_secs_f64() * 1e3;
    format!("machine probe: blake3 of 64 MiB {hash_ms:.1} ms, loopback TCP round trip {trip_us:.1} µs, branchy pointer chase {chase_ms:.0} ms")
}

/// GETs of `url` on 64 connections for `secs` from this process's client;
/// requests/s (each answer must be 200).
pub async fn rate_of(http: &reqwest::Client, url: &str, secs: u64) -> f64 {
    let count = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..64 {
        let (http, url, count, stop) = (http.clone(), url.to_string(), count.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let r = http.get(&url).send().await.unwrap();
                assert_eq!(r.status(), 200);
                r.bytes().await.unwrap();
                count.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(secs)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    count.load(Ordering::Relaxed) as f64 / t0.elapsed().as_secs_f64()
}

/// GETs of `url` with 64 connections for 5 s: requests/s from this
/// process's client, and from `wrk` (a C load generator that leaves more of
/// the CPU to the server) when it is installed.
pub async fn get_rate(http: &reqwest::Client, url: &str, what: &str) {
    let rate = rate_of(http, url, 5).await;
    println!("{what}, 64 connections, in-process reqwest client: {rate:.0} req/s");
    match Command::new("wrk").args(["-t1", "-c64", "-d5s", url]).output() {
        Ok(out) if out.status.success() => {
            let text = String::from_utf8_lossy(&out.stdout);
            let rate = text.lines().find_map(|l| l.strip_prefix("Requests/sec:")).map(str::trim).unwrap_or("?");
            println!("{what}, 64 connections, wrk -t1: {rate} req/s");
        }
        _ => println!("{what} with wrk: skipped (wrk not installed)"),
    }
}
