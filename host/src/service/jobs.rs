//! Reading and controlling jobs once they exist: a caller's view of its job
//! (live, a cached finished record, or the store's), listings, the executed
//! workflow, and cancellation.

use std::sync::Arc;

use super::{LIST_SCAN_BUDGET, LiveJob, Service, ServiceError};
use crate::store::{JobRecord, JobStatus, now_micros};

/// Filters of a job listing.
#[derive(Debug, Default)]
pub struct ListQuery {
    pub cursor: Option<Vec<u8>>,
    pub limit: usize,
    pub statuses: Vec<JobStatus>,
    pub metadata: Vec<(String, String)>,
}

impl Service {
    /// The store key of the job `owner` knows as `id` (see
    /// `store::scoped_job_key`); `id` itself when it names none of theirs.
    pub(crate) async fn job_key(&self, owner: &str, id: &str) -> String {
        self.get_shared(owner, id).await.map_or_else(|_| id.to_string(), |(r, _)| r.id.clone())
    }

    /// 1-based position of a queued job among its owner's queued jobs (see
    /// [`fair::FairQueue::position`]).
    pub fn queue_position(&self, id: &str) -> Option<usize> {
        self.queue.waiting().position(id)
    }

    /// The current record of a job the caller owns.
    pub async fn get(&self, owner: &str, id: &str) -> Result<(JobRecord, Option<usize>), ServiceError> {
        self.get_shared(owner, id).await.map(|(r, p)| ((*r).clone(), p))
    }

    /// [`Service::get`] without copying: finished records are served from an
    /// in-memory cache (they only change again at expiry).
    /// `id` is the id the owner knows: a job stored under its owner-scoped
    /// key (another owner's job held the id) is found by it too.
    pub async fn get_shared(&self, owner: &str, id: &str) -> Result<(Arc<JobRecord>, Option<usize>), ServiceError> {
        let record = match self.record_at(id).await? {
            Some(r) if r.owner == owner => r,
            _ => match self.record_at(&crate::store::scoped_job_key(owner, id)).await? {
                Some(r) if r.owner == owner => r,
                _ => return Err(ServiceError::NotFound),
            },
        };
        let position = if record.status == JobStatus::Queued { self.queue_position(&record.id) } else { None };
        Ok((record, position))
    }

    /// The record stored under the key `id` (live, cached or stored),
    /// whoever owns it.
    pub(super) async fn record_at(&self, id: &str) -> Result<Option<Arc<JobRecord>>, ServiceError> {
        // Where hosts share the store, another host may expire or delete a
        // finished job: its record is read from the store every time.
        let cached = if self.cluster.is_none() { self.finished.get(id) } else { None };
        let record = match self.live_job(id) {
            Some(live) => Arc::new(live.snapshot()),
            None => match cached {
                Some(r) => r,
                None => {
                    let generation = self.finished.generation();
                    let Some(r) = self.meta.get_job(id).await? else { return Ok(None) };
                    let r = Arc::new(r);
                    if r.status.is_terminal() && self.cluster.is_none() && self.live_job(id).is_none() {
                        self.finished.remember(r.clone(), Some(generation));
                    }
                    r
                }
            },
        };
        Ok(Some(record))
    }

    /// The executed (resolved) workflow of a job.
    pub async fn workflow(&self, owner: &str, id: &str) -> Result<serde_json::Value, ServiceError> {
        let (record, _) = self.get_shared(owner, id).await?;
        self.meta.get_workflow(&record.id).await?.ok_or(ServiceError::NotFound)
    }

    /// Cancels a job: a queued one at once, a running one by interrupting its
    /// node (`canceling` until it has stopped); a finished one is unchanged.
    pub async fn cancel(&self, owner: &str, id: &str) -> Result<(JobRecord, Option<usize>), ServiceError> {
        let key = self.job_key(owner, id).await;
        let id = key.as_str();
        // Not live here: finished, or (hosts sharing a store) another's.
        let Some(live) = self.live_job(id) else { return self.cancel_elsewhere(owner, id).await };
        let current = live.snapshot();
        if current.owner != owner {
            return Err(ServiceError::NotFound);
        }
        match current.status {
            JobStatus::Queued => {
                let rec = self.stop_queued(&live, JobStatus::Canceled).await?;
                // Another host took it from this one's queue meanwhile: asked there.
                if !rec.status.is_terminal() && self.live_job(id).is_none() {
                    return self.cancel_elsewhere(owner, id).await;
                }
                Ok((rec, None))
            }
            JobStatus::Running => self.cancel_running(&live).await.map(|r| (r, None)),
            _ => Ok((current, None)),
        }
    }

    /// Interrupts a running job's node: `canceling` until it has stopped.
    /// (A job already finishing ends as it ran: the cancel changes nothing.)
    async fn cancel_running(&self, live: &LiveJob) -> Result<JobRecord, ServiceError> {
        let rec = live.update(self.meta.as_ref(), |rec| rec.status == JobStatus::Running && rec.transition(JobStatus::Canceling, now_micros()).is_ok()).await?;
        if rec.status != JobStatus::Canceling {
            return Ok(rec);
        }
        self.meta.flush().await?;
        live.publish_status();
        live.cancel.cancel();
        Ok(rec)
    }

    /// Ends a job that has not started with `status` (canceled or expired).
    /// A worker that took it meanwhile sees the status and skips it. A job
    /// another host took from this one's queue meanwhile is handed over,
    /// and its record as that host holds it returned.
    pub(super) async fn stop_queued(&self, live: &Arc<LiveJob>, status: JobStatus) -> Result<JobRecord, ServiceError> {
        let before = live.snapshot();
        let id = before.id.clone();
        self.queue.waiting().withdraw(&id);
        let mut stopped = false;
        let updated = live
            .update(self.meta.as_ref(), |rec| {
                let now = now_micros();
                if rec.status == JobStatus::Queued && rec.transition(status, now).is_ok() {
                    // Its time in the queue is known now; it never executed.
                    rec.queue_ms = Some((now - rec.created_at) / 1000);
                    stopped = true;
                }
                stopped
            })
            .await;
        let rec = match updated {
            Err(crate::store::StoreError::Fenced(_)) => {
                self.hand_over(live).await;
                // A cancel goes on to the host that holds it now (durably:
                // it acts on it whenever it learns of it).
                if status == JobStatus::Canceled {
                    self.ask_to_cancel(&before.owner, &id).await?;
                }
                return Ok(self.meta.get_job(&id).await?.unwrap_or(before));
            }
            Err(e) => {
                if stopped {
                    // Not written (and undone on the live record): it stays
                    // queued, as the store holds it, and runs in its turn.
                    // Withdrawn first: a worker refused its start may have
                    // put it back meanwhile.
                    self.queue.waiting().withdraw(&id);
                    self.queue.requeue(&super::fair::sched_key(&before.owner, before.deployment.as_deref()), live.clone());
                }
                return Err(e.into());
            }
            Ok(rec) => rec,
        };
        if !stopped {
            // A worker started it first: cancel it as a running job.
            return if status == JobStatus::Canceled && rec.status == JobStatus::Running { self.cancel_running(live).await } else { Ok(rec) };
        }
        self.metrics.job_ended(rec.status, &rec.surface);
        // Again: a worker refused its start (its key busy on other hosts)
        // may have put it back meanwhile.
        self.queue.waiting().withdraw(&id);
        // Written: it leaves the live set whether or not the flush works (a
        // crash before one may bring it back queued, and it runs then).
        let flushed = self.meta.flush().await;
        live.publish_status();
        self.queue.leave(&id);
        self.publish_queue_positions();
        self.publish_queue(&rec.owner);
        flushed?;
        Ok(rec)
    }

    /// Jobs newest first.
    pub async fn list(&self, owner: &str, q: &ListQuery) -> Result<(Vec<JobRecord>, Option<Vec<u8>>), ServiceError> {
        let keep = |job: &JobRecord| {
            job.owner == owner
                && (q.statuses.is_empty() || q.statuses.contains(&self.live_job(&job.id).map_or(job.status, |l| l.record.lock().status)))
                && q.metadata.iter().all(|(k, v)| job.metadata.as_ref().and_then(|m| m.get(k)).and_then(|x| x.as_str()) == Some(v.as_str()))
        };
        let page = self.meta.list_jobs(Some(owner), q.cursor.as_deref(), q.limit, LIST_SCAN_BUDGET, &keep).await?;
        let jobs = page.jobs.into_iter().map(|j| self.live_job(&j.id).map_or(j, |l| l.snapshot())).collect();
        Ok((jobs, page.next))
    }
}
