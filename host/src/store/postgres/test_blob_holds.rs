//! Blob holds across hosts (`blob_holds`), on the server
//! `KILN_TEST_DATABASE_URL` names.

use super::test_db::fresh;
use crate::store::MetaStore;

/// A blob held by a live claimant (an unfinished job, an upload of a host
/// still registered) reads as held to a pass on any host; an ended
/// claimant's hold does not and is pruned; a hold waits for a pass that
/// has the blob locked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blob_holds_keep_blobs_from_every_hosts_collection() {
    use crate::store::JobStatus;
    use crate::store::cluster::HostLeases;
    let Some(db) = fresh().await else { return };
    let (a, b) = (db.clone().as_host("a"), db.as_host("b"));
    let (lease_a, lease_b) = (super::PgHosts::new(a.clone(), "a"), super::PgHosts::new(b.clone(), "b"));
    let minute = std::time::Duration::from_secs(60);
    lease_a.register(minute).await.unwrap();
    lease_b.register(minute).await.unwrap();
    let (meta_a, meta_b) = (super::PgMeta::new(a), std::sync::Arc::new(super::PgMeta::new(b)));
    // A lock dropped unlocks in the background, and a pass that finds the
    // blob locked reads it as held: held only if it stays so.
    async fn held(meta: &super::PgMeta, name: &str) -> bool {
        for _ in 0..4 {
            if !meta.lock_blob(name).await.unwrap().unwrap().held {
                return false;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        true
    }
    let names = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<Vec<_>>();

    // An upload's hold lives while it is not released and its host lives.
    assert!(meta_b.hold_blobs(&names(&["blake3:up"]), "upload:1").await.unwrap());
    assert!(held(&meta_a, "blake3:up").await);
    assert!(!held(&meta_a, "blake3:other").await);
    meta_b.release_blobs("upload:1").await.unwrap();
    assert!(!held(&meta_a, "blake3:up").await, "released");
    meta_b.hold_blobs(&names(&["blake3:up"]), "upload:2").await.unwrap();
    // A job's holds live while it is unfinished.
    let mut job = crate::store::JobRecord::queued_for_test("j", 5, 1);
    meta_a.submit(&job, &serde_json::json!({}), None).await.unwrap();
    meta_a.hold_blobs(&names(&["blake3:in", "blake3:out"]), "j").await.unwrap();
    assert!(held(&meta_b, "blake3:in").await && held(&meta_b, "blake3:out").await);
    job.transition(JobStatus::Canceled, 10).unwrap();
    meta_a.put_job(&job).await.unwrap();
    assert!(!held(&meta_b, "blake3:out").await, "the job ended");
    // Its host gone, an upload's hold is over too; the ended ones are pruned.
    assert!(held(&meta_a, "blake3:up").await);
    lease_b.release().await.unwrap();
    assert!(!held(&meta_a, "blake3:up").await, "its host is gone");
    assert_eq!(meta_a.prune_blob_holds().await.unwrap(), 3);
    assert_eq!(meta_a.prune_blob_holds().await.unwrap(), 0);

    // A pass that locked a blob finishes with it before a hold lands.
    let lock = meta_a.lock_blob("blake3:busy").await.unwrap().unwrap();
    assert!(!lock.held);
    let holding = {
        let meta = meta_b.clone();
        tokio::spawn(async move { meta.hold_blobs(&["blake3:busy".to_string()], "upload:3").await })
    };
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(!holding.is_finished(), "the hold waits for the pass");
    drop(lock);
    tokio::time::timeout(std::time::Duration::from_secs(10), holding).await.unwrap().unwrap().unwrap();
}

/// A job's inputs are held from the very transaction that writes its
/// submission on a registered host, until it ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jobs_inputs_are_held_from_its_submission() {
    use crate::store::cluster::HostLeases;
    use crate::store::{Admission, JobInput, JobStatus, ServerBound};
    let Some(db) = fresh().await else { return };
    let (a, b) = (db.clone().as_host("a"), db.as_host("b"));
    super::PgHosts::new(a.clone(), "a").register(std::time::Duration::from_secs(60)).await.unwrap();
    let (meta_a, meta_b) = (super::PgMeta::new(a), super::PgMeta::new(b));
    let mut job = crate::store::JobRecord::queued_for_test("with-inputs", 5, 1);
    job.inputs = vec![JobInput { name: "in.png".into(), hash: "blake3:in".into() }];
    let open = ServerBound { max_queued: 1_000_000, queued_here: 1 };
    meta_a.submit_admitted(&job, &serde_json::json!({}), None, Admission { billed: None, key: None, server: open }).await.unwrap();
    assert!(meta_b.lock_blob("blake3:in").await.unwrap().unwrap().held, "held once submitted");
    job.transition(JobStatus::Canceled, 10).unwrap();
    meta_a.put_job(&job).await.unwrap();
    // (The first look's lock is let go in the background: a look that
    // finds it still taken reads as held.)
    let mut held = true;
    for _ in 0..50 {
        held = meta_b.lock_blob("blake3:in").await.unwrap().unwrap().held;
        if !held {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(!held, "not once it ended");
}
