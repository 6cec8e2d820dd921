//! [`SharedPlugins`] on PostgreSQL: table `plugins` (by scope and name)
//! and `plugin_components` (bytes by hash, deleted with the last plugin
//! naming them). Every write takes one advisory lock, so a scope's count
//! and a component's last reference are each read and changed by one
//! writer at a time (installs are rare), and announces the scope
//! (`Topic::Plugins`) in its own transaction.

use super::notices::announce;
use super::{PgDatabase, backend};
use crate::store::StoreError;
use crate::store::cluster::{Publish, Published, SharedPlugin, SharedPlugins, Topic};

/// Shared plugins in PostgreSQL.
pub struct PgPlugins {
    db: PgDatabase,
}

impl PgPlugins {
    pub fn new(db: PgDatabase) -> PgPlugins {
        PgPlugins { db }
    }
}

/// The lock every write of a shared plugin takes.
fn writes_lock() -> i64 {
    super::advisory_key("kiln: shared plugins")
}

/// Deletes component `hash` when no plugin names it any more.
async fn drop_unnamed(tx: &mut sqlx::PgConnection, hash: &str) -> Result<(), StoreError> {
    sqlx::query("DELETE FROM plugin_components WHERE hash = $1 AND NOT EXISTS (SELECT 1 FROM plugins WHERE component = $1)")
        .bind(hash)
        .execute(&mut *tx)
        .await
        .map_err(backend)?;
    Ok(())
}

type Row = (String, String, String, String);

fn plugin((scope, name, manifest, component): Row) -> SharedPlugin {
    SharedPlugin { scope, name, manifest, component }
}

#[async_trait::async_trait]
impl SharedPlugins for PgPlugins {
    async fn plugins(&self, scopes: Option<Vec<String>>) -> Result<Vec<SharedPlugin>, StoreError> {
        on_pool!(self, |pool| {
            let rows: Vec<Row> = match scopes {
                None => sqlx::query_as("SELECT scope, name, manifest, component FROM plugins ORDER BY scope, name").fetch_all(&pool).await,
                Some(scopes) => {
                    sqlx::query_as("SELECT scope, name, manifest, component FROM plugins WHERE scope = ANY($1) ORDER BY scope, name")
                        .bind(scopes)
                        .fetch_all(&pool)
                        .await
                }
            }
            .map_err(backend)?;
            Ok(rows.into_iter().map(plugin).collect())
        })
    }

    async fn publish(&self, plugin: &SharedPlugin, component: &[u8], how: Publish) -> Result<Published, StoreError> {
        if blake3::hash(component).to_hex().as_str() != plugin.component {
            return Err(StoreError::Backend(format!("plugin {}: the component's bytes do not hash to {}", plugin.name, plugin.component)));
        }
        let (plugin, bytes, me) = (plugin.clone(), component.to_vec(), self.db.holder().to_string());
        on_pool!(self, |pool| {
            in_transaction!(pool, |tx| {
                sqlx::query("SELECT pg_advisory_xact_lock($1)").bind(writes_lock()).execute(&mut *tx).await.map_err(backend)?;
                let before: Option<(String,)> = sqlx::query_as("SELECT component FROM plugins WHERE scope = $1 AND name = $2")
                    .bind(&plugin.scope)
                    .bind(&plugin.name)
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(backend)?;
                // Nothing to write (the transaction, and the lock every write
                // waits for, ends as the function returns).
                if before.is_some() && !how.replace {
                    return Ok(Published::Present);
                }
                if let Some(limit) = how.limit {
                    let (others,): (i64,) = sqlx::query_as("SELECT count(*) FROM plugins WHERE scope = $1 AND name <> $2")
                        .bind(&plugin.scope)
                        .bind(&plugin.name)
                        .fetch_one(&mut *tx)
                        .await
                        .map_err(backend)?;
                    if usize::try_from(others).unwrap_or(usize::MAX) >= limit {
                        return Ok(Published::Full);
                    }
                }
                sqlx::query("INSERT INTO plugin_components (hash, bytes) VALUES ($1, $2) ON CONFLICT (hash) DO NOTHING")
                    .bind(&plugin.component)
                    .bind(bytes)
                    .execute(&mut *tx)
                    .await
                    .map_err(backend)?;
                sqlx::query(
                    "INSERT INTO plugins (scope, name, manifest, component) VALUES ($1, $2, $3, $4) \
                 ON CONFLICT (scope, name) DO UPDATE SET manifest = $3, component = $4",
                )
                .bind(&plugin.scope)
                .bind(&plugin.name)
                .bind(&plugin.manifest)
                .bind(&plugin.component)
                .execute(&mut *tx)
                .await
                .map_err(backend)?;
                if let Some((old,)) = before.filter(|(old,)| *old != plugin.component) {
                    drop_unnamed(tx, &old).await?;
                }
                announce(&mut *tx, Topic::Plugins, &me, &plugin.scope).await?;
                Ok(Published::Done)
            })
        })
    }

    async fn withdraw(&self, scope: &str, name: &str) -> Result<bool, StoreError> {
        let (scope, name, me) = (scope.to_string(), name.to_string(), self.db.holder().to_string());
        on_pool!(self, |pool| {
            in_transaction!(pool, |tx| {
                sqlx::query("SELECT pg_advisory_xact_lock($1)").bind(writes_lock()).execute(&mut *tx).await.map_err(backend)?;
                let gone: Option<(String,)> = sqlx::query_as("DELETE FROM plugins WHERE scope = $1 AND name = $2 RETURNING component")
                    .bind(&scope)
                    .bind(&name)
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(backend)?;
                let Some((component,)) = gone else { return Ok(false) };
                drop_unnamed(tx, &component).await?;
                announce(&mut *tx, Topic::Plugins, &me, &scope).await?;
                Ok(true)
            })
        })
    }

    async fn component(&self, hash: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let hash = hash.to_string();
        on_pool!(self, |pool| {
            let row: Option<(Vec<u8>,)> =
                sqlx::query_as("SELECT bytes FROM plugin_components WHERE hash = $1").bind(hash).fetch_optional(&pool).await.map_err(backend)?;
            Ok(row.map(|(b,)| b))
        })
    }
}
