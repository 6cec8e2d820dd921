//! Work sharing between hosts sharing the store: a host with idle workers
//! and nothing queued takes jobs queued on busy hosts
//! ([`HostLeases::take_queued`]), and a host whose queued jobs another
//! took lets them go — out of its queue and live set, its streams on them
//! following them on the host that runs them now.
//!
//! Fair turns across hosts: a busy host also takes one job of each key
//! whose jobs wait only on other hosts ([`TakeFor::Turns`]), so that key
//! has a turn in this host's round-robin too. A key flooding one host is
//! then served by every host alongside the keys queued everywhere, as one
//! host would serve them all.
//!
//! A host looks for work when one of its workers goes idle with nothing
//! queued here, when another host's queue changes ([`Topic::Queues`]) and
//! at every heartbeat; at most once per [`LOOK_EVERY`]. A busy host looks
//! for turns at a heartbeat, when another host's queue of an owner with
//! nothing waiting here changes, when a key's last job waiting here starts
//! and when a job of a key not queued here has waited long enough; at most
//! once per [`TURNS_EVERY`]. The store decides who gets a
//! job (row locks, the holder it names): a host whose job was taken while
//! it started it is refused that start, so a job never runs on two hosts.
//!
//! [`Topic::Queues`]: crate::store::cluster::Topic::Queues

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use super::cluster::ClusterBackends;
use super::{LiveJob, Service};
use crate::store::cluster::{QUEUED_BEFORE_TAKEN, TakeFor, Taken};
use crate::store::{JobRecord, JobStatus};

/// The shortest time between two looks for work (each one transaction).
pub(super) const LOOK_EVERY: Duration = Duration::from_millis(50);
/// The shortest time between two looks for turns (each one transaction):
/// a key queued only elsewhere waits at most about this long for its next
/// turn here after its last one started.
pub(super) const TURNS_EVERY: Duration = Duration::from_millis(250);

/// When this host last looked for other hosts' queued jobs, and when it
/// looks next unless woken sooner (a job it saw had not waited long
/// enough, or a look came too soon after the last).
pub(super) struct Looks {
    last: Instant,
    pub(super) next: Option<Instant>,
    /// A look planned after `next` (a look put off to `next` came first).
    later: Option<Instant>,
}

impl Default for Looks {
    fn default() -> Looks {
        Looks { last: Instant::now(), next: None, later: None }
    }
}

/// What a look for other hosts' queued jobs is for now (see [`TakeFor`]).
pub(super) enum Wanted {
    /// Jobs for this many idle workers.
    Idle(usize),
    /// Turns for keys queued elsewhere, besides these keys waiting here.
    Turns(Vec<String>),
}

impl Wanted {
    /// The shortest time between two such looks.
    pub(super) fn every(&self) -> Duration {
        match self {
            Wanted::Idle(_) => LOOK_EVERY,
            Wanted::Turns(_) => TURNS_EVERY,
        }
    }
}

/// This host's workers as work sharing sees them.
#[derive(Default)]
pub(super) struct WorkSharing {
    /// Workers between taking a job from the queue and being done with it.
    busy: AtomicUsize,
    /// Woken when a worker goes idle with nothing queued here.
    idle: Notify,
    /// Woken when a key's last job waiting here started.
    key_left: Notify,
}

impl WorkSharing {
    /// A worker took a job from the queue.
    pub(super) fn took(&self) {
        self.busy.fetch_add(1, Ordering::SeqCst);
    }

    /// A worker is done with its job.
    pub(super) fn done(&self) {
        self.busy.fetch_sub(1, Ordering::SeqCst);
        self.idle.notify_one();
    }

    /// Workers with a job now.
    pub(super) fn busy(&self) -> usize {
        self.busy.load(Ordering::SeqCst)
    }

    /// Resolves when a worker went idle (see [`WorkSharing::done`]).
    pub(super) async fn went_idle(&self) {
        self.idle.notified().await;
    }

    /// A worker started the last job of a key waiting here: a turn for a
    /// key queued elsewhere may be due.
    pub(super) fn key_left(&self) {
        self.key_left.notify_one();
    }

    /// Resolves when a key left the queue here (see [`WorkSharing::key_left`]).
    pub(super) async fn keys_left(&self) {
        self.key_left.notified().await;
    }
}

impl Service {
    /// Workers that would start a job taken now: those not busy, when no
    /// job here could start now (jobs of a key held back by its running
    /// limit leave the workers free for other hosts' work).
    pub(super) fn idle_workers(&self) -> usize {
        let limits = |key: &str| self.limits_for(key);
        if self.shutdown.is_cancelled() || self.queue.waiting().startable(&limits) {
            return 0;
        }
        self.opts.max_running_jobs.saturating_sub(self.sharing.busy.load(Ordering::SeqCst))
    }

    /// What a look for other hosts' queued jobs would take now: jobs for
    /// idle workers, or turns while jobs wait here; `None` when neither.
    fn wanted_work(&self) -> Option<Wanted> {
        let idle = self.idle_workers();
        if idle > 0 {
            return Some(Wanted::Idle(idle));
        }
        let waiting = self.queue.waiting().waiting_keys();
        (!waiting.is_empty() && !self.shutdown.is_cancelled()).then_some(Wanted::Turns(waiting))
    }

    /// Looks for other hosts' queued jobs if this host wants any now
    /// ([`Service::wanted_work`]), at most once per [`Wanted::every`] (a
    /// look sooner is put off till then). Returns the jobs taken whose
    /// recovery failed (see [`Service::take_queued_work`]).
    pub(super) async fn look_for_work(&self, cluster: &ClusterBackends, looks: &mut Looks) -> Vec<JobRecord> {
        let now = Instant::now();
        if looks.next.is_some_and(|at| at <= now) {
            looks.next = looks.later.take();
        }
        let Some(wanted) = self.wanted_work() else { return Vec::new() };
        let due = looks.last + wanted.every();
        if due > now {
            // Put off till `due`; one planned later stays planned.
            if let Some(planned) = looks.next.filter(|at| *at > due) {
                looks.later = Some(looks.later.map_or(planned, |at| at.min(planned)));
            }
            looks.next = Some(looks.next.map_or(due, |at| at.min(due)));
            return Vec::new();
        }
        looks.last = now;
        let (left, next_in) = self.take_queued_work(cluster, wanted).await;
        // (This look saw what the ones planned were for.)
        (looks.next, looks.later) = (next_in.map(|d| Instant::now() + d), None);
        left
    }

    /// Takes jobs queued on busy hosts, as `wanted` says. Returns those
    /// taken whose recovery failed (this host's now: the caller tries
    /// again, as with jobs taken over), and when to look again for a job it
    /// may take that had not waited long enough on its host.
    async fn take_queued_work(&self, cluster: &ClusterBackends, wanted: Wanted) -> (Vec<JobRecord>, Option<Duration>) {
        let want = match &wanted {
            Wanted::Idle(idle) => TakeFor::Idle(*idle),
            // At most a turn per worker each look.
            Wanted::Turns(waiting) => TakeFor::Turns { keys: self.opts.max_running_jobs, queued_here: waiting },
        };
        let Taken { jobs, next_in } = match cluster.leases.take_queued(want, &self.runnable_here(), QUEUED_BEFORE_TAKEN).await {
            Ok(taken) => taken,
            Err(e) => {
                tracing::warn!(error = %e, "cannot look for jobs queued on other hosts");
                return (Vec::new(), None);
            }
        };
        if jobs.is_empty() {
            return (Vec::new(), next_in);
        }
        tracing::debug!(jobs = jobs.len(), turns = matches!(wanted, Wanted::Turns(_)), "took jobs queued on busy hosts");
        let owners: BTreeSet<String> = jobs.iter().map(|j| j.owner.clone()).collect();
        let left = match self.recover_jobs(jobs, &HashMap::new()).await {
            Ok(()) => Vec::new(),
            Err((e, rest)) => {
                tracing::error!(error = %e, jobs = rest.len(), "cannot queue the jobs taken from other hosts yet: trying again at the next heartbeat");
                rest
            }
        };
        for owner in owners {
            self.publish_queue(&owner);
        }
        (left, next_in)
    }

    /// Lets go of the queued jobs other hosts took from this one (told by
    /// a notice; a start of one missed is refused by the store anyway).
    pub(super) async fn let_go_of_taken(&self, cluster: &ClusterBackends) {
        let waiting = self.queue.waiting().ordered();
        if waiting.is_empty() {
            return;
        }
        let taken = match cluster.leases.taken_away(&waiting).await {
            Ok(taken) => taken,
            Err(e) => return tracing::warn!(error = %e, "cannot check which queued jobs other hosts took"),
        };
        for id in taken {
            // Withdrawn here, unless a worker took it meanwhile (its start
            // is refused: it hands the job over then).
            if let Some(live) = self.live_job(&id)
                && live.record.lock().status == JobStatus::Queued
                && self.queue.waiting().withdraw(&id)
            {
                self.hand_over(&live).await;
            }
        }
    }

    /// A job another host holds now: out of the live set (once, whoever
    /// finds it first); its streams here follow it on that host, from its
    /// record as it stands.
    pub(super) async fn hand_over(&self, live: &Arc<LiveJob>) {
        let id = live.record.lock().id.clone();
        if !self.queue.leave_job(&id, live) {
            return;
        }
        let now = match self.meta.get_job(&id).await {
            Ok(now) => now.map(Arc::new),
            Err(e) => {
                tracing::warn!(job_id = %id, error = %e, "cannot read a job another host took");
                None
            }
        };
        tracing::debug!(job_id = %id, "another host took this queued job");
        live.events.moved(now);
        self.publish_queue(&live.owner);
        self.publish_queue_positions();
    }
}
