//! Accounts, deployments with their bundles, the web frontend's user
//! files, installed plugins and the blobs: each copied where the target
//! lacks it, and each copied byte checked by hash.

use std::io::Read;
use std::path::Path;
use std::sync::Arc;

use super::{MigrateError, Source, Tally, Target};
use crate::service::deployments::{DeploymentRecord, DeploymentState};
use crate::store::cluster::SharedPlugins;
use crate::store::{AccountStore, BlobStore, DeploymentStore, Entry, StoreError, UserFileStore};

/// Most files one user of the web frontend is read for.
const MAX_USER_FILES: usize = 1_000_000;

pub(super) async fn accounts(source: &Source, target: &Target) -> Result<Tally, MigrateError> {
    let mut tally = Tally { kind: "accounts", ..Tally::default() };
    for account in source.accounts.all().await? {
        tally.source += 1;
        if target.accounts.get(&account.id).await?.is_some() {
            tally.present += 1;
            continue;
        }
        target.accounts.create(&account).await?;
        tally.copied += 1;
    }
    Ok(tally)
}

/// Installed plugins, the operator's and accounts' own (by scope and name),
/// each component read back and compared by hash. Every host sharing the
/// database installs them from there.
pub(super) async fn plugins(source: &Source, target: &Target) -> Result<Tally, MigrateError> {
    let mut tally = Tally { kind: "plugins", ..Tally::default() };
    let unreadable = |name: String, e: &dyn std::fmt::Display| MigrateError::Mismatch { kind: "plugin", name, why: e.to_string() };
    let kept = crate::plugins::kept_in(&source.dir).map_err(|e| unreadable(source.dir.display().to_string(), &e))?;
    let stored = target.plugins.plugins(None).await?;
    let mut keys = Vec::with_capacity(kept.len());
    // One plugin's bytes in memory at a time.
    for (scope, dir) in kept {
        let (plugin, bytes) = crate::plugins::read_kept(&scope, &dir).map_err(|e| unreadable(dir.display().to_string(), &e))?;
        keys.push((plugin.scope.clone(), plugin.name.clone()));
        tally.source += 1;
        if stored.iter().any(|s| s.scope == plugin.scope && s.name == plugin.name) {
            tally.present += 1;
            continue;
        }
        let how = crate::store::cluster::Publish { limit: None, replace: false };
        if target.plugins.publish(&plugin, &bytes, how).await? == crate::store::cluster::Published::Present {
            tally.present += 1;
            continue;
        }
        let mismatch = |why: &str| MigrateError::Mismatch { kind: "plugin", name: plugin.name.clone(), why: why.into() };
        let copied = target.plugins.component(&plugin.component).await?.ok_or_else(|| mismatch("its component is not in the database after the copy"))?;
        if blake3::hash(&copied) != blake3::hash(&bytes) {
            return Err(mismatch("the database holds other bytes under its component's hash"));
        }
        tally.copied += 1;
    }
    let now = target.plugins.plugins(None).await?;
    let present = keys.iter().filter(|(scope, name)| now.iter().any(|s| &s.scope == scope && &s.name == name)).count();
    super::all_present("plugins", tally.source, present)?;
    Ok(tally)
}

/// Deployments, each after its bundle (so a host that hears of it finds
/// the bundle), the bundle read back and compared by hash.
pub(super) async fn deployments(source: &Source, target: &Target) -> Result<Tally, MigrateError> {
    let mut tally = Tally { kind: "deployments", ..Tally::default() };
    for json in source.deployments.all().await? {
        let record: DeploymentRecord =
            serde_json::from_value(json.clone()).map_err(|e| StoreError::Corrupt(format!("a deployment record of the data directory: {e}")))?;
        let id = record.spec.id.as_str();
        tally.source += 1;
        if target.deployments.get(id).await?.is_some() {
            tally.present += 1;
            continue;
        }
        if let Some(bundle) = &record.bundle {
            let hex = bundle.hash.strip_prefix("blake3:").unwrap_or_default();
            let mismatch = |why: &str| MigrateError::Mismatch { kind: "bundle", name: bundle.hash.clone(), why: why.into() };
            let bytes = source.deployments.bundle(hex).await?.ok_or_else(|| mismatch("not in the data directory"))?;
            if target.deployments.bundle(hex).await?.is_none() {
                target.deployments.put_bundle(hex, &bytes).await?;
            }
            let copied = target.deployments.bundle(hex).await?.ok_or_else(|| mismatch("not in the database after the copy"))?;
            if blake3::hash(&copied) != blake3::hash(&bytes) {
                return Err(mismatch("the database holds other bytes under its hash"));
            }
        }
        // Where hosts share the store, the record holds what operators
        // asked (each host loads it on its own): one that served, or failed
        // to load, here is one to start.
        let mut record = record.clone();
        if matches!(record.state, DeploymentState::Ready | DeploymentState::Failed) {
            record.state = DeploymentState::Starting;
            record.error = None;
        }
        let json = serde_json::to_value(&record).map_err(|e| StoreError::Backend(e.to_string()))?;
        target.deployments.put(id, &json).await?;
        tally.copied += 1;
    }
    Ok(tally)
}

/// Each user's settings and files (users are the folders under
/// `users/`), each copied file read back and compared by hash.
pub(super) async fn user_files(source: &Source, target: &Target) -> Result<Tally, MigrateError> {
    let (root, from, to) = (source.dir.join("users"), source.user_files.clone(), target.user_files.clone());
    let blocking = move || -> Result<Tally, MigrateError> {
        let mut tally = Tally { kind: "user files", ..Tally::default() };
        let users = match std::fs::read_dir(&root) {
            Ok(dir) => dir.filter_map(Result::ok).filter(|e| e.path().is_dir()).filter_map(|e| e.file_name().into_string().ok()).collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(StoreError::from(e).into()),
        };
        for user in users {
            if let Some(settings) = from.settings(&user)? {
                tally.source += 1;
                if to.settings(&user)?.is_some() {
                    tally.present += 1;
                } else {
                    to.put_settings(&user, &settings)?;
                    tally.copied += 1;
                }
            }
            for file in from.list(&user, Path::new(""), true, MAX_USER_FILES)?.unwrap_or_default() {
                let path = Path::new(&file.path);
                tally.source += 1;
                if to.entry(&user, path)? != Entry::Missing {
                    tally.present += 1;
                    continue;
                }
                let mismatch = |why: &str| MigrateError::Mismatch { kind: "user file", name: format!("{user}/{}", file.path), why: why.into() };
                let bytes = from.read(&user, path)?.ok_or_else(|| mismatch("gone while copied"))?;
                to.put(&user, path, &bytes)?;
                let copied = to.read(&user, path)?.ok_or_else(|| mismatch("not in the database after the copy"))?;
                if blake3::hash(&copied) != blake3::hash(&bytes) {
                    return Err(mismatch("the database holds other bytes"));
                }
                tally.copied += 1;
            }
        }
        Ok(tally)
    };
    tokio::task::spawn_blocking(blocking).await.map_err(|e| StoreError::Backend(e.to_string()))?
}

/// Every blob file streamed into `to` unless it has it, hashed as read:
/// committed only when the blake3 of its bytes is the file's name.
pub(super) async fn blobs(source: &Source, to: Arc<dyn BlobStore>) -> Result<Tally, MigrateError> {
    let from = source.blobs.clone();
    let blocking = move || -> Result<Tally, MigrateError> {
        let mut tally = Tally { kind: "blobs", ..Tally::default() };
        for hash in from.list()? {
            tally.source += 1;
            if to.contains(&hash)? {
                tally.present += 1;
                continue;
            }
            let mismatch = |why: String| MigrateError::Mismatch { kind: "blob", name: hash.to_hex().to_string(), why };
            let mut file = from.open(&hash)?.ok_or_else(|| mismatch("gone while copied".into()))?;
            let mut upload = to.begin(file.metadata().map_err(StoreError::from)?.len())?;
            let mut chunk = vec![0u8; 1 << 20];
            loop {
                let n = file.read(&mut chunk).map_err(StoreError::from)?;
                if n == 0 {
                    break;
                }
                upload.write(&chunk[..n])?;
            }
            // Checked before anything is stored (a dropped upload leaves
            // nothing behind).
            let (got, _) = upload.digest();
            if got != hash {
                return Err(mismatch(format!("its bytes hash to {}: the data directory's copy is damaged", got.to_hex())));
            }
            to.commit(upload)?;
            tally.copied += 1;
        }
        Ok(tally)
    };
    tokio::task::spawn_blocking(blocking).await.map_err(|e| StoreError::Backend(e.to_string()))?
}
