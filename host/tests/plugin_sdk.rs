//! A node author's path, through the real `kiln` binary and cargo: `kiln
//! plugin new` writes a crate in a temporary folder outside kiln's
//! workspace, `kiln plugin build` builds it into a plugin folder (and checks
//! it), a one-off `kiln run` runs its node, and `kiln plugins install`
//! puts it into a running `kiln serve` (the admin API) where a job runs it. `kiln plugin check` refuses a component
//! whose manifest under-declares what it imports, naming the import, and
//! one built against a contract version the host does not implement,
//! naming the versions it speaks. A tenant's compile bomb costs its own
//! install only.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod common;

const PARTNER_WASM: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/kiln_partner.wasm"));
const PRIMITIVES_WASM: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/kiln_primitives.wasm"));

fn kiln(args: &[&str], dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .current_dir(dir)
        .env("KILN_GPU", "off")
        .env("KILN_DATA_DIR", dir.join("data"))
        // The plugin's build keeps its own target folder beside kiln's, so
        // a second run compiles only the plugin.
        .env("CARGO_TARGET_DIR", target_dir().join("plugin-sdk-test"))
        .output()
        .expect("kiln runs")
}

/// The cargo target folder this test binary was built into.
fn target_dir() -> PathBuf {
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_kiln"));
    exe.ancestors().nth(2).expect("the kiln binary sits in <target>/<profile>/").to_path_buf()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn a_new_plugin_builds_outside_the_workspace_and_runs_in_a_job() {
    let work = tempfile::tempdir().unwrap();
    let sdk = Path::new(env!("CARGO_MANIFEST_DIR")).join("../sdk");
    let out = kiln(&["plugin", "new", "edge-lab", "--sdk", sdk.to_str().unwrap()], work.path());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let crate_dir = work.path().join("edge-lab");
    assert_eq!(text(&out.stdout).trim(), "./edge-lab");
    for file in ["Cargo.toml", "Cargo.lock", "kiln-plugin.toml", "src/lib.rs", ".cargo/config.toml"] {
        assert!(crate_dir.join(file).is_file(), "{file} written");
    }
    let again = kiln(&["plugin", "new", "edge-lab", "--sdk", sdk.to_str().unwrap()], work.path());
    assert!(!again.status.success() && text(&again.stderr).contains("already exists"), "{}", text(&again.stderr));

    let out = kiln(&["plugin", "build", "edge-lab"], work.path());
    assert!(out.status.success(), "build failed: {}", text(&out.stderr));
    let folder = PathBuf::from(text(&out.stdout).trim());
    assert!(folder.is_absolute() && folder.join("kiln-plugin.toml").is_file() && folder.join("edge_lab.wasm").is_file(), "{}", folder.display());
    assert!(
        text(&out.stderr).contains("edge-lab 0.1.0 ok: component blake3:") && text(&out.stderr).contains("classes: EdgeLabInvert"),
        "{}",
        text(&out.stderr)
    );

    // Its node in a job: a green image inverted (magenta), saved.
    let workflow = serde_json::json!({
        "1": {"class_type": "EmptyImage", "inputs": {"width": 4, "height": 2, "batch_size": 1, "color": 0x00ff00}},
        "2": {"class_type": "EdgeLabInvert", "inputs": {"image": ["1", 0], "amount": 1.0}},
        "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "lab"}}
    });
    std::fs::write(work.path().join("workflow.json"), workflow.to_string()).unwrap();
    let out_dir = work.path().join("out");
    let run = kiln(&["--plugins", folder.to_str().unwrap(), "run", "workflow.json", "--out", out_dir.to_str().unwrap(), "--no-progress-bar"], work.path());
    assert!(run.status.success(), "{}\n{}", text(&run.stdout), text(&run.stderr));
    let png = std::fs::read_dir(&out_dir).unwrap().map(|e| e.unwrap().path()).find(|p| p.extension().is_some_and(|e| e == "png")).expect("a saved PNG");
    let image = image::open(&png).unwrap().into_rgb8();
    assert_eq!((image.width(), image.height()), (4, 2));
    assert!(image.pixels().all(|p| p.0 == [255, 0, 255]), "{:?}", image.get_pixel(0, 0));

    // Into a running server, without a restart.
    let server = serve(&work.path().join("served"), &[]);
    let mut install = Command::new(env!("CARGO_BIN_EXE_kiln"));
    install.args(["plugins", "--url", &server.base, "install", folder.to_str().unwrap()]).env("KILN_ADMIN_TOKEN", TOKEN);
    let installed = install.output().unwrap();
    assert!(installed.status.success(), "{}", text(&installed.stderr));
    let answer: serde_json::Value = serde_json::from_slice(&installed.stdout).unwrap();
    assert_eq!((answer["name"].as_str(), answer["classes"].clone()), (Some("edge-lab"), serde_json::json!(["EdgeLabInvert"])), "{answer}");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let job = rt.block_on(async {
        let http = reqwest::Client::new();
        let created: serde_json::Value =
            http.post(format!("{}/api/v2/jobs", server.base)).json(&serde_json::json!({ "workflow": workflow })).send().await.unwrap().json().await.unwrap();
        settled(&http, &server.base, None, created["id"].as_str().unwrap_or_else(|| panic!("{created}"))).await
    });
    assert_eq!(job["status"], "succeeded", "{job}");
    assert_eq!(job["components"]["edge-lab"], answer["hash"], "{job}");
}

const TOKEN: &str = "plugin-sdk-operator";

/// A `kiln serve` on loopback with the operator token and `env`.
fn serve(data: &Path, env: &[(&str, &str)]) -> common::Kiln {
    let env: Vec<(&str, &str)> = [("KILN_GPU", "off"), ("KILN_ADMIN_TOKEN", TOKEN)].into_iter().chain(env.iter().copied()).collect();
    common::spawn(data, &env, &[])
}

/// Polls job `id` (with `key`, if any) until it leaves `queued` and
/// `running`; the job.
async fn settled(http: &reqwest::Client, base: &str, key: Option<&str>, id: &str) -> serde_json::Value {
    for _ in 0..600 {
        let mut request = http.get(format!("{base}/api/v2/jobs/{id}"));
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        let job: serde_json::Value = request.send().await.unwrap().json().await.unwrap();
        if !["queued", "running"].contains(&job["status"].as_str().unwrap_or("")) {
            return job;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("job {id} did not finish");
}

#[test]
fn check_refuses_a_manifest_that_under_declares_an_import() {
    let work = tempfile::tempdir().unwrap();
    let folder = work.path().join("quiet");
    std::fs::create_dir(&folder).unwrap();
    // The partner plugin calls out through wasi:http; this manifest does
    // not say so.
    std::fs::write(folder.join("partner.wasm"), PARTNER_WASM).unwrap();
    std::fs::write(folder.join("kiln-plugin.toml"), "name = \"quiet\"\nversion = \"1.0.0\"\ncomponent = \"partner.wasm\"\n").unwrap();
    let out = kiln(&["plugin", "check", folder.to_str().unwrap()], work.path());
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(stderr.contains("imports `wasi:http/") && stderr.contains("it needs `capabilities.outbound_hosts` or `capabilities.routes`"), "{stderr}");

    // Declared, the same component passes.
    let manifest = "name = \"quiet\"\nversion = \"1.0.0\"\ncomponent = \"partner.wasm\"\n[capabilities]\noutbound_hosts = [\"example.com\"]\nroutes = [\"/proxy/partner/\"]\nsecrets = [\"api_key_svc_org\"]\n";
    std::fs::write(folder.join("kiln-plugin.toml"), manifest).unwrap();
    let out = kiln(&["plugin", "check", folder.to_str().unwrap()], work.path());
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("quiet 1.0.0 ok: component blake3:") && text(&out.stdout).contains("MagnificImageSkinEnhancerNode"),
        "{}",
        text(&out.stdout)
    );
}

/// `wasm` (built against `kiln:plugin@0.1.2`) with every `kiln:plugin/…`
/// import and export renamed to `@<version>` (a version of the same
/// length: the component stays well-formed).
fn built_against(wasm: &[u8], version: &str) -> Vec<u8> {
    let mut out = wasm.to_vec();
    let (prefix, old, new) = (b"kiln:plugin/", b"@0.1.2", format!("@{version}").into_bytes());
    assert_eq!(new.len(), old.len());
    let mut i = 0;
    while let Some(at) = out[i..].windows(prefix.len()).position(|w| w == prefix).map(|p| p + i) {
        let end = (at..out.len().min(at + 64)).find(|&j| out[j..].starts_with(old));
        if let Some(j) = end {
            out[j..j + old.len()].copy_from_slice(&new);
        }
        i = at + prefix.len();
    }
    out
}

/// Every contract version the host speaks loads (0.1.0: the example as this
/// repository built it then; 0.1.1 and 0.1.2: the primitives plugin as
/// built, renamed), and one it does not is refused, naming the versions.
#[test]
fn check_names_the_contract_versions_the_host_speaks() {
    let work = tempfile::tempdir().unwrap();
    let folder = work.path().join("versions");
    std::fs::create_dir(&folder).unwrap();
    std::fs::write(folder.join("kiln-plugin.toml"), "name = \"versions\"\nversion = \"1.0.0\"\ncomponent = \"p.wasm\"\n").unwrap();
    let v0_1_0 = include_bytes!("../../tests/fixtures/plugins/custom-node-kiln-plugin-0.1.0.wasm").to_vec();
    for (version, wasm, class) in [
        ("0.1.0", v0_1_0, "ExamplePosterize"),
        ("0.1.1", built_against(PRIMITIVES_WASM, "0.1.1"), "PrimitiveInt"),
        ("0.1.2", PRIMITIVES_WASM.to_vec(), "PrimitiveInt"),
    ] {
        std::fs::write(folder.join("p.wasm"), wasm).unwrap();
        let out = kiln(&["plugin", "check", folder.to_str().unwrap()], work.path());
        assert!(out.status.success() && text(&out.stdout).contains(class), "kiln:plugin@{version}: {}", text(&out.stderr));
    }
    // Built against a newer contract: refused, saying which versions this host speaks.
    std::fs::write(folder.join("p.wasm"), built_against(PRIMITIVES_WASM, "0.9.2")).unwrap();
    let out = kiln(&["plugin", "check", folder.to_str().unwrap()], work.path());
    let stderr = text(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("@0.9.2`: it was built against a version of kiln's plugin contract") && stderr.contains("it speaks kiln:plugin@0.1.0 to @0.1.2"),
        "{stderr}"
    );
}

/// A component that takes Cranelift most of a minute, sent by one account
/// of a cloud server: refused at `compile_timeout_s`, while another
/// account's job and its own install go through meanwhile.
#[test]
fn a_tenants_compile_bomb_costs_only_its_own_install() {
    let work = tempfile::tempdir().unwrap();
    let server = serve(&work.path().join("data"), &[("KILN_MODE", "cloud"), ("KILN_COMPILE_TIMEOUT_S", "3")]);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let http = reqwest::Client::new();
        let account = |name: &'static str| {
            let (http, base) = (http.clone(), server.base.clone());
            async move {
                let made = common::new_account(&http, &base, TOKEN, name, 100).await;
                made["key"].as_str().unwrap_or_else(|| panic!("{made}")).to_string()
            }
        };
        let (bomber, bystander) = (account("bomber").await, account("bystander").await);
        let install = |key: String, name: &'static str, wasm: Vec<u8>| {
            let (http, base) = (http.clone(), server.base.clone());
            async move {
                let form = reqwest::multipart::Form::new()
                    .text("manifest", format!("name = \"{name}\"\nversion = \"1\"\ncomponent = \"p.wasm\"\n"))
                    .part("component", reqwest::multipart::Part::bytes(wasm).file_name("p.wasm"));
                let resp = http.post(format!("{base}/api/v2/plugins")).bearer_auth(key).multipart(form).send().await.unwrap();
                (resp.status().as_u16(), resp.json::<serde_json::Value>().await.unwrap_or_default())
            }
        };
        let started = std::time::Instant::now();
        let bomb = tokio::spawn(install(bomber.clone(), "bomb", common::slow_to_compile(5000, 50_000)));
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        // Meanwhile the other account installs a plugin and runs a job.
        let (status, body) = install(bystander.clone(), "prims", PRIMITIVES_WASM.to_vec()).await;
        assert_eq!(status, 422, "its classes are the host's: {body}");
        let job: serde_json::Value = http
            .post(format!("{}/api/v2/jobs", server.base))
            .bearer_auth(&bystander)
            .json(&serde_json::json!({ "workflow": {
                "1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 7}},
                "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "b"}}
            } }))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let done = settled(&http, &server.base, Some(&bystander), job["id"].as_str().unwrap_or_else(|| panic!("{job}"))).await;
        assert!(!bomb.is_finished(), "the bomb still compiles while the other account's job ran");
        assert_eq!(done["status"], "succeeded", "the other account's job was not held up: {done}");
        let (code, body) = bomb.await.unwrap();
        assert_eq!((code, body["error"]["code"].as_str()), (422, Some("plugin_refused")), "{body}");
        assert!(body["error"]["message"].as_str().unwrap_or("").contains("compile_timeout_s = 3 s"), "{body}");
        assert!(started.elapsed() < std::time::Duration::from_secs(30), "bounded by the compile time limit: {:?}", started.elapsed());
        let listed: serde_json::Value = http.get(format!("{}/api/v2/plugins", server.base)).bearer_auth(&bomber).send().await.unwrap().json().await.unwrap();
        assert_eq!(listed, serde_json::json!({ "plugins": [] }), "nothing half-installed");
    });
}
