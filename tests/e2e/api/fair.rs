//! Tiers and fair scheduling: per-key running and queued limits,
//! and round-robin dispatch across accounts, so one account's flood never
//! starves another's jobs. Jobs of a second account are submitted through
//! the service itself (accounts and their keys are the `tenants` work); the
//! first account's go over HTTP.

use std::collections::HashMap;
use std::sync::Arc;

use kiln::service::Submission;
use kiln::service::fair::OwnerLimits;
use serde_json::{Value, json};

use super::{TestServer, spinner, start, trivial};

/// Submits as `owner` through the service; returns (id, queue position).
async fn submit_as(s: &TestServer, owner: &str, workflow: Value) -> (String, usize) {
    let admitted = s.server.state.service.admit(Submission::v2(owner, workflow)).await.unwrap();
    (admitted.record.id, admitted.position.unwrap())
}

/// Waits until every job is terminal; returns their records by id.
async fn finished(s: &TestServer, jobs: &[(&str, &str)]) -> HashMap<String, kiln::store::JobRecord> {
    let mut out = HashMap::new();
    for _ in 0..1200 {
        out.clear();
        for (owner, id) in jobs {
            let (rec, _) = s.server.state.service.get(owner, id).await.unwrap();
            if rec.status.is_terminal() {
                out.insert(id.to_string(), rec);
            }
        }
        if out.len() == jobs.len() {
            return out;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("jobs did not finish: {} of {}", out.len(), jobs.len());
}

#[tokio::test]
async fn a_flood_from_one_account_does_not_starve_another() {
    let s = start(|c, o| {
        c.max_running_jobs = 1;
        o.max_running_jobs = 1;
    })
    .await;
    // One job holds the only worker while the queue fills (until its node's
    // 2 s limit), so the order below is the dispatcher's, not a race.
    let blocker = s.submit(spinner(1)).await;
    let blocker = blocker["id"].as_str().unwrap().to_string();
    s.wait_for(&blocker, "running").await;
    let mut flood: Vec<String> = Vec::new();
    for i in 0..20 {
        flood.push(submit_as(&s, "alice", trivial(i)).await.0);
    }
    let mut few: Vec<(String, usize)> = Vec::new();
    for i in 0..3 {
        few.push(submit_as(&s, "bob", trivial(100 + i)).await);
    }
    // bob's jobs alternate with alice's (2nd, 4th and 6th to run, below);
    // each owner's positions count its own jobs only.
    assert_eq!(few.iter().map(|(_, p)| *p).collect::<Vec<_>>(), [1, 2, 3]);
    assert_eq!(s.server.state.service.queue_position(&flood[3]), Some(4));
    // Another account's job is not found by this server's own caller.
    let (status, _) = s.get(&format!("/jobs/{}", few[2].0)).await;
    assert_eq!(status, 404);
    let mut all: Vec<(&str, &str)> = flood.iter().map(|id| ("alice", id.as_str())).collect();
    all.extend(few.iter().map(|(id, _)| ("bob", id.as_str())));
    let done = finished(&s, &all).await;
    let mut started: Vec<(i64, &str, String)> = done.values().map(|r| (r.started_at.unwrap(), r.owner.as_str(), r.id.clone())).collect();
    started.sort();
    let owners: Vec<&str> = started.iter().map(|(_, o, _)| *o).collect();
    assert_eq!(&owners[..7], ["alice", "bob", "alice", "bob", "alice", "bob", "alice"], "round-robin across accounts");
    assert!(done.values().all(|r| r.status == kiln::store::JobStatus::Succeeded));
}

#[tokio::test]
async fn a_tiers_running_limit_holds_and_extra_jobs_queue() {
    let s = start(|c, o| {
        c.max_running_jobs = 3;
        o.max_running_jobs = 3;
    })
    .await;
    // alice's tier runs one job at a time; everyone else three.
    let limits = |key: &str| OwnerLimits { max_running: if key == "alice" { 1 } else { 3 }, max_queued: 100 };
    s.server.state.service.set_tenant_limits(Arc::new(limits));
    let heavy = |i: i64| {
        json!({
            "1": { "class_type": "EmptyImage", "inputs": { "width": 512, "height": 512, "batch_size": 1, "color": i } },
            "2": { "class_type": "ImageBlur", "inputs": { "image": ["1", 0], "blur_radius": 6, "sigma": 2.0 } },
            "3": { "class_type": "SaveImage", "inputs": { "images": ["2", 0], "filename_prefix": "h" } },
        })
    };
    let mut alice: Vec<String> = Vec::new();
    for i in 0..4 {
        alice.push(submit_as(&s, "alice", heavy(i)).await.0);
    }
    let mut bob: Vec<String> = Vec::new();
    for i in 0..2 {
        bob.push(submit_as(&s, "bob", heavy(10 + i)).await.0);
    }
    let mut all: Vec<(&str, &str)> = alice.iter().map(|id| ("alice", id.as_str())).collect();
    all.extend(bob.iter().map(|id| ("bob", id.as_str())));
    let done = finished(&s, &all).await;
    assert!(done.values().all(|r| r.status == kiln::store::JobStatus::Succeeded));
    // alice's runs never overlap (a slot frees only after the record is final).
    let mut spans: Vec<(i64, i64)> = alice.iter().map(|id| (done[id].started_at.unwrap(), done[id].completed_at.unwrap())).collect();
    spans.sort();
    for pair in spans.windows(2) {
        assert!(pair[0].1 <= pair[1].0, "alice ran two jobs at once: {spans:?}");
    }
    // All of bob's jobs started before alice's last one: her queue did not hold his back.
    let bob_last_start = bob.iter().map(|id| done[id].started_at.unwrap()).max().unwrap();
    assert!(bob_last_start < spans[3].0, "bob waited behind alice's queue");
}

#[tokio::test]
async fn a_full_tier_queue_is_429_queue_full_with_retry_after() {
    let s = start(|c, o| {
        c.max_running_jobs = 1;
        o.max_running_jobs = 1;
        // The server's one owner falls in the default tier: 2 waiting at most.
        o.tiers.default = Some(OwnerLimits { max_running: 1, max_queued: 2 });
    })
    .await;
    let blocker = s.submit(spinner(2)).await;
    s.wait_for(blocker["id"].as_str().unwrap(), "running").await;
    s.submit(trivial(1)).await;
    s.submit(trivial(2)).await;
    let (status, body, headers) = s.post_job(&json!({ "workflow": trivial(3) }), Some("k-full")).await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["error"]["code"], "queue_full");
    let retry: u64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry));
    // Another account's queue is its own.
    submit_as(&s, "carol", trivial(4)).await;
    // The key was released: once the queue drains, the same key proceeds.
    s.server.state.service.cancel("local", blocker["id"].as_str().unwrap()).await.unwrap();
    for _ in 0..600 {
        let (status, _, _) = s.post_job(&json!({ "workflow": trivial(3) }), Some("k-full")).await;
        if status == 201 {
            return;
        }
        assert_eq!(status, 429);
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("the queue never drained");
}

#[tokio::test]
async fn over_http_a_deployments_jobs_are_scheduled_apart_from_the_servers_flood() {
    let s = start(|c, o| {
        c.max_running_jobs = 1;
        o.max_running_jobs = 1;
        c.admin_token = Some("fair-admin".into());
    })
    .await;
    let resp = s
        .http
        .post(format!("{}/admin/deployments", s.server.url()))
        .bearer_auth("fair-admin")
        .json(&json!({ "id": "other", "owner": "local" }))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    let dep = format!("{}/deployment/other/api/v2", s.server.url());
    let mut ready = false;
    for _ in 0..1200 {
        if s.http.get(format!("{dep}/jobs")).send().await.unwrap().status() == 200 {
            ready = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    assert!(ready);
    let blocker = s.submit(spinner(5)).await;
    s.wait_for(blocker["id"].as_str().unwrap(), "running").await;
    let mut flood = Vec::new();
    for i in 0..10 {
        flood.push(s.submit(trivial(i)).await);
    }
    assert_eq!(flood[9]["queue_position"], 10);
    let mut theirs = Vec::new();
    for i in 0..2 {
        let resp = s.http.post(format!("{dep}/jobs")).json(&json!({ "workflow": trivial(50 + i) })).send().await.unwrap();
        assert_eq!(resp.status(), 201);
        theirs.push(resp.json::<Value>().await.unwrap());
    }
    // The deployment's jobs are 2nd and 4th in line, not 11th and 12th.
    assert_eq!(theirs.iter().map(|j| j["queue_position"].as_u64().unwrap()).collect::<Vec<_>>(), [2, 4]);
    // And the server's own 10th job moved back by the two.
    assert_eq!(s.job(flood[9]["id"].as_str().unwrap()).await["queue_position"], 12);
    for j in &theirs {
        // Followed by its own (prefixed) link.
        let url = format!("{}{}", s.server.url(), j["urls"]["self"].as_str().unwrap());
        let mut succeeded = false;
        for _ in 0..1200 {
            let job: Value = s.http.get(&url).send().await.unwrap().json().await.unwrap();
            if job["status"] == "succeeded" {
                succeeded = true;
                break;
            }
            assert!(["queued", "running"].contains(&job["status"].as_str().unwrap()), "{job}");
            tokio::time::sleep(std::time::Duration::from_millis(25)).await;
        }
        assert!(succeeded, "{url} never succeeded");
    }
}
