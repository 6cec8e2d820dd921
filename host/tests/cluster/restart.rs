//! PostgreSQL restarted under three hosts: a submission during the outage
//! is 500 `upstream_error` (its key stays free), the job running through
//! it ends recorded, an event stream on another host that missed the
//! notices of the outage still hears its end, and the hosts go on.

use std::time::Duration;

use serde_json::{Value, json};

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_restart_under_three_hosts_loses_nothing() {
    let Some(pg) = own_postgres::OwnPostgres::start_new() else { return };
    let Some(mut shared) = shared_on(&pg.url()).await else { return };
    // Leases outlast the outage.
    for (key, value) in shared.iter_mut() {
        match key.as_str() {
            "KILN_LEASE_S" => *value = "30".into(),
            "KILN_HEARTBEAT_S" => *value = "2".into(),
            _ => {}
        }
    }
    let mut hosts: Vec<Host> = ["r1", "r2", "r3"].iter().map(|name| start(name, &shared)).collect();
    let http = reqwest::Client::new();
    let running = submit(&http, &hosts[0], slow(5)).await;
    wait_for(&http, &hosts[1], &running, &["running"], Duration::from_secs(30)).await;
    // An event stream on another host: its notices stop with the database.
    let mut stream = http.get(format!("{}/api/v2/jobs/{running}/events", hosts[1].base)).send().await.unwrap();
    assert_eq!(stream.status(), 200);
    let watched = tokio::spawn(async move {
        let mut seen = String::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
        while !seen.contains("\"status\":\"succeeded\"") {
            match tokio::time::timeout_at(deadline, stream.chunk()).await {
                Ok(Ok(Some(chunk))) => seen.push_str(&String::from_utf8_lossy(&chunk)),
                _ => break,
            }
        }
        seen
    });

    pg.stop();
    for (n, host) in hosts.iter().enumerate() {
        let resp = submit_keyed(&http, host, &format!("outage-{n}"), quick(n as i64)).await;
        let status = resp.status().as_u16();
        let body: Value = resp.json().await.unwrap();
        assert_eq!((status, body["error"]["code"].as_str()), (500, Some("upstream_error")), "{body}");
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    pg.start();

    // The job that ran through the outage ends, recorded, seen on every host.
    let ended = wait_for(&http, &hosts[2], &running, &["succeeded", "failed"], Duration::from_secs(60)).await;
    assert_eq!(ended["status"], "succeeded", "{ended}");
    for host in &hosts {
        assert_eq!(job(&http, host, &running).await["status"], "succeeded");
    }
    let seen = watched.await.unwrap();
    assert!(seen.contains("\"status\":\"succeeded\""), "the stream on another host heard the end: {seen}");
    // The keys of the refused submissions are free; each host runs work.
    for (n, host) in hosts.iter().enumerate() {
        let resp = submit_keyed(&http, host, &format!("outage-{n}"), quick(n as i64)).await;
        assert_eq!(resp.status(), 201, "host {n}");
        let id = resp.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_string();
        let done = wait_for(&http, &hosts[(n + 1) % 3], &id, &["succeeded", "failed"], Duration::from_secs(30)).await;
        assert_eq!(done["status"], "succeeded", "{done}");
    }
    for host in &mut hosts {
        assert!(host.child.try_wait().unwrap().is_none(), "every host kept its lease through the outage");
    }
}

/// A host stalled (SIGSTOP) past its lease while it runs a job: another
/// host takes the job and runs it to the end; when the stalled host wakes,
/// it stops on its own (exit 1, its lease lost) and nothing it still had
/// in hand changes the job the other host finished.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_stalled_past_its_lease_stops_and_leaves_the_job_to_the_one_that_took_it() {
    let Some(shared) = shared().await else { return };
    let (mut stalled, other) = (start("s1", &shared), start("s2", &shared));
    let http = reqwest::Client::new();
    let id = submit(&http, &stalled, slow(8)).await;
    let first_run = wait_for(&http, &other, &id, &["running"], Duration::from_secs(30)).await;
    let db = sqlx::PgPool::connect(&env(&shared, "KILN_DATABASE_URL")).await.unwrap();
    let (holder,): (Option<String>,) = sqlx::query_as("SELECT holder FROM jobs WHERE id = $1").bind(&id).fetch_one(&db).await.unwrap();
    assert!(holder.as_deref().is_some_and(|h| h.starts_with("s1/")), "s1 runs it: {holder:?}");

    let pid = stalled.child.id().to_string();
    assert!(std::process::Command::new("kill").args(["-STOP", &pid]).status().unwrap().success());
    let done = wait_for(&http, &other, &id, &["succeeded", "failed", "canceled"], Duration::from_secs(120)).await;
    assert_eq!(done["status"], "succeeded", "{done}");
    assert!(done["started_at"].as_str() > first_run["started_at"].as_str(), "run again from the start: {first_run} then {done}");

    assert!(std::process::Command::new("kill").args(["-CONT", &pid]).status().unwrap().success());
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = stalled.child.try_wait().unwrap() {
            break status;
        }
        assert!(std::time::Instant::now() < deadline, "the stalled host did not stop after waking");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(status.code(), Some(1), "it stops as a host that lost its lease");
    tokio::time::sleep(Duration::from_secs(1)).await;
    // What the job is (not its signed links, made afresh for each read).
    let seen = |job: &Value| {
        let outputs: Vec<Value> = job["outputs"].as_array().into_iter().flatten().map(|o| json!([o["node_id"], o["name"], o["hash"]])).collect();
        json!([job["status"], job["started_at"], job["completed_at"], job["components"], outputs])
    };
    let after = job(&http, &other, &id).await;
    assert_eq!(seen(&after), seen(&done), "the finished job is the other host's, unchanged: {after}");
}
