//! Blob holds where hosts share the database: what keeps one host's
//! collection pass from deleting a blob another host has written (or is
//! about to reuse) and no asset record names yet. A hold is a row
//! (`blob_holds`: blob, claimant, holding host) written in a transaction
//! that takes the blob's advisory lock shared; a pass takes that lock
//! exclusively on a connection of its own ([`PgDatabase::lock_blob`]) while
//! it checks and deletes the blob. So a hold either lands before the pass
//! looks (the blob is kept) or after the pass has deleted it (its writer,
//! who checks afterwards, stores it again).

use super::{AdvisoryLock, PgDatabase, advisory_key, backend};
use crate::store::{BlobLock, StoreError};

/// Whether hold `h` is live: its claimant is a job not finished, or an
/// upload of a host still registered.
const LIVE: &str = "EXISTS (SELECT 1 FROM jobs j WHERE j.id = h.claimant AND j.status IN ('queued', 'running', 'canceling')) \
     OR (h.claimant LIKE 'upload:%' AND EXISTS (SELECT 1 FROM hosts o WHERE o.holder = h.holder))";

/// The advisory lock of blob `name`.
fn blob_key(name: &str) -> i64 {
    advisory_key(&format!("kiln: blob {name}"))
}

/// Holds `names` for `claimant` by `holder` in transaction `tx` (the
/// blobs' advisory locks taken shared until it ends).
pub(super) async fn hold_in(tx: &mut sqlx::PgConnection, names: &[String], claimant: &str, holder: &str) -> Result<(), StoreError> {
    let mut keys: Vec<i64> = names.iter().map(|n| blob_key(n)).collect();
    // One order for every holder (shared locks never wait on each other,
    // but a pass's exclusive request queues between them).
    keys.sort_unstable();
    keys.dedup();
    sqlx::query("SELECT pg_advisory_xact_lock_shared(k) FROM unnest($1::bigint[]) AS k").bind(&keys).execute(&mut *tx).await.map_err(backend)?;
    sqlx::query("INSERT INTO blob_holds (hash, claimant, holder) SELECT n, $2, $3 FROM unnest($1::text[]) AS n ON CONFLICT DO NOTHING")
        .bind(names)
        .bind(claimant)
        .bind(holder)
        .execute(&mut *tx)
        .await
        .map_err(backend)?;
    Ok(())
}

impl PgDatabase {
    /// Holds `names` for `claimant` by this host (see the module doc).
    pub(super) async fn hold_blobs(&self, names: &[String], claimant: &str) -> Result<(), StoreError> {
        let (names, claimant, me) = (names.to_vec(), claimant.to_string(), self.holder().to_string());
        self.run(move |pool| Box::pin(async move { in_transaction!(pool, |tx| hold_in(tx, &names, &claimant, &me).await) })).await
    }

    pub(super) async fn release_blobs(&self, claimant: &str) -> Result<(), StoreError> {
        let claimant = claimant.to_string();
        self.run(move |pool| {
            Box::pin(async move {
                sqlx::query("DELETE FROM blob_holds WHERE claimant = $1").bind(&claimant).execute(&pool).await.map_err(backend)?;
                Ok(())
            })
        })
        .await
    }

    /// Locks blob `name` exclusively on a connection kept until the lock is
    /// dropped, and reads whether a live claimant holds it; a blob whose
    /// hold is being written now is not locked and reads as held.
    pub(super) async fn lock_blob(&self, name: &str) -> Result<BlobLock, StoreError> {
        let (key, name, pool) = (blob_key(name), name.to_string(), self.pool.clone());
        let (conn, held) = self
            .runtime
            .run(async move {
                let mut conn = pool.acquire().await.map_err(backend)?;
                // Never waits: a hold being written now means held (a pass
                // waiting here would hold up its host's writes behind it).
                match sqlx::query_as::<_, (bool,)>("SELECT pg_try_advisory_lock($1)").bind(key).fetch_one(&mut *conn).await {
                    Ok((true,)) => {}
                    Ok((false,)) => return Ok((None, true)),
                    Err(e) => {
                        // Perhaps taken: the connection must not serve again.
                        conn.detach();
                        return Err(backend(e));
                    }
                }
                let live = format!("SELECT EXISTS (SELECT 1 FROM blob_holds h WHERE h.hash = $1 AND ({LIVE}))");
                match sqlx::query_as::<_, (bool,)>(&live).bind(&name).fetch_one(&mut *conn).await {
                    Ok((held,)) => Ok((Some(conn), held)),
                    Err(e) => {
                        // Closing the connection ends the lock.
                        conn.detach();
                        Err(backend(e))
                    }
                }
            })
            .await?;
        Ok(BlobLock { held, _lock: Box::new(AdvisoryLock { conn, key, runtime: self.runtime.clone() }) })
    }

    /// Deletes the holds whose claimant ended.
    pub(super) async fn prune_blob_holds(&self) -> Result<u64, StoreError> {
        self.run(|pool| {
            Box::pin(async move {
                let done = sqlx::query(&format!("DELETE FROM blob_holds h WHERE NOT ({LIVE})")).execute(&pool).await.map_err(backend)?;
                Ok(done.rows_affected())
            })
        })
        .await
    }
}
