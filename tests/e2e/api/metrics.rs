//! `GET /metrics` over real HTTP: each figure counts what this server did
//! (jobs by surface and end, node runs and failures by class, requests by
//! route pattern and status, open streams), labels stay bounded (route
//! patterns, never the path sent; no job id anywhere), and with an operator
//! token configured the figures are the operator's alone.

use serde_json::json;

use super::{TestServer, spinner, start, start_default, trivial};

/// `GET /metrics` with `token` as a Bearer: the status and the body.
async fn scrape(s: &TestServer, token: Option<&str>) -> (u16, String) {
    let mut req = s.http.get(format!("{}/metrics", s.server.url()));
    if let Some(token) = token {
        req = req.bearer_auth(token);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    if status == 200 {
        let kind = resp.headers()["content-type"].to_str().unwrap().to_string();
        assert!(kind.starts_with("text/plain; version=0.0.4"), "{kind}");
    }
    (status, resp.text().await.unwrap())
}

/// The value of the series written exactly `series` (name and labels).
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[tokio::test]
async fn metrics_count_jobs_nodes_requests_and_streams_by_bounded_labels() {
    let s = start_default().await;
    let ok = s.submit(trivial(3)).await;
    assert_eq!(s.wait(ok["id"].as_str().unwrap()).await["status"], "succeeded");
    let crash = s.submit(json!({ "7": { "class_type": "HostilePanic", "inputs": { "trigger": 1 } } })).await;
    assert_eq!(s.wait(crash["id"].as_str().unwrap()).await["status"], "failed");
    let queued: serde_json::Value =
        s.http.post(format!("{}/api/prompt", s.server.url())).json(&json!({ "prompt": trivial(4) })).send().await.unwrap().json().await.unwrap();
    let compat_id = queued["prompt_id"].as_str().unwrap().to_string();
    assert_eq!(s.wait(&compat_id).await["status"], "succeeded");
    let unknown = uuid::Uuid::new_v4().to_string();
    assert_eq!(s.get(&format!("/jobs/{unknown}")).await.0, 404);
    // Refused by the deployment prefix itself (no such deployment): counted too.
    let refused = s.http.get(format!("{}/deployment/no-such/api/v2/jobs", s.server.url())).send().await.unwrap();
    assert_eq!(refused.status(), 404);
    let ws = format!("{}/ws?clientId=metrics", s.server.url().replacen("http", "ws", 1));
    let (socket, _) = tokio_tungstenite::connect_async(ws).await.expect("the WebSocket opens");

    // (The sweeper measures at start and then every 10 minutes.)
    let measured = s.server.state.service.measure_blob_store().unwrap();
    let (status, text) = scrape(&s, None).await;
    assert_eq!(status, 200, "open without an operator token: {text}");
    let at = |series: &str| value(&text, series).unwrap_or_else(|| panic!("no {series} in\n{text}"));
    assert_eq!(at(r#"kiln_jobs_submitted_total{surface="v2"}"#), 2.0);
    assert_eq!(at(r#"kiln_jobs_submitted_total{surface="compat"}"#), 1.0);
    assert_eq!(at(r#"kiln_jobs_ended_total{status="succeeded",surface="v2"}"#), 1.0);
    assert_eq!(at(r#"kiln_jobs_ended_total{status="failed",surface="v2"}"#), 1.0);
    assert_eq!(at(r#"kiln_jobs_ended_total{status="succeeded",surface="compat"}"#), 1.0);
    assert_eq!(at("kiln_job_queue_wait_seconds_count"), 3.0);
    assert_eq!(at(r#"kiln_node_seconds_count{class="EmptyImage",device="cpu"}"#), 2.0);
    assert_eq!(at(r#"kiln_node_seconds_count{class="SaveImage",device="cpu"}"#), 2.0);
    assert_eq!(at(r#"kiln_node_failures_total{class="HostilePanic",code="node_crashed"}"#), 1.0);
    assert_eq!(at(r#"kiln_http_requests_total{method="POST",route="/api/v2/jobs",status="201"}"#), 2.0);
    assert_eq!(at(r#"kiln_http_requests_total{method="POST",route="/api/prompt",status="200"}"#), 1.0);
    assert_eq!(at(r#"kiln_http_requests_total{method="GET",route="/api/v2/jobs/{id}",status="404"}"#), 1.0);
    assert!(at(r#"kiln_http_request_seconds_count{method="GET",route="/api/v2/jobs/{id}"}"#) >= 3.0);
    assert_eq!(at(r#"kiln_http_requests_total{method="GET",route="/deployment/{id}/{*rest}",status="404"}"#), 1.0);
    assert_eq!(at(r#"kiln_open_streams{kind="websocket"}"#), 1.0);
    assert_eq!(at(r#"kiln_open_streams{kind="sse"}"#), 0.0);
    assert_eq!(at("kiln_jobs_queued"), 0.0);
    assert!(at("kiln_resident_memory_bytes") > 1e6);
    // The outputs' PNGs (the two successful jobs'; equal bytes are one blob).
    assert!(measured.blobs >= 1 && measured.bytes > 60, "{measured:?}");
    assert_eq!((at("kiln_blob_store_blobs"), at("kiln_blob_store_bytes")), (measured.blobs as f64, measured.bytes as f64));
    for id in [ok["id"].as_str().unwrap(), crash["id"].as_str().unwrap(), &compat_id, &unknown] {
        assert!(!text.contains(id), "no job id is a label: {id}");
    }

    drop(socket);
    for _ in 0..100 {
        if value(&scrape(&s, None).await.1, r#"kiln_open_streams{kind="websocket"}"#) == Some(0.0) {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("a closed WebSocket is no longer counted");
}

/// The queue and running gauges follow the queue; a job canceled while
/// queued and one canceled while running each count as ended `canceled`.
#[tokio::test]
async fn queued_running_and_canceled_jobs_are_counted() {
    let s = start(|_, o| o.max_running_jobs = 1).await;
    let running = s.submit(spinner(9)).await;
    let running = running["id"].as_str().unwrap();
    s.wait_for(running, "running").await;
    let queued = s.submit(trivial(5)).await;
    let queued = queued["id"].as_str().unwrap();
    let text = scrape(&s, None).await.1;
    assert_eq!((value(&text, "kiln_jobs_queued"), value(&text, "kiln_jobs_running")), (Some(1.0), Some(1.0)), "{text}");
    for id in [queued, running] {
        assert_eq!(s.http.post(s.url(&format!("/jobs/{id}/cancel"))).send().await.unwrap().status(), 200);
        assert_eq!(s.wait(id).await["status"], "canceled");
    }
    // (A worker lets go of its job just after the job is shown ended.)
    let mut text = scrape(&s, None).await.1;
    for _ in 0..100 {
        if value(&text, "kiln_jobs_running") == Some(0.0) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        text = scrape(&s, None).await.1;
    }
    assert_eq!(value(&text, r#"kiln_jobs_ended_total{status="canceled",surface="v2"}"#), Some(2.0), "{text}");
    assert_eq!((value(&text, "kiln_jobs_queued"), value(&text, "kiln_jobs_running")), (Some(0.0), Some(0.0)), "{text}");
    assert_eq!(value(&text, "kiln_job_queue_wait_seconds_count"), Some(1.0), "only the job that started waited to start: {text}");
}

/// With an operator token (`admin_token`), `/metrics` is the operator's:
/// 401 without it or with another token, 200 with it. Without one, a
/// server with accounts has none (404, as the admin API), and a
/// self-hosted one with a `token` asks for it as the Jobs API does.
#[tokio::test]
async fn metrics_are_the_operators_or_need_the_servers_token() {
    const OPERATOR: &str = "operator-token-of-the-metrics-tests";
    const TOKEN: &str = "token-of-the-metrics-tests";
    let s = start(|c, _| c.admin_token = Some(OPERATOR.into())).await;
    assert_eq!(scrape(&s, None).await.0, 401);
    assert_eq!(scrape(&s, Some("not-the-operator")).await.0, 401);
    let (status, text) = scrape(&s, Some(OPERATOR)).await;
    assert_eq!(status, 200);
    assert!(text.contains("# TYPE kiln_http_requests_total counter"), "{text}");

    let cloud = start(|c, o| {
        c.mode = kiln::config::Mode::Cloud;
        o.mode = kiln::config::Mode::Cloud;
    })
    .await;
    assert_eq!(scrape(&cloud, None).await.0, 404, "no operator token, no metrics");

    let guarded = start(|c, _| c.token = Some(TOKEN.into())).await;
    assert_eq!(scrape(&guarded, None).await.0, 401);
    assert_eq!(scrape(&guarded, Some("not-the-token")).await.0, 401);
    assert_eq!(scrape(&guarded, Some(TOKEN)).await.0, 200);
}
