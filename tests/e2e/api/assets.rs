//! Assets: upload with dedup and hash checks, by-hash/from-hash, get,
//! content with ranges and signed redirects, delete, outputs as inputs.

use serde_json::{Value, json};

use super::{load_save, png_bytes, start, start_default};

fn blake(bytes: &[u8]) -> String {
    format!("blake3:{}", blake3::hash(bytes).to_hex())
}

#[tokio::test]
async fn upload_dedup_hash_checks_and_by_hash() {
    let s = start_default().await;
    let bytes = png_bytes(5, 5, 1);
    let hash = blake(&bytes);
    let head = |h: String| {
        let (http, url) = (s.http.clone(), s.url(&format!("/assets/by-hash/{h}")));
        async move {
            let r = http.head(url).send().await.unwrap();
            (r.status().as_u16(), r.bytes().await.unwrap().len())
        }
    };
    assert_eq!(head(hash.clone()).await, (404, 0));
    // A wrong expected hash mints nothing.
    let (status, err) = s.upload("p.png", bytes.clone(), Some(&blake(b"other"))).await;
    assert_eq!((status, err["error"]["code"].as_str()), (409, Some("hash_mismatch")));
    assert_eq!(head(hash.clone()).await.0, 404);

    let (status, a) = s.upload("p.png", bytes.clone(), Some(&hash.to_uppercase().replace("BLAKE3", "blake3"))).await;
    assert_eq!(status, 201, "{a}");
    assert_eq!((a["created_new"].as_bool(), a["hash"].as_str(), a["size_bytes"].as_u64()), (Some(true), Some(hash.as_str()), Some(bytes.len() as u64)));
    assert_eq!(a["file_path"], "p.png");
    assert!(a["url"].as_str().unwrap().starts_with("http://") && a["created_at"].as_str().unwrap().ends_with("+00:00"));
    let (status, again) = s.upload("p.png", bytes.clone(), Some(&hash)).await;
    assert_eq!((status, again["created_new"].as_bool(), &again["id"]), (200, Some(false), &a["id"]));
    assert_eq!(head(hash.clone()).await, (200, 0));

    // from-hash: known → an asset over the same blob; unknown → blob_not_found.
    let r = s.http.post(s.url("/assets/from-hash")).json(&json!({ "hash": hash, "file_path": "copy.png" })).send().await.unwrap();
    assert!([200, 201].contains(&r.status().as_u16()));
    let minted: Value = r.json().await.unwrap();
    assert_eq!(minted["hash"], hash);
    let r = s.http.post(s.url("/assets/from-hash")).json(&json!({ "hash": blake(b"never"), "file_path": "x" })).send().await.unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(r.json::<Value>().await.unwrap()["error"]["code"], "blob_not_found");

    // Malformed uploads.
    let form = reqwest::multipart::Form::new().text("file_path", "a.png");
    let r = s.http.post(s.url("/assets")).multipart(form).send().await.unwrap();
    assert_eq!((r.status().as_u16(), r.json::<Value>().await.unwrap()["error"]["code"].as_str().map(String::from)), (400, Some("invalid_request".into())));
    // No `file_path` part: refused even when the file part has a file name.
    let form = reqwest::multipart::Form::new().part("file", reqwest::multipart::Part::bytes(vec![1, 2]).file_name("x.png"));
    let r = s.http.post(s.url("/assets")).multipart(form).send().await.unwrap();
    assert_eq!(r.status(), 400, "no file_path");
    assert_eq!(r.json::<Value>().await.unwrap()["error"]["code"], "invalid_request");
    for bad in ["", "/etc/x.png", "a/../b.png", "..\\x.png"] {
        let form = reqwest::multipart::Form::new().text("file_path", bad).part("file", reqwest::multipart::Part::bytes(vec![1, 2]));
        let r = s.http.post(s.url("/assets")).multipart(form).send().await.unwrap();
        assert_eq!(r.status(), 400, "upload file_path {bad:?}");
        let r = s.http.post(s.url("/assets/from-hash")).json(&json!({ "hash": hash, "file_path": bad })).send().await.unwrap();
        assert_eq!(r.status(), 400, "from-hash file_path {bad:?}");
        assert_eq!(r.json::<Value>().await.unwrap()["error"]["code"], "invalid_request");
    }
    let r = s.http.post(s.url("/assets")).body("x").send().await.unwrap();
    assert_eq!(r.status(), 400, "not multipart");
}

#[tokio::test]
async fn oversize_uploads_are_413() {
    let s = start(|_, o| o.max_upload_bytes = 1000).await;
    let (status, err) = s.upload("big.bin", vec![7u8; 5000], None).await;
    assert_eq!((status, err["error"]["code"].as_str()), (413, Some("payload_too_large")), "{err}");
    assert_eq!(s.upload("ok.bin", vec![7u8; 900], None).await.0, 201);
}

#[tokio::test]
async fn get_content_ranges_and_delete() {
    let s = start_default().await;
    let bytes = png_bytes(9, 9, 4);
    let (_, a) = s.upload("r.png", bytes.clone(), None).await;
    let id = a["id"].as_str().unwrap();
    let (status, got) = s.get(&format!("/assets/{id}")).await;
    assert_eq!(status, 200);
    assert!(got.get("created_new").is_none());
    assert_eq!(got["hash"], a["hash"]);
    let content = s.url(&format!("/assets/{id}/content"));
    let full = s.http.get(&content).send().await.unwrap();
    assert_eq!(full.status(), 200);
    assert_eq!(full.headers()["content-type"], "image/png");
    assert_eq!(full.headers()["accept-ranges"], "bytes");
    assert_eq!(full.bytes().await.unwrap().as_ref(), bytes.as_slice());
    let part = s.http.get(&content).header("range", "bytes=0-3").send().await.unwrap();
    assert_eq!(part.status(), 206);
    assert_eq!(part.headers()["content-range"].to_str().unwrap(), format!("bytes 0-3/{}", bytes.len()));
    assert_eq!(part.bytes().await.unwrap().as_ref(), &bytes[..4]);
    let tail = s.http.get(&content).header("range", "bytes=10-").send().await.unwrap();
    assert_eq!(tail.status(), 206);
    assert_eq!(tail.bytes().await.unwrap().as_ref(), &bytes[10..]);
    let past = s.http.get(&content).header("range", format!("bytes={}-{}", bytes.len() + 5, bytes.len() + 9)).send().await.unwrap();
    assert_eq!(past.status(), 416);
    assert_eq!(past.headers()["content-range"].to_str().unwrap(), format!("bytes */{}", bytes.len()));
    // Suffix ranges: the last N bytes; a suffix longer than the content is all of it (RFC 9110 §14.1.3).
    let last = s.http.get(&content).header("range", "bytes=-5").send().await.unwrap();
    assert_eq!(
        (last.status().as_u16(), last.headers()["content-range"].to_str().unwrap().to_string()),
        (206, format!("bytes {}-{}/{}", bytes.len() - 5, bytes.len() - 1, bytes.len()))
    );
    assert_eq!(last.bytes().await.unwrap().as_ref(), &bytes[bytes.len() - 5..]);
    let all = s.http.get(&content).header("range", format!("bytes=-{}", bytes.len() + 100)).send().await.unwrap();
    assert_eq!(
        (all.status().as_u16(), all.headers()["content-range"].to_str().unwrap().to_string()),
        (206, format!("bytes 0-{}/{}", bytes.len() - 1, bytes.len()))
    );
    assert_eq!(all.bytes().await.unwrap().as_ref(), bytes.as_slice());
    // A malformed header is ignored: the whole body.
    let odd = s.http.get(&content).header("range", "lines=1-2").send().await.unwrap();
    assert_eq!(odd.status(), 200);

    let del = s.http.delete(s.url(&format!("/assets/{id}"))).send().await.unwrap();
    assert_eq!(del.status(), 204);
    assert!(del.bytes().await.unwrap().is_empty());
    assert_eq!(s.http.delete(s.url(&format!("/assets/{id}"))).send().await.unwrap().status(), 404);
    assert_eq!(s.get(&format!("/assets/{id}")).await.0, 404);
    assert_eq!(s.http.get(&content).send().await.unwrap().status(), 404);
    let r = s.http.head(s.url(&format!("/assets/by-hash/{}", a["hash"].as_str().unwrap()))).send().await.unwrap();
    assert_eq!(r.status(), 404, "no asset left to mint from");
    assert_eq!(s.get(&format!("/assets/{}", uuid::Uuid::new_v4())).await.1["error"]["code"], "not_found");
}

#[tokio::test]
async fn outputs_are_assets_and_feed_later_jobs() {
    let s = start_default().await;
    let (_, a) = s.upload("in.png", png_bytes(6, 5, 2), None).await;
    let first = s.submit(load_save(&a)).await;
    let done = s.wait(first["id"].as_str().unwrap()).await;
    let out = &done["outputs"][0];
    let oid = out["id"].as_str().unwrap();
    let (status, asset) = s.get(&format!("/assets/{oid}")).await;
    assert_eq!(status, 200);
    assert_eq!((&asset["job_id"], &asset["hash"], &asset["size_bytes"]), (&done["id"], &out["hash"], &out["size_bytes"]));
    // An output of a retained job cannot be deleted.
    let r = s.http.delete(s.url(&format!("/assets/{oid}"))).send().await.unwrap();
    assert_eq!(r.status(), 409);
    assert_eq!(r.json::<Value>().await.unwrap()["error"]["code"], "asset_in_use");
    // The output, referenced by id inside a nested structure, is the next job's input.
    let wf = json!({
        "1": { "class_type": "LoadImage", "inputs": { "image": { "__type": "core/ASSET", "info": { "id": oid } } } },
        "2": { "class_type": "ImageInvert", "inputs": { "image": ["1", 0] } },
        "3": { "class_type": "SaveImage", "inputs": { "images": ["2", 0], "filename_prefix": "second" } },
    });
    let second = s.submit(wf).await;
    let done2 = s.wait(second["id"].as_str().unwrap()).await;
    assert_eq!(done2["status"], "succeeded", "{done2}");
    assert_ne!(done2["outputs"][0]["hash"], out["hash"]);
}

#[tokio::test]
async fn signed_redirects_carry_their_own_authorization() {
    let s = start(|c, _| {
        c.token = Some("tok".into());
        c.download_redirect = true;
        c.signed_url_ttl_s = 60;
    })
    .await;
    let bytes = png_bytes(3, 3, 5);
    let form = reqwest::multipart::Form::new().text("file_path", "s.png").part("file", reqwest::multipart::Part::bytes(bytes.clone()).file_name("s.png"));
    let a: Value = s.http.post(s.url("/assets")).bearer_auth("tok").multipart(form).send().await.unwrap().json().await.unwrap();
    let no_redirects = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let r = no_redirects.get(s.url(&format!("/assets/{}/content", a["id"].as_str().unwrap()))).bearer_auth("tok").send().await.unwrap();
    assert_eq!(r.status(), 302);
    let location = r.headers()["location"].to_str().unwrap().to_string();
    assert!(location.starts_with("http://127.0.0.1:") && location.contains("sig="), "{location}");
    // No credentials needed, ranges work, and the bytes are the upload's.
    let got = s.http.get(&location).send().await.unwrap();
    assert_eq!(got.status(), 200);
    assert_eq!(got.bytes().await.unwrap().as_ref(), bytes.as_slice());
    let part = s.http.get(&location).header("range", "bytes=1-2").send().await.unwrap();
    assert_eq!(part.status(), 206);
    // Tampering or expiry voids the link.
    let tampered = location.replace("sig=", "sig=0");
    let refused = s.http.get(&tampered).send().await.unwrap();
    assert_eq!(refused.status(), 403);
    assert_eq!(refused.json::<Value>().await.unwrap()["error"]["code"], "forbidden");
    let expires: i64 = location.split("expires=").nth(1).unwrap().split('&').next().unwrap().parse().unwrap();
    let moved = location.replace(&format!("expires={expires}"), &format!("expires={}", expires + 100));
    assert_eq!(s.http.get(&moved).send().await.unwrap().status(), 403);
    let sig = location.split("sig=").nth(1).unwrap();
    let id = a["id"].as_str().unwrap();
    let stale = s.server.state.signer.sign(id, 1);
    assert_ne!(stale, sig);
    let old = s.http.get(s.url(&format!("/signed/assets/{id}?expires=1&sig={stale}"))).send().await.unwrap();
    assert_eq!(old.status(), 403, "an expired signature is refused");
    assert_eq!(old.json::<Value>().await.unwrap()["error"]["code"], "forbidden");
    // The SDK's download path follows the redirect.
    let followed = s.http.get(s.url(&format!("/assets/{id}/content"))).bearer_auth("tok").send().await.unwrap();
    assert_eq!(followed.bytes().await.unwrap().as_ref(), bytes.as_slice());
}

#[tokio::test]
async fn uploaded_markup_is_never_served_as_markup() {
    let s = start_default().await;
    let form = reqwest::multipart::Form::new()
        .text("content_type", "text/html")
        .text("file_path", "evil.html")
        .part("file", reqwest::multipart::Part::bytes(b"<script>alert(1)</script>".to_vec()).file_name("evil.html"));
    let a: Value = s.http.post(s.url("/assets")).multipart(form).send().await.unwrap().json().await.unwrap();
    assert_eq!(a["content_type"], "text/html", "the record keeps what was declared");
    let r = s.http.get(s.url(&format!("/assets/{}/content", a["id"].as_str().unwrap()))).send().await.unwrap();
    assert_eq!(r.headers()["content-type"], "application/octet-stream");
    assert_eq!(r.headers()["x-content-type-options"], "nosniff");
    assert!(r.headers()["content-security-policy"].to_str().unwrap().contains("sandbox"));
}

/// Uploads a `file` with extra text parts; returns the status and body.
async fn upload_with(s: &super::TestServer, bytes: Vec<u8>, parts: &[(&str, &str)]) -> (u16, Value) {
    let mut form = reqwest::multipart::Form::new().text("file_path", "t.png");
    for (name, value) in parts {
        form = form.text(name.to_string(), value.to_string());
    }
    let form = form.part("file", reqwest::multipart::Part::bytes(bytes).file_name("t.png"));
    let r = s.http.post(s.url("/assets")).multipart(form).send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

#[tokio::test]
async fn tags_and_expires_in_on_upload_and_from_hash() {
    let s = start_default().await;
    let micros = |ts: &Value| chrono::DateTime::parse_from_rfc3339(ts.as_str().unwrap()).unwrap().timestamp_micros();
    let now = kiln::store::now_micros();

    // Out of range, not a number, bad tags: 400 invalid_request, nothing minted.
    let bytes = png_bytes(6, 6, 9);
    for parts in [&[("expires_in", "59")][..], &[("expires_in", "604801")], &[("expires_in", "soon")], &[("tags", "")]] {
        let (status, err) = upload_with(&s, bytes.clone(), parts).await;
        assert_eq!((status, err["error"]["code"].as_str()), (400, Some("invalid_request")), "{parts:?}: {err}");
    }
    assert_eq!(s.http.head(s.url(&format!("/assets/by-hash/{}", blake(&bytes)))).send().await.unwrap().status(), 404);

    // A one-minute upload with two tags (repeated parts).
    let (status, a) = upload_with(&s, bytes.clone(), &[("tags", "red"), ("tags", "raw"), ("expires_in", "60")]).await;
    assert_eq!(status, 201, "{a}");
    assert_eq!(a["tags"], json!(["red", "raw"]));
    let deadline = micros(&a["expires_at"]);
    assert!((now + 60_000_000..now + 70_000_000).contains(&deadline), "expires_at {}", a["expires_at"]);
    // Re-uploading the bytes with a longer retention and a new tag extends
    // the same record; a shorter one never shortens it.
    let (status, b) = upload_with(&s, bytes.clone(), &[("tags", "raw"), ("tags", "hdr"), ("expires_in", "3600")]).await;
    assert_eq!((status, &b["id"], b["created_new"].as_bool()), (200, &a["id"], Some(false)));
    assert_eq!(b["tags"], json!(["red", "raw", "hdr"]));
    let extended = micros(&b["expires_at"]);
    assert!(extended >= deadline + 3_500_000_000, "{} → {}", a["expires_at"], b["expires_at"]);
    let (_, c) = upload_with(&s, bytes.clone(), &[("expires_in", "60")]).await;
    assert_eq!(micros(&c["expires_at"]), extended);
    let (_, got) = s.get(&format!("/assets/{}", a["id"].as_str().unwrap())).await;
    assert_eq!((got["tags"].clone(), micros(&got["expires_at"])), (json!(["red", "raw", "hdr"]), extended), "persisted");
    // Tags merged over re-uploads stop at 64 an asset: the one that does
    // not fit is refused (409 `too_many_tags`), the record keeps what it had.
    let many: Vec<String> = (0..61).map(|i| format!("t{i}")).collect();
    let parts: Vec<(&str, &str)> = many.iter().map(|t| ("tags", t.as_str())).collect();
    let (status, full) = upload_with(&s, bytes.clone(), &parts).await;
    assert_eq!((status, full["tags"].as_array().map(Vec::len)), (200, Some(64)), "{full}");
    let (status, err) = upload_with(&s, bytes.clone(), &[("tags", "one-more")]).await;
    assert_eq!((status, err["error"]["code"].as_str()), (409, Some("too_many_tags")), "{err}");
    assert_eq!(s.get(&format!("/assets/{}", a["id"].as_str().unwrap())).await.1["tags"].as_array().map(Vec::len), Some(64));
    // A tag over 64 characters is refused.
    let (status, err) = upload_with(&s, bytes.clone(), &[("tags", &"語".repeat(65))]).await;
    assert_eq!((status, err["error"]["code"].as_str()), (400, Some("invalid_request")), "{err}");

    // from-hash takes the same fields, checked the same way.
    let from_hash = |body: Value| {
        let (http, url) = (s.http.clone(), s.url("/assets/from-hash"));
        async move {
            let r = http.post(url).json(&body).send().await.unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        }
    };
    let hash = blake(&bytes);
    for bad in [
        json!({ "hash": hash, "file_path": "m.png", "expires_in": 30 }),
        json!({ "hash": hash, "file_path": "m.png", "tags": "x" }),
        json!({ "hash": hash, "file_path": "m.png", "expires_in": "60" }),
    ] {
        let (status, err) = from_hash(bad.clone()).await;
        assert_eq!((status, err["error"]["code"].as_str()), (400, Some("invalid_request")), "{bad}: {err}");
    }
    let (status, minted) = from_hash(json!({ "hash": hash, "file_path": "m.png", "tags": ["copy"], "expires_in": 120 })).await;
    assert_eq!(status, 201, "{minted}");
    assert_eq!(minted["tags"], json!(["copy"]));
    assert!((now + 120_000_000..now + 130_000_000).contains(&micros(&minted["expires_at"])));
    // Without `expires_in` a record never expires, and re-referencing an
    // expiring one without it makes it permanent.
    let (_, again) = from_hash(json!({ "hash": hash, "file_path": "m.png" })).await;
    assert_eq!((&again["id"], &again["expires_at"]), (&minted["id"], &Value::Null));

    // Past its deadline an upload is gone: 404 at once, deleted by the
    // sweep, and its blob collected once nothing else holds it.
    let other = png_bytes(7, 7, 3);
    let (_, short) = upload_with(&s, other.clone(), &[("expires_in", "60")]).await;
    let short_id = short["id"].as_str().unwrap().to_string();
    assert_eq!(s.get(&format!("/assets/{short_id}")).await.0, 200);
    let service = &s.server.state.service;
    service.sweep(micros(&short["expires_at"])).await.unwrap();
    assert_eq!(s.get(&format!("/assets/{short_id}")).await.0, 404);
    assert_eq!(s.http.head(s.url(&format!("/assets/by-hash/{}", blake(&other)))).send().await.unwrap().status(), 404);
    let job = s.post_job(&json!({ "workflow": load_save(&short) }), None).await;
    assert_eq!((job.0, job.1["error"]["code"].as_str()), (422, Some("missing_asset")), "{}", job.1);
    // The permanent asset over the first bytes survives the same sweep.
    assert_eq!(s.get(&format!("/assets/{}", minted["id"].as_str().unwrap())).await.0, 200);
}
