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
        let _writing = self.writing.lock().await;
        let bytes = {
            let mut records = self.records.lock();
            records.insert(id.to_string(), record.clone());
            let all: Vec<&Json> = records.values().collect();
            serde_json::to_vec_pretty(&all).map_err(|e| StoreError::Backend(e.to_string()))?
        };
        let Some(path) = self.path.clone() else { return Ok(()) };
        tokio::task::spawn_blocking(move || crate::atomic_file::write(&path, &bytes, None)).await.map_err(|e| StoreError::Backend(e.to_string()))??;
        Ok(())
    }
}
