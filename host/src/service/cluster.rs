//! Hosts sharing one store as one service (see `store::cluster`): this
//! host's lease, registered before it takes any job and renewed every
//! `heartbeat_s`; the jobs of hosts whose lease lapsed, taken over and
//! recovered as a restart recovers its own (`retention::recover`); and
//! cancels that other hosts ask for.
//!
//! A host that cannot renew its lease within `lease_s` (the database
//! unreachable, the process stalled) stops: from then on another host may
//! take its jobs over, so it must run none of them. Its workers leave their
//! jobs as a shutdown does, its late writes are refused by the store, and
//! [`Service::lease_lost`] tells the binary to exit (a supervisor starts it
//! again as a new host).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::broadcast::error::RecvError;

use super::{Service, ServiceError};
use crate::store::cluster::{HostLeases, Notices, Topic};
use crate::store::{JobRecord, StoreError};

/// Jobs taken over in one look at most (the rest at the next heartbeat).
const ADOPT_BATCH: usize = 1000;
/// How long a cancel of a job another host holds waits for that host to
/// act before it answers with the job as it stands.
const REMOTE_CANCEL_WAIT: Duration = Duration::from_secs(3);

/// What a host sharing a store coordinates through.
#[derive(Clone)]
pub struct ClusterBackends {
    pub leases: Arc<dyn HostLeases>,
    pub notices: Arc<dyn Notices>,
}

impl Service {
    /// Registers this host's lease (before it recovers or takes any job).
    pub(super) async fn join_cluster(&self) -> Result<(), ServiceError> {
        if let Some(cluster) = &self.cluster {
            cluster.leases.register(self.opts.lease).await?;
            tracing::info!(holder = cluster.leases.holder(), lease_s = self.opts.lease.as_secs(), "joined the hosts sharing the store");
        }
        Ok(())
    }

    /// The unfinished jobs this host recovers at start: every one in an
    /// embedded store; where hosts share the store, those no live host
    /// holds (taken over now).
    pub(super) async fn jobs_to_recover(&self) -> Result<Vec<JobRecord>, ServiceError> {
        let Some(cluster) = &self.cluster else { return Ok(self.meta.unfinished_jobs().await?) };
        let mut jobs = Vec::new();
        loop {
            let batch = cluster.leases.adopt(ADOPT_BATCH).await?;
            let more = batch.len() == ADOPT_BATCH;
            jobs.extend(batch);
            if !more {
                return Ok(jobs);
            }
        }
    }

    /// Renews the lease, takes over lapsed hosts' jobs and serves cancel
    /// requests, until the service stops or the lease is lost.
    pub(super) async fn cluster_loop(self: Arc<Self>) {
        let Some(cluster) = self.cluster.clone() else { return };
        let mut control = cluster.notices.subscribe(Topic::Control);
        let mut tick = tokio::time::interval(self.opts.heartbeat);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut renewed = Instant::now();
        loop {
            tokio::select! {
                _ = self.shutdown.cancelled() => return,
                _ = tick.tick() => {}
                heard = control.recv() => {
                    // A cancel request for a job this host holds (or
                    // missed notices: look anyway).
                    if matches!(&heard, Ok(to) if &**to == cluster.leases.holder()) || matches!(heard, Err(RecvError::Lagged(_))) {
                        self.serve_cancel_requests(cluster.leases.as_ref()).await;
                    }
                    continue;
                }
            }
            let asked = Instant::now();
            match tokio::time::timeout(self.opts.heartbeat, cluster.leases.renew(self.opts.lease)).await {
                Ok(Ok(())) => renewed = asked,
                Ok(Err(StoreError::Fenced(why))) => return self.lose_lease(&why),
                Ok(Err(e)) => tracing::warn!(error = %e, "cannot renew this host's lease"),
                Err(_) => tracing::warn!("renewing this host's lease did not finish within a heartbeat"),
            }
            if renewed.elapsed() >= self.opts.lease {
                return self.lose_lease("not renewed within the lease");
            }
            match cluster.leases.adopt(ADOPT_BATCH).await {
                Ok(jobs) if jobs.is_empty() => {}
                Ok(jobs) => {
                    tracing::warn!(jobs = jobs.len(), "took over the jobs of a host whose lease lapsed");
                    if let Err(e) = self.recover_jobs(jobs).await {
                        tracing::error!(error = %e, "cannot recover the jobs taken over");
                    }
                }
                Err(e) => tracing::warn!(error = %e, "cannot look for lapsed hosts' jobs"),
            }
            self.serve_cancel_requests(cluster.leases.as_ref()).await;
        }
    }

    /// Stops this host: its lease is gone, so another host may run its jobs.
    fn lose_lease(&self, why: &str) {
        tracing::error!(why, "this host lost its lease on its jobs: it stops (start it again to rejoin)");
        self.lease_lost.cancel();
        self.shutdown.cancel();
    }

    /// Resolves when this host lost its lease and stopped (never on an
    /// embedded store): a binary exits then.
    pub async fn lease_lost(&self) {
        self.lease_lost.cancelled().await;
    }

    /// Whether a retention sweep may collect blobs: always on an embedded
    /// store; where hosts share one, only while this host is the only one
    /// registered. Another host's running job may have written a blob no
    /// record names yet, which this host cannot see; no host registers
    /// while a sweep holds its lease, so the answer holds for the pass.
    /// (With several hosts, unreferenced blobs stay until one runs alone.)
    pub(super) async fn may_collect_blobs(&self) -> Result<bool, ServiceError> {
        let Some(cluster) = &self.cluster else { return Ok(true) };
        let alone = cluster.leases.alone().await?;
        if !alone {
            tracing::debug!("other hosts share the store: blobs are not collected this pass");
        }
        Ok(alone)
    }

    /// Cancels the jobs this host holds that another host asked to cancel.
    async fn serve_cancel_requests(&self, leases: &dyn HostLeases) {
        let ids = match leases.cancel_requests().await {
            Ok(ids) => ids,
            Err(e) => return tracing::warn!(error = %e, "cannot read cancel requests"),
        };
        for id in ids {
            let Some(live) = self.live_job(&id) else { continue };
            let owner = live.owner.clone();
            if let Err(e) = self.cancel(&owner, &id).await {
                tracing::error!(job_id = %id, error = %e, "cannot cancel a job as another host asked");
            }
        }
    }

    /// Cancels a job another host holds: asks that host (durably) and
    /// waits a little for it to act; the job as it then stands.
    pub(super) async fn cancel_elsewhere(&self, owner: &str, id: &str) -> Result<(JobRecord, Option<usize>), ServiceError> {
        let (before, position) = self.get(owner, id).await?;
        let Some(cluster) = &self.cluster else { return Ok((before, position)) };
        if before.status.is_terminal() || !cluster.leases.request_cancel(&before.id).await? {
            return self.get(owner, id).await;
        }
        let deadline = Instant::now() + REMOTE_CANCEL_WAIT;
        loop {
            let now = self.meta.get_job(&before.id).await?.ok_or(ServiceError::NotFound)?;
            if now.status != before.status || Instant::now() >= deadline {
                tracing::debug!(job_id = %now.id, status = ?now.status, "cancel asked of the host holding the job");
                return Ok((now, None));
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
}
