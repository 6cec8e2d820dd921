//! Hosts sharing one store as one service (see `store::cluster`): this
//! host's lease, registered before it takes any job and renewed every
//! `heartbeat_s`; the jobs of hosts whose lease lapsed, taken over and
//! recovered as a restart recovers its own (`retention::recover`), only
//! those whose components this host has (a host with another plugin set
//! leaves a job to one that can run it on the code it was validated
//! against); and cancels that other hosts ask for.
//!
//! A host that has not renewed its lease for `lease_s` less one heartbeat
//! (the database unreachable, the process stalled) stops before the
//! database's clock lets another host take its jobs: its workers leave
//! their jobs as a shutdown does, its late writes are refused by the store
//! once its registration is ended, and [`Service::lease_lost`] tells the
//! binary to exit (a supervisor starts it again as a new host).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;

use super::deployments::DeploymentState;
use super::work_sharing::Looks;
use super::{Service, ServiceError};
use crate::store::cluster::{HostLeases, Notices, Runnable, SharedNumbers, Topic};
use crate::store::{JobRecord, JobStatus, StoreError};

/// Jobs taken over in one look at most (the rest at the next heartbeat).
const ADOPT_BATCH: usize = 1000;
/// How many leases a job waits for a host with its very components before
/// any host takes it (see `Runnable::wait`).
const TAKEOVER_WAIT_LEASES: u32 = 10;
/// How long a cancel of a job another host holds waits for that host to
/// act before it answers with the job as it stands.
const REMOTE_CANCEL_WAIT: Duration = Duration::from_secs(3);

/// What a host sharing a store coordinates through.
#[derive(Clone)]
pub struct ClusterBackends {
    pub leases: Arc<dyn HostLeases>,
    pub notices: Arc<dyn Notices>,
    pub numbers: Arc<dyn SharedNumbers>,
    pub plugins: Arc<dyn crate::store::cluster::SharedPlugins>,
}

impl Service {
    /// Registers this host's lease (before it recovers or takes any job)
    /// and starts renewing it: its own task, which nothing else this host
    /// does can hold up (recovering thousands of jobs at start included).
    pub(super) async fn join_cluster(&self) -> Result<Option<tokio::task::JoinHandle<()>>, ServiceError> {
        let Some(cluster) = &self.cluster else { return Ok(None) };
        cluster.leases.register(self.opts.lease).await?;
        tracing::info!(holder = cluster.leases.holder(), lease_s = self.opts.lease.as_secs(), "joined the hosts sharing the store");
        let renewal = Renewal {
            leases: cluster.leases.clone(),
            lease: self.opts.lease,
            heartbeat: self.opts.heartbeat,
            shutdown: self.shutdown.clone(),
            lost: self.lease_lost.clone(),
        };
        Ok(Some(tokio::spawn(renewal.run())))
    }

    /// The unfinished jobs this host recovers at start: every one in an
    /// embedded store; where hosts share the store, those no live host
    /// holds (taken over now).
    /// (With those taken to be ended, see `Adopted::ends`.)
    pub(super) async fn jobs_to_recover(&self) -> Result<(Vec<JobRecord>, HashMap<String, JobStatus>), ServiceError> {
        let Some(cluster) = &self.cluster else { return Ok((self.meta.unfinished_jobs().await?, HashMap::new())) };
        let (mut jobs, mut ends) = (Vec::new(), HashMap::new());
        loop {
            let batch = cluster.leases.adopt(ADOPT_BATCH, &self.runnable_here()).await?;
            let more = batch.jobs.len() == ADOPT_BATCH;
            jobs.extend(batch.jobs);
            ends.extend(batch.ends);
            if !more {
                self.left_for_others(batch.left, &mut 0);
                return Ok((jobs, ends));
            }
        }
    }

    /// What this host can run, for the jobs it would take over: each on
    /// the very components it was validated against, for its owner (see
    /// [`Runnable`]).
    pub(super) fn runnable_here(&self) -> Runnable {
        let holdings = self.plugins.holdings();
        // The deployments this host serves now, each with its own plugins.
        let deployments: std::collections::HashMap<String, Arc<crate::plugins::NodeRegistry>> =
            self.deployments.list().into_iter().filter_map(|d| self.deployments.loaded(&d.spec.id).map(|l| (d.spec.id, l.registry.clone()))).collect();
        let mut hashes = holdings.hashes();
        hashes.extend(deployments.values().flat_map(|r| r.component_hashes()));
        hashes.sort_unstable();
        hashes.dedup();
        // Deployments known here and not stopped (a job of one stopped or
        // unknown here would wait in this host's queue for nothing).
        let serving: HashSet<String> =
            self.deployments.list().into_iter().filter(|d| !matches!(d.state, DeploymentState::Stopped | DeploymentState::Failed)).map(|d| d.spec.id).collect();
        let job = move |job: &JobRecord| match (&job.deployment, &job.bundle) {
            // Its bundle pins its components on every host.
            (Some(id), Some(_)) => serving.contains(id),
            (Some(id), None) => deployments.get(id).is_some_and(|r| r.has_components(&job.components)),
            (None, _) => holdings.has(&job.owner, &job.components),
        };
        Runnable { hashes, job: Arc::new(job), wait: self.opts.lease * TAKEOVER_WAIT_LEASES }
    }

    /// Tells the operator, when their number changes, of the jobs no host
    /// holds that wait for a host with their plugins.
    fn left_for_others(&self, left: usize, told: &mut usize) {
        if left != *told && left > 0 {
            tracing::warn!(jobs = left, "unfinished jobs no host holds need plugins this host lacks: they wait for a host that has them");
        }
        *told = left;
    }

    /// Every heartbeat: takes over lapsed hosts' jobs, serves cancel
    /// requests and looks for other hosts' queued jobs to run here (see
    /// `work_sharing`); at once when a cancel request or a job taken from
    /// this host is heard, and when a worker here goes idle, a key's last
    /// job waiting here starts or another host's queue changes.
    pub(super) async fn cluster_loop(self: Arc<Self>) {
        let Some(cluster) = self.cluster.clone() else { return };
        let mut control = cluster.notices.subscribe(Topic::Control);
        let mut queues = cluster.notices.subscribe(Topic::Queues);
        let mut tick = tokio::time::interval(self.opts.heartbeat);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // When this host looked for other hosts' queued jobs, and looks next.
        let mut looks = Looks::default();
        // Jobs taken over whose recovery failed (the store unreachable):
        // this host's now, so tried again here.
        let mut backlog: Vec<JobRecord> = Vec::new();
        // Those of them taken to be ended (see `Adopted::ends`).
        let mut ends: HashMap<String, JobStatus> = HashMap::new();
        // Jobs left for hosts with other plugins, as last told.
        let mut told_left = 0;
        loop {
            let wake = tokio::select! {
                _ = self.shutdown.cancelled() => return,
                _ = tick.tick() => Wake::Heartbeat,
                heard = control.recv() => {
                    // A cancel request for a job this host holds, or jobs
                    // another host took from its queue (or missed
                    // notices: look anyway).
                    if matches!(&heard, Ok(to) if &**to == cluster.leases.holder()) || matches!(heard, Err(RecvError::Lagged(_))) {
                        self.serve_cancel_requests(cluster.leases.as_ref()).await;
                        self.let_go_of_taken(&cluster).await;
                    }
                    Wake::Nothing
                }
                // A worker here went idle, a key left the queue here,
                // another host's queue changed, or a job seen may be taken
                // now. (A busy host learns nothing from a change to the
                // queue of an owner whose key waits here: it has its turns
                // here. A deployment's key is not its callers', so its
                // change may be passed over: the next trigger finds it.)
                () = self.sharing.went_idle() => Wake::Look,
                () = self.sharing.keys_left() => Wake::Look,
                heard = queues.recv() => match heard {
                    Ok(owner) if self.idle_workers() == 0 && self.queue.waiting().has_waiting(&owner) => Wake::Nothing,
                    _ => Wake::Look,
                },
                () = sleep_until(looks.next), if looks.next.is_some() => Wake::Look,
            };
            match wake {
                Wake::Nothing => continue,
                Wake::Look => {
                    backlog.extend(self.look_for_work(&cluster, &mut looks).await);
                    continue;
                }
                Wake::Heartbeat => {}
            }
            match cluster.leases.adopt(ADOPT_BATCH, &self.runnable_here()).await {
                Ok(adopted) => {
                    self.left_for_others(adopted.left, &mut told_left);
                    if !adopted.jobs.is_empty() {
                        tracing::warn!(jobs = adopted.jobs.len(), "took over the jobs of a host whose lease lapsed");
                        backlog.extend(adopted.jobs);
                        ends.extend(adopted.ends);
                    }
                }
                Err(e) => tracing::warn!(error = %e, "cannot look for lapsed hosts' jobs"),
            }
            if !backlog.is_empty() {
                match self.recover_jobs(std::mem::take(&mut backlog), &ends).await {
                    // Those of deployments stopped or unknown here would wait
                    // for nothing: canceled, as at a start.
                    Ok(()) => self.cancel_orphaned_deployment_jobs().await,
                    Err((e, rest)) => {
                        tracing::error!(error = %e, jobs = rest.len(), "cannot recover the jobs taken over yet: trying again at the next heartbeat");
                        backlog = rest;
                    }
                }
            }
            if backlog.is_empty() {
                ends.clear();
            }
            self.serve_cancel_requests(cluster.leases.as_ref()).await;
            // (Notices of jobs taken from here may have been missed.)
            self.let_go_of_taken(&cluster).await;
            backlog.extend(self.look_for_work(&cluster, &mut looks).await);
        }
    }

    /// Resolves when this host lost its lease and stopped (never on an
    /// embedded store): a binary exits then.
    pub async fn lease_lost(&self) {
        self.lease_lost.cancelled().await;
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
    /// waits up to [`REMOTE_CANCEL_WAIT`] for it to act; the job as it then
    /// stands (`queued` or `running` still when its host has not acted: a
    /// host taking it over later cancels it then).
    pub(super) async fn cancel_elsewhere(&self, owner: &str, id: &str) -> Result<(JobRecord, Option<usize>), ServiceError> {
        let (before, position) = self.get(owner, id).await?;
        let Some(cluster) = &self.cluster else { return Ok((before, position)) };
        if before.status.is_terminal() || before.status == JobStatus::Canceling || !cluster.leases.request_cancel(&before.id).await? {
            return self.get(owner, id).await;
        }
        let deadline = Instant::now() + REMOTE_CANCEL_WAIT;
        loop {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let now = self.meta.get_job(&before.id).await?.ok_or(ServiceError::NotFound)?;
            if now.status != before.status || Instant::now() >= deadline {
                tracing::debug!(job_id = %now.id, status = ?now.status, "cancel asked of the host holding the job");
                return Ok((now, None));
            }
        }
    }

    /// Asks the host holding job `id` of `owner` to cancel it, without
    /// waiting for it to act (the bulk cancels of ComfyUI's queue clear,
    /// delete and interrupt).
    pub(super) async fn ask_to_cancel(&self, owner: &str, id: &str) -> Result<(), ServiceError> {
        let Some(cluster) = &self.cluster else { return Ok(()) };
        let (job, _) = self.get(owner, id).await?;
        if !job.status.is_terminal() && job.status != JobStatus::Canceling {
            cluster.leases.request_cancel(&job.id).await?;
        }
        Ok(())
    }
}

/// What woke the cluster loop.
enum Wake {
    /// The heartbeat: all its periodic work.
    Heartbeat,
    /// A reason to look for other hosts' queued jobs.
    Look,
    /// Something handled already, or nothing to do.
    Nothing,
}

/// Resolves at `at` (never when `None`).
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// This host's lease renewal. A renewal that has not succeeded for
/// `lease` less one `heartbeat` (checked at least every heartbeat, each
/// call bounded by one) is a lost lease: the host stops before the store's
/// clock lets another host take its jobs.
struct Renewal {
    leases: Arc<dyn HostLeases>,
    lease: Duration,
    heartbeat: Duration,
    shutdown: CancellationToken,
    lost: CancellationToken,
}

impl Renewal {
    async fn run(self) {
        let mut tick = tokio::time::interval(self.heartbeat);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Registered just before this started.
        let mut renewed = Instant::now();
        loop {
            tokio::select! {
                _ = self.shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            if renewed.elapsed() + self.heartbeat >= self.lease {
                return self.lose("not renewed within the lease");
            }
            let asked = Instant::now();
            match tokio::time::timeout(self.heartbeat, self.leases.renew(self.lease)).await {
                Ok(Ok(())) => renewed = asked,
                Ok(Err(StoreError::Fenced(why))) => return self.lose(&why),
                Ok(Err(e)) => tracing::warn!(error = %e, "cannot renew this host's lease"),
                Err(_) => tracing::warn!("renewing this host's lease did not finish within a heartbeat"),
            }
        }
    }

    /// Stops this host: its lease is gone, so another host may run its jobs.
    fn lose(&self, why: &str) {
        tracing::error!(why, "this host lost its lease on its jobs: it stops (start it again to rejoin)");
        self.lost.cancel();
        self.shutdown.cancel();
    }
}
