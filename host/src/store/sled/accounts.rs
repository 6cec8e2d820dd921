//! [`AccountStore`] on a sled tree (`accounts`: id → the record's JSON),
//! beside the jobs in the same database.

use super::backend;
use super::durable::DurableFlush;
use crate::store::{Account, AccountChange, AccountStore, CreditChange, StoreError};

/// Accounts in a sled tree.
pub struct SledAccounts {
    tree: sled::Tree,
    durable: DurableFlush,
}

impl SledAccounts {
    pub(crate) fn new(tree: sled::Tree, durable: DurableFlush) -> SledAccounts {
        SledAccounts { tree, durable }
    }

    /// A store in a temporary database that keeps nothing (a self-hosted
    /// service started on other stores, tests).
    pub fn temporary() -> Result<SledAccounts, StoreError> {
        let db = sled::Config::new().temporary(true).open().map_err(backend)?;
        Ok(SledAccounts { tree: db.open_tree("accounts").map_err(backend)?, durable: DurableFlush::temporary(db) })
    }

    /// Changes the stored record of `id` with `f` in one atomic step
    /// (sled retries `f` when another write came between); the record after
    /// it, if there was one.
    fn update(&self, id: &str, mut f: impl FnMut(Option<Account>) -> Option<Account>) -> Result<Option<Account>, StoreError> {
        let mut failed = None;
        let stored = self
            .tree
            .update_and_fetch(id.as_bytes(), |old| {
                failed = None;
                let old = match old.map(serde_json::from_slice::<Account>).transpose() {
                    Ok(old) => old,
                    Err(e) => {
                        failed = Some(StoreError::Corrupt(format!("account {id}: {e}")));
                        return old.map(<[u8]>::to_vec);
                    }
                };
                let new = f(old)?;
                match serde_json::to_vec(&new) {
                    Ok(bytes) => Some(bytes),
                    Err(e) => {
                        failed = Some(StoreError::Backend(e.to_string()));
                        None
                    }
                }
            })
            .map_err(backend)?;
        if let Some(e) = failed {
            return Err(e);
        }
        stored.map(|bytes| serde_json::from_slice(&bytes).map_err(|e| StoreError::Corrupt(format!("account {id}: {e}")))).transpose()
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
            let (key, bytes) = entry.map_err(backend)?;
            let account = serde_json::from_slice(&bytes).map_err(|e| StoreError::Corrupt(format!("account {}: {e}", String::from_utf8_lossy(&key))))?;
            all.push(account);
        }
        Ok(all)
    }

    async fn get(&self, id: &str) -> Result<Option<Account>, StoreError> {
        let bytes = self.tree.get(id.as_bytes()).map_err(backend)?;
        bytes.map(|b| serde_json::from_slice(&b).map_err(|e| StoreError::Corrupt(format!("account {id}: {e}")))).transpose()
    }

    async fn create(&self, account: &Account) -> Result<(), StoreError> {
        let bytes = serde_json::to_vec(account).map_err(|e| StoreError::Backend(e.to_string()))?;
        self.tree.insert(account.id.as_bytes(), bytes).map_err(backend)?;
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
