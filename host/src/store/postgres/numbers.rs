//! [`SharedNumbers`] on PostgreSQL: submission numbers from the sequence
//! `job_numbers`, each owner's ComfyUI priority counter a row of
//! `prompt_counters`.

use super::{PgDatabase, backend};
use crate::store::StoreError;
use crate::store::cluster::SharedNumbers;

/// The highest submission number drawn so far (0 before the first).
pub(super) const LAST_DRAWN: &str = "SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END FROM job_numbers";

/// The numbers hosts share, in PostgreSQL.
pub struct PgNumbers {
    db: PgDatabase,
}

impl PgNumbers {
    pub fn new(db: PgDatabase) -> PgNumbers {
        PgNumbers { db }
    }
}

#[async_trait::async_trait]
impl SharedNumbers for PgNumbers {
    async fn draw_seqs(&self, n: u32) -> Result<Vec<u64>, StoreError> {
        let n = i32::try_from(n.max(1)).unwrap_or(i32::MAX);
        on_pool!(self, |pool| {
            // One draw per row: numbers other hosts drew at the same time
            // may fall between them.
            let rows: Vec<(i64,)> =
                sqlx::query_as("SELECT nextval('job_numbers') FROM generate_series(1, $1) ORDER BY 1").bind(n).fetch_all(&pool).await.map_err(backend)?;
            Ok(rows.into_iter().map(|(v,)| u64::try_from(v).unwrap_or(0)).collect())
        })
    }

    async fn next_prompt_number(&self, owner: &str) -> Result<i64, StoreError> {
        let owner = owner.to_string();
        on_pool!(self, |pool| {
            let (n,): (i64,) = sqlx::query_as(
                "INSERT INTO prompt_counters AS c (owner, next) VALUES ($1, 1) \
                 ON CONFLICT (owner) DO UPDATE SET next = c.next + 1 RETURNING c.next - 1",
            )
            .bind(owner)
            .fetch_one(&pool)
            .await
            .map_err(backend)?;
            Ok(n)
        })
    }
}
