//! PostgreSQL restarted under three hosts: a submission during the outage
//! is 500 `upstream_error` (its key stays free), the job running through
//! it ends recorded, an event stream on another host that missed the
//! notices of the outage still hears its end, and the hosts go on.

use std::time::Duration;

use serde_json::Value;

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
