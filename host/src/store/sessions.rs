//! The session store: where web sign-in sessions live (see
//! `accounts::sessions` for the rules over them). A session is found by its
//! id, the hash of the secret its cookie carries; the secret itself is
//! never stored.

use super::{Micros, StoreError};

/// A signed-in browser: whose it is and until when.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SessionRecord {
    /// The owner it acts for (an account id, or the one owner of a server
    /// without accounts).
    pub owner: String,
    pub created_at: Micros,
    pub expires_at: Micros,
}

/// Session records by id. Calls are short (a record is a few dozen bytes)
/// and are made from request handlers; a shared backend answers them over
/// the network like any store call.
#[async_trait::async_trait]
pub trait SessionStore: Send + Sync {
    /// Stores a session. Durable when it returns.
    async fn put(&self, id: &str, session: &SessionRecord) -> Result<(), StoreError>;
    /// One session (`None`: unknown or ended).
    async fn get(&self, id: &str) -> Result<Option<SessionRecord>, StoreError>;
    /// Ends sessions (unknown ids are skipped). Durable when it returns.
    async fn delete(&self, ids: &[String]) -> Result<(), StoreError>;
    /// The sessions of `owner`, and the ids of every session that expired
    /// before `now` (whoever's: the caller ends them).
    async fn of_owner(&self, owner: &str, now: Micros) -> Result<(Vec<(String, SessionRecord)>, Vec<String>), StoreError>;
}
