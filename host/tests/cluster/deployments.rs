//! A deployment made, stopped or started through one host is served,
//! refused or served again by the others.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deployments_follow_the_operator_on_every_host() {
    let Some(shared) = shared().await else { return };
    let hosts: Vec<Host> = ["d1", "d2", "d3"].iter().map(|name| start_with(name, &shared, &[("KILN_ADMIN_TOKEN", ADMIN)])).collect();
    let http = reqwest::Client::new();
    let [h1, h2, h3] = [&hosts[0], &hosts[1], &hosts[2]];
    let operate = |host: &Host, path: &str, body: Option<Value>| {
        let request = http.post(format!("{}/admin/deployments{path}", host.base)).bearer_auth(ADMIN);
        let request = match body {
            Some(body) => request.json(&body),
            None => request,
        };
        async move { request.send().await.unwrap().status().as_u16() }
    };

    // Made through h1: served by h2, its job read through h3.
    assert_eq!(operate(h1, "", Some(json!({"id": "everywhere", "owner": "local"}))).await, 201);
    let queued = deployment_answers(&http, h2, "everywhere", 201).await;
    let id = queued["id"].as_str().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let job: Value = http.get(format!("{}/deployment/everywhere/api/v2/jobs/{id}", h3.base)).send().await.unwrap().json().await.unwrap();
        if job["status"] == "succeeded" {
            break;
        }
        assert!(Instant::now() < deadline && job["status"] != "failed", "{job}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Stopped through h3: refused by every host.
    assert_eq!(operate(h3, "/everywhere/stop", None).await, 200);
    for host in &hosts {
        let refused = deployment_answers(&http, host, "everywhere", 422).await;
        assert_eq!(refused["error"]["code"], "deployment_stopped", "{refused}");
    }
    // Started again through h2: h1 serves it again.
    assert_eq!(operate(h2, "/everywhere/start", None).await, 200);
    deployment_answers(&http, h1, "everywhere", 201).await;
}
