//! Accounts of a cloud or serverless server: who a caller is (an API key →
//! an account), what it may do (disabled, subscription) and what it has
//! left (credits). Records live in the sled tree `accounts` beside the
//! jobs (id → JSON) and, being few, all in memory too: authenticating a
//! request is one keyed hash and one map lookup. Writes go to sled first,
//! then to memory, one at a time. A job's owner is its account's id.

pub mod keys;

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use serde::{Deserialize, Serialize};

pub use keys::KeyHasher;

use crate::store::{Micros, now_micros};

/// Longest account name.
pub const MAX_NAME_LEN: usize = 64;
/// Most accounts one server keeps (each is held in memory).
pub const MAX_ACCOUNTS: usize = 100_000;
/// The tier an account gets when none is named.
pub const DEFAULT_TIER: &str = "default";

/// One account.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Account {
    /// `acct_` and 32 hex digits: the `owner` of its jobs and assets.
    pub id: String,
    /// Unique, chosen by the operator: letters, digits, `-`, `_`, `.`.
    pub name: String,
    /// Its API keys, as hex of their keyed hashes (never the keys).
    pub key_hashes: Vec<String>,
    /// Balance in credits; may go negative by at most the job that crossed zero.
    pub credits: i64,
    /// The tier's name (its limits are the scheduler's business).
    pub tier: String,
    /// Whether its subscription is active (the cloud's compatibility API
    /// runs workflows only then).
    pub subscription_active: bool,
    /// A disabled account's keys answer 403.
    pub disabled: bool,
    pub created_at: Micros,
}

/// What a job costs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pricing {
    pub credits_per_second: u64,
    pub min_per_job: u64,
}

impl Pricing {
    /// The price of `execution_ms` of execution: per second, rounded up,
    /// never below the minimum.
    pub fn cost(&self, execution_ms: u64) -> i64 {
        let per_time = execution_ms.saturating_mul(self.credits_per_second).div_ceil(1000);
        i64::try_from(per_time.max(self.min_per_job)).unwrap_or(i64::MAX)
    }
}

/// Why an account operation failed.
#[derive(Debug, thiserror::Error)]
pub enum AccountError {
    #[error("account names are 1 to {MAX_NAME_LEN} letters, digits, '-', '_' or '.'")]
    InvalidName,
    #[error("tier names are 1 to {MAX_NAME_LEN} letters, digits, '-', '_' or '.'")]
    InvalidTier,
    #[error("an account named {0:?} exists")]
    NameTaken(String),
    #[error("no account named {0:?}")]
    NotFound(String),
    #[error("this server keeps at most {MAX_ACCOUNTS} accounts")]
    TooMany,
    #[error("the credit balance would overflow")]
    Overflow,
    #[error("account store: {0}")]
    Store(String),
}

fn store_err(e: impl std::fmt::Display) -> AccountError {
    AccountError::Store(e.to_string())
}

fn plain_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= MAX_NAME_LEN && name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

fn hex(bytes: &[u8; 32]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The account store.
pub struct Accounts {
    tree: sled::Tree,
    hasher: KeyHasher,
    pricing: Pricing,
    by_id: RwLock<HashMap<String, Arc<Account>>>,
    /// Key hash → account id (shared: a request's caller takes no allocation).
    by_key: RwLock<HashMap<[u8; 32], Arc<str>>>,
    /// Serializes writes (read, change, store, publish).
    writing: Mutex<()>,
}

impl Accounts {
    /// The accounts in `tree`, keys hashed by `hasher`.
    pub fn open(tree: sled::Tree, hasher: KeyHasher, pricing: Pricing) -> Result<Accounts, AccountError> {
        let (mut by_id, mut by_key) = (HashMap::new(), HashMap::new());
        for entry in tree.iter() {
            let (_, bytes) = entry.map_err(store_err)?;
            let account: Account = serde_json::from_slice(&bytes).map_err(store_err)?;
            index_keys(&mut by_key, &account);
            by_id.insert(account.id.clone(), Arc::new(account));
        }
        Ok(Accounts { tree, hasher, pricing, by_id: RwLock::new(by_id), by_key: RwLock::new(by_key), writing: Mutex::new(()) })
    }

    /// An empty store that keeps nothing on disk (a self-hosted service
    /// started on other stores, tests).
    pub fn in_memory(pricing: Pricing) -> Result<Accounts, AccountError> {
        let db = sled::Config::new().temporary(true).open().map_err(store_err)?;
        Accounts::open(db.open_tree("accounts").map_err(store_err)?, KeyHasher::ephemeral(), pricing)
    }

    pub fn pricing(&self) -> Pricing {
        self.pricing
    }

    /// The account `key` belongs to (disabled ones too: the caller tells
    /// 401 from 403).
    pub fn authenticate(&self, key: &str) -> Option<Arc<Account>> {
        self.authenticate_id(key).map(|(_, account)| account)
    }

    /// [`Accounts::authenticate`] with the account's id as a shared string.
    pub fn authenticate_id(&self, key: &str) -> Option<(Arc<str>, Arc<Account>)> {
        let hash = self.hasher.hash(key);
        let id = self.by_key.read().get(&hash).cloned()?;
        let account = self.by_id.read().get(&*id).cloned()?;
        Some((id, account))
    }

    /// The account with id `id` (a job's owner).
    pub fn get(&self, id: &str) -> Option<Arc<Account>> {
        self.by_id.read().get(id).cloned()
    }

    /// The account named `name`.
    pub fn by_name(&self, name: &str) -> Option<Arc<Account>> {
        self.by_id.read().values().find(|a| a.name == name).cloned()
    }

    /// Every account, by name.
    pub fn list(&self) -> Vec<Arc<Account>> {
        let mut all: Vec<Arc<Account>> = self.by_id.read().values().cloned().collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all
    }

    /// Creates an account; returns it and its API key (shown once, never stored).
    pub fn create(&self, name: &str, credits: i64, tier: Option<&str>) -> Result<(Arc<Account>, String), AccountError> {
        if !plain_name(name) {
            return Err(AccountError::InvalidName);
        }
        let tier = tier.unwrap_or(DEFAULT_TIER);
        if !plain_name(tier) {
            return Err(AccountError::InvalidTier);
        }
        let _writing = self.writing.lock();
        if self.by_name(name).is_some() {
            return Err(AccountError::NameTaken(name.to_string()));
        }
        if self.by_id.read().len() >= MAX_ACCOUNTS {
            return Err(AccountError::TooMany);
        }
        let key = keys::new_key();
        let account = Account {
            id: format!("acct_{}", uuid::Uuid::new_v4().simple()),
            name: name.to_string(),
            key_hashes: vec![hex(&self.hasher.hash(&key))],
            credits,
            tier: tier.to_string(),
            subscription_active: true,
            disabled: false,
            created_at: now_micros(),
        };
        let account = self.store(account, true)?;
        Ok((account, key))
    }

    /// Adds `amount` (may be negative) to the balance of account `name`.
    pub fn add_credits(&self, name: &str, amount: i64) -> Result<Arc<Account>, AccountError> {
        self.change_named(name, |a| {
            a.credits = a.credits.checked_add(amount).ok_or(AccountError::Overflow)?;
            Ok(())
        })
    }

    /// Sets whether the subscription of account `name` is active.
    pub fn set_subscription(&self, name: &str, active: bool) -> Result<Arc<Account>, AccountError> {
        self.change_named(name, |a| {
            a.subscription_active = active;
            Ok(())
        })
    }

    /// Disables account `name`: its keys answer 403 from now on.
    pub fn disable(&self, name: &str) -> Result<Arc<Account>, AccountError> {
        self.change_named(name, |a| {
            a.disabled = true;
            Ok(())
        })
    }

    /// Charges the account `owner` for a job that executed `execution_ms`;
    /// returns the new balance (`None`: the owner is no account, as on a
    /// self-hosted server). Not flushed: sled's periodic flush makes it
    /// durable (a crash may forget the last half second of charges).
    pub fn charge(&self, owner: &str, execution_ms: u64) -> Option<i64> {
        let cost = self.pricing.cost(execution_ms);
        let _writing = self.writing.lock();
        let mut account = (*self.get(owner)?).clone();
        account.credits = account.credits.saturating_sub(cost);
        match self.store(account, false) {
            Ok(a) => Some(a.credits),
            Err(e) => {
                tracing::error!(owner, error = %e, "cannot record a charge");
                None
            }
        }
    }

    /// Whether `owner` may start paid work: an account with a positive
    /// balance, or no account at all (self-hosted). The one answer to "has
    /// this account funds" — for job submission and for partner nodes.
    pub fn has_funds(&self, owner: &str) -> bool {
        self.get(owner).is_none_or(|a| a.credits > 0)
    }

    /// Whether `owner` is a disabled account.
    pub fn is_disabled(&self, owner: &str) -> bool {
        self.get(owner).is_some_and(|a| a.disabled)
    }

    /// The tier of account `owner` (`None`: no such account).
    pub fn tier(&self, owner: &str) -> Option<String> {
        self.get(owner).map(|a| a.tier.clone())
    }

    /// Whether account `owner`'s subscription is active (`true` for owners
    /// that are no account).
    pub fn subscription_active(&self, owner: &str) -> bool {
        self.get(owner).is_none_or(|a| a.subscription_active)
    }

    fn change_named(&self, name: &str, f: impl FnOnce(&mut Account) -> Result<(), AccountError>) -> Result<Arc<Account>, AccountError> {
        let _writing = self.writing.lock();
        let mut account = (*self.by_name(name).ok_or_else(|| AccountError::NotFound(name.to_string()))?).clone();
        f(&mut account)?;
        self.store(account, true)
    }

    /// Writes `account` (flushed when `flush`) and publishes it in memory.
    /// Called with `writing` held.
    fn store(&self, account: Account, flush: bool) -> Result<Arc<Account>, AccountError> {
        let bytes = serde_json::to_vec(&account).map_err(store_err)?;
        self.tree.insert(account.id.as_bytes(), bytes).map_err(store_err)?;
        if flush {
            self.tree.flush().map_err(store_err)?;
        }
        index_keys(&mut self.by_key.write(), &account);
        let account = Arc::new(account);
        self.by_id.write().insert(account.id.clone(), account.clone());
        Ok(account)
    }
}

fn index_keys(by_key: &mut HashMap<[u8; 32], Arc<str>>, account: &Account) {
    let id: Arc<str> = Arc::from(account.id.as_str());
    for h in &account.key_hashes {
        let mut bytes = [0u8; 32];
        let parsed = (0..32).all(|i| match h.get(2 * i..2 * i + 2).and_then(|b| u8::from_str_radix(b, 16).ok()) {
            Some(v) => {
                bytes[i] = v;
                true
            }
            None => false,
        });
        if parsed {
            by_key.insert(bytes, id.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PRICE: Pricing = Pricing { credits_per_second: 10, min_per_job: 3 };

    #[test]
    fn prices_round_up_and_never_go_below_the_minimum() {
        assert_eq!(PRICE.cost(0), 3);
        assert_eq!(PRICE.cost(250), 3);
        assert_eq!(PRICE.cost(301), 4);
        assert_eq!(PRICE.cost(2000), 20);
        // Saturating, never wrapping.
        assert_eq!(Pricing { credits_per_second: u64::MAX, min_per_job: 0 }.cost(u64::MAX), (u64::MAX / 1000 + 1) as i64);
        assert_eq!(Pricing { credits_per_second: 1, min_per_job: u64::MAX }.cost(1), i64::MAX);
    }

    #[test]
    fn accounts_survive_a_reopen_and_keys_find_them() {
        let dir = tempfile::tempdir().unwrap();
        let open = || {
            // sled's flusher lets go of the lock a moment after the last
            // handle is dropped (as `SledMeta::open` also waits for).
            let db = (0..200)
                .find_map(|_| sled::open(dir.path().join("db")).map_err(|_| std::thread::sleep(std::time::Duration::from_millis(20))).ok())
                .expect("the database opens");
            let tree = db.open_tree("accounts").unwrap();
            (db, Accounts::open(tree, KeyHasher::load_or_create(dir.path()).unwrap(), PRICE).unwrap())
        };
        let (key, id) = {
            let (_db, accounts) = open();
            let (a, key) = accounts.create("alice", 5, Some("pro")).unwrap();
            assert!(matches!(accounts.create("alice", 0, None), Err(AccountError::NameTaken(_))));
            assert!(matches!(accounts.create("bad name", 0, None), Err(AccountError::InvalidName)));
            assert!(!serde_json::to_string(&*a).unwrap().contains(&key), "the key itself is never stored");
            assert_eq!(accounts.charge(&a.id, 1000), Some(-5), "a charge may cross zero");
            assert!(!accounts.has_funds(&a.id));
            accounts.add_credits("alice", 10).unwrap();
            accounts.set_subscription("alice", false).unwrap();
            (key, a.id.clone())
        };
        let (_db, accounts) = open();
        let a = accounts.authenticate(&key).unwrap();
        assert_eq!((a.id.as_str(), a.credits, a.tier.as_str(), a.subscription_active), (id.as_str(), 5, "pro", false));
        assert_eq!(accounts.tier(&id).as_deref(), Some("pro"));
        assert!(accounts.authenticate("kiln_nope").is_none());
        assert!(accounts.has_funds("local") && accounts.subscription_active("local") && accounts.charge("local", 10).is_none());
        accounts.disable("alice").unwrap();
        assert!(accounts.authenticate(&key).unwrap().disabled);
        assert!(matches!(accounts.disable("bob"), Err(AccountError::NotFound(_))));
    }
}
