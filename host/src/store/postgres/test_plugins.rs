//! The plugins hosts share ([`super::PgPlugins`]) on a real PostgreSQL:
//! a scope's limit holds against installs through several hosts at once,
//! a component's bytes are kept while a plugin names them, and each change
//! is announced with its scope.

use std::sync::Arc;
use std::time::Duration;

use super::test_db::fresh;
use crate::store::cluster::{Notices, OPERATOR_SCOPE, Publish, Published, SharedPlugin, SharedPlugins, Topic};

/// An install (replacing), with `limit`.
fn install(limit: Option<usize>) -> Publish {
    Publish { limit, replace: true }
}

fn plugin(scope: &str, name: &str, component: &[u8]) -> SharedPlugin {
    SharedPlugin { scope: scope.into(), name: name.into(), manifest: format!("name = \"{name}\""), component: blake3::hash(component).to_hex().to_string() }
}

async fn components(db: &super::PgDatabase) -> i64 {
    let pool = sqlx::PgPool::connect_with((*db.pool.connect_options()).clone()).await.unwrap();
    let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM plugin_components").fetch_one(&pool).await.unwrap();
    pool.close().await;
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_plugins_keep_their_limit_and_their_bytes() {
    let Some(db) = fresh().await else { return };
    let (a, b) = (Arc::new(super::PgPlugins::new(db.clone().as_host("a"))), Arc::new(super::PgPlugins::new(db.clone().as_host("b"))));
    let listener = super::PgNotices::start(&db.clone().as_host("b")).unwrap();
    let mut heard = listener.subscribe(Topic::Plugins);
    super::test_db::listening(&listener, "b").await;

    // The operator's, announced with its scope; bytes that do not hash to
    // the record's component are refused.
    let one = plugin(OPERATOR_SCOPE, "one", b"component 1");
    assert_eq!(a.publish(&one, b"component 1", install(None)).await.unwrap(), Published::Done);
    let notice = tokio::time::timeout(Duration::from_secs(10), heard.recv()).await.expect("announced").unwrap();
    assert_eq!(&*notice, OPERATOR_SCOPE);
    assert!(a.publish(&plugin(OPERATOR_SCOPE, "two", b"x"), b"y", install(None)).await.is_err());

    // Twelve installs of one account's plugins through two hosts at once,
    // its limit three: three are kept.
    let installs = (0..12).map(|n| {
        let host = if n % 2 == 0 { a.clone() } else { b.clone() };
        tokio::spawn(async move { host.publish(&plugin("acct", &format!("p{n}"), b"component 1"), b"component 1", install(Some(3))).await.unwrap() })
    });
    let done = futures_util::future::join_all(installs).await.into_iter().filter(|p| *p.as_ref().unwrap() == Published::Done).count();
    assert_eq!(done, 3);
    let kept = b.plugins(Some(vec!["acct".into()])).await.unwrap();
    assert_eq!(kept.len(), 3);
    // Replacing one of them is within the limit; a fourth is not.
    let replaced = plugin("acct", &kept[0].name, b"component 2");
    assert_eq!(b.publish(&replaced, b"component 2", install(Some(3))).await.unwrap(), Published::Done);
    assert_eq!(b.publish(&plugin("acct", "p99", b"component 2"), b"component 2", install(Some(3))).await.unwrap(), Published::Full);
    assert_eq!(b.plugins(Some(vec!["acct".into()])).await.unwrap().iter().find(|p| p.name == replaced.name), Some(&replaced));
    // A copy of a plugin kept elsewhere never replaces the store's.
    let copy = plugin("acct", &replaced.name, b"component 3");
    assert_eq!(a.publish(&copy, b"component 3", Publish { limit: None, replace: false }).await.unwrap(), Published::Present);
    assert_eq!(b.plugins(Some(vec!["acct".into()])).await.unwrap().iter().find(|p| p.name == replaced.name), Some(&replaced), "kept");
    assert_eq!(a.plugins(None).await.unwrap().len(), 4, "every scope's");

    // Bytes are shared by hash and kept while a plugin names them.
    assert_eq!(components(&db).await, 2);
    assert_eq!(a.component(&one.component).await.unwrap().as_deref(), Some(&b"component 1"[..]));
    assert!(a.withdraw(OPERATOR_SCOPE, "one").await.unwrap());
    assert!(!a.withdraw(OPERATOR_SCOPE, "one").await.unwrap(), "gone already");
    assert_eq!(components(&db).await, 2, "the account's plugins still name component 1");
    assert!(b.withdraw("acct", &replaced.name).await.unwrap());
    assert_eq!(components(&db).await, 1, "no plugin names component 2");
    assert_eq!(a.component(&replaced.component).await.unwrap(), None);
    for p in b.plugins(Some(vec!["acct".into()])).await.unwrap() {
        assert!(a.withdraw("acct", &p.name).await.unwrap());
    }
    assert_eq!(components(&db).await, 0);
    assert!(a.plugins(None).await.unwrap().is_empty());
}
