//! Cloud mode across hosts: accounts made, topped up or disabled through
//! one host hold on all; a tenant's queue bound and credits hold across
//! concurrent submissions on all three, and its tier's running limit across
//! the jobs queued on all three (other accounts' jobs going on meanwhile);
//! the same bytes uploaded through two hosts are one object.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{Value, json};

use super::*;

/// Creates account `name` through `host`; its API key.
pub(super) async fn create_account(http: &reqwest::Client, host: &Host, name: &str, credits: i64) -> String {
    create_account_with(http, host, json!({"name": name, "credits": credits})).await
}

/// `POST /admin/accounts` with `body` through `host`: the new account's key.
async fn create_account_with(http: &reqwest::Client, host: &Host, body: Value) -> String {
    let resp = http.post(format!("{}/admin/accounts", host.base)).bearer_auth(ADMIN).json(&body).send().await.unwrap();
    assert_eq!(resp.status(), 201, "{body}");
    resp.json::<Value>().await.unwrap()["key"].as_str().unwrap().to_string()
}

/// Tiers of the running-limit tests: every account runs one job at a time,
/// except those on tier `wide` (three).
const ONE_AT_A_TIME: &str = "default_tier = \"one\"\n[tiers.one]\nmax_running = 1\nmax_queued = 20\n[tiers.wide]\nmax_running = 3\nmax_queued = 20\n";

async fn admin(http: &reqwest::Client, host: &Host, path: &str, body: Value) -> Value {
    let resp = http.post(format!("{}/admin/accounts/{path}", host.base)).bearer_auth(ADMIN).json(&body).send().await.unwrap();
    assert_eq!(resp.status(), 200, "{path}");
    resp.json().await.unwrap()
}

async fn balance(http: &reqwest::Client, host: &Host, name: &str) -> i64 {
    let account: Value = http.get(format!("{}/admin/accounts/{name}", host.base)).bearer_auth(ADMIN).send().await.unwrap().json().await.unwrap();
    account["credits"].as_i64().unwrap_or_else(|| panic!("{account}"))
}

/// Submits as `key` through `host`: the status and the body.
pub(super) async fn submit_as(http: &reqwest::Client, host: &Host, key: &str, workflow: Value) -> (u16, Value) {
    let resp = http.post(format!("{}/api/v2/jobs", host.base)).bearer_auth(key).json(&json!({ "workflow": workflow })).send().await.unwrap();
    (resp.status().as_u16(), resp.json().await.unwrap_or(Value::Null))
}

async fn job_as(http: &reqwest::Client, host: &Host, key: &str, id: &str) -> Value {
    http.get(format!("{}/api/v2/jobs/{id}", host.base)).bearer_auth(key).send().await.unwrap().json().await.unwrap()
}

/// Polls `host` as `key` until job `id`'s status is one of `wanted`. The
/// 90 s bound only catches a hang: with several clusters of the suite on a
/// small machine, a [`slow`] job may take ten times its lone run.
pub(super) async fn wait_as(http: &reqwest::Client, host: &Host, key: &str, id: &str, wanted: &[&str]) -> Value {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let job = job_as(http, host, key, id).await;
        if wanted.contains(&job["status"].as_str().unwrap_or("")) {
            return job;
        }
        assert!(Instant::now() < deadline, "job {id} never reached {wanted:?}: {job}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls until `check` holds for the status `GET /api/v2/jobs` answers `key` on `host`.
pub(super) async fn until_status(http: &reqwest::Client, host: &Host, key: &str, check: impl Fn(u16) -> bool, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let status = http.get(format!("{}/api/v2/jobs", host.base)).bearer_auth(key).send().await.unwrap().status().as_u16();
        if check(status) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: still {status} after 10 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Submits `workflow` as `key` `per_host` times on each host, all at once.
async fn burst(http: &reqwest::Client, hosts: &[Host], key: &str, per_host: usize, workflow: impl Fn(usize) -> Value) -> Vec<(usize, u16, Value)> {
    let racing = (0..per_host * hosts.len()).map(|n| {
        let (http, host, workflow) = (http.clone(), &hosts[n % hosts.len()], workflow(n));
        async move {
            let (status, body) = submit_as(&http, host, key, workflow).await;
            (n % hosts.len(), status, body)
        }
    });
    futures_util::future::join_all(racing).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_hold_across_hosts() {
    let Some(shared) = shared().await else { return };
    // One job at a time per host; a tenant may have six waiting in all;
    // a job costs 10 credits a second, at least 5.
    let cloud = [
        ("KILN_MODE", "cloud"),
        ("KILN_ADMIN_TOKEN", ADMIN),
        ("KILN_MAX_RUNNING_JOBS", "1"),
        ("KILN_MAX_QUEUED_JOBS_PER_ACCOUNT", "6"),
        ("KILN_CREDITS_MIN_PER_JOB", "5"),
        ("KILN_CREDITS_PER_SECOND", "10"),
    ];
    let hosts: Vec<Host> = ["t1", "t2", "t3"].iter().map(|name| start_with(name, &shared, &cloud)).collect();
    let http = reqwest::Client::new();
    let [h1, h2, h3] = [&hosts[0], &hosts[1], &hosts[2]];

    // Accounts made on h1 are known to h2 and h3 at once.
    let blocker = create_account(&http, h1, "blocker", 1_000_000).await;
    let tenant = create_account(&http, h1, "tenant", 1_000_000).await;
    let poor = create_account(&http, h1, "poor", 10).await;
    for host in [h2, h3] {
        until_status(&http, host, &tenant, |s| s == 200, "a key made on h1 works on the others").await;
        until_status(&http, host, &poor, |s| s == 200, "a key made on h1 works on the others").await;
    }

    // Every host's one worker busy with a long job of another account ...
    let mut blocking = Vec::new();
    for host in &hosts {
        let (status, body) = submit_as(&http, host, &blocker, slow(1)).await;
        assert_eq!(status, 201, "{body}");
        blocking.push(body["id"].as_str().unwrap().to_string());
    }
    for (host, id) in hosts.iter().zip(&blocking) {
        wait_as(&http, host, &blocker, id, &["running"]).await;
    }
    // ... a tenant submitting 15 jobs on all three at once has 6 taken.
    let answers = burst(&http, &hosts, &tenant, 5, |n| quick(n as i64)).await;
    let taken: Vec<_> = answers.iter().filter(|(_, status, _)| *status == 201).collect();
    assert_eq!(taken.len(), 6, "the tenant's queue bound holds across hosts: {answers:?}");
    for (_, status, body) in &answers {
        assert!(*status == 201 || (*status == 429 && body["error"]["code"] == "queue_full"), "{status} {body}");
    }

    // ComfyUI's queue on any host shows the jobs of every host.
    let queue: Value = http.get(format!("{}/api/queue", h1.base)).header("X-API-Key", &tenant).send().await.unwrap().json().await.unwrap();
    let mut pending: Vec<&str> = queue["queue_pending"].as_array().unwrap_or_else(|| panic!("{queue}")).iter().map(|e| e[1].as_str().unwrap()).collect();
    let mut expected: Vec<&str> = taken.iter().map(|(_, _, body)| body["id"].as_str().unwrap()).collect();
    pending.sort();
    expected.sort();
    assert_eq!(pending, expected, "{queue}");
    let counted: Value = http.get(format!("{}/api/prompt", h3.base)).header("X-API-Key", &tenant).send().await.unwrap().json().await.unwrap();
    assert_eq!(counted["exec_info"]["queue_remaining"], 6, "{counted}");
    let queue: Value = http.get(format!("{}/api/queue", h2.base)).header("X-API-Key", &blocker).send().await.unwrap().json().await.unwrap();
    assert_eq!(queue["queue_running"].as_array().unwrap().len(), 3, "{queue}");

    // Disabled through h2: its keys fail on h3, and its jobs waiting on
    // every host are canceled (read from the database they share).
    admin(&http, h2, "tenant/disable", json!({})).await;
    until_status(&http, h3, &tenant, |s| s == 403, "an account disabled on h2 is disabled on h3").await;
    let db = sqlx::PgPool::connect(&env(&shared, "KILN_DATABASE_URL")).await.unwrap();
    for (_, _, body) in &taken {
        let id = body["id"].as_str().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let (status,): (String,) = sqlx::query_as("SELECT status FROM jobs WHERE id = $1").bind(id).fetch_one(&db).await.unwrap();
            if status == "canceled" {
                break;
            }
            assert!(Instant::now() < deadline, "job {id} of the disabled account is still {status}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    // ComfyUI's interrupt through h3 stops the account's running jobs on all.
    let resp = http.post(format!("{}/api/interrupt", h3.base)).header("X-API-Key", &blocker).json(&json!({})).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    for (host, id) in hosts.iter().zip(&blocking) {
        wait_as(&http, host, &blocker, id, &["canceled"]).await;
    }

    // An account with 10 credits, at 5 a job at least: six submissions at
    // once on all three hosts have exactly two taken, whatever order they
    // reach the database in, and its balance ends at zero, never below.
    let answers = burst(&http, &hosts, &poor, 2, |n| quick(300 + n as i64)).await;
    let taken: Vec<_> = answers.iter().filter(|(_, status, _)| *status == 201).collect();
    assert_eq!(taken.len(), 2, "10 credits cover two jobs at 5: {answers:?}");
    for (_, status, body) in &answers {
        assert!(*status == 201 || (*status == 402 && body["error"]["code"] == "insufficient_credits"), "{status} {body}");
    }
    for (host, _, body) in &taken {
        wait_as(&http, &hosts[(host + 1) % 3], &poor, body["id"].as_str().unwrap(), &["succeeded"]).await;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while balance(&http, h3, "poor").await != 0 {
        assert!(Instant::now() < deadline, "both charges of 5 land: {}", balance(&http, h3, "poor").await);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Topped up to 10 again: a job queued on h2 behind another account's
    // long job holds 5, a long one run on h1 the other 5, so a third is
    // refused on every host. The long one costs more than its minimum (its
    // time), which takes the balance below zero; when h2's worker comes to
    // the queued job, it does not run. (A ComfyUI prompt with
    // `extra_pnginfo`, which h2 holds in memory: no idle host takes it
    // from h2's queue.)
    admin(&http, h3, "poor/credits", json!({"amount": 10})).await;
    // (Busy until canceled: it must not end before the long job is charged.)
    let busy = submit_as(&http, h2, &blocker, long(2)).await.1["id"].as_str().unwrap().to_string();
    wait_as(&http, h2, &blocker, &busy, &["running"]).await;
    let pinned = json!({ "prompt": quick(100), "extra_data": { "extra_pnginfo": { "workflow": {} } } });
    let deadline = Instant::now() + Duration::from_secs(10);
    let queued = loop {
        // (h2 may not have heard of the top-up yet.)
        let resp = http.post(format!("{}/api/prompt", h2.base)).header("X-API-Key", &poor).json(&pinned).send().await.unwrap();
        if resp.status() == 200 {
            break resp.json::<Value>().await.unwrap()["prompt_id"].as_str().unwrap().to_string();
        }
        assert!(resp.status() == 402 && Instant::now() < deadline, "{}", resp.status());
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let (status, long) = submit_as(&http, h1, &poor, slow(101)).await;
    assert_eq!(status, 201, "{long}");
    for host in &hosts {
        let (status, body) = submit_as(&http, host, &poor, quick(0)).await;
        assert_eq!((status, body["error"]["code"].as_str()), (402, Some("insufficient_credits")), "two jobs hold all 10 credits: {body}");
    }
    let long = wait_as(&http, h3, &poor, long["id"].as_str().unwrap(), &["succeeded", "failed"]).await;
    assert_eq!(long["status"], "succeeded", "{long}");
    let deadline = Instant::now() + Duration::from_secs(10);
    let overdrawn = loop {
        let now = balance(&http, h3, "poor").await;
        if now < 0 {
            break now;
        }
        assert!(Instant::now() < deadline, "the long job's charge (more than 10) lands: {now}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    http.post(format!("{}/api/v2/jobs/{busy}/cancel", h1.base)).bearer_auth(&blocker).send().await.unwrap();
    let stopped = wait_as(&http, h3, &poor, &queued, &["succeeded", "failed"]).await;
    assert_eq!((stopped["status"].as_str(), stopped["error"]["code"].as_str()), (Some("failed"), Some("insufficient_credits")), "{stopped}");
    for host in &hosts {
        let (status, body) = submit_as(&http, host, &poor, quick(0)).await;
        assert_eq!((status, body["error"]["code"].as_str()), (402, Some("insufficient_credits")), "{body}");
    }
    assert_eq!(balance(&http, h1, "poor").await, overdrawn, "the job that never ran cost nothing");

    // Topped up through h3, it submits through h1 again ...
    admin(&http, h3, "poor/credits", json!({"amount": 1000})).await;
    let topped = overdrawn + 1000;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body) = submit_as(&http, h1, &poor, quick(1)).await;
        if status == 201 {
            wait_as(&http, h1, &poor, body["id"].as_str().unwrap(), &["succeeded"]).await;
            break;
        }
        assert!(status == 402 && Instant::now() < deadline, "{status} {body}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // ... and six jobs at once on all three hosts are all charged, once each.
    let answers = burst(&http, &hosts, &poor, 2, |n| quick(200 + n as i64)).await;
    for (host, status, body) in &answers {
        assert_eq!(*status, 201, "{body}");
        wait_as(&http, &hosts[(host + 1) % 3], &poor, body["id"].as_str().unwrap(), &["succeeded"]).await;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while balance(&http, h2, "poor").await != topped - 5 - 6 * 5 {
        assert!(Instant::now() < deadline, "every charge lands once: {}", balance(&http, h2, "poor").await);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // The same bytes uploaded through two hosts are one object in the bucket.
    let bytes = format!("the same bytes, {}", uuid::Uuid::new_v4()).into_bytes();
    let (mut hashes, mut ids) = (Vec::new(), Vec::new());
    for (host, created) in [(h1, 201), (h2, 200)] {
        let form =
            reqwest::multipart::Form::new().text("file_path", "same.txt").part("file", reqwest::multipart::Part::bytes(bytes.clone()).file_name("same.txt"));
        let resp = http.post(format!("{}/api/v2/assets", host.base)).bearer_auth(&blocker).multipart(form).send().await.unwrap();
        // The second host finds the first's asset: 200, the same one.
        assert_eq!(resp.status(), created);
        let asset: Value = resp.json().await.unwrap();
        hashes.push(asset["hash"].as_str().unwrap().to_string());
        ids.push(asset["id"].as_str().unwrap().to_string());
    }
    assert_eq!((&hashes[0], &ids[0]), (&hashes[1], &ids[1]));
    assert_eq!(hashes[0], format!("blake3:{}", blake3::hash(&bytes).to_hex()));
    let bucket = bucket(&shared);
    let hex = hashes[0].trim_start_matches("blake3:").to_string();
    let objects: Vec<_> = object_store::ObjectStore::list(&bucket, None)
        .filter_map(|o| async { o.ok() })
        .filter(|o| futures_util::future::ready(o.location.as_ref().contains(&hex)))
        .collect()
        .await;
    assert_eq!(objects.len(), 1, "one object holds the bytes both hosts took: {objects:?}");
}

/// A job that runs for about twenty seconds (a hundred and twenty blurs of
/// a 2048² image): canceled before it ends.
fn long(seed: i64) -> Value {
    let mut graph = json!({
        "1": {"class_type": "EmptyImage", "inputs": {"width": 2048, "height": 2048, "batch_size": 1, "color": seed}},
    });
    let last = blurs(&mut graph, 120);
    graph["999"] = json!({"class_type": "SaveImage", "inputs": {"images": [last, 0], "filename_prefix": "long"}});
    graph
}

/// A job that runs for about half a second (four blurs of a 2048² image).
fn medium(seed: i64) -> Value {
    let mut graph = json!({
        "1": {"class_type": "EmptyImage", "inputs": {"width": 2048, "height": 2048, "batch_size": 1, "color": seed}},
    });
    for n in 2..6 {
        graph[n.to_string()] = json!({"class_type": "ImageBlur", "inputs": {"image": [(n - 1).to_string(), 0], "blur_radius": 15, "sigma": 4.0}});
    }
    graph["9"] = json!({"class_type": "SaveImage", "inputs": {"images": ["5", 0], "filename_prefix": "medium"}});
    graph
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tiers_running_limit_holds_across_hosts() {
    let Some(shared) = shared().await else { return };
    // Two workers per host; every account's tier runs one job at a time
    // (the other account's, three).
    let config = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(config.path(), ONE_AT_A_TIME).unwrap();
    let cloud = [("KILN_MODE", "cloud"), ("KILN_ADMIN_TOKEN", ADMIN), ("KILN_MAX_RUNNING_JOBS", "2"), ("KILN_CONFIG", config.path().to_str().unwrap())];
    let hosts: Vec<Host> = ["r1", "r2", "r3"].iter().map(|name| start_with(name, &shared, &cloud)).collect();
    let http = reqwest::Client::new();
    let tenant = create_account(&http, &hosts[0], "tenant", 1_000_000).await;
    // (Another tier's limit: its three jobs never wait for each other.)
    let other = create_account_with(&http, &hosts[0], json!({"name": "other", "credits": 1_000_000, "tier": "wide"})).await;
    for host in &hosts[1..] {
        until_status(&http, host, &tenant, |s| s == 200, "a key made on r1 works on the others").await;
        until_status(&http, host, &other, |s| s == 200, "a key made on r1 works on the others").await;
    }

    // Six jobs of the tenant, two through each host, all at once: six free
    // workers, one job running at a time in all (watched in the database).
    let answers = burst(&http, &hosts, &tenant, 2, |n| medium(n as i64)).await;
    let ids: Vec<String> = answers
        .iter()
        .map(|(_, status, body)| {
            assert_eq!(*status, 201, "{body}");
            body["id"].as_str().unwrap().to_string()
        })
        .collect();
    let db = sqlx::PgPool::connect(&env(&shared, "KILN_DATABASE_URL")).await.unwrap();
    let watching = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let watcher = {
        let (db, ids, watching) = (db.clone(), ids.clone(), watching.clone());
        tokio::spawn(async move {
            let mut most = 0;
            while watching.load(std::sync::atomic::Ordering::SeqCst) {
                let (running,): (i64,) = sqlx::query_as("SELECT count(*) FROM jobs WHERE id = ANY($1) AND status IN ('running', 'canceling')")
                    .bind(&ids)
                    .fetch_one(&db)
                    .await
                    .unwrap();
                most = most.max(running);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            most
        })
    };
    // Another account's jobs start on every host meanwhile (the tenant's
    // key is held, not the workers).
    let mut theirs = Vec::new();
    for host in &hosts {
        let (status, body) = submit_as(&http, host, &other, quick(7)).await;
        assert_eq!(status, 201, "{body}");
        theirs.push((host, body["id"].as_str().unwrap().to_string()));
    }
    for (host, id) in &theirs {
        wait_as(&http, host, &other, id, &["succeeded"]).await;
    }
    let (waiting,): (i64,) = sqlx::query_as("SELECT count(*) FROM jobs WHERE id = ANY($1) AND status = 'queued'").bind(&ids).fetch_one(&db).await.unwrap();
    assert!(waiting > 0, "the other account's jobs did not wait for the tenant's six");
    // (Each host runs the jobs submitted to it: the six ran on all three.)
    for ((host, _, _), id) in answers.iter().zip(&ids) {
        let job = wait_as(&http, &hosts[(host + 1) % 3], &tenant, id, &["succeeded", "failed"]).await;
        assert_eq!(job["status"], "succeeded", "{job}");
    }
    watching.store(false, std::sync::atomic::Ordering::SeqCst);
    let most = watcher.await.unwrap();
    assert_eq!(most, 1, "the tier's one running job holds on all three hosts");
}

/// A host whose queued jobs all wait on their account's running limit is
/// idle for other work: it takes another account's job queued on a busy
/// host, which runs beside that account's first job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_whose_queue_waits_on_a_running_limit_takes_other_work() {
    let Some(shared) = shared().await else { return };
    let config = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(config.path(), ONE_AT_A_TIME).unwrap();
    let cloud =
        |workers| [("KILN_MODE", "cloud"), ("KILN_ADMIN_TOKEN", ADMIN), ("KILN_MAX_RUNNING_JOBS", workers), ("KILN_CONFIG", config.path().to_str().unwrap())];
    // h1 has two workers, h2 one.
    let (h1, h2) = (start_with("l1", &shared, &cloud("2")), start_with("l2", &shared, &cloud("1")));
    let http = reqwest::Client::new();
    let limited = create_account(&http, &h1, "limited", 1_000_000).await;
    let wide = create_account_with(&http, &h1, json!({"name": "wide", "credits": 1_000_000, "tier": "wide"})).await;
    until_status(&http, &h2, &wide, |s| s == 200, "a key made on l1 works on l2").await;
    // On h1: the limited account's first job runs, its second waits for it.
    let running = submit_as(&http, &h1, &limited, slow(1)).await.1["id"].as_str().unwrap().to_string();
    wait_as(&http, &h1, &limited, &running, &["running"]).await;
    let waiting = submit_as(&http, &h1, &limited, quick(2)).await.1["id"].as_str().unwrap().to_string();
    // On h2 (one worker): the other account's first job runs, its second
    // queues behind it; h1's free worker takes it and runs it while the
    // first still runs (h2 alone could not).
    let first = submit_as(&http, &h2, &wide, slow(3)).await.1["id"].as_str().unwrap().to_string();
    wait_as(&http, &h2, &wide, &first, &["running"]).await;
    let second = submit_as(&http, &h2, &wide, quick(4)).await.1["id"].as_str().unwrap().to_string();
    let second_ran = wait_as(&http, &h2, &wide, &second, &["running", "succeeded", "failed"]).await;
    assert_ne!(second_ran["status"], "failed", "{second_ran}");
    assert_eq!(job_as(&http, &h2, &wide, &first).await["status"], "running", "both of its jobs ran at once");
    assert_eq!(job_as(&http, &h1, &limited, &waiting).await["status"], "queued", "the limited account's second job still waits");
    for (key, id) in [(&limited, &running), (&limited, &waiting), (&wide, &first), (&wide, &second)] {
        let done = wait_as(&http, &h2, key, id, &["succeeded", "failed"]).await;
        assert_eq!(done["status"], "succeeded", "{done}");
    }
}

/// Fair turns hold across hosts: one account floods both hosts, another
/// only the first. The second host gives the second account turns too (it
/// takes one of its jobs at a time from the first host's queue), so its
/// jobs are done about as soon as on one host serving both: when its last
/// one starts, about half of the first account's have, not nearly all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_account_flooding_one_host_gets_turns_on_every_host() {
    let Some(shared) = shared().await else { return };
    let cloud = [("KILN_MODE", "cloud"), ("KILN_ADMIN_TOKEN", ADMIN), ("KILN_MAX_RUNNING_JOBS", "1")];
    let (h1, h2) = (start_with("f1", &shared, &cloud), start_with("f2", &shared, &cloud));
    let http = reqwest::Client::new();
    let everywhere = create_account(&http, &h1, "everywhere", 1_000_000).await;
    let one_host = create_account(&http, &h1, "one-host", 1_000_000).await;
    until_status(&http, &h2, &everywhere, |s| s == 200, "a key made on f1 works on f2").await;
    let per_host = 8;
    let mut jobs: Vec<(&str, String)> = Vec::new();
    for n in 0..per_host {
        let (_, body) = submit_as(&http, &h2, &everywhere, medium(n)).await;
        jobs.push(("everywhere", body["id"].as_str().unwrap_or_else(|| panic!("{body}")).to_string()));
    }
    for n in 0..per_host {
        for (name, key) in [("everywhere", &everywhere), ("one-host", &one_host)] {
            let (_, body) = submit_as(&http, &h1, key, medium(100 + n)).await;
            jobs.push((name, body["id"].as_str().unwrap_or_else(|| panic!("{body}")).to_string()));
        }
    }
    let mut started = Vec::new();
    for (name, id) in &jobs {
        let key = if *name == "everywhere" { &everywhere } else { &one_host };
        let done = wait_as(&http, &h1, key, id, &["succeeded", "failed"]).await;
        assert_eq!(done["status"], "succeeded", "{done}");
        started.push((*name, done["started_at"].as_str().unwrap().to_string()));
    }
    // (RFC 3339 times of one clock, in UTC: they sort as text.)
    let last_of_one_host = started.iter().filter(|(name, _)| *name == "one-host").map(|(_, at)| at.clone()).max().unwrap();
    let everywhere_before = started.iter().filter(|(name, at)| *name == "everywhere" && *at < last_of_one_host).count();
    // With turns, 9 or 10 of "everywhere"'s 16 start before "one-host"'s
    // last (each host alternates the two accounts, the second host from
    // its first turn on); without them, 15 (only the first host serves
    // "one-host").
    let everywhere_jobs = 2 * per_host as usize;
    assert!(everywhere_before <= everywhere_jobs * 3 / 4, "{everywhere_before} of {everywhere_jobs} started before the other account's last: {started:?}");
}
