//! [`UserFileStore`] on PostgreSQL: settings in `user_settings`, files in
//! `user_files` by (user, `/`-separated path), so every host serves the
//! same ones. Directories are implicit: a path is a directory while some
//! file lies under it (so none is ever left empty), and a write refuses a
//! path through a file or onto a directory, as a file system would.

use std::path::Path;

use sqlx::Row;

use super::{PgDatabase, backend};
use crate::store::user_files::{Entry, FileInfo, MAX_DEPTH, UserFileStore, path_string};
use crate::store::{StoreError, wait};

/// Users' settings and files in PostgreSQL.
pub struct PgUserFiles {
    db: PgDatabase,
}

impl PgUserFiles {
    pub fn new(db: PgDatabase) -> PgUserFiles {
        PgUserFiles { db }
    }

    /// Runs `call` on the database's runtime, waiting here (the trait's
    /// calls come from blocking threads).
    fn call<T: Send + 'static>(
        &self,
        call: impl FnOnce(sqlx::PgPool) -> futures_util::future::BoxFuture<'static, Result<T, StoreError>> + Send + 'static,
    ) -> Result<T, StoreError> {
        wait(self.db.run(call))
    }
}

fn now_ms() -> i64 {
    crate::store::now_micros() / 1000
}

fn file_info(row: &sqlx::postgres::PgRow, strip: usize) -> Result<FileInfo, StoreError> {
    let get = |e: sqlx::Error| StoreError::Corrupt(format!("user file row: {e}"));
    let path: String = row.try_get("path").map_err(get)?;
    Ok(FileInfo {
        path: path.get(strip..).unwrap_or_default().to_string(),
        size: u64::try_from(row.try_get::<i32, _>("size").map_err(get)?).unwrap_or(0),
        modified_ms: row.try_get("modified_ms").map_err(get)?,
        created_ms: row.try_get("created_ms").map_err(get)?,
    })
}

const INFO: &str = "path, length(bytes) AS size, created_ms, modified_ms";

impl UserFileStore for PgUserFiles {
    fn settings(&self, user: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let user = user.to_string();
        self.call(move |pool| {
            Box::pin(async move {
                let row: Option<(Vec<u8>,)> =
                    sqlx::query_as("SELECT bytes FROM user_settings WHERE user_id = $1").bind(user).fetch_optional(&pool).await.map_err(backend)?;
                Ok(row.map(|(b,)| b))
            })
        })
    }

    fn put_settings(&self, user: &str, bytes: &[u8]) -> Result<(), StoreError> {
        let (user, bytes) = (user.to_string(), bytes.to_vec());
        self.call(move |pool| {
            Box::pin(async move {
                sqlx::query("INSERT INTO user_settings (user_id, bytes) VALUES ($1, $2) ON CONFLICT (user_id) DO UPDATE SET bytes = $2")
                    .bind(user)
                    .bind(bytes)
                    .execute(&pool)
                    .await
                    .map_err(backend)?;
                Ok(())
            })
        })
    }

    fn entry(&self, user: &str, path: &Path) -> Result<Entry, StoreError> {
        let (user, path) = (user.to_string(), path_string(path));
        self.call(move |pool| {
            Box::pin(async move {
                let file: Option<(i32,)> = sqlx::query_as("SELECT length(bytes) FROM user_files WHERE user_id = $1 AND path = $2")
                    .bind(&user)
                    .bind(&path)
                    .fetch_optional(&pool)
                    .await
                    .map_err(backend)?;
                if let Some((size,)) = file {
                    return Ok(Entry::File { size: u64::try_from(size).unwrap_or(0) });
                }
                let (under,): (bool,) = sqlx::query_as("SELECT EXISTS (SELECT 1 FROM user_files WHERE user_id = $1 AND starts_with(path, $2))")
                    .bind(&user)
                    .bind(dir_prefix(&path))
                    .fetch_one(&pool)
                    .await
                    .map_err(backend)?;
                Ok(if under || path.is_empty() { Entry::Directory } else { Entry::Missing })
            })
        })
    }

    fn list(&self, user: &str, dir: &Path, recurse: bool, max: usize) -> Result<Option<Vec<FileInfo>>, StoreError> {
        let (user, prefix) = (user.to_string(), dir_prefix(&path_string(dir)));
        let limit = i64::try_from(max).unwrap_or(i64::MAX);
        self.call(move |pool| {
            Box::pin(async move {
                let strip = prefix.len();
                let rows = sqlx::query(&format!(
                    "SELECT {INFO} FROM user_files WHERE user_id = $1 AND starts_with(path, $2) \
                     AND ($3 OR strpos(substr(path, $4), '/') = 0) ORDER BY path LIMIT $5"
                ))
                .bind(&user)
                .bind(&prefix)
                .bind(recurse)
                // (A position in characters, as `substr` counts.)
                .bind(i32::try_from(prefix.chars().count() + 1).unwrap_or(i32::MAX))
                .bind(limit)
                .fetch_all(&pool)
                .await
                .map_err(backend)?;
                if rows.is_empty() && !prefix.is_empty() {
                    // No file under it: no such directory (or one with only
                    // deeper files, when not recursing).
                    let (under,): (bool,) = sqlx::query_as("SELECT EXISTS (SELECT 1 FROM user_files WHERE user_id = $1 AND starts_with(path, $2))")
                        .bind(&user)
                        .bind(&prefix)
                        .fetch_one(&pool)
                        .await
                        .map_err(backend)?;
                    if !under {
                        return Ok(None);
                    }
                }
                let files = rows.iter().map(|r| file_info(r, strip)).collect::<Result<Vec<_>, _>>()?;
                // As deep as a walk of the file system goes.
                Ok(Some(files.into_iter().filter(|f| f.path.split('/').count() <= MAX_DEPTH).collect()))
            })
        })
    }

    fn read(&self, user: &str, path: &Path) -> Result<Option<Vec<u8>>, StoreError> {
        let (user, path) = (user.to_string(), path_string(path));
        self.call(move |pool| {
            Box::pin(async move {
                let row: Option<(Vec<u8>,)> = sqlx::query_as("SELECT bytes FROM user_files WHERE user_id = $1 AND path = $2")
                    .bind(user)
                    .bind(path)
                    .fetch_optional(&pool)
                    .await
                    .map_err(backend)?;
                Ok(row.map(|(b,)| b))
            })
        })
    }

    fn put(&self, user: &str, path: &Path, bytes: &[u8]) -> Result<FileInfo, StoreError> {
        let (user, path, bytes) = (user.to_string(), path_string(path), bytes.to_vec());
        self.call(move |pool| {
            Box::pin(async move {
                in_transaction!(pool, |tx| {
                    lock_user(tx, &user).await?;
                    refuse_through_files(tx, &user, &path).await?;
                    let now = now_ms();
                    let row = sqlx::query(&format!(
                        "INSERT INTO user_files (user_id, path, bytes, created_ms, modified_ms) VALUES ($1, $2, $3, $4, $4) \
                     ON CONFLICT (user_id, path) DO UPDATE SET bytes = $3, modified_ms = $4 RETURNING {INFO}"
                    ))
                    .bind(&user)
                    .bind(&path)
                    .bind(bytes)
                    .bind(now)
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(backend)?;
                    file_info(&row, 0)
                })
            })
        })
    }

    fn delete(&self, user: &str, path: &Path) -> Result<bool, StoreError> {
        let (user, path) = (user.to_string(), path_string(path));
        self.call(move |pool| {
            Box::pin(async move {
                let done =
                    sqlx::query("DELETE FROM user_files WHERE user_id = $1 AND path = $2").bind(user).bind(path).execute(&pool).await.map_err(backend)?;
                Ok(done.rows_affected() > 0)
            })
        })
    }

    fn rename(&self, user: &str, from: &Path, to: &Path) -> Result<FileInfo, StoreError> {
        let (user, from, to) = (user.to_string(), path_string(from), path_string(to));
        self.call(move |pool| {
            Box::pin(async move {
                in_transaction!(pool, |tx| {
                    lock_user(tx, &user).await?;
                    if from != to {
                        sqlx::query("DELETE FROM user_files WHERE user_id = $1 AND path = $2")
                            .bind(&user)
                            .bind(&to)
                            .execute(&mut *tx)
                            .await
                            .map_err(backend)?;
                        refuse_through_files(tx, &user, &to).await?;
                    }
                    let row = sqlx::query(&format!("UPDATE user_files SET path = $3, modified_ms = $4 WHERE user_id = $1 AND path = $2 RETURNING {INFO}"))
                        .bind(&user)
                        .bind(&from)
                        .bind(&to)
                        .bind(now_ms())
                        .fetch_optional(&mut *tx)
                        .await
                        .map_err(backend)?
                        .ok_or_else(|| StoreError::Io(std::io::Error::new(std::io::ErrorKind::NotFound, format!("no file {from}"))))?;
                    file_info(&row, 0)
                })
            })
        })
    }
}

/// `dir/` (or nothing for the root): what the paths under `dir` start with.
fn dir_prefix(dir: &str) -> String {
    if dir.is_empty() { String::new() } else { format!("{dir}/") }
}

/// Serializes the writes of `user`'s files (across hosts) until the
/// transaction ends, so the check of a write's path holds when it commits.
async fn lock_user(tx: &mut sqlx::PgConnection, user: &str) -> Result<(), StoreError> {
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('kiln user files'), hashtext($1))").bind(user).execute(&mut *tx).await.map_err(backend)?;
    Ok(())
}

/// Refuses a write at `path` that a file system would: one of its
/// directories is a file, or it is itself a directory.
async fn refuse_through_files(tx: &mut sqlx::PgConnection, user: &str, path: &str) -> Result<(), StoreError> {
    let parents: Vec<String> = path.match_indices('/').map(|(i, _)| path[..i].to_string()).collect();
    let (blocked,): (bool,) = sqlx::query_as("SELECT EXISTS (SELECT 1 FROM user_files WHERE user_id = $1 AND (path = ANY($2) OR starts_with(path, $3)))")
        .bind(user)
        .bind(&parents)
        .bind(dir_prefix(path))
        .fetch_one(&mut *tx)
        .await
        .map_err(backend)?;
    if blocked {
        return Err(StoreError::Io(std::io::Error::other(format!("{path} is a directory, or a file lies on its way"))));
    }
    Ok(())
}
