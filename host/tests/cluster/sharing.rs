//! Work spreads over the hosts: jobs queued on a busy host are taken by
//! idle ones, and streams opened on the busy host follow them there.

use std::time::{Duration, Instant};

use super::*;

/// Six jobs submitted to one host with one worker: the two idle hosts take
/// some of them, so more than one runs at once (the host they were
/// submitted to runs one at a time), and each event stream opened on the
/// first host while its job waited there sees the job succeed, wherever
/// it ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_hosts_take_the_jobs_queued_on_a_busy_one() {
    let Some(shared) = shared().await else { return };
    let one_worker = [("KILN_MAX_RUNNING_JOBS", "1")];
    let hosts: Vec<Host> = ["w1", "w2", "w3"].iter().map(|name| start_with(name, &shared, &one_worker)).collect();
    let http = reqwest::Client::new();
    let (busy, other) = (&hosts[0], &hosts[1]);
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
    for (id, stream) in jobs {
        let seen = stream.await.unwrap();
        assert!(seen.contains("\"status\":\"succeeded\""), "the stream opened on the busy host saw job {id} end: {seen}");
    }
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
