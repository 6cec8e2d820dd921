//! The seven Idempotency-Key rules.

use serde_json::json;

use super::{load_save, png_bytes, start_default, trivial};

#[tokio::test]
async fn a_key_is_single_use_even_under_concurrency() {
    let s = start_default().await;
    let body = json!({ "workflow": trivial(1), "metadata": { "k": "once" } });
    let (first, job, _) = s.post_job(&body, Some("key-1")).await;
    assert_eq!(first, 201, "{job}");
    // A retry, and a different body under the same key: rejected, never run.
    let (again, err, headers) = s.post_job(&body, Some("key-1")).await;
    assert_eq!((again, err["error"]["code"].as_str()), (422, Some("idempotency_key_reuse")));
    assert!(headers.get("idempotency-replayed").is_none(), "no replay header");
    let (other, err, _) = s.post_job(&json!({ "workflow": trivial(9) }), Some("key-1")).await;
    assert_eq!((other, err["error"]["code"].as_str()), (422, Some("idempotency_key_reuse")));
    // Whatever else is wrong with a later request, the used key is what it hears.
    for body in [
        json!({ "workflow": trivial(1), "extra_data": { "other": 1 } }),
        json!({ "workflow": { "nodes": [], "links": [] } }),
        json!({ "webhook_url": "http://example.com" }),
        json!([1, 2]),
    ] {
        let (status, err, _) = s.post_job(&body, Some("key-1")).await;
        assert_eq!((status, err["error"]["code"].as_str()), (422, Some("idempotency_key_reuse")), "{body}");
    }
    let raw = s.http.post(s.url("/jobs")).header("Idempotency-Key", "key-1").header("content-type", "application/json").body("{not json").send().await.unwrap();
    assert_eq!(raw.status(), 422);

    // Eight concurrent requests with one fresh key: exactly one job.
    let body = json!({ "workflow": trivial(2), "metadata": { "k": "race" } });
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (http, url, body) = (s.http.clone(), s.url("/jobs"), body.clone());
        tasks.push(tokio::spawn(async move { http.post(url).header("Idempotency-Key", "key-race").json(&body).send().await.unwrap().status().as_u16() }));
    }
    let mut codes = Vec::new();
    for t in tasks {
        codes.push(t.await.unwrap());
    }
    codes.sort();
    assert_eq!(codes, vec![201, 422, 422, 422, 422, 422, 422, 422]);
    let (_, page) = s.get("/jobs?metadata%5Bk%5D=race").await;
    assert_eq!(page["jobs"].as_array().unwrap().len(), 1);
    let (_, page) = s.get("/jobs?metadata%5Bk%5D=once").await;
    assert_eq!(page["jobs"].as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn definite_failures_release_the_key() {
    let s = start_default().await;
    // Validation error: released.
    let bad = json!({ "workflow": { "1": { "class_type": "Nope", "inputs": {} } } });
    assert_eq!(s.post_job(&bad, Some("key-v")).await.0, 422);
    assert_eq!(s.post_job(&json!({ "workflow": trivial(1) }), Some("key-v")).await.0, 201);
    // Missing asset: not claimed; the same key works once the asset exists.
    let missing = json!({ "__type": "core/ASSET", "info": { "id": uuid::Uuid::new_v4().to_string(), "hash": format!("blake3:{}", "0".repeat(64)) } });
    let wf = json!({ "1": { "class_type": "LoadImage", "inputs": { "image": missing } },
                     "2": { "class_type": "SaveImage", "inputs": { "images": ["1", 0], "filename_prefix": "m" } } });
    let (status, err, _) = s.post_job(&json!({ "workflow": wf }), Some("key-a")).await;
    assert_eq!((status, err["error"]["code"].as_str()), (422, Some("missing_asset")), "{err}");
    assert!(err["error"]["details"]["missing_ids"].as_array().is_some_and(|l| l.len() == 1));
    let (_, asset) = s.upload("a.png", png_bytes(4, 4, 9), None).await;
    // The id is authoritative: a known hash does not rescue an unknown id.
    let stale = json!({ "__type": "core/ASSET", "info": { "id": uuid::Uuid::new_v4().to_string(), "hash": asset["hash"] } });
    let wf = json!({ "1": { "class_type": "LoadImage", "inputs": { "image": stale } },
                     "2": { "class_type": "SaveImage", "inputs": { "images": ["1", 0], "filename_prefix": "m" } } });
    assert_eq!(s.post_job(&json!({ "workflow": wf }), Some("key-a")).await.1["error"]["code"], "missing_asset");
    assert_eq!(s.post_job(&json!({ "workflow": load_save(&asset) }), Some("key-a")).await.0, 201);
}

#[tokio::test]
async fn malformed_keys_are_bad_requests() {
    let s = start_default().await;
    let body = json!({ "workflow": trivial(1) });
    for key in [String::new(), "k".repeat(256)] {
        let (status, err, _) = s.post_job(&body, Some(&key)).await;
        assert_eq!((status, err["error"]["code"].as_str()), (400, Some("invalid_request")), "{key:?}");
    }
    assert_eq!(s.post_job(&body, Some(&"k".repeat(255))).await.0, 201);
}

#[tokio::test]
async fn claims_expire_after_24_hours() {
    let s = start_default().await;
    assert_eq!(s.post_job(&json!({ "workflow": trivial(1) }), Some("key-old")).await.0, 201);
    assert_eq!(s.post_job(&json!({ "workflow": trivial(1) }), Some("key-old")).await.0, 422);
    // A sweep a second before 24 h keeps the claim; one 24 h + 1 s later drops it.
    let almost = kiln::store::now_micros() + (24 * 3600 - 1) * 1_000_000;
    s.server.state.service.sweep(almost).await.unwrap();
    assert_eq!(s.post_job(&json!({ "workflow": trivial(1) }), Some("key-old")).await.0, 422);
    let later = kiln::store::now_micros() + (24 * 3600 + 1) * 1_000_000;
    s.server.state.service.sweep(later).await.unwrap();
    assert_eq!(s.post_job(&json!({ "workflow": trivial(1) }), Some("key-old")).await.0, 201);
}
