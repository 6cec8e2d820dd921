//! A fresh database for each test of the PostgreSQL stores, on the server
//! `KILN_TEST_DATABASE_URL` names (`.ci/run` starts one on loopback).
//! Without it the tests skip, except under CI, where they fail.

use super::PgDatabase;
use crate::store::MetaStore;

/// Jobs that cost nothing: only a balance above zero is needed.
pub(super) const FREE: crate::accounts::Pricing = crate::accounts::Pricing { credits_per_second: 0, min_per_job: 0 };

/// An account `id` (named so) holding `credits`.
pub(super) fn account(id: &str, credits: i64) -> crate::store::Account {
    crate::store::Account {
        id: id.into(),
        name: id.into(),
        key_hashes: vec![],
        credits,
        tier: "default".into(),
        subscription_active: true,
        disabled: false,
        created_at: 1,
    }
}

/// A server bound no test reaches.
/// Waits (at most 10 s) until `notices` listens, so nothing sent after
/// this is missed.
pub(super) async fn listening(notices: &super::PgNotices, name: &str) {
    use crate::store::cluster::Notices;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while notices.listens() == 0 {
        assert!(std::time::Instant::now() < deadline, "{name} never listens");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// A job store for each of `names`, each a host registered for a minute.
pub(super) async fn registered_metas(db: &PgDatabase, names: &[&str]) -> Vec<std::sync::Arc<super::PgMeta>> {
    use crate::store::cluster::HostLeases;
    let mut metas = Vec::new();
    for name in names {
        let host = db.clone().as_host(name);
        super::PgHosts::new(host.clone(), name).register(std::time::Duration::from_secs(60)).await.unwrap();
        metas.push(std::sync::Arc::new(super::PgMeta::new(host)));
    }
    metas
}

pub(super) const OPEN: crate::store::ServerBound = crate::store::ServerBound { max_queued: 1_000_000, queued_here: 1 };

/// A new, empty database with kiln's schema; `None` (skipped) when no
/// server is configured outside CI.
pub async fn fresh() -> Option<PgDatabase> {
    let Ok(url) = std::env::var("KILN_TEST_DATABASE_URL") else {
        assert!(std::env::var_os("CI").is_none(), "CI must set KILN_TEST_DATABASE_URL (.ci/run starts PostgreSQL)");
        eprintln!("SKIPPED: KILN_TEST_DATABASE_URL is not set; .ci/run starts PostgreSQL");
        return None;
    };
    let name = format!("kiln_test_{}", uuid::Uuid::new_v4().simple());
    let admin = sqlx::PgPool::connect(&url).await.expect("the test server answers");
    sqlx::query(&format!("CREATE DATABASE {name}")).execute(&admin).await.expect("a test database");
    admin.close().await;
    let (base, _) = url.rsplit_once('/').expect("a database URL ends with /NAME");
    Some(PgDatabase::connect(&format!("{base}/{name}"), 4).await.expect("kiln's schema applies"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_keeps_the_account_store_contract() {
    let Some(db) = fresh().await else { return };
    crate::store::contract_accounts::accounts(std::sync::Arc::new(super::PgAccounts::new(db))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_keeps_the_session_store_contract() {
    let Some(db) = fresh().await else { return };
    crate::store::contract_accounts::sessions(std::sync::Arc::new(super::PgSessions::new(db))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_keeps_the_deployment_store_contract() {
    let Some(db) = fresh().await else { return };
    crate::store::deployments::tests::contract(&super::PgDeployments::new(db)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_keeps_the_user_file_store_contract() {
    let Some(db) = fresh().await else { return };
    let store = super::PgUserFiles::new(db);
    tokio::task::spawn_blocking(move || crate::store::user_files::tests::contract(&store)).await.unwrap();
}

/// The first host's file seeds the shared secret; later hosts (their own
/// files, or none) get that one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_secrets_are_seeded_by_the_first_host_and_shared() {
    let Some(db) = fresh().await else { return };
    let (first, second) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let old = crate::secret_file::load_or_create(first.path(), "accounts.key").unwrap();
    crate::secret_file::load_or_create(second.path(), "accounts.key").unwrap();
    assert_eq!(db.server_secret("accounts.key", first.path()).await.unwrap(), old, "the first host's secret is kept");
    assert_eq!(db.server_secret("accounts.key", second.path()).await.unwrap(), old, "and shared");
    let fresh_one = db.server_secret("signing.key", second.path().join("none").as_path()).await.unwrap();
    assert_ne!(fresh_one, old, "each name its own secret");
    assert_eq!(db.server_secret("signing.key", first.path()).await.unwrap(), fresh_one);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrations_apply_once_however_many_hosts_connect() {
    let Some(db) = fresh().await else { return };
    let all: Vec<i64> = (1..=super::MIGRATIONS.len() as i64).collect();
    assert_eq!(db.applied().await.unwrap(), all);
    // Four more hosts connecting at once to the same database.
    let name = db.pool.connect_options().get_database().unwrap().to_string();
    let base = std::env::var("KILN_TEST_DATABASE_URL").unwrap();
    let url = format!("{}/{name}", base.rsplit_once('/').unwrap().0);
    let hosts = (0..4).map(|_| PgDatabase::connect(&url, 4));
    for host in futures_util::future::join_all(hosts).await {
        assert_eq!(host.unwrap().applied().await.unwrap(), all);
    }
}

/// Every case of the `MetaStore` contract, each on a new database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_keeps_the_meta_store_contract() {
    if fresh().await.is_none() {
        return;
    }
    crate::store::contract::run_all(|| async {
        let db = fresh().await.expect("the test server answers");
        std::sync::Arc::new(super::PgMeta::new(db)) as std::sync::Arc<dyn crate::store::MetaStore>
    })
    .await;
}

/// A call awaited off any runtime (`store::wait` on a job's thread) runs
/// on the pool's runtime and answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_from_a_thread_outside_the_runtime_answer() {
    let Some(db) = fresh().await else { return };
    let meta = std::sync::Arc::new(super::PgMeta::new(db));
    let job = crate::store::JobRecord::queued_for_test("t1", 5, 3);
    meta.submit(&job, &serde_json::json!({}), None).await.unwrap();
    let m = meta.clone();
    let (seq, page) = std::thread::spawn(move || {
        let seq = crate::store::wait(m.max_seq()).unwrap();
        let page = crate::store::wait(m.list_jobs(None, None, 10, 100, &|_| true)).unwrap();
        (seq, page.jobs.len())
    })
    .join()
    .unwrap();
    assert_eq!((seq, page), (3, 1));
}

/// The retention sweep's lease goes to one host of a database at a time,
/// and to another once it is dropped; other names are other leases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_periodic_lease_is_held_by_one_host_at_a_time() {
    let Some(db) = fresh().await else { return };
    let name = db.pool.connect_options().get_database().unwrap().to_string();
    let base = std::env::var("KILN_TEST_DATABASE_URL").unwrap();
    let other = PgDatabase::connect(&format!("{}/{name}", base.rsplit_once('/').unwrap().0), 4).await.unwrap();
    let (one, two) = (super::PgMeta::new(db), super::PgMeta::new(other));
    let held = one.periodic_lease("retention sweep").await.unwrap().expect("the first host takes it");
    assert!(two.periodic_lease("retention sweep").await.unwrap().is_none(), "the second host waits");
    assert!(two.periodic_lease("another job").await.unwrap().is_some(), "another name is another lease");
    drop(held);
    let mut taken = None;
    for _ in 0..100 {
        taken = two.periodic_lease("retention sweep").await.unwrap();
        if taken.is_some() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(taken.is_some(), "released when dropped");
    assert!(one.periodic_lease("retention sweep").await.unwrap().is_none(), "now held by the second");
}

/// Two hosts on one database: a live host's jobs are its own; once its
/// lease lapses another takes them (once), and the lapsed host's renewal
/// and late writes are refused. Cancel requests reach the holder; a
/// finished job is held by none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapsed_host_is_fenced_and_its_jobs_taken_over_once() {
    use std::time::Duration;

    use crate::store::cluster::HostLeases;
    use crate::store::{JobStatus, StoreError};
    let Some(db) = fresh().await else { return };
    let (a, b, c, d) = (db.clone().as_host("a"), db.clone().as_host("b"), db.clone().as_host("c"), db.as_host("d"));
    let (lease_a, lease_b, lease_c) = (super::PgHosts::new(a.clone(), "a"), super::PgHosts::new(b.clone(), "b"), super::PgHosts::new(c.clone(), "c"));
    let (meta_a, meta_b, meta_c) = (super::PgMeta::new(a), super::PgMeta::new(b), super::PgMeta::new(c));
    let minute = Duration::from_secs(60);
    let any = crate::store::cluster::Runnable { hashes: Vec::new(), job: std::sync::Arc::new(|_| true), wait: minute };
    for lease in [&lease_a, &lease_b, &lease_c] {
        lease.register(minute).await.unwrap();
    }
    assert!(lease_a.holder().starts_with("a/") && lease_a.holder() != lease_b.holder());
    let jobs: Vec<_> = (1..=3).map(|n| crate::store::JobRecord::queued_for_test(&format!("j{n}"), 5, n)).collect();
    for job in &jobs {
        meta_a.submit(job, &serde_json::json!({}), None).await.unwrap();
    }
    assert!(lease_b.adopt(10, &any).await.unwrap().jobs.is_empty(), "a live host's jobs stay its own");
    let mut running = jobs[0].clone();
    running.transition(JobStatus::Running, 10).unwrap();
    assert!(matches!(meta_b.put_job(&running).await, Err(StoreError::Fenced(_))), "another host cannot write a held job");
    meta_a.put_job(&running).await.unwrap();

    // A's lease lapses (renewed to end now): B and C look at once and
    // take disjoint shares of its jobs, together all of them.
    lease_a.renew(Duration::ZERO).await.unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
    let (by_b, by_c) = tokio::join!(lease_b.adopt(2, &any), lease_c.adopt(10, &any));
    let (by_b, by_c) = (by_b.unwrap().jobs, by_c.unwrap().jobs);
    let mut taken: Vec<String> = by_b.iter().chain(&by_c).map(|j| j.id.clone()).collect();
    taken.sort();
    assert_eq!(taken, ["j1", "j2", "j3"], "each job taken once: {by_b:?} {by_c:?}");
    assert!(lease_b.adopt(10, &any).await.unwrap().jobs.is_empty() && lease_c.adopt(10, &any).await.unwrap().jobs.is_empty());
    assert_eq!(by_b.iter().chain(&by_c).find(|j| j.id == "j1").unwrap().status, JobStatus::Running, "as A last wrote it");
    assert!(matches!(lease_a.renew(minute).await, Err(StoreError::Fenced(_))), "the lapsed host learns it");
    let mut late = running.clone();
    late.transition(JobStatus::Succeeded, 20).unwrap();
    assert!(matches!(meta_a.put_job(&late).await, Err(StoreError::Fenced(_))), "its late write is refused");
    let asset = crate::store::contract::asset("late-upload", None, "blake3:00", None, &[]);
    assert!(matches!(meta_a.put_asset(&asset).await, Err(StoreError::Fenced(_))), "and so is its late upload's record");
    meta_b.put_asset(&asset).await.unwrap();

    // A cancel request (from A, no longer a holder) reaches the job's
    // holder, durably.
    let (holder, other, meta, mut held) = match by_b.first() {
        Some(job) => (&lease_b, &lease_c, &meta_b, job.clone()),
        None => (&lease_c, &lease_b, &meta_c, by_c[0].clone()),
    };
    assert!(lease_a.request_cancel(&held.id).await.unwrap());
    assert_eq!(holder.cancel_requests().await.unwrap(), vec![held.id.clone()]);
    assert!(other.cancel_requests().await.unwrap().is_empty());
    // Finished, it is held by none: no cancel to ask; a registered host may
    // write it (the sweep expires it), only as finished, and the lapsed
    // host not at all.
    if held.status == JobStatus::Queued {
        held.transition(JobStatus::Running, 30).unwrap();
    }
    held.transition(JobStatus::Canceled, 40).unwrap();
    meta.put_job(&held).await.unwrap();
    assert!(!lease_a.request_cancel(&held.id).await.unwrap());
    assert!(holder.cancel_requests().await.unwrap().is_empty());
    held.expires_at = 50;
    assert!(matches!(meta_a.put_job(&held).await, Err(StoreError::Fenced(_))), "the lapsed host cannot replace a finished record");
    let mut revived = held.clone();
    revived.status = JobStatus::Running;
    let others_meta = if std::ptr::eq(meta, &meta_b) { &meta_c } else { &meta_b };
    assert!(matches!(others_meta.put_job(&revived).await, Err(StoreError::Fenced(_))), "nor anyone make it unfinished again");
    others_meta.put_job(&held).await.unwrap();
    // A clean stop hands the jobs over at once.
    let left: usize = [&by_b, &by_c].iter().map(|jobs| jobs.len()).sum::<usize>() - 1;
    holder.release().await.unwrap();
    other.release().await.unwrap();
    let lease_d = super::PgHosts::new(d, "d");
    lease_d.register(minute).await.unwrap();
    assert_eq!(lease_d.adopt(10, &any).await.unwrap().jobs.len(), left, "the unfinished jobs of the stopped hosts go to the next one");
}

/// A host takes over only the jobs whose components it has (the store's
/// filter by hash, then the host's own answer for each job's owner), two
/// at a time here, so the looks page; the others wait, counted, for a host
/// that has them. A bundle deployment's job needs none (its bundle pins
/// them); a job asked to be canceled or past its expiry is taken whatever
/// it needs (to be ended, not run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_takes_over_only_the_jobs_whose_components_it_has() {
    use std::sync::Arc;
    use std::time::Duration;

    use crate::store::JobRecord;
    use crate::store::cluster::{HostLeases, Runnable};
    let Some(db) = fresh().await else { return };
    let (a, b) = (db.clone().as_host("a"), db.as_host("b"));
    let (lease_a, lease_b, meta_a) = (super::PgHosts::new(a.clone(), "a"), super::PgHosts::new(b, "b"), super::PgMeta::new(a));
    lease_a.register(Duration::from_secs(60)).await.unwrap();
    lease_b.register(Duration::from_secs(60)).await.unwrap();
    let jobs = [
        needing("v1", 1, "local", &[("posterize", "blake3:01"), ("core", "blake3:c0")]),
        needing("v2", 2, "local", &[("posterize", "blake3:02")]),
        // The same seq as v2: the pages go by (seq, id).
        needing("plain", 2, "local", &[]),
        needing("theirs", 3, "tenant", &[("mine", "blake3:0a")]),
        JobRecord { deployment: Some("d1".into()), bundle: Some("blake3:b1".into()), ..needing("bundled", 4, "local", &[("posterize", "blake3:09")]) },
        JobRecord { deployment: Some("d2".into()), ..needing("from-dirs", 5, "local", &[("posterize", "blake3:09")]) },
        needing("to-cancel", 6, "local", &[("gone", "blake3:ff")]),
        JobRecord { expires_at: 0, ..needing("expired", 7, "local", &[("gone", "blake3:ff")]) },
    ];
    for job in &jobs {
        meta_a.submit(job, &serde_json::json!({}), None).await.unwrap();
    }
    assert!(lease_a.request_cancel("to-cancel").await.unwrap());
    lease_a.renew(Duration::ZERO).await.unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
    // B has posterize v2 and core; `blake3:0a` too, but as another
    // account's plugin, not `tenant`'s; it does not serve d2.
    let here = Runnable {
        hashes: ["blake3:02", "blake3:c0", "blake3:0a"].map(String::from).to_vec(),
        job: Arc::new(|job: &JobRecord| job.owner != "tenant" && (job.deployment.is_none() || job.bundle.is_some())),
        wait: Duration::from_secs(60),
    };
    let mut ends = std::collections::HashMap::new();
    let (taken, left) = take_all_into(&lease_b, &here, &mut ends).await;
    assert_eq!(taken, ["bundled", "expired", "plain", "to-cancel", "v2"]);
    let ended = |id: &str| ends.get(id).copied();
    use crate::store::JobStatus;
    assert_eq!((ended("to-cancel"), ended("expired"), ended("v2")), (Some(JobStatus::Canceled), Some(JobStatus::Expired), None), "taken to be ended so");
    assert_eq!(left, 3, "v1 (another posterize), the tenant's job and d2's wait");
    // A host with posterize v1 takes v1, and only it.
    let with_v1 = Runnable { hashes: vec!["blake3:01".into(), "blake3:c0".into()], job: Arc::new(|_: &JobRecord| true), wait: Duration::from_secs(60) };
    let (taken, left) = take_all(&lease_b, &with_v1).await;
    assert_eq!((taken, left), (vec!["v1".to_string()], 2), "the tenant's job and d2's still wait");
}

/// A restarted host takes back its own earlier start's jobs whatever they
/// need (re-validated, as one host alone after an upgrade); a job no host
/// has the components of is taken by any once it has waited `wait`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_host_takes_its_own_jobs_back_and_none_waits_forever() {
    use std::sync::Arc;
    use std::time::Duration;

    use crate::store::JobRecord;
    use crate::store::cluster::{HostLeases, Runnable};
    let Some(db) = fresh().await else { return };
    let minute = Duration::from_secs(60);
    let a = db.clone().as_host("a");
    let first = super::PgHosts::new(a.clone(), "a");
    first.register(minute).await.unwrap();
    let meta_a = super::PgMeta::new(a);
    meta_a.submit(&needing("old-build", 1, "local", &[("core", "blake3:0ld")]), &serde_json::json!({}), None).await.unwrap();
    let lacking = |wait| Runnable { hashes: vec!["blake3:new".into()], job: Arc::new(|_: &JobRecord| true), wait };
    let b = super::PgHosts::new(db.clone().as_host("b"), "b");
    b.register(minute).await.unwrap();
    // `a` starts again (an upgrade): its new start takes the job back.
    let again = super::PgHosts::new(db.clone().as_host("a"), "a");
    again.register(minute).await.unwrap();
    assert_eq!(take_all(&b, &lacking(minute)).await, (Vec::new(), 1), "not b's");
    assert_eq!(take_all(&again, &lacking(minute)).await.0, ["old-build"]);

    // A job copied in by `kiln migrate`, held by none: it waits for a host
    // with its components like any other.
    let copied = super::ImportedJob { job: needing("copied", 3, "local", &[("core", "blake3:0ld")]), workflow: None };
    assert_eq!(super::PgMeta::new(db.clone()).import_jobs(vec![copied]).await.unwrap(), 1);
    assert_eq!(take_all(&b, &lacking(minute)).await, (Vec::new(), 1), "b lacks its components");
    let having = Runnable { hashes: vec!["blake3:0ld".into()], job: Arc::new(|_: &JobRecord| true), wait: minute };
    assert_eq!(take_all(&b, &having).await, (vec!["copied".to_string()], 0));

    // A host that is gone for good: its job waits, then goes to b anyway.
    let c_db = db.as_host("c");
    let c = super::PgHosts::new(c_db.clone(), "c");
    c.register(minute).await.unwrap();
    super::PgMeta::new(c_db).submit(&needing("orphan", 2, "local", &[("core", "blake3:0ld")]), &serde_json::json!({}), None).await.unwrap();
    c.release().await.unwrap();
    let wait = Duration::from_millis(300);
    assert_eq!(take_all(&b, &lacking(wait)).await, (Vec::new(), 1), "it waits first");
    tokio::time::sleep(wait * 2).await;
    assert_eq!(take_all(&b, &lacking(wait)).await, (vec!["orphan".to_string()], 0));
}

/// A queued job of `owner` validated against `components`.
pub(super) fn needing(id: &str, seq: u64, owner: &str, components: &[(&str, &str)]) -> crate::store::JobRecord {
    let mut job = crate::store::JobRecord::queued_for_test(id, 5, seq);
    job.expires_at = i64::MAX / 2;
    job.owner = owner.into();
    job.components = components.iter().map(|(p, h)| (p.to_string(), h.to_string())).collect();
    job
}

/// Looks until nothing more is taken, two jobs at a time: the ids taken
/// (sorted) and the count left at the last look.
async fn take_all(lease: &super::PgHosts, here: &crate::store::cluster::Runnable) -> (Vec<String>, usize) {
    take_all_into(lease, here, &mut std::collections::HashMap::new()).await
}

/// [`take_all`], gathering how the jobs taken are to be ended into `ends`.
async fn take_all_into(
    lease: &super::PgHosts,
    here: &crate::store::cluster::Runnable,
    ends: &mut std::collections::HashMap<String, crate::store::JobStatus>,
) -> (Vec<String>, usize) {
    use crate::store::cluster::HostLeases;
    let mut taken = Vec::new();
    loop {
        let look = lease.adopt(2, here).await.unwrap();
        if look.jobs.is_empty() {
            taken.sort();
            return (taken, look.left);
        }
        ends.extend(look.ends);
        taken.extend(look.jobs.into_iter().map(|j| j.id));
    }
}

/// Notices reach the other hosts on their topic, never the sender.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notices_reach_the_other_hosts_on_their_topic() {
    use crate::store::cluster::{Notices, Topic};
    let Some(db) = fresh().await else { return };
    let (a, b) = (super::PgNotices::start(&db.clone().as_host("a")).unwrap(), super::PgNotices::start(&db.as_host("b")).unwrap());
    let (mut a_hears, mut b_events, mut b_control) = (a.subscribe(Topic::Events), b.subscribe(Topic::Events), b.subscribe(Topic::Control));
    // The listeners connect in the background: send until one arrives.
    let heard = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        loop {
            a.send(Topic::Events, "hello".into());
            if let Ok(Ok(got)) = tokio::time::timeout(std::time::Duration::from_millis(200), b_events.recv()).await {
                return got;
            }
        }
    })
    .await
    .expect("a notice arrives");
    assert_eq!(&*heard, "hello");
    // Each started listening once; a start counts as a gap (what was sent
    // before it was missed), counted once listening.
    listening(&a, "a").await;
    assert_eq!((a.listens(), b.listens(), a.gaps(), b.gaps()), (1, 1, 1, 1));
    // Over NOTIFY's size, through the store; over the largest, not sent.
    let large = "x".repeat(crate::store::cluster::MAX_NOTICE + 1);
    a.send(Topic::Events, large.clone());
    a.send(Topic::Events, "y".repeat(crate::store::cluster::MAX_LARGE_NOTICE + 1));
    a.send(Topic::Control, "to b".into());
    let control = tokio::time::timeout(std::time::Duration::from_secs(5), b_control.recv()).await.unwrap().unwrap();
    assert_eq!(&*control, "to b", "on its own topic");
    let heard = tokio::time::timeout(std::time::Duration::from_secs(5), async {
        loop {
            let next = b_events.recv().await.unwrap();
            if &*next != "hello" {
                return next;
            }
        }
    })
    .await
    .unwrap();
    assert_eq!(*heard, *large, "a large notice arrives whole");
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    while let Ok(more) = b_events.try_recv() {
        assert_eq!(&*more, "hello", "the oversized notice was not sent");
    }
    assert!(a_hears.try_recv().is_err(), "a host does not hear itself");
    assert_eq!((a.gaps(), b.gaps()), (2, 1), "the notice not sent counts as one missed, on the sender's side");
    assert_eq!((a.listens(), b.listens()), (1, 1), "and is no lost connection");
}

/// Notices keep their order whatever their size (a large one is not
/// overtaken by small ones sent after it), and a notice to one host reaches
/// that host alone, uncounted when it cannot be sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notices_keep_their_order_and_reach_one_host_when_addressed() {
    use crate::store::cluster::{Notices, Topic};
    use std::time::Duration;
    let Some(db) = fresh().await else { return };
    let start = |name: &str| super::PgNotices::start(&db.clone().as_host(name)).unwrap();
    let (a, b, c) = (start("a"), start("b"), start("c"));
    let (mut b_events, mut b_direct, mut c_direct) = (b.subscribe(Topic::Events), b.subscribe_direct(), c.subscribe_direct());
    let ready = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            a.send(Topic::Events, "ready".into());
            if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_millis(200), b_events.recv()).await {
                return;
            }
        }
    });
    ready.await.expect("b listens");
    listening(&c, "c").await;
    let large = "L".repeat(crate::store::cluster::MAX_NOTICE * 2);
    for payload in ["first".to_string(), large.clone(), "last".to_string()] {
        a.send(Topic::Events, payload);
    }
    let mut heard = Vec::new();
    while heard.len() < 3 {
        let next = tokio::time::timeout(Duration::from_secs(5), b_events.recv()).await.expect("three notices").unwrap();
        if &*next != "ready" {
            heard.push(next);
        }
    }
    assert_eq!([&*heard[0], &*heard[1], &*heard[2]], ["first", large.as_str(), "last"], "in the order sent");

    let gaps = a.gaps();
    a.send_to(b.address(), "just b".into());
    a.send_to(b.address(), large.clone());
    a.send_to(b.address(), "y".repeat(crate::store::cluster::MAX_LARGE_NOTICE + 1));
    let first = tokio::time::timeout(Duration::from_secs(5), b_direct.recv()).await.expect("b hears").unwrap();
    let second = tokio::time::timeout(Duration::from_secs(5), b_direct.recv()).await.expect("b hears").unwrap();
    assert_eq!((&*first, &*second), ("just b", large.as_str()));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(b_direct.try_recv().is_err(), "the oversized one was not sent");
    assert!(c_direct.try_recv().is_err(), "another host hears nothing addressed to b");
    assert_eq!(a.gaps(), gaps, "nor is it counted as a missed notice");
}

/// Admissions racing on three hosts take exactly the free places of a key
/// (each host counting its own waiting jobs, as its queue does); an account
/// without credits, or disabled, is refused and nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_holds_across_hosts_and_writes_nothing_refused() {
    use crate::store::{AccountChange, AccountStore, Admission, Billing, KeyBound, Refusal, StoreError};
    let Some(db) = fresh().await else { return };
    let accounts = super::PgAccounts::new(db.clone());
    let billed = |account| Some(Billing { account, pricing: FREE });
    accounts.create(&account("rich", 100)).await.unwrap();
    accounts.create(&account("broke", 0)).await.unwrap();
    let metas = registered_metas(&db, &["a", "b", "c"]).await;
    let racing = metas.iter().enumerate().map(|(h, meta)| {
        let meta = meta.clone();
        async move {
            let mut taken = Vec::new();
            for n in 0..4u64 {
                let job = crate::store::JobRecord::queued_for_test(&format!("j{h}-{n}"), 10 + n as i64, n + 1);
                let admission = Admission { billed: billed("rich"), key: Some(KeyBound { key: "rich", max_queued: 5, waiting_here: &taken }), server: OPEN };
                match meta.submit_admitted(&job, &serde_json::json!({}), None, admission).await {
                    Ok(()) => taken.push(job.id),
                    Err(StoreError::Refused(Refusal::QueueFull)) => {}
                    Err(e) => panic!("{e}"),
                }
            }
            taken
        }
    });
    let per_host: Vec<Vec<String>> = futures_util::future::join_all(racing).await;
    assert_eq!(per_host.iter().map(Vec::len).sum::<usize>(), 5, "{per_host:?}");
    // A job its host has started waits no more, whatever its row says yet:
    // with one of them started, one more place is free.
    let (h, mine) = per_host.iter().enumerate().find(|(_, taken)| !taken.is_empty()).unwrap();
    let job = crate::store::JobRecord::queued_for_test("one-more", 50, 50);
    let bound = KeyBound { key: "rich", max_queued: 5, waiting_here: mine };
    let full = Admission { billed: billed("rich"), key: Some(bound), server: OPEN };
    assert!(matches!(metas[h].submit_admitted(&job, &serde_json::json!({}), None, full).await, Err(StoreError::Refused(Refusal::QueueFull))));
    let one_started = Admission { key: Some(KeyBound { waiting_here: &mine[1..], ..bound }), ..full };
    metas[h].submit_admitted(&job, &serde_json::json!({}), None, one_started).await.unwrap();
    // Another key has its own places; the account's state is read as committed.
    let ma = metas[0].clone();
    let admit = |id: &str, billed: &'static str| {
        let (meta, job) = (ma.clone(), crate::store::JobRecord::queued_for_test(id, 99, 99));
        async move {
            let bound = KeyBound { key: billed, max_queued: 5, waiting_here: &[] };
            meta.submit_admitted(
                &job,
                &serde_json::json!({}),
                None,
                Admission { billed: Some(Billing { account: billed, pricing: FREE }), key: Some(bound), server: OPEN },
            )
            .await
        }
    };
    assert!(matches!(admit("k1", "broke").await, Err(StoreError::Refused(Refusal::NoFunds))));
    accounts.add_credits("broke", 1, true).await.unwrap();
    admit("k2", "broke").await.unwrap();
    accounts.change("broke", AccountChange::Disable).await.unwrap();
    assert!(matches!(admit("k3", "broke").await, Err(StoreError::Refused(Refusal::AccountDisabled))));
    assert!(matches!(admit("k4", "nobody").await, Err(StoreError::Refused(Refusal::NoFunds))));
    for refused in ["k1", "k3", "k4"] {
        assert!(ma.get_job(refused).await.unwrap().is_none(), "{refused} was not written");
    }
    assert!(ma.get_job("k2").await.unwrap().is_some());
}

/// Starts racing on three hosts take exactly the key's free running places
/// (the refused ones stay queued); a finished or canceling job's place is
/// counted by its row; a freed place goes to the oldest refused job, on
/// whichever host; other keys have their own places.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keys_running_limit_holds_across_hosts() {
    use crate::store::cluster::HostLeases;
    use crate::store::{Admission, JobStatus, KeyBound, Refusal, StoreError};
    let Some(db) = fresh().await else { return };
    let mut metas = Vec::new();
    for name in ["a", "b", "c"] {
        let host = db.clone().as_host(name);
        super::PgHosts::new(host.clone(), name).register(std::time::Duration::from_secs(60)).await.unwrap();
        metas.push(std::sync::Arc::new(super::PgMeta::new(host)));
    }
    // Six queued jobs of key "k" on each host, written with their key.
    let mut queued = Vec::new();
    for (h, meta) in metas.iter().enumerate() {
        for n in 0..6u64 {
            let job = crate::store::JobRecord::queued_for_test(&format!("r{h}-{n}"), 10 + n as i64, 10 * h as u64 + n + 1);
            let admission = Admission { billed: None, key: Some(KeyBound { key: "k", max_queued: 100, waiting_here: &[] }), server: OPEN };
            meta.submit_admitted(&job, &serde_json::json!({}), None, admission).await.unwrap();
            queued.push((h, job));
        }
    }
    let start = |h: usize, mut job: crate::store::JobRecord, key: &'static str| {
        let meta = metas[h].clone();
        async move {
            job.transition(JobStatus::Running, 100).unwrap();
            let started = meta.start_admitted(&job, key, 2).await;
            (job, started)
        }
    };
    let answers = futures_util::future::join_all(queued.iter().cloned().map(|(h, job)| start(h, job, "k"))).await;
    let mut started = Vec::new();
    for (job, answer) in answers {
        match answer {
            Ok(()) => started.push(job),
            Err(StoreError::Refused(Refusal::RunningFull)) => {
                let row = metas[0].get_job(&job.id).await.unwrap().unwrap();
                assert_eq!(row.status, JobStatus::Queued, "a refused start writes nothing");
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(started.len(), 2, "two of eighteen starts on three hosts: {:?}", started.iter().map(|j| &j.id).collect::<Vec<_>>());
    let host = started[0].id.as_bytes()[1] - b'0';
    // Canceling still runs; a finished job frees its place.
    let mut canceling = started[0].clone();
    canceling.transition(JobStatus::Canceling, 200).unwrap();
    metas[usize::from(host)].put_job(&canceling).await.unwrap();
    let waiting: Vec<(usize, crate::store::JobRecord)> = queued.iter().filter(|(_, j)| !started.iter().any(|s| s.id == j.id)).cloned().collect();
    let (_, next) = start(waiting[0].0, waiting[0].1.clone(), "k").await;
    assert!(matches!(next, Err(StoreError::Refused(Refusal::RunningFull))), "{next:?}");
    let mut finished = canceling;
    finished.transition(JobStatus::Canceled, 300).unwrap();
    metas[usize::from(host)].put_job(&finished).await.unwrap();
    // A place is free: the refused starts go first, oldest first, on
    // whichever host (a newer job elsewhere waits for them).
    let mut order = waiting.clone();
    order.sort_by_key(|(_, j)| (j.created_at, j.id.clone()));
    let oldest = order[0].clone();
    let newer = order.iter().rev().find(|(h, _)| *h != oldest.0).unwrap().clone();
    let (_, next) = start(newer.0, newer.1.clone(), "k").await;
    assert!(matches!(next, Err(StoreError::Refused(Refusal::RunningFull))), "a newer job on another host waits: {next:?}");
    let (_, next) = start(oldest.0, oldest.1.clone(), "k").await;
    next.unwrap();
    // Another key's jobs have places of their own.
    let other = crate::store::JobRecord::queued_for_test("other", 5, 1000);
    let bound = KeyBound { key: "other", max_queued: 5, waiting_here: &[] };
    metas[1].submit_admitted(&other, &serde_json::json!({}), None, Admission { billed: None, key: Some(bound), server: OPEN }).await.unwrap();
    let (_, answer) = start(1, other, "other").await;
    answer.unwrap();
}

/// The server's queue bound counts the jobs waiting on the other hosts
/// (as committed) and the admitting host's own count; a refusal writes
/// nothing; a started or finished job waits no more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_servers_queue_bound_counts_every_hosts_waiting_jobs() {
    use crate::store::cluster::HostLeases;
    use crate::store::{Admission, JobStatus, Refusal, ServerBound, StoreError};
    let Some(db) = fresh().await else { return };
    let mut metas = Vec::new();
    for name in ["a", "b"] {
        let host = db.clone().as_host(name);
        super::PgHosts::new(host.clone(), name).register(std::time::Duration::from_secs(60)).await.unwrap();
        metas.push(super::PgMeta::new(host));
    }
    let admit = |queued_here: usize| Admission { billed: None, key: None, server: ServerBound { max_queued: 4, queued_here } };
    let job = |id: &str, seq: u64| crate::store::JobRecord::queued_for_test(id, 10, seq);
    // Three waiting on a; b (which holds none yet) takes the fourth place.
    for n in 0..3u64 {
        metas[0].submit_admitted(&job(&format!("a{n}"), n + 1), &serde_json::json!({}), None, admit(1 + n as usize)).await.unwrap();
    }
    metas[1].submit_admitted(&job("b0", 10), &serde_json::json!({}), None, admit(1)).await.unwrap();
    let refused = metas[1].submit_admitted(&job("b1", 11), &serde_json::json!({}), None, admit(2)).await;
    assert!(matches!(refused, Err(StoreError::Refused(Refusal::ServerQueueFull))), "{refused:?}");
    assert!(metas[1].get_job("b1").await.unwrap().is_none(), "a refusal writes nothing");
    // One of a's jobs started (and one finished): two places are free.
    let mut started = job("a0", 1);
    started.transition(JobStatus::Running, 20).unwrap();
    metas[0].put_job(&started).await.unwrap();
    metas[1].submit_admitted(&job("b1", 11), &serde_json::json!({}), None, admit(2)).await.unwrap();
    let refused = metas[1].submit_admitted(&job("b2", 12), &serde_json::json!({}), None, admit(3)).await;
    assert!(matches!(refused, Err(StoreError::Refused(Refusal::ServerQueueFull))), "{refused:?}");
}
