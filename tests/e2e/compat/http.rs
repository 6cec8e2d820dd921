//! Compatibility HTTP routes: every route at `/api/x` and `/x`, against
//! the shapes of the reference captures (keys, types, statuses), and round
//! trips with `/api/v2` (one job service behind both).

use std::time::Duration;

use serde_json::{Value, json};

use crate::api::{TestServer, png_bytes, spinner, start, start_default, trivial};

const CAPTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/comfyui/captures");

/// A capture's exchange.
fn capture(name: &str) -> Value {
    let text = std::fs::read_to_string(format!("{CAPTURES}/{name}")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// The JSON type of a value, for shape comparisons.
fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// `ours` has every key of `theirs` with a value of the same JSON type,
/// recursively through objects (and through the first element of arrays).
fn assert_shape(ours: &Value, theirs: &Value, at: &str) {
    match (ours, theirs) {
        (Value::Object(o), Value::Object(t)) => {
            for (k, tv) in t {
                let ov = o.get(k).unwrap_or_else(|| panic!("{at}.{k} missing in {ours}"));
                assert_shape(ov, tv, &format!("{at}.{k}"));
            }
        }
        (Value::Array(o), Value::Array(t)) => {
            if let (Some(o0), Some(t0)) = (o.first(), t.first()) {
                assert_shape(o0, t0, &format!("{at}[0]"));
            }
        }
        // A nullable value (ComfyUI writes null where it has none).
        (_, Value::Null) | (Value::Null, _) => {}
        _ => assert_eq!(kind(ours), kind(theirs), "{at}: {ours} vs {theirs}"),
    }
}

/// Paths under the server root.
fn root(s: &TestServer, path: &str) -> String {
    format!("{}{path}", s.server.url())
}

async fn get(s: &TestServer, path: &str) -> (u16, Value) {
    let resp = s.http.get(root(s, path)).send().await.unwrap();
    (resp.status().as_u16(), resp.json().await.unwrap_or(Value::Null))
}

async fn post(s: &TestServer, path: &str, body: &Value) -> (u16, Value) {
    let resp = s.http.post(root(s, path)).json(body).send().await.unwrap();
    (resp.status().as_u16(), resp.json().await.unwrap_or(Value::Null))
}

async fn upload(s: &TestServer, path: &str, name: &str, bytes: Vec<u8>, fields: &[(&str, &str)]) -> (u16, Value) {
    let mut form =
        reqwest::multipart::Form::new().part("image", reqwest::multipart::Part::bytes(bytes).file_name(name.to_string()).mime_str("image/png").unwrap());
    for (k, v) in fields {
        form = form.text(k.to_string(), v.to_string());
    }
    let resp = s.http.post(root(s, path)).multipart(form).send().await.unwrap();
    (resp.status().as_u16(), resp.json().await.unwrap_or(Value::Null))
}

/// LoadImage(name) → ImageBlur → SaveImage, as in the captures.
fn blur(image: &str, radius: Value) -> Value {
    json!({
        "1": { "class_type": "LoadImage", "inputs": { "image": image } },
        "2": { "class_type": "ImageBlur", "inputs": { "image": ["1", 0], "blur_radius": radius, "sigma": 1.0 } },
        "3": { "class_type": "SaveImage", "inputs": { "images": ["2", 0], "filename_prefix": "anchor_blur" } },
    })
}

/// Polls `/api/job/{id}/status` until a terminal value.
async fn wait_status(s: &TestServer, id: &str) -> String {
    for _ in 0..600 {
        let (code, body) = get(s, &format!("/api/job/{id}/status")).await;
        assert_eq!(code, 200, "{body}");
        let status = body["status"].as_str().unwrap().to_string();
        if ["success", "error", "non_retryable_error", "lost", "cancelled"].contains(&status.as_str()) {
            return status;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{id} did not finish");
}

#[tokio::test]
async fn upload_then_prompt_runs_and_is_a_v2_job() {
    let s = start_default().await;
    // The capture's upload answer: {name, subfolder, type}.
    let (code, up) = upload(&s, "/upload/image", "anchor.png", png_bytes(16, 16, 1), &[("overwrite", "true")]).await;
    assert_eq!(code, 200, "{up}");
    assert_shape(&up, &capture("http-a-upload-image.json")["body_json"], "upload");
    assert_eq!(up, json!({ "name": "anchor.png", "subfolder": "", "type": "input" }));
    // The same bytes again: the same name; other bytes: renamed; overwrite: kept.
    let (_, again) = upload(&s, "/api/upload/image", "anchor.png", png_bytes(16, 16, 1), &[]).await;
    assert_eq!(again["name"], "anchor.png");
    let (_, other) = upload(&s, "/api/upload/image", "anchor.png", png_bytes(16, 16, 2), &[]).await;
    assert_eq!(other["name"], "anchor (1).png");
    let (_, over) = upload(&s, "/api/upload/image", "anchor.png", png_bytes(16, 16, 3), &[("overwrite", "1")]).await;
    assert_eq!(over["name"], "anchor.png");
    // Overwritten back with the first bytes: the name shows them again.
    let (_, back) = upload(&s, "/api/upload/image", "anchor.png", png_bytes(16, 16, 1), &[("overwrite", "true")]).await;
    assert_eq!(back["name"], "anchor.png");
    let (_, same) = upload(&s, "/api/upload/image", "anchor.png", png_bytes(16, 16, 1), &[]).await;
    assert_eq!(same["name"], "anchor.png", "the first bytes are under the name again");
    let (_, sub) = upload(&s, "/api/upload/image", "anchor.png", png_bytes(16, 16, 1), &[("subfolder", "clipspace"), ("type", "temp")]).await;
    assert_eq!(sub, json!({ "name": "anchor.png", "subfolder": "clipspace", "type": "temp" }));
    for bad in [vec![("type", "bogus")], vec![("subfolder", "../x")]] {
        let (code, body) = upload(&s, "/api/upload/image", "x.png", png_bytes(4, 4, 1), &bad).await;
        assert_eq!(code, 400, "{bad:?} {body}");
    }
    let (code, _) = upload(&s, "/api/upload/image", "../evil.png", png_bytes(4, 4, 1), &[]).await;
    assert_eq!(code, 400);

    // The capture's prompt answer; the job is a v2 job.
    let (code, queued) = post(&s, "/prompt", &json!({ "prompt": blur("anchor (1).png", json!(5)), "client_id": "c1" })).await;
    assert_eq!(code, 200, "{queued}");
    assert_shape(&queued, &capture("http-a-post-prompt.json")["body_json"], "prompt");
    assert_eq!(queued["node_errors"], json!({}));
    let id = queued["prompt_id"].as_str().unwrap();
    let job = s.wait(id).await;
    assert_eq!(job["status"], "succeeded", "{job}");
    assert_eq!(wait_status(&s, id).await, "success");

    // History: the capture's shape; its output viewable through a signed URL.
    let (code, history) = get(&s, &format!("/history/{id}")).await;
    assert_eq!(code, 200);
    let item = &history[id];
    let reference = capture("http-e-history-a.json")["body_json"].as_object().unwrap().values().next().unwrap().clone();
    assert_shape(item, &reference, "history");
    let names = |v: &Value| v["status"]["messages"].as_array().unwrap().iter().map(|m| m[0].clone()).collect::<Vec<_>>();
    assert_eq!(names(item), names(&reference));
    assert_eq!(item["prompt"][1], id);
    assert_eq!(item["prompt"][3]["client_id"], "c1");
    assert_eq!(item["prompt"][4], json!(["3"]));
    assert_eq!(item["status"]["status_str"], "success");
    let image = &item["outputs"]["3"]["images"][0];
    assert_eq!(image["type"], "output");
    let filename = image["filename"].as_str().unwrap();
    assert!(filename.starts_with("anchor_blur_") && filename.ends_with(".png"), "{filename}");
    let no_redirect = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let resp = no_redirect.get(root(&s, &format!("/view?filename={filename}&subfolder=&type=output&rand=0.5"))).send().await.unwrap();
    assert_eq!(resp.status(), 302);
    let location = resp.headers()["location"].to_str().unwrap().to_string();
    assert!(location.contains("/api/v2/signed/assets/"), "{location}");
    let bytes = reqwest::get(&location).await.unwrap();
    assert_eq!(bytes.status(), 200);
    assert_eq!(&bytes.bytes().await.unwrap()[..4], b"\x89PNG");
    // The uploaded input too, by its annotated name.
    let resp = no_redirect.get(root(&s, "/api/view?filename=anchor%20(1).png%20[input]")).send().await.unwrap();
    assert_eq!(resp.status(), 302);
    // Traversal and unknown files.
    for (query, status) in
        [("filename=../x.png", 400), ("filename=x.png&subfolder=../..", 400), ("filename=x.png&type=bogus", 400), ("filename=nope.png", 404), ("", 404)]
    {
        let resp = no_redirect.get(root(&s, &format!("/api/view?{query}"))).send().await.unwrap();
        assert_eq!(resp.status(), status, "{query}");
    }
    // `{}` for an unknown id, as ComfyUI answers.
    let (code, unknown) = get(&s, &format!("/api/history/{}", uuid::Uuid::new_v4())).await;
    assert_eq!((code, unknown), (200, json!({})));
}

#[tokio::test]
async fn validation_failures_have_comfyuis_shapes() {
    let s = start_default().await;
    upload(&s, "/upload/image", "anchor.png", png_bytes(8, 8, 1), &[]).await;
    let cases = [
        ("http-c1-value-above-max.json", json!({ "prompt": blur("anchor.png", json!(100)) })),
        ("http-c1b-value-below-min.json", {
            let mut p = blur("anchor.png", json!(5));
            p["2"]["inputs"]["sigma"] = json!(0.0);
            json!({ "prompt": p })
        }),
        ("http-c7-wrong-value-type.json", json!({ "prompt": blur("anchor.png", json!("abc")) })),
        ("http-c8-missing-image-file.json", json!({ "prompt": blur("does_not_exist.png", json!(5)) })),
        ("http-c4-no-prompt-key.json", json!({ "client_id": "x" })),
        ("http-c11-empty-prompt.json", json!({ "prompt": {} })),
        ("http-c5-no-output-node.json", json!({ "prompt": { "1": { "class_type": "LoadImage", "inputs": { "image": "anchor.png" } } } })),
        (
            "http-c2-missing-required-input.json",
            json!({ "prompt": {
                "1": { "class_type": "LoadImage", "inputs": { "image": "anchor.png" } },
                "2": { "class_type": "ImageBlur", "inputs": { "image": ["1", 0], "blur_radius": 5 } },
                "3": { "class_type": "SaveImage", "inputs": { "images": ["2", 0], "filename_prefix": "x" } },
            } }),
        ),
        (
            "http-c9-link-type-mismatch.json",
            json!({ "prompt": {
                "1": { "class_type": "LoadImage", "inputs": { "image": "anchor.png" } },
                "2": { "class_type": "ImageBlur", "inputs": { "image": ["1", 0], "blur_radius": ["1", 0], "sigma": 1.0 } },
                "3": { "class_type": "SaveImage", "inputs": { "images": ["2", 0], "filename_prefix": "x" } },
            } }),
        ),
    ];
    for (file, body) in cases {
        let reference = capture(file);
        let (code, ours) = post(&s, "/api/prompt", &body).await;
        assert_eq!(code, reference["status"].as_u64().unwrap() as u16, "{file}: {ours}");
        let theirs = &reference["body_json"];
        assert_shape(&ours, theirs, file);
        assert_eq!(ours["error"]["type"], theirs["error"]["type"], "{file}: {ours}");
        let node_ids = |v: &Value| v["node_errors"].as_object().unwrap().keys().cloned().collect::<Vec<_>>();
        assert_eq!(node_ids(&ours), node_ids(theirs), "{file}: {ours}");
        for (node, entry) in theirs["node_errors"].as_object().unwrap() {
            let ours = &ours["node_errors"][node];
            assert_eq!(ours["class_type"], entry["class_type"], "{file}");
            assert_eq!(ours["dependent_outputs"], entry["dependent_outputs"], "{file}");
            assert_eq!(ours["errors"][0]["type"], entry["errors"][0]["type"], "{file}");
            assert_eq!(ours["errors"][0]["message"], entry["errors"][0]["message"], "{file}");
            assert_eq!(ours["errors"][0]["details"], entry["errors"][0]["details"], "{file}");
            assert_eq!(ours["errors"][0]["extra_info"]["input_name"], entry["errors"][0]["extra_info"]["input_name"], "{file}");
        }
    }
    // An unknown class: ComfyUI 0.27's `missing_node_type`, whole prompt refused.
    let mut unknown = blur("anchor.png", json!(5));
    unknown["2"]["class_type"] = json!("NoSuchNode");
    let (code, body) = post(&s, "/prompt", &json!({ "prompt": unknown })).await;
    assert_eq!(code, 400);
    assert_shape(&body, &capture("http-c3-unknown-class.json")["body_json"], "unknown class");
    assert_eq!(body["error"]["type"], "missing_node_type");
    assert_eq!(body["error"]["details"], "Node ID '#2'");
    assert_eq!(body["error"]["extra_info"]["class_type"], "NoSuchNode");
    // Partial validation: the valid output runs, the other is reported.
    let mut partial = blur("anchor.png", json!(5));
    partial["4"] = json!({ "class_type": "SaveImage", "inputs": { "images": ["5", 0], "filename_prefix": "y" } });
    partial["5"] = json!({ "class_type": "ImageBlur", "inputs": { "image": ["1", 0], "blur_radius": 100, "sigma": 1.0 } });
    let (code, body) = post(&s, "/prompt", &json!({ "prompt": partial })).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["node_errors"]["5"]["errors"][0]["type"], "value_bigger_than_max");
    assert_eq!(body["node_errors"]["5"]["dependent_outputs"], json!(["4"]));
    let partial_id = body["prompt_id"].as_str().unwrap();
    assert_eq!(s.wait(partial_id).await["status"], "succeeded");
    let (_, history) = get(&s, &format!("/history/{partial_id}")).await;
    assert_eq!(history[partial_id]["prompt"][4], json!(["3"]), "only the outputs that ran");
    // Malformed JSON and a non-canonical prompt_id: 400.
    let resp = s.http.post(root(&s, "/prompt")).header("content-type", "application/json").body("{nope").send().await.unwrap();
    assert_eq!(resp.status(), 400);
    let (code, body) = post(&s, "/prompt", &json!({ "prompt": trivial(1), "prompt_id": "NOT-A-UUID" })).await;
    assert_eq!((code, body["error"]["type"].as_str()), (400, Some("invalid_prompt_id")));
}

#[tokio::test]
async fn numbers_front_and_client_prompt_ids() {
    let s = start_default().await;
    let (_, a) = post(&s, "/prompt", &json!({ "prompt": trivial(1) })).await;
    let (_, rejected) = post(&s, "/prompt", &json!({ "prompt": {} })).await;
    assert_eq!(rejected["error"]["type"], "prompt_no_outputs");
    let (_, b) = post(&s, "/prompt", &json!({ "prompt": trivial(2) })).await;
    let (a_n, b_n) = (a["number"].as_i64().unwrap(), b["number"].as_i64().unwrap());
    assert_eq!(b_n, a_n + 2, "a rejected prompt takes a number too");
    let (_, front) = post(&s, "/prompt", &json!({ "prompt": trivial(3), "front": true })).await;
    assert!(front["number"].as_i64().unwrap() < 0, "{front}");
    let (_, given) = post(&s, "/prompt", &json!({ "prompt": trivial(4), "number": 7.5 })).await;
    assert_eq!(given["number"], json!(7.5));
    let chosen = uuid::Uuid::new_v4().to_string();
    let (code, body) = post(&s, "/prompt", &json!({ "prompt": trivial(5), "prompt_id": chosen })).await;
    assert_eq!((code, body["prompt_id"].as_str()), (200, Some(chosen.as_str())));
    assert_eq!(s.wait(&chosen).await["status"], "succeeded");
    let (code, _) = post(&s, "/prompt", &json!({ "prompt": trivial(6), "prompt_id": chosen })).await;
    assert_eq!(code, 400, "a prompt_id in use");
    // `number` in the history tuple is the one the prompt got.
    let (_, history) = get(&s, &format!("/api/history/{chosen}")).await;
    assert_eq!(history[&chosen]["prompt"][0], body_number(&s, &chosen).await);
}

async fn body_number(s: &TestServer, id: &str) -> Value {
    let (_, queue) = get(s, "/api/jobs?limit=100").await;
    queue["jobs"].as_array().unwrap().iter().find(|j| j["id"] == id).unwrap()["priority"].clone()
}

#[tokio::test]
async fn queue_interrupt_and_cancel_on_running_and_pending_jobs() {
    let s = start_default().await; // two workers
    let mut ids = Vec::new();
    for n in 0..3 {
        let (code, body) = post(&s, "/api/prompt", &json!({ "prompt": spinner(n), "client_id": "q" })).await;
        assert_eq!(code, 200, "{body}");
        ids.push(body["prompt_id"].as_str().unwrap().to_string());
    }
    // One submitted on v2 is in the same queue.
    let v2 = s.submit(spinner(9)).await;
    let v2_id = v2["id"].as_str().unwrap().to_string();
    s.wait_for(&ids[0], "running").await;
    s.wait_for(&ids[1], "running").await;
    let (code, queue) = get(&s, "/queue").await;
    assert_eq!(code, 200);
    assert_shape(&queue, &capture("http-e-queue-running-pending.json")["body_json"], "queue");
    let running: Vec<&Value> = queue["queue_running"].as_array().unwrap().iter().collect();
    let pending: Vec<&Value> = queue["queue_pending"].as_array().unwrap().iter().collect();
    assert_eq!(running.len(), 2, "{queue}");
    assert!(running.iter().chain(&pending).all(|e| e.as_array().unwrap().len() == 5));
    assert_eq!(pending.iter().map(|e| e[1].as_str().unwrap()).collect::<Vec<_>>(), [ids[2].as_str(), v2_id.as_str()]);
    assert_eq!(pending[0][3]["client_id"], "q");
    assert_eq!(pending[0][4], json!(["1"]));
    let (_, remaining) = get(&s, "/api/prompt").await;
    assert_shape(&remaining, &capture("http-e-get-prompt.json")["body_json"], "GET /prompt");
    assert_eq!(remaining["exec_info"]["queue_remaining"], 4);
    let (_, status) = get(&s, &format!("/api/job/{}/status", ids[2])).await;
    assert_eq!(status["status"], "queued_waiting");
    let (_, status) = get(&s, &format!("/api/job/{}/status", ids[0])).await;
    assert!(["preparing", "executing"].contains(&status["status"].as_str().unwrap()), "{status}");

    // delete: a pending one (v2's) and a running one (the spec's rule).
    let resp = s.http.post(root(&s, "/api/queue")).json(&json!({ "delete": [v2_id, ids[1]] })).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.bytes().await.unwrap().is_empty());
    assert_eq!(s.wait(&v2_id).await["status"], "canceled");
    assert_eq!(s.wait(&ids[1]).await["status"], "canceled");
    assert_eq!(wait_status(&s, &ids[1]).await, "cancelled");
    // interrupt one prompt by id (the hostile spinners stop at their 2 s
    // limit by themselves: only fresh ones are relied on to be running).
    s.wait_for(&ids[2], "running").await;
    let resp = s.http.post(root(&s, "/interrupt")).json(&json!({ "prompt_id": ids[2] })).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(s.wait(&ids[2]).await["status"], "canceled");
    assert_ne!(s.wait(&ids[0]).await["status"], "canceled", "only the named prompt");
    // Without a prompt id: every running job.
    let a = post(&s, "/prompt", &json!({ "prompt": spinner(10) })).await.1["prompt_id"].as_str().unwrap().to_string();
    let b = post(&s, "/prompt", &json!({ "prompt": spinner(11) })).await.1["prompt_id"].as_str().unwrap().to_string();
    s.wait_for(&a, "running").await;
    s.wait_for(&b, "running").await;
    let resp = s.http.post(root(&s, "/api/interrupt")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(s.wait(&a).await["status"], "canceled");
    assert_eq!(s.wait(&b).await["status"], "canceled");
    let (_, queue) = get(&s, "/api/queue").await;
    assert_eq!(queue, json!({ "queue_running": [], "queue_pending": [] }));

    // clear: every pending job.
    let a = post(&s, "/prompt", &json!({ "prompt": spinner(20) })).await.1["prompt_id"].as_str().unwrap().to_string();
    let b = post(&s, "/prompt", &json!({ "prompt": spinner(21) })).await.1["prompt_id"].as_str().unwrap().to_string();
    let c = post(&s, "/prompt", &json!({ "prompt": spinner(22) })).await.1["prompt_id"].as_str().unwrap().to_string();
    s.wait_for(&a, "running").await;
    s.wait_for(&b, "running").await;
    post(&s, "/queue", &json!({ "clear": true })).await;
    assert_eq!(s.wait(&c).await["status"], "canceled");
    assert_ne!(s.job(&a).await["status"], "canceled", "clear leaves running jobs");
    post(&s, "/interrupt", &json!({})).await;
    s.wait(&a).await;
    s.wait(&b).await;
}

#[tokio::test]
async fn history_lists_v2_jobs_and_forgets_on_request() {
    let s = start_default().await;
    let mut ids = Vec::new();
    for n in 0..3 {
        let job = s.submit(trivial(n)).await;
        let id = job["id"].as_str().unwrap().to_string();
        s.wait(&id).await;
        ids.push(id);
    }
    let (code, all) = get(&s, "/history").await;
    assert_eq!(code, 200);
    assert_eq!(all.as_object().unwrap().keys().cloned().collect::<Vec<_>>(), ids, "oldest first");
    let (_, last) = get(&s, "/history?max_items=2").await;
    assert_eq!(last.as_object().unwrap().keys().cloned().collect::<Vec<_>>(), ids[1..]);
    let (_, page) = get(&s, "/api/history?max_items=1&offset=1").await;
    assert_eq!(page.as_object().unwrap().keys().cloned().collect::<Vec<_>>(), ids[1..2]);
    assert_eq!(get(&s, "/history?max_items=x").await.0, 400);
    let item = &all[&ids[0]];
    assert_eq!(item["outputs"]["2"]["images"][0]["type"], "output");
    assert_eq!(item["status"]["messages"][2][0], "execution_success");
    // The jobs API of the local engine.
    let (_, list) = get(&s, "/api/jobs?status=completed,failed,cancelled&limit=2&offset=0").await;
    assert_eq!(list["pagination"], json!({ "offset": 0, "limit": 2, "total": 3, "has_more": true }));
    assert_eq!(list["jobs"][0]["id"], ids[2], "newest first");
    assert_eq!(list["jobs"][0]["status"], "completed");
    assert!(list["jobs"][0]["create_time"].is_number() && list["jobs"][0]["outputs_count"] == 1);
    let preview = &list["jobs"][0]["preview_output"];
    assert_eq!((preview["nodeId"].as_str(), preview["mediaType"].as_str(), preview["type"].as_str()), (Some("2"), Some("images"), Some("output")), "{preview}");
    let (code, err) = get(&s, "/api/jobs?status=bogus").await;
    assert_eq!(code, 400);
    assert!(err["error"].as_str().unwrap().starts_with("Invalid status value(s): bogus"));
    assert_eq!(get(&s, "/api/jobs?limit=0").await, (400, json!({ "error": "limit must be a positive integer" })));
    let (code, detail) = get(&s, &format!("/api/jobs/{}", ids[0])).await;
    assert_eq!(code, 200);
    assert_eq!(detail["execution_status"]["status_str"], "success");
    assert!(detail["workflow"]["prompt"]["1"].is_object());
    assert_eq!(get(&s, &format!("/api/jobs/{}", uuid::Uuid::new_v4())).await, (404, json!({ "error": "Job not found" })));
    assert_eq!(get(&s, "/jobs").await.0, 404, "/api/jobs only under /api");
    assert_eq!(post(&s, &format!("/api/jobs/{}/cancel", ids[0]), &json!({})).await.1, json!({ "cancelled": false }));
    assert_eq!(post(&s, "/api/jobs/cancel", &json!({ "job_ids": "x" })).await.0, 400);
    // delete and clear.
    post(&s, "/history", &json!({ "delete": [ids[0]] })).await;
    let (_, all) = get(&s, "/history").await;
    assert_eq!(all.as_object().unwrap().len(), 2);
    assert_eq!(s.job(&ids[0]).await["status"], "expired");
    post(&s, "/api/history", &json!({ "clear": true })).await;
    assert_eq!(get(&s, "/history").await.1, json!({}));
}

#[tokio::test]
async fn object_info_is_cached_compressed_and_follows_uploads() {
    let s = start_default().await;
    let (code, all) = get(&s, "/api/object_info").await;
    assert_eq!(code, 200);
    assert!(all["SaveImage"]["input"]["required"]["images"].is_array());
    let resp = s.http.get(root(&s, "/object_info")).send().await.unwrap();
    let etag = resp.headers()["etag"].to_str().unwrap().to_string();
    let not_modified = s.http.get(root(&s, "/object_info")).header("if-none-match", &etag).send().await.unwrap();
    assert_eq!(not_modified.status(), 304);
    let gz = s.http.get(root(&s, "/api/object_info")).header("accept-encoding", "gzip").send().await.unwrap();
    assert_eq!(gz.headers()["content-encoding"], "gzip");
    assert_eq!(&gz.bytes().await.unwrap()[..2], b"\x1f\x8b");
    // An upload shows in LoadImage's list and changes the ETag.
    upload(&s, "/upload/image", "fresh.png", png_bytes(4, 4, 9), &[]).await;
    let resp = s.http.get(root(&s, "/object_info")).header("if-none-match", &etag).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_ne!(resp.headers()["etag"].to_str().unwrap(), etag);
    let (_, one) = get(&s, "/api/object_info/LoadImage").await;
    assert!(one["LoadImage"]["input"]["required"]["image"][0].as_array().unwrap().contains(&json!("fresh.png")), "{one}");
    assert_eq!(get(&s, "/object_info/NoSuchNode").await, (200, json!({})));
}

/// An upload deleted through the Jobs API leaves ComfyUI's names at once:
/// LoadImage's list, and a prompt naming it.
#[tokio::test]
async fn an_upload_deleted_through_the_jobs_api_leaves_the_compat_names_at_once() {
    let s = start_default().await;
    let bytes = png_bytes(4, 4, 11);
    upload(&s, "/upload/image", "gone.png", bytes.clone(), &[]).await;
    let listed = |info: &Value| info["LoadImage"]["input"]["required"]["image"][0].as_array().unwrap().contains(&json!("gone.png"));
    assert!(listed(&get(&s, "/api/object_info/LoadImage").await.1));
    // Its asset, found by its bytes.
    let hash = format!("blake3:{}", blake3::hash(&bytes).to_hex());
    let found = s.http.post(s.url("/assets/from-hash")).json(&json!({ "hash": hash, "file_path": "gone.png" })).send().await.unwrap();
    assert_eq!(found.status(), 200, "the upload's own record");
    let id = found.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_string();
    assert_eq!(s.http.delete(s.url(&format!("/assets/{id}"))).send().await.unwrap().status(), 204);
    assert!(!listed(&get(&s, "/api/object_info/LoadImage").await.1), "no longer listed");
    let load = json!({ "prompt": {
        "1": { "class_type": "LoadImage", "inputs": { "image": "gone.png" } },
        "2": { "class_type": "SaveImage", "inputs": { "images": ["1", 0], "filename_prefix": "g" } },
    } });
    let (code, body) = post(&s, "/api/prompt", &load).await;
    assert_eq!(code, 400, "a prompt naming it is refused: {body}");
}

#[tokio::test]
async fn a_mask_upload_replaces_the_alpha_of_its_original() {
    let s = start_default().await;
    upload(&s, "/upload/image", "photo.png", png_bytes(4, 4, 5), &[]).await;
    let mask = {
        let mut out = Vec::new();
        let mut e = png::Encoder::new(&mut out, 4, 4);
        e.set_color(png::ColorType::Rgba);
        e.set_depth(png::BitDepth::Eight);
        let mut w = e.write_header().unwrap();
        w.write_image_data(&[0, 0, 0, 77].repeat(16)).unwrap();
        w.finish().unwrap();
        out
    };
    let original = json!({ "filename": "photo.png", "subfolder": "", "type": "input" }).to_string();
    let (code, body) =
        upload(&s, "/api/upload/mask", "clipspace-mask-1.png", mask.clone(), &[("type", "input"), ("subfolder", "clipspace"), ("original_ref", &original)])
            .await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body, json!({ "name": "clipspace-mask-1.png", "subfolder": "", "type": "input" }));
    let bytes = reqwest::get(root(&s, "/view?filename=clipspace-mask-1.png&type=input")).await.unwrap().bytes().await.unwrap();
    let mut reader = png::Decoder::new(std::io::Cursor::new(bytes.to_vec())).read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    assert_eq!(info.color_type, png::ColorType::Rgba);
    assert!(buf.chunks_exact(4).all(|p| p[3] == 77));
    let missing = json!({ "filename": "nope.png", "type": "input" }).to_string();
    let (code, _) = upload(&s, "/upload/mask", "m.png", mask, &[("original_ref", &missing)]).await;
    assert_eq!(code, 404);
}

/// `/view`'s `preview` and `channel` convert as ComfyUI does (headers as in
/// the captures), `rgba` stays the stored bytes, and a file that is no
/// image is a clear 400.
#[tokio::test]
async fn view_converts_for_preview_and_channel() {
    let s = start_default().await;
    let rgba = {
        let mut out = Vec::new();
        let mut e = png::Encoder::new(&mut out, 2, 1);
        e.set_color(png::ColorType::Rgba);
        e.set_depth(png::BitDepth::Eight);
        let mut w = e.write_header().unwrap();
        w.write_image_data(&[200, 10, 20, 128, 0, 0, 255, 255]).unwrap();
        w.finish().unwrap();
        out
    };
    let (code, body) = upload(&s, "/upload/image", "half.png", rgba.clone(), &[]).await;
    assert_eq!(code, 200, "{body}");
    let view = |query: &str| {
        let url = root(&s, &format!("/view?filename=half.png&type=input&{query}"));
        async move {
            let resp = reqwest::get(url).await.unwrap();
            let (status, headers) = (resp.status().as_u16(), resp.headers().clone());
            (status, headers, resp.bytes().await.unwrap().to_vec())
        }
    };
    let header = |h: &reqwest::header::HeaderMap, name: &str| h.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();

    // preview=webp;50: a WebP (lossless here, so the very pixels).
    let theirs = capture("http-e-view-preview-webp.json");
    let (status, headers, bytes) = view("preview=webp;50").await;
    assert_eq!(status, 200);
    assert_eq!(header(&headers, "content-type"), "image/webp");
    assert_eq!(header(&headers, "content-disposition"), "filename=\"half.png\"");
    assert_eq!(&bytes[..4], &hex(&theirs["body_first_bytes_hex"])[..4], "RIFF");
    assert_eq!(&bytes[8..12], b"WEBP");
    assert_eq!(image::load_from_memory(&bytes).unwrap().into_rgba8().into_raw(), vec![200, 10, 20, 128, 0, 0, 255, 255]);

    // preview=jpeg;50: a JPEG without alpha.
    let (status, headers, bytes) = view("preview=jpeg;50").await;
    assert_eq!((status, header(&headers, "content-type").as_str()), (200, "image/jpeg"));
    assert_eq!(&bytes[..3], &[0xFF, 0xD8, 0xFF]);
    assert!(!image::load_from_memory(&bytes).unwrap().color().has_alpha());
    // A channel with `a` forces WebP.
    let (_, headers, _) = view("preview=jpeg;50&channel=a").await;
    assert_eq!(header(&headers, "content-type"), "image/webp");

    // channel=a: black with the source's alpha; channel=rgb: no alpha.
    let theirs = capture("http-e-view-channel-a.json");
    let (status, headers, bytes) = view("channel=a").await;
    assert_eq!((status, header(&headers, "content-type")), (200, "image/png".to_string()));
    assert_eq!(&bytes[..16], &hex(&theirs["body_first_bytes_hex"])[..16], "PNG signature and IHDR");
    assert_eq!(image::load_from_memory(&bytes).unwrap().into_rgba8().into_raw(), vec![0, 0, 0, 128, 0, 0, 0, 255]);
    let (_, _, bytes) = view("channel=rgb").await;
    let rgb = image::load_from_memory(&bytes).unwrap();
    assert!(!rgb.color().has_alpha());
    assert_eq!(rgb.into_rgb8().into_raw(), vec![200, 10, 20, 0, 0, 255]);

    // rgba (the default) is the stored file itself.
    let (status, _, bytes) = view("channel=rgba").await;
    assert_eq!((status, bytes), (200, rgba));

    // A file that is not an image cannot be converted: 400, not a crash.
    let (code, _) = upload(&s, "/upload/image", "notes.png", b"plain text, not a PNG".to_vec(), &[]).await;
    assert_eq!(code, 200);
    let resp = reqwest::get(root(&s, "/view?filename=notes.png&type=input&preview=webp;90")).await.unwrap();
    assert_eq!(resp.status().as_u16(), 400);
    let body: Value = resp.json().await.unwrap();
    assert!(body.to_string().contains("notes.png"), "{body}");
}

fn hex(v: &Value) -> Vec<u8> {
    let text = v.as_str().unwrap();
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap()).collect()
}

#[tokio::test]
async fn small_routes_answer_as_clients_expect() {
    let s = start_default().await;
    let misc = capture("http-misc-endpoints.json");
    let (code, stats) = get(&s, "/system_stats").await;
    assert_eq!(code, 200);
    assert_shape(&stats, &misc["/system_stats"]["body_json"], "system_stats");
    let (_, features) = get(&s, "/api/features").await;
    assert_shape(&features, &misc["/features"]["body_json"], "features");
    let id = s.submit(trivial(1)).await["id"].as_str().unwrap().to_string();
    s.wait(&id).await;
    let (_, jobs) = get(&s, "/api/jobs?limit=2").await;
    assert_shape(&jobs, &misc["/api/jobs?limit=2"]["body_json"], "jobs");
    for class in ["ImageBlur", "LoadImage", "SaveImage"] {
        let (_, ours) = get(&s, &format!("/object_info/{class}")).await;
        assert_shape(&ours[class]["input"], &misc[&format!("/object_info/{class}")]["body_json"][class]["input"], class);
    }
    assert_eq!(get(&s, "/extensions").await, (200, json!([])));
    assert_eq!(get(&s, "/api/embeddings").await, (200, json!([])));
    assert_eq!(get(&s, "/models").await, (200, json!([])));
    assert_eq!(get(&s, "/api/users").await.1["storage"], "server");
    assert_eq!(get(&s, "/api/settings").await, (200, json!({})));
    assert_eq!(get(&s, "/api/settings/Comfy.Locale").await, (200, Value::Null));
    assert_eq!(s.http.post(root(&s, "/api/free")).json(&json!({ "unload_models": true })).send().await.unwrap().status(), 200);
    assert_eq!(get(&s, &format!("/api/job/{}/status", uuid::Uuid::new_v4())).await.0, 404);
}

#[tokio::test]
async fn a_configured_token_is_asked_for_as_x_api_key() {
    let s = start(|c, _| c.token = Some("s3cret".into())).await;
    for path in ["/api/prompt", "/prompt", "/queue", "/api/object_info", "/history", "/api/jobs", "/system_stats", "/api/settings"] {
        let resp = s.http.get(root(&s, path)).send().await.unwrap();
        assert_eq!(resp.status(), 401, "{path}");
        let resp = s.http.get(root(&s, path)).header("x-api-key", "wrong").send().await.unwrap();
        assert_eq!(resp.status(), 401, "{path}");
        let resp = s.http.get(root(&s, path)).header("x-api-key", "s3cret").send().await.unwrap();
        assert_eq!(resp.status(), 200, "{path}");
    }
    let resp = s.http.post(root(&s, "/api/prompt")).header("x-api-key", "s3cret").json(&json!({ "prompt": trivial(1) })).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let id = resp.json::<Value>().await.unwrap()["prompt_id"].as_str().unwrap().to_string();
    // The same job on v2 (bearer token there).
    let job = s.http.get(s.url(&format!("/jobs/{id}"))).bearer_auth("s3cret").send().await.unwrap();
    assert_eq!(job.status(), 200);
    // The view's signed URL works without credentials.
    for _ in 0..200 {
        let h = s.http.get(root(&s, &format!("/history/{id}"))).header("x-api-key", "s3cret").send().await.unwrap().json::<Value>().await.unwrap();
        if let Some(name) = h[&id]["outputs"]["2"]["images"][0]["filename"].as_str() {
            let no_redirect = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
            let resp = no_redirect.get(root(&s, &format!("/api/view?filename={name}"))).header("x-api-key", "s3cret").send().await.unwrap();
            assert_eq!(resp.status(), 302);
            let location = resp.headers()["location"].to_str().unwrap().to_string();
            assert_eq!(reqwest::get(&location).await.unwrap().status(), 200);
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the job did not finish");
}

#[tokio::test]
async fn routes_live_under_the_mount_prefix() {
    let s = start(|c, _| {
        c.mount_prefix = "/deployment/x".into();
        c.token = Some("k".into());
    })
    .await;
    // (The server's URL carries the prefix.)
    assert!(s.server.url().ends_with("/deployment/x"));
    for path in ["/api/prompt", "/prompt", "/api/jobs"] {
        let resp = s.http.get(root(&s, path)).send().await.unwrap();
        assert_eq!(resp.status(), 401, "{path}");
        let resp = s.http.get(root(&s, path)).header("x-api-key", "k").send().await.unwrap();
        assert_eq!(resp.status(), 200, "{path}");
    }
    let outside = s.server.url().replace("/deployment/x", "/api/prompt");
    let resp = s.http.get(outside).header("x-api-key", "k").send().await.unwrap();
    assert_eq!(resp.status(), 404, "outside the prefix");
}

#[tokio::test]
async fn uploads_and_prompt_numbers_survive_a_restart() {
    let s = start_default().await;
    upload(&s, "/upload/image", "kept.png", png_bytes(8, 8, 4), &[("subfolder", "in")]).await;
    let (code, body) = post(&s, "/prompt", &json!({ "prompt": blur("in/kept.png", json!(3)), "number": 42 })).await;
    assert_eq!(code, 200, "{body}");
    let id = body["prompt_id"].as_str().unwrap().to_string();
    s.wait(&id).await;
    let data = s.shutdown().await;
    let s = crate::api::start_in(data, |_, _| {}).await;
    let (_, history) = get(&s, &format!("/history/{id}")).await;
    assert_eq!(history[&id]["prompt"][0], json!(42.0));
    // The upload index is rebuilt from the asset records.
    let (_, info) = get(&s, "/object_info/LoadImage").await;
    assert!(info["LoadImage"]["input"]["required"]["image"][0].as_array().unwrap().contains(&json!("in/kept.png")), "{info}");
    let (code, again) = upload(&s, "/upload/image", "kept.png", png_bytes(8, 8, 4), &[("subfolder", "in")]).await;
    assert_eq!((code, again["name"].as_str()), (200, Some("kept.png")), "same bytes: same name");
    let (code, body) = post(&s, "/prompt", &json!({ "prompt": blur("in/kept.png", json!(5)) })).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(s.wait(body["prompt_id"].as_str().unwrap()).await["status"], "succeeded");
}

/// The web UI sends its workflow as `extra_data.extra_pnginfo`; SaveImage
/// embeds it in the PNG (so a saved image loads back as its workflow), as
/// ComfyUI does.
#[tokio::test]
async fn extra_pnginfo_is_embedded_in_saved_pngs() {
    let s = start_default().await;
    let prompt = json!({
        "1": { "class_type": "EmptyImage", "inputs": { "width": 8, "height": 8, "batch_size": 1, "color": 0 } },
        "2": { "class_type": "SaveImage", "inputs": { "images": ["1", 0], "filename_prefix": "pnginfo" } }
    });
    let ui_workflow = json!({ "nodes": [{ "id": 1, "type": "EmptyImage" }], "links": [], "version": 0.4 });
    let (code, queued) = post(&s, "/prompt", &json!({ "prompt": prompt, "extra_data": { "extra_pnginfo": { "workflow": ui_workflow } } })).await;
    assert_eq!(code, 200, "{queued}");
    let id = queued["prompt_id"].as_str().unwrap();
    assert_eq!(s.wait(id).await["status"], "succeeded");
    let (_, history) = get(&s, &format!("/history/{id}")).await;
    let filename = history[id]["outputs"]["2"]["images"][0]["filename"].as_str().unwrap().to_string();
    let bytes = reqwest::get(root(&s, &format!("/view?filename={filename}&type=output"))).await.unwrap().bytes().await.unwrap();
    let reader = png::Decoder::new(std::io::Cursor::new(bytes.to_vec())).read_info().unwrap();
    let info = reader.info();
    let texts: Vec<(String, String)> = info
        .uncompressed_latin1_text
        .iter()
        .map(|t| (t.keyword.clone(), t.text.clone()))
        .chain(info.utf8_text.iter().map(|t| (t.keyword.clone(), t.get_text().unwrap())))
        .collect();
    let workflow = texts.iter().find(|(k, _)| k == "workflow").map(|(_, v)| v.clone()).unwrap_or_else(|| panic!("no workflow chunk in {texts:?}"));
    assert_eq!(serde_json::from_str::<Value>(&workflow).unwrap(), ui_workflow);
    assert!(texts.iter().any(|(k, _)| k == "prompt"), "the API prompt too: {texts:?}");
}

/// A client fetches an output as soon as ComfyUI's `executed` names it,
/// which is before its job has finished: `/view` finds the outputs of the
/// caller's running jobs too.
#[tokio::test]
async fn an_output_is_viewable_while_its_job_still_runs() {
    let s = start_default().await;
    let mut workflow = trivial(3);
    workflow["9"] = spinner(1)["1"].clone();
    let (code, body) = post(&s, "/api/prompt", &json!({ "prompt": workflow })).await;
    assert_eq!(code, 200, "{body}");
    let id = body["prompt_id"].as_str().unwrap().to_string();
    let mut filename = None;
    for _ in 0..400 {
        let job = s.job(&id).await;
        if let Some(name) = job["outputs"][0]["name"].as_str() {
            assert_eq!(job["status"], "running", "the spinner keeps the job running: {job}");
            filename = Some(name.to_string());
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let filename = filename.expect("SaveImage saved while the spinner ran");
    let no_redirect = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let resp = no_redirect.get(root(&s, &format!("/view?filename={filename}&type=output"))).send().await.unwrap();
    assert_eq!(resp.status(), 302, "{filename}");
    assert_eq!(s.job(&id).await["status"], "running", "still running when it was served");
    let (code, _) = post(&s, &format!("/api/jobs/{id}/cancel"), &json!({})).await;
    assert_eq!(code, 200);
}
