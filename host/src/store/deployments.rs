//! The deployment store: where serverless deployments' records live (the
//! service owns their shape and state machine; here they are JSON
//! documents by id). The embedded [`FileDeployments`] keeps them in one
//! JSON file of the data directory, replaced whole at each write.

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
    /// Writes the record of deployment `id`; durable when it returns.
    async fn put(&self, id: &str, record: &Json) -> Result<(), StoreError>;
    /// Removes the record of deployment `id` (a creation taken back).
    async fn delete(&self, id: &str) -> Result<(), StoreError>;
}

/// Records in a JSON array in one file (`None`: kept in memory only).
pub struct FileDeployments {
    path: Option<PathBuf>,
    records: Mutex<BTreeMap<String, Json>>,
    /// Serializes writes of the file, in the order of `records`' changes.
    writing: tokio::sync::Mutex<()>,
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
        Ok(FileDeployments { path, records: Mutex::new(records), writing: tokio::sync::Mutex::new(()) })
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
}

impl FileDeployments {
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
            tokio::task::spawn_blocking(move || crate::atomic_file::write(&path, &bytes, None)).await.map_err(|e| StoreError::Backend(e.to_string()))??;
        }
        *self.records.lock() = next;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
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
}
