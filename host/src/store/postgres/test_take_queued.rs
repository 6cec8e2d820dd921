//! Idle hosts taking jobs queued on busy ones, and busy hosts taking turns
//! for keys queued only elsewhere (`HostLeases::take_queued`), on the
//! server `KILN_TEST_DATABASE_URL` names.

use std::sync::Arc;
use std::time::Duration;

use super::test_db::{fresh, needing};
use crate::store::cluster::{HostLeases, Notices, Runnable, TakeFor, Topic};
use crate::store::{JobRecord, JobStatus, MetaStore, StoreError};

const MINUTE: Duration = Duration::from_secs(60);

/// Runs `sql` (statements) on the test database (through a pool of the
/// test's own).
async fn sql(db: &super::PgDatabase, sql: &str) {
    let pool = sqlx::PgPool::connect_with((*db.pool.connect_options()).clone()).await.unwrap();
    sqlx::raw_sql(sql).execute(&pool).await.unwrap();
    pool.close().await;
}

/// Ids of the jobs taken for `limit` idle workers.
async fn take(lease: &super::PgHosts, limit: usize, here: &Runnable, waited: Duration) -> Vec<String> {
    take_for(lease, TakeFor::Idle(limit), here, waited).await
}

/// Ids of the jobs taken as `want` says.
async fn take_for(lease: &super::PgHosts, want: TakeFor<'_>, here: &Runnable, waited: Duration) -> Vec<String> {
    lease.take_queued(want, here, waited).await.unwrap().jobs.into_iter().map(|j| j.id).collect()
}

/// [`HostLeases::taken_away`], sorted.
async fn taken_away(lease: &super::PgHosts, ids: &[String]) -> Vec<String> {
    let mut taken = lease.taken_away(ids).await.unwrap();
    taken.sort();
    taken
}

/// A queued job of `owner` validated against core `blake3:c0`.
fn job(id: &str, created: i64, owner: &str) -> JobRecord {
    JobRecord { created_at: created, ..needing(id, 1, owner, &[("core", "blake3:c0")]) }
}

/// What an idle host takes from a busy one: queued jobs it can run, that
/// waited long enough on their host, each key's oldest in turn; never a
/// job refused by its key's running limit, asked to be canceled, past its
/// expiry, holding `extra_data` or `extra_pnginfo` in its host's memory,
/// held by no live host, or running. Its former holder hears of it and
/// finds it among its jobs taken away (not one not written yet), and its
/// late start of one is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_host_takes_queued_jobs_a_busy_one_holds() {
    let Some(db) = fresh().await else { return };
    let (a, b, c) = (db.clone().as_host("a"), db.clone().as_host("b"), db.clone().as_host("c"));
    let (lease_a, lease_b, lease_c) = (super::PgHosts::new(a.clone(), "a"), super::PgHosts::new(b.clone(), "b"), super::PgHosts::new(c.clone(), "c"));
    for lease in [&lease_a, &lease_b, &lease_c] {
        lease.register(MINUTE).await.unwrap();
    }
    let (meta_a, meta_b, meta_c) = (super::PgMeta::new(a.clone()), super::PgMeta::new(b), super::PgMeta::new(c));
    let on_a = [
        job("x1", 10, "x"),
        job("x2", 11, "x"),
        job("x3", 12, "x"),
        job("y1", 13, "y"),
        JobRecord { had_extra_data: true, ..job("with-extra", 1, "x") },
        JobRecord { pnginfo_held: true, ..job("with-pnginfo", 1, "x") },
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
    // Key "z" runs one job on c: a's start of its job is refused and marked.
    meta_c.submit(&job("z-running", 0, "z"), &serde_json::json!({}), None).await.unwrap();
    meta_c.start_admitted(&JobRecord { status: JobStatus::Running, ..job("z-running", 0, "z") }, "z", 1).await.unwrap();
    let refused = JobRecord { status: JobStatus::Running, ..on_a[8].clone() };
    assert!(matches!(meta_a.start_admitted(&refused, "z", 1).await, Err(StoreError::Refused(_))));
    meta_a.put_job(&JobRecord { status: JobStatus::Running, ..on_a[9].clone() }).await.unwrap();
    // A job of a host that stopped is taken over, not taken from a queue.
    let gone_db = db.clone().as_host("gone");
    let gone = super::PgHosts::new(gone_db.clone(), "gone");
    gone.register(MINUTE).await.unwrap();
    super::PgMeta::new(gone_db).submit(&job("orphan", 0, "x"), &serde_json::json!({}), None).await.unwrap();
    gone.release().await.unwrap();

    let here = Runnable { hashes: vec!["blake3:c0".into()], job: Arc::new(|job: &JobRecord| job.owner != "tenant"), wait: MINUTE };
    let early = lease_b.take_queued(TakeFor::Idle(10), &here, MINUTE).await.unwrap();
    assert!(early.jobs.is_empty(), "none has waited a minute on its host");
    assert!(early.next_in.is_some_and(|d| d > Duration::ZERO && d <= MINUTE), "it looks again when one has: {:?}", early.next_in);
    // All of them waited long enough; then one more is queued on a.
    sql(&db, "UPDATE jobs SET held_since = 0").await;
    meta_a.submit(&job("fresh", 0, "y"), &serde_json::json!({}), None).await.unwrap();

    let notices_a = super::PgNotices::start(&a).unwrap();
    let mut told = notices_a.subscribe(Topic::Control);
    super::test_db::listening(&notices_a, "a").await;
    assert_eq!(take(&lease_b, 3, &here, MINUTE).await, ["x1", "y1", "x2"], "each key's oldest in turn");
    // Another idle host takes what is left for it: not the fresh job, nor
    // those b just took.
    assert_eq!(take(&lease_c, 10, &here, MINUTE).await, ["x3"], "nothing else may move");
    let heard = tokio::time::timeout(Duration::from_secs(5), told.recv()).await.expect("a hears").unwrap();
    assert_eq!(&*heard, a.holder(), "the notice names the former holder");

    // A submission a has not written yet is still a's.
    let queued_on_a: Vec<String> = ["x1", "x2", "x3", "y1", "fresh", "not-written-yet"].map(String::from).to_vec();
    assert_eq!(taken_away(&lease_a, &queued_on_a).await, ["x1", "x2", "x3", "y1"]);
    // a's late start is refused, with or without a running limit; b runs it.
    let start = |j: &JobRecord| JobRecord { status: JobStatus::Running, attempts: 1, ..j.clone() };
    assert!(matches!(meta_a.put_job(&start(&on_a[0])).await, Err(StoreError::Fenced(_))));
    assert!(matches!(meta_a.start_admitted(&start(&on_a[1]), "x", 5).await, Err(StoreError::Fenced(_))));
    meta_b.put_job(&start(&on_a[0])).await.unwrap();
    assert_eq!(meta_a.get_job("x1").await.unwrap().unwrap().status, JobStatus::Running);

    // Once they waited on their new host too, they move on.
    assert_eq!(take(&lease_c, 10, &here, Duration::ZERO).await, ["fresh", "x2", "y1"], "b's (x1 runs there) and the fresh one");
    assert_eq!(taken_away(&lease_a, &queued_on_a).await, ["fresh", "x1", "x2", "x3", "y1"]);
}

/// Jobs an idle host cannot run, oldest, do not hide one it can: it reads
/// on past them (up to eight pages of eight per job it may take).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_an_idle_host_cannot_run_do_not_hide_one_it_can() {
    let Some(db) = fresh().await else { return };
    let (a, b) = (db.clone().as_host("a"), db.clone().as_host("b"));
    let (lease_a, lease_b) = (super::PgHosts::new(a.clone(), "a"), super::PgHosts::new(b, "b"));
    lease_a.register(MINUTE).await.unwrap();
    lease_b.register(MINUTE).await.unwrap();
    let meta_a = super::PgMeta::new(a);
    for n in 0..30 {
        meta_a.submit(&job(&format!("theirs-{n:02}"), n, "tenant"), &serde_json::json!({}), None).await.unwrap();
    }
    meta_a.submit(&job("mine", 100, "x"), &serde_json::json!({}), None).await.unwrap();
    let here = Runnable { hashes: vec!["blake3:c0".into()], job: Arc::new(|job: &JobRecord| job.owner != "tenant"), wait: MINUTE };
    assert_eq!(take(&lease_b, 1, &here, Duration::ZERO).await, ["mine"], "past 30 it cannot run, pages of 8");
}

/// Turns: a busy host takes one job of each key queued elsewhere (the
/// oldest), never of a key it has queued itself nor a key's last job on its
/// host; one key's flood does not hide the others (the pages read skip the
/// keys seen), and a turn moves no job back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turns_take_one_job_of_each_key_queued_only_elsewhere() {
    let Some(db) = fresh().await else { return };
    let (a, b, c) = (db.clone().as_host("a"), db.clone().as_host("b"), db.clone().as_host("c"));
    let (lease_a, lease_b, lease_c) = (super::PgHosts::new(a.clone(), "a"), super::PgHosts::new(b, "b"), super::PgHosts::new(c, "c"));
    for lease in [&lease_a, &lease_b, &lease_c] {
        lease.register(MINUTE).await.unwrap();
    }
    let meta_a = super::PgMeta::new(a);
    // On a: a flood of key "flood", oldest; then two of "x", one of "y",
    // two of "w" (which b has queued itself), four of "v".
    for n in 0..30 {
        meta_a.submit(&job(&format!("flood-{n:02}"), n, "flood"), &serde_json::json!({}), None).await.unwrap();
    }
    let others = [
        ("x1", 100, "x"),
        ("x2", 101, "x"),
        ("y1", 102, "y"),
        ("w1", 103, "w"),
        ("w2", 104, "w"),
        ("v1", 105, "v"),
        ("v2", 106, "v"),
        ("v3", 107, "v"),
        ("v4", 108, "v"),
    ];
    for (id, created, owner) in others {
        meta_a.submit(&job(id, created, owner), &serde_json::json!({}), None).await.unwrap();
    }
    let here = Runnable { hashes: vec!["blake3:c0".into()], job: Arc::new(|_: &JobRecord| true), wait: MINUTE };
    let (on_b, flood) = (["w".to_string()], ["flood".to_string()]);
    // Pages of 8 per key wanted (24 rows) hold nothing but the flood: the
    // next page skips it.
    let mut took = take_for(&lease_b, TakeFor::Turns { keys: 3, queued_here: &on_b }, &here, Duration::ZERO).await;
    took.sort();
    assert_eq!(took, ["flood-00", "v1", "x1"], "one of each key with another in line on a, not w (queued on b) nor y1 (y's last on a)");
    let mut took = take_for(&lease_c, TakeFor::Turns { keys: 10, queued_here: &[] }, &here, Duration::ZERO).await;
    took.sort();
    assert_eq!(took, ["flood-01", "v2", "w1"], "x2 is x's last on a now, and x1 is b's last of x");
    assert!(take_for(&lease_a, TakeFor::Turns { keys: 10, queued_here: &flood }, &here, Duration::ZERO).await.is_empty(), "no turn moves a job back");
    assert_eq!(take_for(&lease_c, TakeFor::Turns { keys: 1, queued_here: &on_b }, &here, Duration::ZERO).await, ["flood-02"], "one turn (v3 could be another)");
    // Idle workers take the oldest jobs they read, wherever they wait, turns
    // taken by another host too (here with no wait; a host holds each job
    // 100 ms first): the flood's, sixteen rows read for two workers.
    assert_eq!(take(&lease_b, 2, &here, Duration::ZERO).await, ["flood-01", "flood-02"]);
}

/// Migration 0015 gives unfinished rows written without a scheduling key
/// theirs from their record — a deployment's `deployment/<id>`, else the
/// owner, also when PostgreSQL cannot read the record as `jsonb` (a
/// `\u0000` in a label) — and leaves finished rows alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migration_0015_gives_unfinished_rows_their_scheduling_key() {
    let Some(db) = fresh().await else { return };
    let label = serde_json::Map::from_iter([("note".to_string(), serde_json::json!("a\u{0}b"))]);
    let jobs = [
        JobRecord { deployment: Some("dep9".into()), ..job("of-deployment", 1, "x") },
        job("plain", 2, "x"),
        JobRecord { deployment: Some("dep9".into()), metadata: Some(label), ..job("unreadable", 3, "y") },
        JobRecord { status: JobStatus::Succeeded, ..job("finished", 4, "x") },
    ];
    let imported = jobs.into_iter().map(|job| super::ImportedJob { job, workflow: None }).collect();
    assert_eq!(super::PgMeta::new(db.clone()).import_jobs(imported).await.unwrap(), 4);
    // As rows from before the migration: no key, no index.
    sql(&db, "UPDATE jobs SET sched_key = NULL; DROP INDEX jobs_queued_by_key_and_holder").await;
    sql(&db, include_str!("migrations/0015_turns.sql")).await;
    let pool = sqlx::PgPool::connect_with((*db.pool.connect_options()).clone()).await.unwrap();
    let keys: Vec<(String, Option<String>)> = sqlx::query_as("SELECT id, sched_key FROM jobs ORDER BY id").fetch_all(&pool).await.unwrap();
    let keys: Vec<(&str, Option<&str>)> = keys.iter().map(|(id, key)| (id.as_str(), key.as_deref())).collect();
    assert_eq!(keys, [("finished", None), ("of-deployment", Some("deployment/dep9")), ("plain", Some("x")), ("unreadable", Some("y"))]);
}
