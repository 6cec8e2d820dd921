//! The account store: where account records live (see `accounts` for the
//! rules over them). A balance changes only by [`AccountStore::add_credits`],
//! one atomic step of the store, so concurrent charges and top-ups — from
//! one process or several sharing the store — never lose one another.

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

/// Account records. They are few (a server keeps at most
/// `accounts::MAX_ACCOUNTS`): [`AccountStore::all`] reads them once at start
/// and the caller keeps them in memory.
#[async_trait::async_trait]
pub trait AccountStore: Send + Sync {
    /// Every account.
    async fn all(&self) -> Result<Vec<Account>, StoreError>;
    /// Writes `account` (a new one whole; for one that exists, every field
    /// but its balance, which only [`AccountStore::add_credits`] changes)
    /// and returns it as stored. Durable when it returns.
    async fn put(&self, account: &Account) -> Result<Account, StoreError>;
    /// Adds `delta` (negative: a charge) to the balance of account `id` in
    /// one atomic step. Durable when it returns if `durable`; otherwise soon
    /// after (a crash may forget the last moments of charges).
    async fn add_credits(&self, id: &str, delta: i64, durable: bool) -> Result<CreditChange, StoreError>;
}
