//! Plugins installed into a running server through the admin API: a new
//! class shows in `object_info` at once (its ETag changes) and runs in jobs;
//! an upgrade under load lets the running job finish on the components it
//! started with while new jobs use the new ones (each job records the
//! component hashes it ran); refusals (a class another plugin provides, a
//! bundled plugin's name, a component that does not compile) change
//! nothing; a removal takes the class away; installs survive a restart.

use serde_json::{Value, json};

use super::{TestServer, start, start_in};
use crate::support::{EXAMPLE_WASM, HOSTILE_WASM};

const ADMIN: &str = "plugin-operator-token";
/// An earlier build of the example plugin (the same class, another hash).
const EXAMPLE_V1: &[u8] = include_bytes!("../../fixtures/plugins/custom-node-kiln-plugin-0.1.0.wasm");

fn manifest(name: &str, version: &str) -> String {
    format!("name = \"{name}\"\nversion = \"{version}\"\ncomponent = \"plugin.wasm\"\n[limits]\nmemory_mb = 256\ntimeout_ms = 30000\n")
}

async fn install(s: &TestServer, manifest: &str, component: &[u8]) -> (u16, Value) {
    let form = reqwest::multipart::Form::new()
        .text("manifest", manifest.to_string())
        .part("component", reqwest::multipart::Part::bytes(component.to_vec()).file_name("plugin.wasm"));
    let resp = s.http.post(format!("{}/admin/plugins", s.server.url())).bearer_auth(ADMIN).multipart(form).send().await.unwrap();
    (resp.status().as_u16(), resp.json().await.unwrap_or(Value::Null))
}

async fn admin(s: &TestServer, method: reqwest::Method, path: &str) -> (u16, Value) {
    let resp = s.http.request(method, format!("{}/admin{path}", s.server.url())).bearer_auth(ADMIN).send().await.unwrap();
    (resp.status().as_u16(), resp.json().await.unwrap_or(Value::Null))
}

/// `object_info`'s ETag and whether it lists `class`.
async fn object_info(s: &TestServer, class: &str) -> (String, bool) {
    let resp = s.http.get(format!("{}/api/object_info", s.server.url())).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let etag = resp.headers()["etag"].to_str().unwrap().to_string();
    let all: Value = resp.json().await.unwrap();
    (etag, all.get(class).is_some())
}

/// A job that blurs a 2048² image `blurs` times, then posterizes and saves it.
fn posterize_job(blurs: usize) -> Value {
    let mut wf = serde_json::Map::new();
    wf.insert("0".into(), json!({"class_type": "EmptyImage", "inputs": {"width": 2048, "height": 2048, "batch_size": 1, "color": 0x4080c0}}));
    for i in 1..=blurs {
        wf.insert(i.to_string(), json!({"class_type": "ImageBlur", "inputs": {"image": [(i - 1).to_string(), 0], "blur_radius": 31, "sigma": 10.0}}));
    }
    wf.insert("p".into(), json!({"class_type": "ExamplePosterize", "inputs": {"image": [blurs.to_string(), 0], "levels": 3}}));
    wf.insert("s".into(), json!({"class_type": "SaveImage", "inputs": {"images": ["p", 0], "filename_prefix": "p"}}));
    Value::Object(wf)
}

fn with_admin(c: &mut kiln::config::Config) {
    c.admin_token = Some(ADMIN.into());
}

#[tokio::test]
async fn a_plugin_installs_upgrades_and_is_removed_without_a_restart() {
    let s = start(|c, _| with_admin(c)).await;
    let (etag_before, listed) = object_info(&s, "ExamplePosterize").await;
    assert!(!listed);

    let (status, v1) = install(&s, &manifest("example-posterize", "1.0.0"), EXAMPLE_V1).await;
    assert_eq!(status, 201, "{v1}");
    assert_eq!((v1["name"].as_str(), v1["version"].as_str(), v1["classes"].clone()), (Some("example-posterize"), Some("1.0.0"), json!(["ExamplePosterize"])));
    let (etag_v1, listed) = object_info(&s, "ExamplePosterize").await;
    assert!(listed && etag_v1 != etag_before, "object_info shows the class at once, under a new ETag");

    // Upgrade under load: the running job keeps v1.
    let running = s.submit(posterize_job(12)).await;
    let id = running["id"].as_str().unwrap();
    s.wait_for(id, "running").await;
    let (status, v2) = install(&s, &manifest("example-posterize", "2.0.0"), EXAMPLE_WASM).await;
    assert_eq!(status, 201, "{v2}");
    assert_ne!(v1["hash"], v2["hash"]);
    assert_eq!(s.job(id).await["status"], "running", "the job must still run when the upgrade lands (make it longer)");
    let done = s.wait(id).await;
    assert_eq!(done["status"], "succeeded", "{done}");
    assert_eq!(done["components"]["example-posterize"], v1["hash"], "it finished on the components it started with");
    let next = s.wait(s.submit(posterize_job(0)).await["id"].as_str().unwrap()).await;
    assert_eq!(next["status"], "succeeded", "{next}");
    assert_eq!(next["components"]["example-posterize"], v2["hash"], "a new job uses the new version");
    assert!(next["components"]["core-image"].as_str().unwrap().starts_with("blake3:"));

    let (status, list) = admin(&s, reqwest::Method::GET, "/plugins").await;
    assert_eq!(status, 200);
    let ours: Vec<&Value> = list["plugins"].as_array().unwrap().iter().filter(|p| p["installed"] == true).collect();
    assert_eq!(ours.len(), 1, "{list}");
    assert_eq!((&ours[0]["name"], &ours[0]["version"], &ours[0]["hash"]), (&json!("example-posterize"), &json!("2.0.0"), &v2["hash"]));

    let (status, _) = admin(&s, reqwest::Method::DELETE, "/plugins/example-posterize").await;
    assert_eq!(status, 204);
    let (_, listed) = object_info(&s, "ExamplePosterize").await;
    assert!(!listed);
    let (status, err, _) = s.post_job(&json!({ "workflow": posterize_job(0) }), None).await;
    assert_eq!((status, err["error"]["code"].as_str()), (422, Some("invalid_workflow")), "{err}");
    let (status, err) = admin(&s, reqwest::Method::DELETE, "/plugins/example-posterize").await;
    assert_eq!((status, err["error"]["code"].as_str()), (404, Some("not_found")), "{err}");
}

#[tokio::test]
async fn refused_plugins_change_nothing_and_installs_survive_a_restart() {
    let s = start(|c, _| with_admin(c)).await;
    let (etag, _) = object_info(&s, "ExamplePosterize").await;
    // Classes another plugin already provides.
    let (status, err) = install(&s, &manifest("copycat", "1.0.0"), HOSTILE_WASM).await;
    assert_eq!((status, err["error"]["code"].as_str()), (422, Some("plugin_refused")), "{err}");
    assert!(err["error"]["message"].as_str().unwrap().contains("is already provided by plugin `hostile`"), "{err}");
    // A bundled plugin's name.
    let (status, err) = install(&s, &manifest("core-image", "9.0.0"), EXAMPLE_WASM).await;
    assert_eq!((status, err["error"]["code"].as_str()), (409, Some("conflict")), "{err}");
    // Not a component.
    let (status, err) = install(&s, &manifest("broken", "1.0.0"), b"\0asm garbage").await;
    assert_eq!((status, err["error"]["code"].as_str()), (422, Some("plugin_refused")), "{err}");
    // A part missing.
    let form = reqwest::multipart::Form::new().text("manifest", manifest("lonely", "1.0.0"));
    let resp = s.http.post(format!("{}/admin/plugins", s.server.url())).bearer_auth(ADMIN).multipart(form).send().await.unwrap();
    assert_eq!(resp.status(), 400);
    // No operator token.
    let resp = s.http.get(format!("{}/admin/plugins", s.server.url())).send().await.unwrap();
    assert_eq!(resp.status(), 401);
    assert_eq!(object_info(&s, "ExamplePosterize").await.0, etag, "nothing changed");
    let plugin_dir = s.data.path().join("plugins");
    assert_eq!(std::fs::read_dir(&plugin_dir).unwrap().count(), 0, "nothing was written");

    let (status, v1) = install(&s, &manifest("example-posterize", "1.0.0"), EXAMPLE_WASM).await;
    assert_eq!(status, 201, "{v1}");
    let data = s.shutdown().await;
    let s = start_in(data, |c, _| with_admin(c)).await;
    assert!(object_info(&s, "ExamplePosterize").await.1, "the installed plugin loads again at start");
    let done = s.wait(s.submit(posterize_job(0)).await["id"].as_str().unwrap()).await;
    assert_eq!((done["status"].as_str(), &done["components"]["example-posterize"]), (Some("succeeded"), &v1["hash"]), "{done}");
}
