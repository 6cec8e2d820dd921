//! What the official web frontend needs besides jobs: its settings and user
//! data files, kept in the data directory across restarts, with paths and
//! sizes bounded; the static tree served with `index.html` uncached and a
//! Content-Security-Policy; and the optional lookups it makes at start.

use serde_json::{Value, json};

use crate::api::{TestServer, start, start_default, start_in};

fn root(server: &TestServer, path: &str) -> String {
    format!("{}{path}", server.server.url())
}

async fn get(server: &TestServer, path: &str) -> (u16, String) {
    let resp = server.http.get(root(server, path)).send().await.unwrap();
    (resp.status().as_u16(), resp.text().await.unwrap())
}

async fn post(server: &TestServer, path: &str, body: impl Into<reqwest::Body>) -> (u16, String) {
    let resp = server.http.post(root(server, path)).body(body).send().await.unwrap();
    (resp.status().as_u16(), resp.text().await.unwrap())
}

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

#[tokio::test]
async fn settings_and_saved_workflows_survive_a_restart() {
    let server = start_default().await;
    assert_eq!(get(&server, "/api/settings").await, (200, "{}".into()));
    assert_eq!(get(&server, "/api/settings/Comfy.InstalledVersion").await, (200, "null".into()));
    assert_eq!(post(&server, "/api/settings/Comfy.InstalledVersion", "\"1.58.1\"").await.0, 200);
    assert_eq!(post(&server, "/api/settings", r#"{"Comfy.TutorialCompleted": true, "Comfy.Locale": "en"}"#).await.0, 200);
    assert_eq!(post(&server, "/api/settings", "[1]").await.0, 400);
    // ComfyUI's listing of a directory not there yet is a 404 (the frontend shows none).
    assert_eq!(get(&server, "/api/userdata?dir=workflows&recurse=true&split=false&full_info=true").await.0, 404);
    assert_eq!(get(&server, "/api/userdata").await.0, 400, "dir is required");
    let workflow = r#"{"nodes": [], "links": [], "version": 0.4}"#;
    let (status, body) = post(&server, "/api/userdata/workflows%2Fmine.json?overwrite=false&full_info=true", workflow).await;
    assert_eq!(status, 200, "{body}");
    let info = json(&body);
    assert_eq!((info["path"].as_str(), info["size"].as_u64()), (Some("workflows/mine.json"), Some(workflow.len() as u64)));
    assert!(info["modified"].as_i64().unwrap() > 1_600_000_000_000, "milliseconds: {info}");
    assert_eq!(post(&server, "/api/userdata/workflows%2Fmine.json?overwrite=false", "{}").await.0, 409);
    assert_eq!(post(&server, "/api/userdata/workflows%2Fsub%2Fother.json", "{}").await, (200, "\"workflows/sub/other.json\"".into()));
    let data = server.shutdown().await;

    let server = start_in(data, |_, _| {}).await;
    let settings = json(&get(&server, "/api/settings").await.1);
    assert_eq!(settings, json!({"Comfy.InstalledVersion": "1.58.1", "Comfy.TutorialCompleted": true, "Comfy.Locale": "en"}));
    assert_eq!(get(&server, "/api/settings/Comfy.Locale").await, (200, "\"en\"".into()));
    let (status, listed) = get(&server, "/api/userdata?dir=workflows&recurse=true&split=false&full_info=true").await;
    assert_eq!(status, 200);
    let paths: Vec<Value> = json(&listed).as_array().unwrap().iter().map(|f| f["path"].clone()).collect();
    assert_eq!(paths, [json!("mine.json"), json!("sub/other.json")]);
    assert_eq!(json(&get(&server, "/api/userdata?dir=workflows").await.1), json!(["mine.json"]), "no recursion");
    assert_eq!(
        json(&get(&server, "/api/userdata?dir=workflows&recurse=true&split=true").await.1),
        json!([["mine.json", "mine.json"], ["sub/other.json", "sub", "other.json"]])
    );
    let resp = server.http.get(root(&server, "/api/userdata/workflows%2Fmine.json")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.headers()["content-disposition"].to_str().unwrap().starts_with("attachment"));
    assert_eq!(resp.text().await.unwrap(), workflow);
    // Rename, then delete.
    let (status, moved) = post(&server, "/api/userdata/workflows%2Fmine.json/move/workflows%2Frenamed.json?full_info=true", "").await;
    assert_eq!((status, json(&moved)["path"].clone()), (200, json!("workflows/renamed.json")));
    assert_eq!(post(&server, "/api/userdata/workflows%2Frenamed.json/move/workflows%2Fsub%2Fother.json?overwrite=false", "").await.0, 409);
    assert_eq!(get(&server, "/api/userdata/workflows%2Fmine.json").await.0, 404);
    let deleted = server.http.delete(root(&server, "/api/userdata/workflows%2Frenamed.json")).send().await.unwrap();
    assert_eq!(deleted.status(), 204);
    assert_eq!(get(&server, "/api/userdata/workflows%2Frenamed.json").await.0, 404);
    server.shutdown().await;
}

/// Directories under `dir`, recursively.
fn directories(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).filter(|p| p.is_dir()).map(|p| 1 + directories(&p)).sum()
}

/// The directories of the default user's files: on disk, or (with
/// `KILN_TEST_STORE=postgres`) the ones their paths in the database imply.
async fn user_directories(server: &TestServer) -> usize {
    let Ok(url) = std::fs::read_to_string(server.data.path().join("test-database-url")) else {
        return directories(&server.data.path().join("users/default/files"));
    };
    let db = sqlx::PgPool::connect(&url).await.unwrap();
    let paths: Vec<(String,)> = sqlx::query_as("SELECT path FROM user_files WHERE user_id = 'default'").fetch_all(&db).await.unwrap();
    db.close().await;
    let dirs: std::collections::HashSet<&str> = paths.iter().flat_map(|(p,)| p.match_indices('/').map(move |(i, _)| &p[..i])).collect();
    dirs.len()
}

#[tokio::test]
async fn moves_and_deletes_of_user_data_leave_no_empty_directories() {
    let server = start(|config, _| config.max_userdata_files = 5).await;
    for name in ["a", "b"] {
        assert_eq!(post(&server, &format!("/api/userdata/workflows%2F{name}.json"), "{}").await.0, 200);
    }
    // 150 moves, each into three fresh directories (the old server kept
    // every one: 450 here, walked by every later write).
    let mut at = "workflows%2Fa.json".to_string();
    for i in 0..150 {
        let next = format!("m{i}%2Fn{i}%2Fo{i}%2Fa.json");
        let (status, body) = post(&server, &format!("/api/userdata/{at}/move/{next}"), "").await;
        assert_eq!(status, 200, "move {i}: {body}");
        at = next;
    }
    assert_eq!(user_directories(&server).await, 4, "workflows/ (b.json) and m149/n149/o149/ (a.json), nothing else");
    assert_eq!(server.http.delete(root(&server, &format!("/api/userdata/{at}"))).send().await.unwrap().status(), 204);
    assert_eq!(server.http.delete(root(&server, "/api/userdata/workflows%2Fb.json")).send().await.unwrap().status(), 204);
    assert_eq!(user_directories(&server).await, 0);
    let on_disk = server.data.path().join("users/default/files");
    if !server.data.path().join("test-database-url").exists() {
        assert!(on_disk.is_dir(), "the user's own directory stays");
    }
    // Writes work as before, up to the file bound.
    for i in 0..5 {
        assert_eq!(post(&server, &format!("/api/userdata/d{i}%2Ff.json"), "{}").await.0, 200);
    }
    assert_eq!(post(&server, "/api/userdata/x.json", "{}").await.0, 507);
    server.shutdown().await;
}

#[tokio::test]
async fn user_data_refuses_escapes_and_bounds_sizes() {
    let server = start(|config, _| {
        config.max_userdata_file_kb = 1;
        config.max_userdata_files = 2;
        config.max_settings_kb = 1;
    })
    .await;
    for bad in ["..%2Fescape.json", "workflows%2F..%2F..%2Fescape.json", "%2Fetc%2Fpasswd", ".hidden", "a%5Cb"] {
        assert_eq!(post(&server, &format!("/api/userdata/{bad}"), "{}").await.0, 400, "{bad}");
        assert_eq!(get(&server, &format!("/api/userdata/{bad}")).await.0, 400, "{bad}");
    }
    assert_eq!(get(&server, "/api/userdata?dir=..").await.0, 400);
    assert!(!server.data.path().join("escape.json").exists() && !server.data.path().join("users/escape.json").exists());
    assert_eq!(post(&server, "/api/userdata/big.json", vec![b' '; 1025]).await.0, 413);
    assert_eq!(post(&server, "/api/userdata/a.json", vec![b' '; 1024]).await.0, 200);
    assert_eq!(post(&server, "/api/userdata/b.json", "{}").await.0, 200);
    assert_eq!(post(&server, "/api/userdata/c.json", "{}").await.0, 507, "at most 2 files");
    assert_eq!(post(&server, "/api/settings/Comfy.Big", format!("\"{}\"", "x".repeat(2000))).await.0, 413);
    assert_eq!(get(&server, "/api/settings").await, (200, "{}".into()));
    server.shutdown().await;
}

#[tokio::test]
async fn the_frontend_is_served_with_its_policy() {
    let tree = tempfile::tempdir().unwrap();
    std::fs::write(
        tree.path().join("index.html"),
        "<html><head><style>body{}</style><script type=\"module\" src=\"./assets/index.js\"></script></head></html>",
    )
    .unwrap();
    std::fs::create_dir(tree.path().join("assets")).unwrap();
    std::fs::write(tree.path().join("assets/index.js"), "export {};").unwrap();
    let dir = tree.path().to_path_buf();
    let server = start(move |config, _| config.front_end_root = Some(dir)).await;
    let resp = server.http.get(root(&server, "/")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["cache-control"], "no-store");
    let csp = resp.headers()["content-security-policy"].to_str().unwrap().to_string();
    assert!(csp.contains("default-src 'self'") && csp.contains("connect-src 'self'") && !csp.contains("script-src 'self' 'unsafe-inline'"), "{csp}");
    assert!(csp.contains("'sha256-"), "the inline style is allowed by hash: {csp}");
    assert!(resp.text().await.unwrap().contains("./assets/index.js"));
    let js = server.http.get(root(&server, "/assets/index.js")).send().await.unwrap();
    assert_eq!(js.status(), 200);
    assert!(js.headers()["content-type"].to_str().unwrap().contains("javascript"));
    assert_eq!(get(&server, "/user.css").await.0, 404);
    assert_eq!(get(&server, "/api/userdata/user.css").await.0, 404);
    assert_eq!(get(&server, "/..%2Findex.html").await.0, 404);
    // The API's routes still win over the tree.
    assert!(json(&get(&server, "/api/system_stats").await.1)["system"].is_object());
    for (path, body) in [
        ("/api/i18n", "{}"),
        ("/api/workflow_templates", "{}"),
        ("/api/global_subgraphs", "{}"),
        ("/api/node_replacements", "{}"),
        ("/api/experiment/models", "[]"),
    ] {
        assert_eq!(get(&server, path).await, (200, body.to_string()), "{path}");
    }
    assert_eq!(get(&server, "/api/view_metadata/checkpoints?filename=x.safetensors").await.0, 404);
    assert_eq!(get(&server, "/internal/files/input").await, (200, "[]".to_string()));
    assert_eq!(get(&server, "/internal/files/elsewhere").await.0, 400);
    server.shutdown().await;
    // Without a front end, `/` is the API's 404.
    let bare = start_default().await;
    assert_eq!(get(&bare, "/").await.0, 404);
    bare.shutdown().await;
}
