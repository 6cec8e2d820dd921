//! The numbers hosts share ([`super::PgNumbers`]) on a real PostgreSQL:
//! never handed out twice, above every job's, counted per owner.

use std::sync::Arc;

use super::test_db::fresh;
use crate::store::cluster::SharedNumbers;
use crate::store::{JobRecord, MetaStore};

async fn sql(db: &super::PgDatabase, sql: &str) {
    let pool = sqlx::PgPool::connect_with((*db.pool.connect_options()).clone()).await.unwrap();
    sqlx::raw_sql(sql).execute(&pool).await.unwrap();
    pool.close().await;
}

/// Two hosts drawing blocks at once: every number once, each block in
/// increasing order, and the store's bound above them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submission_numbers_are_never_drawn_twice() {
    let Some(db) = fresh().await else { return };
    let hosts = [Arc::new(super::PgNumbers::new(db.clone())), Arc::new(super::PgNumbers::new(db.clone()))];
    let draws = (0..40u32).map(|n| {
        let host = hosts[n as usize % 2].clone();
        tokio::spawn(async move { host.draw_seqs(1 + n % 8).await.unwrap() })
    });
    let mut all = Vec::new();
    for drawn in futures_util::future::join_all(draws).await {
        let drawn = drawn.unwrap();
        assert!(drawn.windows(2).all(|w| w[0] < w[1]), "a block is in increasing order: {drawn:?}");
        all.extend(drawn);
    }
    let count = all.len();
    assert_eq!(count, (0..40u32).map(|n| 1 + n as usize % 8).sum::<usize>(), "each draw gives what it asked for");
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), count, "no number drawn twice");
    let meta = super::PgMeta::new(db.clone());
    assert_eq!(meta.max_seq().await.unwrap(), *all.last().unwrap(), "the bound counts drawn numbers");
    // A draw after all of them is above all of them.
    assert!(hosts[0].draw_seqs(1).await.unwrap()[0] > *all.last().unwrap());
    // `kiln migrate` raises the numbers above the copied server's; never lowers them.
    meta.raise_seq_bound(5000).await.unwrap();
    assert_eq!(hosts[1].draw_seqs(1).await.unwrap(), [5001]);
    meta.raise_seq_bound(10).await.unwrap();
    assert_eq!(hosts[0].draw_seqs(2).await.unwrap(), [5002, 5003]);
    // A page of copied jobs raises them at once (a copy cut short leaves
    // no number of its jobs to draw again).
    let copied = super::ImportedJob { job: JobRecord::queued_for_test("copied", 1, 9000), workflow: None };
    assert_eq!(meta.import_jobs(vec![copied]).await.unwrap(), 1);
    assert_eq!(hosts[1].draw_seqs(1).await.unwrap(), [9001]);
}

/// Migration 0016 starts the numbers above every job's and the old bound
/// deleted jobs left, whichever is higher.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migration_0016_starts_numbers_above_every_job() {
    let Some(db) = fresh().await else { return };
    let jobs = [JobRecord::queued_for_test("a", 1, 41), JobRecord::queued_for_test("b", 2, 7)];
    let imported = jobs.into_iter().map(|job| super::ImportedJob { job, workflow: None }).collect();
    assert_eq!(super::PgMeta::new(db.clone()).import_jobs(imported).await.unwrap(), 2);
    let before = |bound: u64| {
        format!(
            "DROP SEQUENCE job_numbers; DROP TABLE prompt_counters; \
             CREATE TABLE seq_bound (one BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (one), value BIGINT NOT NULL); \
             INSERT INTO seq_bound (value) VALUES ({bound})"
        )
    };
    let numbers = super::PgNumbers::new(db.clone());
    sql(&db, &before(0)).await;
    sql(&db, include_str!("migrations/0016_numbers.sql")).await;
    assert_eq!(numbers.draw_seqs(1).await.unwrap(), [42], "above the highest job's");
    sql(&db, &before(90)).await;
    sql(&db, include_str!("migrations/0016_numbers.sql")).await;
    assert_eq!(numbers.draw_seqs(1).await.unwrap(), [91], "above the bound deleted jobs left");
}

/// Each owner's priority counter counts from 0, one number per request,
/// whichever host asks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompt_counters_are_per_owner_and_shared() {
    let Some(db) = fresh().await else { return };
    let (h1, h2) = (super::PgNumbers::new(db.clone()), super::PgNumbers::new(db.clone()));
    assert_eq!(h1.next_prompt_number("x").await.unwrap(), 0);
    assert_eq!(h2.next_prompt_number("x").await.unwrap(), 1);
    assert_eq!(h2.next_prompt_number("y").await.unwrap(), 0, "another owner's counter is its own");
    assert_eq!(h1.next_prompt_number("x").await.unwrap(), 2);
}
