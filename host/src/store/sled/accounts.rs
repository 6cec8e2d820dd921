//! [`AccountStore`] on a sled tree (`accounts`: id → the record's JSON, in
//! pieces when long: see [`super::chunked`]), beside the jobs in the same
//! database.

use super::backend;
use super::chunked::Chunked;
use super::durable::DurableFlush;
use crate::store::{Account, AccountChange, AccountStore, CreditChange, StoreError};

/// Accounts in a sled tree.
pub struct SledAccounts {
    tree: Chunked,
    durable: DurableFlush,
}

impl SledAccounts {
    pub(crate) fn new(db: &sled::Db, durable: DurableFlush) -> Result<SledAccounts, StoreError> {
        Ok(SledAccounts { tree: Chunked::open(db, "accounts", 4)?, durable })
    }

    /// A store in a temporary database that keeps nothing (a self-hosted
    /// service started on other stores, tests).
    pub fn temporary() -> Result<SledAccounts, StoreError> {
        let db = sled::Config::new().temporary(true).open().map_err(backend)?;
        SledAccounts::new(&db.clone(), DurableFlush::temporary(db))
    }

    /// Changes the stored record of `id` with `f` in one atomic step (`f`
    /// runs again when another write came between); the record after it,
    /// if there is one.
    fn update(&self, id: &str, mut f: impl FnMut(Option<Account>) -> Option<Account>) -> Result<Option<Account>, StoreError> {
        let corrupt = |e: serde_json::Error| StoreError::Corrupt(format!("account {id}: {e}"));
        loop {
            let current = self.tree.get_stored(id.as_bytes())?;
            let old = current.as_ref().map(|(_, value)| serde_json::from_slice::<Account>(value)).transpose().map_err(corrupt)?;
            let new = f(old);
            let bytes = new.as_ref().map(serde_json::to_vec).transpose().map_err(|e| StoreError::Backend(e.to_string()))?;
            if self.tree.compare_and_swap(id.as_bytes(), current.map(|(stored, _)| stored), bytes.as_deref())? {
                return Ok(new);
            }
        }
    }

    fn flush(&self) -> Result<(), StoreError> {
        self.durable.flush()
    }
}

#[async_trait::async_trait]
impl AccountStore for SledAccounts {
    async fn all(&self) -> Result<Vec<Account>, StoreError> {
        let mut all = Vec::new();
        for entry in self.tree.iter() {
            let (key, bytes) = entry?;
            let account = serde_json::from_slice(&bytes).map_err(|e| StoreError::Corrupt(format!("account {}: {e}", String::from_utf8_lossy(&key))))?;
            all.push(account);
        }
        Ok(all)
    }

    async fn get(&self, id: &str) -> Result<Option<Account>, StoreError> {
        let bytes = self.tree.get(id.as_bytes())?;
        bytes.map(|b| serde_json::from_slice(&b).map_err(|e| StoreError::Corrupt(format!("account {id}: {e}")))).transpose()
    }

    async fn create(&self, account: &Account) -> Result<(), StoreError> {
        let bytes = serde_json::to_vec(account).map_err(|e| StoreError::Backend(e.to_string()))?;
        self.tree.put(account.id.as_bytes(), &bytes)?;
        self.flush()
    }

    async fn change(&self, id: &str, change: AccountChange) -> Result<Option<Account>, StoreError> {
        let stored = self.update(id, |old| {
            let mut account = old?;
            change.apply(&mut account);
            Some(account)
        })?;
        self.flush()?;
        Ok(stored)
    }

    async fn add_credits(&self, id: &str, delta: i64, durable: bool) -> Result<CreditChange, StoreError> {
        let mut overflow = false;
        let stored = self.update(id, |old| {
            overflow = false;
            let mut account = old?;
            match account.credits.checked_add(delta) {
                Some(credits) => account.credits = credits,
                None => overflow = true,
            }
            Some(account)
        })?;
        if durable {
            self.flush()?;
        }
        Ok(match stored {
            None => CreditChange::NoAccount,
            Some(_) if overflow => CreditChange::Overflow,
            Some(account) => CreditChange::Changed(account),
        })
    }
}
