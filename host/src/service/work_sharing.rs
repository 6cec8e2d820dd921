//! Work sharing between hosts sharing the store: a host with idle workers
//! and nothing queued takes jobs queued on busy hosts
//! ([`HostLeases::take_queued`]), and a host whose queued jobs another
//! took lets them go — out of its queue and live set, its streams on them
//! following them on the host that runs them now.
//!
//! A host looks for work when one of its workers goes idle with nothing
//! queued here, when another host's queue changes ([`Topic::Queues`]) and
//! at every heartbeat; at most once per [`LOOK_EVERY`]. The store decides
//! who gets a job (row locks, the holder it names): a host whose job was
//! taken while it started it is refused that start, so a job never runs
//! on two hosts.
//!
//! [`Topic::Queues`]: crate::store::cluster::Topic::Queues

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

use super::cluster::ClusterBackends;
use super::{LiveJob, Service};
use crate::store::cluster::{QUEUED_BEFORE_TAKEN, Taken};
use crate::store::{JobRecord, JobStatus};

/// The shortest time between two looks for work (each one transaction).
pub(super) const LOOK_EVERY: Duration = Duration::from_millis(50);

/// This host's workers as work sharing sees them.
#[derive(Default)]
pub(super) struct WorkSharing {
    /// Workers between taking a job from the queue and being done with it.
    busy: AtomicUsize,
    /// Woken when a worker goes idle with nothing queued here.
    idle: Notify,
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

    /// Resolves when a worker went idle (see [`WorkSharing::done`]).
    pub(super) async fn went_idle(&self) {
        self.idle.notified().await;
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

    /// Takes jobs queued on busy hosts for this host's idle workers.
    /// Returns those taken whose recovery failed (this host's now: the
    /// caller tries again, as with jobs taken over), and when to look
    /// again for a job that had not waited long enough on its host.
    pub(super) async fn take_queued_work(&self, cluster: &ClusterBackends) -> (Vec<JobRecord>, Option<Duration>) {
        let idle = self.idle_workers();
        if idle == 0 {
            return (Vec::new(), None);
        }
        let Taken { jobs, next_in } = match cluster.leases.take_queued(idle, &self.runnable_here(), QUEUED_BEFORE_TAKEN).await {
            Ok(taken) => taken,
            Err(e) => {
                tracing::warn!(error = %e, "cannot look for jobs queued on other hosts");
                return (Vec::new(), None);
            }
        };
        if jobs.is_empty() {
            return (Vec::new(), next_in);
        }
        tracing::debug!(jobs = jobs.len(), "took jobs queued on busy hosts");
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
