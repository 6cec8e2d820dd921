//! Plugins installed through one host serve on every host: the
//! operator's (admin API) and an account's own (`/api/v2/plugins`),
//! installed, upgraded and removed through any host and followed by the
//! others; a host started later has them before it serves; a plugin a
//! host kept from before it shared the store becomes every host's. Once
//! every plugin is removed, the database keeps none of their bytes.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::plugins::{MANIFEST, POSTERIZE, another_build};
use super::tenants::{create_account, submit_as, until_status, wait_as};
use super::*;

fn hash(component: &[u8]) -> String {
    format!("blake3:{}", blake3::hash(component).to_hex())
}

/// A quick job through the plugin's class.
fn posterized(seed: i64) -> Value {
    let mut graph = quick(seed);
    graph["p"] = json!({"class_type": "ExamplePosterize", "inputs": {"image": ["1", 0], "levels": 3}});
    graph["2"]["inputs"]["images"] = json!(["p", 0]);
    graph
}

/// `example-posterize`'s hash in `GET {path}` on `host` as `token`.
async fn listed(http: &reqwest::Client, host: &Host, path: &str, token: &str) -> Option<String> {
    let list: Value = http.get(format!("{}{path}", host.base)).bearer_auth(token).send().await.unwrap().json().await.unwrap();
    let plugins = list["plugins"].as_array().unwrap_or_else(|| panic!("{list}"));
    plugins.iter().find(|p| p["name"] == "example-posterize").map(|p| p["hash"].as_str().unwrap_or_default().to_string())
}

/// Polls until every host in `hosts` lists `wanted` (`None`: no such plugin).
async fn until_listed(http: &reqwest::Client, hosts: &[&Host], path: &str, token: &str, wanted: Option<&str>) {
    let deadline = Instant::now() + Duration::from_secs(30);
    for host in hosts {
        loop {
            let now = listed(http, host, path, token).await;
            if now.as_deref() == wanted {
                break;
            }
            assert!(Instant::now() < deadline, "{} lists {now:?}, not {wanted:?}, after 30 s", host.base);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Installs `component` as `example-posterize` through `host` at `path`
/// as `token`: the answer's hash.
async fn install(http: &reqwest::Client, host: &Host, path: &str, token: &str, component: Vec<u8>) -> String {
    let form =
        reqwest::multipart::Form::new().text("manifest", MANIFEST).part("component", reqwest::multipart::Part::bytes(component).file_name("plugin.wasm"));
    let resp = http.post(format!("{}{path}", host.base)).bearer_auth(token).multipart(form).send().await.unwrap();
    assert_eq!(resp.status(), 201, "{}", host.base);
    resp.json::<Value>().await.unwrap()["hash"].as_str().unwrap().to_string()
}

async fn remove(http: &reqwest::Client, host: &Host, path: &str, token: &str) {
    let resp = http.delete(format!("{}{path}/example-posterize", host.base)).bearer_auth(token).send().await.unwrap();
    assert_eq!(resp.status(), 204, "{}", host.base);
}

/// Whether a submission was refused for naming an unknown class.
fn unknown_class(refusal: &Value) -> bool {
    refusal["error"]["details"]["node_errors"]["p"][0]["reason"] == "unknown_class"
}

/// Creates account `name` through `host`, and waits until every host in
/// `all` knows its key (hosts hear of accounts through the database).
async fn account(http: &reqwest::Client, host: &Host, name: &str, all: &[&Host]) -> String {
    let key = create_account(http, host, name, 1_000_000).await;
    for host in all {
        until_status(http, host, &key, |status| status == 200, name).await;
    }
    key
}

/// A job of `key` through the plugin, on `host`: its final record.
async fn run_as(http: &reqwest::Client, host: &Host, key: &str, seed: i64) -> Value {
    let (status, body) = submit_as(http, host, key, posterized(seed)).await;
    assert_eq!(status, 201, "{body}");
    wait_as(http, host, key, body["id"].as_str().unwrap(), &["succeeded", "failed", "canceled"]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugins_installed_through_one_host_serve_on_every_host() {
    let Some(shared) = shared().await else { return };
    let cloud = [("KILN_MODE", "cloud"), ("KILN_ADMIN_TOKEN", ADMIN)];
    let (i1, i2) = (start_with("i1", &shared, &cloud), start_with("i2", &shared, &cloud));
    // i3's data directory keeps a plugin installed before it shared a store.
    let kept = tempfile::tempdir().unwrap();
    let folder = kept.path().join("plugins/example-posterize");
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::write(folder.join("kiln-plugin.toml"), MANIFEST).unwrap();
    std::fs::write(folder.join("plugin.wasm"), POSTERIZE).unwrap();
    let i3 = start_in(kept.path(), "i3", &shared, &cloud);
    let (v1, v2) = (hash(POSTERIZE), hash(&another_build()));
    let http = reqwest::Client::new();
    until_listed(&http, &[&i1, &i2, &i3], "/admin/plugins", ADMIN, Some(&v1)).await;
    let alice = account(&http, &i1, "alice", &[&i1, &i2, &i3]).await;
    let done = run_as(&http, &i2, &alice, 1).await;
    assert_eq!((done["status"].as_str(), done["components"]["example-posterize"].as_str()), (Some("succeeded"), Some(v1.as_str())), "{done}");

    // Upgraded through one host: the old build's bytes leave the database.
    assert_eq!(install(&http, &i2, "/admin/plugins", ADMIN, another_build()).await, v2);
    until_listed(&http, &[&i1, &i3], "/admin/plugins", ADMIN, Some(&v2)).await;
    let done = run_as(&http, &i3, &alice, 2).await;
    assert_eq!((done["status"].as_str(), done["components"]["example-posterize"].as_str()), (Some("succeeded"), Some(v2.as_str())), "{done}");
    let db = sqlx::PgPool::connect(&env(&shared, "KILN_DATABASE_URL")).await.unwrap();
    let kept: Vec<(String,)> = sqlx::query_as("SELECT hash FROM plugin_components").fetch_all(&db).await.unwrap();
    assert_eq!(kept, [(v2.trim_start_matches("blake3:").to_string(),)]);

    // A host whose plugin folder provides the class under another name
    // cannot load the shared plugin: it is left out there, the host serves on.
    let (folder, _) = super::plugins::plugin_folder(POSTERIZE);
    std::fs::write(folder.path().join("kiln-plugin.toml"), MANIFEST.replace("example-posterize", "fixed-posterize")).unwrap();
    let i5 = start_with("i5", &shared, &[cloud[0], cloud[1], super::plugins::plugin_dirs(&folder)]);
    let names: Value = http.get(format!("{}/admin/plugins", i5.base)).bearer_auth(ADMIN).send().await.unwrap().json().await.unwrap();
    let names: Vec<&str> = names["plugins"].as_array().unwrap().iter().filter_map(|p| p["name"].as_str()).collect();
    assert!(names.contains(&"fixed-posterize") && !names.contains(&"example-posterize"), "{names:?}");
    let done = run_as(&http, &i5, &alice, 6).await;
    assert_eq!(done["components"]["fixed-posterize"].as_str(), Some(hash(POSTERIZE).as_str()), "its own plugin: {done}");
    drop(i5);

    // Removed through another host: gone everywhere.
    remove(&http, &i1, "/admin/plugins", ADMIN).await;
    until_listed(&http, &[&i2, &i3], "/admin/plugins", ADMIN, None).await;
    let (status, body) = submit_as(&http, &i3, &alice, posterized(3)).await;
    assert_eq!((status, unknown_class(&body)), (422, true), "the class is gone on every host: {body}");

    // An account's own, through one host: its jobs run through any host;
    // another account sees none of it.
    let bob = account(&http, &i3, "bob", &[&i1, &i2, &i3]).await;
    assert_eq!(install(&http, &i3, "/api/v2/plugins", &bob, POSTERIZE.to_vec()).await, v1);
    until_listed(&http, &[&i1, &i2], "/api/v2/plugins", &bob, Some(&v1)).await;
    let done = run_as(&http, &i1, &bob, 4).await;
    assert_eq!((done["status"].as_str(), done["components"]["example-posterize"].as_str()), (Some("succeeded"), Some(v1.as_str())), "{done}");
    let (status, body) = submit_as(&http, &i2, &alice, posterized(5)).await;
    assert_eq!((status, unknown_class(&body)), (422, true), "not alice's: {body}");
    assert_eq!(listed(&http, &i2, "/admin/plugins", ADMIN).await, None, "not the operator's");

    // A host started now has it before it serves; removed through it, it
    // is gone everywhere, and so are its bytes.
    let i4 = start_with("i4", &shared, &cloud);
    assert_eq!(listed(&http, &i4, "/api/v2/plugins", &bob).await.as_deref(), Some(v1.as_str()), "followed at start");
    remove(&http, &i4, "/api/v2/plugins", &bob).await;
    until_listed(&http, &[&i1, &i2, &i3], "/api/v2/plugins", &bob, None).await;
    let (plugins, components): (i64, i64) =
        sqlx::query_as("SELECT (SELECT count(*) FROM plugins), (SELECT count(*) FROM plugin_components)").fetch_one(&db).await.unwrap();
    assert_eq!((plugins, components), (0, 0));
    drop((i1, i2, i3, i4));
}
