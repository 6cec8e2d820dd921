//! The sled store: the trait's contract (`store::contract`), and its own:
//! claims, replay, indexes, budgets.

use super::*;
use crate::store::durability::Durability;

/// Every case of the `MetaStore` contract, each on a new store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sled_keeps_the_meta_store_contract() {
    let dirs = parking_lot::Mutex::new(Vec::new());
    crate::store::contract::run_all(|| {
        let dir = tempfile::tempdir().unwrap();
        let meta = SledMeta::open(dir.path()).unwrap();
        dirs.lock().push(dir);
        async move { std::sync::Arc::new(meta) as std::sync::Arc<dyn crate::store::MetaStore> }
    })
    .await;
}

/// The account and session stores' contracts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sled_keeps_the_account_and_session_store_contracts() {
    crate::store::contract_accounts::accounts(std::sync::Arc::new(SledAccounts::temporary().unwrap())).await;
    crate::store::contract_accounts::sessions(std::sync::Arc::new(super::SledSessions::temporary().unwrap())).await;
}

fn job(id: &str, created: Micros, seq: u64) -> JobRecord {
    JobRecord::queued_for_test(id, created, seq)
}

/// An asset record over `blake3:cc`.
fn asset(id: &str, job: Option<&str>, expires: Option<Micros>, tags: &[&str]) -> AssetRecord {
    AssetRecord {
        id: id.into(),
        owner: "local".into(),
        hash: "blake3:cc".into(),
        size_bytes: 1,
        content_type: "image/png".into(),
        file_path: None,
        created_at: 0,
        expires_at: expires,
        job_id: job.map(str::to_string),
        node_id: None,
        tags: tags.iter().map(|t| t.to_string()).collect(),
    }
}

/// The queue as the service rebuilds it: queued jobs in `seq` order.
fn queued(meta: &Sled) -> Vec<String> {
    let mut jobs: Vec<JobRecord> = meta.all_jobs().unwrap().into_iter().filter(|j| j.status == JobStatus::Queued).collect();
    jobs.sort_by_key(|j| j.seq);
    jobs.into_iter().map(|j| j.id).collect()
}

#[test]
fn open_waits_for_a_handle_being_dropped_and_names_a_held_directory() {
    let dir = tempfile::tempdir().unwrap();
    let first = Sled::open(dir.path(), Durability::PowerLoss).unwrap();
    // An in-process restart: the old handle goes away a moment later.
    let dropper = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(300));
        drop(first);
    });
    let second = Sled::open(dir.path(), Durability::PowerLoss).expect("opens once the old handle is gone");
    dropper.join().unwrap();
    // Held for good: a clear error after the wait.
    match Sled::open(dir.path(), Durability::PowerLoss) {
        Err(StoreError::Backend(m)) => assert!(m.contains("in use by another process"), "{m}"),
        other => panic!("expected the directory to be in use, got {:?}", other.map(|_| ())),
    }
    drop(second);
}

#[test]
fn submit_claims_once_and_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    {
        let meta = Sled::open(dir.path(), Durability::PowerLoss).unwrap();
        let claim = IdempotencyClaim { key: "k".into(), owner: "local".into(), job_id: Some("a".into()), claimed_at: 10, expires_at: 100 };
        meta.submit(&job("a", 10, 1), &serde_json::json!({"1": {}}), Some(&claim)).unwrap();
        let again = IdempotencyClaim { job_id: Some("b".into()), claimed_at: 20, ..claim.clone() };
        assert!(matches!(meta.submit(&job("b", 20, 2), &serde_json::json!({}), Some(&again)), Err(StoreError::KeyClaimed)));
        assert!(meta.get_job("b").unwrap().is_none(), "a refused claim records nothing");
        // An expired claim no longer holds the key.
        let later = IdempotencyClaim { job_id: Some("c".into()), claimed_at: 100, expires_at: 200, ..claim };
        meta.submit(&job("c", 30, 3), &serde_json::json!({}), Some(&later)).unwrap();
    }
    let meta = Sled::open(dir.path(), Durability::PowerLoss).unwrap();
    assert_eq!(queued(&meta), vec!["a".to_string(), "c".to_string()]);
    assert_eq!(meta.get_claim("k").unwrap().unwrap().job_id.as_deref(), Some("c"));
    assert_eq!(meta.get_workflow("a").unwrap(), Some(serde_json::json!({"1": {}})));
    let page = meta.list_jobs(None, None, 1, usize::MAX, &|_| true).unwrap();
    assert_eq!(page.jobs[0].id, "c");
    let page = meta.list_jobs(None, page.next.as_deref(), 5, usize::MAX, &|_| true).unwrap();
    assert_eq!(page.jobs.iter().map(|j| j.id.as_str()).collect::<Vec<_>>(), vec!["a"]);
    assert!(page.next.is_none());
    assert_eq!(meta.purge_claims(1_000).unwrap(), 1);
}

/// The purge reads only claims past their expiry (an index by expiry),
/// leaves a key claimed again since, and a store whose indexes predate
/// that index gets it when it opens.
#[test]
fn the_claim_purge_reads_expired_claims_only() {
    let dir = tempfile::tempdir().unwrap();
    let claim = |key: &str, job: &str, at: Micros| IdempotencyClaim {
        key: key.into(),
        owner: "local".into(),
        job_id: Some(job.into()),
        claimed_at: at,
        expires_at: at + 100,
    };
    {
        let meta = Sled::open(dir.path(), Durability::PowerLoss).unwrap();
        meta.submit(&job("a", 10, 1), &serde_json::json!({}), Some(&claim("k1", "a", 10))).unwrap();
        meta.submit(&job("b", 20, 2), &serde_json::json!({}), Some(&claim("k2", "b", 20))).unwrap();
        assert!(matches!(meta.submit(&job("x", 30, 3), &serde_json::json!({}), Some(&claim("k2", "x", 30))), Err(StoreError::KeyClaimed)));
        assert_eq!(meta.index.claims_expiring.len(), 2, "a refused claim leaves no entry");
        // k1 expired at 110 and is claimed again (expiring at 300).
        meta.submit(&job("c", 200, 4), &serde_json::json!({}), Some(&claim("k1", "c", 200))).unwrap();
        meta.submit(&job("d", 500, 5), &serde_json::json!({}), Some(&claim("k3", "d", 500))).unwrap();
        assert_eq!(meta.purge_claims(150).unwrap(), 1, "k2 only: k1's first entry finds a newer claim");
        assert_eq!(meta.get_claim("k1").unwrap().unwrap().job_id.as_deref(), Some("c"));
        assert!(meta.get_claim("k2").unwrap().is_none());
        assert_eq!(meta.index.claims_due(i64::MAX).unwrap().len(), 2, "the entries read are gone; k1's new one and k3's stay");
        // A store from before the claims index: built at open (an
        // unreadable claim is due at once, as the old full scan had it).
        meta.claims.insert(b"bad", b"not json".as_slice()).unwrap();
        meta.db.drop_tree("claims_expiring").unwrap();
        meta.index.info.insert(b"indexes", &[1u8]).unwrap();
        meta.flush().unwrap();
    }
    let meta = Sled::open(dir.path(), Durability::PowerLoss).unwrap();
    assert_eq!(meta.index.claims_due(i64::MAX).unwrap().len(), 3);
    assert_eq!(meta.purge_claims(1_000).unwrap(), 3);
    assert!(meta.claims.get(b"bad").unwrap().is_none());
    assert!(meta.get_claim("k1").unwrap().is_none() && meta.get_claim("k3").unwrap().is_none());
}

#[test]
fn assets_indexed_by_hash() {
    let dir = tempfile::tempdir().unwrap();
    let meta = Sled::open(dir.path(), Durability::PowerLoss).unwrap();
    let a = AssetRecord {
        id: "x".into(),
        owner: "local".into(),
        hash: "blake3:aa".into(),
        size_bytes: 1,
        content_type: "image/png".into(),
        file_path: None,
        created_at: 0,
        expires_at: None,
        job_id: None,
        node_id: None,
        tags: vec!["t".into()],
    };
    meta.put_asset(&a).unwrap();
    meta.put_asset(&AssetRecord { id: "y".into(), ..a.clone() }).unwrap();
    assert_eq!(meta.assets_with_hash("blake3:aa").unwrap().len(), 2);
    assert_eq!(meta.get_asset("y").unwrap().unwrap().tags, vec!["t".to_string()]);
    meta.delete_asset(&a).unwrap();
    assert_eq!(meta.assets_with_hash("blake3:aa").unwrap().len(), 1);
    assert!(meta.get_asset("x").unwrap().is_none());
    // Expired uploads are found by the sweep; outputs and later or
    // never-expiring uploads are not.
    meta.put_asset(&AssetRecord { id: "due".into(), expires_at: Some(100), ..a.clone() }).unwrap();
    meta.put_asset(&AssetRecord { id: "later".into(), expires_at: Some(101), ..a.clone() }).unwrap();
    meta.put_asset(&AssetRecord { id: "output".into(), expires_at: Some(50), job_id: Some("j".into()), ..a.clone() }).unwrap();
    let due: Vec<String> = meta.uploads_due(100, 10).unwrap().into_iter().map(|a| a.id).collect();
    assert_eq!(due, vec!["due".to_string()]);
}

fn ids<T>(records: Vec<T>, id: impl Fn(&T) -> &str) -> Vec<String> {
    let mut ids: Vec<String> = records.iter().map(|r| id(r).to_string()).collect();
    ids.sort();
    ids
}

/// Recovery, the sweep and the upload index read their records through
/// indexes that follow every write (status, expiry, tags changing; records
/// deleted), across a reopen; a store written before the indexes gets
/// them when it opens.
#[test]
fn the_periodic_work_finds_its_records_through_indexes() {
    let dir = tempfile::tempdir().unwrap();
    {
        let meta = Sled::open(dir.path(), Durability::PowerLoss).unwrap();
        // expires_at = created + 1000: a at 1010, b at 1020, c at 1030, d at 1040.
        for (i, id) in ["a", "b", "c", "d"].into_iter().enumerate() {
            meta.submit(&job(id, 10 * (i as Micros + 1), 5 + i as u64), &serde_json::json!({}), None).unwrap();
        }
        assert_eq!(ids(meta.unfinished_jobs().unwrap(), |j| &j.id), ["a", "b", "c", "d"]);
        let b = meta.get_job("b").unwrap().unwrap();
        meta.put_job(&JobRecord { status: JobStatus::Running, ..b.clone() }).unwrap();
        meta.finish_job(&JobRecord { status: JobStatus::Succeeded, ..b.clone() }, &[]).unwrap();
        let c = meta.get_job("c").unwrap().unwrap();
        meta.put_job(&JobRecord { status: JobStatus::Expired, ..c }).unwrap();
        meta.delete_job(&meta.get_job("d").unwrap().unwrap()).unwrap();
        assert_eq!(ids(meta.unfinished_jobs().unwrap(), |j| &j.id), ["a"], "finished, expired and deleted jobs left it");
        let bound = meta.index.max_seq().unwrap();
        assert!(bound >= 8, "a bound on every seq submitted, deleted or not: {bound}");
        meta.submit(&job("e", 50, bound + 10), &serde_json::json!({}), None).unwrap();
        assert!(meta.index.max_seq().unwrap() >= bound + 10, "a seq past the block reserves the next one");
        meta.delete_job(&meta.get_job("e").unwrap().unwrap()).unwrap();
        // Due at 1025: a and b (not expired, past their expiry); c is
        // expired and purged only once its expiry is before `purge_before`.
        assert_eq!(ids(meta.jobs_due(1025, 0, 100).unwrap(), |j| &j.id), ["a", "b"]);
        assert_eq!(ids(meta.jobs_due(1025, 1030, 100).unwrap(), |j| &j.id), ["a", "b", "c"]);
        assert_eq!(ids(meta.jobs_due(1015, 0, 1).unwrap(), |j| &j.id), ["a"], "at most the limit");
        assert!(meta.jobs_due(1000, 1000, 100).unwrap().is_empty());

        meta.put_asset(&asset("out1", Some("a"), Some(50), &[])).unwrap();
        meta.put_asset(&asset("out2", Some("a"), None, &[])).unwrap();
        meta.put_asset(&asset("other", Some("b"), None, &[])).unwrap();
        meta.put_asset(&asset("up", None, Some(100), &["comfy:input", "mine"])).unwrap();
        meta.put_asset(&asset("up2", None, None, &["comfy:temp"])).unwrap();
        assert_eq!(ids(meta.assets_of_job("a").unwrap(), |a| &a.id), ["out1", "out2"]);
        assert_eq!(ids(meta.uploads_due(100, 10).unwrap(), |a| &a.id), ["up"], "outputs are not uploads");
        assert_eq!(ids(meta.assets_tagged("comfy:").unwrap(), |a| &a.id), ["up", "up2"]);
        // Referenced again: a later expiry, a tag dropped.
        meta.put_asset(&asset("up", None, Some(200), &["mine"])).unwrap();
        assert!(meta.uploads_due(100, 10).unwrap().is_empty(), "its old expiry left the index");
        assert_eq!(ids(meta.uploads_due(200, 10).unwrap(), |a| &a.id), ["up"]);
        assert_eq!(ids(meta.assets_tagged("comfy:").unwrap(), |a| &a.id), ["up2"]);
        assert_eq!(ids(meta.assets_tagged("mine").unwrap(), |a| &a.id), ["up"]);
        meta.delete_asset(&meta.get_asset("out1").unwrap().unwrap()).unwrap();
        assert_eq!(ids(meta.assets_of_job("a").unwrap(), |a| &a.id), ["out2"]);
        meta.checkpoint().unwrap();
        // After the checkpoint (which saved the unfinished set): one job
        // submitted, one finished; only the commit log has them.
        meta.submit(&job("f", 60, 9), &serde_json::json!({}), None).unwrap();
        let a = meta.get_job("a").unwrap().unwrap();
        meta.finish_job(&JobRecord { status: JobStatus::Failed, ..a }, &[]).unwrap();
        assert_eq!(ids(meta.unfinished_jobs().unwrap(), |j| &j.id), ["f"]);
    }
    let meta = Sled::open(dir.path(), Durability::PowerLoss).unwrap();
    assert_eq!(ids(meta.unfinished_jobs().unwrap(), |j| &j.id), ["f"], "the saved set and the log together");
    let a = meta.get_job("a").unwrap().unwrap();
    meta.put_job(&JobRecord { status: JobStatus::Queued, ..a }).unwrap();
    meta.index.settle(&meta.get_job("a").unwrap().unwrap());
    meta.checkpoint().unwrap();
    drop(meta);
    let meta = Sled::open(dir.path(), Durability::PowerLoss).unwrap();
    assert_eq!(ids(meta.unfinished_jobs().unwrap(), |j| &j.id), ["a", "f"]);
    assert_eq!(ids(meta.jobs_due(1025, 1030, 100).unwrap(), |j| &j.id), ["a", "b", "c"]);
    assert_eq!(ids(meta.uploads_due(200, 10).unwrap(), |a| &a.id), ["up"]);
    assert!(meta.index.max_seq().unwrap() >= 1034, "the bound survives a reopen");

    // A store written before the indexes: they are built when it opens.
    for tree in ["jobs_expiring", "jobs_expired", "assets_by_job", "uploads_expiring", "assets_by_tag", "store_info"] {
        meta.db.drop_tree(tree).unwrap();
    }
    meta.flush().unwrap();
    drop(meta);
    let meta = Sled::open(dir.path(), Durability::PowerLoss).unwrap();
    assert_eq!(ids(meta.unfinished_jobs().unwrap(), |j| &j.id), ["a", "f"]);
    assert_eq!(ids(meta.jobs_due(1025, 1030, 100).unwrap(), |j| &j.id), ["a", "b", "c"]);
    assert_eq!(ids(meta.assets_of_job("a").unwrap(), |a| &a.id), ["out2"]);
    assert_eq!(ids(meta.assets_tagged("comfy:").unwrap(), |a| &a.id), ["up2"]);
    assert!(meta.index.max_seq().unwrap() >= 7, "rebuilt from the records left");
}

/// Entries a crash left without their record (deleted between the record
/// and its entries) or filing a record elsewhere are removed once a minute
/// past their time, so they do not take a share of every sweep's batch.
#[test]
fn stale_index_entries_are_removed_as_the_sweep_meets_them() {
    let dir = tempfile::tempdir().unwrap();
    let meta = Sled::open(dir.path(), Durability::PowerLoss).unwrap();
    // expires_at = created + 1000.
    for (id, created) in [("gone", 10), ("kept", 20), ("moved", 30)] {
        meta.submit(&job(id, created, 1), &serde_json::json!({}), None).unwrap();
    }
    // The record deleted and the crash before its entries went.
    meta.jobs.remove(b"gone").unwrap();
    // Expired, the crash before its `expiring` entry went.
    let moved = meta.get_job("moved").unwrap().unwrap();
    let moved = JobRecord { status: JobStatus::Expired, ..moved };
    meta.index.before_job(&moved).unwrap();
    meta.jobs.insert(b"moved", &serde_json::to_vec(&moved).unwrap()).unwrap();
    // Within a minute of their time, entries are left alone (a record's
    // entries are written just before it).
    assert_eq!(ids(meta.jobs_due(1040, 0, 100).unwrap(), |j| &j.id), ["kept"]);
    assert_eq!(meta.index.expiring.len(), 3);
    let later = 1040 + STALE_AFTER;
    assert_eq!(ids(meta.jobs_due(later, 0, 100).unwrap(), |j| &j.id), ["kept"]);
    assert_eq!(meta.index.expiring.len(), 1, "only the entry of the job still filed there is left");
    assert_eq!(ids(meta.jobs_due(later, 2000, 100).unwrap(), |j| &j.id), ["kept", "moved"], "the expired job's own entry stays");

    let upload = asset("up", None, Some(100), &[]);
    meta.put_asset(&upload).unwrap();
    meta.assets.remove(b"up").unwrap();
    assert!(meta.uploads_due(later, 10).unwrap().is_empty());
    assert_eq!(meta.index.uploads_expiring.len(), 0);
}

/// A submission whose record reached sled while its commit log frame did
/// not, after the unfinished set was saved (a checkpoint's flush between
/// its record and its frame, then a crash): the open finds it by its
/// creation time, indexed as unfinished and expiring.
#[test]
fn a_submission_in_sled_only_is_found_when_the_store_opens() {
    let dir = tempfile::tempdir().unwrap();
    let now = crate::store::now_micros();
    {
        let meta = Sled::open(dir.path(), Durability::PowerLoss).unwrap();
        meta.checkpoint().unwrap();
        let lost = JobRecord { expires_at: now + 5, ..job("lost", now, 1) };
        // The record and its time index, none of the submission's index
        // entries, no frame in the log.
        meta.by_time.insert(time_key(&lost), lost.id.as_bytes()).unwrap();
        meta.jobs.insert(lost.id.as_bytes(), &encode(&lost).unwrap()).unwrap();
        meta.flush().unwrap();
        assert!(meta.unfinished_jobs().unwrap().is_empty());
    }
    let meta = Sled::open(dir.path(), Durability::PowerLoss).unwrap();
    assert_eq!(ids(meta.unfinished_jobs().unwrap(), |j| &j.id), ["lost"]);
    assert_eq!(ids(meta.jobs_due(now + 10, 0, 10).unwrap(), |j| &j.id), ["lost"]);
}

/// A crash after the commit log had entries that sled had not written
/// out: they come back, each only where sled's record is older.
#[test]
fn writes_sled_lost_come_back_from_the_commit_log() {
    let dir = tempfile::tempdir().unwrap();
    let started = |j: &JobRecord, attempts| JobRecord { status: JobStatus::Running, started_at: Some(j.created_at + 1), attempts, ..j.clone() };
    let (a, b, c, d) = (job("a", 10, 1), job("b", 20, 2), job("c", 30, 3), job("d", 40, 4));
    let out = AssetRecord {
        id: "out-b".into(),
        owner: "local".into(),
        hash: "blake3:bb".into(),
        size_bytes: 3,
        content_type: "image/png".into(),
        file_path: Some("b.png".into()),
        created_at: 25,
        expires_at: Some(100),
        job_id: Some("b".into()),
        node_id: Some("9".into()),
        tags: vec![],
    };
    let finished_b = JobRecord {
        status: JobStatus::Succeeded,
        attempts: 1,
        outputs: vec![crate::store::OutputRecord {
            node_id: "9".into(),
            name: "b.png".into(),
            kind: "image".into(),
            content_type: "image/png".into(),
            size_bytes: 3,
            asset_id: out.id.clone(),
            hash: out.hash.clone(),
            subfolder: Some(String::new()),
        }],
        ..b.clone()
    };
    let claim = IdempotencyClaim { key: "k".into(), owner: "local".into(), job_id: Some("d".into()), claimed_at: 40, expires_at: 1_000 };
    {
        let meta = Sled::open(dir.path(), Durability::PowerLoss).unwrap();
        // Durable in sled: b queued, c finished.
        meta.submit(&b, &serde_json::json!({"b": 1}), None).unwrap();
        meta.submit(&c, &serde_json::json!({}), None).unwrap();
        meta.put_job(&JobRecord { status: JobStatus::Succeeded, attempts: 1, ..c.clone() }).unwrap();
        meta.checkpoint().unwrap();
        // Only in the log (as if sled lost them in the crash): a's
        // submission and start, b's start and finish with its output,
        // a stale start of c, d's submission with its claim.
        meta.append(&entry("submitted", &[("job", &encode(&a).unwrap()), ("workflow", br#"{"a":1}"#), ("claim", b"null")]), false).unwrap();
        meta.record_start(&started(&a, 1)).unwrap();
        meta.record_start(&started(&b, 1)).unwrap();
        let assets = encode(&vec![out.clone()]).unwrap();
        meta.append(&entry("finished", &[("job", &encode(&finished_b).unwrap()), ("assets", &assets)]), false).unwrap();
        meta.record_start(&started(&c, 1)).unwrap();
        meta.append(&entry("submitted", &[("job", &encode(&d).unwrap()), ("workflow", br#"{"d":1}"#), ("claim", &encode(&claim).unwrap())]), true).unwrap();
    }
    let meta = Sled::open(dir.path(), Durability::PowerLoss).unwrap();
    let get = |id: &str| meta.get_job(id).unwrap().unwrap();
    assert_eq!((get("a").status, get("a").attempts), (JobStatus::Running, 1), "submitted and started from the log");
    assert_eq!(meta.get_workflow("a").unwrap(), Some(serde_json::json!({"a": 1})));
    assert_eq!((get("b").status, get("b").outputs.len()), (JobStatus::Succeeded, 1), "finished from the log");
    assert_eq!(meta.assets_with_hash("blake3:bb").unwrap().len(), 1, "with its output asset");
    assert_eq!((get("c").status, get("c").attempts), (JobStatus::Succeeded, 1), "a newer durable state wins");
    assert_eq!(get("d").status, JobStatus::Queued);
    assert_eq!(meta.get_claim("k").unwrap().and_then(|c| c.job_id).as_deref(), Some("d"), "the claim comes back with its job");
    assert_eq!(queued(&meta), vec!["d".to_string()], "started and finished jobs are off the queue");
    assert_eq!(meta.list_jobs(None, None, 10, usize::MAX, &|_| true).unwrap().jobs.len(), 4, "listed");
    // Replayed once: sled has it all, the log starts a new cycle.
    drop(meta);
    let (_, left) = CommitLog::open(&dir.path().join(LOG_FILE), Durability::PowerLoss).unwrap();
    assert!(left.is_empty());
}

#[test]
fn one_owners_listing_reads_only_that_owners_records() {
    let dir = tempfile::tempdir().unwrap();
    let meta = Sled::open(dir.path(), Durability::PowerLoss).unwrap();
    let mut mine = Vec::new();
    for i in 0..5u64 {
        let mut j = job(&format!("a{i}"), 100 + i as i64, i);
        j.owner = "alice".into();
        j.logs = Some(crate::store::JobLogRecord { text: "x".repeat(1000), truncated: false, captured_at: 0 });
        meta.submit(&j, &serde_json::json!({}), None).unwrap();
        mine.push(j.id);
    }
    for i in 0..300u64 {
        let mut j = job(&format!("b{i}"), 50 + i as i64, 100 + i);
        j.owner = "bob".into();
        meta.submit(&j, &serde_json::json!({}), None).unwrap();
        // Unreadable: a listing that decoded them would fail.
        meta.jobs.insert(j.id.as_bytes(), b"not json").unwrap();
    }
    assert!(matches!(meta.list_jobs(None, None, 1000, usize::MAX, &|_| true), Err(StoreError::Corrupt(_))), "a scan of everyone's reads bob's");
    let first = meta.list_jobs(Some("alice"), None, 3, usize::MAX, &|_| true).unwrap();
    assert_eq!(first.jobs.iter().map(|j| j.id.as_str()).collect::<Vec<_>>(), ["a4", "a3", "a2"]);
    assert!(first.jobs.iter().all(|j| j.logs.is_none()), "listings leave logs out");
    let rest = meta.list_jobs(Some("alice"), first.next.as_deref(), 3, usize::MAX, &|_| true).unwrap();
    assert_eq!(rest.jobs.iter().map(|j| j.id.as_str()).collect::<Vec<_>>(), ["a1", "a0"]);
    assert!(rest.next.is_none());
    assert!(meta.list_jobs(Some("carol"), None, 10, usize::MAX, &|_| true).unwrap().jobs.is_empty());
    assert!(meta.get_job("a0").unwrap().unwrap().logs.is_some(), "a read of one job has its log");
    // A store written before the index existed gets it when it opens.
    // (bob's unreadable records are skipped; the checkpoint empties the
    // commit log, whose replay would read them.)
    meta.by_owner.clear().unwrap();
    meta.checkpoint().unwrap();
    drop(meta);
    let meta = Sled::open(dir.path(), Durability::PowerLoss).unwrap();
    assert_eq!(meta.list_jobs(Some("alice"), None, 10, usize::MAX, &|_| true).unwrap().jobs.len(), 5);
}

/// A filter few jobs match reads at most `max_scanned` records per
/// page: short pages, each with a cursor, that together list them all.
#[test]
fn a_filtered_listing_reads_at_most_its_budget() {
    let dir = tempfile::tempdir().unwrap();
    let meta = Sled::open(dir.path(), Durability::PowerLoss).unwrap();
    for i in 0..50u64 {
        meta.submit(&job(&format!("j{i:02}"), 100 + i as i64, i + 1), &serde_json::json!({}), None).unwrap();
    }
    let read = std::sync::atomic::AtomicUsize::new(0);
    let tenth = |j: &JobRecord| {
        read.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        j.id.ends_with('0')
    };
    let first = meta.list_jobs(None, None, 10, 12, &tenth).unwrap();
    assert_eq!(read.load(std::sync::atomic::Ordering::Relaxed), 12, "stopped at the budget");
    assert_eq!(first.jobs.iter().map(|j| j.id.as_str()).collect::<Vec<_>>(), ["j40"], "a short page");
    assert!(first.next.is_some(), "and a cursor to go on from");
    let (mut all, mut cursor, mut pages) = (Vec::new(), None, 0);
    loop {
        read.store(0, std::sync::atomic::Ordering::Relaxed);
        let page = meta.list_jobs(None, cursor.as_deref(), 10, 12, &tenth).unwrap();
        assert!(read.load(std::sync::atomic::Ordering::Relaxed) <= 12);
        all.extend(page.jobs.into_iter().map(|j| j.id));
        pages += 1;
        match page.next {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    assert_eq!(all, ["j40", "j30", "j20", "j10", "j00"], "every match, newest first, none twice");
    assert!((5..=6).contains(&pages), "{pages} pages of at most 12 reads");
    // Without a budget, one page.
    let whole = meta.list_jobs(None, None, 10, usize::MAX, &tenth).unwrap();
    assert_eq!((whole.jobs.len(), whole.next.is_none()), (5, true));
}

/// Writers racing on one asset (tags and expiry different per writer; an
/// asset's bytes, so its hash, never change): whichever record is stored
/// last, every index finds it by what it holds; and an asset deleted while
/// it is being updated leaves no hash entry behind.
#[test]
fn racing_updates_of_an_asset_leave_it_found_by_what_it_holds() {
    let dir = tempfile::tempdir().unwrap();
    let meta = Sled::open(dir.path(), Durability::PowerLoss).unwrap();
    let version = |writer: usize| asset("a", None, Some(1000 + writer as Micros), &[&format!("w{writer}")]);
    for round in 0..5 {
        meta.put_asset(&asset("a", None, Some(5000), &["first"])).unwrap();
        std::thread::scope(|s| {
            for writer in 0..4 {
                let (meta, record) = (&meta, version(writer));
                s.spawn(move || {
                    for _ in 0..300 {
                        assert!(meta.update_asset(&record).unwrap());
                    }
                });
            }
        });
        let stored = meta.get_asset("a").unwrap().unwrap();
        let found = |records: Vec<AssetRecord>| records.into_iter().filter(|r| r.id == "a").count();
        assert_eq!(found(meta.assets_tagged(&stored.tags[0]).unwrap()), 1, "round {round}: by its tag");
        assert_eq!(found(meta.uploads_due(stored.expires_at.unwrap(), 100).unwrap()), 1, "round {round}: by its expiry");
        assert_eq!(found(meta.assets_with_hash(&stored.hash).unwrap()), 1, "round {round}: by its hash");
        assert_eq!(found(meta.assets_tagged("first").unwrap()), 0, "round {round}: not by what it held before");

        // Deleted while two writers update it.
        std::thread::scope(|s| {
            for writer in 0..2 {
                let (meta, record) = (&meta, version(writer));
                s.spawn(move || {
                    for _ in 0..200 {
                        meta.update_asset(&record).unwrap();
                    }
                });
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
            meta.delete_asset(&meta.get_asset("a").unwrap().unwrap_or_else(|| version(0))).unwrap();
        });
        assert!(meta.get_asset("a").unwrap().is_none(), "round {round}: an update never brings a deleted asset back");
        assert!(meta.hashes.scan_prefix(b"blake3:cc\0").next().is_none(), "round {round}: no hash entry of a deleted asset");
    }
}

/// Writers merging into one asset from its stored record (as uploads of
/// the same bytes do, each adding its tag): no writer's tag is lost.
#[test]
fn concurrent_changes_of_an_asset_are_merged_not_lost() {
    let dir = tempfile::tempdir().unwrap();
    let meta = Sled::open(dir.path(), Durability::PowerLoss).unwrap();
    meta.put_asset(&asset("a", None, Some(5000), &["first"])).unwrap();
    std::thread::scope(|s| {
        for writer in 0..4 {
            let meta = &meta;
            s.spawn(move || {
                for n in 0..50 {
                    let tag = format!("w{writer}-{n}");
                    let add = move |stored: &AssetRecord| {
                        let mut next = stored.clone();
                        next.tags.push(tag.clone());
                        Some(next)
                    };
                    assert!(meta.change_asset("a", &add).unwrap().is_some());
                }
            });
        }
    });
    let stored = meta.get_asset("a").unwrap().unwrap();
    assert_eq!(stored.tags.len(), 1 + 4 * 50, "every writer's tags: {:?}", stored.tags);
    assert_eq!(meta.assets_tagged("w3-49").unwrap().len(), 1, "found by the last tag");
}

/// Large workflows, job records and asset records never make sled write a
/// page to a blob file (which it never syncs: a power cut could leave the
/// log pointing at nothing, and sled would not open), and come back whole
/// after the store is reopened.
#[test]
fn large_records_stay_out_of_sled_blob_files() {
    let dir = tempfile::tempdir().unwrap();
    let workflow = serde_json::json!({ "1": { "class_type": "A", "inputs": {}, "_meta": { "title": "w".repeat(1 << 20) } } });
    let mut ids = Vec::new();
    {
        let meta = Sled::open(dir.path(), Durability::PowerLoss).unwrap();
        for i in 0..40 {
            let mut j = job(&format!("big-{i:02}"), i, i as u64);
            j.logs = Some(crate::store::JobLogRecord { text: format!("{i}").repeat(200 << 10), truncated: false, captured_at: 0 });
            meta.submit(&j, &workflow, None).unwrap();
            let mut a = asset(&format!("asset-{i:02}"), Some(&j.id), None, &[]);
            a.tags = (0..400).map(|t| format!("tag-{t}")).collect();
            meta.put_asset(&a).unwrap();
            ids.push(j.id);
        }
        meta.checkpoint().unwrap();
    }
    let blobs: Vec<_> = std::fs::read_dir(dir.path().join("blobs")).map(|d| d.map(|e| e.unwrap().file_name()).collect()).unwrap_or_default();
    assert!(blobs.is_empty(), "sled wrote blob files: {blobs:?}");
    let meta = Sled::open(dir.path(), Durability::PowerLoss).unwrap();
    for (i, id) in ids.iter().enumerate() {
        let j = meta.get_job(id).unwrap().unwrap();
        assert_eq!(j.logs.unwrap().text.len(), format!("{i}").len() * (200 << 10));
        assert_eq!(meta.get_workflow(id).unwrap().unwrap(), workflow);
        assert_eq!(meta.get_asset(&format!("asset-{i:02}")).unwrap().unwrap().tags.len(), 400);
    }
}

/// A store written before records were split: its long records are split
/// when it opens (once), and read back the same.
#[test]
fn long_records_of_an_older_store_are_split_when_it_opens() {
    let dir = tempfile::tempdir().unwrap();
    let workflow = serde_json::json!({ "1": { "class_type": "A", "inputs": {}, "_meta": { "title": "w".repeat(64 << 10) } } });
    {
        let meta = Sled::open(dir.path(), Durability::PowerLoss).unwrap();
        meta.submit(&job("old", 1, 1), &serde_json::json!({}), None).unwrap();
        // As an older version wrote it: whole, and not yet split.
        meta.db.open_tree("workflows").unwrap().insert(b"old", serde_json::to_vec(&workflow).unwrap()).unwrap();
        meta.db.remove(b"records_split").unwrap();
        meta.checkpoint().unwrap();
    }
    let meta = Sled::open(dir.path(), Durability::PowerLoss).unwrap();
    assert!(meta.db.open_tree("workflows").unwrap().get(b"old").unwrap().unwrap().len() < 64, "a stub now");
    assert_eq!(meta.get_workflow("old").unwrap().unwrap(), workflow);
}
