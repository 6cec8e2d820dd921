//! The queue: every job that has not finished (the live set, by store
//! key, always this process's) and, behind the [`Waiting`] trait, the jobs
//! waiting to run and the server-wide count of queued jobs. The embedded
//! [`LocalWaiting`] keeps them in memory (a restart rebuilds them from the
//! store, see `retention`). Submissions are numbered by `numbers`.
//!
//! The rules of who may queue how much live in `intake` (bounds) and
//! `fair` (per-key limits and round-robin order); this owns the state they
//! act on and keeps the live set and the waiting queue in step.

mod local;

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::RwLock;

pub use local::LocalWaiting;

use super::LiveJob;
use super::fair::{KeyQueueFull, TenantLimits};

/// Where jobs wait to run: the server's queue places, each scheduling
/// key's queue (served round-robin within each key's limits, see `fair`),
/// and the workers' wake-ups.
///
/// Every call but [`Waiting::next`] answers without waiting (they run under
/// a job's write turn on the submission path). Where hosts share the store,
/// each host queues the jobs it holds here; an idle host takes jobs queued
/// on busy ones through the store, and the host they left withdraws them
/// (see `work_sharing`).
#[async_trait::async_trait]
pub trait Waiting: Send + Sync {
    /// Takes one of the server's `max` queue places; `false` when all are
    /// taken. Given back by [`Waiting::release`], or by the job leaving the
    /// queue ([`Waiting::withdraw`], [`Waiting::next`]).
    fn reserve(&self, max: usize) -> bool;
    /// Gives back a place taken by [`Waiting::reserve`] for a job not pushed.
    fn release(&self);
    /// The server's queue places taken now.
    fn queued(&self) -> usize;
    /// Whether [`Waiting::next`] would give a job now, within `limits`
    /// (jobs of held keys, or of keys at their running limit, wait).
    fn startable(&self, limits: &dyn TenantLimits) -> bool;
    /// Queues a job whose place is reserved under scheduling key `key`
    /// (at most `max_queued` of the key's) and wakes a worker; its position
    /// among its owner's queued jobs.
    fn push(&self, key: &str, owner: &str, id: String, front: bool, max_queued: usize) -> Result<usize, KeyQueueFull>;
    /// A job recovered (at start, or taken over from another host): takes
    /// a place, queues it whatever its key's limit and wakes a worker.
    fn requeue(&self, key: &str, owner: &str, id: String);
    /// A job [`Waiting::next`] gave that could not start yet (its key runs
    /// as many jobs as it may on all hosts): back at its key's front, the
    /// key held until `until` (takes a place, as [`Waiting::requeue`]).
    fn put_back(&self, key: &str, owner: &str, id: String, until: std::time::Instant);
    /// Takes a job out of the queue (canceled, expired, or its submission
    /// not written); whether it was waiting.
    fn withdraw(&self, id: &str) -> bool;
    /// The next job to run, round-robin across scheduling keys within each
    /// key's `limits` (held keys skipped), with its key: waits until there
    /// is one.
    async fn next(&self, limits: &dyn TenantLimits) -> (String, String);
    /// A job of `key` stopped running: the key may run another (this
    /// worker looks first, any other idle one too).
    fn done(&self, key: &str);
    /// Some key's limits changed: every idle worker looks again.
    fn limits_changed(&self);
    /// The ids of the jobs of scheduling key `key` waiting here.
    fn waiting_of(&self, key: &str) -> Vec<String>;
    /// Whether a job of scheduling key `key` waits here.
    fn has_waiting(&self, key: &str) -> bool;
    /// The scheduling keys with jobs waiting here.
    fn waiting_keys(&self) -> Vec<String>;
    /// 1-based position of a queued job among its owner's queued jobs.
    fn position(&self, id: &str) -> Option<usize>;
    /// Queued job ids in the order they would run.
    fn ordered(&self) -> Vec<String>;
}

/// The jobs not yet finished, and those of them waiting to run.
pub(super) struct JobQueue {
    live: RwLock<LiveSet>,
    waiting: Arc<dyn Waiting>,
}

/// The live jobs by store key, and how many of them each account is
/// billed for (`LiveJob::billed`), kept in step under one lock.
#[derive(Default)]
struct LiveSet {
    jobs: HashMap<String, Arc<LiveJob>>,
    billed: HashMap<Arc<str>, usize>,
}

impl LiveSet {
    fn insert(&mut self, id: String, job: Arc<LiveJob>) {
        if let Some(account) = &job.billed {
            *self.billed.entry(account.clone()).or_default() += 1;
        }
        if let Some(replaced) = self.jobs.insert(id, job) {
            self.unbill(&replaced);
        }
    }

    fn remove(&mut self, id: &str) -> Option<Arc<LiveJob>> {
        let job = self.jobs.remove(id)?;
        self.unbill(&job);
        Some(job)
    }

    fn unbill(&mut self, job: &LiveJob) {
        if let Some(account) = &job.billed
            && let Some(n) = self.billed.get_mut(account)
        {
            *n -= 1;
            if *n == 0 {
                self.billed.remove(account);
            }
        }
    }
}

/// Why a job did not join the live set.
#[derive(Debug, PartialEq, Eq)]
pub enum NotJoined {
    /// Another live job has its store key.
    Taken,
    /// Its account's balance does not cover it beside the account's other
    /// live jobs.
    NoFunds,
}

impl JobQueue {
    pub fn new(waiting: Arc<dyn Waiting>) -> JobQueue {
        JobQueue { live: RwLock::default(), waiting }
    }

    /// The live job stored under `id`.
    pub fn live(&self, id: &str) -> Option<Arc<LiveJob>> {
        self.live.read().jobs.get(id).cloned()
    }

    /// Every live job (a copy of the set: no lock is held afterwards).
    pub fn live_jobs(&self) -> Vec<Arc<LiveJob>> {
        self.live.read().jobs.values().cloned().collect()
    }

    /// Live jobs of `owner` (ComfyUI's `queue_remaining`).
    pub fn remaining_of(&self, owner: &str) -> usize {
        self.live.read().jobs.values().filter(|j| &*j.owner == owner).count()
    }

    /// Live jobs billed to `account`.
    pub fn billed_to(&self, account: &str) -> usize {
        self.live.read().billed.get(account).copied().unwrap_or(0)
    }

    /// Whether no job is live.
    pub fn is_idle(&self) -> bool {
        self.live.read().jobs.is_empty()
    }

    /// The waiting queue.
    pub fn waiting(&self) -> &dyn Waiting {
        self.waiting.as_ref()
    }

    /// Adds a new job to the live set. Refused, with nothing added, when
    /// its key is taken, or when it is billed to an account and `admits`
    /// refuses the number of live jobs billed to that account already:
    /// counted and joined under one lock, so concurrent submissions never
    /// together pass a balance that covers only some of them.
    pub fn join(&self, id: &str, job: Arc<LiveJob>, admits: impl FnOnce(&str, usize) -> bool) -> Result<(), NotJoined> {
        let mut live = self.live.write();
        if live.jobs.contains_key(id) {
            return Err(NotJoined::Taken);
        }
        if let Some(account) = &job.billed
            && !admits(account, live.billed.get(account).copied().unwrap_or(0))
        {
            return Err(NotJoined::NoFunds);
        }
        live.insert(id.to_string(), job);
        Ok(())
    }

    /// Removes a job from the live set.
    pub fn leave(&self, id: &str) -> Option<Arc<LiveJob>> {
        self.live.write().remove(id)
    }

    /// Removes `job` from the live set, if it is still the one stored
    /// under `id` (not a newer one under the same key); whether it was.
    pub fn leave_job(&self, id: &str, job: &Arc<LiveJob>) -> bool {
        let mut live = self.live.write();
        if live.jobs.get(id).is_some_and(|current| Arc::ptr_eq(current, job)) {
            live.remove(id);
            return true;
        }
        false
    }

    /// A job recovered (at start, or taken over from another host):
    /// queued whatever its key's limit (and its account's balance: it was
    /// admitted once). In the live set first, so a worker woken by the
    /// queueing finds it.
    pub fn requeue(&self, key: &str, job: Arc<LiveJob>) {
        let (id, owner) = (job.record.lock().id.clone(), job.owner.clone());
        self.live.write().insert(id.clone(), job);
        self.waiting.requeue(key, &owner, id);
    }

    /// Live jobs that `keep` accepts. `keep` runs after the set's lock is
    /// released: it may take a job's record lock (a submission holds that
    /// lock while it joins or leaves the set).
    pub fn live_where(&self, keep: impl Fn(&LiveJob) -> bool) -> Vec<Arc<LiveJob>> {
        self.live_jobs().into_iter().filter(|job| keep(job)).collect()
    }

    /// Waiting jobs, in the order they would run, that `keep` accepts.
    pub fn queued_where(&self, keep: impl Fn(&LiveJob) -> bool) -> Vec<Arc<LiveJob>> {
        let order = self.waiting.ordered();
        let waiting: Vec<Arc<LiveJob>> = {
            let live = self.live.read();
            order.iter().filter_map(|id| live.jobs.get(id).cloned()).collect()
        };
        waiting.into_iter().filter(|job| keep(job)).collect()
    }
}
