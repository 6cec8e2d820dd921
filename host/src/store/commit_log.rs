//! The commit log: a redo log of job writes (submissions, starts, terminal
//! records) that makes them durable without a flush of the metadata store.
//!
//! sled's own flush hands the write to its I/O thread pool, whose `send`
//! wakes all seven idle pool threads; twice per job that was a fifth of the
//! server's CPU (BENCHMARKS.md, "where a job's CPU goes"). Here the calling
//! thread writes a frame with one `pwrite` and, when it must be durable,
//! syncs the log's unsynced prefix as [`Durability`] says (`fdatasync` by
//! default). Syncs are group commits: one runs at a time and covers every
//! frame appended before it started, so the writers that queued behind it
//! share the next one instead of each paying a device cache flush.
//!
//! Frames go one after another into a file that is zero-filled ahead of the
//! writes (1 MiB at a time, made durable with `fdatasync` when extended), so
//! a sync never has file-size metadata to write. A frame is
//! `magic ‖ cycle ‖ seq ‖ len ‖ checksum ‖ payload` (little-endian; the
//! checksum is the first 8 bytes of blake3 over cycle, seq, len and
//! payload). Reading starts at offset 0 and stops at the first frame that is
//! torn, fails its checksum, or does not continue the first frame's cycle
//! and sequence — which is how frames of an earlier cycle, left behind the
//! write position by a reset, are told apart. Syncs always cover the whole
//! unsynced prefix, so what survives a crash is a prefix of the log.
//!
//! The log is reset (a new random cycle id, writes start again at offset 0,
//! whose old header is zeroed and synced first) only after a flush of the
//! store has made every frame redundant: when the store opens, when the log
//! is full ([`CAP`]), and when the store asks (a checkpoint), always under
//! the log's lock so no frame can slip between the flush and the reset.
//!
//! A failed sync is not retried: the kernel may have dropped the dirty pages
//! it could not write and report the next sync of the same range as clean,
//! which would acknowledge frames behind a hole that replay stops at. The
//! log is *failed* instead: every sync refuses until the next append has
//! flushed the store and reset the log (PostgreSQL, facing the same kernel
//! behaviour, stops the server; here the writers of the unsynced frames get
//! an error and the store's own flush is the way back).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;

use super::StoreError;
use super::durability::Durability;

/// Most bytes of frames before the log is reset.
pub const CAP: u64 = 16 << 20;
/// Within this many bytes of [`CAP`], an append may have to flush the store.
const HEADROOM: u64 = 1 << 20;
/// A sync that took longer than this, µs, is slow: a thread that must not
/// block hands the next one to another thread (see [`CommitLog::sync_may_wait`]).
const QUICK_SYNC_MICROS: u64 = 500;
/// The file is zero-filled ahead of the writes in steps of this size.
const STEP: u64 = 1 << 20;
const MAGIC: [u8; 4] = *b"KLG1";
const HEADER: usize = 4 + 8 + 8 + 4 + 8;

struct State {
    /// Where the next frame goes.
    end: u64,
    /// Frames before this offset are durable.
    synced: u64,
    /// Bytes of the file that exist (zero-filled or written).
    allocated: u64,
    /// The next frame's sequence number.
    seq: u64,
    /// This cycle's id (random per reset): a sync that finishes after a
    /// reset must not mark frames of the new cycle durable.
    cycle: u64,
    /// A sync of this cycle failed (with this kind of error): nothing after
    /// `synced` may be acknowledged until a flush of the store and a reset.
    failed: Option<std::io::ErrorKind>,
}

/// An append-only log of opaque payloads.
pub struct CommitLog {
    /// Written and synced by offset, so it is shared outside the lock.
    file: File,
    state: Mutex<State>,
    /// A flush and reset holds the lock (see [`CommitLog::may_block`]).
    resetting: AtomicBool,
    /// `state.failed`, readable without the lock.
    failed_hint: AtomicBool,
    /// `state.end`, readable without the lock.
    end_hint: AtomicU64,
    /// Held by the one sync running (see [`CommitLog::sync_to`]).
    syncing: Mutex<()>,
    /// Syncs run so far (group commit makes them fewer than the appends
    /// that wait for one).
    syncs: AtomicU64,
    /// How long the last sync took, µs.
    last_sync_micros: AtomicU64,
    durability: Durability,
    /// Tests make the next sync fail as a device error would.
    #[cfg(test)]
    fail_next_sync: AtomicBool,
}

fn checksum(cycle: u64, seq: u64, payload: &[u8]) -> [u8; 8] {
    let mut h = blake3::Hasher::new();
    h.update(&cycle.to_le_bytes());
    h.update(&seq.to_le_bytes());
    h.update(&(payload.len() as u32).to_le_bytes());
    h.update(payload);
    let mut out = [0; 8];
    out.copy_from_slice(&h.finalize().as_bytes()[..8]);
    out
}

impl CommitLog {
    /// Opens (creating) the log at `path` and returns it with the payloads
    /// of its current cycle, oldest first. The caller applies them, flushes
    /// the store, then calls [`CommitLog::reset`].
    pub fn open(path: &Path, durability: Durability) -> Result<(CommitLog, Vec<Vec<u8>>), StoreError> {
        let file = File::options().read(true).write(true).create(true).truncate(false).open(path)?;
        let allocated = file.metadata()?.len();
        let mut payloads = Vec::new();
        let (mut offset, mut last) = (0u64, None::<(u64, u64)>);
        let mut header = [0u8; HEADER];
        let field = |h: &[u8], at: usize| u64::from_le_bytes(h[at..at + 8].try_into().unwrap_or_default());
        while offset + HEADER as u64 <= allocated {
            if file.read_exact_at(&mut header, offset).is_err() || header[..4] != MAGIC {
                break;
            }
            let (cycle, seq) = (field(&header, 4), field(&header, 12));
            let len = u32::from_le_bytes(header[20..24].try_into().unwrap_or_default()) as u64;
            if last.is_some_and(|(c, s)| cycle != c || seq != s + 1) || offset + HEADER as u64 + len > allocated {
                break;
            }
            let mut payload = vec![0u8; len as usize];
            if file.read_exact_at(&mut payload, offset + HEADER as u64).is_err() || checksum(cycle, seq, &payload)[..] != header[24..32] {
                break;
            }
            payloads.push(payload);
            last = Some((cycle, seq));
            offset += HEADER as u64 + len;
        }
        // Until the reset the frames read stay; new ones would follow them.
        let (cycle, seq) = last.map_or_else(|| (new_cycle(), 1), |(c, s)| (c, s + 1));
        let state = State { end: offset, synced: offset, allocated, seq, cycle, failed: None };
        let log = CommitLog {
            file,
            state: Mutex::new(state),
            resetting: AtomicBool::new(false),
            failed_hint: AtomicBool::new(false),
            end_hint: AtomicU64::new(offset),
            syncing: Mutex::new(()),
            syncs: AtomicU64::new(0),
            last_sync_micros: AtomicU64::new(0),
            durability,
            #[cfg(test)]
            fail_next_sync: AtomicBool::new(false),
        };
        Ok((log, payloads))
    }

    /// Appends `payload`; with `sync`, returns once it (and every frame
    /// before it) is durable. When the log is full or a sync has failed,
    /// `flush` (which must make every earlier frame redundant) runs first
    /// and the log is reset.
    pub fn append(&self, payload: &[u8], sync: bool, flush: impl FnOnce() -> Result<(), StoreError>) -> Result<(), StoreError> {
        let mut frame = Vec::with_capacity(HEADER + payload.len());
        let mut state = self.state.lock();
        let len = u32::try_from(payload.len()).map_err(|_| StoreError::Backend("commit log entry too large".into()))?;
        if state.failed.is_some() || state.end + frame.capacity() as u64 > CAP {
            self.flush_and_reset(&mut state, flush)?;
        }
        let (cycle, seq) = (state.cycle, state.seq);
        frame.extend_from_slice(&MAGIC);
        frame.extend_from_slice(&cycle.to_le_bytes());
        frame.extend_from_slice(&seq.to_le_bytes());
        frame.extend_from_slice(&len.to_le_bytes());
        frame.extend_from_slice(&checksum(cycle, seq, payload));
        frame.extend_from_slice(payload);
        let at = state.end;
        let needed = at + frame.len() as u64;
        if needed > state.allocated {
            // Zero-fill ahead and make the new length durable once, so later
            // syncs of this region carry no metadata.
            let grown = needed.div_ceil(STEP) * STEP;
            let zeros = vec![0u8; (grown - state.allocated) as usize];
            self.file.write_all_at(&zeros, state.allocated)?;
            self.file.sync_data()?;
            state.allocated = grown;
        }
        self.file.write_all_at(&frame, at)?;
        state.end = needed;
        self.end_hint.store(needed, Ordering::Relaxed);
        state.seq += 1;
        if !sync {
            return Ok(());
        }
        let cycle = state.cycle;
        drop(state);
        self.sync_to(needed, cycle)
    }

    /// Syncs run so far.
    #[cfg(test)]
    pub fn syncs(&self) -> u64 {
        self.syncs.load(Ordering::Relaxed)
    }

    /// Makes every frame appended so far durable.
    pub fn sync(&self) -> Result<(), StoreError> {
        let (end, cycle) = {
            let state = self.state.lock();
            (state.end, state.cycle)
        };
        self.sync_to(end, cycle)
    }

    /// Returns once the frames of `cycle` before `to` are durable (or that
    /// cycle was ended by a reset, whose flush made them redundant). One
    /// sync runs at a time, outside the append lock; a caller that waited
    /// for it finds its frames covered, or runs the next sync, which covers
    /// everything appended by then (group commit).
    fn sync_to(&self, to: u64, cycle: u64) -> Result<(), StoreError> {
        let _turn = self.syncing.lock();
        let (from, end) = {
            let state = self.state.lock();
            if state.cycle != cycle || state.synced >= to {
                return Ok(());
            }
            if let Some(kind) = state.failed {
                return Err(failed(kind));
            }
            (state.synced, state.end)
        };
        let started = std::time::Instant::now();
        let synced = self.sync_range(from, end);
        self.last_sync_micros.store(started.elapsed().as_micros() as u64, Ordering::Relaxed);
        self.syncs.fetch_add(1, Ordering::Relaxed);
        let mut state = self.state.lock();
        if state.cycle != cycle {
            // A reset flushed the store meanwhile: the frames are redundant.
            return Ok(());
        }
        if let Err(e) = synced {
            tracing::error!(error = %e, "a sync of the commit log failed; the next write flushes the store and resets the log");
            state.failed = Some(e.kind());
            self.failed_hint.store(true, Ordering::Relaxed);
            return Err(e.into());
        }
        state.synced = state.synced.max(end);
        Ok(())
    }

    fn sync_range(&self, from: u64, to: u64) -> std::io::Result<()> {
        #[cfg(test)]
        if self.fail_next_sync.swap(false, Ordering::Relaxed) {
            return Err(std::io::Error::from_raw_os_error(libc::EIO));
        }
        self.durability.sync_range(&self.file, from, to)
    }

    /// Runs `flush` (which must make every frame so far redundant) with
    /// appends held off, then starts a new cycle.
    pub fn checkpoint(&self, flush: impl FnOnce() -> Result<(), StoreError>) -> Result<(), StoreError> {
        let mut state = self.state.lock();
        self.flush_and_reset(&mut state, flush)
    }

    /// Whether a sync now may keep its caller waiting long: the last one
    /// was slow (the device's cache flush took more than
    /// [`QUICK_SYNC_MICROS`]; waiting for one in flight first at most
    /// doubles a quick one). A caller that must not block — an HTTP
    /// thread — has another thread sync then.
    pub fn sync_may_wait(&self) -> bool {
        self.last_sync_micros.load(Ordering::Relaxed) > QUICK_SYNC_MICROS
    }

    /// Whether an append now may wait for a flush of the store (a
    /// checkpoint is running, or the log is nearly full): a caller that must
    /// not block — an HTTP thread — appends from another thread then.
    pub fn may_block(&self) -> bool {
        self.resetting.load(Ordering::Relaxed) || self.failed_hint.load(Ordering::Relaxed) || self.end_hint.load(Ordering::Relaxed) + HEADROOM > CAP
    }

    fn flush_and_reset(&self, state: &mut State, flush: impl FnOnce() -> Result<(), StoreError>) -> Result<(), StoreError> {
        self.resetting.store(true, Ordering::Relaxed);
        let done = flush().and_then(|()| self.reset(state));
        self.resetting.store(false, Ordering::Relaxed);
        done
    }

    /// Starts a new cycle at offset 0. The old first header is zeroed and
    /// synced first, so a crash before the next frame replays nothing.
    fn reset(&self, state: &mut State) -> Result<(), StoreError> {
        if state.allocated >= HEADER as u64 {
            self.file.write_all_at(&[0u8; HEADER], 0)?;
            self.durability.sync_range(&self.file, 0, HEADER as u64)?;
        }
        state.end = 0;
        self.end_hint.store(0, Ordering::Relaxed);
        state.synced = 0;
        state.cycle = new_cycle();
        state.seq = 1;
        state.failed = None;
        self.failed_hint.store(false, Ordering::Relaxed);
        Ok(())
    }
}

/// What a sync answers while the log is failed (the failure's kind kept:
/// a full disk stays `StorageFull`).
fn failed(kind: std::io::ErrorKind) -> StoreError {
    StoreError::Io(std::io::Error::new(kind, "an earlier sync of the commit log failed; the store is flushed before the next write"))
}

/// A random cycle id.
fn new_cycle() -> u64 {
    u64::from_le_bytes(uuid::Uuid::new_v4().as_bytes()[..8].try_into().unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(path: &Path) -> (CommitLog, Vec<String>) {
        let (log, payloads) = CommitLog::open(path, Durability::PowerLoss).unwrap();
        (log, payloads.into_iter().map(|p| String::from_utf8(p).unwrap()).collect())
    }

    #[test]
    fn frames_come_back_in_order_until_a_torn_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("commit.log");
        {
            let (log, old) = open(&path);
            assert!(old.is_empty());
            log.append(b"one", true, || Ok(())).unwrap();
            log.append(b"two", false, || Ok(())).unwrap();
            log.append(b"three", true, || Ok(())).unwrap();
        }
        assert_eq!(open(&path).1, ["one", "two", "three"]);
        // Tear the last frame: the ones before it survive, it does not.
        let len = (HEADER + 3) as u64 * 2 + HEADER as u64 + 5;
        let file = File::options().write(true).open(&path).unwrap();
        file.write_all_at(b"X", len - 2).unwrap();
        assert_eq!(open(&path).1, ["one", "two"]);
        // A broken header ends the log too.
        file.write_all_at(b"Z", 0).unwrap();
        assert!(open(&path).1.is_empty());
    }

    #[test]
    fn writers_waiting_for_a_sync_share_the_next_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("commit.log");
        let (log, _) = CommitLog::open(&path, Durability::PowerLoss).unwrap();
        let log = std::sync::Arc::new(log);
        // A sync in flight: the writers append, then queue behind it.
        let in_flight = log.syncing.lock();
        let writers: Vec<_> = (0..4)
            .map(|i| {
                let log = log.clone();
                std::thread::spawn(move || log.append(format!("w{i}").as_bytes(), true, || Ok(())).unwrap())
            })
            .collect();
        while log.end_hint.load(Ordering::Relaxed) < 4 * (HEADER as u64 + 2) {
            std::thread::yield_now();
        }
        drop(in_flight);
        for w in writers {
            w.join().unwrap();
        }
        assert_eq!(log.syncs.load(Ordering::Relaxed), 1, "the first to go on synced all four frames");
        log.append(b"alone", true, || Ok(())).unwrap();
        assert_eq!(log.syncs.load(Ordering::Relaxed), 2);
        log.sync().unwrap();
        assert_eq!(log.syncs.load(Ordering::Relaxed), 2, "nothing left to sync");
        let mut back = open(&path).1;
        back.sort();
        assert_eq!(back, ["alone", "w0", "w1", "w2", "w3"]);
    }

    /// After a failed sync nothing more is acknowledged over the log until
    /// the store has been flushed: a retried sync could succeed over pages
    /// the kernel dropped.
    #[test]
    fn a_failed_sync_is_not_retried_the_next_write_flushes_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("commit.log");
        let flushes = std::cell::Cell::new(0);
        let flush = || {
            flushes.set(flushes.get() + 1);
            Ok(())
        };
        let (log, _) = open(&path);
        log.append(b"kept", true, flush).unwrap();
        log.append(b"unsynced", false, flush).unwrap();
        log.fail_next_sync.store(true, Ordering::Relaxed);
        assert!(log.sync().is_err(), "the device error is reported");
        assert!(log.sync().is_err(), "and not retried as if the pages were written");
        assert!(log.may_block(), "the next append flushes the store");
        assert_eq!(flushes.get(), 0);
        log.append(b"after", true, flush).unwrap();
        assert_eq!(flushes.get(), 1, "the store was flushed first");
        assert!(!log.may_block());
        log.sync().unwrap();
        drop(log);
        assert_eq!(open(&path).1, ["after"], "a new cycle: the failed frames were made redundant by the flush");
        // A flush that fails too keeps the log failed.
        let (log, _) = open(&path);
        log.append(b"x", false, || Ok(())).unwrap();
        log.fail_next_sync.store(true, Ordering::Relaxed);
        assert!(log.sync().is_err());
        assert!(log.append(b"y", true, || Err(StoreError::Backend("disk gone".into()))).is_err());
        assert!(log.sync().is_err(), "still failed");
    }

    #[test]
    fn a_checkpoint_starts_a_cycle_and_old_frames_are_not_replayed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("commit.log");
        let flushes = std::cell::Cell::new(0);
        {
            let (log, _) = open(&path);
            for i in 0..5 {
                log.append(format!("old-{i}-{}", "x".repeat(40)).as_bytes(), false, || Ok(())).unwrap();
            }
            log.checkpoint(|| {
                flushes.set(flushes.get() + 1);
                Ok(())
            })
            .unwrap();
            assert!(open(&path).1.is_empty(), "a checkpoint with no frame after it replays nothing");
            // Shorter than what it overwrites: the old frames behind it must
            // not come back (they belong to another cycle).
            log.append(b"new", true, || Ok(())).unwrap();
        }
        assert_eq!(flushes.get(), 1);
        assert_eq!(open(&path).1, ["new"]);
        // A failed checkpoint flush keeps the cycle.
        let (log, _) = open(&path);
        assert!(log.checkpoint(|| Err(StoreError::Backend("disk gone".into()))).is_err());
        log.append(b"after", true, || Ok(())).unwrap();
        assert_eq!(open(&path).1, ["new", "after"]);
    }

    #[test]
    fn appends_may_block_during_a_checkpoint_and_near_the_cap() {
        let dir = tempfile::tempdir().unwrap();
        let (log, _) = open(&dir.path().join("commit.log"));
        assert!(!log.may_block());
        log.checkpoint(|| {
            assert!(log.may_block(), "while the store is flushed");
            Ok(())
        })
        .unwrap();
        assert!(!log.may_block());
        let entry = vec![b'e'; 64 << 10];
        while !log.may_block() {
            log.append(&entry, false, || Ok(())).unwrap();
        }
        assert!(log.end_hint.load(Ordering::Relaxed) + HEADROOM > CAP, "only near the cap");
        log.checkpoint(|| Ok(())).unwrap();
        assert!(!log.may_block(), "a new cycle starts empty");
    }

    #[test]
    fn a_full_log_flushes_and_wraps() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("commit.log");
        let flushes = std::cell::Cell::new(0);
        let (log, _) = open(&path);
        let entry = vec![b'e'; 64 << 10];
        let per_cycle = CAP / (entry.len() + HEADER) as u64;
        for _ in 0..per_cycle + 3 {
            log.append(&entry, true, || {
                flushes.set(flushes.get() + 1);
                Ok(())
            })
            .unwrap();
        }
        assert_eq!(flushes.get(), 1, "one wrap");
        drop(log);
        assert_eq!(open(&path).1.len(), 3, "only the new cycle is replayed");
        assert!(std::fs::metadata(&path).unwrap().len() <= CAP + STEP);
    }
}
