//! [`DeploymentStore`] on PostgreSQL: records in table `deployments`
//! (JSONB by id), bundles in table `bundles` (bytes by hash, written once),
//! so a deployment and its bundle outlive the host that created them.
//! Each write of a record announces its id to the other hosts
//! (`Topic::Deployments`) in its own transaction.

use super::notices::announce;
use super::{PgDatabase, backend};
use crate::store::cluster::Topic;
use crate::store::{DeploymentStore, StoreError};

/// Deployments in PostgreSQL.
pub struct PgDeployments {
    db: PgDatabase,
}

impl PgDeployments {
    pub fn new(db: PgDatabase) -> PgDeployments {
        PgDeployments { db }
    }
}

#[async_trait::async_trait]
impl DeploymentStore for PgDeployments {
    async fn all(&self) -> Result<Vec<serde_json::Value>, StoreError> {
        on_pool!(self, |pool| {
            let rows: Vec<(sqlx::types::Json<serde_json::Value>,)> =
                sqlx::query_as("SELECT record FROM deployments ORDER BY id").fetch_all(&pool).await.map_err(backend)?;
            Ok(rows.into_iter().map(|(r,)| r.0).collect())
        })
    }

    async fn get(&self, id: &str) -> Result<Option<serde_json::Value>, StoreError> {
        let id = id.to_string();
        on_pool!(self, |pool| {
            let row: Option<(sqlx::types::Json<serde_json::Value>,)> =
                sqlx::query_as("SELECT record FROM deployments WHERE id = $1").bind(id).fetch_optional(&pool).await.map_err(backend)?;
            Ok(row.map(|(r,)| r.0))
        })
    }

    async fn put(&self, id: &str, record: &serde_json::Value) -> Result<(), StoreError> {
        let (id, record, me) = (id.to_string(), record.clone(), self.db.holder().to_string());
        on_pool!(self, |pool| {
            in_transaction!(pool, |tx| {
                sqlx::query("INSERT INTO deployments (id, record) VALUES ($1, $2) ON CONFLICT (id) DO UPDATE SET record = $2")
                    .bind(&id)
                    .bind(sqlx::types::Json(record))
                    .execute(&mut *tx)
                    .await
                    .map_err(backend)?;
                announce(&mut *tx, Topic::Deployments, &me, &id).await
            })
        })
    }

    async fn delete(&self, id: &str) -> Result<(), StoreError> {
        let (id, me) = (id.to_string(), self.db.holder().to_string());
        on_pool!(self, |pool| {
            in_transaction!(pool, |tx| {
                sqlx::query("DELETE FROM deployments WHERE id = $1").bind(&id).execute(&mut *tx).await.map_err(backend)?;
                announce(&mut *tx, Topic::Deployments, &me, &id).await
            })
        })
    }

    async fn put_bundle(&self, hash: &str, bytes: &[u8]) -> Result<(), StoreError> {
        if !super::super::deployments::is_hash(hash) {
            return Err(StoreError::Backend(format!("{hash:?} is not a bundle hash")));
        }
        let (hash, bytes) = (hash.to_string(), bytes.to_vec());
        on_pool!(self, |pool| {
            sqlx::query("INSERT INTO bundles (hash, bytes) VALUES ($1, $2) ON CONFLICT (hash) DO NOTHING")
                .bind(hash)
                .bind(bytes)
                .execute(&pool)
                .await
                .map_err(backend)?;
            Ok(())
        })
    }

    async fn bundle(&self, hash: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let hash = hash.to_string();
        on_pool!(self, |pool| {
            let row: Option<(Vec<u8>,)> =
                sqlx::query_as("SELECT bytes FROM bundles WHERE hash = $1").bind(hash).fetch_optional(&pool).await.map_err(backend)?;
            Ok(row.map(|(b,)| b))
        })
    }
}
