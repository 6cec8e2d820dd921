//! API keys of accounts: how they are made and how they are stored. A key
//! is 256 random bits (`kiln_` and 64 hex digits); only its blake3 keyed by
//! a server secret is kept. Keys are high-entropy, so a fast keyed hash is
//! right (no password hash): knowing the stored hashes without the secret
//! gives nothing, and checking a key costs well under a microsecond.

use std::path::Path;

/// The secret file in the data directory (owner-only, created on first use).
const SECRET_FILE: &str = "accounts.key";
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
        let path = dir.join(SECRET_FILE);
        if let Ok(bytes) = std::fs::read(&path)
            && let Ok(secret) = <[u8; 32]>::try_from(bytes.as_slice())
        {
            return Ok(KeyHasher { secret });
        }
        let secret = random_bytes();
        std::fs::create_dir_all(dir)?;
        let tmp = dir.join(format!("{SECRET_FILE}.tmp"));
        {
            use std::io::Write;
            let mut options = std::fs::File::options();
            options.write(true).create(true).truncate(true);
            #[cfg(unix)]
            std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
            let mut f = options.open(&tmp)?;
            f.write_all(&secret)?;
            f.sync_all()?;
        }
        std::fs::rename(&tmp, &path)?;
        Ok(KeyHasher { secret })
    }

    /// A hasher with a fresh secret that is never written (tests, an
    /// in-memory account store).
    pub fn ephemeral() -> KeyHasher {
        KeyHasher { secret: random_bytes() }
    }

    /// The stored form of `key`.
    pub fn hash(&self, key: &str) -> [u8; 32] {
        *blake3::keyed_hash(&self.secret, key.as_bytes()).as_bytes()
    }
}

/// 32 bytes from the OS's generator (through two v4 UUIDs: 244 random bits).
fn random_bytes() -> [u8; 32] {
    let mut out = [0u8; 32];
    out[..16].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
    out[16..].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
    // Spread the 244 bits over all 256 (the UUID version bits are fixed).
    *blake3::hash(&out).as_bytes()
}

/// A new API key.
pub fn new_key() -> String {
    let bytes = random_bytes();
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
