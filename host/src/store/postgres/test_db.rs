//! A fresh database for each test of the PostgreSQL stores, on the server
//! `KILN_TEST_DATABASE_URL` names (`.ci/run` starts one on loopback).
//! Without it the tests skip, except under CI, where they fail.

use super::PgDatabase;
use crate::store::MetaStore;

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
