//! Any host answers for any job: poll, SSE, the compat WebSocket, cancel,
//! download and an Idempotency-Key raced on all three; a host killed with
//! SIGKILL loses its running job to another, which runs it; the server's
//! queue bound counts the jobs waiting on every host.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use futures_util::StreamExt;

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hosts_serve_as_one() {
    let Some(shared) = shared().await else { return };
    let hosts: Vec<Host> = ["h1", "h2", "h3"].iter().map(|name| start(name, &shared)).collect();
    let http = reqwest::Client::new();
    let [h1, h2, h3] = [&hosts[0], &hosts[1], &hosts[2]];

    // Jobs submitted to every host, each polled through the next and its
    // output downloaded through the one after: the same bytes everywhere.
    let mut ids = Vec::new();
    for n in 0..6 {
        ids.push((n, submit(&http, &hosts[n % 3], quick(n as i64)).await));
    }
    for (n, id) in &ids {
        let done = wait_for(&http, &hosts[(n + 1) % 3], id, &["succeeded", "failed"], Duration::from_secs(30)).await;
        assert_eq!(done["status"], "succeeded", "{done}");
        let png = download(&http, &hosts[(n + 2) % 3], &done).await;
        assert_eq!(&png[..4], b"\x89PNG");
    }
    let listed: Value = http.get(format!("{}/api/v2/jobs?limit=100", h2.base)).send().await.unwrap().json().await.unwrap();
    assert_eq!(listed["jobs"].as_array().unwrap().len(), 6, "a listing on any host shows every host's jobs");
    // ComfyUI's unified jobs list too.
    let comfy: Value = http.get(format!("{}/api/jobs?limit=100", h3.base)).send().await.unwrap().json().await.unwrap();
    let mut listed: Vec<&str> = comfy["jobs"].as_array().unwrap_or_else(|| panic!("{comfy}")).iter().filter_map(|j| j["id"].as_str()).collect();
    let mut submitted: Vec<&str> = ids.iter().map(|(_, id)| id.as_str()).collect();
    listed.sort_unstable();
    submitted.sort_unstable();
    assert_eq!(listed, submitted, "/api/jobs on any host lists every host's jobs");
    // The hosts number submissions from one source: ComfyUI's history (on
    // any host) shows no number twice.
    let history: Value = http.get(format!("{}/api/history?max_items=100", h3.base)).send().await.unwrap().json().await.unwrap();
    let mut numbers: Vec<i64> = ids.iter().map(|(_, id)| history[id]["prompt"][0].as_i64().unwrap_or_else(|| panic!("{id} in {history}"))).collect();
    numbers.sort_unstable();
    numbers.dedup();
    assert_eq!(numbers.len(), 6, "six jobs, six numbers: {numbers:?}");
    // And an owner's ComfyUI priority counter is one, whichever host a
    // prompt reaches: prompts sent through each host in turn count up.
    let mut priorities = Vec::new();
    for host in [h1, h2, h3, h1] {
        let queued: Value = http.post(format!("{}/api/prompt", host.base)).json(&json!({ "prompt": quick(11) })).send().await.unwrap().json().await.unwrap();
        priorities.push(queued["number"].as_i64().unwrap_or_else(|| panic!("{queued}")));
    }
    assert!(priorities.windows(2).all(|w| w[1] == w[0] + 1), "one counter across hosts: {priorities:?}");

    // An event stream on h2 follows a job h1 runs, to its end.
    let id = submit(&http, h1, slow(1)).await;
    let mut stream = http.get(format!("{}/api/v2/jobs/{id}/events", h2.base)).send().await.unwrap();
    assert_eq!(stream.status(), 200);
    let mut seen = String::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !seen.contains("\"status\":\"succeeded\"") {
        let chunk = tokio::time::timeout_at(deadline.into(), stream.chunk()).await.expect("the stream ends the job within 60 s").unwrap();
        let Some(chunk) = chunk else { break };
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(seen.contains("\"status\":\"running\"") && seen.contains("event: output"), "the stream saw the run: {seen}");
    assert!(seen.contains("\"status\":\"succeeded\""), "and its end: {seen}");

    // The compat WebSocket on h3 hears a prompt queued on h1 succeed, and
    // its status messages count it in the queue while it is there (the
    // queue of every host), then count it out.
    let ws_url = format!("{}/ws?clientId=watcher", h3.base.replacen("http", "ws", 1));
    let (mut socket, _) = tokio_tungstenite::connect_async(ws_url).await.unwrap();
    let queued: Value =
        http.post(format!("{}/api/prompt", h1.base)).json(&json!({ "prompt": slow(42), "client_id": "watcher" })).send().await.unwrap().json().await.unwrap();
    let prompt_id = queued["prompt_id"].as_str().unwrap_or_else(|| panic!("{queued}")).to_string();
    let (mut succeeded, mut counts) = (false, Vec::new());
    let heard = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(Ok(message)) = socket.next().await {
            if let tokio_tungstenite::tungstenite::Message::Text(text) = message {
                let message: Value = serde_json::from_str(&text).unwrap();
                if message["type"] == "execution_success" && message["data"]["prompt_id"] == prompt_id.as_str() {
                    succeeded = true;
                }
                if message["type"] == "status" {
                    counts.push(message["data"]["status"]["exec_info"]["queue_remaining"].as_u64().unwrap());
                }
                if succeeded && counts.contains(&1) && counts.last() == Some(&0) {
                    return;
                }
            }
        }
    })
    .await;
    assert!(heard.is_ok(), "h3's socket heard the prompt h1 ran succeed ({succeeded}) and its queue counts: {counts:?}");
    // A message over NOTIFY's size (one node saving 150 images) reaches it whole.
    let batch = json!({
        "1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 150, "color": 3}},
        "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "batch"}},
    });
    let queued: Value =
        http.post(format!("{}/api/prompt", h1.base)).json(&json!({ "prompt": batch, "client_id": "watcher" })).send().await.unwrap().json().await.unwrap();
    let prompt_id = queued["prompt_id"].as_str().unwrap_or_else(|| panic!("{queued}")).to_string();
    let executed = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(Ok(message)) = socket.next().await {
            if let tokio_tungstenite::tungstenite::Message::Text(text) = message {
                let message: Value = serde_json::from_str(&text).unwrap();
                if message["type"] == "executed" && message["data"]["prompt_id"] == prompt_id.as_str() {
                    return (text.len(), message["data"]["output"]["images"].as_array().map_or(0, Vec::len));
                }
            }
        }
        (0, 0)
    })
    .await;
    let (bytes, images) = executed.expect("h3's socket heard the large `executed` message");
    assert_eq!(images, 150);
    assert!(bytes > 7000, "the message was over NOTIFY's size: {bytes} bytes");
    let _ = socket.close(None).await;

    // A cancel sent to h2 stops the job h1 runs; h3 sees it canceled.
    let id = submit(&http, h1, slow(2)).await;
    wait_for(&http, h3, &id, &["running"], Duration::from_secs(30)).await;
    let resp = http.post(format!("{}/api/v2/jobs/{id}/cancel", h2.base)).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let answer: Value = resp.json().await.unwrap();
    assert!(["canceling", "canceled"].contains(&answer["status"].as_str().unwrap()), "{answer}");
    wait_for(&http, h3, &id, &["canceled"], Duration::from_secs(30)).await;

    // An Idempotency-Key raced on all three hosts: one 201.
    let racing = (0..9).map(|n| {
        let (http, url) = (http.clone(), format!("{}/api/v2/jobs", hosts[n % 3].base));
        async move { http.post(url).header("Idempotency-Key", "raced").json(&json!({ "workflow": quick(7) })).send().await.unwrap().status().as_u16() }
    });
    let mut codes = futures_util::future::join_all(racing).await;
    codes.sort();
    assert_eq!(codes.iter().filter(|&&c| c == 201).count(), 1, "{codes:?}");

    // SIGKILL of the host running a job: another host takes it over once
    // the lease lapses, and runs it again from the start, to the end.
    let id = submit(&http, h1, slow(3)).await;
    let first_run = wait_for(&http, h2, &id, &["running"], Duration::from_secs(30)).await;
    let db = sqlx::PgPool::connect(&env(&shared, "KILN_DATABASE_URL")).await.unwrap();
    let (holder,): (Option<String>,) = sqlx::query_as("SELECT holder FROM jobs WHERE id = $1").bind(&id).fetch_one(&db).await.unwrap();
    assert!(holder.as_deref().is_some_and(|h| h.starts_with("h1/")), "h1 runs it: {holder:?}");
    let mut hosts = hosts;
    let mut h1 = hosts.remove(0);
    h1.child.kill().unwrap();
    h1.child.wait().unwrap();
    let killed_at = Instant::now();
    let (h2, h3) = (&hosts[0], &hosts[1]);
    let done = wait_for(&http, h2, &id, &["succeeded", "failed", "canceled"], Duration::from_secs(90)).await;
    assert_eq!(done["status"], "succeeded", "the job ran again on another host: {done}");
    assert!(done["started_at"].as_str() > first_run["started_at"].as_str(), "started again: {first_run} then {done}");
    assert!(killed_at.elapsed() >= Duration::from_secs(2), "not before the dead host's lease lapsed");
    let png = download(&http, h3, &done).await;
    assert_eq!(&png[..4], b"\x89PNG");
    // The hosts left still take and run new work.
    let id = submit(&http, h3, quick(9)).await;
    assert_eq!(wait_for(&http, h2, &id, &["succeeded", "failed"], Duration::from_secs(30)).await["status"], "succeeded");
}

/// The server's queue bound (`max_queued_jobs`) holds for the jobs waiting
/// on all hosts together, not per host: with every host's one worker busy,
/// four jobs submitted one after another through the three hosts are
/// taken, the next ones refused 429 `queue_full` on every host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_servers_queue_bound_holds_across_hosts() {
    let Some(shared) = shared().await else { return };
    let bounded = [("KILN_MAX_RUNNING_JOBS", "1"), ("KILN_MAX_QUEUED_JOBS", "4")];
    let hosts: Vec<Host> = ["q1", "q2", "q3"].iter().map(|name| start_with(name, &shared, &bounded)).collect();
    let http = reqwest::Client::new();
    let mut blocking = Vec::new();
    for (n, host) in hosts.iter().enumerate() {
        let id = submit(&http, host, slow(n as i64)).await;
        wait_for(&http, host, &id, &["running"], Duration::from_secs(30)).await;
        blocking.push((host, id));
    }
    let mut taken = Vec::new();
    for n in 0..7 {
        let host = &hosts[n % 3];
        let resp = http.post(format!("{}/api/v2/jobs", host.base)).json(&json!({ "workflow": quick(n as i64) })).send().await.unwrap();
        let status = resp.status().as_u16();
        let retry_after = resp.headers().get("retry-after").is_some();
        let body: Value = resp.json().await.unwrap();
        if n < 4 {
            assert_eq!(status, 201, "place {n} of 4: {body}");
            taken.push((host, body["id"].as_str().unwrap().to_string()));
        } else {
            assert_eq!((status, body["error"]["code"].as_str(), retry_after), (429, Some("queue_full"), true), "job {n} past the bound: {body}");
        }
    }
    for (host, id) in &blocking {
        let resp = http.post(format!("{}/api/v2/jobs/{id}/cancel", host.base)).send().await.unwrap();
        assert_eq!(resp.status(), 200);
    }
    for (host, id) in &taken {
        assert_eq!(wait_for(&http, host, id, &["succeeded", "failed"], Duration::from_secs(30)).await["status"], "succeeded");
    }
    // With the queue drained, every host takes work again.
    for host in &hosts {
        let id = submit(&http, host, quick(9)).await;
        assert_eq!(wait_for(&http, host, &id, &["succeeded", "failed"], Duration::from_secs(30)).await["status"], "succeeded");
    }
}

/// Blobs are collected while several hosts run: an upload deleted through
/// another host than the one that stored it leaves the bucket; the blobs
/// records still name (another upload, a job's output) stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreferenced_blobs_leave_the_bucket_while_several_hosts_run() {
    let Some(shared) = shared().await else { return };
    let sweeping = [("KILN_SWEEP_INTERVAL_S", "1")];
    let hosts: Vec<Host> = ["g1", "g2"].iter().map(|name| start_with(name, &shared, &sweeping)).collect();
    let http = reqwest::Client::new();
    let bucket = bucket(&shared);
    let stored = |hash: String| {
        let bucket = &bucket;
        async move {
            let hex = hash.trim_start_matches("blake3:").to_string();
            let objects: Vec<_> = object_store::ObjectStore::list(bucket, None).filter_map(|o| async { o.ok() }).collect().await;
            objects.iter().any(|o| o.location.as_ref().contains(&hex))
        }
    };
    let upload = |bytes: Vec<u8>| {
        let http = http.clone();
        let base = hosts[0].base.clone();
        async move {
            let form = reqwest::multipart::Form::new().text("file_path", "gc.txt").part("file", reqwest::multipart::Part::bytes(bytes).file_name("gc.txt"));
            let resp = http.post(format!("{base}/api/v2/assets")).multipart(form).send().await.unwrap();
            assert_eq!(resp.status(), 201);
            let asset: Value = resp.json().await.unwrap();
            (asset["id"].as_str().unwrap().to_string(), asset["hash"].as_str().unwrap().to_string())
        }
    };
    let (gone_id, gone_hash) = upload(format!("to be deleted {}", uuid::Uuid::new_v4()).into_bytes()).await;
    let (_, kept_hash) = upload(format!("to be kept {}", uuid::Uuid::new_v4()).into_bytes()).await;
    let job = submit(&http, &hosts[0], quick(77)).await;
    let done = wait_for(&http, &hosts[1], &job, &["succeeded", "failed"], Duration::from_secs(30)).await;
    assert_eq!(done["status"], "succeeded", "{done}");
    assert!(stored(gone_hash.clone()).await && stored(kept_hash.clone()).await);

    let resp = http.delete(format!("{}/api/v2/assets/{gone_id}", hosts[1].base)).send().await.unwrap();
    assert!(resp.status().is_success(), "{}", resp.status());
    let deadline = Instant::now() + Duration::from_secs(30);
    while stored(gone_hash.clone()).await {
        assert!(Instant::now() < deadline, "the deleted upload's blob is still in the bucket after 30 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Several passes later, what records name is still there.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(stored(kept_hash).await, "an upload still recorded keeps its blob");
    for host in &hosts {
        let png = download(&http, host, &done).await;
        assert_eq!(&png[..4], b"\x89PNG");
    }
}

/// The retention sweep takes the database's advisory lock named
/// `kiln::store::SWEEP_LEASE` (one host sweeps at a time): while another
/// session holds it (as a host in the middle of a sweep does), no host
/// expires anything; once it is released, a host's next sweep does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_retention_sweep_runs_on_one_host_at_a_time() {
    use sqlx::Connection;
    let Some(shared) = shared().await else { return };
    let mut holder = sqlx::PgConnection::connect(&env(&shared, "KILN_DATABASE_URL")).await.unwrap();
    // The lease's key: the first 8 bytes of the name's blake3, little-endian.
    let key = i64::from_le_bytes(blake3::hash(kiln::store::SWEEP_LEASE.as_bytes()).as_bytes()[..8].try_into().unwrap());
    let (taken,): (bool,) = sqlx::query_as("SELECT pg_try_advisory_lock($1)").bind(key).fetch_one(&mut holder).await.unwrap();
    assert!(taken);
    let brief = [("KILN_JOB_RETENTION_S", "1"), ("KILN_SWEEP_INTERVAL_S", "1")];
    let hosts: Vec<Host> = ["s1", "s2"].iter().map(|name| start_with(name, &shared, &brief)).collect();
    let http = reqwest::Client::new();
    let id = submit(&http, &hosts[0], quick(1)).await;
    wait_for(&http, &hosts[1], &id, &["succeeded"], Duration::from_secs(30)).await;
    // Past its retention and several sweeps of both hosts: still there.
    tokio::time::sleep(Duration::from_secs(4)).await;
    for host in &hosts {
        assert_eq!(job(&http, host, &id).await["status"], "succeeded", "no host swept while the lease was held");
    }
    let (released,): (bool,) = sqlx::query_as("SELECT pg_advisory_unlock($1)").bind(key).fetch_one(&mut holder).await.unwrap();
    assert!(released);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let resp = http.get(format!("{}/api/v2/jobs/{id}", hosts[1].base)).send().await.unwrap();
        let status = resp.status();
        let body: Value = resp.json().await.unwrap_or(Value::Null);
        if status == 404 || body["status"] == "expired" {
            break;
        }
        assert!(Instant::now() < deadline, "a host sweeps once the lease is free: {status} {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// ComfyUI's `POST /api/interrupt` on a self-hosted cluster (no accounts):
/// through either host it stops the prompts running on the others, the
/// one named by `prompt_id` alone when one is named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn comfyui_interrupt_through_another_host_stops_the_running_prompt() {
    let Some(shared) = shared().await else { return };
    let hosts: Vec<Host> = ["i1", "i2"].iter().map(|name| start(name, &shared)).collect();
    let http = reqwest::Client::new();
    let (first, second) = (submit(&http, &hosts[0], slow(41)).await, submit(&http, &hosts[1], slow(42)).await);
    wait_for(&http, &hosts[1], &first, &["running"], Duration::from_secs(30)).await;
    wait_for(&http, &hosts[0], &second, &["running"], Duration::from_secs(30)).await;
    let interrupt = |host: &Host, body: Value| http.post(format!("{}/api/interrupt", host.base)).json(&body).send();
    // Named: through the host that does not run it; the other runs on.
    assert_eq!(interrupt(&hosts[1], json!({ "prompt_id": first })).await.unwrap().status(), 200);
    let stopped = wait_for(&http, &hosts[1], &first, &["canceled", "succeeded", "failed"], Duration::from_secs(30)).await;
    assert_eq!(stopped["status"], "canceled", "{stopped}");
    assert_eq!(job(&http, &hosts[0], &second).await["status"], "running", "a prompt not named runs on");
    // Unnamed: every running prompt, wherever it runs.
    assert_eq!(interrupt(&hosts[0], json!({})).await.unwrap().status(), 200);
    let stopped = wait_for(&http, &hosts[0], &second, &["canceled", "succeeded", "failed"], Duration::from_secs(30)).await;
    assert_eq!(stopped["status"], "canceled", "{stopped}");
}
