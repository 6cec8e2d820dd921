//! Records copied in from an embedded store (`kiln migrate`, see
//! `crate::migrate`): each written only where absent, so a copy stopped
//! part way and run again writes what is missing and nothing twice. An
//! unfinished job is written held by no host: the first host to look
//! takes it over (`HostLeases::adopt`) and recovers it as a restart would.

use futures_util::future::BoxFuture;

use super::meta::{enc, finished_changed, seq, status};
use super::{PgMeta, backend};
use crate::store::{AssetRecord, IdempotencyClaim, JobRecord, StoreError};

/// A job to copy in: its record and its workflow's bytes (JSON) when kept.
pub struct ImportedJob {
    pub job: JobRecord,
    pub workflow: Option<Vec<u8>>,
}

/// One row's insert, which writes nothing where the row exists.
type Insert<'a> = sqlx::query::Query<'a, sqlx::Postgres, sqlx::postgres::PgArguments>;

fn job_insert(new: &ImportedJob) -> Result<Insert<'_>, StoreError> {
    let ImportedJob { job, workflow } = new;
    Ok(sqlx::query(
        // An unfinished job is billed to its owner, as migration 0018 bills
        // those it finds; a public demo's (owner `demo/<id>`, no account)
        // holds nothing, and pays as its host says when it ends.
        "INSERT INTO jobs (id, owner, created_at, seq, status, expires_at, record, workflow, holder, sched_key, takeover_needs, movable, billed) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, NULL, $9, $10, $11, CASE WHEN $5 IN ('queued', 'running', 'canceling') AND $2 NOT LIKE 'demo/%' THEN $2 END) \
         ON CONFLICT (id) DO NOTHING",
    )
    .bind(&job.id)
    .bind(&job.owner)
    .bind(job.created_at)
    .bind(seq(job))
    .bind(status(job))
    .bind(job.expires_at)
    .bind(enc(job)?)
    .bind(workflow)
    .bind(job.sched_key())
    .bind(job.takeover_needs())
    .bind(job.movable()))
}

fn asset_insert(asset: &AssetRecord) -> Result<Insert<'_>, StoreError> {
    Ok(sqlx::query("INSERT INTO assets (id, hash, job_id, expires_at, tags, record) VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (id) DO NOTHING")
        .bind(&asset.id)
        .bind(&asset.hash)
        .bind(&asset.job_id)
        .bind(asset.expires_at)
        .bind(&asset.tags)
        .bind(enc(asset)?))
}

fn claim_insert(claim: &IdempotencyClaim) -> Result<Insert<'_>, StoreError> {
    Ok(sqlx::query("INSERT INTO claims (key, expires_at, record) VALUES ($1, $2, $3) ON CONFLICT (key) DO NOTHING")
        .bind(&claim.key)
        .bind(claim.expires_at)
        .bind(enc(claim)?))
}

/// What else a new row's transaction writes.
type After<T> = for<'c> fn(&'c mut sqlx::PgConnection, &T) -> BoxFuture<'c, Result<(), StoreError>>;

/// A finished job copied in is a change of its owner's history.
fn count_finished<'c>(tx: &'c mut sqlx::PgConnection, new: &ImportedJob) -> BoxFuture<'c, Result<(), StoreError>> {
    let finished = new.job.status.is_terminal().then(|| new.job.clone());
    Box::pin(async move {
        match finished {
            Some(job) => finished_changed(tx, &job).await,
            None => Ok(()),
        }
    })
}

fn nothing_more<'c, T>(_: &'c mut sqlx::PgConnection, _: &T) -> BoxFuture<'c, Result<(), StoreError>> {
    Box::pin(async { Ok(()) })
}

impl PgMeta {
    /// Writes each of `jobs` the database lacks, in one transaction (a
    /// finished one counted as its owner's change, see
    /// `MetaStore::finished_changes`), and raises the submission numbers
    /// above theirs (so a copy cut short leaves none to be drawn again);
    /// how many were new.
    pub async fn import_jobs(&self, jobs: Vec<ImportedJob>) -> Result<usize, StoreError> {
        let highest = jobs.iter().map(|j| j.job.seq).max();
        let new = self.insert_new(jobs, job_insert, count_finished).await?;
        if let Some(seq) = highest {
            self.raise_seq_bound(seq).await?;
        }
        Ok(new)
    }

    /// Writes each of `assets` the database lacks; how many were new.
    pub async fn import_assets(&self, assets: Vec<AssetRecord>) -> Result<usize, StoreError> {
        self.insert_new(assets, asset_insert, nothing_more).await
    }

    /// Writes each of `claims` the database lacks; how many were new.
    pub async fn import_claims(&self, claims: Vec<IdempotencyClaim>) -> Result<usize, StoreError> {
        self.insert_new(claims, claim_insert, nothing_more).await
    }

    /// Runs `insert` for each of `items` in one transaction, and `after`
    /// (in it) for each row that was new; how many were.
    async fn insert_new<T: Send + Sync + 'static>(
        &self,
        items: Vec<T>,
        insert: fn(&T) -> Result<Insert<'_>, StoreError>,
        after: After<T>,
    ) -> Result<usize, StoreError> {
        self.db
            .run(move |pool| {
                Box::pin(async move {
                    in_transaction!(pool, |tx| {
                        let mut new = 0;
                        for item in &items {
                            if insert(item)?.execute(&mut *tx).await.map_err(backend)?.rows_affected() == 1 {
                                after(tx, item).await?;
                                new += 1;
                            }
                        }
                        Ok(new)
                    })
                })
            })
            .await
    }

    /// Makes `id` the installation's id (what marks its bucket) while the
    /// database holds nothing yet; the id it has after.
    pub async fn adopt_installation(&self, id: &str) -> Result<String, StoreError> {
        let id = id.to_string();
        self.db
            .run(move |pool| {
                Box::pin(async move {
                    sqlx::query(
                        "UPDATE installation SET id = $1 WHERE NOT EXISTS (SELECT 1 FROM jobs) AND NOT EXISTS (SELECT 1 FROM assets) \
                         AND NOT EXISTS (SELECT 1 FROM accounts) AND NOT EXISTS (SELECT 1 FROM deployments) \
                         AND NOT EXISTS (SELECT 1 FROM hosts) AND NOT EXISTS (SELECT 1 FROM server_secrets)",
                    )
                    .bind(&id)
                    .execute(&pool)
                    .await
                    .map_err(backend)?;
                    let (now,): (String,) = sqlx::query_as("SELECT id FROM installation").fetch_one(&pool).await.map_err(backend)?;
                    Ok(now)
                })
            })
            .await
    }

    /// Raises the numbers new submissions draw above `seq` (the source's
    /// highest, deleted jobs' included). Not atomic with hosts drawing
    /// meanwhile: the copy runs before any host serves the database.
    pub async fn raise_seq_bound(&self, seq: u64) -> Result<(), StoreError> {
        let seq = i64::try_from(seq).unwrap_or(i64::MAX);
        self.db
            .run(move |pool| {
                Box::pin(async move {
                    sqlx::query(&format!("SELECT setval('job_numbers', $1) WHERE $1 > ({})", super::numbers::LAST_DRAWN))
                        .bind(seq)
                        .execute(&pool)
                        .await
                        .map_err(backend)?;
                    Ok(())
                })
            })
            .await
    }

    /// How many of `ids` the database holds, of `what`.
    pub async fn present(&self, what: Imported, ids: Vec<String>) -> Result<usize, StoreError> {
        let sql = match what {
            Imported::Jobs => "SELECT count(*) FROM jobs WHERE id = ANY($1)",
            Imported::Assets => "SELECT count(*) FROM assets WHERE id = ANY($1)",
            Imported::Claims => "SELECT count(*) FROM claims WHERE key = ANY($1)",
        };
        self.db
            .run(move |pool| {
                Box::pin(async move {
                    let (n,): (i64,) = sqlx::query_as(sql).bind(&ids).fetch_one(&pool).await.map_err(backend)?;
                    Ok(usize::try_from(n).unwrap_or(0))
                })
            })
            .await
    }
}

/// What [`PgMeta::present`] counts.
#[derive(Debug, Clone, Copy)]
pub enum Imported {
    Jobs,
    Assets,
    Claims,
}
