//! [`SessionStore`] on a sled tree (`sessions`: id → the record's JSON),
//! beside the accounts in the same database. The tree holds at most
//! `accounts::sessions::MAX_PER_OWNER` sessions per owner, so a scan of it
//! at sign-in is short.

use super::backend;
use super::durable::DurableFlush;
use crate::store::{Micros, SessionRecord, SessionStore, StoreError};

/// Sessions in a sled tree.
pub struct SledSessions {
    tree: sled::Tree,
    durable: DurableFlush,
}

impl SledSessions {
    pub(crate) fn new(tree: sled::Tree, durable: DurableFlush) -> SledSessions {
        SledSessions { tree, durable }
    }

    /// A store in a temporary database that keeps nothing (a service
    /// started on other stores, tests).
    pub fn temporary() -> Result<SledSessions, StoreError> {
        let db = sled::Config::new().temporary(true).open().map_err(backend)?;
        Ok(SledSessions { tree: db.open_tree("sessions").map_err(backend)?, durable: DurableFlush::temporary(db) })
    }
}

fn decode(id: &[u8], bytes: &[u8]) -> Result<SessionRecord, StoreError> {
    serde_json::from_slice(bytes).map_err(|e| StoreError::Corrupt(format!("session {}: {e}", String::from_utf8_lossy(id))))
}

#[async_trait::async_trait]
impl SessionStore for SledSessions {
    async fn put(&self, id: &str, session: &SessionRecord) -> Result<(), StoreError> {
        let bytes = serde_json::to_vec(session).map_err(|e| StoreError::Backend(e.to_string()))?;
        self.tree.insert(id.as_bytes(), bytes).map_err(backend)?;
        self.durable.flush()
    }

    async fn get(&self, id: &str) -> Result<Option<SessionRecord>, StoreError> {
        self.tree.get(id.as_bytes()).map_err(backend)?.map(|bytes| decode(id.as_bytes(), &bytes)).transpose()
    }

    async fn delete(&self, ids: &[String]) -> Result<(), StoreError> {
        let mut batch = sled::Batch::default();
        for id in ids {
            batch.remove(id.as_bytes());
        }
        self.tree.apply_batch(batch).map_err(backend)?;
        self.durable.flush()
    }

    async fn of_owner(&self, owner: &str, now: Micros) -> Result<(Vec<(String, SessionRecord)>, Vec<String>), StoreError> {
        let (mut own, mut expired) = (Vec::new(), Vec::new());
        for entry in self.tree.iter() {
            let (id, bytes) = entry.map_err(backend)?;
            let id_text = String::from_utf8_lossy(&id).into_owned();
            // A record that cannot be read is ended like an expired one.
            match decode(&id, &bytes) {
                Ok(session) if session.expires_at <= now => expired.push(id_text),
                Ok(session) if session.owner == owner => own.push((id_text, session)),
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "an unreadable session record is dropped");
                    expired.push(id_text);
                }
            }
        }
        Ok((own, expired))
    }
}
