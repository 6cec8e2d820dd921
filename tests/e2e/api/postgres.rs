//! A server on the PostgreSQL store (`store = "postgres"`), over real HTTP
//! on loopback against a real PostgreSQL (`KILN_TEST_DATABASE_URL`; `.ci/run`
//! starts one; without it these skip outside CI): jobs run and their
//! outputs download, an Idempotency-Key is single-use (eight racing
//! submissions: one 201), and after a restart the jobs, the claims and the
//! accounts (cloud) are still there and new jobs run.

use kiln::config::{Mode, StoreKind};
use serde_json::{Value, json};

use super::{fresh_database, load_save, png_bytes, start_in, trivial};

fn on_postgres(url: String, mode: Mode) -> impl FnOnce(&mut kiln::config::Config, &mut kiln::service::ServiceOptions) {
    move |c, o| {
        c.store = StoreKind::Postgres;
        c.database_url = Some(url);
        c.mode = mode;
        o.mode = mode;
        if mode.has_accounts() {
            c.admin_token = Some("pg-operator".into());
        }
    }
}

#[tokio::test]
async fn jobs_and_claims_live_in_postgres_across_a_restart() {
    let Some(url) = fresh_database().await else { return };
    let s = start_in(tempfile::tempdir().unwrap(), on_postgres(url.clone(), Mode::SelfHosted)).await;
    let (code, asset) = s.upload("in.png", png_bytes(8, 8, 3), None).await;
    assert_eq!(code, 201, "{asset}");
    let done = s.wait(s.submit(load_save(&asset)).await["id"].as_str().unwrap()).await;
    assert_eq!(done["status"], "succeeded", "{done}");
    let output = done["outputs"][0]["url"].as_str().unwrap().to_string();
    let body = json!({ "workflow": trivial(7) });
    let racing = (0..8).map(|_| {
        let (http, url, body) = (s.http.clone(), s.url("/jobs"), body.clone());
        async move { http.post(url).header("Idempotency-Key", "pg-key").json(&body).send().await.unwrap().status().as_u16() }
    });
    let mut codes = futures_util::future::join_all(racing).await;
    codes.sort();
    assert_eq!(codes, [201, 422, 422, 422, 422, 422, 422, 422]);

    let data = s.shutdown().await;
    let s = start_in(data, on_postgres(url, Mode::SelfHosted)).await;
    assert_eq!(s.job(done["id"].as_str().unwrap()).await["status"], "succeeded");
    let (again, refused, _) = s.post_job(&body, Some("pg-key")).await;
    assert_eq!((again, refused["error"]["code"].as_str()), (422, Some("idempotency_key_reuse")), "the claim outlived the restart");
    let listed: Value = s.http.get(s.url("/jobs?limit=10")).send().await.unwrap().json().await.unwrap();
    assert_eq!(listed["jobs"].as_array().unwrap().len(), 2, "{listed}");
    for job in listed["jobs"].as_array().unwrap() {
        s.wait(job["id"].as_str().unwrap()).await;
    }
    // (The new server listens on another port: the same path there.)
    let path = output.split_once("/api/v2").unwrap().1;
    let bytes = s.http.get(s.url(path)).send().await.unwrap().bytes().await.unwrap();
    assert_eq!(&bytes[..4], b"\x89PNG");
    // New jobs still run.
    let newer = s.submit(trivial(9)).await;
    assert_eq!(s.wait(newer["id"].as_str().unwrap()).await["status"], "succeeded");
}

#[tokio::test]
async fn accounts_live_in_postgres_across_a_restart() {
    let Some(url) = fresh_database().await else { return };
    let s = start_in(tempfile::tempdir().unwrap(), on_postgres(url.clone(), Mode::Cloud)).await;
    let created: Value = s
        .http
        .post(format!("{}/admin/accounts", s.server.url()))
        .bearer_auth("pg-operator")
        .json(&json!({ "name": "pg-tenant", "credits": 100 }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let key = created["key"].as_str().unwrap().to_string();
    let job: Value = s.http.post(s.url("/jobs")).bearer_auth(&key).json(&json!({ "workflow": trivial(3) })).send().await.unwrap().json().await.unwrap();
    let id = job["id"].as_str().unwrap().to_string();
    for _ in 0..400 {
        let now: Value = s.http.get(s.url(&format!("/jobs/{id}"))).bearer_auth(&key).send().await.unwrap().json().await.unwrap();
        if now["status"] == "succeeded" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    let data = s.shutdown().await;
    let s = start_in(data, on_postgres(url, Mode::Cloud)).await;
    let seen = s.http.get(s.url(&format!("/jobs/{id}"))).bearer_auth(&key).send().await.unwrap();
    assert_eq!(seen.status(), 200, "the account and its job are still there");
    let account: Value =
        s.http.get(format!("{}/admin/accounts/pg-tenant", s.server.url())).bearer_auth("pg-operator").send().await.unwrap().json().await.unwrap();
    assert!(account["credits"].as_i64().unwrap() <= 100, "{account}");
}
