//! Jobs (with their workflows), assets and idempotency claims: read from
//! sled a page at a time in key order, written where absent, and each page
//! counted present in the database afterwards.

use super::{MigrateError, PAGE, Source, Tally, Target, all_present};
use crate::store::postgres::{Imported, ImportedJob};

pub(super) async fn jobs(source: &Source, target: &Target) -> Result<Tally, MigrateError> {
    let mut tally = Tally { kind: "jobs", ..Tally::default() };
    let mut after = String::new();
    loop {
        let page = source.meta.export_jobs(&after, PAGE)?;
        let Some(last) = page.last() else { return Ok(tally) };
        after = last.job.id.clone();
        let ids: Vec<String> = page.iter().map(|e| e.job.id.clone()).collect();
        let jobs = page
            .into_iter()
            .map(|e| {
                let sched_key = crate::service::fair::sched_key(&e.job.owner, e.job.deployment.as_deref());
                ImportedJob { job: e.job, workflow: e.workflow, sched_key }
            })
            .collect();
        count(&mut tally, ids.len(), target.meta.import_jobs(jobs).await?);
        all_present("jobs", ids.len(), target.meta.present(Imported::Jobs, ids).await?)?;
    }
}

pub(super) async fn assets(source: &Source, target: &Target) -> Result<Tally, MigrateError> {
    let mut tally = Tally { kind: "assets", ..Tally::default() };
    let mut after = String::new();
    loop {
        let page = source.meta.export_assets(&after, PAGE)?;
        let Some(last) = page.last() else { return Ok(tally) };
        after = last.id.clone();
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
