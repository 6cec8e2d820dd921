//! Submitting, polling, failing, cancelling, listing jobs.

use serde_json::{Value, json};

use super::{assert_job_shape, load_save, png_bytes, spinner, start, start_default, trivial};

#[tokio::test]
async fn submit_poll_and_download_outputs() {
    let s = start_default().await;
    let input = png_bytes(16, 12, 3);
    let (_, asset) = s.upload("photo.png", input, None).await;
    let (status, job, _) = s.post_job(&json!({ "workflow": load_save(&asset) }), None).await;
    assert_eq!(status, 201, "{job}");
    assert_job_shape(&job);
    assert_eq!(job["status"], "queued");
    assert!(job.get("logs").is_none(), "no logs on submit");
    assert!(job["started_at"].is_null() && job["error"].is_null() && job["progress"].is_null());

    let done = s.wait(job["id"].as_str().unwrap()).await;
    assert_job_shape(&done);
    assert_eq!(done["status"], "succeeded", "{done}");
    assert!(done["started_at"].as_str().unwrap().ends_with("+00:00") && done["completed_at"].as_str().unwrap().ends_with("+00:00"));
    assert!(done["metrics"]["queue_ms"].is_i64() && done["metrics"]["execution_ms"].is_i64(), "{done}");
    assert_eq!(done["progress"]["value"], 1.0);
    assert!(done.get("logs").is_none(), "self-hosted jobs have no logs on read (spec: serverless only): {done}");
    let outputs = done["outputs"].as_array().unwrap();
    assert_eq!(outputs.len(), 1, "{done}");
    let out = &outputs[0];
    assert_eq!((out["node_id"].as_str(), out["type"].as_str(), out["content_type"].as_str()), (Some("2"), Some("image"), Some("image/png")));
    assert_eq!(out["name"], "kiln_00001_.png");
    assert_eq!(out["job_id"], done["id"]);
    let url = out["url"].as_str().unwrap();
    assert!(url.starts_with("http://127.0.0.1:"), "absolute url: {url}");
    let bytes = s.http.get(url).send().await.unwrap().bytes().await.unwrap();
    assert_eq!(bytes.len() as u64, out["size_bytes"].as_u64().unwrap());
    assert_eq!(out["hash"].as_str().unwrap(), format!("blake3:{}", blake3::hash(&bytes).to_hex()));
    // The output is an image of the input's size.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("o.png"), &bytes).unwrap();
    let (w, h, ..) = crate::support::read_png(&dir.path().join("o.png"));
    assert_eq!((w, h), (16, 12));
}

#[tokio::test]
async fn malformed_submissions_get_the_documented_errors() {
    let s = start_default().await;
    let cases: Vec<(Value, u16, &str)> = vec![
        (json!({ "workflow": { "nodes": [], "links": [] } }), 422, "workflow_format_ui"),
        (json!({}), 422, "invalid_workflow"),
        (json!({ "workflow": [1, 2] }), 422, "invalid_workflow"),
        (json!({ "workflow": trivial(1), "webhook_url": "http://x" }), 422, "invalid_workflow"),
        (json!({ "workflow": trivial(1), "inputs": {} }), 422, "invalid_workflow"),
        (json!({ "workflow": trivial(1), "extra_data": { "foo": 1 } }), 400, "invalid_request"),
        (json!({ "workflow": trivial(1), "extra_data": { "api_key_svc_org": 5 } }), 400, "invalid_request"),
        (json!({ "workflow": trivial(1), "metadata": { "bad key": "v" } }), 422, "metadata_invalid"),
        (json!({ "workflow": trivial(1), "metadata": { "k": "\u{202e}gpj.exe" } }), 422, "metadata_invalid"),
        (json!({ "workflow": trivial(1), "metadata": { "k": "é".repeat(129) } }), 422, "metadata_invalid"),
        (json!({ "workflow": { "1": { "class_type": "NoSuchNode", "inputs": {} } } }), 422, "invalid_workflow"),
        (
            json!({ "workflow": { "1": { "class_type": "EmptyImage", "inputs": { "width": 0, "height": 8, "batch_size": 1, "color": 0 } },
                               "2": { "class_type": "SaveImage", "inputs": { "images": ["1", 0], "filename_prefix": "x" } } } }),
            422,
            "invalid_workflow",
        ),
        (json!({ "workflow": { "1": { "class_type": "LoadImage", "inputs": { "image": { "__type": "core/ASSET" } } } } }), 422, "missing_asset"),
    ];
    for (body, status, code) in cases {
        let (got, err, _) = s.post_job(&body, None).await;
        assert_eq!((got, err["error"]["code"].as_str()), (status, Some(code)), "{body} → {err}");
        assert!(err["error"]["message"].as_str().is_some_and(|m| !m.is_empty()));
        assert!(err["error"].as_object().unwrap().contains_key("details"));
    }
    // Per-node details name the node and the field.
    let bad = json!({ "workflow": { "1": { "class_type": "EmptyImage", "inputs": { "width": 0, "height": 8, "batch_size": 1, "color": 0 } },
                                     "2": { "class_type": "SaveImage", "inputs": { "images": ["1", 0], "filename_prefix": "x" } } } });
    let (_, err, _) = s.post_job(&bad, None).await;
    assert_eq!(err["error"]["details"]["node_errors"]["1"][0]["field"], "width", "{err}");
    // Not JSON, and too large.
    let resp = s.http.post(s.url("/jobs")).header("content-type", "application/json").body("{nope").send().await.unwrap();
    assert_eq!(resp.status(), 400);
    assert_eq!(resp.json::<Value>().await.unwrap()["error"]["code"], "invalid_request");
    // Over the workflow size limit (max_workflow_kb, 8 MiB by default): the
    // workflow is what is too large, and the message names the setting.
    // On a connection of its own: the server answers before reading the
    // whole body and closes it, which the pooled client could reuse.
    let resp = reqwest::Client::new().post(s.url("/jobs")).body(vec![b' '; 9 << 20]).send().await.unwrap();
    assert_eq!(resp.status(), 422);
    let err = resp.json::<Value>().await.unwrap();
    assert_eq!(err["error"]["code"], "invalid_workflow");
    assert!(err["error"]["message"].as_str().unwrap().contains("max_workflow_kb"), "{err}");
    // More nodes than max_workflow_nodes (5000 by default): refused before validation.
    let many: serde_json::Map<String, Value> =
        (0..5001).map(|i| (i.to_string(), json!({ "class_type": "EmptyImage", "inputs": { "width": 8, "height": 8, "batch_size": 1, "color": 0 } }))).collect();
    let (got, err, _) = s.post_job(&json!({ "workflow": many }), None).await;
    assert_eq!((got, err["error"]["code"].as_str()), (422, Some("invalid_workflow")));
    assert!(err["error"]["message"].as_str().unwrap().contains("5001 nodes, over the limit of 5000 (max_workflow_nodes)"), "{err}");
    // Nothing above created a job.
    assert_eq!(s.get("/jobs").await.1["jobs"].as_array().unwrap().len(), 0);
    // Unknown routes and ids answer in the envelope.
    assert_eq!(s.get("/nope").await.1["error"]["code"], "not_found");
    assert_eq!(s.get("/jobs/not-a-uuid").await, (404, json!({"error": {"code": "not_found", "message": "Not found.", "details": null}})));
    assert_eq!(s.get(&format!("/jobs/{}", uuid::Uuid::new_v4())).await.0, 404);
    assert_eq!(s.get(&format!("/jobs/{}/workflow", uuid::Uuid::new_v4())).await.0, 404);
    // Segments that do not even decode: the envelope too, not a plain-text rejection.
    for path in ["/jobs/%FF", "/jobs/%FF/events", "/jobs/%C3%28/workflow", "/assets/%FF", "/assets/%FF/content"] {
        let (status, body) = s.get(path).await;
        assert_eq!((status, body["error"]["code"].as_str()), (404, Some("not_found")), "{path}: {body}");
    }
    let resp = s.http.post(s.url("/jobs/%FF/cancel")).send().await.unwrap();
    assert_eq!(resp.status(), 404);
    assert_eq!(resp.json::<Value>().await.unwrap()["error"]["code"], "not_found");
}

/// The report of the job's `HostileSecretProbe` output file.
async fn probe_report(s: &super::TestServer, job: &serde_json::Value) -> String {
    let output = job["outputs"].as_array().unwrap().iter().find(|o| o["name"].as_str().is_some_and(|n| n.starts_with("secret-probe"))).expect("probe output");
    s.http.get(output["url"].as_str().unwrap()).send().await.unwrap().text().await.unwrap()
}

#[tokio::test]
async fn extra_data_reaches_the_plugins_of_its_job_and_is_never_echoed() {
    let s = start_default().await;
    let mut workflow = trivial(2);
    workflow["9"] = json!({ "class_type": "HostileSecretProbe", "inputs": { "trigger": 1 } });
    let (status, job, _) = s.post_job(&json!({ "workflow": workflow, "extra_data": { "api_key_svc_org": "secret-key" } }), None).await;
    assert_eq!(status, 201, "{job}");
    let id = job["id"].as_str().unwrap();
    let done = s.wait(id).await;
    assert_eq!(done["status"], "succeeded", "{done}");
    // The job's plugin (granted the secret) got this job's key; another
    // job's plugin gets its own, or none.
    assert_eq!(probe_report(&s, &done).await, crate::hostile::secret_report(Some("secret-key")));
    let other = s.submit(workflow.clone()).await;
    let other = s.wait(other["id"].as_str().unwrap()).await;
    assert_eq!(probe_report(&s, &other).await, crate::hostile::secret_report(None));
    for body in [job.to_string(), s.job(id).await.to_string(), s.get(&format!("/jobs/{id}/workflow")).await.1.to_string(), s.get("/jobs").await.1.to_string()] {
        assert!(!body.contains("secret-key") && !body.contains("extra_data"), "{body}");
    }
    // Nor is it on disk.
    let mut stored = Vec::new();
    for entry in walk(s.data.path()) {
        stored.extend(std::fs::read(entry).unwrap());
    }
    assert!(!stored.windows(10).any(|w| w == b"secret-key"), "extra_data must never be persisted");
}

#[tokio::test]
async fn a_partner_key_echoed_by_a_plugin_is_redacted_from_its_error_and_log() {
    let s = start(|_, o| o.logs_on_read = true).await;
    let workflow = json!({ "9": { "class_type": "HostileSecretProbe", "inputs": { "trigger": 2 } } });
    let (status, job, _) = s.post_job(&json!({ "workflow": workflow, "extra_data": { "api_key_svc_org": "sk-echoed-77" } }), None).await;
    assert_eq!(status, 201, "{job}");
    let done = s.wait(job["id"].as_str().unwrap()).await;
    assert_eq!(done["status"], "failed", "{done}");
    assert_eq!(done["error"]["message"], "partner said 401 for key [redacted]", "{done}");
    let log = done["logs"]["text"].as_str().unwrap();
    assert!(log.contains("calling the partner with key [redacted]"), "{log}");
    assert!(!done.to_string().contains("sk-echoed-77"), "{done}");
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() { out.extend(walk(&p)) } else { out.push(p) }
    }
    out
}

#[tokio::test]
async fn workflow_returns_the_executed_graph() {
    let s = start_default().await;
    let (_, asset) = s.upload("a.png", png_bytes(4, 4, 1), None).await;
    let job = s.submit(load_save(&asset)).await;
    let (status, body) = s.get(&format!("/jobs/{}/workflow", job["id"].as_str().unwrap())).await;
    assert_eq!(status, 200);
    assert_eq!(body["format"], "api");
    assert_eq!(body["workflow"]["1"]["inputs"]["image"], "a.png", "asset references are resolved: {body}");
    assert_eq!(body["workflow"]["2"]["class_type"], "SaveImage");
}

#[tokio::test]
async fn node_failures_are_job_errors_not_http_errors() {
    let s = start_default().await;
    let job = s.submit(json!({ "7": { "class_type": "HostilePanic", "inputs": { "trigger": 1 } } })).await;
    let done = s.wait(job["id"].as_str().unwrap()).await;
    assert_eq!(done["status"], "failed");
    let e = &done["error"];
    assert_eq!((e["code"].as_str(), e["node_id"].as_str(), e["class_type"].as_str()), (Some("node_crashed"), Some("7"), Some("HostilePanic")), "{done}");
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()));
    // The server carries on.
    let ok = s.submit(trivial(3)).await;
    assert_eq!(s.wait(ok["id"].as_str().unwrap()).await["status"], "succeeded");
}

#[tokio::test]
async fn self_hosted_jobs_capture_logs_but_reads_leave_them_out() {
    let s = start_default().await;
    let job = s.submit(json!({ "1": { "class_type": "HostileChatty", "inputs": { "trigger": 1 } } })).await;
    let done = s.wait(job["id"].as_str().unwrap()).await;
    assert_eq!(done["status"], "succeeded", "{done}");
    assert!(done.get("logs").is_none(), "absent, not null, on a self-hosted job: {done}");
    // Captured all the same: the stored record has it.
    let (record, _) = s.server.state.service.get("local", job["id"].as_str().unwrap()).await.unwrap();
    assert!(record.logs.is_some_and(|l| l.text.contains("line 19999 of noise")));
}

#[tokio::test]
async fn the_job_log_is_on_get_only() {
    let s = start(|_, o| o.logs_on_read = true).await;
    let job = s.submit(json!({ "1": { "class_type": "HostileChatty", "inputs": { "trigger": 1 } } })).await;
    let id = job["id"].as_str().unwrap();
    let done = s.wait(id).await;
    let logs = &done["logs"];
    // ~760 KB of output against the suite's 16 KiB node log: the tail is
    // kept, and the log says it is one.
    let text = logs["text"].as_str().unwrap();
    assert_eq!(logs["truncated"], true, "{logs}");
    assert!(text.trim_end().ends_with("[1 HostileChatty] line 19999 of noise from a chatty plugin"), "the tail: {}", &text[text.len().saturating_sub(200)..]);
    assert!(text.starts_with("[1 HostileChatty] [kiln: ") && text.contains("earlier bytes of output dropped]"), "{}", &text[..200.min(text.len())]);
    assert!(text.len() < 32 << 10, "bounded (16 KiB of output plus line prefixes): {} bytes", text.len());
    assert!(logs["captured_at"].as_str().unwrap().ends_with("+00:00"));
    // A short log is whole.
    let quiet = s.submit(trivial(4)).await;
    let quiet = s.wait(quiet["id"].as_str().unwrap()).await;
    assert_eq!((quiet["logs"]["text"].as_str(), quiet["logs"]["truncated"].as_bool()), (Some(""), Some(false)), "{quiet}");
    let cancel = s.http.post(s.url(&format!("/jobs/{id}/cancel"))).send().await.unwrap().json::<Value>().await.unwrap();
    assert!(cancel.get("logs").is_none());
    assert!(s.get("/jobs").await.1["jobs"].as_array().unwrap().iter().all(|j| j.get("logs").is_none()));
}

#[tokio::test]
async fn cancel_queued_running_finished_and_unknown() {
    let s = start(|_, o| o.max_running_jobs = 1).await;
    let running = s.submit(spinner(1)).await;
    let rid = running["id"].as_str().unwrap();
    s.wait_for(rid, "running").await;
    let queued = s.submit(trivial(4)).await;
    let qid = queued["id"].as_str().unwrap();
    assert_eq!(s.job(qid).await["queue_position"], 1);
    // Metrics are null until known, and present as keys all along.
    assert_eq!(queued["metrics"], json!({ "queue_ms": null, "execution_ms": null }), "{queued}");
    let running_now = s.job(rid).await;
    assert!(running_now["metrics"]["queue_ms"].is_u64() && running_now["metrics"]["execution_ms"].is_null(), "{running_now}");

    let cancel = |id: String| {
        let http = s.http.clone();
        let url = s.url(&format!("/jobs/{id}/cancel"));
        async move {
            let resp = http.post(url).send().await.unwrap();
            (resp.status().as_u16(), resp.json::<Value>().await.unwrap())
        }
    };
    let (status, body) = cancel(qid.into()).await;
    assert_eq!((status, body["status"].as_str()), (200, Some("canceled")), "{body}");
    // It waited, and never executed.
    assert!(body["metrics"]["queue_ms"].is_u64() && body["metrics"]["execution_ms"].is_null(), "{body}");
    let (status, body) = cancel(rid.into()).await;
    assert_eq!(status, 200);
    assert!(["canceling", "canceled"].contains(&body["status"].as_str().unwrap()), "{body}");
    // The node really stops: long before its 2 s limit, and not as a timeout.
    let started = std::time::Instant::now();
    let done = s.wait(rid).await;
    assert_eq!(done["status"], "canceled", "{done}");
    assert!(started.elapsed() < std::time::Duration::from_millis(1500), "cancel took {:?}", started.elapsed());
    // Finished jobs are unchanged; unknown ids are 404.
    assert_eq!(cancel(rid.into()).await.1["status"], "canceled");
    assert_eq!(cancel(uuid::Uuid::new_v4().to_string()).await.0, 404);
    let ok = s.submit(trivial(5)).await;
    let ok_id = ok["id"].as_str().unwrap().to_string();
    s.wait(&ok_id).await;
    assert_eq!(cancel(ok_id).await.1["status"], "succeeded");
}

#[tokio::test]
async fn list_is_newest_first_with_cursor_paging_and_filters() {
    let s = start_default().await;
    let mut ids = Vec::new();
    for i in 0..5 {
        let (status, job, _) = s.post_job(&json!({ "workflow": trivial(i), "metadata": { "batch": if i % 2 == 0 { "even" } else { "odd" } } }), None).await;
        assert_eq!(status, 201);
        ids.push(job["id"].as_str().unwrap().to_string());
    }
    for id in &ids {
        s.wait(id).await;
    }
    let mut seen = Vec::new();
    let mut cursor = String::new();
    loop {
        let (status, page) = s.get(&format!("/jobs?limit=2&cursor={cursor}")).await;
        assert_eq!(status, 200, "{page}");
        for item in page["jobs"].as_array().unwrap() {
            assert!(item["id"].is_string() && item["status"].is_string() && item["create_time"].is_string() && item["update_time"].is_string());
            seen.push(item["id"].as_str().unwrap().to_string());
        }
        match page.get("next_cursor").and_then(Value::as_str) {
            Some(c) => cursor = c.to_string(),
            None => break,
        }
    }
    let newest_first: Vec<String> = ids.iter().rev().cloned().collect();
    assert_eq!(seen, newest_first, "every job once, newest first");
    let (_, odd) = s.get("/jobs?metadata%5Bbatch%5D=odd").await;
    assert_eq!(odd["jobs"].as_array().unwrap().len(), 2);
    let (_, done) = s.get("/jobs?status=succeeded,failed").await;
    assert_eq!(done["jobs"].as_array().unwrap().len(), 5);
    assert_eq!(s.get("/jobs?status=queued").await.1["jobs"].as_array().unwrap().len(), 0);
    assert_eq!(s.get("/jobs?limit=101").await.0, 400);
    assert_eq!(s.get("/jobs?status=bogus").await.0, 400);
    for bad in ["zz", "00", "abcd", &"00".repeat(44)] {
        let (status, body) = s.get(&format!("/jobs?cursor={bad}")).await;
        assert_eq!((status, body["error"]["code"].as_str()), (400, Some("invalid_cursor")), "{bad}");
    }
    // Filters AND; a job needs every label with exactly that value.
    let (_, none) = s.get("/jobs?metadata%5Bbatch%5D=odd&metadata%5Bother%5D=x").await;
    assert_eq!(none["jobs"].as_array().unwrap().len(), 0);
    // Filters the platform refuses are refused here, whatever else the query holds.
    for bad in [
        "metadata=",
        "status=queued&metadata=5",
        "metadata%5Bbatch%5D=odd&metadata%5Bbatch%5D=even",
        "metadata%5Ba%5D=1&metadata%5Bb%5D=1&metadata%5Bc%5D=1&metadata%5Bd%5D=1",
        "metadata%5Bbad%20key%5D=1",
        "metadata%5Bbatch%5D=%E2%80%AEodd",
        "metadata%5Bbatch%5D=odd;limit=2",
        "metadata%5Bbatch%5D=%zz",
        "metadata%5Bbatch%5D=%FF",
    ] {
        let (status, body) = s.get(&format!("/jobs?{bad}")).await;
        assert_eq!((status, body["error"]["code"].as_str()), (400, Some("invalid_metadata_filter")), "{bad}: {body}");
    }
    let (status, body) = s.get("/jobs?limit=2;cursor=").await;
    assert_eq!((status, body["error"]["code"].as_str()), (400, Some("invalid_request")), "{body}");
}

#[tokio::test]
async fn a_full_queue_answers_429_with_retry_after() {
    let s = start(|_, o| {
        o.max_running_jobs = 1;
        o.max_queued_jobs = 1;
    })
    .await;
    let running = s.submit(spinner(2)).await;
    s.wait_for(running["id"].as_str().unwrap(), "running").await;
    let queued = s.submit(trivial(1)).await;
    let (status, err, headers) = s.post_job(&json!({ "workflow": trivial(2) }), Some("key-q")).await;
    assert_eq!((status, err["error"]["code"].as_str()), (429, Some("queue_full")), "{err}");
    let retry: u64 = headers["retry-after"].to_str().unwrap().parse().expect("integer Retry-After");
    assert!(retry >= 1);
    // The key was released: once there is room, the same key goes through.
    s.http.post(s.url(&format!("/jobs/{}/cancel", queued["id"].as_str().unwrap()))).send().await.unwrap();
    let (status, job, _) = s.post_job(&json!({ "workflow": trivial(2) }), Some("key-q")).await;
    assert_eq!(status, 201, "{job}");
}

#[tokio::test]
async fn links_carry_the_mount_prefix() {
    // Written sloppily on purpose: the prefix is normalized.
    let s = start(|c, _| c.mount_prefix = "deployment/x/".into()).await;
    assert!(s.base.ends_with("/deployment/x/api/v2"));
    let job = s.submit(trivial(1)).await;
    let id = job["id"].as_str().unwrap();
    assert_eq!(job["urls"]["self"], format!("/deployment/x/api/v2/jobs/{id}"));
    assert_eq!(job["urls"]["events"], format!("/deployment/x/api/v2/jobs/{id}/events"));
    let done = s.wait(id).await;
    let url = done["outputs"][0]["url"].as_str().unwrap();
    assert!(url.contains("/deployment/x/api/v2/assets/"), "{url}");
    assert_eq!(s.http.get(url).send().await.unwrap().status(), 200);
    // Links resolve against the request origin.
    let origin = s.base.split("/deployment").next().unwrap().to_string();
    let polled = s.http.get(format!("{origin}{}", job["urls"]["self"].as_str().unwrap())).send().await.unwrap();
    assert_eq!(polled.status(), 200);
    // Without the prefix there is nothing.
    assert_eq!(s.http.get(format!("{origin}/api/v2/jobs/{id}")).send().await.unwrap().status(), 404);
}
