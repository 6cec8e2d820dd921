//! [`SessionStore`] on PostgreSQL (table `sessions`, indexed by owner and
//! by expiry): a session ended on one host opens nothing on any other.

use sqlx::Row;

use super::{PgDatabase, backend};
use crate::store::{Micros, SessionRecord, SessionStore, StoreError};

/// Sessions in PostgreSQL.
pub struct PgSessions {
    db: PgDatabase,
}

impl PgSessions {
    pub fn new(db: PgDatabase) -> PgSessions {
        PgSessions { db }
    }
}

fn session(row: &sqlx::postgres::PgRow) -> Result<(String, SessionRecord), StoreError> {
    let get = |e: sqlx::Error| StoreError::Corrupt(format!("session row: {e}"));
    Ok((
        row.try_get("id").map_err(get)?,
        SessionRecord {
            owner: row.try_get("owner").map_err(get)?,
            created_at: row.try_get("created_at").map_err(get)?,
            expires_at: row.try_get("expires_at").map_err(get)?,
        },
    ))
}

#[async_trait::async_trait]
impl SessionStore for PgSessions {
    async fn put(&self, id: &str, s: &SessionRecord) -> Result<(), StoreError> {
        let (id, s) = (id.to_string(), s.clone());
        on_pool!(self, |pool| {
            sqlx::query(
                "INSERT INTO sessions (id, owner, created_at, expires_at) VALUES ($1, $2, $3, $4) \
                         ON CONFLICT (id) DO UPDATE SET owner = $2, created_at = $3, expires_at = $4",
            )
            .bind(id)
            .bind(s.owner)
            .bind(s.created_at)
            .bind(s.expires_at)
            .execute(&pool)
            .await
            .map_err(backend)?;
            Ok(())
        })
    }

    async fn get(&self, id: &str) -> Result<Option<SessionRecord>, StoreError> {
        let id = id.to_string();
        on_pool!(self, |pool| {
            let row =
                sqlx::query("SELECT id, owner, created_at, expires_at FROM sessions WHERE id = $1").bind(id).fetch_optional(&pool).await.map_err(backend)?;
            Ok(row.as_ref().map(session).transpose()?.map(|(_, s)| s))
        })
    }

    async fn delete(&self, ids: &[String]) -> Result<(), StoreError> {
        let ids = ids.to_vec();
        on_pool!(self, |pool| {
            sqlx::query("DELETE FROM sessions WHERE id = ANY($1)").bind(ids).execute(&pool).await.map_err(backend)?;
            Ok(())
        })
    }

    async fn of_owner(&self, owner: &str, now: Micros) -> Result<(Vec<(String, SessionRecord)>, Vec<String>), StoreError> {
        let owner = owner.to_string();
        on_pool!(self, |pool| {
            let own = sqlx::query("SELECT id, owner, created_at, expires_at FROM sessions WHERE owner = $1 AND expires_at > $2")
                .bind(&owner)
                .bind(now)
                .fetch_all(&pool)
                .await
                .map_err(backend)?;
            // The expired ones, a bounded batch at a time.
            let expired: Vec<(String,)> =
                sqlx::query_as("SELECT id FROM sessions WHERE expires_at <= $1 LIMIT 1000").bind(now).fetch_all(&pool).await.map_err(backend)?;
            Ok((own.iter().map(session).collect::<Result<_, _>>()?, expired.into_iter().map(|(id,)| id).collect()))
        })
    }
}
