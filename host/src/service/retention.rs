//! Recovery after a crash or restart, and the retention sweeper.
//!
//! Recovery policy: queued jobs are queued again in their original order. A
//! job that was running is run again from the start (its partial outputs
//! are dropped) — once: if it was already on its second attempt it fails
//! with `interrupted`, so a job that crashes the server cannot loop forever.
//! A job that was `canceling` ends `canceled`. A queued or running job
//! submitted with `extra_data` fails with `interrupted` instead: that data
//! (a partner key) is never stored, so the job cannot run as submitted.
//! A job already past its `expires_at` ends `expired`, and one taken over
//! from another host whose client asked to cancel it ends `canceled`:
//! neither runs again.
//!
//! Retention: at `expires_at` a job becomes `expired`, its output assets are
//! deleted (a running job is stopped first), and the expired record stays
//! readable for one more retention period before it is purged. Uploaded
//! assets past their own `expires_at` (asked for with `expires_in`) are
//! deleted. Blobs no asset, upload in progress or running job refers to are
//! collected; claims past their 24 h are dropped.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::{ExtraData, LiveJob, Service, ServiceError};
use crate::codes::JobErrorCode;
use crate::store::{JobErrorRecord, JobLogRecord, JobRecord, JobStatus, Micros, now_micros};

/// A running job is re-run after a restart at most this many times in all.
pub const MAX_ATTEMPTS: u32 = 2;

/// Jobs (and, apart, uploads) one sweep handles at most; more wait for the
/// next sweep.
const SWEEP_BATCH: usize = 10_000;

impl Service {
    /// Brings the store to a consistent state after a start.
    pub(super) async fn recover(&self) -> Result<(), ServiceError> {
        let (jobs, ends) = self.jobs_to_recover().await?;
        let max_seq = jobs.iter().map(|j| j.seq).max().unwrap_or(0).max(self.meta.max_seq().await?);
        self.numbers.start_seq_after(max_seq);
        self.recover_jobs(jobs, &ends).await.map_err(|(e, _)| e)
    }

    /// Applies the recovery policy to unfinished jobs this process now
    /// holds (its own after a restart, or a lapsed host's, see `cluster`),
    /// oldest first; those in `ends` (taken over to be ended, see
    /// `Adopted::ends`) end so. On an error, the jobs not yet recovered
    /// come back with it (to try again: they are this host's, and no other
    /// takes them).
    pub(super) async fn recover_jobs(&self, mut jobs: Vec<JobRecord>, ends: &HashMap<String, JobStatus>) -> Result<(), (ServiceError, Vec<JobRecord>)> {
        let now = now_micros();
        jobs.sort_by_key(|j| j.seq);
        let mut jobs = jobs.into_iter();
        while let Some(job) = jobs.next() {
            let end = ends.get(&job.id).copied();
            if let Err(e) = self.recover_job(job.clone(), end, now).await {
                return Err((e, std::iter::once(job).chain(jobs).collect()));
            }
        }
        self.meta.flush().await.map_err(|e| (e.into(), Vec::new()))
    }

    /// One job of [`Service::recover_jobs`]: ended, or queued here.
    async fn recover_job(&self, mut job: JobRecord, end: Option<JobStatus>, now: Micros) -> Result<(), ServiceError> {
        // Output assets of an interrupted run that its stored record does
        // not list (outputs reach the store with the terminal record).
        if matches!(job.status, JobStatus::Running | JobStatus::Canceling) {
            for asset in self.meta.assets_of_job(&job.id).await? {
                if !job.outputs.iter().any(|o| o.asset_id == asset.id) {
                    self.delete_asset_record(&asset).await?;
                }
            }
        }
        // Asked to be canceled (by a client of another host), or past its
        // expiry (by the store's clock when taken over, else this host's):
        // ended so, never run again, and streams told.
        let end = end.or((job.expires_at <= now).then_some(JobStatus::Expired));
        if let Some(end) = end.filter(|_| !job.status.is_terminal()) {
            if end == JobStatus::Expired {
                self.drop_outputs(&mut job).await?;
            }
            job.progress = None;
            job.transition(end, now)?;
            tracing::info!(job_id = %job.id, status = ?end, "job recovered and ended, not run");
            self.meta.put_job(&job).await?;
            self.metrics.job_ended(job.status, &job.surface);
            self.bus.job_channel(&job.id).publish(super::JobEvent::Status(Arc::new(job)));
            return Ok(());
        }
        if matches!(job.status, JobStatus::Queued | JobStatus::Running) && job.had_extra_data {
            // Its `extra_data` (the partner key) was never stored: run
            // again without it, a partner node would fail or, worse,
            // behave differently. It fails, saying why.
            let ran = job.status == JobStatus::Running;
            self.drop_outputs(&mut job).await?;
            let why = "the server running this job stopped before it finished; its extra_data is never stored, so it cannot run again: submit it again";
            fail_interrupted(&mut job, why.into(), ran, now)?;
            tracing::warn!(job_id = %job.id, "job with extra_data interrupted (a restart, or its host stopped): failed");
            self.meta.put_job(&job).await?;
            self.metrics.job_ended(job.status, &job.surface);
            return Ok(());
        }
        match job.status {
            JobStatus::Queued => {}
            JobStatus::Canceling => {
                // Keeps the outputs its record lists.
                job.transition(JobStatus::Canceled, now)?;
                self.meta.put_job(&job).await?;
                self.metrics.job_ended(job.status, &job.surface);
                return Ok(());
            }
            JobStatus::Running => {
                self.drop_outputs(&mut job).await?;
                job.progress = None;
                if job.attempts >= MAX_ATTEMPTS {
                    let why = format!("the server stopped while this job was running (attempt {}); it is not retried again", job.attempts);
                    fail_interrupted(&mut job, why, true, now)?;
                    tracing::warn!(job_id = %job.id, "job interrupted (a restart, or its host stopped) for the last time: failed");
                    self.meta.put_job(&job).await?;
                    self.metrics.job_ended(job.status, &job.surface);
                    return Ok(());
                }
                tracing::warn!(job_id = %job.id, "job interrupted (a restart, or its host stopped): running it again");
                job.transition(JobStatus::Queued, now)?;
                job.started_at = None;
                self.meta.put_job(&job).await?;
            }
            _ => return Ok(()),
        }
        // Recovered jobs are queued whatever their key's limit.
        let key = super::fair::sched_key(&job.owner, job.deployment.as_deref());
        let events = self.bus.job_channel(&job.id);
        let billed = self.billing(&job.owner, job.deployment.as_deref());
        self.queue.requeue(&key, Arc::new(LiveJob::new(job, ExtraData::default(), events).billed_to(billed)));
        Ok(())
    }

    /// Deletes the output assets a job record lists and forgets them on it.
    pub(super) async fn drop_outputs(&self, job: &mut JobRecord) -> Result<(), ServiceError> {
        for out in job.outputs.drain(..) {
            if let Some(asset) = self.meta.get_asset(&out.asset_id).await? {
                self.delete_asset_record(&asset).await?;
            }
        }
        Ok(())
    }

    pub(super) async fn sweeper_loop(self: Arc<Self>) {
        let mut tick = tokio::time::interval(self.opts.sweep_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Freed tensor memory is kept for reuse while jobs run (see
        // `memory`); once the server has been idle for a few seconds it goes
        // back to the kernel.
        let mut idle_check = tokio::time::interval(std::time::Duration::from_secs(3));
        let (mut last_seen, mut trimmed_at) = (0, 0);
        loop {
            tokio::select! {
                _ = self.shutdown.cancelled() => return,
                _ = idle_check.tick() => {
                    // Idle: no job live, no new submission or stream for a
                    // whole interval, and something happened since the last trim.
                    let activity = self.activity.load(Ordering::Relaxed);
                    let quiet = activity == last_seen && self.queue.is_idle() && self.open_streams() == 0;
                    if quiet && activity != trimmed_at {
                        trimmed_at = activity;
                        tokio::task::spawn_blocking(crate::memory::release_free_memory);
                    }
                    last_seen = activity;
                    continue;
                }
                _ = tick.tick() => {}
            }
            // One host at a time, where hosts share the store.
            let _lease = match self.meta.periodic_lease(crate::store::SWEEP_LEASE).await {
                Ok(Some(lease)) => lease,
                Ok(None) => {
                    tracing::debug!("another host holds the retention sweep");
                    continue;
                }
                Err(e) => {
                    tracing::error!(error = %e, "cannot take the retention sweep's lease");
                    continue;
                }
            };
            // On the blocking pool, as a whole: it lists and deletes files.
            let (this, runtime) = (self.clone(), tokio::runtime::Handle::current());
            match tokio::task::spawn_blocking(move || crate::store::may_block_here(|| runtime.block_on(this.sweep(now_micros())))).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::error!(error = %e, "retention sweep failed"),
                Err(e) => tracing::error!(error = %e, "retention sweep panicked"),
            }
        }
    }

    /// One retention pass as of `now`.
    pub async fn sweep(&self, now: Micros) -> Result<(), ServiceError> {
        // Nothing written before the deletions below may be replayed after
        // a crash (it could bring a deleted record back).
        self.meta.checkpoint().await?;
        let grace = self.opts.retention.as_micros() as Micros;
        for listed in self.meta.jobs_due(now, now.saturating_sub(grace), SWEEP_BATCH).await? {
            if let Some(live) = self.live_job(&listed.id) {
                let status = live.record.lock().status;
                // Not stopped as queued: a worker took it meanwhile.
                let stopped = status == JobStatus::Queued && self.stop_queued(&live, JobStatus::Expired).await?.status == JobStatus::Expired;
                if !stopped && self.live_job(&listed.id).is_none() {
                    // Another host took it meanwhile: it expires there.
                    continue;
                }
                if !stopped {
                    // Running: stop it; the worker records it as expired.
                    live.expire_on_stop.store(true, Ordering::SeqCst);
                    live.cancel.cancel();
                    continue;
                }
            }
            // Re-read: the listing may predate the job's last write.
            let Some(mut job) = self.meta.get_job(&listed.id).await? else { continue };
            if !job.status.is_terminal() {
                // Unfinished and not live here: another host sharing the
                // store holds it (it expires once it has ended).
                continue;
            }
            if job.status != JobStatus::Expired || !job.outputs.is_empty() {
                self.drop_outputs(&mut job).await?;
                job.transition(JobStatus::Expired, now)?;
                job.progress = None;
                self.meta.put_job(&job).await?;
                self.finished.forget(&job.id);
                tracing::info!(job_id = %job.id, "job expired");
            } else if job.expires_at + grace <= now {
                self.meta.delete_job(&job).await?;
                self.finished.forget(&job.id);
            }
        }
        // Uploads (not job outputs, which go with their job) past their expiry.
        // (Each only if still due: an upload of the same bytes may have
        // extended it since it was listed.)
        for asset in self.meta.uploads_due(now, SWEEP_BATCH).await? {
            if let Some(deleted) = self.meta.delete_expired_upload(&asset, now).await? {
                self.forget_asset_record(&deleted);
                tracing::info!(asset_id = %deleted.id, "asset expired");
            }
        }
        self.meta.purge_claims(now).await?;
        self.meta.tidy().await?;
        self.meta.prune_blob_holds().await?;
        self.collect_blobs()?;
        self.measure_blobs();
        self.meta.flush().await?;
        Ok(())
    }
}

/// Ends a job recovered at a restart as failed `interrupted`. Its log is
/// empty: what its runs printed was in the lost process (`ran`: shed).
fn fail_interrupted(job: &mut JobRecord, message: String, ran: bool, now: Micros) -> Result<(), crate::store::IllegalTransition> {
    job.transition(JobStatus::Failed, now)?;
    job.progress = None;
    job.error = Some(JobErrorRecord { code: JobErrorCode::Interrupted, message, node_id: None, class_type: None, traceback: None });
    job.logs = Some(JobLogRecord { text: String::new(), truncated: ran, captured_at: now });
    Ok(())
}
