//! Serverless deployments over real HTTP: the admin API and its
//! operator-token gate, the deployment-scoped Jobs API under
//! `/deployment/{id}/api/v2` (links carry the prefix, 429
//! `deployment_not_ready` while its plugins load, 422 `deployment_stopped`
//! after a stop), its plugin set restricting node classes, persistence
//! across a restart, the public demo, and job `logs`: present only on
//! `GET /jobs/{id}` of serverless jobs, absent everywhere else.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use super::events::{events, read_stream};
use super::{TestServer, start, start_in, trivial};
use crate::support::{HOSTILE_MANIFEST, HOSTILE_WASM, install_plugin};

const ADMIN: &str = "operator-secret-token";

fn chatty() -> Value {
    json!({ "1": { "class_type": "HostileChatty", "inputs": { "trigger": 1 } } })
}

async fn admin(s: &TestServer, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
    let mut req = s.http.request(method, format!("{}/admin{path}", s.server.url())).bearer_auth(ADMIN);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = req.send().await.unwrap();
    (resp.status().as_u16(), resp.json().await.unwrap_or(Value::Null))
}

async fn create(s: &TestServer, body: Value) -> Value {
    let (status, rec) = admin(s, reqwest::Method::POST, "/deployments", Some(body)).await;
    assert_eq!(status, 201, "{rec}");
    rec
}

async fn wait_state(s: &TestServer, id: &str, state: &str) -> Value {
    for _ in 0..1200 {
        let (status, rec) = admin(s, reqwest::Method::GET, &format!("/deployments/{id}"), None).await;
        assert_eq!(status, 200, "{rec}");
        if rec["state"] == state {
            return rec;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("deployment {id} never became {state}");
}

fn dep_url(s: &TestServer, id: &str, path: &str) -> String {
    format!("{}/deployment/{id}/api/v2{path}", s.server.url())
}

async fn dep_post(s: &TestServer, id: &str, path: &str, body: &Value) -> (u16, Value, reqwest::header::HeaderMap) {
    let resp = s.http.post(dep_url(s, id, path)).json(body).send().await.unwrap();
    let (status, headers) = (resp.status().as_u16(), resp.headers().clone());
    (status, resp.json().await.unwrap_or(Value::Null), headers)
}

async fn dep_get(s: &TestServer, id: &str, path: &str) -> (u16, Value, reqwest::header::HeaderMap) {
    let resp = s.http.get(dep_url(s, id, path)).send().await.unwrap();
    let (status, headers) = (resp.status().as_u16(), resp.headers().clone());
    (status, resp.json().await.unwrap_or(Value::Null), headers)
}

async fn dep_wait(s: &TestServer, id: &str, job: &str) -> Value {
    for _ in 0..1200 {
        let (status, rec, _) = dep_get(s, id, &format!("/jobs/{job}")).await;
        assert_eq!(status, 200, "{rec}");
        if ["succeeded", "failed", "canceled", "expired"].contains(&rec["status"].as_str().unwrap()) {
            return rec;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("job {job} did not finish");
}

fn server_with_admin(c: &mut kiln::config::Config) {
    c.admin_token = Some(ADMIN.into());
}

/// A plugin directory whose component is a FIFO: loading it blocks until
/// the test writes the component, so the deployment is `starting` until
/// then. Returns the component's path.
fn fifo_plugin(dir: &Path) -> std::path::PathBuf {
    install_plugin(dir, HOSTILE_MANIFEST, HOSTILE_WASM);
    let component = HOSTILE_MANIFEST.lines().find_map(|l| l.strip_prefix("component = ")).unwrap().trim_matches('"');
    let path = dir.join(component);
    std::fs::remove_file(&path).unwrap();
    assert!(std::process::Command::new("mkfifo").arg(&path).status().unwrap().success());
    path
}

#[tokio::test]
async fn the_admin_api_is_off_without_its_token_and_gated_with_it() {
    let off = start(|_, _| {}).await;
    let (status, body) = admin(&off, reqwest::Method::GET, "/deployments", None).await;
    assert_eq!((status, body["error"]["code"].as_str()), (404, Some("not_found")));
    let s = start(|c, _| server_with_admin(c)).await;
    let url = format!("{}/admin/deployments", s.server.url());
    let resp = s.http.get(&url).send().await.unwrap();
    assert_eq!(resp.status(), 401);
    // A token that is not the operator's: 401 (an account's key is 403,
    // tested in `api::tenants`).
    let resp = s.http.get(&url).bearer_auth("not-the-operator-token").send().await.unwrap();
    assert_eq!(resp.status(), 401);
    assert_eq!(resp.json::<Value>().await.unwrap()["error"]["code"], "unauthorized");
    let (status, body) = admin(&s, reqwest::Method::GET, "/deployments", None).await;
    assert_eq!((status, body["deployments"].as_array().map(Vec::len)), (200, Some(0)));
    // Bad specs are 400; a taken id 409; unknown ids 404.
    for bad in [json!({ "id": "Bad Id", "owner": "local" }), json!({ "id": "x" }), json!({ "id": "x", "owner": "local", "extra": 1 })] {
        let (status, body) = admin(&s, reqwest::Method::POST, "/deployments", Some(bad.clone())).await;
        assert_eq!(status, 400, "{bad} → {body}");
    }
    create(&s, json!({ "id": "dup", "owner": "local" })).await;
    let (status, _) = admin(&s, reqwest::Method::POST, "/deployments", Some(json!({ "id": "dup", "owner": "local" }))).await;
    assert_eq!(status, 409);
    let (status, _) = admin(&s, reqwest::Method::POST, "/deployments/nope/stop", None).await;
    assert_eq!(status, 404);
    let (status, _, _) = dep_get(&s, "nope", "/jobs").await;
    assert_eq!(status, 404, "an unknown deployment");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployment_is_not_ready_while_its_plugins_load_then_serves_its_own_classes_with_prefixed_links() {
    let s = start(|c, _| server_with_admin(c)).await;
    let plugins = tempfile::tempdir().unwrap();
    let hostile = plugins.path().join("hostile");
    let component = fifo_plugin(&hostile);
    let rec = create(&s, json!({ "id": "slow", "owner": "local", "plugin_dirs": [hostile] })).await;
    assert_eq!(rec["state"], "starting");
    assert_eq!(rec["api_base"], "/deployment/slow/api/v2");
    // Its plugins are loading (the component's read waits on the FIFO).
    for path in ["/jobs", "/health"] {
        let (status, body, headers) = dep_get(&s, "slow", path).await;
        assert_eq!((status, body["error"]["code"].as_str()), (429, Some("deployment_not_ready")), "{body}");
        assert!(headers["retry-after"].to_str().unwrap().parse::<u64>().unwrap() >= 1);
    }
    let (status, body, _) = dep_post(&s, "slow", "/jobs", &json!({ "workflow": trivial(1) })).await;
    assert_eq!((status, body["error"]["code"].as_str()), (429, Some("deployment_not_ready")));
    // The component arrives: the load goes on and the deployment serves.
    // (Opening the FIFO blocks until the loader reads it: on a thread.)
    std::thread::spawn(move || std::fs::write(component, HOSTILE_WASM).unwrap());
    wait_state(&s, "slow", "ready").await;

    let (status, job, _) = dep_post(&s, "slow", "/jobs", &json!({ "workflow": chatty() })).await;
    assert_eq!(status, 201, "{job}");
    let id = job["id"].as_str().unwrap();
    for (name, link) in [("self", format!("/deployment/slow/api/v2/jobs/{id}")), ("events", format!("/deployment/slow/api/v2/jobs/{id}/events"))] {
        assert_eq!(job["urls"][name], link.as_str(), "{job}");
    }
    assert_eq!(job["urls"]["cancel"], format!("/deployment/slow/api/v2/jobs/{id}/cancel"));
    assert!(job.get("logs").is_none(), "no logs on submit: {job}");
    let done = dep_wait(&s, "slow", id).await;
    assert_eq!(done["status"], "succeeded", "{done}");
    // logs: on GET of a serverless job, the tail of what it printed.
    let logs = &done["logs"];
    assert_eq!(logs["truncated"], true, "the chatty node printed more than node_log_kb: {done}");
    assert!(logs["text"].as_str().unwrap().contains("of noise from a chatty plugin"));
    assert!(logs["captured_at"].as_str().unwrap().ends_with("+00:00"));
    // Absent from the list, the cancel response and the status event.
    let (_, list, _) = dep_get(&s, "slow", "/jobs").await;
    assert!(list["jobs"].as_array().unwrap().iter().all(|j| j.get("logs").is_none()), "{list}");
    let resp = s.http.post(dep_url(&s, "slow", &format!("/jobs/{id}/cancel"))).send().await.unwrap();
    let canceled: Value = resp.json().await.unwrap();
    assert!(canceled.get("logs").is_none() && canceled["status"] == "succeeded", "{canceled}");
    let (frames, ended, _) = read_stream(&s, &dep_url(&s, "slow", &format!("/jobs/{id}/events")), Duration::from_secs(10)).await;
    assert!(ended);
    let statuses: Vec<&Value> = events(&frames).into_iter().filter(|(n, _)| *n == "status").map(|(_, d)| d).collect();
    assert!(!statuses.is_empty() && statuses.iter().all(|d| d.get("logs").is_none() && d["id"] == id), "{statuses:?}");

    // A deployment without the hostile plugin refuses its classes; the
    // bundled ones run, and even a quiet job's log is there (empty).
    create(&s, json!({ "id": "plain", "owner": "local" })).await;
    wait_state(&s, "plain", "ready").await;
    let (status, body, _) = dep_post(&s, "plain", "/jobs", &json!({ "workflow": chatty() })).await;
    assert_eq!((status, body["error"]["code"].as_str()), (422, Some("invalid_workflow")), "{body}");
    let (status, job, _) = dep_post(&s, "plain", "/jobs", &json!({ "workflow": trivial(3) })).await;
    assert_eq!(status, 201);
    let done = dep_wait(&s, "plain", job["id"].as_str().unwrap()).await;
    assert_eq!(done["status"], "succeeded");
    assert_eq!((done["logs"]["text"].as_str(), done["logs"]["truncated"].as_bool()), (Some(""), Some(false)), "{done}");
    let url = done["outputs"][0]["url"].as_str().unwrap();
    assert!(url.contains("/deployment/plain/api/v2/assets/"), "{url}");
    assert_eq!(s.http.get(url).send().await.unwrap().status(), 200);
    // A job of the server itself (self-hosted) shows no logs.
    let host_job = s.submit(trivial(4)).await;
    let host_done = s.wait(host_job["id"].as_str().unwrap()).await;
    assert!(host_done.get("logs").is_none(), "{host_done}");
    // Its compatibility API is not under the prefix.
    let resp = s.http.get(format!("{}/deployment/plain/api/object_info", s.server.url())).send().await.unwrap();
    assert_eq!(resp.status(), 404);
}

#[tokio::test]
async fn a_stopped_deployment_is_422_until_started_and_deployments_survive_a_restart() {
    let s = start(|c, _| server_with_admin(c)).await;
    let plugins = tempfile::tempdir().unwrap();
    let hostile = plugins.path().join("hostile");
    install_plugin(&hostile, HOSTILE_MANIFEST, HOSTILE_WASM);
    create(&s, json!({ "id": "svc", "owner": "local", "plugin_dirs": [hostile], "limits": { "max_running": 1, "max_queued": 5 } })).await;
    create(&s, json!({ "id": "off", "owner": "local" })).await;
    wait_state(&s, "svc", "ready").await;
    wait_state(&s, "off", "ready").await;
    let (status, job, _) = dep_post(&s, "svc", "/jobs", &json!({ "workflow": trivial(1) })).await;
    assert_eq!(status, 201);
    let job_id = job["id"].as_str().unwrap().to_string();
    dep_wait(&s, "svc", &job_id).await;
    let (status, rec) = admin(&s, reqwest::Method::POST, "/deployments/off/stop", None).await;
    assert_eq!((status, rec["state"].as_str()), (200, Some("stopped")));
    for (status, body, _) in [dep_get(&s, "off", "/jobs").await, dep_post(&s, "off", "/jobs", &json!({ "workflow": trivial(2) })).await] {
        assert_eq!((status, body["error"]["code"].as_str()), (422, Some("deployment_stopped")), "{body}");
    }
    // The deployment's queue limit holds (its own scheduling key).
    let mut codes = Vec::new();
    for i in 0..8 {
        let (status, body, _) = dep_post(&s, "svc", "/jobs", &json!({ "workflow": super::spinner(i) })).await;
        codes.push(if status == 201 { "created".to_string() } else { body["error"]["code"].as_str().unwrap().to_string() });
    }
    assert!(codes.contains(&"queue_full".to_string()), "1 running + 5 queued, then 429: {codes:?}");
    let data = s.shutdown().await;

    let s = start_in(data, |c, _| server_with_admin(c)).await;
    let (_, list) = admin(&s, reqwest::Method::GET, "/deployments", None).await;
    let states: Vec<(&str, &str)> = list["deployments"].as_array().unwrap().iter().map(|d| (d["id"].as_str().unwrap(), d["state"].as_str().unwrap())).collect();
    assert!(states.contains(&("off", "stopped")), "{states:?}");
    wait_state(&s, "svc", "ready").await;
    let (status, old, _) = dep_get(&s, "svc", &format!("/jobs/{job_id}")).await;
    assert_eq!((status, old["status"].as_str()), (200, Some("succeeded")), "{old}");
    assert_eq!(old["logs"]["truncated"], false, "the log lives as long as the job: {old}");
    let (status, _, _) = dep_get(&s, "off", "/jobs").await;
    assert_eq!(status, 422);
    let (status, rec) = admin(&s, reqwest::Method::POST, "/deployments/off/start", None).await;
    assert_eq!(status, 200, "{rec}");
    wait_state(&s, "off", "ready").await;
    let (status, _, _) = dep_get(&s, "off", "/jobs").await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn a_public_demo_takes_anonymous_callers_and_withholds_logs() {
    let s = start(|c, _| {
        server_with_admin(c);
        c.token = Some("host-token".into());
    })
    .await;
    create(&s, json!({ "id": "demo", "owner": "local", "public_demo": true })).await;
    create(&s, json!({ "id": "private", "owner": "local" })).await;
    create(&s, json!({ "id": "theirs", "owner": "acme" })).await;
    for id in ["demo", "private", "theirs"] {
        wait_state(&s, id, "ready").await;
    }
    // No credentials: the demo serves; the server's own API and a private
    // deployment do not.
    let (status, job, _) = dep_post(&s, "demo", "/jobs", &json!({ "workflow": trivial(1) })).await;
    assert_eq!(status, 201, "{job}");
    let id = job["id"].as_str().unwrap().to_string();
    let (status, _, _) = dep_get(&s, "private", "/jobs").await;
    assert_eq!(status, 401);
    assert_eq!(s.http.get(s.url("/jobs")).send().await.unwrap().status(), 401);
    // With the server's token, another account's deployment is 403.
    let resp = s.http.get(dep_url(&s, "theirs", "/jobs")).bearer_auth("host-token").send().await.unwrap();
    assert_eq!(resp.status(), 403);
    // The demo's job: finished, its log stored but withheld on read.
    let done = dep_wait(&s, "demo", &id).await;
    assert_eq!(done["status"], "succeeded");
    assert!(done.get("logs").is_none(), "{done}");
    let (stored, _) = s.server.state.service.get(&kiln::api::deployment::demo_owner("demo"), &id).await.unwrap();
    assert!(stored.logs.is_some(), "the demo stores the log");
    assert_eq!(s.server.state.service.billed_account(&stored), "local", "billed to the deployment's owner");
    // The demo identity's jobs are not the server owner's.
    let resp = s.http.get(s.url(&format!("/jobs/{id}"))).bearer_auth("host-token").send().await.unwrap();
    assert_eq!(resp.status(), 404);
}

#[tokio::test]
async fn a_serverless_servers_own_jobs_show_logs_on_get_only() {
    let s = start(|_, o| {
        o.logs_on_read = true;
        o.job_log_bytes = 1000;
    })
    .await;
    let (status, job, _) = s.post_job(&json!({ "workflow": chatty() }), None).await;
    assert_eq!(status, 201);
    assert!(job.get("logs").is_none());
    let id = job["id"].as_str().unwrap();
    let done = s.wait(id).await;
    assert_eq!(done["logs"]["truncated"], true, "{done}");
    // The job's bound (job_log_kb) keeps the tail: the last line printed.
    let text = done["logs"]["text"].as_str().unwrap();
    assert!(text.len() <= 1000 && text.contains("line 19999 of noise"), "{text:?}");
    let (_, list) = s.get("/jobs").await;
    assert!(list["jobs"].as_array().unwrap().iter().all(|j| j.get("logs").is_none()));
    let canceled: Value = s.http.post(s.url(&format!("/jobs/{id}/cancel"))).send().await.unwrap().json().await.unwrap();
    assert!(canceled.get("logs").is_none());
    // A job that is still running has no log yet (absent, not null).
    let running = s.submit(super::spinner(9)).await;
    let seen = s.wait_for(running["id"].as_str().unwrap(), "running").await;
    assert!(seen.get("logs").is_none(), "{seen}");
}

#[tokio::test]
async fn queued_jobs_of_a_deployment_stopped_across_a_restart_are_canceled_not_left_waiting() {
    let s = start(|c, _| server_with_admin(c)).await;
    let plugins = tempfile::tempdir().unwrap();
    let hostile = plugins.path().join("hostile");
    install_plugin(&hostile, HOSTILE_MANIFEST, HOSTILE_WASM);
    create(&s, json!({ "id": "gone", "owner": "local", "plugin_dirs": [hostile], "limits": { "max_running": 1, "max_queued": 10 } })).await;
    wait_state(&s, "gone", "ready").await;
    let mut ids = Vec::new();
    for i in 0..3 {
        let (status, job, _) = dep_post(&s, "gone", "/jobs", &json!({ "workflow": super::spinner(i) })).await;
        assert_eq!(status, 201);
        ids.push(job["id"].as_str().unwrap().to_string());
    }
    let data = s.shutdown().await;
    // As if the server died between a stop's record and its cancels: the
    // record says stopped, in the file or (KILN_TEST_STORE=postgres) the
    // database the data directory names.
    match std::fs::read_to_string(data.path().join("test-database-url")) {
        Ok(url) => {
            let db = sqlx::PgPool::connect(&url).await.unwrap();
            sqlx::query("UPDATE deployments SET record = jsonb_set(record, '{state}', '\"stopped\"')").execute(&db).await.unwrap();
            db.close().await;
        }
        Err(_) => {
            let file = data.path().join("deployments.json");
            let mut records: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
            records[0]["state"] = json!("stopped");
            std::fs::write(&file, serde_json::to_vec(&records).unwrap()).unwrap();
        }
    }
    let s = start_in(data, |c, _| server_with_admin(c)).await;
    for id in &ids {
        // Through the server's own surface (the deployment's answers 422).
        let job = s.job(id).await;
        assert_eq!(job["status"], "canceled", "{job}");
    }
    let (status, _, _) = dep_get(&s, "gone", "/jobs").await;
    assert_eq!(status, 422);
}

/// `{id}.{serverless_host}`: the deployment's Jobs API at `/api/v2`, links
/// without a prefix; an unknown label answers as an unknown deployment;
/// other hosts reach the server itself; `X-Forwarded-Host` only when
/// trusted.
#[tokio::test]
async fn a_deployment_answers_on_its_subdomain_of_the_serverless_host() {
    let s = start(|c, _| {
        server_with_admin(c);
        c.serverless_host = Some("run.test".into());
    })
    .await;
    create(&s, json!({ "id": "sub-a", "owner": "local" })).await;
    wait_state(&s, "sub-a", "ready").await;
    let on = |host: &str, path: &str| s.http.get(format!("{}{path}", s.server.url())).header("host", host.to_string());
    let submit = s.http.post(format!("{}/api/v2/jobs", s.server.url())).header("host", "sub-a.run.test:8080").json(&json!({ "workflow": trivial(5) }));
    let resp = submit.send().await.unwrap();
    assert_eq!(resp.status(), 201);
    let job: Value = resp.json().await.unwrap();
    let own = job["urls"]["self"].as_str().unwrap().to_string();
    assert!(own.starts_with("/api/v2/jobs/"), "links carry no prefix on the subdomain: {own}");
    // The same job through the deployment's prefix: it is the deployment's.
    let id = job["id"].as_str().unwrap();
    let done = dep_wait(&s, "sub-a", id).await;
    assert_eq!(done["status"], "succeeded");
    assert_eq!(on("SUB-A.Run.Test", &own).send().await.unwrap().status(), 200, "host names are case-insensitive");
    assert_eq!(on("nope.run.test", "/api/v2/jobs").send().await.unwrap().status(), 404, "an unknown label is an unknown deployment");
    assert_eq!(on("sub-a.run.test", "/api/object_info").send().await.unwrap().status(), 404, "only the Jobs API is on the subdomain");
    assert_eq!(on("run.test", "/api/v2/health").send().await.unwrap().status(), 200, "the bare host is the server's");
    // The deployment's state answers there: stopped, its subdomain is 422.
    let (status, _) = admin(&s, reqwest::Method::POST, "/deployments/sub-a/stop", None).await;
    assert_eq!(status, 200);
    let resp = on("sub-a.run.test", "/api/v2/jobs").send().await.unwrap();
    assert_eq!((resp.status().as_u16(), resp.json::<Value>().await.unwrap()["error"]["code"].clone()), (422, json!("deployment_stopped")));
    // X-Forwarded-Host counts only when trusted: here the server's own API answers.
    let forwarded = s.http.get(format!("{}/api/v2/jobs", s.server.url())).header("x-forwarded-host", "sub-a.run.test").send().await.unwrap();
    assert_eq!(forwarded.status(), 200);
}
