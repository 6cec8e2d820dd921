//! What a submission may hold outside any job: queued jobs keep parsed
//! workflows only within their share (`queued_parsed_mb`) and the rest
//! start from their stored bytes; a body is counted before it is parsed
//! (`max_workflow_values`) on both surfaces.

use serde_json::{Value, json};

use super::{spinner, start, start_default, trivial};

/// `trivial(n)` with an input no class reads carrying `values` numbers.
fn padded(n: i64, values: usize) -> Value {
    let mut w = trivial(n);
    w["1"]["inputs"]["pad"] = Value::Array(vec![json!(1); values]);
    w
}

#[tokio::test]
async fn queued_jobs_hold_parsed_workflows_only_within_their_share() {
    const SHARE: u64 = 4 << 20;
    let s = start(|c, o| {
        c.max_running_jobs = 1;
        o.max_running_jobs = 1;
        o.queued_parsed_bytes = SHARE;
    })
    .await;
    let service = &s.server.state.service;
    let blocker = s.submit(spinner(1)).await;
    let blocker = blocker["id"].as_str().unwrap().to_string();
    s.wait_for(&blocker, "running").await;
    // Each is estimated at ~1.3 MiB parsed (5,000 values at 256 bytes):
    // three fit in the share.
    let mut ids = Vec::new();
    for i in 0..6 {
        let job = s.submit(padded(i, 5_000)).await;
        ids.push(job["id"].as_str().unwrap().to_string());
        assert!(service.queued_parsed_held() <= SHARE, "{} held", service.queued_parsed_held());
    }
    let held = service.queued_parsed_held();
    assert!((5_000 * 256..=SHARE).contains(&held), "the first jobs are kept parsed, within the share: {held}");
    assert!(held < 6 * 5_000 * 256, "not all six are kept: {held}");
    // Those over the share start from their stored bytes, and run the same.
    for id in &ids {
        let done = s.wait_for(id, "succeeded").await;
        assert_eq!(done["outputs"].as_array().unwrap().len(), 1, "{done}");
    }
    assert_eq!(service.queued_parsed_held(), 0, "given back as each job starts");
}

#[tokio::test]
async fn a_body_over_the_value_count_is_refused_before_it_is_parsed_on_both_surfaces() {
    let s = start(|c, o| {
        c.max_workflow_values = 10_000;
        o.workflow_limits.max_values = 10_000;
    })
    .await;
    let (status, body, _) = s.post_job(&json!({ "workflow": padded(1, 20_000) }), None).await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["code"], "invalid_workflow", "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("max_workflow_values"), "{body}");
    // Under the count it runs.
    let (status, body, _) = s.post_job(&json!({ "workflow": padded(2, 5_000) }), None).await;
    assert_eq!(status, 201, "{body}");
    // ComfyUI's route answers with its own error shape.
    let root = s.base.trim_end_matches("/api/v2");
    let resp = s.http.post(format!("{root}/api/prompt")).json(&json!({ "prompt": padded(3, 20_000) })).send().await.unwrap();
    assert_eq!(resp.status(), 400);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["type"], "invalid_prompt", "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("max_workflow_values"), "{body}");
}

#[tokio::test]
async fn listings_page_on_records_and_stream_the_workflows_they_return() {
    let s = start_default().await;
    let root = s.base.trim_end_matches("/api/v2").to_string();
    let mut ids = Vec::new();
    for i in 0..5 {
        let resp = s.http.post(format!("{root}/api/prompt")).json(&json!({ "prompt": padded(i, 3_000) })).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        let body: Value = resp.json().await.unwrap();
        ids.push(body["prompt_id"].as_str().unwrap().to_string());
    }
    for id in &ids {
        s.wait_for(id, "succeeded").await;
    }
    let history: Value = s.http.get(format!("{root}/history")).send().await.unwrap().json().await.unwrap();
    let items = history.as_object().unwrap();
    assert_eq!(items.len(), 5);
    for id in &ids {
        let prompt = &items[id]["prompt"];
        assert_eq!(prompt[1], id.as_str());
        assert_eq!(prompt[2]["1"]["inputs"]["pad"].as_array().unwrap().len(), 3_000, "the stored workflow, whole");
        assert_eq!(prompt[4], json!(["2"]), "outputs_to_execute");
        assert_eq!(items[id]["status"]["status_str"], "success");
    }
    // Paged: only the newest; its workflow is the one returned.
    let last: Value = s.http.get(format!("{root}/history?max_items=1")).send().await.unwrap().json().await.unwrap();
    assert_eq!(last.as_object().unwrap().keys().collect::<Vec<_>>(), [&ids[4]]);
    let one: Value = s.http.get(format!("{root}/history/{}", ids[0])).send().await.unwrap().json().await.unwrap();
    assert_eq!(one[&ids[0]]["prompt"][2]["1"]["inputs"]["pad"].as_array().unwrap().len(), 3_000);
    let jobs: Value = s.http.get(format!("{root}/api/jobs?limit=2")).send().await.unwrap().json().await.unwrap();
    assert_eq!(jobs["jobs"].as_array().unwrap().len(), 2);
    assert_eq!(jobs["pagination"]["total"], 5);
    let detail: Value = s.http.get(format!("{root}/api/jobs/{}", ids[1])).send().await.unwrap().json().await.unwrap();
    assert_eq!(detail["workflow"]["prompt"]["1"]["inputs"]["pad"].as_array().unwrap().len(), 3_000, "{}", detail["id"]);
    assert_eq!(detail["status"], "completed");
    let queue: Value = s.http.get(format!("{root}/queue")).send().await.unwrap().json().await.unwrap();
    assert_eq!(queue, json!({ "queue_running": [], "queue_pending": [] }));
}
