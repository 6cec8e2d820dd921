//! Accounts' own plugins (cloud mode) over real HTTP: two accounts each
//! install a plugin with the same class name and each sees and runs only
//! its own (its `object_info`, its jobs, with its component's hash); a
//! third sees neither, and an unknown class answers it exactly as one that
//! exists nowhere; the count quota (an upgrade is not a new plugin); what a tenant's manifest cannot have
//! (network, secrets) refused, what it asks beyond the ceilings capped;
//! all of it again after a restart.

use reqwest::{Method, RequestBuilder, StatusCode};
use serde_json::{Value, json};

use super::{TestServer, start, start_default, start_in};
use crate::support::EXAMPLE_WASM;

const OPERATOR: &str = "operator-of-account-plugins";
/// An earlier build of the example plugin: the same class, another hash.
const EXAMPLE_V1: &[u8] = include_bytes!("../../fixtures/plugins/custom-node-kiln-plugin-0.1.0.wasm");

async fn json_of(req: RequestBuilder) -> (StatusCode, Value) {
    let resp = req.send().await.unwrap();
    (resp.status(), resp.json().await.unwrap_or(Value::Null))
}

struct Tenant<'a> {
    s: &'a TestServer,
    key: String,
}

async fn tenant<'a>(s: &'a TestServer, name: &str) -> Tenant<'a> {
    Tenant { s, key: s.new_account(OPERATOR, name, 1000).await.0 }
}

fn manifest(name: &str, extra: &str) -> String {
    format!("name = \"{name}\"\nversion = \"1.0.0\"\ncomponent = \"p.wasm\"\n{extra}")
}

impl Tenant<'_> {
    fn v2(&self, method: Method, path: &str) -> RequestBuilder {
        self.s.http.request(method, self.s.url(path)).bearer_auth(&self.key)
    }
    async fn install(&self, manifest: &str, wasm: &[u8]) -> (StatusCode, Value) {
        let form = reqwest::multipart::Form::new()
            .text("manifest", manifest.to_string())
            .part("component", reqwest::multipart::Part::bytes(wasm.to_vec()).file_name("p.wasm"));
        json_of(self.v2(Method::POST, "/plugins").multipart(form)).await
    }
    async fn object_info_has(&self, class: &str) -> bool {
        let resp = self.s.http.get(format!("{}/api/object_info", self.s.server.url())).header("X-API-Key", &self.key).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        resp.json::<Value>().await.unwrap().get(class).is_some()
    }
    /// Submits a job posterizing with `class`; the answer.
    async fn submit(&self, class: &str) -> (StatusCode, Value) {
        let wf = json!({
            "1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 0x4080c0}},
            "2": {"class_type": class, "inputs": {"image": ["1", 0], "levels": 2}},
            "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "t"}}
        });
        json_of(self.v2(Method::POST, "/jobs").json(&json!({ "workflow": wf }))).await
    }
    async fn run(&self, class: &str) -> Value {
        let (status, job) = self.submit(class).await;
        assert_eq!(status, 201, "{job}");
        let id = job["id"].as_str().unwrap().to_string();
        for _ in 0..600 {
            let (_, job) = json_of(self.v2(Method::GET, &format!("/jobs/{id}"))).await;
            if ["succeeded", "failed"].contains(&job["status"].as_str().unwrap_or("")) {
                return job;
            }
            tokio::time::sleep(std::time::Duration::from_millis(25)).await;
        }
        panic!("job {id} did not finish");
    }
}

fn cloud(c: &mut kiln::config::Config, o: &mut kiln::service::ServiceOptions) {
    c.mode = kiln::config::Mode::Cloud;
    c.admin_token = Some(OPERATOR.into());
    c.max_plugins_per_account = 1;
    o.mode = kiln::config::Mode::Cloud;
}

#[tokio::test]
async fn each_account_sees_and_runs_only_its_own_plugins() {
    let s = start(cloud).await;
    let (a, b, c) = (tenant(&s, "ada").await, tenant(&s, "bob").await, tenant(&s, "cyd").await);
    let (status, mine_a) = a.install(&manifest("mine", ""), EXAMPLE_V1).await;
    assert_eq!(status, 201, "{mine_a}");
    let (status, mine_b) = b.install(&manifest("mine", ""), EXAMPLE_WASM).await;
    assert_eq!(status, 201, "{mine_b}");
    assert_eq!((&mine_a["classes"], &mine_b["classes"]), (&json!(["ExamplePosterize"]), &json!(["ExamplePosterize"])));
    assert_ne!(mine_a["hash"], mine_b["hash"]);

    assert!(a.object_info_has("ExamplePosterize").await && b.object_info_has("ExamplePosterize").await);
    assert!(!c.object_info_has("ExamplePosterize").await, "another account's class is not listed");
    let ran_a = a.run("ExamplePosterize").await;
    let ran_b = b.run("ExamplePosterize").await;
    assert_eq!((ran_a["status"].as_str(), &ran_a["components"]["mine"]), (Some("succeeded"), &mine_a["hash"]), "{ran_a}");
    assert_eq!((ran_b["status"].as_str(), &ran_b["components"]["mine"]), (Some("succeeded"), &mine_b["hash"]), "{ran_b}");
    // A tenant names its classes: the operator's metrics count them as `other`.
    let metrics = s.http.get(format!("{}/metrics", s.server.url())).bearer_auth(OPERATOR).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains(r#"kiln_node_seconds_count{class="other",device="cpu"} 2"#), "{metrics}");
    assert!(metrics.contains(r#"kiln_node_seconds_count{class="EmptyImage",device="cpu"} 2"#), "{metrics}");
    assert!(!metrics.contains("ExamplePosterize"), "{metrics}");

    // To a third account it is a class that exists nowhere, word for word.
    let (status, theirs) = c.submit("ExamplePosterize").await;
    let (_, nowhere) = c.submit("NoSuchClassAnywhere").await;
    assert_eq!(status, 422, "{theirs}");
    assert_eq!(
        theirs["error"]["message"].as_str().unwrap().replace("ExamplePosterize", "X"),
        nowhere["error"]["message"].as_str().unwrap().replace("NoSuchClassAnywhere", "X")
    );
    let (_, listed) = json_of(c.v2(Method::GET, "/plugins")).await;
    assert_eq!(listed, json!({ "plugins": [] }));
    let (status, _) = json_of(c.v2(Method::DELETE, "/plugins/mine")).await;
    assert_eq!(status, 404);
    let (_, listed) = json_of(a.v2(Method::GET, "/plugins")).await;
    assert_eq!((listed["plugins"].as_array().unwrap().len(), &listed["plugins"][0]["hash"]), (1, &mine_a["hash"]), "{listed}");

    // What a tenant cannot have: the network and secrets are the operator's to grant.
    let (status, err) = c.install(&manifest("caller", "[capabilities]\noutbound_hosts = [\"example.com\"]\n"), EXAMPLE_WASM).await;
    assert_eq!((status, err["error"]["code"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some("plugin_refused")), "{err}");
    let (status, err) = c.install(&manifest("reader", "[capabilities]\nsecrets = [\"api_key_svc_org\"]\n"), EXAMPLE_WASM).await;
    assert_eq!((status, err["error"]["code"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some("plugin_refused")), "{err}");
    // What it asks beyond the ceilings is capped; the GPU is off for tenants.
    let (_, listed) = json_of(c.v2(Method::GET, "/plugins")).await;
    assert_eq!(listed, json!({ "plugins": [] }), "a refused plugin takes no place");
    let greedy = "[limits]\nmemory_mb = 100000\ntimeout_ms = 99999999\n[capabilities]\ngpu = true\n";
    let (status, _) = json_of(a.v2(Method::DELETE, "/plugins/mine")).await;
    assert_eq!(status, 204);
    assert!(!a.object_info_has("ExamplePosterize").await);
    let (status, body) = a.install(&manifest("greedy", greedy), EXAMPLE_V1).await;
    assert_eq!(status, 201, "{body}");
    let (_, listed) = json_of(a.v2(Method::GET, "/plugins")).await;
    let greedy = &listed["plugins"][0];
    assert_eq!((greedy["memory_mb"].as_u64(), greedy["timeout_ms"].as_u64(), greedy["gpu"].as_bool()), (Some(4096), Some(600_000), Some(false)), "{listed}");

    // The count quota (1 here): another plugin is refused, an upgrade is not.
    let (status, body) = b.install(&manifest("other", ""), EXAMPLE_V1).await;
    assert_eq!((status, body["error"]["code"].as_str()), (StatusCode::CONFLICT, Some("too_many_plugins")), "{body}");
    let (status, body) = b.install(&manifest("mine", ""), EXAMPLE_V1).await;
    assert_eq!((status, &body["hash"]), (StatusCode::CREATED, &mine_a["hash"]), "{body}");

    // After a restart each account has its own again.
    let keys = (a.key.clone(), b.key.clone(), c.key.clone());
    let data = s.shutdown().await;
    let s = start_in(data, cloud).await;
    let (a, b, c) = (Tenant { s: &s, key: keys.0 }, Tenant { s: &s, key: keys.1 }, Tenant { s: &s, key: keys.2 });
    let (_, listed) = json_of(a.v2(Method::GET, "/plugins")).await;
    assert_eq!((listed["plugins"][0]["name"].as_str(), listed["plugins"][0]["gpu"].as_bool()), (Some("greedy"), Some(false)), "{listed}");
    assert_eq!(b.run("ExamplePosterize").await["components"]["mine"], mine_a["hash"]);
    assert!(!c.object_info_has("ExamplePosterize").await);
}

#[tokio::test]
async fn a_host_without_accounts_has_no_account_plugins() {
    let s = start_default().await;
    let resp = s.http.get(s.url("/plugins")).send().await.unwrap();
    assert_eq!(resp.status(), 404);
}
