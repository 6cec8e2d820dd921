//! Restart recovery and retention.

use serde_json::json;

use super::{load_save, png_bytes, spinner, start, start_default, start_in, trivial};

#[tokio::test]
async fn a_restart_loses_nothing_and_reruns_the_interrupted_job_once() {
    let s = start(|_, o| {
        o.max_running_jobs = 1;
        o.logs_on_read = true;
    })
    .await;
    let (_, asset) = s.upload("keep.png", png_bytes(4, 4, 8), None).await;
    let (status, running, _) = s.post_job(&json!({ "workflow": spinner(21) }), Some("key-restart")).await;
    assert_eq!(status, 201);
    let rid = running["id"].as_str().unwrap().to_string();
    s.wait_for(&rid, "running").await;
    let queued = s.submit(load_save(&asset)).await;
    let qid = queued["id"].as_str().unwrap().to_string();
    let data = s.shutdown().await;

    let s = start_in(data, |_, o| {
        o.max_running_jobs = 1;
        o.logs_on_read = true;
    })
    .await;
    // The claim, the asset and both jobs survived.
    assert_eq!(s.post_job(&json!({ "workflow": trivial(1) }), Some("key-restart")).await.0, 422);
    assert_eq!(s.get(&format!("/assets/{}", asset["id"].as_str().unwrap())).await.0, 200);
    // The interrupted job ran again (its second attempt hits the node's limit);
    // the queued one ran after it.
    let again = s.wait(&rid).await;
    assert_eq!(again["status"], "failed", "{again}");
    assert_eq!(again["error"]["code"], "node_timeout");
    let done = s.wait(&qid).await;
    assert_eq!(done["status"], "succeeded", "{done}");
    assert_eq!(done["outputs"].as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn outputs_of_an_interrupted_run_are_dropped_at_restart() {
    // An output is saved, then a branch spins until its limit; the server
    // stops in between. The output is on the live record and its asset is
    // readable, but the stored record does not list it (outputs reach the
    // store with the terminal record): recovery still finds and drops it.
    let s = start(|_, o| {
        o.max_running_jobs = 1;
        o.logs_on_read = true;
    })
    .await;
    let mut workflow = trivial(3);
    workflow["9"] = spinner(23)["1"].clone();
    let id = s.submit(workflow).await["id"].as_str().unwrap().to_string();
    let mut seen = None;
    for _ in 0..200 {
        let job = s.job(&id).await;
        if job["status"] == "running" && job["outputs"].as_array().is_some_and(|o| o.len() == 1) {
            seen = Some(job["outputs"][0]["id"].as_str().unwrap().to_string());
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let first = seen.expect("the output of the first run, while the job runs");
    assert_eq!(s.get(&format!("/assets/{first}")).await.0, 200);
    let s = start_in(s.shutdown().await, |_, o| {
        o.max_running_jobs = 1;
        o.logs_on_read = true;
    })
    .await;
    assert_eq!(s.get(&format!("/assets/{first}")).await.0, 404, "the interrupted run's output is gone");
    let done = s.wait(&id).await;
    assert_eq!(done["status"], "failed", "{done}");
    let outputs = done["outputs"].as_array().unwrap();
    assert_eq!(outputs.len(), 1, "only the second run's output: {done}");
    assert_ne!(outputs[0]["id"], first.as_str());
}

#[tokio::test]
async fn jobs_with_extra_data_fail_at_restart_instead_of_running_without_it() {
    let s = start(|_, o| {
        o.max_running_jobs = 1;
        o.logs_on_read = true;
    })
    .await;
    let keyed = |workflow| json!({ "workflow": workflow, "extra_data": { "api_key_svc_org": "k-restart" } });
    let (status, running, _) = s.post_job(&keyed(spinner(25)), None).await;
    assert_eq!(status, 201, "{running}");
    let running = running["id"].as_str().unwrap().to_string();
    s.wait_for(&running, "running").await;
    let (status, queued, _) = s.post_job(&keyed(trivial(5)), None).await;
    assert_eq!(status, 201, "{queued}");
    let queued = queued["id"].as_str().unwrap().to_string();
    let plain = s.submit(trivial(6)).await["id"].as_str().unwrap().to_string();

    let s = start_in(s.shutdown().await, |_, o| {
        o.max_running_jobs = 1;
        o.logs_on_read = true;
    })
    .await;
    for (id, ran) in [(&running, true), (&queued, false)] {
        let job = s.job(id).await;
        assert_eq!(job["status"], "failed", "{job}");
        assert_eq!(job["error"]["code"], "interrupted", "{job}");
        assert!(job["error"]["message"].as_str().unwrap().contains("extra_data"), "{job}");
        assert_eq!(job["logs"]["truncated"], ran, "{job}");
    }
    // A job without extra_data runs as usual (and at once: the keyed
    // spinner did not run again).
    assert_eq!(s.wait(&plain).await["status"], "succeeded");
}

#[tokio::test]
async fn a_job_interrupted_twice_fails_instead_of_looping() {
    let s = start(|_, o| {
        o.max_running_jobs = 1;
        o.logs_on_read = true;
    })
    .await;
    let job = s.submit(spinner(22)).await;
    let id = job["id"].as_str().unwrap().to_string();
    s.wait_for(&id, "running").await;
    let s = start_in(s.shutdown().await, |_, o| {
        o.max_running_jobs = 1;
        o.logs_on_read = true;
    })
    .await;
    s.wait_for(&id, "running").await;
    let s = start_in(s.shutdown().await, |_, o| {
        o.max_running_jobs = 1;
        o.logs_on_read = true;
    })
    .await;
    let done = s.job(&id).await;
    assert_eq!(done["status"], "failed", "{done}");
    assert_eq!(done["error"]["code"], "interrupted");
    // Its runs' output died with the processes: an empty log, shed.
    assert_eq!(done["logs"]["text"], "", "{done}");
    assert_eq!(done["logs"]["truncated"], true, "{done}");
}

#[tokio::test]
async fn retention_expires_jobs_and_their_outputs() {
    let s = start_default().await;
    let (_, asset) = s.upload("in.png", png_bytes(4, 4, 6), None).await;
    let job = s.submit(load_save(&asset)).await;
    let id = job["id"].as_str().unwrap().to_string();
    let done = s.wait(&id).await;
    let out = done["outputs"][0].clone();
    let expires = kiln::store::now_micros() + 24 * 3600 * 1_000_000 + 1_000_000;
    let blobs = s.server.state.service.blobs().clone();
    let count_blobs = || blobs.list().unwrap().len();
    assert_eq!(count_blobs(), 2, "input + output");

    s.server.state.service.sweep(expires).await.unwrap();
    let expired = s.job(&id).await;
    assert_eq!(expired["status"], "expired", "{expired}");
    assert_eq!(expired["outputs"].as_array().unwrap().len(), 0);
    assert_eq!(s.get(&format!("/assets/{}", out["id"].as_str().unwrap())).await.0, 404);
    assert_eq!(s.get(&format!("/assets/{}", asset["id"].as_str().unwrap())).await.0, 200, "uploads are not job outputs");
    assert_eq!(count_blobs(), 1, "the output blob was collected");
    // One retention period later the record itself is gone.
    s.server.state.service.sweep(expires + 24 * 3600 * 1_000_000).await.unwrap();
    assert_eq!(s.get(&format!("/jobs/{id}")).await.0, 404);
}

/// `expires_at` is `created_at` plus the retention period; a sweep before
/// it changes nothing; a sweep after it expires a queued job at once and
/// stops a running one, which then ends `expired` too.
#[tokio::test]
async fn retention_expires_queued_and_running_jobs_at_their_deadline() {
    let s = start(|_, o| {
        o.max_running_jobs = 1;
        o.logs_on_read = true;
    })
    .await;
    let running = s.submit(spinner(41)).await;
    let running_id = running["id"].as_str().unwrap().to_string();
    s.wait_for(&running_id, "running").await;
    let queued = s.submit(trivial(41)).await;
    let queued_id = queued["id"].as_str().unwrap().to_string();
    let micros = |t: &serde_json::Value| chrono::DateTime::parse_from_rfc3339(t.as_str().unwrap()).unwrap().timestamp_micros();
    assert_eq!(micros(&queued["expires_at"]) - micros(&queued["created_at"]), 86_400 * 1_000_000, "{queued}");

    let now = kiln::store::now_micros();
    s.server.state.service.sweep(now + (86_400 - 60) * 1_000_000).await.unwrap();
    assert_eq!(s.job(&running_id).await["status"], "running");
    assert_eq!(s.job(&queued_id).await["status"], "queued");

    s.server.state.service.sweep(now + (86_400 + 1) * 1_000_000).await.unwrap();
    let queued = s.job(&queued_id).await;
    assert_eq!((queued["status"].as_str(), queued["started_at"].as_str()), (Some("expired"), None), "{queued}");
    let running = s.wait(&running_id).await;
    assert_eq!(running["status"], "expired", "{running}");
    assert!(running["started_at"].is_string() && running["completed_at"].is_string(), "{running}");
    // The worker is free again.
    let next = s.submit(trivial(42)).await;
    assert_eq!(s.wait(next["id"].as_str().unwrap()).await["status"], "succeeded");
}
