//! Credits across hosts on the server `KILN_TEST_DATABASE_URL` names: the
//! balance an admission holds against (every unfinished job billed to the
//! account holds its minimum price) and the charge made with a job's end.

use super::test_db::{FREE, OPEN, account, fresh, listening, registered_metas};
use crate::store::MetaStore;

/// Submissions billed to one account racing on three hosts (each under its
/// own scheduling key, as a deployment's demo jobs are) are admitted only
/// while the balance covers the minimum price of every unfinished job
/// billed to it; a job that ends gives its hold back, one billed to
/// another account holds nothing of this one's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_submissions_on_three_hosts_never_promise_more_than_the_balance() {
    use crate::store::{AccountStore, Admission, Billing, KeyBound, Refusal, StoreError};
    let Some(db) = fresh().await else { return };
    let accounts = super::PgAccounts::new(db.clone());
    // 7 credits at 3 a job: two jobs at a time.
    let pricing = crate::accounts::Pricing { credits_per_second: 100, min_per_job: 3 };
    accounts.create(&account("thin", 7)).await.unwrap();
    accounts.create(&account("other", 100)).await.unwrap();
    let metas = registered_metas(&db, &["a", "b", "c"]).await;
    let submit = |meta: std::sync::Arc<super::PgMeta>, id: String, account: &'static str| async move {
        let job = crate::store::JobRecord::queued_for_test(&id, 10, 1);
        // Each job under its own key: only the balance can refuse it.
        let key = KeyBound { key: &id, max_queued: 5, waiting_here: &[] };
        let admission = Admission { billed: Some(Billing { account, pricing }), key: Some(key), server: OPEN };
        match meta.submit_admitted(&job, &serde_json::json!({}), None, admission).await {
            Ok(()) => Some(job),
            Err(StoreError::Refused(Refusal::NoFunds)) => None,
            Err(e) => panic!("{e}"),
        }
    };
    let racing = (0..12).map(|n| submit(metas[n % 3].clone(), format!("t{n}"), "thin"));
    let admitted: Vec<_> = futures_util::future::join_all(racing).await.into_iter().flatten().collect();
    assert_eq!(admitted.len(), 2, "7 credits cover two jobs at 3 each: {:?}", admitted.iter().map(|j| &j.id).collect::<Vec<_>>());
    assert!(submit(metas[1].clone(), "t-more".into(), "thin").await.is_none());
    // Another account's jobs hold nothing of this one's.
    assert!(submit(metas[2].clone(), "o1".into(), "other").await.is_some());
    // One ends (charged before its end is written, as the worker does):
    // the other still holds its minimum, so one more fits, not two.
    accounts.add_credits("thin", -3, false).await.unwrap();
    let mut done = admitted[0].clone();
    done.transition(crate::store::JobStatus::Canceled, 20).unwrap();
    let host: usize = done.id[1..].parse().unwrap();
    metas[host % 3].put_job(&done).await.unwrap();
    let again = (0..4).map(|n| submit(metas[n % 3].clone(), format!("u{n}"), "thin"));
    let admitted: Vec<_> = futures_util::future::join_all(again).await.into_iter().flatten().collect();
    assert_eq!(admitted.len(), 0, "4 credits left, one job unfinished: none fits");
    accounts.add_credits("thin", 2, false).await.unwrap();
    let again = (0..4).map(|n| submit(metas[n % 3].clone(), format!("v{n}"), "thin"));
    let admitted: Vec<_> = futures_util::future::join_all(again).await.into_iter().flatten().collect();
    assert_eq!(admitted.len(), 1, "6 credits, one job unfinished: one more");
}

/// A job's end and its account's charge are one write: charged once, even
/// when the write is tried again after an unknown outcome; a host that no
/// longer holds the job charges nothing (its run is not the job's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jobs_end_charges_its_account_once_in_the_same_write() {
    use std::time::Duration;

    use crate::store::cluster::{Notices, Topic};
    use crate::store::{AccountStore, Admission, Billing, Charge, Charged, CreditChange, JobStatus, StoreError};
    let Some(db) = fresh().await else { return };
    let accounts = super::PgAccounts::new(db.clone());
    accounts.create(&account("payer", 100)).await.unwrap();
    let metas = registered_metas(&db, &["a", "b"]).await;
    // Another host hears of the new balance.
    let listener = super::PgNotices::start(&db.clone().as_host("c")).unwrap();
    let mut heard = listener.subscribe(Topic::Accounts);
    listening(&listener, "c").await;
    let charge = Charge { account: "payer", amount: 7 };
    let mut job = crate::store::JobRecord::queued_for_test("paid", 10, 1);
    metas[0].put_job(&job).await.unwrap();
    job.transition(JobStatus::Running, 11).unwrap();
    metas[0].put_job(&job).await.unwrap();
    job.transition(JobStatus::Succeeded, 12).unwrap();
    match metas[0].finish_job_charged(&job, &[], charge).await.unwrap() {
        Charged::With(Some(CreditChange::Changed(a))) => assert_eq!(a.credits, 93),
        other => panic!("charged with the end: {other:?}"),
    }
    let notice = tokio::time::timeout(Duration::from_secs(10), heard.recv()).await.expect("announced").unwrap();
    assert_eq!(&*notice, "payer");
    assert!(matches!(metas[0].finish_job_charged(&job, &[], charge).await.unwrap(), Charged::With(None)), "a retry charges nothing");
    assert_eq!(accounts.get("payer").await.unwrap().unwrap().credits, 93);
    assert_eq!(metas[1].get_job("paid").await.unwrap().unwrap().status, JobStatus::Succeeded);
    // Held by another host: refused, and nothing charged.
    let mut other = crate::store::JobRecord::queued_for_test("elsewhere", 10, 2);
    metas[1].put_job(&other).await.unwrap();
    other.transition(JobStatus::Running, 11).unwrap();
    other.transition(JobStatus::Succeeded, 12).unwrap();
    assert!(matches!(metas[0].finish_job_charged(&other, &[], charge).await, Err(StoreError::Fenced(_))));
    assert_eq!(accounts.get("payer").await.unwrap().unwrap().credits, 93);
    // An account that is gone: the end is written, nothing charged.
    let mut orphan = crate::store::JobRecord::queued_for_test("orphan", 10, 3);
    metas[0].put_job(&orphan).await.unwrap();
    orphan.transition(JobStatus::Canceled, 12).unwrap();
    let gone = Charge { account: "nobody", amount: 7 };
    assert!(matches!(metas[0].finish_job_charged(&orphan, &[], gone).await.unwrap(), Charged::With(Some(CreditChange::NoAccount))));
    assert_eq!(metas[1].get_job("orphan").await.unwrap().unwrap().status, JobStatus::Canceled);
    // The account its admission held pays, whatever the caller names.
    accounts.create(&account("holder", 100)).await.unwrap();
    let mut held = crate::store::JobRecord::queued_for_test("held", 10, 4);
    let admission = Admission { billed: Some(Billing { account: "holder", pricing: FREE }), key: None, server: OPEN };
    metas[0].submit_admitted(&held, &serde_json::json!({}), None, admission).await.unwrap();
    held.transition(JobStatus::Running, 11).unwrap();
    metas[0].put_job(&held).await.unwrap();
    held.transition(JobStatus::Succeeded, 12).unwrap();
    metas[0].finish_job_charged(&held, &[], charge).await.unwrap();
    assert_eq!(accounts.get("holder").await.unwrap().unwrap().credits, 93);
    assert_eq!(accounts.get("payer").await.unwrap().unwrap().credits, 93, "unchanged since its own job");
}
