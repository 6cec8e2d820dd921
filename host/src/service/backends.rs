//! What the service keeps its state in and sends its messages through,
//! each behind a trait so another backend slots in: the metadata store,
//! the blobs, accounts, sign-in sessions, deployments, the web frontend's user files, the
//! waiting queue and the execution bus. [`Backends::embedded`] opens
//! kiln's own: one sled database, blob files, the deployments file and the
//! user files under the data directory, and the queue and bus of this
//! process; [`Backends::from_config`] swaps in PostgreSQL and an S3 bucket
//! where the settings ask.

use std::path::Path;
use std::sync::Arc;

use super::ServiceError;
use super::bus::{ExecBus, LocalBus};
use super::queue::{LocalWaiting, Waiting};
use crate::accounts::KeyHasher;
use crate::store::s3::{S3Blobs, S3Settings};
use crate::store::{
    AccountStore, BlobStore, DeploymentStore, DiskBlobs, DiskUserFiles, FileDeployments, MetaStore, SessionStore, SledAccounts, SledMeta, SledSessions,
    StoreError, UserFileStore,
};

/// The bucket `blob_store = "s3"` names, its cache under the data
/// directory; `None` for blobs on the file system.
pub fn s3_settings(config: &crate::config::Config) -> Option<S3Settings> {
    (config.blob_store == crate::config::BlobStoreKind::S3).then(|| S3Settings {
        endpoint: config.s3_endpoint.clone(),
        bucket: config.s3_bucket.clone().unwrap_or_default(),
        region: config.s3_region.clone(),
        cache_dir: config.data_dir.join("blob-cache"),
        cache_bytes: config.blob_cache_mb.saturating_mul(1 << 20),
        installation: None,
    })
}

/// The service's backends.
pub struct Backends {
    /// Jobs, assets, idempotency claims (see [`MetaStore`]).
    pub meta: Arc<dyn MetaStore>,
    /// Asset bytes, by content (see [`BlobStore`]).
    pub blobs: Arc<dyn BlobStore>,
    /// Account records (see [`AccountStore`]).
    pub accounts: Arc<dyn AccountStore>,
    /// The secret API keys are hashed with.
    pub key_hasher: KeyHasher,
    /// The secret download URLs are signed with.
    pub signing_key: [u8; 32],
    /// Web sign-in sessions (see [`SessionStore`]).
    pub sessions: Arc<dyn SessionStore>,
    /// Deployment records (see [`DeploymentStore`]).
    pub deployments: Arc<dyn DeploymentStore>,
    /// The web frontend's settings and files (see [`UserFileStore`]).
    pub user_files: Arc<dyn UserFileStore>,
    /// Where queued jobs wait (see [`Waiting`]).
    pub waiting: Arc<dyn Waiting>,
    /// Execution messages (see [`ExecBus`]).
    pub bus: Arc<dyn ExecBus>,
    /// This host's lease and notices where hosts share the store (see
    /// `service::cluster`); `None`: one process holds every job.
    pub cluster: Option<super::ClusterBackends>,
}

impl Backends {
    /// kiln's embedded backends under `data_dir` (created when missing),
    /// their acknowledged writes as durable as `durability` says; refused
    /// for a directory `kiln migrate` copied into a shared database.
    pub fn embedded(data_dir: &Path, durability: crate::store::Durability) -> Result<Backends, ServiceError> {
        let moved = data_dir.join(crate::migrate::MOVED_MARK);
        if moved.exists() {
            return Err(ServiceError::InvalidRequest(format!(
                "{} was copied into a shared database by `kiln migrate` ({}): serve that database instead (store = \"postgres\"), or delete the file to serve the directory on its own",
                data_dir.display(),
                moved.display()
            )));
        }
        crate::atomic_file::create_dir_all(data_dir).map_err(StoreError::from)?;
        let sled = SledMeta::open_with(&data_dir.join("meta"), durability)?;
        let (accounts, sessions) = (Arc::new(sled.accounts()?), Arc::new(sled.sessions()?));
        Backends::beside(Arc::new(sled), accounts, sessions, data_dir, file_secrets(data_dir)?)
    }

    /// Jobs, assets, claims, accounts, sessions, deployments and their
    /// bundles, installed plugins, the server secrets and the web frontend's user files in the
    /// PostgreSQL database at `url` (its schema migrated first; at most
    /// `max_connections` open), shared with the other hosts that name it:
    /// this host (`host_id`) holds the jobs submitted to it under a lease
    /// and hears the others' events (see `service::cluster`). Blobs under
    /// `data_dir` (unless S3 replaces them), and this process's queue.
    pub async fn postgres(url: &str, max_connections: u32, data_dir: &Path, host_id: &str) -> Result<Backends, ServiceError> {
        use crate::store::postgres::{PgAccounts, PgDatabase, PgDeployments, PgHosts, PgMeta, PgNotices, PgNumbers, PgPlugins, PgSessions, PgUserFiles};
        crate::atomic_file::create_dir_all(data_dir).map_err(StoreError::from)?;
        let db = PgDatabase::connect(url, max_connections).await?.as_host(host_id);
        // The secrets every host shares: seeded, when the database has none
        // yet, from this host's files (kept from before it used the
        // database, so its keys and signed URLs stay valid).
        let accounts_secret = db.server_secret(crate::accounts::keys::SECRET_FILE, data_dir).await?;
        let signing_key = db.server_secret(crate::api::signing::SECRET_FILE, data_dir).await?;
        let mut backends = Backends::beside(
            Arc::new(PgMeta::new(db.clone())),
            Arc::new(PgAccounts::new(db.clone())),
            Arc::new(PgSessions::new(db.clone())),
            data_dir,
            (KeyHasher::from_secret(accounts_secret), signing_key),
        )?;
        backends.deployments = Arc::new(PgDeployments::new(db.clone()));
        backends.user_files = Arc::new(PgUserFiles::new(db.clone()));
        let notices: Arc<dyn crate::store::cluster::Notices> = Arc::new(PgNotices::start(&db)?);
        backends.bus = Arc::new(super::bus::SharedBus::start(notices.clone(), backends.meta.clone()));
        let numbers = Arc::new(PgNumbers::new(db.clone()));
        let plugins = Arc::new(PgPlugins::new(db.clone()));
        backends.cluster = Some(super::ClusterBackends { leases: Arc::new(PgHosts::new(db, host_id)), notices, numbers, plugins });
        Ok(backends)
    }

    /// The given record stores and secrets with what stays under
    /// `data_dir` (blobs, deployments, user files) and this process's
    /// queue and bus.
    fn beside(
        meta: Arc<dyn MetaStore>,
        accounts: Arc<dyn AccountStore>,
        sessions: Arc<dyn SessionStore>,
        data_dir: &Path,
        (key_hasher, signing_key): (KeyHasher, [u8; 32]),
    ) -> Result<Backends, ServiceError> {
        Ok(Backends {
            meta,
            accounts,
            sessions,
            blobs: Arc::new(DiskBlobs::open(data_dir.join("blobs"))?),
            key_hasher,
            signing_key,
            deployments: Arc::new(FileDeployments::open(Some(data_dir.join("deployments.json")))?),
            user_files: Arc::new(DiskUserFiles::new(data_dir.join("users"))),
            waiting: Arc::new(LocalWaiting::default()),
            bus: Arc::new(LocalBus::default()),
            cluster: None,
        })
    }

    /// The backends `config.store` and `config.blob_store` name.
    pub async fn from_config(config: &crate::config::Config) -> Result<Backends, ServiceError> {
        config.check_store().map_err(ServiceError::InvalidRequest)?;
        let mut backends = match (config.store, config.database_url.as_deref()) {
            (crate::config::StoreKind::Postgres, Some(url)) => {
                Backends::postgres(url, config.database_max_connections, &config.data_dir, &config.host_id()).await?
            }
            (crate::config::StoreKind::Postgres, None) => return Err(ServiceError::InvalidRequest("store = \"postgres\" needs database_url".into())),
            (crate::config::StoreKind::Embedded, _) => Backends::embedded(&config.data_dir, config.durability)?,
        };
        if let Some(mut settings) = s3_settings(config) {
            settings.installation = Some(backends.meta.installation_id().await?);
            let blobs = S3Blobs::open(&settings).await?;
            tracing::info!(place = blobs.place(), cached_bytes = blobs.cached_bytes(), "blobs in S3");
            backends.blobs = Arc::new(blobs);
        }
        Ok(backends)
    }

    /// Given metadata and blob stores (another backend, or a test double);
    /// the rest embedded: accounts, sessions and deployments in memory only, user
    /// files under `data_dir`.
    pub fn with_stores(meta: Arc<dyn MetaStore>, blobs: Arc<dyn BlobStore>, data_dir: &Path) -> Result<Backends, ServiceError> {
        Ok(Backends {
            meta,
            blobs,
            accounts: Arc::new(SledAccounts::temporary()?),
            key_hasher: KeyHasher::ephemeral(),
            signing_key: crate::secret_file::load_or_create(data_dir, crate::api::signing::SECRET_FILE).map_err(StoreError::from)?,
            sessions: Arc::new(SledSessions::temporary()?),
            deployments: Arc::new(FileDeployments::open(None)?),
            user_files: Arc::new(DiskUserFiles::new(data_dir.join("users"))),
            waiting: Arc::new(LocalWaiting::default()),
            bus: Arc::new(LocalBus::default()),
            cluster: None,
        })
    }
}

/// The server secrets kept in `data_dir`'s files (created on first use).
fn file_secrets(data_dir: &Path) -> Result<(KeyHasher, [u8; 32]), ServiceError> {
    let accounts = KeyHasher::load_or_create(data_dir).map_err(StoreError::from)?;
    let signing = crate::secret_file::load_or_create(data_dir, crate::api::signing::SECRET_FILE).map_err(StoreError::from)?;
    Ok((accounts, signing))
}
