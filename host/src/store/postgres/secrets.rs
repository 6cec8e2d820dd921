//! The server secrets every host of an installation shares (table
//! `server_secrets`): an account key hashed on one host is checked on any
//! other, a URL signed by one downloads from any other.

use std::path::Path;

use super::{PgDatabase, backend};
use crate::store::StoreError;

impl PgDatabase {
    /// The installation's secret `name`. The first host to ask writes it:
    /// its own file of that name in `data_dir` when it has one (what it
    /// used before it shared the database, so its keys and URLs stay
    /// valid), else fresh random bytes. Hosts racing write once.
    pub async fn server_secret(&self, name: &str, data_dir: &Path) -> Result<[u8; 32], StoreError> {
        let seed = crate::secret_file::load(data_dir, name).unwrap_or_else(crate::secret_file::random_key);
        let name = name.to_string();
        self.run(move |pool| {
            Box::pin(async move {
                sqlx::query("INSERT INTO server_secrets (name, secret) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING")
                    .bind(&name)
                    .bind(seed.as_slice())
                    .execute(&pool)
                    .await
                    .map_err(backend)?;
                let (secret,): (Vec<u8>,) =
                    sqlx::query_as("SELECT secret FROM server_secrets WHERE name = $1").bind(&name).fetch_one(&pool).await.map_err(backend)?;
                <[u8; 32]>::try_from(secret.as_slice()).map_err(|_| StoreError::Corrupt(format!("server secret {name} is not 32 bytes")))
            })
        })
        .await
    }

    /// The installation's secret `name` when one is stored (nothing written).
    pub async fn stored_secret(&self, name: &str) -> Result<Option<[u8; 32]>, StoreError> {
        let name = name.to_string();
        self.run(move |pool| {
            Box::pin(async move {
                let row: Option<(Vec<u8>,)> =
                    sqlx::query_as("SELECT secret FROM server_secrets WHERE name = $1").bind(&name).fetch_optional(&pool).await.map_err(backend)?;
                row.map(|(secret,)| <[u8; 32]>::try_from(secret.as_slice()).map_err(|_| StoreError::Corrupt(format!("server secret {name} is not 32 bytes"))))
                    .transpose()
            })
        })
        .await
    }
}
