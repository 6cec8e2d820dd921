//! `kiln migrate --to postgres`: copies an embedded data directory into
//! the database (and bucket) that hosts share (see `crate::migrate`).

use std::path::PathBuf;
use std::sync::Arc;

use crate::config::{BlobStoreKind, Config};
use crate::migrate::{Source, Target};

/// Arguments of `kiln migrate`.
#[derive(Debug, clap::Args)]
pub struct MigrateArgs {
    /// Where to copy to: `postgres` (the database `database_url` names,
    /// and the bucket of `blob_store = "s3"`).
    #[arg(long, value_enum)]
    pub to: MigrateTo,
    /// The embedded data directory to copy (not in use by a server)
    /// [default: `data_dir`].
    #[arg(long, value_name = "DIR")]
    pub from: Option<PathBuf>,
}

/// What `kiln migrate` copies into.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum MigrateTo {
    Postgres,
}

/// The exit code of a copy that left records out (listed).
const EXIT_LEFT_OUT: i32 = 3;
/// The blob cache of a copy into a bucket.
const MIGRATE_CACHE_BYTES: u64 = 256 << 20;

/// Runs `kiln migrate`; the exit code (0: everything copied and checked;
/// [`EXIT_LEFT_OUT`]: copied and checked, except records left out, listed).
pub async fn run(config: &Config, args: MigrateArgs) -> anyhow::Result<i32> {
    let MigrateTo::Postgres = args.to;
    let mut target_config = config.clone();
    target_config.store = crate::config::StoreKind::Postgres;
    target_config.check_store().map_err(|e| anyhow::anyhow!("kiln migrate --to postgres: {e}"))?;
    let Some(url) = config.database_url.as_deref() else { anyhow::bail!("kiln migrate --to postgres needs database_url (KILN_DATABASE_URL)") };
    let from = args.from.unwrap_or_else(|| config.data_dir.clone());
    let source = Source::open(&from)?;
    let mut target = Target::open(url).await?;
    crate::migrate::prepare(&source, &target).await?;
    // The bucket is asked whether it holds a blob, not a cache kept from
    // before: this run's own, emptied at its start and end, on the data's
    // disk, and small (it keeps recent uploads only).
    let cache = from.join(".kiln-migrate-cache");
    let _ = std::fs::remove_dir_all(&cache);
    if let Some(mut settings) = crate::service::s3_settings(config) {
        settings.installation = Some(target.installation_id().await?);
        settings.cache_dir = cache.clone();
        settings.cache_bytes = MIGRATE_CACHE_BYTES;
        let bucket = crate::store::s3::S3Blobs::open(&settings).await?;
        println!("blobs: into s3 {}", bucket.place());
        target = target.with_blobs(Arc::new(bucket));
    } else if config.blob_store == BlobStoreKind::Fs {
        println!(
            "blobs: left in {} (blob_store = \"fs\": give the hosts this folder as their data directory's blobs/, on a volume they share)",
            from.join("blobs").display()
        );
    }
    println!("copying {} into {}", from.display(), crate::store::postgres::redacted(url));
    let copied = crate::migrate::run(&source, &target, &mut |tally| println!("{tally}")).await;
    target.close().await;
    let _ = std::fs::remove_dir_all(&cache);
    let left_out: usize = copied?.iter().map(|t| t.left_out).sum();
    if left_out > 0 {
        println!(
            "done, but {left_out} asset(s) left out, their blobs lost (listed above); every other record is in the database, every copied byte checked by hash; the directory is not marked as moved"
        );
        return Ok(EXIT_LEFT_OUT);
    }
    println!("done: every record of the data directory is in the database, every copied byte checked by hash; the directory is marked so no server opens it");
    Ok(0)
}
