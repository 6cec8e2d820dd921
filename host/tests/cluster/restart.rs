//! PostgreSQL restarted under three hosts: a submission during the outage
//! is 500 `upstream_error` (its key stays free), the job running through
//! it ends recorded, an event stream on another host that missed the
//! notices of the outage still hears its end, and the hosts go on. The
//! bucket going away under two hosts (a SeaweedFS server of the test's
//! own, killed and started again) loses nothing.

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

/// `POST /api/v2/assets` of `bytes` through `host`: the status and body.
async fn upload(http: &reqwest::Client, host: &Host, name: &str, bytes: Vec<u8>) -> (u16, Value) {
    let form =
        reqwest::multipart::Form::new().text("file_path", name.to_string()).part("file", reqwest::multipart::Part::bytes(bytes).file_name(name.to_string()));
    let resp = http.post(format!("{}/api/v2/assets", host.base)).multipart(form).send().await.unwrap();
    (resp.status().as_u16(), resp.json().await.unwrap_or(Value::Null))
}

/// `GET /api/v2/assets/{id}/content` through `host`: the status and bytes.
async fn content(http: &reqwest::Client, host: &Host, id: &str) -> (u16, Vec<u8>) {
    let resp = http.get(format!("{}/api/v2/assets/{id}/content", host.base)).send().await.unwrap();
    (resp.status().as_u16(), resp.bytes().await.unwrap().to_vec())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bucket_going_away_under_two_hosts_loses_nothing() {
    let Some(mut weed) = own_weed::OwnWeed::start_new() else { return };
    let Some(mut shared) = shared().await else { return };
    for (key, value) in shared.iter_mut() {
        if key == "KILN_S3_ENDPOINT" {
            *value = weed.endpoint();
        }
    }
    let hosts: Vec<Host> = ["b1", "b2"].iter().map(|name| start(name, &shared)).collect();
    let (h1, h2) = (&hosts[0], &hosts[1]);
    let http = reqwest::Client::new();
    // Stored before the outage: an upload through h1 (cached there only)
    // and a job's output, downloaded through both (cached on both).
    let kept = format!("kept before the outage {}", uuid::Uuid::new_v4()).into_bytes();
    let (status, uploaded) = upload(&http, h1, "kept.txt", kept.clone()).await;
    assert_eq!(status, 201, "{uploaded}");
    let uploaded = uploaded["id"].as_str().unwrap().to_string();
    let done = submit(&http, h1, quick(1)).await;
    let done = wait_for(&http, h2, &done, &["succeeded"], Duration::from_secs(30)).await;
    let output = download(&http, h1, &done).await;
    assert_eq!(download(&http, h2, &done).await, output);

    weed.stop();
    // Each of these waits out the store's retries (15 s): all at once.
    let (refused, unread, failed) =
        tokio::join!(upload(&http, h2, "refused.txt", b"sent while the bucket is away".to_vec()), content(&http, h2, &uploaded), async {
            let id = submit(&http, h2, quick(2)).await;
            wait_for(&http, h1, &id, &["succeeded", "failed"], Duration::from_secs(90)).await
        },);
    assert_eq!((refused.0, refused.1["error"]["code"].as_str()), (500, Some("upstream_error")), "{}", refused.1);
    assert_eq!(unread.0, 500, "h2 never cached h1's upload: {}", String::from_utf8_lossy(&unread.1));
    assert_eq!(failed["status"], "failed", "a job whose output cannot be stored fails: {failed}");
    assert!(failed["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{failed}");
    // What the database and the hosts' caches hold still answers.
    assert_eq!(content(&http, h1, &uploaded).await, (200, kept.clone()), "h1 cached its upload");
    assert_eq!(download(&http, h2, &done).await, output, "h2 cached the output");
    assert_eq!(job(&http, h2, done["id"].as_str().unwrap()).await["status"], "succeeded");

    weed.start();
    // Nothing stored was lost: h2 reads h1's upload from the bucket (a
    // restarted SeaweedFS answers before its volumes are back: retried),
    // and takes uploads and runs jobs again.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, bytes) = content(&http, h2, &uploaded).await;
        if status == 200 {
            assert_eq!(bytes, kept);
            break;
        }
        assert!(Instant::now() < deadline, "h2 never read the upload back: {status}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let (status, again) = upload(&http, h2, "again.txt", b"sent once it is back".to_vec()).await;
    assert_eq!(status, 201, "{again}");
    let after = submit(&http, h2, quick(3)).await;
    wait_for(&http, h1, &after, &["succeeded"], Duration::from_secs(30)).await;
}
