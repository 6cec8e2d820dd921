//! Hosts with different plugin sets: a job records the components it was
//! validated against when submitted, and when its host dies, a host whose
//! plugin of that name is another build leaves it alone (it would run other
//! code); a host that has the very component takes it and runs it. A job
//! a client asks to cancel meanwhile is taken at once and ended canceled.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::*;

/// `examples/custom-node` (class `ExamplePosterize`) as built before.
const POSTERIZE: &[u8] = include_bytes!("../../../tests/fixtures/plugins/custom-node-kiln-plugin-0.1.0.wasm");

/// The same component with a custom section appended: it behaves alike,
/// but it is another build, with another hash.
fn another_build() -> Vec<u8> {
    let mut bytes = POSTERIZE.to_vec();
    // Section 0 (custom), 10 bytes: a 9-byte name and no payload.
    bytes.extend([0u8, 10, 9]);
    bytes.extend(b"kiln-test");
    bytes
}

/// Installs `component` as plugin `example-posterize` on `host`: its hash.
async fn install(http: &reqwest::Client, host: &Host, component: Vec<u8>) -> String {
    let manifest = "name = \"example-posterize\"\nversion = \"1.0.0\"\ncomponent = \"plugin.wasm\"\n[limits]\nmemory_mb = 256\ntimeout_ms = 30000\n";
    let form =
        reqwest::multipart::Form::new().text("manifest", manifest).part("component", reqwest::multipart::Part::bytes(component).file_name("plugin.wasm"));
    let resp = http.post(format!("{}/admin/plugins", host.base)).bearer_auth(ADMIN).multipart(form).send().await.unwrap();
    assert_eq!(resp.status(), 201, "{}", host.base);
    resp.json::<Value>().await.unwrap()["hash"].as_str().unwrap().to_string()
}

/// A few seconds of blurs, then the plugin's posterize, then a save.
fn posterized() -> Value {
    let mut graph = slow(4);
    graph["p"] = json!({"class_type": "ExamplePosterize", "inputs": {"image": ["21", 0], "levels": 3}});
    graph["99"]["inputs"]["images"] = json!(["p", 0]);
    graph
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_is_taken_over_only_by_a_host_with_its_components() {
    let Some(mut shared) = shared().await else { return };
    // A 6 s lease: a job waits 60 s for a host with its components, well
    // past what this test needs to start a third host.
    for (key, value) in shared.iter_mut() {
        if key == "KILN_LEASE_S" {
            *value = "6".into();
        }
    }
    let admin = [("KILN_ADMIN_TOKEN", ADMIN), ("KILN_MAX_RUNNING_JOBS", "1")];
    let (mut p1, p2) = (start_with("p1", &shared, &admin), start_with("p2", &shared, &admin));
    let http = reqwest::Client::new();
    let v1 = install(&http, &p1, POSTERIZE.to_vec()).await;
    let other = install(&http, &p2, another_build()).await;
    assert_ne!(v1, other);

    let id = submit(&http, &p1, posterized()).await;
    wait_for(&http, &p2, &id, &["running"], Duration::from_secs(30)).await;
    // One job at a time: the second waits, its components recorded as
    // validated at submission.
    let waiting = submit(&http, &p1, posterized()).await;
    let doomed = submit(&http, &p1, posterized()).await;
    let queued = job(&http, &p2, &waiting).await;
    assert_eq!((queued["status"].as_str(), &queued["components"]["example-posterize"]), (Some("queued"), &json!(v1)), "{queued}");
    p1.child.kill().unwrap();
    p1.child.wait().unwrap();

    // p2 ends p1's lapsed lease (and looks for its jobs in the same
    // transaction, every heartbeat after): the job is not p2's.
    let db = sqlx::PgPool::connect(&env(&shared, "KILN_DATABASE_URL")).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (p1_rows,): (i64,) = sqlx::query_as("SELECT count(*) FROM hosts WHERE host_id = 'p1'").fetch_one(&db).await.unwrap();
        if p1_rows == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "p1's lease never lapsed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    for (id, left_as) in [(&id, "running"), (&waiting, "queued")] {
        let (holder,): (Option<String>,) = sqlx::query_as("SELECT holder FROM jobs WHERE id = $1").bind(id).fetch_one(&db).await.unwrap();
        assert!(holder.as_deref().is_some_and(|h| h.starts_with("p1/")), "still the dead host's, not p2's: {holder:?}");
        assert_eq!(job(&http, &p2, id).await["status"], left_as, "as the dead host left it");
    }

    // A cancel asked of a dead host's job: the job is taken over at once,
    // whatever it needs, and ended canceled, never run.
    let resp = http.post(format!("{}/api/v2/jobs/{doomed}/cancel", p2.base)).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let canceled = wait_for(&http, &p2, &doomed, &["canceled", "succeeded", "failed"], Duration::from_secs(30)).await;
    assert_eq!((canceled["status"].as_str(), &canceled["started_at"]), (Some("canceled"), &Value::Null), "{canceled}");

    // A host with the very component: it takes the job once it has it.
    let p3 = start_with("p3", &shared, &admin);
    assert_eq!(install(&http, &p3, POSTERIZE.to_vec()).await, v1);
    for id in [&id, &waiting] {
        let done = wait_for(&http, &p2, id, &["succeeded", "failed", "canceled"], Duration::from_secs(90)).await;
        assert_eq!(done["status"], "succeeded", "{done}");
        assert_eq!(done["components"]["example-posterize"], v1.as_str(), "run on the component it was validated against: {done}");
        let (holder,): (Option<String>,) = sqlx::query_as("SELECT holder FROM jobs WHERE id = $1").bind(id).fetch_one(&db).await.unwrap();
        assert_eq!(holder, None, "finished, held by none");
    }
    drop(p3);
}
