//! The queue: every job that has not finished (the live set, by store
//! key), the fair queue of those waiting, the server-wide count of queued
//! jobs and the order submissions are numbered in. In-process: one server
//! holds it (a restart rebuilds it from the store, see `retention`).
//!
//! The rules of who may queue how much live in `intake` (bounds) and
//! `fair` (per-key limits and round-robin order); this owns the state they
//! act on and keeps the count and the fair queue in step.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use parking_lot::{Mutex, RwLock};
use tokio::sync::Notify;

use super::LiveJob;
use super::fair::{FairQueue, KeyQueueFull, TenantLimits};

/// The jobs not yet finished, and those of them waiting to run.
pub(super) struct JobQueue {
    live: RwLock<HashMap<String, Arc<LiveJob>>>,
    /// Queued jobs per scheduling key, served round-robin (see `fair`).
    waiting: Mutex<FairQueue>,
    /// Jobs queued on the whole server (reserved before they are pushed).
    queued: AtomicUsize,
    /// Wakes a worker when a job is pushed or a key may run another.
    notify: Notify,
    /// The next submission's number (`JobRecord::seq`).
    seq: AtomicU64,
}

impl JobQueue {
    pub fn new() -> JobQueue {
        JobQueue { live: RwLock::default(), waiting: Mutex::default(), queued: AtomicUsize::new(0), notify: Notify::new(), seq: AtomicU64::new(1) }
    }

    /// The live job stored under `id`.
    pub fn live(&self, id: &str) -> Option<Arc<LiveJob>> {
        self.live.read().get(id).cloned()
    }

    /// Every live job (a copy of the set: no lock is held afterwards).
    pub fn live_jobs(&self) -> Vec<Arc<LiveJob>> {
        self.live.read().values().cloned().collect()
    }

    /// Live jobs of `owner` (ComfyUI's `queue_remaining`).
    pub fn remaining_of(&self, owner: &str) -> usize {
        self.live.read().values().filter(|j| &*j.owner == owner).count()
    }

    /// Whether no job is live.
    pub fn is_idle(&self) -> bool {
        self.live.read().is_empty()
    }

    /// Adds a job to the live set; `false` (and nothing added) when its key
    /// is taken.
    pub fn join(&self, id: &str, job: Arc<LiveJob>) -> bool {
        let mut live = self.live.write();
        if live.contains_key(id) {
            return false;
        }
        live.insert(id.to_string(), job);
        true
    }

    /// Removes a job from the live set.
    pub fn leave(&self, id: &str) -> Option<Arc<LiveJob>> {
        self.live.write().remove(id)
    }

    /// Takes one of the server's `max` queue places; `false` when all are
    /// taken. Given back by [`JobQueue::release`], or by the job leaving the
    /// queue ([`JobQueue::withdraw`], [`JobQueue::next`]).
    pub fn reserve(&self, max: usize) -> bool {
        if self.queued.fetch_add(1, Ordering::SeqCst) >= max {
            self.queued.fetch_sub(1, Ordering::SeqCst);
            return false;
        }
        true
    }

    /// Gives back a place taken by [`JobQueue::reserve`] for a job not pushed.
    pub fn release(&self) {
        self.queued.fetch_sub(1, Ordering::SeqCst);
    }

    /// Queues a job whose place is reserved under scheduling key `key`
    /// (at most `max_queued` of the key's) and wakes a worker; its position
    /// among its owner's queued jobs.
    pub fn push(&self, key: &str, owner: &str, id: String, front: bool, max_queued: usize) -> Result<usize, KeyQueueFull> {
        let position = self.waiting.lock().push(key, owner, id, front, max_queued)?;
        self.notify.notify_one();
        Ok(position)
    }

    /// A job recovered at start: queued whatever its key's limit.
    pub fn requeue(&self, key: &str, job: Arc<LiveJob>) {
        let id = job.record.lock().id.clone();
        self.queued.fetch_add(1, Ordering::SeqCst);
        let _ = self.waiting.lock().push(key, &job.owner, id.clone(), false, usize::MAX);
        self.live.write().insert(id, job);
    }

    /// Takes a job out of the waiting queue (canceled, expired, or its
    /// submission not written); whether it was waiting.
    pub fn withdraw(&self, id: &str) -> bool {
        let removed = self.waiting.lock().remove(id);
        if removed {
            self.queued.fetch_sub(1, Ordering::SeqCst);
        }
        removed
    }

    /// The next job to run, round-robin across scheduling keys within each
    /// key's `limits` (see `fair`), with its key: waits until there is one.
    pub async fn next(&self, limits: &dyn TenantLimits) -> (String, String) {
        loop {
            // Registered before the queue is checked, so a push in between
            // still wakes this worker.
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(next) = self.waiting.lock().pop(limits) {
                self.queued.fetch_sub(1, Ordering::SeqCst);
                return next;
            }
            notified.await;
        }
    }

    /// A job of `key` stopped running: the key may run another (this
    /// worker looks first, any other idle one too).
    pub fn done(&self, key: &str) {
        self.waiting.lock().done(key);
        self.notify.notify_one();
    }

    /// Some key's limits changed: every idle worker looks again.
    pub fn limits_changed(&self) {
        self.notify.notify_waiters();
    }

    /// 1-based position of a queued job among its owner's queued jobs.
    pub fn position(&self, id: &str) -> Option<usize> {
        self.waiting.lock().position(id)
    }

    /// Queued job ids in the order they would run.
    pub fn ordered(&self) -> Vec<String> {
        self.waiting.lock().ordered()
    }

    /// Live jobs that `keep` accepts. `keep` runs after the set's lock is
    /// released: it may take a job's record lock (a submission holds that
    /// lock while it joins or leaves the set).
    pub fn live_where(&self, keep: impl Fn(&LiveJob) -> bool) -> Vec<Arc<LiveJob>> {
        self.live_jobs().into_iter().filter(|job| keep(job)).collect()
    }

    /// Waiting jobs, in the order they would run, that `keep` accepts.
    pub fn queued_where(&self, keep: impl Fn(&LiveJob) -> bool) -> Vec<Arc<LiveJob>> {
        let order = self.ordered();
        let waiting: Vec<Arc<LiveJob>> = {
            let live = self.live.read();
            order.iter().filter_map(|id| live.get(id).cloned()).collect()
        };
        waiting.into_iter().filter(|job| keep(job)).collect()
    }

    /// Numbers a new submission.
    pub fn next_seq(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::SeqCst)
    }

    /// Numbers submissions from after `max` on (at start, after the store's).
    pub fn start_seq_after(&self, max: u64) {
        self.seq.store(max + 1, Ordering::SeqCst);
    }
}
