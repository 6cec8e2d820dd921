//! [`MetaStore`] on PostgreSQL (tables `jobs`, `assets`, `claims`; each
//! row keeps its record as JSON beside the columns queries use). A
//! submission, its claim and its workflow commit in one transaction; a
//! claim is taken by one `INSERT … ON CONFLICT DO UPDATE … WHERE` the
//! holder's claim has expired, so two hosts submitting one key cannot both
//! win. Every commit is durable (the server's `synchronous_commit`), so
//! the flush and sync calls have nothing left to do. A listing's cursor is
//! the created time (8 bytes, big-endian) and id of the last job it showed,
//! as in the embedded store.

use serde::Serialize;
use serde::de::DeserializeOwned;
use sqlx::Row;
use sqlx::postgres::PgPool;

use super::{PgDatabase, backend};
use crate::store::{Admission, AssetRecord, Charge, Charged, IdempotencyClaim, JobFilter, JobPage, JobRecord, MetaStore, Micros, StoreError};

/// Rows a listing reads per query (its scan budget bounds the total).
const LIST_CHUNK: usize = 256;

/// Jobs, assets and claims in PostgreSQL.
pub struct PgMeta {
    pub(super) db: PgDatabase,
}

impl PgMeta {
    pub fn new(db: PgDatabase) -> PgMeta {
        PgMeta { db }
    }

    fn writer(&self) -> Writer {
        Writer { holder: self.db.holder().to_string(), registered: self.db.registered }
    }
}

pub(super) fn enc<T: Serialize>(value: &T) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(value).map_err(|e| StoreError::Backend(e.to_string()))
}

fn dec<T: DeserializeOwned>(what: &str, bytes: &[u8]) -> Result<T, StoreError> {
    serde_json::from_slice(bytes).map_err(|e| StoreError::Corrupt(format!("{what}: {e}")))
}

pub(super) fn status(job: &JobRecord) -> String {
    serde_json::to_value(job.status).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default()
}

/// Deletes the job `$1`, raising the submission numbers above its own.
const DELETE_JOB: &str = "WITH gone AS (DELETE FROM jobs WHERE id = $1 RETURNING seq) \
     SELECT setval('job_numbers', gone.seq) FROM gone, job_numbers \
     WHERE gone.seq > CASE WHEN job_numbers.is_called THEN job_numbers.last_value ELSE job_numbers.last_value - 1 END";

pub(super) fn seq(job: &JobRecord) -> i64 {
    i64::try_from(job.seq).unwrap_or(i64::MAX)
}

/// The cursor after `job`: its created time and id.
fn cursor_of(job: &JobRecord) -> Vec<u8> {
    let mut k = job.created_at.to_be_bytes().to_vec();
    k.extend_from_slice(job.id.as_bytes());
    k
}

fn parse_cursor(cursor: &[u8]) -> Option<(i64, String)> {
    let (time, id) = cursor.split_at_checked(8)?;
    Some((i64::from_be_bytes(time.try_into().ok()?), String::from_utf8(id.to_vec()).ok()?))
}

pub(super) fn records<T: DeserializeOwned>(what: &str, rows: &[sqlx::postgres::PgRow]) -> Result<Vec<T>, StoreError> {
    rows.iter().map(|r| record(what, r)).collect()
}

/// The record (column `record`) of one row.
pub(super) fn record<T: DeserializeOwned>(what: &str, row: &sqlx::postgres::PgRow) -> Result<T, StoreError> {
    row.try_get::<Vec<u8>, _>("record").map_err(backend).and_then(|b| dec(what, &b))
}

/// Inserts or replaces a job's record (and its workflow when given) as
/// written by `writer`, under scheduling key `key` (the key admission
/// counted it under; `None`: the row's, or for a new row the record's own,
/// `JobRecord::sched_key`), billed to account `billed` (`None`: as the row
/// says): an unfinished record is held by it, a finished one
/// by no host. Refused ([`StoreError::Fenced`]) where the row is another
/// host's (this host's lease lapsed and that host took the job over), where
/// a finished row would become unfinished again or be replaced by anything
/// but a finished record, and, for a registered host, once its
/// registration is gone (a lapsed host must not touch even a finished job).
pub(super) async fn upsert_job<'e>(
    exec: impl sqlx::PgExecutor<'e>,
    job: &JobRecord,
    workflow: Option<&[u8]>,
    (key, billed): (Option<&str>, Option<&str>),
    writer: &Writer,
) -> Result<(), StoreError> {
    let finished = job.status.is_terminal();
    let held_by = (!finished).then_some(writer.holder.as_str());
    let written: Option<(i32,)> = sqlx::query_as(
        "INSERT INTO jobs (id, owner, created_at, seq, status, expires_at, record, workflow, holder, sched_key, takeover_needs, movable, billed) \
         SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, COALESCE($13, $16), $14, $15, $17 WHERE NOT $11 OR EXISTS (SELECT 1 FROM hosts WHERE holder = $10) \
         ON CONFLICT (id) DO UPDATE SET owner = $2, created_at = $3, seq = $4, status = $5, expires_at = $6, record = $7, \
         workflow = COALESCE($8, jobs.workflow), holder = $9, sched_key = COALESCE($13, jobs.sched_key, $16), takeover_needs = $14, movable = $15, \
         billed = COALESCE($17, jobs.billed) \
         WHERE jobs.holder = $10 OR (jobs.holder IS NULL AND $12 AND (NOT $11 OR jobs.status NOT IN ('queued', 'running', 'canceling'))) \
         RETURNING 1",
    )
    .bind(&job.id)
    .bind(&job.owner)
    .bind(job.created_at)
    .bind(seq(job))
    .bind(status(job))
    .bind(job.expires_at)
    .bind(enc(job)?)
    .bind(workflow)
    .bind(held_by)
    .bind(&writer.holder)
    .bind(writer.registered)
    .bind(finished)
    .bind(key)
    .bind(job.takeover_needs())
    .bind(job.movable())
    .bind(job.sched_key())
    .bind(billed)
    .fetch_optional(exec)
    .await
    .map_err(backend)?;
    written.map(|_| ()).ok_or_else(|| StoreError::Fenced(format!("job {}", job.id)))
}

/// `query` with an asset's columns bound as `$1`–`$6` (id, hash, job id,
/// expiry, tags, record).
/// An asset's row rewritten from its record (bound by [`bind_asset`]).
const UPDATE_ASSET: &str = "UPDATE assets SET hash = $2, job_id = $3, expires_at = $4, tags = $5, record = $6 WHERE id = $1 RETURNING 1";

fn bind_asset<'q, O>(
    query: sqlx::query::QueryAs<'q, sqlx::Postgres, O, sqlx::postgres::PgArguments>,
    asset: &'q AssetRecord,
) -> Result<sqlx::query::QueryAs<'q, sqlx::Postgres, O, sqlx::postgres::PgArguments>, StoreError> {
    Ok(query.bind(&asset.id).bind(&asset.hash).bind(&asset.job_id).bind(asset.expires_at).bind(&asset.tags).bind(enc(asset)?))
}

/// Who writes: this start's holder id, and whether it registered as one of
/// the hosts sharing the database (then only while its registration lasts).
pub(super) struct Writer {
    pub(super) holder: String,
    pub(super) registered: bool,
}

/// Writes finished `job` as `writer` in `tx` (see [`upsert_job`]), counted
/// as a change of its owner's history.
pub(super) async fn write_finished(tx: &mut sqlx::PgConnection, job: &JobRecord, writer: &Writer) -> Result<(), StoreError> {
    upsert_job(&mut *tx, job, None, (None, None), writer).await?;
    finished_changed(&mut *tx, job).await
}

/// Counts a write or deletion of `job` when it is finished (see
/// `MetaStore::finished_changes`), in the transaction that makes it.
pub(super) async fn finished_changed<'e>(exec: impl sqlx::PgExecutor<'e>, job: &JobRecord) -> Result<(), StoreError> {
    if job.status.is_terminal() {
        sqlx::query("INSERT INTO finished_changes (owner, n) VALUES ($1, 1) ON CONFLICT (owner) DO UPDATE SET n = finished_changes.n + 1")
            .bind(job.owner.as_str())
            .execute(exec)
            .await
            .map_err(backend)?;
    }
    Ok(())
}

async fn submit(
    pool: PgPool,
    job: JobRecord,
    workflow: Vec<u8>,
    claim: Option<IdempotencyClaim>,
    admission: Option<super::admission::Admit>,
    writer: Writer,
) -> Result<(), StoreError> {
    in_transaction!(pool, |tx| {
        // Where hosts share the store, its inputs are held while it is
        // unfinished (see `blob_holds`), from this very step; first, so the
        // key's admission lock is never held while a collection pass has one
        // of these blobs locked.
        if writer.registered && !job.status.is_terminal() && !job.inputs.is_empty() {
            let names: Vec<String> = job.inputs.iter().map(|i| i.hash.clone()).collect();
            super::blob_holds::hold_in(tx, &names, &job.id, &writer.holder).await?;
        }
        if let Some(a) = &admission {
            super::admission::admit(tx, a, &writer.holder).await?;
        }
        if let Some(claim) = &claim {
            // Taken when free, or when the holder's claim has expired by now.
            let taken = sqlx::query(
                "INSERT INTO claims (key, expires_at, record) VALUES ($1, $2, $3) \
                 ON CONFLICT (key) DO UPDATE SET expires_at = $2, record = $3 WHERE claims.expires_at <= $4 RETURNING key",
            )
            .bind(&claim.key)
            .bind(claim.expires_at)
            .bind(enc(claim)?)
            .bind(claim.claimed_at)
            .fetch_optional(&mut *tx)
            .await
            .map_err(backend)?;
            if taken.is_none() {
                return Err(StoreError::KeyClaimed);
            }
        }
        let key = admission.as_ref().and_then(|a| a.key.as_ref()).map(|(key, _, _)| key.as_str());
        let billed = admission.as_ref().and_then(|a| a.billed.as_ref()).map(|(account, _)| account.as_str());
        upsert_job(&mut *tx, &job, Some(&workflow), (key, billed), &writer).await?;
        // (A refused submission is rolled back at once, releasing the
        // key's admission lock.)
        finished_changed(&mut *tx, &job).await
    })
}

/// Up to `chunk` job records (JSON) of `owner` (everyone's: `None`)
/// before `after` (created time, id), newest first.
async fn chunk(pool: PgPool, owner: Option<String>, after: Option<(i64, String)>, chunk: usize) -> Result<Vec<Vec<u8>>, StoreError> {
    let (time, id) = after.clone().unwrap_or((i64::MAX, String::new()));
    // Before the cursor: an older time, or the same time and a smaller id
    // (no cursor: everything).
    let rows: Vec<(Vec<u8>,)> = sqlx::query_as(
        "SELECT record FROM jobs WHERE ($1::text IS NULL OR owner = $1) \
         AND ($4 OR created_at < $2 OR (created_at = $2 AND id < $3)) \
         ORDER BY created_at DESC, id DESC LIMIT $5",
    )
    .bind(owner)
    .bind(time)
    .bind(id)
    .bind(after.is_none())
    .bind(i64::try_from(chunk).unwrap_or(i64::MAX))
    .fetch_all(&pool)
    .await
    .map_err(backend)?;
    Ok(rows.into_iter().map(|(r,)| r).collect())
}

impl PgMeta {
    /// One page of a listing (see [`MetaStore::list_jobs`]): chunks read on
    /// the pool's runtime, the filter (which borrows from the caller)
    /// applied here.
    async fn list(&self, owner: Option<&str>, cursor: Option<&[u8]>, limit: usize, max_scanned: usize, keep: &JobFilter<'_>) -> Result<JobPage, StoreError> {
        let mut after = match cursor {
            Some(c) => Some(parse_cursor(c).ok_or_else(|| StoreError::Backend("not a listing cursor".into()))?),
            None => None,
        };
        let (mut jobs, mut scanned) = (Vec::new(), 0usize);
        loop {
            let size = LIST_CHUNK.min(max_scanned.saturating_sub(scanned)).max(1);
            let (who, from) = (owner.map(str::to_string), after.clone());
            let rows = on_pool!(self, |pool| chunk(pool, who, from, size).await)?;
            let got = rows.len();
            for bytes in rows {
                let mut job: JobRecord = dec("job", &bytes)?;
                if keep(&job) {
                    if jobs.len() == limit {
                        let next = jobs.last().map(cursor_of);
                        return Ok(JobPage { jobs, next });
                    }
                    job.logs = None;
                    jobs.push(job.clone());
                }
                scanned += 1;
                after = Some((job.created_at, job.id.clone()));
                if scanned >= max_scanned {
                    return Ok(JobPage { jobs, next: Some(cursor_of(&job)) });
                }
            }
            if got < size {
                return Ok(JobPage { jobs, next: None });
            }
        }
    }
}

#[async_trait::async_trait]
impl MetaStore for PgMeta {
    async fn submit(&self, job: &JobRecord, workflow: &serde_json::Value, claim: Option<&IdempotencyClaim>) -> Result<(), StoreError> {
        let (job, workflow, claim, writer) = (job.clone(), enc(workflow)?, claim.cloned(), self.writer());
        on_pool!(self, |pool| submit(pool, job, workflow, claim, None, writer).await)
    }

    async fn submit_admitted(
        &self,
        job: &JobRecord,
        workflow: &serde_json::Value,
        claim: Option<&IdempotencyClaim>,
        admission: Admission<'_>,
    ) -> Result<(), StoreError> {
        let (job, workflow, claim, writer) = (job.clone(), enc(workflow)?, claim.cloned(), self.writer());
        let admission = super::admission::Admit {
            billed: admission.billed.map(|b| (b.account.to_string(), b.pricing)),
            key: admission.key.map(|k| (k.key.to_string(), k.max_queued, k.waiting_here.to_vec())),
            server: admission.server,
        };
        on_pool!(self, |pool| submit(pool, job, workflow, claim, Some(admission), writer).await)
    }

    async fn put_job(&self, job: &JobRecord) -> Result<(), StoreError> {
        let (job, writer) = (job.clone(), self.writer());
        if !job.status.is_terminal() {
            return on_pool!(self, |pool| upsert_job(&pool, &job, None, (None, None), &writer).await);
        }
        on_pool!(self, |pool| in_transaction!(pool, |tx| write_finished(tx, &job, &writer).await))
    }

    async fn finish_job_charged(&self, job: &JobRecord, _assets: &[AssetRecord], charge: Charge<'_>) -> Result<Charged, StoreError> {
        if !job.status.is_terminal() {
            return Err(StoreError::Backend(format!("job {} is not finished", job.id)));
        }
        let (job, writer, account, amount) = (job.clone(), self.writer(), charge.account.to_string(), charge.amount);
        on_pool!(self, |pool| super::admission::finish_charged(pool, job, writer, (account, amount)).await)
    }

    async fn start_admitted(&self, job: &JobRecord, key: &str, max_running: usize) -> Result<(), StoreError> {
        let (job, key, writer) = (job.clone(), key.to_string(), self.writer());
        on_pool!(self, |pool| super::admission::start(pool, job, key, max_running, writer).await)
    }

    async fn get_job(&self, id: &str) -> Result<Option<JobRecord>, StoreError> {
        let id = id.to_string();
        on_pool!(self, |pool| {
            let row = sqlx::query("SELECT record FROM jobs WHERE id = $1").bind(&id).fetch_optional(&pool).await.map_err(backend)?;
            Ok(records("job", row.as_slice())?.pop())
        })
    }

    async fn get_jobs(&self, ids: &[String]) -> Result<Vec<JobRecord>, StoreError> {
        let ids = ids.to_vec();
        on_pool!(self, |pool| {
            let rows =
                sqlx::query("SELECT j.record FROM unnest($1::text[]) WITH ORDINALITY AS wanted(id, n) JOIN jobs j ON j.id = wanted.id ORDER BY wanted.n")
                    .bind(&ids)
                    .fetch_all(&pool)
                    .await
                    .map_err(backend)?;
            records("job", &rows)
        })
    }

    async fn delete_job(&self, job: &JobRecord) -> Result<(), StoreError> {
        let job = job.clone();
        on_pool!(self, |pool| {
            in_transaction!(pool, |tx| {
                // The numbers stay above the deleted job's: a number drawn
                // from them always is (so nothing is set); one a writer chose
                // itself raises them.
                sqlx::query(DELETE_JOB).bind(&job.id).execute(&mut *tx).await.map_err(backend)?;
                finished_changed(&mut *tx, &job).await?;
                Ok(())
            })
        })
    }

    async fn get_workflow(&self, id: &str) -> Result<Option<serde_json::Value>, StoreError> {
        self.get_workflow_bytes(id).await?.map(|b| dec("workflow", &b)).transpose()
    }

    async fn list_jobs(
        &self,
        owner: Option<&str>,
        cursor: Option<&[u8]>,
        limit: usize,
        max_scanned: usize,
        keep: &JobFilter<'_>,
    ) -> Result<JobPage, StoreError> {
        self.list(owner, cursor, limit, max_scanned, keep).await
    }

    async fn get_workflow_bytes(&self, id: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let id = id.to_string();
        on_pool!(self, |pool| {
            let row: Option<(Option<Vec<u8>>,)> =
                sqlx::query_as("SELECT workflow FROM jobs WHERE id = $1").bind(&id).fetch_optional(&pool).await.map_err(backend)?;
            Ok(row.and_then(|(w,)| w))
        })
    }

    async fn get_workflows_bytes(&self, ids: &[String], budget: usize) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        let (ids, budget) = (ids.to_vec(), i64::try_from(budget).unwrap_or(i64::MAX));
        on_pool!(self, |pool| {
            // Each row with the bytes of the rows before it: those that
            // start within the budget (always the first).
            let rows: Vec<(Option<Vec<u8>>,)> = sqlx::query_as(
                "SELECT workflow FROM (\
                   SELECT j.workflow, wanted.n, \
                     COALESCE(SUM(octet_length(j.workflow)) OVER (ORDER BY wanted.n ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS before \
                   FROM unnest($1::text[]) WITH ORDINALITY AS wanted(id, n) LEFT JOIN jobs j ON j.id = wanted.id\
                 ) t WHERE n = 1 OR before < $2 ORDER BY n",
            )
            .bind(&ids)
            .bind(budget)
            .fetch_all(&pool)
            .await
            .map_err(backend)?;
            Ok(rows.into_iter().map(|(w,)| w).collect())
        })
    }

    async fn unfinished_jobs(&self) -> Result<Vec<JobRecord>, StoreError> {
        on_pool!(self, |pool| {
            let rows = sqlx::query("SELECT record FROM jobs WHERE status IN ('queued', 'running', 'canceling') ORDER BY seq")
                .fetch_all(&pool)
                .await
                .map_err(backend)?;
            records("job", &rows)
        })
    }

    async fn unfinished_elsewhere(&self, owner: &str, limit: usize) -> Result<Vec<JobRecord>, StoreError> {
        let (owner, limit, me) = (owner.to_string(), i64::try_from(limit).unwrap_or(i64::MAX), self.writer().holder);
        on_pool!(self, |pool| {
            let rows = sqlx::query(
                "SELECT record FROM jobs WHERE owner = $1 AND status IN ('queued', 'running', 'canceling') \
                 AND holder IS DISTINCT FROM $3 ORDER BY seq, created_at LIMIT $2",
            )
            .bind(owner)
            .bind(limit)
            .bind(me)
            .fetch_all(&pool)
            .await
            .map_err(backend)?;
            records("job", &rows)
        })
    }

    async fn unfinished_count_elsewhere(&self, owner: &str) -> Result<usize, StoreError> {
        let (owner, me) = (owner.to_string(), self.writer().holder);
        on_pool!(self, |pool| {
            let (n,): (i64,) =
                sqlx::query_as("SELECT count(*) FROM jobs WHERE owner = $1 AND status IN ('queued', 'running', 'canceling') AND holder IS DISTINCT FROM $2")
                    .bind(owner)
                    .bind(me)
                    .fetch_one(&pool)
                    .await
                    .map_err(backend)?;
            Ok(usize::try_from(n).unwrap_or(0))
        })
    }

    async fn max_seq(&self) -> Result<u64, StoreError> {
        on_pool!(self, |pool| {
            let (max,): (Option<i64>,) = sqlx::query_as(&format!("SELECT GREATEST((SELECT MAX(seq) FROM jobs), ({}))", super::numbers::LAST_DRAWN))
                .fetch_one(&pool)
                .await
                .map_err(backend)?;
            Ok(u64::try_from(max.unwrap_or(0)).unwrap_or(0))
        })
    }

    async fn jobs_due(&self, now: Micros, purge_before: Micros, limit: usize) -> Result<Vec<JobRecord>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        on_pool!(self, |pool| {
            let rows = sqlx::query(
                "(SELECT record, expires_at FROM jobs WHERE status <> 'expired' AND expires_at <= $1 ORDER BY expires_at LIMIT $3) \
                 UNION ALL (SELECT record, expires_at FROM jobs WHERE status = 'expired' AND expires_at <= $2 ORDER BY expires_at LIMIT $3)",
            )
            .bind(now)
            .bind(purge_before)
            .bind(limit)
            .fetch_all(&pool)
            .await
            .map_err(backend)?;
            records("job", &rows)
        })
    }

    async fn put_asset(&self, asset: &AssetRecord) -> Result<(), StoreError> {
        let (asset, writer) = (asset.clone(), self.writer());
        on_pool!(self, |pool| {
            // A registered host records an asset only while registered: one
            // whose lease lapsed mid-upload (its upload's hold ended with its
            // registration, so the blob may have been collected) is refused.
            let written: Option<(i32,)> = bind_asset(
                sqlx::query_as(
                    "INSERT INTO assets (id, hash, job_id, expires_at, tags, record) SELECT $1, $2, $3, $4, $5, $6 \
                     WHERE NOT $8 OR EXISTS (SELECT 1 FROM hosts WHERE holder = $7) \
                     ON CONFLICT (id) DO UPDATE SET hash = $2, job_id = $3, expires_at = $4, tags = $5, record = $6 RETURNING 1",
                ),
                &asset,
            )?
            .bind(&writer.holder)
            .bind(writer.registered)
            .fetch_optional(&pool)
            .await
            .map_err(backend)?;
            written.map(|_| ()).ok_or_else(|| StoreError::Fenced(format!("asset {}: this host's lease lapsed", asset.id)))
        })
    }

    async fn update_asset(&self, asset: &AssetRecord) -> Result<bool, StoreError> {
        let asset = asset.clone();
        on_pool!(self, |pool| {
            // (No registration check: the record it replaces already keeps
            // its blob from collection.)
            let update = sqlx::query_as(UPDATE_ASSET);
            let written: Option<(i32,)> = bind_asset(update, &asset)?.fetch_optional(&pool).await.map_err(backend)?;
            Ok(written.is_some())
        })
    }

    async fn change_asset(&self, id: &str, change: crate::store::AssetChange) -> Result<Option<AssetRecord>, StoreError> {
        let id = id.to_string();
        on_pool!(self, |pool| {
            // The row locked from the read to the write: no other write of
            // it comes between.
            in_transaction!(pool, |tx| {
                let row = sqlx::query("SELECT record FROM assets WHERE id = $1 FOR UPDATE").bind(&id).fetch_optional(&mut *tx).await.map_err(backend)?;
                let (old, new) = match records::<AssetRecord>("asset", row.as_slice())?.pop() {
                    Some(old) => {
                        let new = change(&old);
                        (Some(old), new)
                    }
                    None => (None, None),
                };
                // Nothing to write: the row's lock ends with the transaction.
                let Some(new) = new else { return Ok(old) };
                let update = sqlx::query_as::<_, (i32,)>(UPDATE_ASSET);
                bind_asset(update, &new)?.fetch_optional(&mut *tx).await.map_err(backend)?;
                Ok(Some(new))
            })
        })
    }

    async fn get_asset(&self, id: &str) -> Result<Option<AssetRecord>, StoreError> {
        let id = id.to_string();
        on_pool!(self, |pool| {
            let row = sqlx::query("SELECT record FROM assets WHERE id = $1").bind(&id).fetch_optional(&pool).await.map_err(backend)?;
            Ok(records("asset", row.as_slice())?.pop())
        })
    }

    async fn delete_asset(&self, asset: &AssetRecord) -> Result<(), StoreError> {
        let id = asset.id.clone();
        on_pool!(self, |pool| {
            sqlx::query("DELETE FROM assets WHERE id = $1").bind(id).execute(&pool).await.map_err(backend)?;
            Ok(())
        })
    }

    async fn delete_expired_upload(&self, asset: &AssetRecord, now: Micros) -> Result<Option<AssetRecord>, StoreError> {
        let id = asset.id.clone();
        on_pool!(self, |pool| {
            // The row's own columns decide, as they stand when it is deleted.
            let row = sqlx::query("DELETE FROM assets WHERE id = $1 AND job_id IS NULL AND expires_at <= $2 RETURNING record")
                .bind(id)
                .bind(now)
                .fetch_optional(&pool)
                .await
                .map_err(backend)?;
            Ok(records("asset", row.as_slice())?.pop())
        })
    }

    async fn assets_with_hash(&self, hash: &str) -> Result<Vec<AssetRecord>, StoreError> {
        let hash = hash.to_string();
        on_pool!(self, |pool| {
            let rows = sqlx::query("SELECT record FROM assets WHERE hash = $1 ORDER BY id").bind(&hash).fetch_all(&pool).await.map_err(backend)?;
            records("asset", &rows)
        })
    }

    async fn assets_of_job(&self, job_id: &str) -> Result<Vec<AssetRecord>, StoreError> {
        let job_id = job_id.to_string();
        on_pool!(self, |pool| {
            let rows = sqlx::query("SELECT record FROM assets WHERE job_id = $1 ORDER BY id").bind(&job_id).fetch_all(&pool).await.map_err(backend)?;
            records("asset", &rows)
        })
    }

    async fn uploads_due(&self, now: Micros, limit: usize) -> Result<Vec<AssetRecord>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        on_pool!(self, |pool| {
            let rows = sqlx::query("SELECT record FROM assets WHERE job_id IS NULL AND expires_at <= $1 ORDER BY expires_at, id LIMIT $2")
                .bind(now)
                .bind(limit)
                .fetch_all(&pool)
                .await
                .map_err(backend)?;
            records("asset", &rows)
        })
    }

    async fn assets_tagged(&self, prefix: &str) -> Result<Vec<AssetRecord>, StoreError> {
        let prefix = prefix.to_string();
        on_pool!(self, |pool| {
            let rows = sqlx::query("SELECT record FROM assets WHERE EXISTS (SELECT 1 FROM unnest(tags) AS t WHERE starts_with(t, $1)) ORDER BY id")
                .bind(&prefix)
                .fetch_all(&pool)
                .await
                .map_err(backend)?;
            records("asset", &rows)
        })
    }

    async fn get_claim(&self, key: &str) -> Result<Option<IdempotencyClaim>, StoreError> {
        let key = key.to_string();
        on_pool!(self, |pool| {
            let row = sqlx::query("SELECT record FROM claims WHERE key = $1").bind(&key).fetch_optional(&pool).await.map_err(backend)?;
            Ok(records("claim", row.as_slice())?.pop())
        })
    }

    async fn purge_claims(&self, now: Micros) -> Result<usize, StoreError> {
        on_pool!(self, |pool| {
            let done = sqlx::query("DELETE FROM claims WHERE expires_at <= $1").bind(now).execute(&pool).await.map_err(backend)?;
            Ok(usize::try_from(done.rows_affected()).unwrap_or(usize::MAX))
        })
    }

    /// Every commit is already durable.
    async fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }

    async fn hold_blobs(&self, names: &[String], claimant: &str) -> Result<bool, StoreError> {
        self.db.hold_blobs(names, claimant).await.map(|()| true)
    }

    async fn release_blobs(&self, claimant: &str) -> Result<(), StoreError> {
        self.db.release_blobs(claimant).await
    }

    async fn lock_blob(&self, name: &str) -> Result<Option<crate::store::BlobLock>, StoreError> {
        self.db.lock_blob(name).await.map(Some)
    }

    async fn prune_blob_holds(&self) -> Result<u64, StoreError> {
        self.db.prune_blob_holds().await
    }

    async fn periodic_lease(&self, name: &str) -> Result<Option<crate::store::PeriodicLease>, StoreError> {
        self.db.advisory_lease(name).await
    }

    /// Rewrites this host's own `hosts` row as it is (a row version and
    /// its WAL, refused by a read-only database; no row is contended).
    async fn check_writable(&self) -> Result<(), StoreError> {
        let me = self.writer().holder;
        on_pool!(self, |pool| {
            sqlx::query("UPDATE hosts SET lease_until = lease_until WHERE holder = $1").bind(me).execute(&pool).await.map_err(backend)?;
            Ok(())
        })
    }

    async fn installation_id(&self) -> Result<String, StoreError> {
        on_pool!(self, |pool| {
            let (id,): (String,) = sqlx::query_as("SELECT id FROM installation").fetch_one(&pool).await.map_err(backend)?;
            Ok(id)
        })
    }

    async fn finished_changes(&self, owner: &str) -> Result<u64, StoreError> {
        let owner = owner.to_string();
        on_pool!(self, |pool| {
            let n: Option<(i64,)> =
                sqlx::query_as("SELECT n FROM finished_changes WHERE owner = $1").bind(&owner).fetch_optional(&pool).await.map_err(backend)?;
            Ok(n.map_or(0, |(n,)| n as u64))
        })
    }

    async fn close(&self) {
        // The accounts and sessions share this pool: the host stops them too.
        self.db.close().await;
    }
}
