//! kiln's stores on PostgreSQL, for hosts that share one database: so far
//! the metadata store ([`PgMeta`]: jobs, assets, claims), the accounts
//! ([`PgAccounts`]) and the web sign-in sessions ([`PgSessions`]). Queries are checked at run time (no database at build
//! time); the schema is kiln's own migrations, embedded in the binary and
//! applied by [`PgDatabase::connect`] under sqlx's migration lock, so hosts
//! starting together apply each once.
//!
//! Every call runs on the database's own runtime (two threads; the
//! connections belong to its reactor), whichever thread awaits it: store
//! calls are also made from blocking threads through `store::wait`, and a
//! caller that blocks its own runtime's threads that way (a current-thread
//! runtime has one) must not stall the calls it waits for.

/// Runs `body` with a pool connection on the database's runtime (see
/// [`PgDatabase::run`]) and awaits it: `on_pool!(self, |pool| { … })` in a
/// store holding `db: PgDatabase`.
macro_rules! on_pool {
    ($self:ident, |$pool:ident| $body:expr) => {
        $self.db.run(move |$pool| Box::pin(async move { $body })).await
    };
}

/// Runs `body` in a transaction of `pool`, with `tx` the transaction's
/// connection (`&mut PgConnection`), and ends it as `body` ends: committed
/// when it returns `Ok`, rolled back at once when it returns `Err` (a `?`
/// included). A dropped transaction would roll back only when its
/// connection is next used, its row and advisory locks held until then.
/// `in_transaction!(pool, |tx| { …; Ok(value) })`, in an async function
/// returning `Result<_, StoreError>`.
macro_rules! in_transaction {
    ($pool:expr, |$tx:ident| $body:expr) => {{
        let mut transaction = $pool.begin().await.map_err(crate::store::postgres::backend)?;
        let ended: Result<_, crate::store::StoreError> = async {
            let $tx: &mut sqlx::PgConnection = &mut transaction;
            $body
        }
        .await;
        match ended {
            Ok(value) => transaction.commit().await.map_err(crate::store::postgres::backend).map(|()| value),
            Err(e) => {
                // The error is the caller's news, not the rollback's.
                let _ = transaction.rollback().await;
                Err(e)
            }
        }
    }};
}

mod accounts;
mod admission;
mod blob_holds;
mod deployments;
mod hosts;
mod import;
mod meta;
mod notices;
mod numbers;
mod plugins;
mod secrets;
mod sessions;
mod user_files;

use std::borrow::Cow;

use sqlx::migrate::{Migration, MigrationSource, MigrationType, Migrator};
use sqlx::postgres::{PgPool, PgPoolOptions};

pub use accounts::PgAccounts;
pub use deployments::PgDeployments;
pub use hosts::PgHosts;
pub use import::{Imported, ImportedJob};
pub use meta::PgMeta;
pub use notices::PgNotices;
pub use numbers::PgNumbers;
pub use plugins::PgPlugins;
pub use sessions::PgSessions;
pub use user_files::PgUserFiles;

use super::StoreError;
use super::io_runtime::IoRuntime;

/// The schema, in order (version, description, SQL).
const MIGRATIONS: &[(i64, &str, &str)] = &[
    (1, "accounts and sessions", include_str!("migrations/0001_accounts_and_sessions.sql")),
    (2, "jobs, assets and claims", include_str!("migrations/0002_jobs_assets_claims.sql")),
    (3, "finished changes", include_str!("migrations/0003_finished_changes.sql")),
    (4, "installation", include_str!("migrations/0004_installation.sql")),
    (5, "deployments and bundles", include_str!("migrations/0005_deployments.sql")),
    (6, "server secrets", include_str!("migrations/0006_server_secrets.sql")),
    (7, "user files", include_str!("migrations/0007_user_files.sql")),
    (8, "hosts", include_str!("migrations/0008_hosts.sql")),
    (9, "admission", include_str!("migrations/0009_admission.sql")),
    (10, "takeover", include_str!("migrations/0010_takeover.sql")),
    (11, "running by key", include_str!("migrations/0011_running_by_key.sql")),
    (12, "blob holds", include_str!("migrations/0012_blob_holds.sql")),
    (13, "notice bodies", include_str!("migrations/0013_notice_bodies.sql")),
    (14, "held since", include_str!("migrations/0014_held_since.sql")),
    (15, "turns", include_str!("migrations/0015_turns.sql")),
    (16, "numbers", include_str!("migrations/0016_numbers.sql")),
    (17, "plugins", include_str!("migrations/0017_plugins.sql")),
    (18, "billed", include_str!("migrations/0018_billed.sql")),
];

/// How long an idle connection stays open.
const IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);
/// How long a call waits for a connection (every one busy, or the server
/// not answering) before it fails `Unavailable`: a client sees 500
/// `upstream_error` within this while the database is down.
const ACQUIRE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

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

/// Threads of the database's own runtime.
const THREADS: usize = 2;

/// A connection pool to kiln's database, on a runtime of its own.
#[derive(Clone)]
pub struct PgDatabase {
    pool: PgPool,
    runtime: std::sync::Arc<IoRuntime>,
    /// This start of this host (see `store::cluster::HostLeases::holder`):
    /// the holder its job writes name.
    holder: std::sync::Arc<str>,
    /// Whether this handle is a host registered among those sharing the
    /// database (see [`PgDatabase::as_host`]): its writes then count only
    /// while its registration lasts.
    registered: bool,
    /// Calls started and not yet ended (a caller that stopped waiting for
    /// one does not end it: [`PgDatabase::close`] lets them finish).
    in_flight: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

/// A failure of the database as the store's error: a connection that
/// cannot be made or was lost, or a server shutting down or starting, is
/// [`StoreError::Unavailable`] (worth retrying); anything else `Backend`.
pub(super) fn backend<E: std::fmt::Display + 'static>(e: E) -> StoreError {
    let unavailable = (&e as &dyn std::any::Any).downcast_ref::<sqlx::Error>().is_some_and(|e| match e {
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::Tls(_) => true,
        // SQLSTATE class 08: connection exception; 57P01–57P03: the server
        // is shutting down or cannot take connections yet.
        sqlx::Error::Database(db) => db.code().is_some_and(|c| c.starts_with("08") || matches!(&*c, "57P01" | "57P02" | "57P03")),
        _ => false,
    });
    if unavailable { StoreError::Unavailable(format!("postgres: {e}")) } else { StoreError::Backend(format!("postgres: {e}")) }
}

impl PgDatabase {
    /// Connects to `url` (`postgres://…`) with at most `max_connections`
    /// open, and applies the migrations this build has and the database
    /// lacks.
    pub async fn connect(url: &str, max_connections: u32) -> Result<PgDatabase, StoreError> {
        let runtime = IoRuntime::start("kiln-db", THREADS)?;
        let url = url.to_string();
        let pool = runtime
            .run(async move {
                let pool = PgPoolOptions::new()
                    .max_connections(max_connections.max(1))
                    .min_connections(0)
                    .idle_timeout(IDLE_TIMEOUT)
                    .acquire_timeout(ACQUIRE_TIMEOUT)
                    .connect(&url)
                    .await
                    .map_err(backend)?;
                Migrator::new(Embedded).await.map_err(backend)?.run(&pool).await.map_err(backend)?;
                Ok(pool)
            })
            .await?;
        Ok(PgDatabase { pool, runtime, holder: holder_id("kiln"), registered: false, in_flight: Default::default() })
    }

    /// This database handle as host `host_id` (a new holder, see
    /// [`PgDatabase::holder`]), one of the hosts sharing the database: its
    /// job and asset writes are refused unless it is registered
    /// (`HostLeases::register`) and until its registration is ended.
    pub fn as_host(mut self, host_id: &str) -> PgDatabase {
        self.holder = holder_id(host_id);
        self.registered = true;
        self
    }

    /// The holder this host's job writes name: `<host_id>/<nonce>`, new at
    /// each start.
    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// Runs `call` on the database's runtime and waits for it there.
    async fn run<T: Send + 'static>(
        &self,
        call: impl FnOnce(PgPool) -> futures_util::future::BoxFuture<'static, Result<T, StoreError>> + Send + 'static,
    ) -> Result<T, StoreError> {
        let in_flight = InFlight::start(&self.in_flight);
        let call = call(self.pool.clone());
        self.runtime
            .run(async move {
                let _in_flight = in_flight;
                call.await
            })
            .await
    }

    /// PostgreSQL's session advisory lock on `name` (a 64-bit key from
    /// its blake3), on a connection held until the lease is dropped: one
    /// host at a time; released by the server if the host dies.
    pub async fn advisory_lease(&self, name: &str) -> Result<Option<super::PeriodicLease>, StoreError> {
        let key = advisory_key(name);
        let pool = self.pool.clone();
        let conn = self
            .runtime
            .run(async move {
                let mut conn = pool.acquire().await.map_err(backend)?;
                let (got,): (bool,) = sqlx::query_as("SELECT pg_try_advisory_lock($1)").bind(key).fetch_one(&mut *conn).await.map_err(backend)?;
                Ok(got.then_some(conn))
            })
            .await?;
        Ok(conn.map(|conn| super::PeriodicLease(Some(Box::new(AdvisoryLock { conn: Some(conn), key, runtime: self.runtime.clone() })))))
    }

    /// Closes every connection (after the calls in flight end, 5 s at
    /// most, and those in use come back);
    /// later calls fail. What a host does when it stops.
    pub async fn close(&self) {
        // A write whose caller was dropped at shutdown (a worker leaving its
        // job mid-start) still lands: up to 5 s for the calls in flight.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while self.in_flight.load(std::sync::atomic::Ordering::SeqCst) > 0 && std::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        let pool = self.pool.clone();
        if let Ok(handle) = self.runtime.handle() {
            let _ = handle.spawn(async move { pool.close().await }).await;
        }
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

/// One call in flight, counted until it ends.
struct InFlight(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl InFlight {
    fn start(count: &std::sync::Arc<std::sync::atomic::AtomicUsize>) -> InFlight {
        count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        InFlight(count.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A held advisory lock: unlocked on its own connection when dropped (on
/// the database's runtime, where the connection must go back to the pool).
struct AdvisoryLock {
    conn: Option<sqlx::pool::PoolConnection<sqlx::Postgres>>,
    key: i64,
    runtime: std::sync::Arc<IoRuntime>,
}

impl Drop for AdvisoryLock {
    fn drop(&mut self) {
        let Some(mut conn) = self.conn.take() else { return };
        match self.runtime.handle() {
            Ok(handle) => {
                let key = self.key;
                handle.spawn(async move {
                    if sqlx::query("SELECT pg_advisory_unlock($1)").bind(key).execute(&mut *conn).await.is_err() {
                        // Not known to be unlocked: the connection must not serve again.
                        conn.detach();
                    }
                });
            }
            // The runtime is gone (the process is stopping): the server
            // releases the lock with the connection.
            Err(_) => std::mem::forget(conn),
        }
    }
}

/// The advisory lock key of the periodic work `name`: 64 bits of its blake3.
fn advisory_key(name: &str) -> i64 {
    i64::from_le_bytes(blake3::hash(name.as_bytes()).as_bytes()[..8].try_into().unwrap_or_default())
}

/// `<host_id>/<nonce>`: one start of host `host_id`.
fn holder_id(host_id: &str) -> std::sync::Arc<str> {
    let nonce = uuid::Uuid::new_v4().simple().to_string();
    std::sync::Arc::from(format!("{host_id}/{}", &nonce[..12]))
}

/// Microseconds since the epoch by the database server's clock, in SQL:
/// leases are measured by one clock whatever the hosts' clocks say.
pub(super) const DB_NOW: &str = "(extract(epoch from clock_timestamp()) * 1000000)::bigint";

/// Connects once to `url` (within 5 s) without changing anything; the
/// kiln migrations the database has (none before kiln's first start on
/// it). What `kiln doctor` asks.
pub async fn probe(url: &str) -> Result<Vec<i64>, StoreError> {
    use sqlx::Connection;
    let connect = sqlx::PgConnection::connect(url);
    let mut conn = tokio::time::timeout(std::time::Duration::from_secs(5), connect).await.map_err(|_| backend("no answer within 5 s"))?.map_err(backend)?;
    let exists: (bool,) = sqlx::query_as("SELECT to_regclass('_sqlx_migrations') IS NOT NULL").fetch_one(&mut conn).await.map_err(backend)?;
    let applied = if exists.0 {
        let rows: Vec<(i64,)> = sqlx::query_as("SELECT version FROM _sqlx_migrations ORDER BY version").fetch_all(&mut conn).await.map_err(backend)?;
        rows.into_iter().map(|(v,)| v).collect()
    } else {
        Vec::new()
    };
    let _ = conn.close().await;
    Ok(applied)
}

/// `url` with its password replaced by `***` (for logs and `kiln doctor`).
pub fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_string() };
    let (authority, path) = rest.split_once('/').map_or((rest, None), |(a, p)| (a, Some(p)));
    let authority = match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{user}:***@{host}"),
            None => authority.to_string(),
        },
        None => authority.to_string(),
    };
    match path {
        Some(p) => format!("{scheme}://{authority}/{p}"),
        None => format!("{scheme}://{authority}"),
    }
}

#[cfg(test)]
mod test_billing;
#[cfg(test)]
mod test_blob_holds;
#[cfg(test)]
pub(crate) mod test_db;
#[cfg(test)]
mod test_numbers;
#[cfg(test)]
mod test_plugins;
#[cfg(test)]
mod test_take_queued;

#[cfg(test)]
mod tests {
    use super::StoreError;

    #[test]
    fn a_lost_connection_is_unavailable_and_a_bad_query_is_not() {
        assert!(matches!(super::backend(sqlx::Error::PoolTimedOut), StoreError::Unavailable(_)));
        assert!(matches!(super::backend(sqlx::Error::Io(std::io::ErrorKind::ConnectionRefused.into())), StoreError::Unavailable(_)));
        assert!(matches!(super::backend(sqlx::Error::RowNotFound), StoreError::Backend(_)));
        assert!(matches!(super::backend("no answer"), StoreError::Backend(_)));
    }

    #[test]
    fn a_password_in_a_database_url_is_not_shown() {
        assert_eq!(super::redacted("postgres://kiln:s3cret@db:5432/kiln?sslmode=require"), "postgres://kiln:***@db:5432/kiln?sslmode=require");
        assert_eq!(super::redacted("postgres://kiln@db/kiln"), "postgres://kiln@db/kiln");
        assert_eq!(super::redacted("postgres://u:p@ss@db"), "postgres://u:***@db");
        assert_eq!(super::redacted("not a url"), "not a url");
    }
}
