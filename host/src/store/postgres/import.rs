//! Records copied in from an embedded store (`kiln migrate`, see
//! `crate::migrate`): each written only where absent, so a copy stopped
//! part way and run again writes what is missing and nothing twice. An
//! unfinished job is written held by no host: the first host to look
//! takes it over (`HostLeases::adopt`) and recovers it as a restart would.

use super::meta::{enc, finished_changed, seq, status};
use super::{PgMeta, backend};
use crate::store::{AssetRecord, IdempotencyClaim, JobRecord, StoreError};

/// A job to copy in: its record, its workflow's bytes (JSON) when kept,
/// and its scheduling key (what admission counts it under).
pub struct ImportedJob {
    pub job: JobRecord,
    pub workflow: Option<Vec<u8>>,
    pub sched_key: String,
}

impl PgMeta {
    /// Writes each of `jobs` the database lacks, in one transaction; how
    /// many were new.
    pub async fn import_jobs(&self, jobs: Vec<ImportedJob>) -> Result<usize, StoreError> {
        self.db
            .run(move |pool| {
                Box::pin(async move {
                    let mut tx = pool.begin().await.map_err(backend)?;
                    let mut new = 0;
                    for ImportedJob { job, workflow, sched_key } in &jobs {
                        let inserted = sqlx::query(
                            "INSERT INTO jobs (id, owner, created_at, seq, status, expires_at, record, workflow, holder, sched_key, takeover_needs) \
                             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, NULL, $9, $10) ON CONFLICT (id) DO NOTHING",
                        )
                        .bind(&job.id)
                        .bind(&job.owner)
                        .bind(job.created_at)
                        .bind(seq(job))
                        .bind(status(job))
                        .bind(job.expires_at)
                        .bind(enc(job)?)
                        .bind(workflow)
                        .bind(sched_key)
                        .bind(job.takeover_needs())
                        .execute(&mut *tx)
                        .await
                        .map_err(backend)?;
                        if inserted.rows_affected() == 1 {
                            finished_changed(&mut *tx, job).await?;
                            new += 1;
                        }
                    }
                    tx.commit().await.map_err(backend)?;
                    Ok(new)
                })
            })
            .await
    }

    /// Writes each of `assets` the database lacks; how many were new.
    pub async fn import_assets(&self, assets: Vec<AssetRecord>) -> Result<usize, StoreError> {
        self.db
            .run(move |pool| {
                Box::pin(async move {
                    let mut tx = pool.begin().await.map_err(backend)?;
                    let mut new = 0;
                    for asset in &assets {
                        let inserted = sqlx::query(
                            "INSERT INTO assets (id, hash, job_id, expires_at, tags, record) VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (id) DO NOTHING",
                        )
                        .bind(&asset.id)
                        .bind(&asset.hash)
                        .bind(&asset.job_id)
                        .bind(asset.expires_at)
                        .bind(&asset.tags)
                        .bind(enc(asset)?)
                        .execute(&mut *tx)
                        .await
                        .map_err(backend)?;
                        new += usize::from(inserted.rows_affected() == 1);
                    }
                    tx.commit().await.map_err(backend)?;
                    Ok(new)
                })
            })
            .await
    }

    /// Writes each of `claims` the database lacks; how many were new.
    pub async fn import_claims(&self, claims: Vec<IdempotencyClaim>) -> Result<usize, StoreError> {
        self.db
            .run(move |pool| {
                Box::pin(async move {
                    let mut tx = pool.begin().await.map_err(backend)?;
                    let mut new = 0;
                    for claim in &claims {
                        let inserted = sqlx::query("INSERT INTO claims (key, expires_at, record) VALUES ($1, $2, $3) ON CONFLICT (key) DO NOTHING")
                            .bind(&claim.key)
                            .bind(claim.expires_at)
                            .bind(enc(claim)?)
                            .execute(&mut *tx)
                            .await
                            .map_err(backend)?;
                        new += usize::from(inserted.rows_affected() == 1);
                    }
                    tx.commit().await.map_err(backend)?;
                    Ok(new)
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

    /// Raises the bound new queue numbers start above to at least `seq`
    /// (the source's highest, deleted jobs' included).
    pub async fn raise_seq_bound(&self, seq: u64) -> Result<(), StoreError> {
        let seq = i64::try_from(seq).unwrap_or(i64::MAX);
        self.db
            .run(move |pool| {
                Box::pin(async move {
                    sqlx::query("UPDATE seq_bound SET value = GREATEST(value, $1)").bind(seq).execute(&pool).await.map_err(backend)?;
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
