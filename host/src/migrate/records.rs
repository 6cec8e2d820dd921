//! Jobs (with their workflows), assets and idempotency claims: read from
//! sled a page at a time in key order, written where absent, and each page
//! counted present in the database afterwards.

use std::sync::Arc;

use super::{MigrateError, PAGE, Source, Tally, Target, all_present};
use crate::store::postgres::{Imported, ImportedJob};
use crate::store::{BlobStore, StoreError};

pub(super) async fn jobs(source: &Source, target: &Target) -> Result<Tally, MigrateError> {
    let mut tally = Tally { kind: "jobs", ..Tally::default() };
    let mut after = String::new();
    loop {
        let page = source.meta.export_jobs(&after, PAGE)?;
        let Some(last) = page.last() else { return Ok(tally) };
        after = last.job.id.clone();
        let ids: Vec<String> = page.iter().map(|e| e.job.id.clone()).collect();
        let jobs = page.into_iter().map(|e| ImportedJob { job: e.job, workflow: e.workflow }).collect();
        count(&mut tally, ids.len(), target.meta.import_jobs(jobs).await?);
        all_present("jobs", ids.len(), target.meta.present(Imported::Jobs, ids).await?)?;
    }
}

/// Assets, each page's blobs checked present in `blobs` (where the hosts
/// will read them) before its records are written: one whose blob is lost
/// is left out, counted.
pub(super) async fn assets(source: &Source, target: &Target, blobs: Arc<dyn BlobStore>) -> Result<Tally, MigrateError> {
    let mut tally = Tally { kind: "assets", ..Tally::default() };
    let mut after = String::new();
    loop {
        let page = source.meta.export_assets(&after, PAGE)?;
        let Some(last) = page.last() else {
            if tally.left_out > 0 && tally.copied + tally.present == 0 {
                let why = "no asset's blob is in the blob store the hosts read: is it the store the data directory's server used?";
                return Err(MigrateError::Mismatch { kind: "asset blobs", name: format!("all {}", tally.left_out), why: why.into() });
            }
            return Ok(tally);
        };
        after = last.id.clone();
        let mut hashes: Vec<String> = page.iter().map(|a| a.hash.clone()).collect();
        hashes.sort_unstable();
        hashes.dedup();
        let missing = blobs_missing(blobs.clone(), hashes).await?;
        let (page, lost): (Vec<_>, Vec<_>) = page.into_iter().partition(|a| !missing.contains(&a.hash));
        for asset in &lost {
            tally.source += 1;
            tally.leave_out(&asset.id);
        }
        if page.is_empty() {
            continue;
        }
        let ids: Vec<String> = page.iter().map(|a| a.id.clone()).collect();
        count(&mut tally, ids.len(), target.meta.import_assets(page).await?);
        all_present("assets", ids.len(), target.meta.present(Imported::Assets, ids).await?)?;
    }
}

pub(super) async fn claims(source: &Source, target: &Target) -> Result<Tally, MigrateError> {
    let mut tally = Tally { kind: "idempotency claims", ..Tally::default() };
    let mut after = String::new();
    loop {
        let page = source.meta.export_claims(&after, PAGE)?;
        let Some(last) = page.last() else { return Ok(tally) };
        after = last.key.clone();
        let keys: Vec<String> = page.iter().map(|c| c.key.clone()).collect();
        count(&mut tally, keys.len(), target.meta.import_claims(page).await?);
        all_present("idempotency claims", keys.len(), target.meta.present(Imported::Claims, keys).await?)?;
    }
}

fn count(tally: &mut Tally, read: usize, new: usize) {
    tally.source += read;
    tally.copied += new;
    tally.present += read - new.min(read);
}

/// Which of `hashes` (`blake3:<hex>`) `blobs` lacks.
async fn blobs_missing(blobs: Arc<dyn BlobStore>, hashes: Vec<String>) -> Result<Vec<String>, MigrateError> {
    let look = move || -> Result<Vec<String>, StoreError> {
        let mut missing = Vec::new();
        for hash in hashes {
            let parsed = hash.strip_prefix("blake3:").and_then(|hex| blake3::Hash::from_hex(hex).ok());
            match parsed {
                Some(h) if blobs.contains(&h)? => {}
                _ => missing.push(hash),
            }
        }
        Ok(missing)
    };
    Ok(tokio::task::spawn_blocking(look).await.map_err(|e| StoreError::Backend(e.to_string()))??)
}
