//! Work spreads over the hosts: jobs queued on a busy host are taken by
//! idle ones, and streams opened on the busy host follow them there; a job
//! whose `extra_pnginfo` its host holds stays there; a cancel through the
//! first host reaches a job another took, also one taken so recently that
//! the first host still queues it.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::*;

/// Six jobs submitted to one host with one worker: the two idle hosts take
/// some of them, so more than one runs at once (the host they were
/// submitted to runs one at a time), and each event stream opened on the
/// first host while its job waited there sees the job succeed, wherever
/// it ran. A prompt with `extra_pnginfo` queued there meanwhile runs there,
/// its PNG embedding that workflow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_hosts_take_the_jobs_queued_on_a_busy_one() {
    let Some(shared) = shared().await else { return };
    let one_worker = [("KILN_MAX_RUNNING_JOBS", "1")];
    let hosts: Vec<Host> = ["w1", "w2", "w3"].iter().map(|name| start_with(name, &shared, &one_worker)).collect();
    let http = reqwest::Client::new();
    let (busy, other) = (&hosts[0], &hosts[1]);
    // The busy host's worker taken first; then a prompt whose `extra_pnginfo`
    // the busy host holds in memory alone: it must wait for that host.
    let first = submit(&http, busy, slow(100)).await;
    wait_for(&http, other, &first, &["running"], Duration::from_secs(30)).await;
    let prompt = json!({
        "1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 1}},
        "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "pinned"}},
    });
    let extra = json!({ "extra_pnginfo": { "workflow": { "marker": "kept-on-its-host" } } });
    let queued: Value =
        http.post(format!("{}/api/prompt", busy.base)).json(&json!({ "prompt": prompt, "extra_data": extra })).send().await.unwrap().json().await.unwrap();
    let pinned = queued["prompt_id"].as_str().unwrap_or_else(|| panic!("{queued}")).to_string();
    let mut jobs = Vec::new();
    for n in 0..6 {
        let id = submit(&http, busy, slow(n)).await;
        let stream = http.get(format!("{}/api/v2/jobs/{id}/events", busy.base)).send().await.unwrap();
        assert_eq!(stream.status(), 200);
        jobs.push((id, tokio::spawn(read_to_end(stream))));
    }
    // Polled through another host until every job ended: the most seen
    // running at once.
    let (mut most_running, deadline) = (0, Instant::now() + Duration::from_secs(180));
    loop {
        let mut statuses = Vec::new();
        for (id, _) in &jobs {
            statuses.push(job(&http, other, id).await["status"].as_str().unwrap_or("").to_string());
        }
        most_running = most_running.max(statuses.iter().filter(|s| *s == "running").count());
        if statuses.iter().all(|s| ["succeeded", "failed", "canceled"].contains(&s.as_str())) {
            assert!(statuses.iter().all(|s| s == "succeeded"), "{statuses:?}");
            break;
        }
        assert!(Instant::now() < deadline, "the jobs never all ended: {statuses:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(most_running >= 2, "the idle hosts took queued jobs: at most {most_running} ran at once");
    // The pinned prompt ran where its `extra_pnginfo` was: its PNG has it.
    let done = wait_for(&http, other, &pinned, &["succeeded", "failed"], Duration::from_secs(60)).await;
    assert_eq!(done["status"], "succeeded", "{done}");
    let png = download(&http, other, &done).await;
    assert!(png.windows(16).any(|w| w == b"kept-on-its-host"), "the PNG embeds the workflow its host held");
    for (id, stream) in jobs {
        let seen = stream.await.unwrap();
        assert!(seen.contains("\"status\":\"succeeded\""), "the stream opened on the busy host saw job {id} end: {seen}");
    }
}

/// A cancel sent to the host a queued job was submitted to reaches it on
/// the idle host that took it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_through_the_first_host_reaches_a_job_another_took() {
    let Some(shared) = shared().await else { return };
    let one_worker = [("KILN_MAX_RUNNING_JOBS", "1")];
    let hosts: Vec<Host> = ["c1", "c2"].iter().map(|name| start_with(name, &shared, &one_worker)).collect();
    let http = reqwest::Client::new();
    let (busy, other) = (&hosts[0], &hosts[1]);
    let first = submit(&http, busy, slow(1)).await;
    wait_for(&http, other, &first, &["running"], Duration::from_secs(30)).await;
    // The busy host runs one job at a time: this one runs on the other.
    let second = submit(&http, busy, slow(2)).await;
    wait_for(&http, other, &second, &["running"], Duration::from_secs(30)).await;
    assert_eq!(job(&http, busy, &first).await["status"], "running", "both run at once");
    let resp = http.post(format!("{}/api/v2/jobs/{second}/cancel", busy.base)).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let answer: Value = resp.json().await.unwrap();
    assert!(["canceling", "canceled"].contains(&answer["status"].as_str().unwrap_or("")), "{answer}");
    wait_for(&http, busy, &second, &["canceled"], Duration::from_secs(30)).await;
    assert_eq!(wait_for(&http, other, &first, &["succeeded", "failed"], Duration::from_secs(60)).await["status"], "succeeded");
}

/// A cancel of a queued job another host took a moment ago (its row names
/// that host; this one has not heard yet): this host's write is refused,
/// so it lets the job go and asks its holder to cancel it, and never runs
/// it. (The other host is a row only: nothing acts on the request.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_of_a_job_just_taken_elsewhere_goes_to_its_new_holder() {
    let Some(shared) = shared().await else { return };
    let host = start_with("f1", &shared, &[("KILN_MAX_RUNNING_JOBS", "1")]);
    let http = reqwest::Client::new();
    let busy = submit(&http, &host, slow(1)).await;
    wait_for(&http, &host, &busy, &["running"], Duration::from_secs(30)).await;
    let taken = submit(&http, &host, quick(2)).await;
    let db = sqlx::PgPool::connect(&env(&shared, "KILN_DATABASE_URL")).await.unwrap();
    sqlx::query(
        "INSERT INTO hosts (holder, host_id, started_at, lease_until) \
         VALUES ('ghost/1', 'ghost', 0, (extract(epoch from clock_timestamp()) * 1000000)::bigint + 3600000000)",
    )
    .execute(&db)
    .await
    .unwrap();
    let moved = sqlx::query("UPDATE jobs SET holder = 'ghost/1' WHERE id = $1 AND status = 'queued'").bind(&taken).execute(&db).await.unwrap();
    assert_eq!(moved.rows_affected(), 1, "still queued behind the running job");

    let resp = http.post(format!("{}/api/v2/jobs/{taken}/cancel", host.base)).send().await.unwrap();
    assert_eq!(resp.status(), 200, "{}", resp.text().await.unwrap_or_default());
    let (asked,): (bool,) = sqlx::query_as("SELECT cancel_requested FROM jobs WHERE id = $1").bind(&taken).fetch_one(&db).await.unwrap();
    assert!(asked, "the holder is asked to cancel it");
    // Once its worker is free, this host runs nothing of the job.
    assert_eq!(wait_for(&http, &host, &busy, &["succeeded", "failed"], Duration::from_secs(60)).await["status"], "succeeded");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (status, holder): (String, Option<String>) = sqlx::query_as("SELECT status, holder FROM jobs WHERE id = $1").bind(&taken).fetch_one(&db).await.unwrap();
    assert_eq!((status.as_str(), holder.as_deref()), ("queued", Some("ghost/1")), "left to its holder");
    assert_eq!(job(&http, &host, &taken).await["started_at"], Value::Null);
}

/// An SSE stream's text until it ends (or 180 s pass).
async fn read_to_end(mut stream: reqwest::Response) -> String {
    let mut seen = String::new();
    let deadline = Instant::now() + Duration::from_secs(180);
    while !seen.contains("\"status\":\"succeeded\"") && !seen.contains("\"status\":\"failed\"") {
        match tokio::time::timeout_at(deadline.into(), stream.chunk()).await {
            Ok(Ok(Some(chunk))) => seen.push_str(&String::from_utf8_lossy(&chunk)),
            _ => break,
        }
    }
    seen
}
