//! The job queue and its fairness: queued jobs wait per scheduling key (an
//! account, or a deployment), and workers take the next runnable job
//! round-robin across keys, skipping a key whose running jobs are at its
//! tier's limit. One key's flood therefore delays another key's jobs by at
//! most one job per other waiting key, never by the flood's length.
//!
//! A key may also be held for a while ([`FairQueue::put_back`]): where
//! hosts share the store, a job whose key already runs as many jobs as it
//! may on all hosts goes back to its key's front, and the key waits before
//! it is tried again while other keys' jobs go on.
//!
//! It also owns the per-key limits ([`OwnerLimits`]) and how they are looked
//! up ([`TenantLimits`]): tiers from the configuration, resolved per key.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

/// What one scheduling key may have at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct OwnerLimits {
    /// Jobs running at once; more wait in the queue (never refused). 0
    /// holds the key's jobs (a deployment that is not ready).
    pub max_running: usize,
    /// Jobs waiting in the queue; more are refused with 429 `queue_full`.
    pub max_queued: usize,
}

/// Resolves the limits of a scheduling key (an owner, or `deployment/ID`).
/// The service asks it when a job is queued and each time a worker looks
/// for work, so it must be cheap (a map lookup).
pub trait TenantLimits: Send + Sync {
    fn limits(&self, key: &str) -> OwnerLimits;
}

/// Any `Fn(&str) -> OwnerLimits` is a lookup.
impl<F: Fn(&str) -> OwnerLimits + Send + Sync> TenantLimits for F {
    fn limits(&self, key: &str) -> OwnerLimits {
        self(key)
    }
}

/// Named tiers (config `[tiers.NAME]`) and the limits of a key without one.
#[derive(Debug, Clone, Default)]
pub struct Tiers {
    pub tiers: HashMap<String, OwnerLimits>,
    pub default: Option<OwnerLimits>,
}

impl Tiers {
    /// The limits of tier `name`; an unknown or absent tier gets `fallback`
    /// (the default tier when configured, else the global limits).
    pub fn resolve(&self, name: Option<&str>, fallback: OwnerLimits) -> OwnerLimits {
        self.configured(name).unwrap_or(fallback)
    }

    /// The limits the configuration gives tier `name` (or the default
    /// tier); `None` when neither is configured.
    pub fn configured(&self, name: Option<&str>) -> Option<OwnerLimits> {
        name.and_then(|n| self.tiers.get(n)).copied().or(self.default)
    }

    /// The tiers `config` names (`[tiers.NAME]`, `default_tier`); a tier
    /// runs at least one job. An unknown `default_tier` is refused at start
    /// (`Config::check_tiers`); here it means no default.
    pub fn from_config(config: &crate::config::Config) -> Tiers {
        let limits = |t: &crate::config::TierConfig| OwnerLimits { max_running: t.max_running.max(1), max_queued: t.max_queued };
        Tiers {
            tiers: config.tiers.iter().map(|(name, t)| (name.clone(), limits(t))).collect(),
            default: config.default_tier.as_ref().and_then(|d| config.tiers.get(d)).map(limits),
        }
    }
}

/// One key's waiting jobs and how many of its jobs run now.
#[derive(Default)]
struct KeyQueue {
    jobs: VecDeque<String>,
    running: usize,
    /// No job of the key is taken before this (see [`FairQueue::put_back`]).
    held_until: Option<Instant>,
}

/// The queue: job ids per scheduling key, and the round-robin order of the
/// keys that have jobs waiting (the front one is served next).
#[derive(Default)]
pub struct FairQueue {
    keys: HashMap<String, KeyQueue>,
    rotation: VecDeque<String>,
    /// The key of every queued job.
    key_of: HashMap<String, String>,
    /// The owner of every queued job (a key's jobs may have several: a
    /// public demo deployment's callers and its owning account).
    owner_of: HashMap<String, Arc<str>>,
}

/// Why a job was not queued.
#[derive(Debug, PartialEq, Eq)]
pub struct KeyQueueFull;

impl FairQueue {
    /// Queues `id` of `owner` under `key` (ahead of the key's other jobs
    /// with `front`); refuses it when `key` already has `max_queued` jobs
    /// waiting. Returns the job's position ([`FairQueue::position`]).
    pub fn push(&mut self, key: &str, owner: &str, id: String, front: bool, max_queued: usize) -> Result<usize, KeyQueueFull> {
        let entry = self.keys.entry(key.to_string()).or_default();
        if entry.jobs.len() >= max_queued {
            if entry.jobs.is_empty() && entry.running == 0 {
                self.keys.remove(key);
            }
            return Err(KeyQueueFull);
        }
        let was_waiting = !entry.jobs.is_empty();
        if front {
            entry.jobs.push_front(id.clone());
        } else {
            entry.jobs.push_back(id.clone());
        }
        // `front` reorders the key's own jobs only: moving the key itself
        // ahead would let one account's `front` flood starve the others.
        if !was_waiting {
            self.rotation.push_back(key.to_string());
        }
        self.key_of.insert(id.clone(), key.to_string());
        self.owner_of.insert(id.clone(), Arc::from(owner));
        Ok(self.position(&id).unwrap_or(1))
    }

    /// Takes the next job whose key is below its running limit and not held
    /// at `now`, round-robin across keys; the job counts as running for its
    /// key until [`done`].
    ///
    /// [`done`]: FairQueue::done
    pub fn pop(&mut self, limits: &dyn TenantLimits, now: Instant) -> Option<(String, String)> {
        for turn in 0..self.rotation.len() {
            let key = &self.rotation[turn];
            let Some(entry) = self.keys.get_mut(key) else { continue };
            if entry.held_until.is_some_and(|until| until > now) || entry.running >= limits.limits(key).max_running {
                continue;
            }
            entry.held_until = None;
            let Some(id) = entry.jobs.pop_front() else { continue };
            entry.running += 1;
            let Some(key) = self.rotation.remove(turn) else { continue };
            if !entry.jobs.is_empty() {
                self.rotation.push_back(key.clone());
            }
            self.key_of.remove(&id);
            self.owner_of.remove(&id);
            return Some((id, key));
        }
        None
    }

    /// Puts a job taken by [`FairQueue::pop`] back at its key's front,
    /// unstarted, and holds the key until `until`: no job of it is taken
    /// before then, other keys' jobs are. The job still counts as running
    /// for its key until [`FairQueue::done`].
    pub fn put_back(&mut self, key: &str, owner: &str, id: String, until: Instant) {
        let _ = self.push(key, owner, id, true, usize::MAX);
        if let Some(entry) = self.keys.get_mut(key) {
            entry.held_until = Some(until);
        }
    }

    /// Whether [`FairQueue::pop`] would take a job now: a key with jobs
    /// waiting, not held, and running fewer than its limit.
    pub fn startable(&self, limits: &dyn TenantLimits, now: Instant) -> bool {
        self.rotation
            .iter()
            .filter_map(|key| Some((key, self.keys.get(key)?)))
            .any(|(key, entry)| !entry.jobs.is_empty() && entry.held_until.is_none_or(|until| until <= now) && entry.running < limits.limits(key).max_running)
    }

    /// The earliest time after `now` (the `now` of the [`FairQueue::pop`]
    /// that found nothing) that a held key with waiting jobs may be tried again (a worker that found nothing to take sleeps until
    /// then at most).
    pub fn next_hold(&self, now: Instant) -> Option<Instant> {
        self.rotation.iter().filter_map(|k| self.keys.get(k)?.held_until).filter(|until| *until > now).min()
    }

    /// A job taken by [`FairQueue::pop`] under `key` stopped running.
    pub fn done(&mut self, key: &str) {
        if let Some(entry) = self.keys.get_mut(key) {
            entry.running = entry.running.saturating_sub(1);
            if entry.running == 0 && entry.jobs.is_empty() {
                self.keys.remove(key);
            }
        }
    }

    /// Takes a queued job out (canceled, expired, not written); whether it
    /// was queued.
    pub fn remove(&mut self, id: &str) -> bool {
        let Some(key) = self.key_of.remove(id) else { return false };
        self.owner_of.remove(id);
        if let Some(entry) = self.keys.get_mut(&key) {
            entry.jobs.retain(|j| j != id);
            if entry.jobs.is_empty() {
                self.rotation.retain(|k| *k != key);
                if entry.running == 0 {
                    self.keys.remove(&key);
                }
            }
        }
        true
    }

    /// Queued jobs of all keys.
    pub fn len(&self) -> usize {
        self.key_of.len()
    }

    pub fn is_empty(&self) -> bool {
        self.key_of.is_empty()
    }

    /// The ids of `key`'s waiting jobs.
    pub fn waiting_of(&self, key: &str) -> Vec<String> {
        self.keys.get(key).map_or_else(Vec::new, |entry| entry.jobs.iter().cloned().collect())
    }

    /// Whether a job of `key` waits.
    pub fn has_waiting(&self, key: &str) -> bool {
        self.keys.get(key).is_some_and(|e| !e.jobs.is_empty())
    }

    /// The keys with jobs waiting, in their round-robin order.
    pub fn waiting_keys(&self) -> Vec<String> {
        self.rotation.iter().cloned().collect()
    }

    /// Jobs of `key` running now.
    pub fn running_of(&self, key: &str) -> usize {
        self.keys.get(key).map_or(0, |e| e.running)
    }

    /// 1-based position of a queued job among its owner's own queued jobs,
    /// in the round-robin dispatch order (running limits aside): how many
    /// of the owner's jobs start before it, plus one. Other owners' jobs
    /// interleave with them but are not counted: counting them would tell
    /// an account how much other accounts have queued. (With one owner, as
    /// on a self-hosted server, this is the place in the whole queue.)
    pub fn position(&self, id: &str) -> Option<usize> {
        let key = self.key_of.get(id)?;
        let owner = self.owner_of.get(id)?;
        let depth = self.keys.get(key)?.jobs.iter().position(|j| j == id)?;
        let mut ahead = 0;
        let mut before_own = true;
        for k in &self.rotation {
            let Some(entry) = self.keys.get(k) else { continue };
            if k == key {
                before_own = false;
            }
            // A key served before this job's own in each round also goes
            // first in the job's round.
            let first = if before_own { depth + 1 } else { depth };
            ahead += entry.jobs.iter().take(first).filter(|j| self.owner_of.get(*j).is_some_and(|o| o == owner)).count();
        }
        Some(ahead + 1)
    }

    /// Every queued job in dispatch order (round-robin across keys).
    pub fn ordered(&self) -> Vec<String> {
        let mut out = Vec::with_capacity(self.len());
        let queues: Vec<&VecDeque<String>> = self.rotation.iter().filter_map(|k| self.keys.get(k).map(|e| &e.jobs)).collect();
        let deepest = queues.iter().map(|q| q.len()).max().unwrap_or(0);
        for depth in 0..deepest {
            out.extend(queues.iter().filter_map(|q| q.get(depth)).cloned());
        }
        out
    }
}

pub use crate::store::sched_key;

/// The limits lookup a service starts with: every key gets `limits`.
pub fn uniform(limits: OwnerLimits) -> Arc<dyn TenantLimits> {
    Arc::new(move |_: &str| limits)
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPEN: OwnerLimits = OwnerLimits { max_running: 100, max_queued: 100 };

    #[test]
    fn tiers_and_per_account_shares_come_from_the_config() {
        let config: crate::config::Config =
            toml::from_str("default_tier = \"free\"\n[tiers.free]\nmax_running = 1\nmax_queued = 20\n[tiers.pro]\nmax_running = 0\nmax_queued = 5\n").unwrap();
        let tiers = Tiers::from_config(&config);
        assert_eq!(tiers.default, Some(OwnerLimits { max_running: 1, max_queued: 20 }));
        assert_eq!(tiers.tiers["pro"].max_running, 1, "a tier runs at least one job");
        let config = crate::config::Config { max_queued_jobs_per_account: Some(40), max_event_streams_per_account: Some(7), ..config };
        let options = super::super::ServiceOptions::from_config(&config);
        assert_eq!((options.max_queued_per_account, options.max_streams_per_account), (40, 7));
        assert_eq!(options.tiers.default, tiers.default);
    }

    fn pop_all(q: &mut FairQueue, limits: &dyn TenantLimits) -> Vec<String> {
        std::iter::from_fn(|| q.pop(limits, Instant::now()).map(|(id, _)| id)).collect()
    }

    #[test]
    fn a_flood_does_not_starve_a_second_key() {
        let mut q = FairQueue::default();
        for i in 0..50 {
            q.push("a", "a", format!("a{i}"), false, 100).unwrap();
        }
        let positions: Vec<usize> = (0..3).map(|i| q.push("b", "b", format!("b{i}"), false, 100).unwrap()).collect();
        // b's jobs alternate with a's (2nd, 4th and 6th to run); each owner
        // sees its place among its own jobs only.
        assert_eq!(positions, [1, 2, 3]);
        assert_eq!(q.position("a0"), Some(1));
        assert_eq!(q.position("a3"), Some(4));
        let order = q.ordered();
        let dispatched = pop_all(&mut q, &|_: &str| OPEN);
        assert_eq!(order, dispatched, "positions and listing follow the dispatch order");
        assert_eq!(&dispatched[..7], ["a0", "b0", "a1", "b1", "a2", "b2", "a3"]);
        assert_eq!(dispatched.len(), 53);
    }

    #[test]
    fn running_limits_hold_a_key_back_and_done_releases_it() {
        let mut q = FairQueue::default();
        let limits = |k: &str| OwnerLimits { max_running: if k == "a" { 2 } else { 5 }, max_queued: 10 };
        for i in 0..4 {
            q.push("a", "a", format!("a{i}"), false, 10).unwrap();
        }
        q.push("b", "b", "b0".into(), false, 10).unwrap();
        assert_eq!(pop_all(&mut q, &limits), ["a0", "b0", "a1"], "a stops at 2 running");
        assert_eq!(q.running_of("a"), 2);
        assert!(q.pop(&limits, Instant::now()).is_none());
        q.done("a");
        assert_eq!(q.pop(&limits, Instant::now()).map(|(id, _)| id).as_deref(), Some("a2"));
        assert!(q.pop(&limits, Instant::now()).is_none());
        assert_eq!(q.len(), 1);
    }

    #[test]
    fn queued_limit_per_key_and_removal() {
        let mut q = FairQueue::default();
        q.push("a", "a", "a0".into(), false, 2).unwrap();
        q.push("a", "a", "a1".into(), false, 2).unwrap();
        assert_eq!(q.push("a", "a", "a2".into(), false, 2), Err(KeyQueueFull));
        assert_eq!(q.push("b", "b", "b0".into(), false, 2), Ok(1), "b's first job, whatever a has queued");
        assert!(q.remove("a0") && !q.remove("a0"));
        assert_eq!(q.position("a1"), Some(1));
        assert!(q.remove("a1"));
        assert_eq!(q.ordered(), ["b0"]);
        q.push("a", "a", "a4".into(), false, 2).unwrap();
        assert_eq!(q.push("a", "a", "a3".into(), true, 2), Ok(1), "front goes ahead of its own key's jobs, not of other keys'");
        assert_eq!(pop_all(&mut q, &|_: &str| OPEN), ["b0", "a3", "a4"]);
        assert!(q.is_empty());
    }

    #[test]
    fn a_position_counts_only_the_owners_jobs_that_start_before_it() {
        let mut q = FairQueue::default();
        // A deployment's key holds its owner's jobs and its demo callers'.
        q.push("x", "x", "x0".into(), false, 10).unwrap();
        q.push("x", "x", "x1".into(), false, 10).unwrap();
        q.push("deployment/d", "demo/d", "d0".into(), false, 10).unwrap();
        q.push("deployment/d", "x", "d1".into(), false, 10).unwrap();
        q.push("deployment/d", "demo/d", "d2".into(), false, 10).unwrap();
        // Dispatch order: x0 d0 x1 d1 d2.
        assert_eq!(q.ordered(), ["x0", "d0", "x1", "d1", "d2"]);
        let positions: Vec<Option<usize>> = ["x0", "x1", "d1", "d0", "d2"].iter().map(|id| q.position(id)).collect();
        assert_eq!(positions, [Some(1), Some(2), Some(3), Some(1), Some(2)]);
    }

    #[test]
    fn tiers_resolve_by_name_then_default_then_fallback() {
        let gold = OwnerLimits { max_running: 8, max_queued: 800 };
        let fallback = OwnerLimits { max_running: 2, max_queued: 20 };
        let mut tiers = Tiers { tiers: HashMap::from([("gold".to_string(), gold)]), default: None };
        assert_eq!(tiers.resolve(Some("gold"), fallback), gold);
        assert_eq!(tiers.resolve(Some("nope"), fallback), fallback);
        tiers.default = Some(OwnerLimits { max_running: 1, max_queued: 5 });
        assert_eq!(tiers.resolve(None, fallback).max_running, 1);
        assert_eq!(tiers.configured(Some("nope")), tiers.default, "the default tier is configured");
        tiers.default = None;
        assert_eq!(tiers.configured(Some("nope")), None, "the global limits are not a tier's");
    }

    #[test]
    fn a_job_put_back_waits_at_its_keys_front_while_other_keys_go_on() {
        let mut q = FairQueue::default();
        for i in 0..2 {
            q.push("a", "a", format!("a{i}"), false, 10).unwrap();
            q.push("b", "b", format!("b{i}"), false, 10).unwrap();
        }
        let (first, key) = q.pop(&|_: &str| OPEN, Instant::now()).unwrap();
        assert_eq!((first.as_str(), key.as_str()), ("a0", "a"));
        let until = Instant::now() + std::time::Duration::from_millis(150);
        q.put_back("a", "a", first, until);
        q.done("a");
        assert_eq!(q.next_hold(Instant::now()), Some(until));
        assert_eq!(q.position("a0"), Some(1), "back at its key's front");
        assert!(q.startable(&|_: &str| OPEN, Instant::now()), "b's jobs may start");
        assert_eq!(pop_all(&mut q, &|_: &str| OPEN), ["b0", "b1"], "a held key is skipped, the others are served");
        assert!(!q.startable(&|_: &str| OPEN, Instant::now()), "only a held key's jobs wait");
        std::thread::sleep(until.saturating_duration_since(Instant::now()));
        assert_eq!(pop_all(&mut q, &|_: &str| OPEN), ["a0", "a1"], "after the hold, in its order");
        assert_eq!(q.next_hold(Instant::now()), None);
        assert!(q.is_empty());
    }

    /// A key at its running limit has nothing to start, like a held one.
    #[test]
    fn a_key_at_its_running_limit_has_nothing_startable() {
        let mut q = FairQueue::default();
        let one = |_: &str| OwnerLimits { max_running: 1, max_queued: 10 };
        q.push("a", "a", "a0".into(), false, 10).unwrap();
        q.push("a", "a", "a1".into(), false, 10).unwrap();
        assert!(q.startable(&one, Instant::now()));
        assert_eq!(q.pop(&one, Instant::now()).map(|(id, _)| id).as_deref(), Some("a0"));
        assert!(!q.startable(&one, Instant::now()), "a1 waits for a0");
        q.done("a");
        assert!(q.startable(&one, Instant::now()));
    }
}
