//! Server secrets (the account key hasher's, the URL signer's): 32 random
//! bytes, kept in a file of the data directory that only the owner may read
//! (with `store = "postgres"` the database keeps the ones every host uses,
//! seeded from these files: `store::postgres::secrets`).

use std::path::Path;

/// 32 bytes from the OS's generator (through two v4 UUIDs: 244 random
/// bits, spread over all 256 by blake3, since the UUID version bits are fixed).
pub fn random_key() -> [u8; 32] {
    let mut out = [0u8; 32];
    out[..16].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
    out[16..].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
    *blake3::hash(&out).as_bytes()
}

/// The secret in `dir/name`, creating it on first use (and replacing a file
/// that does not hold exactly 32 bytes), with mode 0600, replaced whole
/// (`atomic_file`): a crash never leaves a partial secret behind.
pub fn load_or_create(dir: &Path, name: &str) -> std::io::Result<[u8; 32]> {
    if let Some(secret) = load(dir, name) {
        return Ok(secret);
    }
    let path = dir.join(name);
    let secret = random_key();
    crate::atomic_file::write(&path, &secret, Some(0o600))?;
    Ok(secret)
}

/// The secret in `dir/name`, if it holds one.
pub fn load(dir: &Path, name: &str) -> Option<[u8; 32]> {
    std::fs::read(dir.join(name)).ok().and_then(|bytes| <[u8; 32]>::try_from(bytes.as_slice()).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_is_created_owner_only_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let first = load_or_create(&data, "x.key").unwrap();
        assert_eq!(load_or_create(&data, "x.key").unwrap(), first, "read back, not replaced");
        assert_ne!(load_or_create(&data, "y.key").unwrap(), first, "each file its own secret");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(std::fs::metadata(data.join("x.key")).unwrap().permissions().mode() & 0o777, 0o600);
        }
        std::fs::write(data.join("x.key"), b"short").unwrap();
        assert_ne!(load_or_create(&data, "x.key").unwrap(), first, "a damaged secret is replaced");
    }
}
