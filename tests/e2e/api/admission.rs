//! Every rule a submission meets before its job is queued, through both
//! surfaces: the same rule (applied once, in the service's intake) refuses
//! a Jobs API submission with the documented envelope and a ComfyUI prompt
//! with its own body, and nothing is queued either way.

use reqwest::StatusCode;
use serde_json::{Value, json};

use super::{TestServer, spinner, start, start_default, trivial};

/// POST /api/prompt with `prompt`; returns (status, body).
async fn post_prompt(s: &TestServer, prompt: &Value, key: Option<&str>) -> (StatusCode, Value) {
    let mut req = s.http.post(format!("{}/api/prompt", s.server.url())).json(&json!({ "prompt": prompt }));
    if let Some(key) = key {
        req = req.header("X-API-Key", key);
    }
    let resp = req.send().await.unwrap();
    (resp.status(), resp.json().await.unwrap_or(Value::Null))
}

/// POST /api/v2/jobs with `workflow`; returns (status, body).
async fn post_job(s: &TestServer, workflow: &Value, key: Option<&str>) -> (StatusCode, Value) {
    let mut req = s.http.post(s.url("/jobs")).json(&json!({ "workflow": workflow }));
    if let Some(key) = key {
        req = req.bearer_auth(key);
    }
    let resp = req.send().await.unwrap();
    (resp.status(), resp.json().await.unwrap_or(Value::Null))
}

/// Jobs queued or running on the server.
fn live_jobs(s: &TestServer) -> usize {
    s.server.state.service.queue_remaining("local")
}

/// Asserts the Jobs API envelope: `{"error": {"code", "message"}}`.
fn assert_envelope(body: &Value, code: &str) {
    assert_eq!(body["error"]["code"], code, "{body}");
    assert!(body["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{body}");
}

#[tokio::test]
async fn a_ui_format_workflow_is_refused_on_both_surfaces() {
    let s = start_default().await;
    let ui = json!({ "nodes": [{ "id": 1, "type": "EmptyImage" }], "links": [] });
    let (status, body) = post_job(&s, &ui, None).await;
    assert_eq!(status, 422, "{body}");
    assert_envelope(&body, "workflow_format_ui");
    let (status, body) = post_prompt(&s, &ui, None).await;
    assert_eq!(status, 400, "{body}");
    assert_envelope(&body, "workflow_format_ui");
    assert_eq!(live_jobs(&s), 0);
}

#[tokio::test]
async fn an_unknown_asset_reference_is_refused_on_both_surfaces() {
    let s = start_default().await;
    let missing = "0190d0b4-0000-7000-8000-000000000001";
    let mut workflow = trivial(1);
    workflow["1"]["inputs"]["extra"] = json!({ "__type": "core/ASSET", "info": { "id": missing } });
    let (status, body) = post_job(&s, &workflow, None).await;
    assert_eq!(status, 422, "{body}");
    assert_envelope(&body, "missing_asset");
    assert_eq!(body["error"]["details"]["missing_ids"], json!([missing]), "{body}");
    let (status, body) = post_prompt(&s, &workflow, None).await;
    assert_eq!(status, 400, "{body}");
    assert_envelope(&body, "missing_asset");
    assert_eq!(live_jobs(&s), 0);
}

#[tokio::test]
async fn a_failing_output_refuses_a_job_and_is_dropped_from_a_prompt() {
    let s = start_default().await;
    // Output "3" reads an image from a node that does not exist.
    let mut workflow = trivial(1);
    workflow["3"] = json!({ "class_type": "SaveImage", "inputs": { "images": ["9", 0], "filename_prefix": "x" } });
    let (status, body) = post_job(&s, &workflow, None).await;
    assert_eq!(status, 422, "{body}");
    assert_envelope(&body, "invalid_workflow");
    assert!(body["error"]["details"]["node_errors"]["3"].is_array(), "the failing node is named: {body}");
    assert_eq!(live_jobs(&s), 0, "all or nothing on the Jobs API");
    // ComfyUI's policy: the failing output is dropped and reported, the rest runs.
    let (status, body) = post_prompt(&s, &workflow, None).await;
    assert_eq!(status, 200, "{body}");
    assert!(body["node_errors"]["3"]["errors"].is_array(), "{body}");
    let id = body["prompt_id"].as_str().unwrap();
    let job = s.wait(id).await;
    assert_eq!(job["status"], "succeeded", "{job}");
    let nodes: Vec<&str> = job["outputs"].as_array().unwrap().iter().map(|o| o["node_id"].as_str().unwrap()).collect();
    assert_eq!(nodes, ["2"], "only the valid output ran: {job}");
    // Every output failing refuses the prompt too.
    let only_bad = json!({ "3": workflow["3"].clone() });
    let (status, body) = post_prompt(&s, &only_bad, None).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["type"], "prompt_outputs_failed_validation", "{body}");
}

#[tokio::test]
async fn an_unknown_class_is_refused_on_both_surfaces() {
    let s = start_default().await;
    let workflow = json!({ "1": { "class_type": "NoSuchNode", "inputs": {} } });
    let (status, body) = post_job(&s, &workflow, None).await;
    assert_eq!(status, 422, "{body}");
    assert_envelope(&body, "invalid_workflow");
    let (status, body) = post_prompt(&s, &workflow, None).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["type"], "missing_node_type", "{body}");
    assert_eq!(live_jobs(&s), 0);
}

#[tokio::test]
async fn a_full_queue_refuses_on_both_surfaces() {
    let s = start(|c, o| {
        c.max_running_jobs = 1;
        o.max_running_jobs = 1;
        c.max_queued_jobs = 1;
        o.max_queued_jobs = 1;
    })
    .await;
    assert_eq!(s.http.get(s.url("/ready")).send().await.unwrap().status(), 200, "ready while the queue has room");
    let blocker = s.submit(spinner(1)).await;
    s.wait_for(blocker["id"].as_str().unwrap(), "running").await;
    s.submit(trivial(1)).await;
    let (status, body) = post_job(&s, &trivial(2), None).await;
    assert_eq!(status, 429, "{body}");
    assert_envelope(&body, "queue_full");
    // A load balancer sends it nothing more meanwhile.
    let ready = s.http.get(s.url("/ready")).send().await.unwrap();
    assert_eq!(ready.status(), 503);
    let ready: serde_json::Value = ready.json().await.unwrap();
    assert_eq!((ready["status"].as_str(), &ready["checks"]["queue"]), (Some("not_ready"), &serde_json::json!({"queued": 1, "max_queued": 1})), "{ready}");
    let (status, body) = post_prompt(&s, &trivial(3), None).await;
    assert_eq!(status, 429, "{body}");
    assert_envelope(&body, "queue_full");
    assert_eq!(live_jobs(&s), 2, "the running job and the one queued");
}

const OPERATOR: &str = "operator-token-of-the-admission-tests";

/// A serverless server (accounts, no subscription rule) with `tweak`.
async fn serverless(tweak: impl FnOnce(&mut kiln::config::Config, &mut kiln::service::ServiceOptions)) -> TestServer {
    start(|c, o| {
        c.mode = kiln::config::Mode::Serverless;
        c.admin_token = Some(OPERATOR.into());
        o.mode = kiln::config::Mode::Serverless;
        tweak(c, o);
    })
    .await
}

#[tokio::test]
async fn an_account_without_credits_submits_nothing_on_either_surface() {
    let s = serverless(|_, _| {}).await;
    let (key, id) = s.new_account(OPERATOR, "broke", 0).await;
    let (status, body) = post_job(&s, &trivial(1), Some(&key)).await;
    assert_eq!(status, 402, "{body}");
    assert_envelope(&body, "insufficient_credits");
    let (status, body) = post_prompt(&s, &trivial(1), Some(&key)).await;
    assert_eq!(status, 402, "{body}");
    assert_envelope(&body, "insufficient_credits");
    assert_eq!(s.server.state.service.queue_remaining(&id), 0);
}

/// With accounts, one account's own bound (`max_queued_jobs_per_account`)
/// refuses it on both surfaces while the server has room.
#[tokio::test]
async fn an_account_over_its_own_queue_bound_is_refused_on_both_surfaces() {
    let s = serverless(|c, o| {
        c.max_running_jobs = 1;
        o.max_running_jobs = 1;
        c.max_queued_jobs_per_account = Some(1);
        o.max_queued_per_account = 1;
    })
    .await;
    let (key, id) = s.new_account(OPERATOR, "busy", 1_000_000).await;
    let (status, blocker) = post_job(&s, &spinner(1), Some(&key)).await;
    assert_eq!(status, 201, "{blocker}");
    for _ in 0..200 {
        if s.server.state.service.queue_position(blocker["id"].as_str().unwrap()).is_none() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let (status, queued) = post_job(&s, &trivial(1), Some(&key)).await;
    assert_eq!(status, 201, "{queued}");
    let (status, body) = post_job(&s, &trivial(2), Some(&key)).await;
    assert_eq!(status, 429, "{body}");
    assert_envelope(&body, "queue_full");
    let (status, body) = post_prompt(&s, &trivial(3), Some(&key)).await;
    assert_eq!(status, 429, "{body}");
    assert_envelope(&body, "queue_full");
    assert_eq!(s.server.state.service.queue_remaining(&id), 2, "the running job and the one queued");
    // Another account still gets in.
    let (other, _) = s.new_account(OPERATOR, "other", 1_000_000).await;
    let (status, body) = post_prompt(&s, &trivial(4), Some(&other)).await;
    assert_eq!(status, 200, "{body}");
}
