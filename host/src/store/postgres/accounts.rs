//! [`AccountStore`] on PostgreSQL (table `accounts`, one row per account).
//! A balance changes by one `UPDATE … SET credits = credits + $delta`, a
//! flag by one `UPDATE` of its column: hosts sharing the database never
//! undo one another's changes, and a balance is never overdrawn by two
//! hosts reading it at once. A charge that need not be durable at once
//! commits without waiting for the WAL flush (`synchronous_commit = off`
//! for that transaction only). Names are unique in the database (one
//! `UNIQUE` index), whichever host creates the account. Each write
//! announces the account's id to the other hosts (`Topic::Accounts`) in its
//! own transaction, so they hear of every committed change and re-read it.

use sqlx::Row;
use sqlx::postgres::PgRow;

use super::notices::announce;
use super::{PgDatabase, backend};
use crate::store::cluster::Topic;
use crate::store::{Account, AccountChange, AccountStore, CreditChange, StoreError};

/// Accounts in PostgreSQL.
pub struct PgAccounts {
    db: PgDatabase,
}

impl PgAccounts {
    pub fn new(db: PgDatabase) -> PgAccounts {
        PgAccounts { db }
    }
}

const COLUMNS: &str = "id, name, key_hashes, credits, tier, subscription_active, disabled, created_at";

fn account(row: &PgRow) -> Result<Account, StoreError> {
    let get = |e: sqlx::Error| StoreError::Corrupt(format!("account row: {e}"));
    Ok(Account {
        id: row.try_get("id").map_err(get)?,
        name: row.try_get("name").map_err(get)?,
        key_hashes: row.try_get("key_hashes").map_err(get)?,
        credits: row.try_get("credits").map_err(get)?,
        tier: row.try_get("tier").map_err(get)?,
        subscription_active: row.try_get("subscription_active").map_err(get)?,
        disabled: row.try_get("disabled").map_err(get)?,
        created_at: row.try_get("created_at").map_err(get)?,
    })
}

#[async_trait::async_trait]
impl AccountStore for PgAccounts {
    async fn all(&self) -> Result<Vec<Account>, StoreError> {
        on_pool!(self, |pool| {
            let rows = sqlx::query(&format!("SELECT {COLUMNS} FROM accounts ORDER BY created_at, id")).fetch_all(&pool).await.map_err(backend)?;
            rows.iter().map(account).collect()
        })
    }

    async fn get(&self, id: &str) -> Result<Option<Account>, StoreError> {
        let id = id.to_string();
        on_pool!(self, |pool| {
            let row = sqlx::query(&format!("SELECT {COLUMNS} FROM accounts WHERE id = $1")).bind(id).fetch_optional(&pool).await.map_err(backend)?;
            row.as_ref().map(account).transpose()
        })
    }

    async fn some(&self, ids: &[String]) -> Result<Vec<Account>, StoreError> {
        let ids = ids.to_vec();
        on_pool!(self, |pool| {
            let rows = sqlx::query(&format!("SELECT {COLUMNS} FROM accounts WHERE id = ANY($1)")).bind(ids).fetch_all(&pool).await.map_err(backend)?;
            rows.iter().map(account).collect()
        })
    }

    async fn create(&self, a: &Account) -> Result<(), StoreError> {
        let (a, me) = (a.clone(), self.db.holder().to_string());
        on_pool!(self, |pool| {
            in_transaction!(pool, |tx| {
                let inserted = sqlx::query(&format!("INSERT INTO accounts ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"))
                    .bind(&a.id)
                    .bind(&a.name)
                    .bind(&a.key_hashes)
                    .bind(a.credits)
                    .bind(&a.tier)
                    .bind(a.subscription_active)
                    .bind(a.disabled)
                    .bind(a.created_at)
                    .execute(&mut *tx)
                    .await;
                match inserted {
                    Ok(_) => announce(&mut *tx, Topic::Accounts, &me, &a.id).await,
                    Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
                        Err(StoreError::Backend(format!("an account named {:?} (or with id {}) already exists", a.name, a.id)))
                    }
                    Err(e) => Err(backend(e)),
                }
            })
        })
    }

    async fn change(&self, id: &str, change: AccountChange) -> Result<Option<Account>, StoreError> {
        let (id, me) = (id.to_string(), self.db.holder().to_string());
        on_pool!(self, |pool| {
            in_transaction!(pool, |tx| {
                let (set, active) = match change {
                    AccountChange::Subscription(active) => ("subscription_active = $2", Some(active)),
                    AccountChange::Disable => ("disabled = TRUE", None),
                };
                let sql = format!("UPDATE accounts SET {set} WHERE id = $1 RETURNING {COLUMNS}");
                let mut query = sqlx::query(&sql).bind(&id);
                if let Some(active) = active {
                    query = query.bind(active);
                }
                let row = query.fetch_optional(&mut *tx).await.map_err(backend)?;
                let changed = row.as_ref().map(account).transpose()?;
                if changed.is_some() {
                    announce(&mut *tx, Topic::Accounts, &me, &id).await?;
                }
                Ok(changed)
            })
        })
    }

    async fn add_credits(&self, id: &str, delta: i64, durable: bool) -> Result<CreditChange, StoreError> {
        let (id, me) = (id.to_string(), self.db.holder().to_string());
        on_pool!(self, |pool| {
            in_transaction!(pool, |tx| {
                if !durable {
                    sqlx::query("SET LOCAL synchronous_commit TO OFF").execute(&mut *tx).await.map_err(backend)?;
                }
                let change = credit_in(tx, &id, delta).await?;
                if let CreditChange::Changed(_) = change {
                    announce(&mut *tx, Topic::Accounts, &me, &id).await?;
                }
                Ok(change)
            })
        })
    }
}

/// Changes account `id`'s balance by `delta` in `tx` (checked in
/// `numeric`: a balance never leaves i64). Not announced: the caller says
/// when the other hosts hear of it.
pub(super) async fn credit_in(tx: &mut sqlx::PgConnection, id: &str, delta: i64) -> Result<CreditChange, StoreError> {
    let row = sqlx::query(&format!(
        "UPDATE accounts SET credits = credits + $2 WHERE id = $1 \
         AND credits::numeric + $2::numeric BETWEEN -9223372036854775808 AND 9223372036854775807 RETURNING {COLUMNS}"
    ))
    .bind(id)
    .bind(delta)
    .fetch_optional(&mut *tx)
    .await
    .map_err(backend)?;
    Ok(match row {
        Some(row) => CreditChange::Changed(account(&row)?),
        None => {
            let exists = sqlx::query("SELECT 1 FROM accounts WHERE id = $1").bind(id).fetch_optional(&mut *tx).await.map_err(backend)?;
            if exists.is_some() { CreditChange::Overflow } else { CreditChange::NoAccount }
        }
    })
}
