//! The contract every [`AccountStore`] and [`SessionStore`] keeps, written
//! against the traits only: the embedded stores and the PostgreSQL ones
//! run the same cases (`sled/tests.rs`, `postgres/test_db.rs`).

use std::sync::Arc;

use super::{Account, AccountChange, AccountStore, CreditChange, SessionRecord, SessionStore};

fn account(id: &str, name: &str, credits: i64) -> Account {
    Account {
        id: id.into(),
        name: name.into(),
        key_hashes: vec![format!("{id}-key")],
        credits,
        tier: "default".into(),
        subscription_active: true,
        disabled: false,
        created_at: 7,
    }
}

/// Records round-trip; flags and balances change one step at a time; a
/// balance never leaves i64; concurrent changes through the same store are
/// all kept (none undoes another).
pub async fn accounts(store: Arc<dyn AccountStore>) {
    assert!(store.all().await.unwrap().is_empty());
    let a = account("acct_a", "alice", 10);
    store.create(&a).await.unwrap();
    store.create(&account("acct_b", "bob", 0)).await.unwrap();
    assert_eq!(store.get("acct_a").await.unwrap(), Some(a.clone()));
    assert_eq!(store.get("acct_none").await.unwrap(), None);
    assert_eq!(store.all().await.unwrap().len(), 2);

    let changed = store.change("acct_a", AccountChange::Subscription(false)).await.unwrap().unwrap();
    assert!(!changed.subscription_active && !changed.disabled && changed.credits == 10);
    assert!(store.change("acct_a", AccountChange::Disable).await.unwrap().unwrap().disabled);
    assert_eq!(store.change("acct_none", AccountChange::Disable).await.unwrap(), None);

    match store.add_credits("acct_a", -15, true).await.unwrap() {
        CreditChange::Changed(a) => assert_eq!((a.credits, a.disabled, a.subscription_active), (-5, true, false)),
        other => panic!("{other:?}"),
    }
    assert_eq!(store.add_credits("acct_none", 1, true).await.unwrap(), CreditChange::NoAccount);
    store.add_credits("acct_b", i64::MAX, true).await.unwrap();
    assert_eq!(store.add_credits("acct_b", 1, true).await.unwrap(), CreditChange::Overflow);
    assert_eq!(store.get("acct_b").await.unwrap().unwrap().credits, i64::MAX, "an overflow changes nothing");

    // 100 charges and 100 top-ups racing with flag writes: every one kept.
    store.create(&account("acct_c", "carol", 0)).await.unwrap();
    let mut tasks = Vec::new();
    for i in 0..200i64 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let delta = if i % 2 == 0 { -3 } else { 5 };
            store.add_credits("acct_c", delta, i % 3 == 0).await.unwrap();
            if i % 50 == 0 {
                store.change("acct_c", AccountChange::Subscription(i % 100 == 0)).await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(store.get("acct_c").await.unwrap().unwrap().credits, 100 * 5 - 100 * 3);
}

/// Sessions round-trip and end; an owner's are listed apart from the
/// expired ones of everyone.
pub async fn sessions(store: Arc<dyn SessionStore>) {
    let s = |owner: &str, created: i64, expires: i64| SessionRecord { owner: owner.into(), created_at: created, expires_at: expires };
    store.put("s1", &s("acct_a", 1, 1000)).await.unwrap();
    store.put("s2", &s("acct_a", 2, 1000)).await.unwrap();
    store.put("s3", &s("acct_b", 3, 1000)).await.unwrap();
    store.put("old", &s("acct_b", 0, 50)).await.unwrap();
    assert_eq!(store.get("s1").await.unwrap(), Some(s("acct_a", 1, 1000)));
    assert_eq!(store.get("nope").await.unwrap(), None);
    let (mut own, expired) = store.of_owner("acct_a", 100).await.unwrap();
    own.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(own.iter().map(|(id, _)| id.as_str()).collect::<Vec<_>>(), ["s1", "s2"]);
    assert_eq!(expired, ["old"]);
    store.delete(&["s1".into(), "old".into(), "unknown".into()]).await.unwrap();
    assert_eq!(store.get("s1").await.unwrap(), None);
    assert_eq!(store.get("old").await.unwrap(), None);
    assert!(store.get("s2").await.unwrap().is_some());
}
