//! The account store: where account records live (see `accounts` for the
//! rules over them). Every change is one atomic step of the store that
//! touches only what it changes — a balance by [`AccountStore::add_credits`],
//! a flag by [`AccountStore::change`] — so writers sharing the store (two
//! admin calls, a charge, several processes) never undo one another.

use super::{Account, StoreError};

/// What a credit change did.
#[derive(Debug, Clone, PartialEq)]
pub enum CreditChange {
    /// The account as stored after the change.
    Changed(Account),
    /// No account has that id.
    NoAccount,
    /// The balance would leave `i64`: nothing changed.
    Overflow,
}

/// A change of an account's flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccountChange {
    /// Its subscription becomes active or not.
    Subscription(bool),
    /// Its keys answer 403 from now on.
    Disable,
}

impl AccountChange {
    /// Applies the change to a record.
    pub fn apply(self, account: &mut Account) {
        match self {
            AccountChange::Subscription(active) => account.subscription_active = active,
            AccountChange::Disable => account.disabled = true,
        }
    }
}

/// Account records. They are few (a server keeps at most
/// `accounts::MAX_ACCOUNTS`): [`AccountStore::all`] reads them once at start
/// and the caller keeps them in memory. Calls may wait for a disk or a
/// network: they are made from blocking threads and job threads, never
/// from a request runtime's workers. A write that fails may still have
/// been applied: the caller reads the record back ([`AccountStore::get`]).
#[async_trait::async_trait]
pub trait AccountStore: Send + Sync {
    /// Every account.
    async fn all(&self) -> Result<Vec<Account>, StoreError>;
    /// One account.
    async fn get(&self, id: &str) -> Result<Option<Account>, StoreError>;
    /// The accounts of `ids` that exist (the default reads them one by one).
    async fn some(&self, ids: &[String]) -> Result<Vec<Account>, StoreError> {
        let mut found = Vec::with_capacity(ids.len());
        for id in ids {
            found.extend(self.get(id).await?);
        }
        Ok(found)
    }
    /// Writes a new account. Durable when it returns.
    async fn create(&self, account: &Account) -> Result<(), StoreError>;
    /// Changes account `id`'s flags in one atomic step; the account as
    /// stored after it (`None`: no such account). Durable when it returns.
    async fn change(&self, id: &str, change: AccountChange) -> Result<Option<Account>, StoreError>;
    /// Adds `delta` (negative: a charge) to the balance of account `id` in
    /// one atomic step. Durable when it returns if `durable`; otherwise soon
    /// after (a crash may forget the last moments of charges).
    async fn add_credits(&self, id: &str, delta: i64, durable: bool) -> Result<CreditChange, StoreError>;
}
