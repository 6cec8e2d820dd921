//! An embedded data directory moved into the cluster: `kiln migrate --to
//! postgres` copies a self-hosted server's jobs (one killed mid-run), their
//! outputs, an upload, an Idempotency-Key's claim, a deployment and a user
//! file into PostgreSQL and the bucket. A host on those serves all of it,
//! runs the interrupted job, and a second copy writes nothing and checks
//! everything again.

use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};

use super::*;

/// `kiln migrate --to postgres --from data` with the cluster's settings:
/// its exit status and what it printed.
fn migrate(data: &std::path::Path, shared: &[(String, String)]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["migrate", "--to", "postgres", "--from"])
        .arg(data)
        .env("KILN_DATA_DIR", data.join("migrate-cache"))
        .envs(shared.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

/// The settings of an embedded server: none of the cluster's.
fn embedded(shared: &[(String, String)]) -> Vec<(String, String)> {
    shared.iter().filter(|(k, _)| k == "KILN_GPU" || k == "KILN_LOG").cloned().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embedded_data_dir_moves_into_the_cluster() {
    let Some(shared) = shared().await else { return };
    let http = reqwest::Client::new();
    let data = tempfile::tempdir().unwrap();
    let admin = [("KILN_ADMIN_TOKEN", ADMIN)];

    // A self-hosted server on its own data directory.
    let mut old = start_in(data.path(), "old", &embedded(&shared), &admin);
    let keyed = submit_keyed(&http, &old, "moved", quick(5)).await;
    assert_eq!(keyed.status(), 201);
    let keyed = keyed.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_string();
    let done = wait_for(&http, &old, &keyed, &["succeeded", "failed"], Duration::from_secs(30)).await;
    assert_eq!(done["status"], "succeeded", "{done}");
    let output = download(&http, &old, &done).await;
    let form =
        reqwest::multipart::Form::new().text("file_path", "moved.png").part("file", reqwest::multipart::Part::bytes(output.clone()).file_name("moved.png"));
    let upload: Value = http.post(format!("{}/api/v2/assets", old.base)).multipart(form).send().await.unwrap().json().await.unwrap();
    let upload_id = upload["id"].as_str().unwrap_or_else(|| panic!("{upload}")).to_string();
    let saved = http.post(format!("{}/api/userdata/workflows%2Fmoved.json", old.base)).body("{\"nodes\": [1]}").send().await.unwrap();
    assert!(saved.status().is_success(), "{}", saved.status());
    let made = http.post(format!("{}/admin/deployments", old.base)).bearer_auth(ADMIN).json(&json!({"id": "moved", "owner": "local"})).send().await.unwrap();
    assert_eq!(made.status(), 201);
    let deployed = deployment_answers(&http, &old, "moved", 201).await;
    let deployed = deployed["id"].as_str().unwrap().to_string();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let job: Value = http.get(format!("{}/deployment/moved/api/v2/jobs/{deployed}", old.base)).send().await.unwrap().json().await.unwrap();
        if job["status"] == "succeeded" {
            break;
        }
        assert!(std::time::Instant::now() < deadline && job["status"] != "failed", "{job}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Killed while a job runs: it is `running` in the data directory.
    let interrupted = submit(&http, &old, slow(6)).await;
    wait_for(&http, &old, &interrupted, &["running"], Duration::from_secs(30)).await;
    old.child.kill().unwrap();
    old.child.wait().unwrap();

    let (ok, printed) = migrate(data.path(), &shared);
    assert!(ok, "{printed}");
    for line in [
        "jobs: 3 in the data directory, 3 copied now, 0 there already",
        // Two outputs and the upload (of the first output's bytes).
        "assets: 3 in the data directory, 3 copied now",
        "idempotency claims: 1 in the data directory, 1 copied now",
        "deployments: 1 in the data directory, 1 copied now",
        "user files: 1 in the data directory, 1 copied now",
        "blobs: 2 in the data directory, 2 copied now",
    ] {
        assert!(printed.contains(line), "{line:?} in {printed}");
    }

    // The old server does not open the directory again.
    let mut again = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["serve", "--port", "0", "--data-dir"])
        .arg(data.path())
        .envs(embedded(&shared).iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = again.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = again.kill();
            panic!("kiln serve opened the copied data directory");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let mut said = String::new();
    std::io::Read::read_to_string(&mut again.stderr.take().unwrap(), &mut said).unwrap();
    assert!(!status.success() && said.contains("kiln migrate"), "{said}");

    // A host of the cluster serves what the old server held.
    let host = start_with("m1", &shared, &admin);
    let moved = job(&http, &host, &keyed).await;
    assert_eq!(moved["status"], "succeeded", "{moved}");
    assert_eq!(download(&http, &host, &moved).await, output, "the output, from the bucket");
    let again = submit_keyed(&http, &host, "moved", quick(5)).await;
    assert_eq!(again.status(), 422, "the key's claim came along: it is spent");
    assert_eq!(again.json::<Value>().await.unwrap()["error"]["code"], "idempotency_key_reuse");
    assert_eq!(submit_keyed(&http, &host, "fresh", quick(5)).await.status(), 201, "another key is free");
    let asset: Value = http.get(format!("{}/api/v2/assets/{upload_id}", host.base)).send().await.unwrap().json().await.unwrap();
    assert_eq!(asset["hash"], upload["hash"], "{asset}");
    let file = http.get(format!("{}/api/userdata/workflows%2Fmoved.json", host.base)).send().await.unwrap();
    assert_eq!(file.text().await.unwrap(), "{\"nodes\": [1]}");
    deployment_answers(&http, &host, "moved", 201).await;
    let ran = wait_for(&http, &host, &interrupted, &["succeeded", "failed"], Duration::from_secs(90)).await;
    assert_eq!(ran["status"], "succeeded", "the interrupted job was taken over and run: {ran}");

    // Again: nothing new to copy, everything checked present.
    let (ok, printed) = migrate(data.path(), &shared);
    assert!(ok, "{printed}");
    assert!(printed.contains("jobs: 3 in the data directory, 0 copied now, 3 there already"), "{printed}");
    assert!(printed.contains("blobs: 2 in the data directory, 0 copied now, 2 there already"), "{printed}");
}
