//! `kiln db`: the operator's commands on the PostgreSQL database of
//! `store = "postgres"` (`database_url`).

use crate::config::{Config, StoreKind};
use crate::store::postgres::{PgDatabase, probe, redacted};

/// `kiln db` arguments.
#[derive(Debug, clap::Args)]
pub struct DbArgs {
    #[command(subcommand)]
    pub command: DbCommand,
}

/// A `kiln db` subcommand.
#[derive(Debug, clap::Subcommand)]
pub enum DbCommand {
    /// Apply the schema migrations this build has and the database lacks
    /// (what `kiln serve` does at start), then print them.
    Migrate,
}

/// Runs `kiln db …`; the exit code.
pub async fn run(config: &Config, args: DbArgs) -> anyhow::Result<i32> {
    let url = match (config.store, config.database_url.as_deref()) {
        (StoreKind::Postgres, Some(url)) => url,
        _ => anyhow::bail!("kiln db needs store = \"postgres\" and database_url (KILN_STORE, KILN_DATABASE_URL)"),
    };
    match args.command {
        DbCommand::Migrate => {
            let before = probe(url).await?;
            let db = PgDatabase::connect(url, 1).await?;
            let after = db.applied().await?;
            db.close().await;
            let new: Vec<i64> = after.iter().copied().filter(|v| !before.contains(v)).collect();
            println!("{}: migrations {after:?} (applied now: {new:?})", redacted(url));
            Ok(0)
        }
    }
}
