//! Job workers: each takes the next queued job (see `queue`), starts it,
//! runs it through its engine's executor with an event sink (`sink`), and
//! records how it ended (`outcome`), durably, before anyone sees it.

mod billing;
mod outcome;
mod sink;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use outcome::{NO_CREDITS, NotRun, end_record};
use sink::JobSink;

use super::bus::{self, ExecBody};
use super::job_files::{JobInputs, JobOutputs};
use super::{JobEvent, LiveJob, Service};
use crate::codes::JobErrorCode;
use crate::executor::{Event, RunContext, RunOutcome};
use crate::store::{Charged, JobErrorRecord, JobRecord, JobStatus, ProgressSnapshot, StoreError, now_micros};

/// The longest wait between tries to record a finished job.
const FINISH_RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(2);

/// How long a scheduling key whose jobs on all hosts are at its running
/// limit waits before this host tries to start its next job again (one
/// short transaction per try; other keys' jobs start meanwhile): at most
/// this long a freed place stays free when the key's next job waits on
/// another host.
const KEY_BUSY_RETRY: std::time::Duration = std::time::Duration::from_millis(250);

impl Service {
    pub(super) async fn worker_loop(self: Arc<Self>) {
        loop {
            let next = tokio::select! {
                _ = self.shutdown.cancelled() => return,
                id = self.next_job() => id,
            };
            let (next, key) = next;
            self.sharing.took();
            if self.cluster.is_some() && !self.queue.waiting().has_waiting(&key) {
                self.sharing.key_left();
            }
            let Some(live) = self.live_job(&next) else {
                self.queue.waiting().done(&key);
                self.sharing.done();
                continue;
            };
            tokio::select! {
                _ = self.shutdown.cancelled() => {
                    // Leave the job `running` in the store: the next start re-runs it.
                    live.cancel.cancel();
                    return;
                }
                () = tracing::Instrument::instrument(self.run_job(live.clone(), &key), tracing::info_span!("run", job_id = %next, owner = %live.owner)) => {}
            }
            self.queue.waiting().done(&key);
            self.sharing.done();
        }
    }

    /// The next job to run, with its scheduling key (see `queue`).
    async fn next_job(&self) -> (String, String) {
        let limits = |key: &str| self.limits_for(key);
        self.queue.waiting().next(&limits).await
    }

    /// Runs one job of scheduling key `key` taken from the queue, from its
    /// start to its durable end.
    async fn run_job(&self, live: Arc<LiveJob>, key: &str) {
        let Some(snapshot) = self.begin(&live, key).await else { return };
        let kept = live.prepared.lock().take();
        let prepared = match (self.engine_for(&snapshot).await, kept) {
            (Err(e), _) => Err(e),
            // Planned against the classes that serve now (no plugin was
            // installed or removed since): the plan holds.
            (Ok((registry, executor)), Some(kept)) if Arc::ptr_eq(&registry, &kept.registry) => Ok(((kept.text, kept.plan), registry, executor)),
            (Ok((registry, executor)), _) => self.prepare(&snapshot, &registry).await.map(|p| (p, registry, executor)),
        };
        let outcome = match prepared {
            Ok(((prompt, plan), registry, executor)) => self.execute(&live, &snapshot, (prompt, plan, registry), &executor).await,
            Err(error) => {
                // It never started: the bus still shows it start and fail.
                self.bus.job(&Arc::from(snapshot.id.as_str()), &Arc::from(snapshot.owner.as_str()), ExecBody::Started { at_ms: bus::now_ms() });
                Err(NotRun { error, output_lost: false })
            }
        };
        self.finish(&live, outcome).await;
    }

    /// Moves a queued job to running and records it; `None` when it is no
    /// longer queued (canceled or expired while it waited), or when its
    /// key runs as many jobs as it may on all the hosts sharing the store
    /// (then it goes back to its key's front, see `fair`).
    ///
    /// The running record goes to the store in the job's write turn (so a
    /// concurrent cancel's write cannot be overtaken), and into the live
    /// record once the store answered (a start not admitted leaves it
    /// queued); then, outside the turn (it may wait
    /// for the disk when the log grows), the start is logged: it survives a
    /// crash of the process before the run begins, so a job that brings the
    /// server down cannot be retried forever, without a flush on every job
    /// (see `MetaStore::record_start`).
    async fn begin(&self, live: &Arc<LiveJob>, key: &str) -> Option<JobRecord> {
        // Not before its submitter has its answer (see `StartGate`).
        live.may_start().await;
        let now = now_micros();
        let turn = live.writes.lock().await;
        let snapshot = {
            let rec = live.record.lock();
            if rec.status != JobStatus::Queued {
                return None;
            }
            let mut started = rec.clone();
            if let Err(bug) = started.transition(JobStatus::Running, now) {
                tracing::error!(job_id = %rec.id, %bug, "cannot start the job");
                return None;
            }
            started.started_at = Some(now);
            started.queue_ms = Some((now - started.created_at) / 1000);
            started.attempts += 1;
            started
        };
        let written = match self.shared_running_limit(key) {
            // Not admitted for certain (refused, or the store did not
            // answer): it waits, as the limit may not be known to hold.
            Some(max_running) => match self.meta.start_admitted(&snapshot, key, max_running).await {
                Err(StoreError::Unavailable(_) | StoreError::Backend(_)) => Err(StoreError::Refused(crate::store::Refusal::RunningFull)),
                written => written,
            },
            None => self.meta.put_job(&snapshot).await,
        };
        match written {
            Err(StoreError::Fenced(_)) => {
                drop(turn);
                // An idle host took it from this one's queue (or this
                // host's lease lapsed and another took it over).
                tracing::debug!(job_id = %snapshot.id, "another host holds this job now: not started here");
                self.hand_over(live).await;
                return None;
            }
            Err(StoreError::Refused(_)) => {
                let until = std::time::Instant::now() + KEY_BUSY_RETRY;
                self.queue.waiting().put_back(key, &live.owner, snapshot.id.clone(), until);
                tracing::debug!(job_id = %snapshot.id, key, "the key runs as many jobs as it may on all hosts: the job waits");
                return None;
            }
            // (Not written, where no limit is checked across hosts: it runs
            // all the same; see below.)
            _ => *live.record.lock() = snapshot.clone(),
        }
        drop(turn);
        let logged = match written {
            Ok(()) => self.meta.record_start(&snapshot).await,
            Err(e) => Err(e),
        };
        if let Err(e) = logged {
            tracing::error!(job_id = %snapshot.id, error = %e, "cannot record the running job");
        }
        tracing::debug!(job_id = %snapshot.id, attempt = snapshot.attempts, "job running");
        let waited = snapshot.started_at.map_or(0, |at| at - snapshot.created_at);
        self.metrics.job_started(std::time::Duration::from_micros(u64::try_from(waited).unwrap_or(0)));
        live.publish_status();
        self.publish_queue_positions();
        // Running jobs still count as remaining (as ComfyUI counts them).
        self.publish_queue_here(&snapshot.owner);
        Some(snapshot)
    }

    /// The job's node classes and executor: its deployment's, or the
    /// server's. A job whose account ran out of credits while it waited
    /// (a job that cost more than the minimum it held took the balance to
    /// zero or below) does not run: it fails, never executed, never
    /// charged.
    /// Where hosts share the store, the balance is the store's (another
    /// host's charge may not have been heard yet; this host's view if the
    /// store cannot answer).
    async fn engine_for(&self, job: &JobRecord) -> Result<(Arc<crate::plugins::NodeRegistry>, Arc<crate::executor::Executor>), JobErrorRecord> {
        let error = |code: JobErrorCode, message: &str| JobErrorRecord { code, message: message.into(), node_id: None, class_type: None, traceback: None };
        if self.opts.mode.has_accounts() {
            let billed = self.billed_account(job);
            let funds = match self.cluster {
                Some(_) => self.accounts.stored_funds(&billed).await.unwrap_or_else(|e| {
                    tracing::warn!(job_id = %job.id, account = %billed, error = %e, "cannot read the billed account's balance before the start");
                    self.accounts.has_funds(&billed)
                }),
                None => self.accounts.has_funds(&billed),
            };
            if !funds {
                return Err(error(NO_CREDITS, "the account ran out of credits before the job started"));
            }
        }
        self.engine(&job.owner, job.deployment.as_deref())
            .ok_or_else(|| error(JobErrorCode::DeploymentStopped, "the job's deployment was stopped before the job could run"))
    }

    /// Runs a started job's plan to its outcome (a panic in the executor
    /// is a failed job, never a dead worker).
    async fn execute(
        &self,
        live: &Arc<LiveJob>,
        job: &JobRecord,
        (prompt, plan, registry): (Arc<str>, crate::workflow::Plan, Arc<crate::plugins::NodeRegistry>),
        executor: &crate::executor::Executor,
    ) -> Result<RunOutcome, NotRun> {
        let total = plan.nodes.len() as u64;
        let components = registry.components_of(plan.nodes.iter().map(|n| n.class_type.as_str()));
        {
            let mut rec = live.record.lock();
            rec.components = components;
            rec.bundle = registry.bundle().map(crate::plugins::identity::hash_grant);
            rec.progress = Some(ProgressSnapshot {
                value: 0.0,
                nodes_done: 0,
                nodes_total: total,
                current_node: None,
                current_node_class: None,
                step: None,
                steps: None,
                message: None,
            });
        }
        let accounts = self.opts.mode.has_accounts();
        let ctx = RunContext {
            job_id: job.id.clone(),
            registry,
            prompt,
            extra_pnginfo: live.extra.extra_pnginfo.as_deref().cloned(),
            inputs: Arc::new(JobInputs::new(&job.inputs, self.blobs.clone())),
            outputs: Arc::new(JobOutputs::new(
                self.blobs.clone(),
                live.pending_blobs.clone(),
                self.blob_claims.clone(),
                (self.meta.clone(), job.id.clone()),
                self.opts.disk_floor.clone(),
            )),
            events: self.sink(live.clone()),
            cancel: live.cancel.clone(),
            secrets: live.extra.secrets.clone(),
            branches: self.threads.branches(),
            budget: crate::budget::JobBudget::new(self.opts.job_limits),
            // With accounts, results are never shared between them.
            cache_scope: if accounts { job.owner.clone() } else { String::new() },
            funds: accounts.then(|| {
                let (accounts, billed) = (self.accounts.clone(), self.billed_account(job));
                Arc::new(move || accounts.has_funds(&billed)) as crate::executor::FundsCheck
            }),
        };
        let run = std::panic::AssertUnwindSafe(executor.run(&plan, ctx));
        futures_util::FutureExt::catch_unwind(run).await.map_err(|_| NotRun {
            error: JobErrorRecord {
                code: JobErrorCode::InternalError,
                message: "the job's execution failed unexpectedly".into(),
                node_id: None,
                class_type: None,
                traceback: None,
            },
            output_lost: true,
        })
    }

    /// Loads and re-validates the job's workflow (plugins may have changed
    /// since it was submitted, e.g. across a restart).
    /// A job's plan and workflow text from the store (a job submitted
    /// before a restart, or whose parsed form the queued jobs' share could
    /// not keep): counted, then parsed and validated within the intake
    /// budget like a submission; the run keeps the text and the plan, not
    /// the parsed tree.
    async fn prepare(&self, job: &JobRecord, registry: &crate::plugins::NodeRegistry) -> Result<(Arc<str>, crate::workflow::Plan), JobErrorRecord> {
        let error = |code: JobErrorCode, message: String| JobErrorRecord { code, message, node_id: None, class_type: None, traceback: None };
        let bytes = match self.meta.get_workflow_bytes(&job.id).await {
            Ok(Some(b)) => b,
            Ok(None) => return Err(error(JobErrorCode::InternalError, "the job's workflow is missing from the store".into())),
            Err(e) => return Err(error(JobErrorCode::InternalError, format!("cannot read the job's workflow: {e}"))),
        };
        let cost = crate::workflow::cost::count_values(&bytes, u64::MAX).unwrap_or_default();
        let _parsing = self.intake.enter(super::intake_estimate(cost)).await.map_err(|e| error(JobErrorCode::InvalidWorkflow, e.to_string()))?;
        let workflow: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|e| error(JobErrorCode::InternalError, format!("the job's stored workflow is unreadable: {e}")))?;
        let inputs = JobInputs::new(&job.inputs, self.blobs.clone());
        let plan = match super::intake::plan(&workflow, registry, &inputs, &self.opts.workflow_limits, super::OutputPolicy::AllOrNothing) {
            Ok((plan, _)) => plan,
            Err(e) => return Err(error(JobErrorCode::InvalidWorkflow, crate::service::ServiceError::from(e).to_string())),
        };
        let text = String::from_utf8(bytes).map_err(|_| error(JobErrorCode::InternalError, "the job's stored workflow is not UTF-8".into()))?;
        Ok((Arc::from(text), plan))
    }

    /// The executor's event sink for one job.
    fn sink(&self, live: Arc<LiveJob>) -> crate::executor::EventSink {
        let sink = JobSink::new(self.meta.clone(), self.bus.clone(), live, (self.metrics.clone(), self.registry()));
        Arc::new(move |event: Event| sink.handle(event))
    }

    /// Writes a job's terminal record with its output assets. While the
    /// store is unreachable (a database restarting) it tries again, backing
    /// off to [`FINISH_RETRY_MAX`], so the job is shown finished only once
    /// its record and outputs are durable; it gives up only when the
    /// service stops (a restart then recovers the job) or on any other
    /// error. With `due` (the billed account and the execution it pays
    /// for), a store that keeps the accounts too charges it in the same
    /// write (see `billing`).
    async fn record_finished(&self, terminal: &JobRecord, assets: &[crate::store::AssetRecord], due: Option<&billing::Due>) -> Result<Charged, StoreError> {
        let mut delay = std::time::Duration::from_millis(50);
        loop {
            let written = match due {
                Some(due) => self.meta.finish_job_charged(terminal, assets, due.charge(self.accounts.pricing())).await,
                None => self.meta.finish_job(terminal, assets).await.map(|()| Charged::Apart),
            };
            match written {
                Err(StoreError::Unavailable(e)) if !self.shutdown.is_cancelled() => {
                    tracing::warn!(job_id = %terminal.id, error = %e, retry_in_ms = delay.as_millis() as u64, "the store is unavailable; the finished job waits to be recorded");
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = self.shutdown.cancelled() => {}
                    }
                    delay = (delay * 2).min(FINISH_RETRY_MAX);
                }
                done => return done,
            }
        }
    }

    /// Records how the run ended and retires the live job. The terminal
    /// record is made durable (sled, then a synced commit-log frame with the
    /// output assets) before anyone can see it: until then the live record
    /// keeps its running state — a poll, a listing or an event stream never
    /// shows a job done that a crash could undo — and, marked finishing, it
    /// takes no other write (a cancel arriving now changes nothing). The
    /// record's lock is not held across this write, so a poll does not wait
    /// for it.
    /// The job's account is charged with that write, or just after it
    /// (`billing`), before the job leaves the live set.
    async fn finish(&self, live: &Arc<LiveJob>, outcome: Result<RunOutcome, NotRun>) {
        if let Err(NotRun { error, .. }) = &outcome {
            let (id, owner) = {
                let rec = live.record.lock();
                (Arc::from(rec.id.as_str()), Arc::from(rec.owner.as_str()))
            };
            let body = ExecBody::Failed {
                node: error.node_id.clone(),
                class_type: error.class_type.clone(),
                code: error.code,
                message: error.message.clone(),
                executed: Vec::new(),
                at_ms: bus::now_ms(),
            };
            self.bus.job(&id, &owner, body);
        }
        // After any write in flight (a cancel's): the terminal record is the last.
        let _turn = live.writes.lock().await;
        let terminal = {
            let rec = live.record.lock();
            live.finishing.store(true, Ordering::SeqCst);
            let mut terminal = rec.clone();
            if let Err(bug) = end_record(&mut terminal, outcome, live.expire_on_stop.load(Ordering::SeqCst), now_micros(), self.opts.job_log_bytes) {
                tracing::error!(job_id = %terminal.id, %bug, "cannot record how the job ended");
            }
            terminal
        };
        let terminal = Arc::new(terminal);
        let assets = std::mem::take(&mut *live.output_assets.lock());
        // On this thread: the execution runtime's threads are there for
        // blocking job work, and a hand-off to the blocking pool and back
        // cost ~100 µs per job here (BENCHMARKS.md, "fewer hand-offs on a job's critical path").
        let due = self.charge_due(&terminal);
        match self.record_finished(&terminal, &assets, due.as_ref()).await {
            Ok(Charged::With(change)) => self.charged_with_end(&terminal, due, change).await,
            // Before it leaves the live set: its hold on the balance lasts
            // until it is charged.
            Ok(Charged::Apart) => self.charge_apart(&terminal, due).await,
            Err(StoreError::Fenced(_)) => {
                // This host's lease lapsed while the job ran and another
                // host took it over: that host's run is the job's (nothing
                // was charged: the end and its charge are one write).
                tracing::warn!(job_id = %terminal.id, "another host took this job over while it ran here: this run is dropped");
                self.queue.leave(&terminal.id);
                return;
            }
            // Ended either way: a store failure only means a restart may
            // run it again. Where hosts share the store, the failed write
            // charged nothing either (the rerun pays); the embedded store
            // may have kept the end, so the run is charged.
            Err(e) => {
                tracing::error!(job_id = %terminal.id, error = %e, "cannot record the finished job");
                if self.cluster.is_none() {
                    self.charge_apart(&terminal, due).await;
                }
            }
        }
        // Served from memory from now on (the sweeper forgets it when it
        // expires it; a live job is never expired under it).
        self.finished.remember(terminal.clone(), None);
        *live.record.lock() = (*terminal).clone();
        self.metrics.job_ended(terminal.status, &terminal.surface);
        // The one line per job at `info` (queued and running are `debug`).
        tracing::info!(
            job_id = %terminal.id,
            status = terminal.status.as_str(),
            queue_ms = terminal.queue_ms,
            execution_ms = terminal.execution_ms,
            error = terminal.error.as_ref().map(|e| e.code.as_str()),
            "job finished"
        );
        live.publish(JobEvent::Status(terminal.clone()));
        self.queue.leave(&terminal.id);
        // On the bus, after the record is written: the queue changed, and
        // the job is over.
        self.publish_queue(&terminal.owner);
        self.bus.job(&Arc::from(terminal.id.as_str()), &Arc::from(terminal.owner.as_str()), ExecBody::Executing { node: None });
    }
}
