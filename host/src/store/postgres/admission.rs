//! Admission where hosts share the database: the rules a new job is
//! admitted by (`store::Admission`: the billed account, its key's queue bound,
//! the server's) and a job's start by its key's running limit, each checked
//! in the transaction that writes the job, under the key's advisory lock;
//! and the end of a job billed to an account, charged in the transaction
//! that records it (until then the job holds the account's minimum) and
//! announced after it.

use sqlx::postgres::PgPool;

use super::DB_NOW;
use super::backend;
use super::meta::{Writer, upsert_job, write_finished};
use crate::accounts::Pricing;
use crate::store::cluster::Topic;
use crate::store::{Charged, CreditChange, JobRecord, Refusal, ServerBound, StoreError};

/// A new job's `store::Admission`, owned (to move onto the pool's runtime).
pub(super) struct Admit {
    /// The billed account and its prices.
    pub(super) billed: Option<(String, Pricing)>,
    /// The key, its bound and the ids of its jobs waiting on this host.
    pub(super) key: Option<(String, usize, Vec<String>)>,
    pub(super) server: ServerBound,
}

/// The advisory lock that admissions and starts of jobs of one scheduling
/// key take in turn (so two hosts never both take the last free place).
pub(super) fn admission_lock(key: &str) -> i64 {
    super::advisory_key(&format!("kiln: admit jobs of {key}"))
}

/// The advisory lock that admissions of jobs billed to `account` take in
/// turn (so two hosts never both spend the last of a balance).
fn billing_lock(account: &str) -> i64 {
    super::advisory_key(&format!("kiln: bill {account}"))
}

/// Checks `admit` in `tx` (before anything is written): the billed
/// account's state as committed now, its balance against its unfinished
/// jobs on every host (counted under the account's lock, held to the
/// commit, which writes the new job's `billed`); the key's jobs waiting: those other
/// hosts hold, and those of `me` still waiting here, as written, counted
/// under the key's lock (held to the commit, so two hosts never both take
/// the last place); the jobs waiting on other hosts against the server's
/// bound (see [`ServerBound`]).
pub(super) async fn admit(tx: &mut sqlx::PgConnection, admit: &Admit, me: &str) -> Result<(), StoreError> {
    let limit = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
    if let Some((key, _, _)) = &admit.key {
        sqlx::query("SELECT pg_advisory_xact_lock($1)").bind(admission_lock(key)).execute(&mut *tx).await.map_err(backend)?;
    }
    // Always after the key's lock (never the other way round: no two
    // admissions wait on each other).
    if let Some((account, _)) = &admit.billed {
        sqlx::query("SELECT pg_advisory_xact_lock($1)").bind(billing_lock(account)).execute(&mut *tx).await.map_err(backend)?;
    }
    let (key, max_key, waiting_here) = admit.key.clone().unwrap_or_default();
    let server_room = admit.server.max_queued.saturating_sub(admit.server.queued_here);
    let (credits, disabled, unfinished, waiting, elsewhere): (Option<i64>, Option<bool>, i64, i64, i64) = sqlx::query_as(
        "SELECT a.credits, a.disabled, \
         (SELECT count(*) FROM (SELECT 1 FROM jobs WHERE billed = $1 AND status IN ('queued', 'running', 'canceling') \
          LIMIT (SELECT greatest(credits / $8, 0) + 1 FROM accounts WHERE id = $1)) b), \
         (SELECT count(*) FROM (SELECT 1 FROM jobs WHERE $6 AND sched_key = $2 AND status = 'queued' \
          AND (holder IS DISTINCT FROM $4 OR id = ANY($5)) LIMIT $3) w), \
         (SELECT count(*) FROM (SELECT 1 FROM jobs WHERE status = 'queued' AND holder IS DISTINCT FROM $4 LIMIT $7) s) \
         FROM (SELECT 1) one LEFT JOIN accounts a ON a.id = $1",
    )
    .bind(admit.billed.as_ref().map(|(account, _)| account.as_str()))
    .bind(&key)
    .bind(limit(max_key))
    .bind(me)
    .bind(&waiting_here)
    .bind(admit.key.is_some())
    .bind(limit(server_room).saturating_add(1))
    // Counted only as far as the balance could cover (more refuses alike).
    .bind(admit.billed.as_ref().map_or(1, |(_, pricing)| i64::try_from(pricing.min_per_job.max(1)).unwrap_or(i64::MAX)))
    .fetch_one(&mut *tx)
    .await
    .map_err(backend)?;
    if let Some((_, pricing)) = &admit.billed {
        let unfinished = usize::try_from(unfinished).unwrap_or(usize::MAX);
        match credits.zip(disabled) {
            Some((_, true)) => return Err(StoreError::Refused(Refusal::AccountDisabled)),
            Some((credits, false)) if !pricing.admits(credits, unfinished) => return Err(StoreError::Refused(Refusal::NoFunds)),
            Some(_) => {}
            // An account removed from the database: nothing to bill.
            None => return Err(StoreError::Refused(Refusal::NoFunds)),
        }
    }
    if admit.key.is_some() && waiting >= limit(max_key) {
        return Err(StoreError::Refused(Refusal::QueueFull));
    }
    if elsewhere > limit(server_room) {
        return Err(StoreError::Refused(Refusal::ServerQueueFull));
    }
    Ok(())
}

/// Writes `job`'s start if its key `key` runs fewer than `max_running`
/// jobs on all hosts (see `MetaStore::start_admitted`).
pub(super) async fn start(pool: PgPool, job: JobRecord, key: String, max_running: usize, writer: Writer) -> Result<(), StoreError> {
    let max = i64::try_from(max_running).unwrap_or(i64::MAX);
    // Whether it started: a refused start is committed too (it waits first
    // from now on), a fenced one rolled back (see `in_transaction!`).
    let started = in_transaction!(pool, |tx| {
        // The key's admission lock: two hosts never both start the last
        // free place (the key's submissions take it too, briefly).
        sqlx::query("SELECT pg_advisory_xact_lock($1)").bind(admission_lock(&key)).execute(&mut *tx).await.map_err(backend)?;
        // Still this host's (an idle host may have taken it from the queue):
        // locked, so no host takes it while this start is decided.
        let held: Option<(Option<String>,)> =
            sqlx::query_as("SELECT holder FROM jobs WHERE id = $1 FOR UPDATE").bind(&job.id).fetch_optional(&mut *tx).await.map_err(backend)?;
        if matches!(&held, Some((holder,)) if holder.as_deref() != Some(writer.holder.as_str())) {
            return Err(StoreError::Fenced(format!("job {}", job.id)));
        }
        // Running on a registered host (a lapsed host's jobs count
        // again once taken over and started), and the key's older jobs
        // whose start was refused on other registered hosts: they go first.
        let (taken,): (i64,) = sqlx::query_as(
            "SELECT (SELECT count(*) FROM (SELECT 1 FROM jobs j WHERE sched_key = $1 AND status IN ('running', 'canceling') AND id <> $2 \
         AND EXISTS (SELECT 1 FROM hosts h WHERE h.holder = j.holder) LIMIT $3) r) \
         + (SELECT count(*) FROM (SELECT 1 FROM jobs j WHERE sched_key = $1 AND status = 'queued' AND start_wanted_at IS NOT NULL \
         AND (created_at, id) < ($4, $2) AND j.holder <> $5 AND EXISTS (SELECT 1 FROM hosts h WHERE h.holder = j.holder) LIMIT $3) w)",
        )
        .bind(&key)
        .bind(&job.id)
        .bind(max)
        .bind(job.created_at)
        .bind(&writer.holder)
        .fetch_one(&mut *tx)
        .await
        .map_err(backend)?;
        if taken >= max {
            // Kept queued; newer starts elsewhere wait for it from now on.
            sqlx::query(&format!("UPDATE jobs SET start_wanted_at = {DB_NOW} WHERE id = $1 AND holder = $2 AND status = 'queued' AND start_wanted_at IS NULL"))
                .bind(&job.id)
                .bind(&writer.holder)
                .execute(&mut *tx)
                .await
                .map_err(backend)?;
            return Ok(false);
        }
        // Counted under `key` from now on by every host's starts.
        upsert_job(&mut *tx, &job, None, (Some(&key), None), &writer).await?;
        Ok(true)
    })?;
    if started { Ok(()) } else { Err(StoreError::Refused(Refusal::RunningFull)) }
}

/// Writes finished `job` and charges `amount` to the account its admission
/// held (`jobs.billed`; `account` for a row from before that was recorded),
/// in one transaction, only if the row was unfinished until this write
/// (locked from that read to the commit): a retry after an unknown outcome
/// charges nothing twice (see `MetaStore::finish_job_charged`).
///
/// The other hosts hear of the payer's balance after the commit, in a
/// statement of its own, not in the transaction: a NOTIFY makes its commit
/// take PostgreSQL's one lock on the notification queue, and a transaction
/// that wrote rows keeps it through its commit's flush, which put every
/// billed job's end on every host in one line (BENCHMARKS.md, "What the
/// cluster's design choices cost"); a NOTIFY alone writes nothing to wait
/// for. A retry after a lost answer announces again (the first try may
/// have committed without announcing). Admissions and starts read the
/// balance from the row; a notice lost after the commit leaves the other
/// hosts' copies of it high, which the early 402 check and API nodes' funds
/// check read, until the account next changes.
pub(super) async fn finish_charged(pool: PgPool, job: JobRecord, writer: Writer, (account, amount): (String, i64)) -> Result<Charged, StoreError> {
    let (charged, payer) = ended_and_charged(&pool, &job, &writer, (account, amount)).await?;
    if let Some(payer) = payer
        && let Err(e) = super::notices::announce(&pool, Topic::Accounts, &writer.holder, &payer).await
    {
        tracing::warn!(job_id = %job.id, account = %payer, error = %e, "a charge is recorded, but the other hosts were not told; their copies of the balance are behind until the account next changes");
    }
    Ok(charged)
}

/// [`finish_charged`]'s transaction; with the account to announce (one
/// charged now, or by an earlier try of this end).
async fn ended_and_charged(pool: &PgPool, job: &JobRecord, writer: &Writer, (account, amount): (String, i64)) -> Result<(Charged, Option<String>), StoreError> {
    in_transaction!(pool, |tx| {
        let ending: Option<(bool, Option<String>)> =
            sqlx::query_as("SELECT status IN ('queued', 'running', 'canceling'), billed FROM jobs WHERE id = $1 FOR UPDATE")
                .bind(&job.id)
                .fetch_optional(&mut *tx)
                .await
                .map_err(backend)?;
        write_finished(tx, job, writer).await?;
        let (unfinished, payer) = match ending {
            Some((unfinished, billed)) => (unfinished, billed.unwrap_or(account)),
            None => return Ok((Charged::With(None), None)),
        };
        if !unfinished {
            return Ok((Charged::With(None), Some(payer)));
        }
        let change = super::accounts::credit_in(tx, &payer, amount.saturating_neg()).await?;
        let announced = matches!(change, CreditChange::Changed(_)).then_some(payer);
        Ok((Charged::With(Some(change)), announced))
    })
}
