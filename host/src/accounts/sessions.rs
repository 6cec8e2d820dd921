//! Web sign-in sessions: a browser trades an API key (or a self-hosted
//! server's token) for a session, whose secret travels in an HttpOnly
//! cookie and stands in for the key on the HTTP routes and `/ws`. Sessions
//! are server-side records in a [`SessionStore`] (embedded: the sled tree
//! `sessions`), so they survive a restart and end at once when signed out,
//! when they expire (`session_ttl_s`), or beyond [`MAX_PER_OWNER`] (the
//! oldest goes first). Only the secret's blake3 hash is stored. The cookie
//! rules (names, attributes, the same-origin check) live at the edge,
//! `api::session`.

use std::sync::Arc;

use crate::secret_file::random_key;
use crate::store::{Micros, SessionRecord, SessionStore, StoreError, now_micros};

/// Most sessions one owner keeps (browsers signed in at once).
pub const MAX_PER_OWNER: usize = 16;

/// The sessions of a server.
pub struct Sessions {
    store: Arc<dyn SessionStore>,
    ttl_micros: Micros,
}

/// A secret's session id: the hex of its blake3 hash.
fn id_of(secret: &str) -> String {
    blake3::hash(secret.as_bytes()).to_hex().to_string()
}

/// Whether `secret` has the shape of one this module hands out (64 hex
/// digits): anything else is not looked up at all.
fn well_formed(secret: &str) -> bool {
    secret.len() == 64 && secret.bytes().all(|b| b.is_ascii_hexdigit())
}

impl Sessions {
    pub fn new(store: Arc<dyn SessionStore>, ttl_s: u64) -> Sessions {
        Sessions { store, ttl_micros: Micros::try_from(ttl_s.saturating_mul(1_000_000)).unwrap_or(Micros::MAX) }
    }

    /// Starts a session for `owner`: its secret (for the cookie) and
    /// record. Ends the owner's oldest beyond [`MAX_PER_OWNER`] and every
    /// expired session found on the way.
    pub async fn start(&self, owner: &str) -> Result<(String, SessionRecord), StoreError> {
        let now = now_micros();
        let secret: String = random_key().iter().map(|b| format!("{b:02x}")).collect();
        let record = SessionRecord { owner: owner.to_string(), created_at: now, expires_at: now.saturating_add(self.ttl_micros) };
        let (mut own, mut ended) = self.store.of_owner(owner, now).await?;
        own.sort_by_key(|(_, s)| s.created_at);
        let excess = (own.len() + 1).saturating_sub(MAX_PER_OWNER);
        ended.extend(own.into_iter().take(excess).map(|(id, _)| id));
        if !ended.is_empty() {
            self.store.delete(&ended).await?;
        }
        self.store.put(&id_of(&secret), &record).await?;
        Ok((secret, record))
    }

    /// The live session `secret` opens (`None`: unknown, ended or expired;
    /// an expired one is ended on the way).
    pub async fn find(&self, secret: &str) -> Result<Option<SessionRecord>, StoreError> {
        if !well_formed(secret) {
            return Ok(None);
        }
        let id = id_of(secret);
        match self.store.get(&id).await? {
            Some(session) if session.expires_at > now_micros() => Ok(Some(session)),
            Some(_) => {
                self.store.delete(&[id]).await?;
                Ok(None)
            }
            None => Ok(None),
        }
    }

    /// Ends the session `secret` opens (signing out); unknown is fine.
    pub async fn end(&self, secret: &str) -> Result<(), StoreError> {
        if well_formed(secret) { self.store.delete(&[id_of(secret)]).await } else { Ok(()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::SledSessions;

    fn sessions(ttl_s: u64) -> (Sessions, Arc<SledSessions>) {
        let store = Arc::new(SledSessions::temporary().unwrap());
        (Sessions::new(store.clone(), ttl_s), store)
    }

    #[tokio::test]
    async fn a_session_opens_until_it_is_ended_and_its_secret_is_not_stored() {
        let (s, store) = sessions(3600);
        let (secret, record) = s.start("acct-1").await.unwrap();
        assert_eq!(s.find(&secret).await.unwrap(), Some(record.clone()));
        assert!(store.get(&secret).await.unwrap().is_none(), "stored by its hash only");
        assert_eq!(s.find(&secret.to_uppercase()).await.unwrap(), None);
        assert_eq!(s.find("kiln_not_a_session").await.unwrap(), None);
        s.end(&secret).await.unwrap();
        assert_eq!(s.find(&secret).await.unwrap(), None);
    }

    #[tokio::test]
    async fn expired_sessions_open_nothing_and_are_ended() {
        let (s, store) = sessions(0);
        let (secret, _) = s.start("acct-1").await.unwrap();
        assert_eq!(s.find(&secret).await.unwrap(), None);
        assert!(store.get(&id_of(&secret)).await.unwrap().is_none());
    }

    #[tokio::test]
    async fn an_owner_keeps_at_most_its_newest_sessions() {
        let (s, _) = sessions(3600);
        let mut secrets = Vec::new();
        for _ in 0..MAX_PER_OWNER + 3 {
            secrets.push(s.start("acct-1").await.unwrap().0);
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
        let other = s.start("acct-2").await.unwrap().0;
        let mut open = Vec::new();
        for secret in &secrets {
            open.push(s.find(secret).await.unwrap().is_some());
        }
        assert_eq!(open.iter().filter(|o| **o).count(), MAX_PER_OWNER);
        assert!(open[..3].iter().all(|o| !o), "the oldest ended first: {open:?}");
        assert!(s.find(&other).await.unwrap().is_some(), "another owner's session stays");
    }
}
