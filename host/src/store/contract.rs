//! The contract every [`MetaStore`] keeps, written against the trait only,
//! so each backend of this crate runs the same cases in its tests (the
//! embedded store in `sled/tests.rs`; another backend calls [`run_all`] on
//! fresh stores of its own). What a backend does beneath the trait (logs,
//! indexes, replay) is its own tests' business.

use std::sync::Arc;

use serde_json::json;

use super::{AssetRecord, IdempotencyClaim, JobRecord, JobStatus, MetaStore, Micros, OutputRecord, StoreError};

fn job(id: &str, owner: &str, created: Micros, seq: u64) -> JobRecord {
    JobRecord { owner: owner.into(), ..JobRecord::queued_for_test(id, created, seq) }
}

pub(crate) fn asset(id: &str, job: Option<&str>, hash: &str, expires: Option<Micros>, tags: &[&str]) -> AssetRecord {
    AssetRecord {
        id: id.into(),
        owner: "local".into(),
        hash: hash.into(),
        size_bytes: 3,
        content_type: "image/png".into(),
        file_path: Some(format!("{id}.png")),
        created_at: 5,
        expires_at: expires,
        job_id: job.map(str::to_string),
        node_id: job.map(|_| "9".to_string()),
        tags: tags.iter().map(|t| t.to_string()).collect(),
    }
}

fn claim(key: &str, job: &str, at: Micros) -> IdempotencyClaim {
    IdempotencyClaim { key: key.into(), owner: "local".into(), job_id: Some(job.into()), claimed_at: at, expires_at: at + 100 }
}

fn ids<T>(mut records: Vec<T>, id: impl Fn(&T) -> &str) -> Vec<String> {
    let mut out: Vec<String> = records.drain(..).map(|r| id(&r).to_string()).collect();
    out.sort();
    out
}

/// Every case, each on a store `fresh` opens empty.
pub(crate) async fn run_all<F, Fut>(fresh: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Arc<dyn MetaStore>>,
{
    a_claim_holds_its_key_until_it_expires(fresh().await.as_ref()).await;
    one_of_many_concurrent_submissions_with_a_key_wins(fresh().await).await;
    the_periodic_queries_find_exactly_their_records(fresh().await.as_ref()).await;
    an_expired_upload_extended_since_it_was_listed_stays(fresh().await.as_ref()).await;
    an_asset_is_changed_from_its_stored_record(fresh().await).await;
    listings_page_newest_first_per_owner_within_a_budget(fresh().await.as_ref()).await;
    a_finished_job_reads_back_with_its_outputs(fresh().await.as_ref()).await;
    the_owner_stamp_moves_with_each_finished_write(fresh().await.as_ref()).await;
    jobs_read_at_once_come_in_the_order_asked(fresh().await.as_ref()).await;
    workflows_read_at_once_stay_within_their_budget(fresh().await.as_ref()).await;
    the_installation_id_is_made_once(fresh().await.as_ref(), fresh().await.as_ref()).await;
}

/// A store's installation id is made once and answered every time; two
/// fresh stores have two.
pub(crate) async fn the_installation_id_is_made_once(one: &dyn MetaStore, other: &dyn MetaStore) {
    let id = one.installation_id().await.unwrap();
    assert!(!id.is_empty());
    assert_eq!(one.installation_id().await.unwrap(), id);
    assert_ne!(other.installation_id().await.unwrap(), id);
}

/// `get_workflows_bytes` answers the workflows of a prefix of the ids
/// asked, in order: those starting within the budget, at least one.
pub(crate) async fn workflows_read_at_once_stay_within_their_budget(meta: &dyn MetaStore) {
    let workflow = |c: char| json!({ "1": { "class_type": c.to_string().repeat(80) } });
    let size = serde_json::to_vec(&workflow('x')).unwrap().len();
    for (i, id) in ["a", "b", "c"].into_iter().enumerate() {
        meta.submit(&job(id, "o", 10 + i as Micros, i as u64 + 1), &workflow(id.chars().next().unwrap()), None).await.unwrap();
    }
    let ids: Vec<String> = ["a", "b", "nope", "c"].into_iter().map(String::from).collect();
    let ids = &ids;
    let read = |budget| async move {
        let got = meta.get_workflows_bytes(ids, budget).await.unwrap();
        got.into_iter()
            .map(|w| w.map(|b| serde_json::from_slice::<serde_json::Value>(&b).unwrap()["1"]["class_type"].as_str().unwrap()[..1].to_string()))
            .collect::<Vec<_>>()
    };
    let (a, b, c) = (Some("a".to_string()), Some("b".to_string()), Some("c".to_string()));
    assert_eq!(read(0).await, std::slice::from_ref(&a), "at least one");
    assert_eq!(read(size).await, std::slice::from_ref(&a), "the second starts at the budget");
    assert_eq!(read(size + 1).await, [a.clone(), b.clone()]);
    assert_eq!(read(2 * size + 1).await, [a.clone(), b.clone(), None, c.clone()], "the unknown id adds no bytes");
    assert_eq!(read(usize::MAX).await, [a, b, None, c]);
    assert!(meta.get_workflows_bytes(&[], 10).await.unwrap().is_empty());
}

/// `get_jobs` answers the records that exist, in the order of the ids
/// asked (repeats included), skipping the unknown.
pub(crate) async fn jobs_read_at_once_come_in_the_order_asked(meta: &dyn MetaStore) {
    for (i, id) in ["a", "b", "c"].into_iter().enumerate() {
        meta.submit(&job(id, "o", 10 + i as Micros, i as u64 + 1), &json!({}), None).await.unwrap();
    }
    let ask: Vec<String> = ["c", "nope", "a", "b", "a"].into_iter().map(String::from).collect();
    let got: Vec<String> = meta.get_jobs(&ask).await.unwrap().into_iter().map(|j| j.id).collect();
    assert_eq!(got, ["c", "a", "b", "a"]);
    assert!(meta.get_jobs(&[]).await.unwrap().is_empty());
}

/// `finished_changes` stays put while nothing finished of the owner is
/// written, and moves with each finished write or deletion of theirs.
pub(crate) async fn the_owner_stamp_moves_with_each_finished_write(meta: &dyn MetaStore) {
    let stamp = |owner: &'static str| async move { meta.finished_changes(owner).await.unwrap() };
    let start = stamp("a").await;
    assert_eq!(stamp("a").await, start, "read twice, nothing written");
    let j = job("j", "a", 10, 1);
    meta.submit(&j, &json!({}), None).await.unwrap();
    let running = JobRecord { status: JobStatus::Running, started_at: Some(11), attempts: 1, ..j.clone() };
    meta.put_job(&running).await.unwrap();
    assert_eq!(stamp("a").await, start, "queued and running writes");
    let done = JobRecord { status: JobStatus::Succeeded, completed_at: Some(20), ..running };
    meta.put_job(&done).await.unwrap();
    let finished = stamp("a").await;
    assert_ne!(finished, start, "a finished write");
    let other = JobRecord { status: JobStatus::Failed, completed_at: Some(21), ..job("k", "b", 12, 2) };
    meta.submit(&other, &json!({}), None).await.unwrap();
    meta.put_job(&other).await.unwrap();
    assert_eq!(stamp("a").await, finished, "another owner's finished writes");
    meta.delete_job(&done).await.unwrap();
    assert_ne!(stamp("a").await, finished, "a finished job deleted");
}

/// A live claim refuses its key and records nothing; an expired one frees
/// it; the purge drops expired claims only.
pub(crate) async fn a_claim_holds_its_key_until_it_expires(meta: &dyn MetaStore) {
    meta.submit(&job("a", "local", 10, 1), &json!({"1": {}}), Some(&claim("k", "a", 10))).await.unwrap();
    let refused = meta.submit(&job("b", "local", 20, 2), &json!({}), Some(&claim("k", "b", 20))).await;
    assert!(matches!(refused, Err(StoreError::KeyClaimed)), "{refused:?}");
    assert!(meta.get_job("b").await.unwrap().is_none(), "a refused claim records nothing");
    assert_eq!(meta.get_workflow("a").await.unwrap(), Some(json!({"1": {}})));
    // Expired at 110: taken again.
    meta.submit(&job("c", "local", 200, 3), &json!({}), Some(&claim("k", "c", 200))).await.unwrap();
    assert_eq!(meta.get_claim("k").await.unwrap().and_then(|c| c.job_id).as_deref(), Some("c"));
    meta.submit(&job("d", "local", 250, 4), &json!({}), Some(&claim("other", "d", 250))).await.unwrap();
    assert_eq!(meta.purge_claims(320).await.unwrap(), 1, "k (expired at 300), not `other` (350)");
    assert!(meta.get_claim("k").await.unwrap().is_none());
    assert!(meta.get_claim("other").await.unwrap().is_some());
}

/// Of 16 submissions racing for one key, exactly one is recorded.
pub(crate) async fn one_of_many_concurrent_submissions_with_a_key_wins(meta: Arc<dyn MetaStore>) {
    let tasks: Vec<_> = (0..16)
        .map(|i| {
            let meta = meta.clone();
            tokio::spawn(async move {
                let id = format!("j{i}");
                let same = IdempotencyClaim { job_id: Some(id.clone()), ..claim("same", &id, 10) };
                meta.submit(&job(&id, "local", 10 + i, i as u64 + 1), &json!({}), Some(&same)).await.is_ok()
            })
        })
        .collect();
    let mut won = Vec::new();
    for t in tasks {
        won.push(t.await.unwrap());
    }
    assert_eq!(won.iter().filter(|w| **w).count(), 1, "{won:?}");
    let winner = format!("j{}", won.iter().position(|w| *w).unwrap());
    assert_eq!(meta.get_claim("same").await.unwrap().and_then(|c| c.job_id), Some(winner.clone()));
    assert_eq!(ids(meta.unfinished_jobs().await.unwrap(), |j| &j.id), [winner], "the losers wrote nothing");
}

/// The sweep's deletion of an expired upload loses to a write that
/// extended it after the sweep listed it (an upload of the same bytes,
/// answered to its uploader with this record): only a record still due
/// goes, with its index entries.
pub(crate) async fn an_expired_upload_extended_since_it_was_listed_stays(meta: &dyn MetaStore) {
    meta.put_asset(&asset("kept", None, "blake3:k1", Some(100), &["t"])).await.unwrap();
    meta.put_asset(&asset("gone", None, "blake3:g1", Some(100), &["t"])).await.unwrap();
    meta.put_asset(&asset("output", Some("job"), "blake3:o1", Some(100), &[])).await.unwrap();
    let listed = meta.uploads_due(150, 10).await.unwrap();
    assert_eq!(ids(listed.clone(), |a| &a.id), ["gone", "kept"]);
    // Extended after the listing.
    assert!(meta.update_asset(&asset("kept", None, "blake3:k1", Some(10_000), &["t"])).await.unwrap());
    for listed in &listed {
        let deleted = meta.delete_expired_upload(listed, 150).await.unwrap();
        assert_eq!(deleted.map(|a| a.id), (listed.id == "gone").then(|| "gone".to_string()), "{}", listed.id);
    }
    assert_eq!(meta.get_asset("kept").await.unwrap().and_then(|a| a.expires_at), Some(10_000));
    assert_eq!(ids(meta.assets_with_hash("blake3:k1").await.unwrap(), |a| &a.id), ["kept"]);
    assert!(meta.get_asset("gone").await.unwrap().is_none());
    assert!(meta.assets_with_hash("blake3:g1").await.unwrap().is_empty());
    assert_eq!(ids(meta.assets_tagged("t").await.unwrap(), |a| &a.id), ["kept"]);
    // Gone already, or never an upload: nothing to do.
    assert!(meta.delete_expired_upload(&asset("gone", None, "blake3:g1", Some(100), &[]), 150).await.unwrap().is_none());
    assert!(meta.delete_expired_upload(&asset("output", Some("job"), "blake3:o1", Some(100), &[]), 150).await.unwrap().is_none());
    assert!(meta.get_asset("output").await.unwrap().is_some());
}

/// `change_asset` works from the record as stored, not a copy read
/// earlier: changes made at once (uploads of the same bytes, each adding
/// its tag) all land; no change leaves the record; a missing asset is
/// `None`.
pub(crate) async fn an_asset_is_changed_from_its_stored_record(meta: Arc<dyn MetaStore>) {
    meta.put_asset(&asset("m", None, "blake3:m1", Some(100), &["first"])).await.unwrap();
    let add = |tag: String| -> super::AssetChange {
        Arc::new(move |stored: &AssetRecord| {
            let mut next = stored.clone();
            next.tags.push(tag.clone());
            Some(next)
        })
    };
    let changes = (0..12).map(|i| {
        let meta = meta.clone();
        let change = add(format!("t{i}"));
        tokio::spawn(async move { meta.change_asset("m", change).await })
    });
    for done in futures_util::future::join_all(changes).await {
        assert!(done.unwrap().unwrap().is_some());
    }
    let stored = meta.get_asset("m").await.unwrap().unwrap();
    let mut tags = stored.tags.clone();
    tags.sort();
    let mut expected: Vec<String> = (0..12).map(|i| format!("t{i}")).chain(["first".to_string()]).collect();
    expected.sort();
    assert_eq!(tags, expected, "no change lost");
    let left = meta.change_asset("m", Arc::new(|_: &AssetRecord| None)).await.unwrap();
    assert_eq!(left, Some(stored), "no change: the record as stored");
    assert!(meta.change_asset("nope", add("x".into())).await.unwrap().is_none());
    assert!(meta.assets_tagged("t11").await.unwrap().iter().any(|a| a.id == "m"), "found by a tag added");
}

/// Recovery's, the sweep's and the upload index's queries, across status
/// changes, expiry, rewrites and deletions.
pub(crate) async fn the_periodic_queries_find_exactly_their_records(meta: &dyn MetaStore) {
    // expires_at = created + 1000: a at 1010, b at 1020, c at 1030, d at 1040.
    for (i, id) in ["a", "b", "c", "d"].into_iter().enumerate() {
        meta.submit(&job(id, "local", 10 * (i as Micros + 1), 5 + i as u64), &json!({}), None).await.unwrap();
    }
    let b = meta.get_job("b").await.unwrap().unwrap();
    meta.put_job(&JobRecord { status: JobStatus::Running, ..b.clone() }).await.unwrap();
    meta.finish_job(&JobRecord { status: JobStatus::Succeeded, ..b }, &[]).await.unwrap();
    let c = meta.get_job("c").await.unwrap().unwrap();
    meta.put_job(&JobRecord { status: JobStatus::Expired, ..c }).await.unwrap();
    meta.delete_job(&meta.get_job("d").await.unwrap().unwrap()).await.unwrap();
    assert_eq!(ids(meta.unfinished_jobs().await.unwrap(), |j| &j.id), ["a"]);
    assert!(meta.max_seq().await.unwrap() >= 8, "a bound on every seq submitted");
    assert_eq!(ids(meta.jobs_due(1025, 0, 100).await.unwrap(), |j| &j.id), ["a", "b"]);
    assert_eq!(ids(meta.jobs_due(1025, 1030, 100).await.unwrap(), |j| &j.id), ["a", "b", "c"]);
    assert_eq!(meta.jobs_due(1015, 0, 1).await.unwrap().len(), 1, "at most the limit");
    assert!(meta.jobs_due(1000, 1000, 100).await.unwrap().is_empty());

    meta.put_asset(&asset("out1", Some("a"), "blake3:aa", Some(50), &[])).await.unwrap();
    meta.put_asset(&asset("out2", Some("a"), "blake3:aa", None, &[])).await.unwrap();
    meta.put_asset(&asset("up", None, "blake3:bb", Some(100), &["comfy:input", "mine"])).await.unwrap();
    meta.put_asset(&asset("up2", None, "blake3:cc", None, &["comfy:temp"])).await.unwrap();
    assert_eq!(ids(meta.assets_of_job("a").await.unwrap(), |a| &a.id), ["out1", "out2"]);
    assert_eq!(ids(meta.assets_with_hash("blake3:aa").await.unwrap(), |a| &a.id), ["out1", "out2"]);
    assert_eq!(ids(meta.uploads_due(100, 10).await.unwrap(), |a| &a.id), ["up"], "outputs are not uploads");
    assert_eq!(ids(meta.assets_tagged("comfy:").await.unwrap(), |a| &a.id), ["up", "up2"]);
    // Referenced again: a later expiry, a tag dropped.
    assert!(meta.update_asset(&asset("up", None, "blake3:bb", Some(200), &["mine"])).await.unwrap());
    assert!(meta.uploads_due(100, 10).await.unwrap().is_empty(), "its old expiry no longer counts");
    assert_eq!(ids(meta.uploads_due(200, 10).await.unwrap(), |a| &a.id), ["up"]);
    assert_eq!(ids(meta.assets_tagged("comfy:").await.unwrap(), |a| &a.id), ["up2"]);
    meta.delete_asset(&meta.get_asset("out1").await.unwrap().unwrap()).await.unwrap();
    assert_eq!(ids(meta.assets_of_job("a").await.unwrap(), |a| &a.id), ["out2"]);
    assert_eq!(ids(meta.assets_with_hash("blake3:aa").await.unwrap(), |a| &a.id), ["out2"]);
    // A change to a record read before its deletion brings nothing back.
    let up2 = meta.get_asset("up2").await.unwrap().unwrap();
    meta.delete_asset(&up2).await.unwrap();
    assert!(!meta.update_asset(&AssetRecord { tags: vec!["comfy:input".into()], ..up2 }).await.unwrap());
    assert!(meta.get_asset("up2").await.unwrap().is_none());
    assert!(meta.assets_with_hash("blake3:cc").await.unwrap().is_empty());
    assert!(meta.assets_tagged("comfy:").await.unwrap().is_empty());
}

/// Listings: newest first, one owner's alone, without logs, paged by a
/// cursor, ended early by the scan budget with a cursor to go on from.
pub(crate) async fn listings_page_newest_first_per_owner_within_a_budget(meta: &dyn MetaStore) {
    for i in 0..5u64 {
        let mut j = job(&format!("a{i}"), "alice", 100 + i as Micros, i + 1);
        j.logs = Some(super::JobLogRecord { text: "x".repeat(100), truncated: false, captured_at: 0 });
        meta.submit(&j, &json!({}), None).await.unwrap();
    }
    for i in 0..20u64 {
        meta.submit(&job(&format!("b{i}"), "bob", 50 + i as Micros, 10 + i), &json!({}), None).await.unwrap();
    }
    let all = |p: &super::JobPage| p.jobs.iter().map(|j| j.id.clone()).collect::<Vec<_>>();
    let first = meta.list_jobs(Some("alice"), None, 3, usize::MAX, &|_| true).await.unwrap();
    assert_eq!(all(&first), ["a4", "a3", "a2"]);
    assert!(first.jobs.iter().all(|j| j.logs.is_none()), "listings leave logs out");
    let rest = meta.list_jobs(Some("alice"), first.next.as_deref(), 3, usize::MAX, &|_| true).await.unwrap();
    assert_eq!(all(&rest), ["a1", "a0"]);
    assert!(rest.next.is_none());
    assert!(meta.get_job("a4").await.unwrap().unwrap().logs.is_some(), "a read of one has them");
    // A filter few match, on a budget: short pages that go on.
    let (mut seen, mut cursor, mut pages) = (Vec::new(), None, 0);
    loop {
        let page = meta.list_jobs(None, cursor.as_deref(), 10, 4, &|j| j.id.ends_with('1')).await.unwrap();
        assert!(page.jobs.len() <= 4);
        seen.extend(all(&page));
        pages += 1;
        match page.next {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    assert!(pages >= 6, "25 records on a budget of 4: {pages} pages");
    assert_eq!(seen, ["a1", "b11", "b1"], "newest first");
}

/// A terminal record and its output assets, made durable together, read back.
pub(crate) async fn a_finished_job_reads_back_with_its_outputs(meta: &dyn MetaStore) {
    let j = job("j", "local", 10, 1);
    meta.submit(&j, &json!({"9": {"class_type": "SaveImage"}}), None).await.unwrap();
    let running = JobRecord { status: JobStatus::Running, started_at: Some(11), attempts: 1, ..j.clone() };
    meta.put_job(&running).await.unwrap();
    meta.record_start(&running).await.unwrap();
    let out = asset("o", Some("j"), "blake3:dd", None, &[]);
    let output = OutputRecord {
        node_id: "9".into(),
        name: "o.png".into(),
        kind: "image".into(),
        content_type: "image/png".into(),
        size_bytes: 3,
        asset_id: "o".into(),
        hash: "blake3:dd".into(),
        subfolder: Some(String::new()),
    };
    let done = JobRecord { status: JobStatus::Succeeded, completed_at: Some(20), outputs: vec![output], ..running };
    // The outputs are written first; the terminal write makes them durable with it.
    meta.put_asset(&out).await.unwrap();
    meta.finish_job(&done, std::slice::from_ref(&out)).await.unwrap();
    meta.sync_jobs().await.unwrap();
    assert_eq!(meta.get_job("j").await.unwrap(), Some(done));
    assert_eq!(meta.get_asset("o").await.unwrap(), Some(out));
    assert!(meta.unfinished_jobs().await.unwrap().is_empty());
    let text = meta.get_workflow_bytes("j").await.unwrap().unwrap();
    assert_eq!(serde_json::from_slice::<serde_json::Value>(&text).unwrap(), json!({"9": {"class_type": "SaveImage"}}));
}
