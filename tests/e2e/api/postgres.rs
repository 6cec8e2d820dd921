//! A server on the PostgreSQL store (`store = "postgres"`), over real HTTP
//! on loopback against a real PostgreSQL (`KILN_TEST_DATABASE_URL`; `.ci/run`
//! starts one; without it these skip outside CI): jobs run and their
//! outputs download, an Idempotency-Key is single-use (eight racing
//! submissions: one 201), and after a restart the jobs, the claims and the
//! accounts (cloud) are still there and new jobs run; a deployment made
//! from a bundle on one host is served by another host with a data
//! directory of its own once the first is gone, as do account keys and
//! signed URLs made on the first (the secrets are the database's) and the
//! web frontend's settings and saved workflows.

use kiln::config::{Mode, StoreKind};
use serde_json::{Value, json};

use super::{fresh_database, load_save, png_bytes, start_in, trivial};
use crate::own_postgres::OwnPostgres;

fn on_postgres(url: String, mode: Mode) -> impl FnOnce(&mut kiln::config::Config, &mut kiln::service::ServiceOptions) {
    move |c, o| {
        c.store = StoreKind::Postgres;
        c.database_url = Some(url);
        // One host id per data directory: a restart on it is the same host.
        c.host_id = Some(format!("pg-{}", &blake3::hash(c.data_dir.to_string_lossy().as_bytes()).to_hex()[..8]));
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
    let (key, job) = account_with_a_finished_job(&s, "pg-tenant").await;
    let id = job["id"].as_str().unwrap().to_string();
    let data = s.shutdown().await;
    let s = start_in(data, on_postgres(url, Mode::Cloud)).await;
    let seen = s.http.get(s.url(&format!("/jobs/{id}"))).bearer_auth(&key).send().await.unwrap();
    assert_eq!(seen.status(), 200, "the account and its job are still there");
    let account: Value =
        s.http.get(format!("{}/admin/accounts/pg-tenant", s.server.url())).bearer_auth("pg-operator").send().await.unwrap().json().await.unwrap();
    assert!(account["credits"].as_i64().unwrap() <= 100, "{account}");
}

/// A deployment from a bundle, created on one host, is served by a second
/// host (a new data directory, the same database) after the first is gone:
/// its record and its bundle live in PostgreSQL.
#[tokio::test]
async fn a_deployment_and_its_bundle_outlive_the_host_that_created_them() {
    use kiln::bundle::{Include, PackOptions};
    let Some(url) = fresh_database().await else { return };
    let options = PackOptions { name: "solid".into(), version: "1".into(), include: Include::Installed, fixed: Default::default() };
    let limits = kiln::workflow::WorkflowLimits::default();
    let registry = &crate::support::env().await.registry;
    let bundle = kiln::bundle::pack(registry, &[("solid".into(), trivial(5))], &Default::default(), &options, &limits).unwrap();
    let host = |url: String| {
        move |c: &mut kiln::config::Config, o: &mut kiln::service::ServiceOptions| {
            on_postgres(url, Mode::SelfHosted)(c, o);
            c.admin_token = Some("pg-operator".into());
        }
    };
    let first = start_in(tempfile::tempdir().unwrap(), host(url.clone())).await;
    let form = reqwest::multipart::Form::new()
        .part("deployment", reqwest::multipart::Part::text(json!({"id": "solid", "owner": "local"}).to_string()))
        .part("bundle", reqwest::multipart::Part::bytes(bundle.to_bytes().unwrap()));
    let resp = first.http.post(format!("{}/admin/deployments", first.server.url())).bearer_auth("pg-operator").multipart(form).send().await.unwrap();
    assert_eq!(resp.status(), 201, "{}", resp.text().await.unwrap());
    drop(first.shutdown().await);

    let second = start_in(tempfile::tempdir().unwrap(), host(url)).await;
    let admin = format!("{}/admin/deployments/solid", second.server.url());
    let shown: Value = second.http.get(&admin).bearer_auth("pg-operator").send().await.unwrap().json().await.unwrap();
    assert_eq!(shown["bundle"]["hash"], bundle.hash_string(), "{shown}");
    let jobs = format!("{}/deployment/solid/api/v2/jobs", second.server.url());
    let mut created = Value::Null;
    for _ in 0..1200 {
        let resp = second.http.post(&jobs).json(&json!({ "workflow": trivial(5) })).send().await.unwrap();
        if resp.status() != 429 {
            assert_eq!(resp.status(), 201);
            created = resp.json().await.unwrap();
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    let id = created["id"].as_str().expect("the deployment became ready on the second host").to_string();
    for _ in 0..1200 {
        let job: Value = second.http.get(format!("{jobs}/{id}")).send().await.unwrap().json().await.unwrap();
        if job["status"] == "succeeded" {
            assert_eq!(job["bundle"], bundle.hash_string(), "{job}");
            return;
        }
        assert!(["queued", "running"].contains(&job["status"].as_str().unwrap()), "{job}");
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    panic!("the job never finished");
}

/// The web frontend's settings and saved workflows, written through one
/// host, are read through another (its own data directory, the same
/// database).
#[tokio::test]
async fn the_frontends_settings_and_files_are_served_by_every_host() {
    let Some(url) = fresh_database().await else { return };
    let first = start_in(tempfile::tempdir().unwrap(), on_postgres(url.clone(), Mode::SelfHosted)).await;
    let at = |s: &super::TestServer, path: &str| format!("{}{path}", s.server.url());
    let saved = first.http.post(at(&first, "/api/userdata/workflows%2Fmine.json")).body("{\"nodes\": []}").send().await.unwrap();
    assert_eq!(saved.status(), 200);
    let set = first.http.post(at(&first, "/api/settings")).json(&json!({ "Comfy.Locale": "fr" })).send().await.unwrap();
    assert_eq!(set.status(), 200);
    drop(first.shutdown().await);

    let second = start_in(tempfile::tempdir().unwrap(), on_postgres(url, Mode::SelfHosted)).await;
    let read = second.http.get(at(&second, "/api/userdata/workflows%2Fmine.json")).send().await.unwrap();
    assert_eq!(read.status(), 200);
    assert_eq!(read.text().await.unwrap(), "{\"nodes\": []}");
    let locale: Value = second.http.get(at(&second, "/api/settings/Comfy.Locale")).send().await.unwrap().json().await.unwrap();
    assert_eq!(locale, "fr");
    let listed: Value = second.http.get(at(&second, "/api/userdata?dir=workflows")).send().await.unwrap().json().await.unwrap();
    assert_eq!(listed, json!(["mine.json"]));
}

/// An account key and a signed download URL made on one host work on a
/// second host with a data directory of its own (its blobs copied in, as
/// on a shared volume or bucket; none of the first's secret files): the
/// secrets they depend on are the database's.
#[tokio::test]
async fn keys_and_signed_urls_made_on_one_host_work_on_another() {
    let Some(url) = fresh_database().await else { return };
    let first = start_in(tempfile::tempdir().unwrap(), on_postgres(url.clone(), Mode::Cloud)).await;
    let (key, done) = account_with_a_finished_job(&first, "roaming").await;
    let id = done["id"].as_str().unwrap().to_string();
    let signed = done["outputs"][0]["url"].as_str().unwrap_or_else(|| panic!("{done}")).to_string();
    assert!(signed.contains("/signed/"), "{signed}");
    let data = first.shutdown().await;

    let second_dir = tempfile::tempdir().unwrap();
    copy_tree(&data.path().join("blobs"), &second_dir.path().join("blobs"));
    if let Ok(bucket) = std::fs::read(data.path().join("test-bucket")) {
        std::fs::write(second_dir.path().join("test-bucket"), bucket).unwrap();
    }
    assert!(!second_dir.path().join("accounts.key").exists() && !second_dir.path().join("signing.key").exists());
    let second = start_in(second_dir, on_postgres(url, Mode::Cloud)).await;
    let seen = second.http.get(second.url(&format!("/jobs/{id}"))).bearer_auth(&key).send().await.unwrap();
    assert_eq!(seen.status(), 200, "the key made on the first host opens the second");
    let path = signed.split_once("/api/v2").unwrap().1;
    let resp = second.http.get(second.url(path)).send().await.unwrap();
    assert_eq!(resp.status(), 200, "the URL signed on the first host downloads from the second");
    assert_eq!(&resp.bytes().await.unwrap()[..4], b"\x89PNG");
    let flipped = if path.ends_with('0') { '1' } else { '0' };
    let forged = format!("{}{flipped}", &path[..path.len() - 1]);
    let refused = second.http.get(second.url(&forged)).send().await.unwrap().status();
    assert!(refused.is_client_error(), "a forged signature is refused: {refused}");
}

/// A new account `name` (the admin API, 100 credits) and a job of it run to
/// success: its key and the job.
async fn account_with_a_finished_job(s: &super::TestServer, name: &str) -> (String, Value) {
    let (key, _) = s.new_account("pg-operator", name, 100).await;
    let job: Value = s.http.post(s.url("/jobs")).bearer_auth(&key).json(&json!({ "workflow": trivial(3) })).send().await.unwrap().json().await.unwrap();
    let id = job["id"].as_str().unwrap().to_string();
    for _ in 0..400 {
        let now: Value = s.http.get(s.url(&format!("/jobs/{id}"))).bearer_auth(&key).send().await.unwrap().json().await.unwrap();
        if now["status"] == "succeeded" {
            return (key, now);
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    panic!("the job of account {name} never succeeded");
}

fn copy_tree(from: &std::path::Path, to: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(from) else { return };
    std::fs::create_dir_all(to).unwrap();
    for entry in entries {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// TLS to the database: with `sslmode=verify-full` and the CA in
/// `sslrootcert`, kiln reaches a server that takes TLS connections only and
/// runs jobs on it; without TLS, or trusting another CA, `kiln doctor`'s
/// check says the database does not answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_database_is_reached_over_verified_tls() {
    let Some((pg, ca)) = OwnPostgres::start_new_tls() else { return };
    let answers = |url: String| async move {
        let config = kiln::config::Config { store: StoreKind::Postgres, database_url: Some(url), ..kiln::config::Config::default() };
        let (lines, answered) = kiln::cli::doctor_backends(&config).await;
        (answered, lines.join("; "))
    };
    let tls = format!("{}?sslmode=verify-full&sslrootcert={}", pg.url(), ca.display());
    let (ok, lines) = answers(tls.clone()).await;
    assert!(ok, "{lines}");
    let (ok, lines) = answers(format!("{}?sslmode=disable", pg.url())).await;
    assert!(!ok && lines.contains("does not answer"), "the server takes TLS only: {lines}");
    let other_ca = pg.dir().join("other.crt");
    let (ok, lines) = answers(format!("{}?sslmode=verify-full&sslrootcert={}", pg.url(), other_ca.display())).await;
    assert!(!ok, "a certificate its root does not vouch for is refused: {lines}");

    let s = start_in(tempfile::tempdir().unwrap(), on_postgres(tls, Mode::SelfHosted)).await;
    let job = s.submit(trivial(2)).await;
    assert_eq!(s.wait(job["id"].as_str().unwrap()).await["status"], "succeeded");
    s.shutdown().await;
}

/// PostgreSQL stops while a job runs and comes back: a submission made
/// meanwhile is refused with 500 `upstream_error` and its Idempotency-Key
/// stays free; the job that ended during the outage is recorded once the
/// database is back (and shown finished only then), so after a restart of
/// kiln every job is as it ended — none interrupted or run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_restart_mid_run_loses_no_job_and_no_key() {
    let Some(pg) = OwnPostgres::start_new() else { return };
    let s = start_in(tempfile::tempdir().unwrap(), on_postgres(pg.url(), Mode::SelfHosted)).await;
    let before = s.submit(trivial(1)).await["id"].as_str().unwrap().to_string();
    assert_eq!(s.wait(&before).await["status"], "succeeded");
    // Runs until its node's 2 s limit, which it reaches while the database is down.
    let spinning = s.submit(super::spinner(5)).await["id"].as_str().unwrap().to_string();
    s.wait_for(&spinning, "running").await;
    pg.stop();
    let body = json!({ "workflow": trivial(2) });
    let (status, refused, _) = s.post_job(&body, Some("during-the-outage")).await;
    assert_eq!((status, refused["error"]["code"].as_str()), (500, Some("upstream_error")), "{refused}");
    tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
    assert_eq!(s.job(&spinning).await["status"], "running", "not shown finished while its end cannot be recorded");
    pg.start();
    let ended = s.wait(&spinning).await;
    assert_eq!((ended["status"].as_str(), ended["error"]["code"].as_str()), (Some("failed"), Some("node_timeout")), "{ended}");
    let (status, accepted, _) = s.post_job(&body, Some("during-the-outage")).await;
    assert_eq!(status, 201, "the key is free: {accepted}");
    let after = accepted["id"].as_str().unwrap().to_string();
    assert_eq!(s.wait(&after).await["status"], "succeeded");

    let data = s.shutdown().await;
    let s = start_in(data, on_postgres(pg.url(), Mode::SelfHosted)).await;
    assert_eq!(s.job(&before).await["status"], "succeeded");
    let reread = s.job(&spinning).await;
    assert_eq!((reread["status"].as_str(), reread["error"]["code"].as_str()), (Some("failed"), Some("node_timeout")), "recorded as it ended: {reread}");
    assert_eq!(s.job(&after).await["status"], "succeeded");
    let (again, _, _) = s.post_job(&body, Some("during-the-outage")).await;
    assert_eq!(again, 422, "the key is held by the job it made");
}
