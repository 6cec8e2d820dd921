//! The last rules before a job is queued, and its durable write: funds, the
//! server's queue bound, the job's id, the account's state, the scheduling
//! key's own bound (its tier), then the record, the workflow and the
//! idempotency claim in one store write, synced before the caller hears.
//! Where hosts share the store, the store checks the server's bound and,
//! with accounts, the billed account and the key's bound again in that
//! write ([`Admission`]), so these hold across all of them.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use serde_json::Value as Json;

use super::{IDEMPOTENCY_TTL, Submission};
use crate::service::live::{self, LiveJob, StartGate};
use crate::service::queue::NotJoined;
use crate::service::{Service, ServiceError, fair};
use crate::store::{Admission, Billing, IdempotencyClaim, JobInput, JobRecord, JobStatus, KeyBound, Micros, Refusal, ServerBound, StoreError, now_micros};
use crate::workflow::Plan;

/// A plan and the node classes it was made against.
type PlannedOn = (Plan, std::sync::Arc<crate::plugins::NodeRegistry>);

/// 429 `queue_full` for a key (or the server) with these limits: retry
/// after about the time a queue this deep takes to drain, 1 to 60 s.
fn queue_full(limits: fair::OwnerLimits) -> ServiceError {
    let per_job = (limits.max_queued / limits.max_running.max(1)).max(1);
    ServiceError::QueueFull { retry_after_s: (per_job as u64 / 100).clamp(1, 60) }
}

/// Admission turns (a few, shared by keys hashing alike): the admissions of
/// one scheduling key that a shared store checks take turns on this host,
/// so the key's waiting jobs listed for one ([`Admission::waiting_here`])
/// are not changed by another meanwhile, and at most this many of this
/// host's database connections wait on the store's admission locks at once.
#[derive(Default)]
pub struct AdmissionTurns([tokio::sync::Mutex<()>; ADMISSION_TURNS]);

const ADMISSION_TURNS: usize = 8;

impl AdmissionTurns {
    async fn take(&self, key: &str) -> tokio::sync::MutexGuard<'_, ()> {
        use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
        let hash = BuildHasherDefault::<DefaultHasher>::default().hash_one(key);
        self.0[(hash % ADMISSION_TURNS as u64) as usize].lock().await
    }
}

/// A slot of the server-wide queue bound, given back unless kept.
struct Slot<'a>(Option<&'a Service>);

impl Slot<'_> {
    fn keep(mut self) {
        self.0 = None;
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        if let Some(service) = self.0 {
            service.queue.waiting().release();
        }
    }
}

impl Service {
    /// 429 `queue_full` for the server's queue bound.
    fn server_queue_full(&self) -> ServiceError {
        queue_full(fair::OwnerLimits { max_running: self.opts.max_running_jobs, max_queued: self.opts.max_queued_jobs })
    }

    /// Records a validated job (`workflow` resolved, `plan` its plan); it
    /// is durable and queued when this returns, at the position returned.
    pub(super) async fn enqueue(
        &self,
        sub: Submission,
        workflow: Json,
        inputs: Vec<JobInput>,
        plan: PlannedOn,
    ) -> Result<(JobRecord, usize, StartGate), ServiceError> {
        let now = now_micros();
        self.activity.fetch_add(1, Ordering::Relaxed);
        // An account whose balance does not cover one more job beside its
        // unfinished ones submits nothing (no claim is made, so its
        // Idempotency-Key stays free). Checked again as the job joins the
        // live set, and where hosts share the store, in its write.
        let billed = self.billing(&sub.owner, sub.deployment.as_deref());
        if billed.as_deref().is_some_and(|account| !self.accounts.admits(account, self.queue.billed_to(account))) {
            return Err(ServiceError::InsufficientCredits);
        }
        // Reserve a queue slot; a full queue releases everything (no claim).
        if !self.queue.waiting().reserve(self.opts.max_queued_jobs) {
            return Err(self.server_queue_full());
        }
        let slot = Slot(Some(self));
        let id = match &sub.id {
            None => uuid::Uuid::now_v7().to_string(),
            Some(chosen) => self.key_for_chosen_id(&sub.owner, chosen).await?,
        };
        let seq = self.numbers.next_seq().await?;
        let record = self.new_record(&sub, (id, seq), inputs, &plan, now);
        let claim = sub.idempotency_key.as_ref().map(|key| IdempotencyClaim {
            key: self.claim_key(&sub.owner, key),
            owner: sub.owner.clone(),
            job_id: Some(record.id.clone()),
            claimed_at: now,
            expires_at: now + IDEMPOTENCY_TTL.as_micros() as Micros,
        });
        let live = Arc::new(LiveJob::new(record.clone(), sub.extra, self.bus.job_channel(&record.id)).billed_to(billed));
        // Shut before it is queued; opened when the caller drops it (on an
        // error, at once).
        let gate = StartGate::shut(&live);
        let (written, position) = self.commit(&live, slot, (&sub.owner, sub.deployment.as_deref(), sub.front), &workflow, claim.as_ref(), plan).await?;
        let id = &record.id;
        if matches!(written, Ok(()) | Err(StoreError::NotDurable(_))) {
            // Queued here: it runs whatever the caller hears from now on.
            self.metrics.job_submitted(&record.surface);
        }
        match written {
            Ok(()) => {}
            // The caller hears 500 (outcome unknown); the key stays claimed.
            Err(e @ StoreError::NotDurable(_)) => {
                tracing::warn!(job_id = %id, error = %e, "job queued, but its submission may not be durable");
                return Err(e.into());
            }
            Err(e) => {
                self.withdraw(id);
                return Err(match e {
                    StoreError::KeyClaimed => ServiceError::IdempotencyKeyReuse,
                    StoreError::Refused(Refusal::NoFunds) => ServiceError::InsufficientCredits,
                    StoreError::Refused(Refusal::AccountDisabled) => ServiceError::AccountDisabled,
                    StoreError::Refused(Refusal::QueueFull) => queue_full(self.limits_for(&fair::sched_key(&sub.owner, sub.deployment.as_deref()))),
                    StoreError::Refused(Refusal::ServerQueueFull) => self.server_queue_full(),
                    e => e.into(),
                });
            }
        }
        tracing::debug!(job_id = %id, "job queued");
        // The job is queued, but starts only once the caller drops `gate`
        // (after its answer is made). Nothing it does can be seen as done
        // before the submission is durable either way: its terminal
        // record is logged after the submission and synced with everything
        // before it, and a crash before this sync loses the submission and
        // everything after it together (the caller, who got no 201, submits
        // again). The 201 waits for the sync.
        match self.meta.sync_jobs().await {
            Ok(()) => Ok((record, position, gate)),
            Err(e) => Err(StoreError::NotDurable(e.to_string()).into()),
        }
    }

    /// The queued record of a new job (`id`, numbered `seq`), with the
    /// components its plan was validated against.
    fn new_record(&self, sub: &Submission, (id, seq): (String, u64), inputs: Vec<JobInput>, (plan, registry): &PlannedOn, now: Micros) -> JobRecord {
        JobRecord {
            id,
            owner: sub.owner.clone(),
            status: JobStatus::Queued,
            created_at: now,
            started_at: None,
            completed_at: None,
            updated_at: now,
            expires_at: now + self.opts.retention.as_micros() as Micros,
            seq,
            attempts: 0,
            inputs,
            outputs: Vec::new(),
            error: None,
            progress: None,
            logs: None,
            queue_ms: None,
            execution_ms: None,
            metadata: sub.metadata.clone(),
            surface: sub.surface.as_str().to_string(),
            logs_withheld: sub.deployment.as_deref().and_then(|d| self.deployments.get(d)).is_some_and(|d| d.spec.public_demo),
            components: registry.components_of(plan.nodes.iter().map(|n| n.class_type.as_str())),
            bundle: registry.bundle().map(crate::plugins::identity::hash_grant),
            deployment: sub.deployment.clone(),
            had_extra_data: !sub.extra.secrets.is_empty(),
            pnginfo_held: sub.extra.extra_pnginfo.is_some(),
            compat: sub.compat.clone(),
        }
    }

    /// Queues the job and writes its submission, in the job's write turn
    /// (see `LiveJob::writes`): the refusals that need the job in the live set (the account
    /// disabled meanwhile, the key's own bound), then the store write.
    /// Returns the write's outcome (the job stays queued unless it failed
    /// outright) and its position.
    ///
    /// The job is queued and a worker woken before the submission is
    /// written: waking a thread takes longer than the writes (about 60 vs
    /// 35 µs here), so the worker usually starts as soon as they are done.
    /// It cannot start earlier: the writes happen in the job's write turn,
    /// which the worker takes first — also what puts the submission
    /// before the job's start in the commit log. No one else can see the
    /// job yet (its id is unknown until the 201; the store does not list
    /// it).
    async fn commit(
        &self,
        live: &Arc<LiveJob>,
        slot: Slot<'_>,
        (owner, deployment, front): (&str, Option<&str>, bool),
        workflow: &Json,
        claim: Option<&IdempotencyClaim>,
        (plan, registry): PlannedOn,
    ) -> Result<(Result<(), StoreError>, usize), ServiceError> {
        // Uncontended (the job is new); a worker that takes the job waits for it.
        let _turn = live.writes.lock().await;
        let record = live.snapshot();
        let id = record.id.clone();
        // The job holds its account's minimum price from here until it
        // leaves the live set (charged by then if it ran).
        match self.queue.join(&id, live.clone(), |account, unfinished| self.accounts.admits(account, unfinished)) {
            Ok(()) => {}
            Err(NotJoined::Taken) => {
                return Err(ServiceError::InvalidRequest(format!("a job with id {} already exists", crate::store::public_job_id(&id))));
            }
            Err(NotJoined::NoFunds) => return Err(ServiceError::InsufficientCredits),
        }
        // An account disabled meanwhile queues nothing, nor is billed for a
        // demo job (checked after the job joined the live set: a disable
        // either sees it there and cancels it, or is seen here).
        if self.accounts.is_disabled(owner) || self.accounts.is_disabled(&self.billed_owner(owner, deployment)) {
            self.queue.leave(&id);
            return Err(ServiceError::AccountDisabled);
        }
        let key = fair::sched_key(owner, deployment);
        let limits = self.limits_for(&key);
        let Ok(position) = self.queue.waiting().push(&key, owner, id.clone(), front, limits.max_queued) else {
            self.queue.leave(&id);
            return Err(queue_full(limits));
        };
        slot.keep();
        // Before the worker can start it (it waits for this turn), so the
        // queue change precedes the job's own messages.
        self.publish_queue(owner);
        let written = if self.cluster.is_some() {
            // Checked again where hosts share the store, across all of them
            // (one host's memory already checked everything): the server's
            // queue bound, and with accounts the billed account and the key's bound.
            let server = || ServerBound { max_queued: self.opts.max_queued_jobs, queued_here: self.queue.waiting().queued() };
            if self.opts.mode.has_accounts() {
                // An owner that is no account has no balance to check.
                let billed = live.billed.as_deref().map(|account| Billing { account, pricing: self.accounts.pricing() });
                let _turn = self.admission_turns.take(&key).await;
                let server = server();
                let mut waiting_here = self.queue.waiting().waiting_of(&key);
                waiting_here.retain(|other| *other != id);
                let bound = KeyBound { key: &key, max_queued: limits.max_queued, waiting_here: &waiting_here };
                self.meta.submit_admitted(&record, workflow, claim, Admission { billed, key: Some(bound), server }).await
            } else {
                self.meta.submit_admitted(&record, workflow, claim, Admission { billed: None, key: None, server: server() }).await
            }
        } else {
            self.meta.submit(&record, workflow, claim).await
        };
        // Other hosts count the queue from the store: told again once the
        // row is there (the first announcement may be counted before it).
        if let Some(counts) = &self.queue_counts {
            counts.changed_here(owner);
        }
        match &written {
            // Committed (durable or not): the job exists, so it runs. Kept
            // parsed for the worker while the queued jobs' share allows;
            // otherwise dropped here and parsed again at start. The plan
            // holds at most the tree's constants; the text is what nodes
            // read as `prompt`.
            Ok(()) | Err(StoreError::NotDurable(_)) => {
                // (Where hosts share the store, the write held its inputs'
                // blobs there while it is unfinished: see `blob_gc`.)
                let held = crate::workflow::cost::of_value(workflow).tree_bytes();
                if let Some(permit) = self.queued_parsed.try_enter(held) {
                    let text = Arc::from(workflow.to_string());
                    *live.prepared.lock() = Some(live::Prepared { text, plan, registry, _held: permit });
                }
            }
            // Not written: a worker that took it meanwhile finds it no
            // longer queued.
            Err(_) => {
                // (Queued in this turn: the move is always allowed.)
                if let Err(bug) = live.record.lock().transition(JobStatus::Canceled, now_micros()) {
                    tracing::error!(job_id = %id, %bug, "cannot mark an unwritten submission");
                }
            }
        }
        Ok((written, position))
    }

    /// The store key of a new job of `owner` with the client-chosen id
    /// `chosen`: the id itself, or, when another owner's job holds it, the
    /// owner-scoped key (`store::scoped_job_key`), so the answer is the one
    /// an unused id gets. The owner's own job under either is a reuse (400;
    /// checked again, atomically, when the job joins the live set).
    async fn key_for_chosen_id(&self, owner: &str, chosen: &str) -> Result<String, ServiceError> {
        let exists = || ServiceError::InvalidRequest(format!("a job with id {chosen} already exists"));
        let scoped = crate::store::scoped_job_key(owner, chosen);
        match self.owner_at(chosen).await? {
            Some(holder) if holder == owner => Err(exists()),
            _ if self.owner_at(&scoped).await?.is_some() => Err(exists()),
            Some(_) => Ok(scoped),
            None => Ok(chosen.to_string()),
        }
    }

    /// The owner of the job stored under `key`, if any.
    async fn owner_at(&self, key: &str) -> Result<Option<String>, ServiceError> {
        if let Some(live) = self.live_job(key) {
            return Ok(Some(live.owner.to_string()));
        }
        Ok(self.meta.get_job(key).await?.map(|r| r.owner))
    }

    /// Takes back a job whose submission was not written (already marked
    /// so that a worker that took it meanwhile skips it).
    fn withdraw(&self, id: &str) {
        self.queue.waiting().withdraw(id);
        let removed = self.queue.leave(id);
        if let Some(job) = removed {
            self.publish_queue(&job.owner);
        }
    }
}
