//! Accounts of a cloud or serverless server: who a caller is (an API key →
//! an account), what it may do (disabled, subscription) and what it has
//! left (credits). Records live in an [`AccountStore`] (embedded: the sled
//! tree `accounts` beside the jobs) and, being few, all in memory too:
//! authenticating a request is one keyed hash and one map lookup. Writes go
//! to the store first, then to memory, one at a time; a balance changes
//! only by the store's atomic credit step. Where hosts share the store, a
//! host re-reads what another changed ([`Accounts::refresh`],
//! [`Accounts::reload`]; see `service::cluster`). A job's owner is its
//! account's id.

pub mod keys;
pub mod sessions;

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::RwLock;

pub use crate::store::Account;
pub use keys::KeyHasher;

use crate::store::{AccountChange, AccountStore, CreditChange, StoreError, now_micros};

/// Longest account name.
pub const MAX_NAME_LEN: usize = 64;
/// Most accounts one server keeps (each is held in memory).
pub const MAX_ACCOUNTS: usize = 100_000;
/// The tier an account gets when none is named.
pub const DEFAULT_TIER: &str = "default";

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

    /// Whether a balance of `credits` admits one more job while
    /// `unfinished` other jobs billed to the same account have not been
    /// charged: each holds the minimum price until it is, so submissions
    /// arriving together (on any host) never promise more than the balance
    /// covers. A balance above zero is needed even when jobs are free.
    pub fn admits(&self, credits: i64, unfinished: usize) -> bool {
        let unfinished = i128::try_from(unfinished).unwrap_or(i128::MAX);
        let held = i128::from(self.min_per_job).saturating_mul(unfinished.saturating_add(1));
        i128::from(credits) >= held.max(1)
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

impl From<StoreError> for AccountError {
    fn from(e: StoreError) -> AccountError {
        AccountError::Store(e.to_string())
    }
}

fn plain_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= MAX_NAME_LEN && name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

fn hex(bytes: &[u8; 32]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The accounts of the server.
pub struct Accounts {
    store: Arc<dyn AccountStore>,
    hasher: KeyHasher,
    pricing: Pricing,
    by_id: RwLock<HashMap<String, Arc<Account>>>,
    /// Key hash → account id (shared: a request's caller takes no allocation).
    by_key: RwLock<HashMap<[u8; 32], Arc<str>>>,
    /// Serializes writes (read, change, store, publish).
    writing: tokio::sync::Mutex<()>,
}

impl Accounts {
    /// The accounts in `store`, keys hashed by `hasher`.
    pub async fn open(store: Arc<dyn AccountStore>, hasher: KeyHasher, pricing: Pricing) -> Result<Accounts, AccountError> {
        let (by_id, by_key) = index(store.all().await?);
        Ok(Accounts { store, hasher, pricing, by_id: RwLock::new(by_id), by_key: RwLock::new(by_key), writing: tokio::sync::Mutex::new(()) })
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

    /// Every account as the store holds it now, by name: what operators
    /// are shown (where hosts share the store, a host's copy of a balance
    /// can lag another host's charge). Shows nothing.
    pub async fn list_stored(&self) -> Result<Vec<Account>, AccountError> {
        let mut all = self.store.all().await?;
        all.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(all)
    }

    /// The account named `name` as the store holds it now (see
    /// [`Accounts::list_stored`]; one this host has not heard of yet is
    /// looked for among all).
    pub async fn by_name_stored(&self, name: &str) -> Result<Account, AccountError> {
        let stored = match self.by_name(name) {
            Some(known) => self.store.get(&known.id).await?,
            None => self.store.all().await?.into_iter().find(|a| a.name == name),
        };
        stored.ok_or_else(|| AccountError::NotFound(name.to_string()))
    }

    /// Creates an account; returns it and its API key (shown once, never stored).
    pub async fn create(&self, name: &str, credits: i64, tier: Option<&str>) -> Result<(Arc<Account>, String), AccountError> {
        if !plain_name(name) {
            return Err(AccountError::InvalidName);
        }
        let tier = tier.unwrap_or(DEFAULT_TIER);
        if !plain_name(tier) {
            return Err(AccountError::InvalidTier);
        }
        let _writing = self.writing.lock().await;
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
        if let Err(e) = self.store.create(&account).await {
            self.read_back(&account.id).await;
            return Err(e.into());
        }
        Ok((self.publish(account), key))
    }

    /// Adds `amount` (may be negative) to the balance of account `name`.
    pub async fn add_credits(&self, name: &str, amount: i64) -> Result<Arc<Account>, AccountError> {
        let _writing = self.writing.lock().await;
        let id = self.by_name(name).ok_or_else(|| AccountError::NotFound(name.to_string()))?.id.clone();
        let changed = self.store.add_credits(&id, amount, true).await;
        let changed = match changed {
            Ok(changed) => changed,
            Err(e) => {
                self.read_back(&id).await;
                return Err(e.into());
            }
        };
        match changed {
            CreditChange::Changed(account) => Ok(self.publish(account)),
            CreditChange::NoAccount => Err(AccountError::NotFound(name.to_string())),
            CreditChange::Overflow => Err(AccountError::Overflow),
        }
    }

    /// Sets whether the subscription of account `name` is active.
    pub async fn set_subscription(&self, name: &str, active: bool) -> Result<Arc<Account>, AccountError> {
        self.change_named(name, AccountChange::Subscription(active)).await
    }

    /// Disables account `name`: its keys answer 403 from now on.
    pub async fn disable(&self, name: &str) -> Result<Arc<Account>, AccountError> {
        self.change_named(name, AccountChange::Disable).await
    }

    /// Charges the account `owner` for a job that executed `execution_ms`;
    /// returns the new balance (`None`: the owner is no account, as on a
    /// self-hosted server). Not made durable at once (see
    /// [`AccountStore::add_credits`]).
    pub async fn charge(&self, owner: &str, execution_ms: u64) -> Option<i64> {
        self.get(owner)?;
        // The write turn keeps what memory shows in the store's order.
        let _writing = self.writing.lock().await;
        let cost = self.pricing.cost(execution_ms);
        match self.store.add_credits(owner, cost.saturating_neg(), false).await {
            Ok(CreditChange::Changed(account)) => Some(self.publish(account).credits),
            Ok(CreditChange::NoAccount) => None,
            Ok(CreditChange::Overflow) => {
                tracing::error!(owner, cost, "a charge would overflow the balance; not recorded");
                None
            }
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

    /// Whether `owner` may queue one more job while `unfinished` other jobs
    /// billed to it have not been charged ([`Pricing::admits`]); `true` for
    /// owners that are no account.
    pub fn admits(&self, owner: &str, unfinished: usize) -> bool {
        self.get(owner).is_none_or(|a| self.pricing.admits(a.credits, unfinished))
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

    async fn change_named(&self, name: &str, change: AccountChange) -> Result<Arc<Account>, AccountError> {
        let _writing = self.writing.lock().await;
        let id = self.by_name(name).ok_or_else(|| AccountError::NotFound(name.to_string()))?.id.clone();
        match self.store.change(&id, change).await {
            Ok(Some(account)) => Ok(self.publish(account)),
            Ok(None) => Err(AccountError::NotFound(name.to_string())),
            Err(e) => {
                self.read_back(&id).await;
                Err(e.into())
            }
        }
    }

    /// Shows accounts `ids` as the store holds them now (another host
    /// changed them: hosts sharing a store hear of each other's writes).
    pub async fn refresh(&self, ids: &[String]) -> Result<(), AccountError> {
        let _writing = self.writing.lock().await;
        for account in self.store.some(ids).await? {
            self.publish(account);
        }
        Ok(())
    }

    /// Whether `owner` may start paid work by the balance the store holds
    /// now (see [`Accounts::has_funds`]; where hosts share the store,
    /// another's charge may not have been heard yet). Shows nothing.
    pub async fn stored_funds(&self, owner: &str) -> Result<bool, AccountError> {
        if self.get(owner).is_none() {
            return Ok(true);
        }
        Ok(self.store.get(owner).await?.is_none_or(|a| a.credits > 0))
    }

    /// Shows every account as the store holds it now (after notices of
    /// other hosts' writes may have been missed).
    pub async fn reload(&self) -> Result<(), AccountError> {
        let _writing = self.writing.lock().await;
        let (by_id, by_key) = index(self.store.all().await?);
        *self.by_key.write() = by_key;
        *self.by_id.write() = by_id;
        Ok(())
    }

    /// After a failed write, which may still have been applied: memory
    /// shows what the store holds (a retried top-up then starts from the
    /// stored balance). Called with `writing` held.
    async fn read_back(&self, id: &str) {
        match self.store.get(id).await {
            Ok(Some(account)) => drop(self.publish(account)),
            Ok(None) => {}
            Err(e) => tracing::error!(account = id, error = %e, "cannot read an account back after a failed write"),
        }
    }

    /// Shows `account`, as stored, to readers. Called with `writing` held.
    fn publish(&self, account: Account) -> Arc<Account> {
        index_keys(&mut self.by_key.write(), &account);
        let account = Arc::new(account);
        self.by_id.write().insert(account.id.clone(), account.clone());
        account
    }
}

/// Accounts by id and by key hash.
type Index = (HashMap<String, Arc<Account>>, HashMap<[u8; 32], Arc<str>>);

fn index(all: Vec<Account>) -> Index {
    let (mut by_id, mut by_key) = (HashMap::with_capacity(all.len()), HashMap::with_capacity(all.len()));
    for account in all {
        index_keys(&mut by_key, &account);
        by_id.insert(account.id.clone(), Arc::new(account));
    }
    (by_id, by_key)
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
    fn a_balance_admits_what_it_covers_at_the_minimum_price() {
        // 10 credits at 3 a job: three jobs, the fourth would overdraw.
        assert!(PRICE.admits(10, 0) && PRICE.admits(10, 2));
        assert!(!PRICE.admits(10, 3));
        assert!(PRICE.admits(3, 0) && !PRICE.admits(2, 0), "the first job needs its minimum too");
        assert!(!PRICE.admits(0, 0) && !PRICE.admits(-5, 0));
        // Free jobs still need a balance above zero.
        let free = Pricing { credits_per_second: 10, min_per_job: 0 };
        assert!(free.admits(1, 1_000_000) && !free.admits(0, 0));
        // Never overflowing.
        let dear = Pricing { credits_per_second: 1, min_per_job: u64::MAX };
        assert!(!dear.admits(i64::MAX, usize::MAX) && !dear.admits(i64::MAX, 0));
        assert!(Pricing { credits_per_second: 1, min_per_job: 1 }.admits(i64::MAX, 1 << 40));
    }

    #[tokio::test]
    async fn accounts_survive_a_reopen_and_keys_find_them() {
        let dir = tempfile::tempdir().unwrap();
        let open = async || {
            // Waits for the previous handle's lock to go (see `SledMeta::open`).
            let db = crate::store::SledMeta::open(&dir.path().join("db")).unwrap();
            let store = Arc::new(db.accounts().unwrap());
            (db, Accounts::open(store, KeyHasher::load_or_create(dir.path()).unwrap(), PRICE).await.unwrap())
        };
        let (key, id) = {
            let (_db, accounts) = open().await;
            let (a, key) = accounts.create("alice", 5, Some("pro")).await.unwrap();
            assert!(matches!(accounts.create("alice", 0, None).await, Err(AccountError::NameTaken(_))));
            assert!(matches!(accounts.create("bad name", 0, None).await, Err(AccountError::InvalidName)));
            assert!(!serde_json::to_string(&*a).unwrap().contains(&key), "the key itself is never stored");
            assert_eq!(accounts.charge(&a.id, 1000).await, Some(-5), "a charge may cross zero");
            assert!(!accounts.has_funds(&a.id));
            accounts.add_credits("alice", 10).await.unwrap();
            assert!(matches!(accounts.add_credits("alice", i64::MAX).await, Err(AccountError::Overflow)));
            assert_eq!(accounts.by_name("alice").unwrap().credits, 5, "a refused change changes nothing");
            accounts.set_subscription("alice", false).await.unwrap();
            (key, a.id.clone())
        };
        let (_db, accounts) = open().await;
        let a = accounts.authenticate(&key).unwrap();
        assert_eq!((a.id.as_str(), a.credits, a.tier.as_str(), a.subscription_active), (id.as_str(), 5, "pro", false));
        assert_eq!(accounts.tier(&id).as_deref(), Some("pro"));
        assert!(accounts.authenticate("kiln_nope").is_none());
        assert!(accounts.has_funds("local") && accounts.subscription_active("local") && accounts.charge("local", 10).await.is_none());
        accounts.disable("alice").await.unwrap();
        assert!(accounts.authenticate(&key).unwrap().disabled);
        assert!(matches!(accounts.disable("bob").await, Err(AccountError::NotFound(_))));
    }

    /// Two servers sharing one account store (here: two `Accounts` over one
    /// tree) charge and top up concurrently: no change is lost, and a
    /// record write by one never puts back a balance the other changed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_credit_changes_through_two_servers_are_all_kept() {
        let store: Arc<dyn AccountStore> = Arc::new(crate::store::SledAccounts::temporary().unwrap());
        let hasher = KeyHasher::ephemeral();
        let first = Arc::new(Accounts::open(store.clone(), hasher.clone(), PRICE).await.unwrap());
        let (a, _) = first.create("alice", 10_000, None).await.unwrap();
        let second = Arc::new(Accounts::open(store.clone(), hasher, PRICE).await.unwrap());
        let mut tasks = Vec::new();
        for i in 0..200 {
            let (accounts, id) = (if i % 2 == 0 { first.clone() } else { second.clone() }, a.id.clone());
            tasks.push(tokio::spawn(async move {
                match i % 4 {
                    // 1 s of execution: 10 credits.
                    0 | 1 => drop(accounts.charge(&id, 1000).await),
                    2 => drop(accounts.add_credits("alice", 3).await.unwrap()),
                    // A record write from a stale copy of the balance.
                    _ => drop(accounts.set_subscription("alice", i % 8 == 3).await.unwrap()),
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let stored = store.get(&a.id).await.unwrap().unwrap();
        assert_eq!(stored.credits, 10_000 - 100 * 10 + 50 * 3);
        // A flag one server set survives the other's change of another flag.
        first.disable("alice").await.unwrap();
        let seen = second.set_subscription("alice", true).await.unwrap();
        assert!(seen.disabled && store.get(&a.id).await.unwrap().unwrap().disabled, "the disable is kept");
    }

    /// What operators are shown where servers share the store: the stored
    /// balance, not this server's copy, and an account another server
    /// created before this one heard of it.
    #[tokio::test]
    async fn the_stored_view_shows_other_servers_writes() {
        let store: Arc<dyn AccountStore> = Arc::new(crate::store::SledAccounts::temporary().unwrap());
        let hasher = KeyHasher::ephemeral();
        let first = Accounts::open(store.clone(), hasher.clone(), PRICE).await.unwrap();
        first.create("alice", 100, None).await.unwrap();
        let second = Accounts::open(store.clone(), hasher, PRICE).await.unwrap();
        first.create("bob", 50, None).await.unwrap();
        assert_eq!(first.charge(&first.by_name("alice").unwrap().id, 2000).await, Some(80));
        assert_eq!(second.by_name("alice").unwrap().credits, 100, "its copy, not yet told");
        assert!(second.by_name("bob").is_none());
        assert_eq!(second.by_name_stored("alice").await.unwrap().credits, 80);
        assert_eq!(second.by_name_stored("bob").await.unwrap().credits, 50);
        assert!(matches!(second.by_name_stored("carol").await, Err(AccountError::NotFound(_))));
        let listed: Vec<(String, i64)> = second.list_stored().await.unwrap().into_iter().map(|a| (a.name, a.credits)).collect();
        assert_eq!(listed, [("alice".to_string(), 80), ("bob".to_string(), 50)]);
    }
}
