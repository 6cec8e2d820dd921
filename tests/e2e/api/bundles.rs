//! Deployments from bundles through the admin API, in process: a bundle
//! carrying a plugin this server lacks is served with the bundle's copy,
//! visible to that deployment only; one that only references it is 422
//! `bundle_refused`, naming it; a bundle with `plugin_dirs` is refused; a
//! body over `max_bundle_mb` is 413.

use std::collections::BTreeMap;
use std::time::Duration;

use kiln::bundle::{Include, PackOptions};
use kiln::plugins::NodeRegistry;
use kiln::workflow::WorkflowLimits;
use serde_json::{Value, json};

use super::{TestServer, start};
use crate::support::{EXAMPLE_MANIFEST, EXAMPLE_WASM, env, install_plugin};

const ADMIN: &str = "bundle-suite-operator";

fn posterize() -> Value {
    json!({
        "1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 0x8040c0}},
        "2": {"class_type": "ExamplePosterize", "inputs": {"image": ["1", 0], "levels": 3}},
        "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "poster"}}
    })
}

/// `POST /admin/deployments` with a bundle: status and body.
async fn create(s: &TestServer, spec: Value, bundle: Vec<u8>) -> (u16, Value) {
    let form = reqwest::multipart::Form::new()
        .part("deployment", reqwest::multipart::Part::text(spec.to_string()))
        .part("bundle", reqwest::multipart::Part::bytes(bundle).file_name("b.kiln"));
    let resp = s.http.post(format!("{}/admin/deployments", s.server.url())).bearer_auth(ADMIN).multipart(form).send().await.unwrap();
    (resp.status().as_u16(), resp.json().await.unwrap_or(Value::Null))
}

async fn submit(s: &TestServer, base: &str, workflow: Value) -> (u16, Value) {
    for _ in 0..1200 {
        let resp = s.http.post(format!("{}{base}/jobs", s.server.url())).json(&json!({ "workflow": workflow })).send().await.unwrap();
        if resp.status() != 429 {
            return (resp.status().as_u16(), resp.json().await.unwrap());
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("{base} never became ready");
}

async fn finished(s: &TestServer, base: &str, id: &str) -> Value {
    for _ in 0..2000 {
        let job: Value = s.http.get(format!("{}{base}/jobs/{id}", s.server.url())).send().await.unwrap().json().await.unwrap();
        if ["succeeded", "failed", "canceled"].contains(&job["status"].as_str().unwrap_or("")) {
            return job;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("job {id} never finished");
}

#[tokio::test]
async fn a_bundle_carries_a_plugin_the_server_lacks_or_is_refused_naming_it() {
    // The packing host has the example plugin; the server does not.
    let plugins = tempfile::tempdir().unwrap();
    install_plugin(&plugins.path().join("posterize"), EXAMPLE_MANIFEST, EXAMPLE_WASM);
    let packer = NodeRegistry::load_all(&env().await.runtime, &[plugins.path().to_path_buf()]).await.unwrap();
    let pack = |include| {
        let options = PackOptions { name: "poster".into(), version: "2.1.0".into(), include, fixed: Default::default() };
        kiln::bundle::pack(&packer, &[("poster".into(), posterize())], &BTreeMap::new(), &options, &WorkflowLimits::default()).unwrap()
    };
    let (carried, referenced) = (pack(Include::Installed), pack(Include::None));
    let s = start(|c, _| {
        c.admin_token = Some(ADMIN.into());
        c.max_bundle_mb = 2;
    })
    .await;

    let (status, body) = create(&s, json!({"id": "ref", "owner": "local"}), referenced.to_bytes().unwrap()).await;
    assert_eq!((status, body["error"]["code"].as_str()), (422, Some("bundle_refused")), "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    let example_hash = format!("blake3:{}", blake3::hash(EXAMPLE_WASM).to_hex());
    assert!(message.contains("example-posterize") && message.contains(&example_hash), "names the component: {message}");
    assert!(!message.contains("core-image"), "the server has core-image: {message}");

    let (status, body) = create(&s, json!({"id": "dirs", "owner": "local", "plugin_dirs": ["/srv/x"]}), carried.to_bytes().unwrap()).await;
    assert_eq!((status, body["error"]["code"].as_str()), (400, Some("invalid_request")), "{body}");

    let (status, created) = create(&s, json!({"id": "poster", "owner": "local"}), carried.to_bytes().unwrap()).await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["bundle"]["hash"], carried.hash_string());
    assert_eq!((created["bundle"]["name"].as_str(), created["bundle"]["version"].as_str()), (Some("poster"), Some("2.1.0")));
    assert_eq!(created["bundle"]["components"]["example-posterize"], example_hash.as_str());
    let (status, job) = submit(&s, "/deployment/poster/api/v2", posterize()).await;
    assert_eq!(status, 201, "{job}");
    let job = finished(&s, "/deployment/poster/api/v2", job["id"].as_str().unwrap()).await;
    assert_eq!(job["status"], "succeeded", "the bundle's copy of the plugin ran: {job}");
    assert_eq!(job["bundle"], carried.hash_string());
    assert_eq!(job["components"]["example-posterize"], example_hash.as_str());
    let shown: Value = s.http.get(format!("{}/admin/deployments/poster", s.server.url())).bearer_auth(ADMIN).send().await.unwrap().json().await.unwrap();
    assert_eq!(shown["bundle"]["hash"], carried.hash_string(), "GET shows it: {shown}");

    // The bundle's plugin is the deployment's alone; the host's own jobs
    // record no bundle.
    let (status, body) = submit(&s, "/api/v2", posterize()).await;
    assert_eq!((status, body["error"]["code"].as_str()), (422, Some("invalid_workflow")), "{body}");
    let (status, job) = submit(&s, "/api/v2", super::trivial(3)).await;
    assert_eq!(status, 201, "{job}");
    let job = finished(&s, "/api/v2", job["id"].as_str().unwrap()).await;
    assert!(job.get("bundle").is_none() && job["components"].get("core-image").is_some(), "{job}");

    // Over max_bundle_mb (2 MiB here): refused before it is read.
    let (status, body) = create(&s, json!({"id": "big", "owner": "local"}), vec![7u8; 4 << 20]).await;
    assert_eq!((status, body["error"]["code"].as_str()), (413, Some("payload_too_large")), "{body}");
    let (status, body) = create(&s, json!({"id": "junk", "owner": "local"}), b"not a bundle".to_vec()).await;
    assert_eq!((status, body["error"]["code"].as_str()), (422, Some("bundle_refused")), "{body}");
    // A JSON spec (no bundle) is held to the admin API's 64 KiB, not a bundle's size.
    let big_spec = json!({"id": "big-json", "owner": "local", "plugin_dirs": vec!["x"; 40_000]});
    let resp = s.http.post(format!("{}/admin/deployments", s.server.url())).bearer_auth(ADMIN).json(&big_spec).send().await.unwrap();
    assert_eq!(resp.status(), 413);

    // A carried component over max_plugin_mb is refused as an install would be.
    let strict = start(|c, o| {
        c.admin_token = Some(ADMIN.into());
        c.max_plugin_mb = 0;
        o.max_plugin_bytes = 0;
    })
    .await;
    let (status, body) = create(&strict, json!({"id": "poster", "owner": "local"}), carried.to_bytes().unwrap()).await;
    assert_eq!(status, 400, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("example-posterize"), "{body}");
}
