//! kiln's stores on PostgreSQL, for hosts that share one database: so far
//! the metadata store ([`PgMeta`]: jobs, assets, claims), the accounts
//! ([`PgAccounts`]) and the web sign-in sessions ([`PgSessions`]). Queries are checked at run time (no database at build
//! time); the schema is kiln's own migrations, embedded in the binary and
//! applied by [`PgDatabase::connect`] under sqlx's migration lock, so hosts
//! starting together apply each once.
//!
//! Every call runs on the runtime the pool was opened on (its connections
//! belong to that runtime's reactor), whichever thread awaits it: store
//! calls are also made from blocking threads through `store::wait`.

mod accounts;
mod meta;
mod sessions;

use std::borrow::Cow;

use sqlx::migrate::{Migration, MigrationSource, MigrationType, Migrator};
use sqlx::postgres::{PgPool, PgPoolOptions};

pub use accounts::PgAccounts;
pub use meta::PgMeta;
pub use sessions::PgSessions;

use super::StoreError;

/// The schema, in order (version, description, SQL).
const MIGRATIONS: &[(i64, &str, &str)] = &[
    (1, "accounts and sessions", include_str!("migrations/0001_accounts_and_sessions.sql")),
    (2, "jobs, assets and claims", include_str!("migrations/0002_jobs_assets_claims.sql")),
];

/// Most connections one host opens.
const MAX_CONNECTIONS: u32 = 16;

/// kiln's embedded migrations as sqlx's migration source.
#[derive(Debug)]
struct Embedded;

impl<'s> MigrationSource<'s> for Embedded {
    fn resolve(self) -> futures_util::future::BoxFuture<'s, Result<Vec<Migration>, sqlx::error::BoxDynError>> {
        Box::pin(async {
            Ok(MIGRATIONS.iter().map(|(v, d, sql)| Migration::new(*v, Cow::Borrowed(*d), MigrationType::Simple, Cow::Borrowed(*sql), false)).collect())
        })
    }
}

/// A connection pool to kiln's database, on the runtime it was opened on.
#[derive(Clone)]
pub struct PgDatabase {
    pool: PgPool,
    runtime: tokio::runtime::Handle,
}

pub(super) fn backend(e: impl std::fmt::Display) -> StoreError {
    StoreError::Backend(format!("postgres: {e}"))
}

impl PgDatabase {
    /// Connects to `url` (`postgres://…`) and applies the migrations this
    /// build has and the database lacks. On a tokio runtime.
    pub async fn connect(url: &str) -> Result<PgDatabase, StoreError> {
        let pool = PgPoolOptions::new().max_connections(MAX_CONNECTIONS).connect(url).await.map_err(backend)?;
        Migrator::new(Embedded).await.map_err(backend)?.run(&pool).await.map_err(backend)?;
        let runtime = tokio::runtime::Handle::try_current().map_err(backend)?;
        Ok(PgDatabase { pool, runtime })
    }

    /// Runs `call` on the pool's runtime and waits for it there.
    async fn run<T: Send + 'static>(
        &self,
        call: impl FnOnce(PgPool) -> futures_util::future::BoxFuture<'static, Result<T, StoreError>> + Send + 'static,
    ) -> Result<T, StoreError> {
        let pool = self.pool.clone();
        self.runtime.spawn(call(pool)).await.map_err(backend)?
    }

    /// The versions of the migrations applied (what `kiln doctor` shows).
    pub async fn applied(&self) -> Result<Vec<i64>, StoreError> {
        self.run(|pool| {
            Box::pin(async move {
                let rows: Vec<(i64,)> = sqlx::query_as("SELECT version FROM _sqlx_migrations ORDER BY version").fetch_all(&pool).await.map_err(backend)?;
                Ok(rows.into_iter().map(|(v,)| v).collect())
            })
        })
        .await
    }
}

#[cfg(test)]
pub(crate) mod test_db;
