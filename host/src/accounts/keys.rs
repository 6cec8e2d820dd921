//! API keys of accounts: how they are made and how they are stored. A key
//! is 256 random bits (`kiln_` and 64 hex digits); only its blake3 keyed by
//! a server secret is kept. Keys are high-entropy, so a fast keyed hash is
//! right (no password hash): knowing the stored hashes without the secret
//! gives nothing, and checking a key costs well under a microsecond.

use std::path::Path;

use crate::secret_file::random_key;

/// The secret file in the data directory (owner-only, created on first use).
/// The key hasher's secret's name (its file in the data directory).
pub const SECRET_FILE: &str = "accounts.key";
/// What every key starts with (recognisable in logs and secret scanners).
pub const KEY_PREFIX: &str = "kiln_";

/// Hashes keys with the server's secret.
#[derive(Clone)]
pub struct KeyHasher {
    secret: [u8; 32],
}

impl KeyHasher {
    /// Loads the secret from `dir/accounts.key`, creating it on first use.
    pub fn load_or_create(dir: &Path) -> std::io::Result<KeyHasher> {
        Ok(KeyHasher { secret: crate::secret_file::load_or_create(dir, SECRET_FILE)? })
    }

    /// A hasher with `secret` (one the PostgreSQL store shares).
    pub fn from_secret(secret: [u8; 32]) -> KeyHasher {
        KeyHasher { secret }
    }

    /// A hasher with a fresh secret that is never written (tests, an
    /// in-memory account store).
    pub fn ephemeral() -> KeyHasher {
        KeyHasher { secret: random_key() }
    }

    /// The stored form of `key`.
    pub fn hash(&self, key: &str) -> [u8; 32] {
        *blake3::keyed_hash(&self.secret, key.as_bytes()).as_bytes()
    }
}

/// A new API key.
pub fn new_key() -> String {
    let bytes = random_key();
    let mut key = String::with_capacity(KEY_PREFIX.len() + 64);
    key.push_str(KEY_PREFIX);
    for b in bytes {
        key.push_str(&format!("{b:02x}"));
    }
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_random_and_hashes_depend_on_the_secret() {
        let (a, b) = (new_key(), new_key());
        assert_ne!(a, b);
        assert!(a.starts_with(KEY_PREFIX) && a.len() == KEY_PREFIX.len() + 64, "{a}");
        let dir = tempfile::tempdir().unwrap();
        let h1 = KeyHasher::load_or_create(dir.path()).unwrap();
        let h2 = KeyHasher::load_or_create(dir.path()).unwrap();
        assert_eq!(h1.hash(&a), h2.hash(&a), "the secret survives a restart");
        assert_ne!(h1.hash(&a), h1.hash(&b));
        assert_ne!(h1.hash(&a), KeyHasher::ephemeral().hash(&a));
        assert_ne!(&h1.hash(&a), blake3::hash(a.as_bytes()).as_bytes(), "keyed, not a plain hash");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.path().join(SECRET_FILE)).unwrap().permissions().mode();
            assert_eq!(mode & 0o077, 0, "owner-only");
        }
    }
}
