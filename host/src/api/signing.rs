//! Signed, expiring download URLs: `…/signed/assets/{id}?expires=…&sig=…`
//! where `sig` is blake3 keyed by a secret that never leaves the data
//! directory. The URL is its own authorization (no bearer token needed).

use std::path::Path;

/// When a URL signed now for `ttl_s` seconds expires (Unix seconds): the
/// one rule for every signed link (bodies, `/view`, content redirects).
pub fn expiry(ttl_s: u64) -> i64 {
    (crate::store::now_micros() / 1_000_000).saturating_add(i64::try_from(ttl_s).unwrap_or(i64::MAX))
}

/// Signs and checks download URLs.
pub struct Signer {
    key: [u8; 32],
}

/// Never prints the key.
impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Signer")
    }
}

/// The signing key's name (its file in the data directory).
pub const SECRET_FILE: &str = "signing.key";

impl Signer {
    /// Loads the key from `dir/signing.key`, creating it (owner-only) on first use.
    pub fn load_or_create(dir: &Path) -> std::io::Result<Signer> {
        Ok(Signer::new(crate::secret_file::load_or_create(dir, SECRET_FILE)?))
    }

    /// A signer with `key` (the service's: see `Backends::signing_key`).
    pub fn new(key: [u8; 32]) -> Signer {
        Signer { key }
    }

    fn mac(&self, asset_id: &str, expires: i64) -> blake3::Hash {
        blake3::keyed_hash(&self.key, format!("asset\n{asset_id}\n{expires}").as_bytes())
    }

    /// The signature for `asset_id` valid until `expires` (Unix seconds).
    pub fn sign(&self, asset_id: &str, expires: i64) -> String {
        self.mac(asset_id, expires).to_hex().to_string()
    }

    /// Whether `sig` is valid for `asset_id` and `expires` has not passed.
    pub fn verify(&self, asset_id: &str, expires: i64, sig: &str, now: i64) -> bool {
        // blake3::Hash equality is constant-time.
        expires >= now && blake3::Hash::from_hex(sig).is_ok_and(|given| given == self.mac(asset_id, expires))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_bind_asset_and_expiry_and_survive_reload() {
        let dir = tempfile::tempdir().unwrap();
        let s = Signer::load_or_create(dir.path()).unwrap();
        let sig = s.sign("a", 100);
        assert!(s.verify("a", 100, &sig, 50));
        assert!(!s.verify("a", 100, &sig, 101), "expired");
        assert!(!s.verify("b", 100, &sig, 50), "other asset");
        assert!(!s.verify("a", 200, &sig, 50), "other expiry");
        assert!(!s.verify("a", 100, "zz", 50));
        let again = Signer::load_or_create(dir.path()).unwrap();
        assert!(again.verify("a", 100, &sig, 50));
    }
}
