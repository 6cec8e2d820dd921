//! Idle hosts taking jobs queued on busy ones (`HostLeases::take_queued`),
//! on the server `KILN_TEST_DATABASE_URL` names.

use std::sync::Arc;
use std::time::Duration;

use super::test_db::{fresh, needing};
use crate::store::cluster::{HostLeases, Notices, QUEUED_BEFORE_TAKEN, Runnable, Topic};
use crate::store::{JobRecord, JobStatus, MetaStore, StoreError};

/// What an idle host takes from a busy one: queued jobs it can run, after
/// they waited a moment on their host, each key's oldest in turn; never a
/// job refused by its key's running limit, asked to be canceled, past its
/// expiry, with `extra_data`, held by no live host, or running. Its former
/// holder hears of it, finds it among its jobs taken away, and its late
/// start of one is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_host_takes_queued_jobs_a_busy_one_holds() {
    let Some(db) = fresh().await else { return };
    let minute = Duration::from_secs(60);
    let (a, b, c) = (db.clone().as_host("a"), db.clone().as_host("b"), db.clone().as_host("c"));
    let (lease_a, lease_b, lease_c) = (super::PgHosts::new(a.clone(), "a"), super::PgHosts::new(b.clone(), "b"), super::PgHosts::new(c.clone(), "c"));
    for lease in [&lease_a, &lease_b, &lease_c] {
        lease.register(minute).await.unwrap();
    }
    let (meta_a, meta_b, meta_c) = (super::PgMeta::new(a.clone()), super::PgMeta::new(b), super::PgMeta::new(c));
    let job = |id: &str, created: i64, owner: &str| JobRecord { created_at: created, ..needing(id, 1, owner, &[("core", "blake3:c0")]) };
    let on_a = [
        job("x1", 10, "x"),
        job("x2", 11, "x"),
        job("x3", 12, "x"),
        job("y1", 13, "y"),
        JobRecord { had_extra_data: true, ..job("with-extra", 1, "x") },
        JobRecord { expires_at: 0, ..job("expired", 2, "x") },
        job("to-cancel", 3, "x"),
        job("refused", 4, "z"),
        job("running", 5, "x"),
        job("elsewhere", 6, "tenant"),
        needing("other-build", 7, "x", &[("core", "blake3:0ld")]),
    ];
    for job in &on_a {
        meta_a.submit(job, &serde_json::json!({}), None).await.unwrap();
    }
    assert!(lease_a.request_cancel("to-cancel").await.unwrap());
    let refused = JobRecord { status: JobStatus::Running, ..on_a[7].clone() };
    // Key "z" runs one job on c: a's start of its job is refused and marked.
    meta_c.submit(&job("z-running", 0, "z"), &serde_json::json!({}), None).await.unwrap();
    meta_c.start_admitted(&JobRecord { status: JobStatus::Running, ..job("z-running", 0, "z") }, "z", 1).await.unwrap();
    assert!(matches!(meta_a.start_admitted(&refused, "z", 1).await, Err(StoreError::Refused(_))));
    meta_a.put_job(&JobRecord { status: JobStatus::Running, ..on_a[8].clone() }).await.unwrap();
    // A job of a host that stopped is taken over, not taken from a queue.
    let gone_db = db.clone().as_host("gone");
    let gone = super::PgHosts::new(gone_db.clone(), "gone");
    gone.register(minute).await.unwrap();
    super::PgMeta::new(gone_db).submit(&job("orphan", 0, "x"), &serde_json::json!({}), None).await.unwrap();
    gone.release().await.unwrap();

    let here = Runnable { hashes: vec!["blake3:c0".into()], job: Arc::new(|job: &JobRecord| job.owner != "tenant"), wait: minute };
    assert!(lease_b.take_queued(10, &here).await.unwrap().is_empty(), "none has waited long enough on its host");
    tokio::time::sleep(QUEUED_BEFORE_TAKEN * 2).await;

    let notices_a = super::PgNotices::start(&a).unwrap();
    let mut told = notices_a.subscribe(Topic::Control);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while notices_a.listens() == 0 {
        assert!(std::time::Instant::now() < deadline, "a listens");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Just queued (the oldest by its own clock): its host starts it if it can.
    meta_a.submit(&job("fresh", 0, "y"), &serde_json::json!({}), None).await.unwrap();
    let taken: Vec<String> = lease_b.take_queued(3, &here).await.unwrap().into_iter().map(|j| j.id).collect();
    assert_eq!(taken, ["x1", "y1", "x2"], "each key's oldest in turn");
    // Another idle host takes what is left for it: not the fresh job, nor
    // those b just took.
    let rest: Vec<String> = lease_c.take_queued(10, &here).await.unwrap().into_iter().map(|j| j.id).collect();
    assert_eq!(rest, ["x3"], "nothing else may move");
    let heard = tokio::time::timeout(Duration::from_secs(5), told.recv()).await.expect("a hears").unwrap();
    assert_eq!(&*heard, a.holder(), "the notice names the former holder");

    let queued_on_a: Vec<String> = ["x1", "x2", "x3", "y1", "fresh"].map(String::from).to_vec();
    assert_eq!(lease_a.taken_away(&queued_on_a).await.unwrap(), ["x1", "x2", "x3", "y1"]);
    // a's late start is refused; b runs it.
    let start = |j: &JobRecord| JobRecord { status: JobStatus::Running, attempts: 1, ..j.clone() };
    assert!(matches!(meta_a.put_job(&start(&on_a[0])).await, Err(StoreError::Fenced(_))));
    meta_b.put_job(&start(&on_a[0])).await.unwrap();
    assert_eq!(meta_a.get_job("x1").await.unwrap().unwrap().status, JobStatus::Running);

    tokio::time::sleep(QUEUED_BEFORE_TAKEN * 2).await;
    let rest: Vec<String> = lease_c.take_queued(10, &here).await.unwrap().into_iter().map(|j| j.id).collect();
    assert_eq!(rest, ["fresh", "x2", "y1"], "b's (x1 runs there) after they waited there too");
    assert_eq!(lease_a.taken_away(&queued_on_a).await.unwrap(), queued_on_a);
}
