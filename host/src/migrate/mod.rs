//! `kiln migrate --to postgres`: an embedded data directory copied into
//! the stores hosts share — its jobs (with their workflows), assets,
//! idempotency claims, accounts, deployments (with their bundles), the web
//! frontend's user files, installed plugins (the operator's and accounts'
//! own) and the server secrets into PostgreSQL, its blobs
//! into the S3 bucket when `blob_store = "s3"`.
//!
//! Every write is made only where the target lacks the record, so a copy
//! stopped part way (a crash, a lost connection) is run again and writes
//! what is missing, nothing twice; a record the target already holds is
//! left as it is (hosts may have moved it on since). An asset whose blob is
//! lost (nowhere the hosts read) is left out and reported — unless every
//! asset's is, which means the wrong blob store (an error). A copy that
//! left nothing out marks the directory ([`MOVED_MARK`]) so no embedded
//! server opens it. Each kind is checked
//! once copied: every record of the source is present in the target
//! (counted by id), and every copied byte is hashed: a blob is committed
//! under the blake3 of what was read, which must be its name, and a
//! bundle, user file or plugin component is read back and compared by
//! hash; every copied asset's blob must be where the hosts will read it. The data directory must not
//! be in use (sled's lock refuses a second opener), nor served again once
//! copied (a record the database holds is never updated from it); sign-in
//! sessions are not copied (users sign in again).

mod files;
mod records;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::store::postgres::{PgAccounts, PgDatabase, PgDeployments, PgMeta, PgPlugins, PgUserFiles};
use crate::store::{BlobStore, DiskBlobs, DiskUserFiles, FileDeployments, SledAccounts, SledMeta, StoreError};

/// Records read from the source per page.
const PAGE: usize = 256;

/// Why a migration stopped (what was copied before stays copied).
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the database holds another installation's server secret `{0}`: the data directory's API keys and signed URLs would not verify there")]
    ForeignSecret(String),
    #[error("{kind}: {missing} of the source's records are not in the target after the copy")]
    Missing { kind: &'static str, missing: usize },
    #[error("{kind} `{name}`: {why}")]
    Mismatch { kind: &'static str, name: String, why: String },
}

/// What was done with one kind of record.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tally {
    pub kind: &'static str,
    /// How many the source holds.
    pub source: usize,
    /// How many this run wrote.
    pub copied: usize,
    /// How many the target held already.
    pub present: usize,
    /// How many were left out (an asset whose blob is nowhere the hosts
    /// read: lost from the data directory), with the first few ids.
    pub left_out: usize,
    pub left_out_ids: Vec<String>,
}

impl Tally {
    /// Counts `id` as left out.
    fn leave_out(&mut self, id: &str) {
        self.left_out += 1;
        if self.left_out_ids.len() < 10 {
            self.left_out_ids.push(id.to_string());
        }
    }
}

impl std::fmt::Display for Tally {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {} in the data directory, {} copied now, {} there already", self.kind, self.source, self.copied, self.present)?;
        if self.left_out > 0 {
            write!(
                f,
                ", {} left out (their blob is lost: {}{})",
                self.left_out,
                self.left_out_ids.join(", "),
                if self.left_out > self.left_out_ids.len() { ", …" } else { "" }
            )?;
        }
        Ok(())
    }
}

/// The embedded stores of a data directory.
pub struct Source {
    dir: PathBuf,
    meta: SledMeta,
    accounts: SledAccounts,
    deployments: FileDeployments,
    user_files: Arc<DiskUserFiles>,
    blobs: Arc<DiskBlobs>,
}

impl Source {
    /// Opens the embedded stores under `dir` (which must exist and not be
    /// in use) as a start does: sled replays its commit log, the blob
    /// folder's staging files are cleared.
    pub fn open(dir: &Path) -> Result<Source, MigrateError> {
        if !dir.join("meta").is_dir() {
            return Err(StoreError::Backend(format!("{} holds no embedded store (no meta/)", dir.display())).into());
        }
        let meta = SledMeta::open(&dir.join("meta"))?;
        Ok(Source {
            accounts: meta.accounts()?,
            meta,
            deployments: FileDeployments::open(Some(dir.join("deployments.json")))?,
            user_files: Arc::new(DiskUserFiles::new(dir.join("users"))),
            blobs: Arc::new(DiskBlobs::open(dir.join("blobs"))?),
            dir: dir.to_path_buf(),
        })
    }
}

/// The shared stores copied into: a PostgreSQL database (its schema
/// migrated first) and, when blobs move too, a bucket
/// ([`Target::with_blobs`]).
pub struct Target {
    db: PgDatabase,
    meta: PgMeta,
    accounts: PgAccounts,
    deployments: PgDeployments,
    user_files: Arc<PgUserFiles>,
    plugins: PgPlugins,
    /// `None`: blobs stay where they are (`blob_store = "fs"`).
    blobs: Option<Arc<dyn BlobStore>>,
}

impl Target {
    /// The database at `url`, and `blobs` when they move.
    pub async fn open(url: &str) -> Result<Target, MigrateError> {
        Ok(Target::on(PgDatabase::connect(url, 4).await?))
    }

    /// The database `db` connects to.
    pub fn on(db: PgDatabase) -> Target {
        Target {
            meta: PgMeta::new(db.clone()),
            accounts: PgAccounts::new(db.clone()),
            deployments: PgDeployments::new(db.clone()),
            user_files: Arc::new(PgUserFiles::new(db.clone())),
            plugins: PgPlugins::new(db.clone()),
            db,
            blobs: None,
        }
    }

    /// The same, with blobs copied into `blobs`.
    pub fn with_blobs(self, blobs: Arc<dyn BlobStore>) -> Target {
        Target { blobs: Some(blobs), ..self }
    }

    /// The database's installation id (what marks the bucket).
    pub async fn installation_id(&self) -> Result<String, MigrateError> {
        Ok(crate::store::MetaStore::installation_id(&self.meta).await?)
    }

    /// Closes the database connections.
    pub async fn close(&self) {
        self.db.close().await;
    }
}

/// Copies everything `source` holds into `target`, each kind checked;
/// `progress` hears each kind's tally as it is done. When nothing was left
/// out, marks the source directory as moved ([`MOVED_MARK`]).
pub async fn run(source: &Source, target: &Target, progress: &mut dyn FnMut(&Tally)) -> Result<Vec<Tally>, MigrateError> {
    // First, so nothing is copied into another installation's database.
    prepare(source, target).await?;
    let mut tallies = Vec::new();
    let mut done = |t: Tally| {
        progress(&t);
        tallies.push(t);
    };
    done(files::accounts(source, target).await?);
    done(files::deployments(source, target).await?);
    done(files::user_files(source, target).await?);
    done(files::plugins(source, target).await?);
    // Blobs before the records that name them: an asset copied is checked
    // to have its blob where the hosts will read it.
    let blob_home: Arc<dyn BlobStore> = match &target.blobs {
        Some(blobs) => {
            done(files::blobs(source, blobs.clone()).await?);
            blobs.clone()
        }
        None => source.blobs.clone(),
    };
    done(records::jobs(source, target).await?);
    done(records::assets(source, target, blob_home).await?);
    done(records::claims(source, target).await?);
    target.meta.raise_seq_bound(crate::store::MetaStore::max_seq(&source.meta).await?).await?;
    if tallies.iter().all(|t| t.left_out == 0) {
        std::fs::write(source.dir.join(MOVED_MARK), MOVED_TEXT).map_err(StoreError::from)?;
    }
    Ok(tallies)
}

/// The file a copied data directory is marked with: an embedded server
/// refuses to open it (`Backends::embedded`), so the directory is not
/// served beside the cluster it was copied into (whose bucket it could
/// share, and whose blobs its sweep would collect).
pub const MOVED_MARK: &str = "moved-to-postgres";
const MOVED_TEXT: &str = "kiln migrate --to postgres copied this data directory into a shared database: serve that instead. \
Delete this file to serve the directory on its own anyway.\n";

/// Makes the database the data directory's installation's, before any
/// record is copied (and before a bucket is opened, which is marked with
/// the installation's id): the directory's id becomes the database's while
/// the database holds nothing (a bucket the embedded server marked is then
/// the database's too); its server secrets (API keys' hashing, URL
/// signing) seed the database's, or must equal those already there — all
/// checked before anything is written. Run again, it changes nothing.
pub async fn prepare(source: &Source, target: &Target) -> Result<(), MigrateError> {
    let names = [crate::accounts::keys::SECRET_FILE, crate::api::signing::SECRET_FILE];
    let own: Vec<(&str, [u8; 32])> = names.iter().filter_map(|name| crate::secret_file::load(&source.dir, name).map(|s| (*name, s))).collect();
    for (name, secret) in &own {
        if target.db.stored_secret(name).await?.is_some_and(|stored| stored != *secret) {
            return Err(MigrateError::ForeignSecret(name.to_string()));
        }
    }
    target.meta.adopt_installation(&crate::store::MetaStore::installation_id(&source.meta).await?).await?;
    for (name, secret) in &own {
        if target.db.server_secret(name, &source.dir).await? != *secret {
            return Err(MigrateError::ForeignSecret(name.to_string()));
        }
    }
    Ok(())
}

/// Counts the target's records among `ids` and fails when any is missing.
fn all_present(kind: &'static str, expected: usize, present: usize) -> Result<(), MigrateError> {
    if present < expected { Err(MigrateError::Missing { kind, missing: expected - present }) } else { Ok(()) }
}
