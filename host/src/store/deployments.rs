//! The deployment store: where serverless deployments' records live (the
//! service owns their shape and state machine; here they are JSON
//! documents by id), and the bundles deployments were created from (bytes
//! by hash). The embedded [`FileDeployments`] keeps the records in one
//! JSON file of the data directory, replaced whole at each write, and each
//! bundle in a file of its own beside it (`bundles/<hash>.kiln`).

use std::collections::BTreeMap;
use std::path::PathBuf;

use parking_lot::Mutex;
use serde_json::Value as Json;

use super::StoreError;

/// Deployment records by id. They are few (a server keeps at most
/// `deployments::MAX_DEPLOYMENTS`): [`DeploymentStore::all`] reads them once
/// at start and the caller keeps them in memory.
#[async_trait::async_trait]
pub trait DeploymentStore: Send + Sync {
    /// Every record.
    async fn all(&self) -> Result<Vec<Json>, StoreError>;
    /// The record of deployment `id`, if any (the default reads them all).
    async fn get(&self, id: &str) -> Result<Option<Json>, StoreError> {
        Ok(self.all().await?.into_iter().find(|r| r.get("id").and_then(Json::as_str) == Some(id)))
    }
    /// Writes the record of deployment `id`; durable when it returns.
    async fn put(&self, id: &str, record: &Json) -> Result<(), StoreError>;
    /// Removes the record of deployment `id` (a creation taken back).
    async fn delete(&self, id: &str) -> Result<(), StoreError>;
    /// Keeps the bytes of the bundle whose hash is `hash` (64 hex digits);
    /// durable when it returns. Bundles are content-addressed: keeping one
    /// twice keeps one.
    async fn put_bundle(&self, hash: &str, bytes: &[u8]) -> Result<(), StoreError>;
    /// The bytes of bundle `hash`, if kept.
    async fn bundle(&self, hash: &str) -> Result<Option<Vec<u8>>, StoreError>;
}

/// Runs file work `f` inline on a thread that may block (see
/// `store::may_block_here`: a blocking-pool thread driving service work,
/// which must not wait for yet another one), else on the blocking pool.
async fn on_disk<T: Send + 'static>(f: impl FnOnce() -> std::io::Result<T> + Send + 'static) -> Result<T, StoreError> {
    if super::may_block() {
        return Ok(f()?);
    }
    Ok(tokio::task::spawn_blocking(f).await.map_err(|e| StoreError::Backend(e.to_string()))??)
}

/// Whether `hash` is 64 lowercase hex digits (a bundle's name in a store).
pub(super) fn is_hash(hash: &str) -> bool {
    hash.len() == 64 && hash.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Records in a JSON array in one file (`None`: kept in memory only).
pub struct FileDeployments {
    path: Option<PathBuf>,
    records: Mutex<BTreeMap<String, Json>>,
    /// Serializes writes of the file, in the order of `records`' changes.
    writing: tokio::sync::Mutex<()>,
    /// Bundles, when kept in memory only.
    bundles: Mutex<BTreeMap<String, std::sync::Arc<[u8]>>>,
}

impl FileDeployments {
    /// The records in `path` (none when it does not exist yet).
    pub fn open(path: Option<PathBuf>) -> Result<FileDeployments, StoreError> {
        let mut records = BTreeMap::new();
        if let Some(path) = &path
            && path.exists()
        {
            let bytes = std::fs::read(path)?;
            let all: Vec<Json> = serde_json::from_slice(&bytes).map_err(|e| StoreError::Corrupt(format!("{}: {e}", path.display())))?;
            for record in all {
                let id = record.get("id").and_then(Json::as_str).ok_or_else(|| StoreError::Corrupt(format!("{}: a record without an id", path.display())))?;
                records.insert(id.to_string(), record);
            }
        }
        Ok(FileDeployments { path, records: Mutex::new(records), writing: tokio::sync::Mutex::new(()), bundles: Mutex::default() })
    }
}

#[async_trait::async_trait]
impl DeploymentStore for FileDeployments {
    async fn all(&self) -> Result<Vec<Json>, StoreError> {
        Ok(self.records.lock().values().cloned().collect())
    }

    async fn put(&self, id: &str, record: &Json) -> Result<(), StoreError> {
        self.write(id, Some(record)).await
    }

    async fn delete(&self, id: &str) -> Result<(), StoreError> {
        self.write(id, None).await
    }

    async fn put_bundle(&self, hash: &str, bytes: &[u8]) -> Result<(), StoreError> {
        if !is_hash(hash) {
            return Err(StoreError::Backend(format!("{hash:?} is not a bundle hash")));
        }
        let Some(path) = self.bundle_path(hash) else {
            self.bundles.lock().insert(hash.to_string(), bytes.into());
            return Ok(());
        };
        let bytes = bytes.to_vec();
        // Its directory is made (durably) by the write.
        on_disk(move || crate::atomic_file::write(&path, &bytes, None)).await
    }

    async fn bundle(&self, hash: &str) -> Result<Option<Vec<u8>>, StoreError> {
        if !is_hash(hash) {
            return Ok(None);
        }
        let Some(path) = self.bundle_path(hash) else { return Ok(self.bundles.lock().get(hash).map(|b| b.to_vec())) };
        on_disk(move || match std::fs::read(path) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        })
        .await
    }
}

impl FileDeployments {
    /// Where bundle `hash` is kept: `bundles/<hash>.kiln` beside the
    /// records' file (`None`: in memory).
    fn bundle_path(&self, hash: &str) -> Option<PathBuf> {
        let dir = self.path.as_ref()?.parent().unwrap_or(std::path::Path::new("."));
        Some(dir.join("bundles").join(format!("{hash}.kiln")))
    }

    /// Writes the file with `id`'s record replaced (`None`: removed), then
    /// keeps the change in memory: a write that fails leaves memory as the
    /// file was, so a later write does not carry the failed change.
    async fn write(&self, id: &str, record: Option<&Json>) -> Result<(), StoreError> {
        let _writing = self.writing.lock().await;
        let mut next = self.records.lock().clone();
        match record {
            Some(record) => next.insert(id.to_string(), record.clone()),
            None => next.remove(id),
        };
        if let Some(path) = self.path.clone() {
            let all: Vec<&Json> = next.values().collect();
            let bytes = serde_json::to_vec_pretty(&all).map_err(|e| StoreError::Backend(e.to_string()))?;
            on_disk(move || crate::atomic_file::write(&path, &bytes, None)).await?;
        }
        *self.records.lock() = next;
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A write that fails leaves nothing behind in memory: the next write
    /// does not carry it.
    #[tokio::test]
    async fn a_failed_write_is_not_carried_by_the_next() {
        let dir = tempfile::tempdir().unwrap();
        let blocker = dir.path().join("not-a-dir");
        std::fs::write(&blocker, b"").unwrap();
        let store = FileDeployments::open(Some(blocker.join("deployments.json"))).unwrap();
        assert!(store.put("a", &serde_json::json!({"id": "a"})).await.is_err());
        assert!(store.all().await.unwrap().is_empty());
        let path = dir.path().join("deployments.json");
        let store = FileDeployments::open(Some(path.clone())).unwrap();
        store.put("b", &serde_json::json!({"id": "b"})).await.unwrap();
        store.put("c", &serde_json::json!({"id": "c"})).await.unwrap();
        store.delete("b").await.unwrap();
        let reopened = FileDeployments::open(Some(path)).unwrap();
        assert_eq!(reopened.all().await.unwrap(), vec![serde_json::json!({"id": "c"})]);
    }

    /// What every [`DeploymentStore`] keeps: records by id (replaced,
    /// removed), bundles by hash (kept once, read back), and only a hash
    /// names a bundle.
    pub(crate) async fn contract(store: &dyn DeploymentStore) {
        assert!(store.all().await.unwrap().is_empty());
        store.put("b", &serde_json::json!({"id": "b", "v": 1})).await.unwrap();
        store.put("a", &serde_json::json!({"id": "a"})).await.unwrap();
        store.put("b", &serde_json::json!({"id": "b", "v": 2})).await.unwrap();
        let mut all = store.all().await.unwrap();
        all.sort_by_key(|r| r["id"].as_str().unwrap().to_string());
        assert_eq!(all, vec![serde_json::json!({"id": "a"}), serde_json::json!({"id": "b", "v": 2})]);
        store.delete("a").await.unwrap();
        assert_eq!(store.all().await.unwrap(), vec![serde_json::json!({"id": "b", "v": 2})]);

        let hash = blake3::hash(b"bundle").to_hex().to_string();
        assert_eq!(store.bundle(&hash).await.unwrap(), None);
        store.put_bundle(&hash, b"bundle").await.unwrap();
        store.put_bundle(&hash, b"bundle").await.unwrap();
        assert_eq!(store.bundle(&hash).await.unwrap().as_deref(), Some(&b"bundle"[..]));
        assert!(store.put_bundle("../escape", b"x").await.is_err(), "only a hash names a bundle");
        assert_eq!(store.bundle("../deployments.json").await.unwrap(), None);
    }

    #[tokio::test]
    async fn file_and_memory_stores_keep_the_contract_and_bundles_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("deployments.json");
        contract(&FileDeployments::open(Some(path.clone())).unwrap()).await;
        contract(&FileDeployments::open(None).unwrap()).await;
        let hash = blake3::hash(b"bundle").to_hex().to_string();
        assert!(dir.path().join("bundles").join(format!("{hash}.kiln")).is_file());
        let reopened = FileDeployments::open(Some(path)).unwrap();
        assert_eq!(reopened.bundle(&hash).await.unwrap().as_deref(), Some(&b"bundle"[..]), "survives a restart");
        assert_eq!(reopened.all().await.unwrap().len(), 1);
    }
}
