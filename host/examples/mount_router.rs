//! kiln's HTTP surfaces inside an existing axum application: its own route
//! at `/hello`, kiln's Jobs API, ComfyUI API and `/ws` under `/kiln`
//! (`mount_prefix`, so kiln's links carry it). Starts, submits one job
//! through the mounted Jobs API, prints its output's URL and stops.
//! `cargo run -p kiln --example mount_router`
use std::time::Duration;

use axum::routing::get;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let data_dir = std::env::temp_dir().join(format!("kiln-example-mount-{}", std::process::id()));
    let config = kiln::Config { mount_prefix: "/kiln".into(), data_dir: data_dir.clone(), ..kiln::Config::default() };
    let kiln = kiln::Mounted::start(config, addr).await?;
    let app = axum::Router::new().route("/hello", get(|| async { "hello from the application" })).merge(kiln.router());
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    let (http, base) = (reqwest::Client::new(), format!("http://{addr}"));
    println!("{}", http.get(format!("{base}/hello")).send().await?.text().await?);
    let workflow = serde_json::json!({
        "1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 0xff0000}},
        "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "mounted"}}
    });
    let job: serde_json::Value = http.post(format!("{base}/kiln/api/v2/jobs")).json(&serde_json::json!({ "workflow": workflow })).send().await?.json().await?;
    let this = format!("{base}{}", job["urls"]["self"].as_str().ok_or("no job link")?);
    let job = loop {
        let job: serde_json::Value = http.get(&this).send().await?.json().await?;
        if !["queued", "running"].contains(&job["status"].as_str().unwrap_or("")) {
            break job;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    if job["status"] != "succeeded" {
        return Err(format!("the job did not succeed: {job}").into());
    }
    let url = job["outputs"][0]["url"].as_str().unwrap_or("");
    if !url.starts_with(&format!("{base}/kiln/")) {
        return Err(format!("kiln's links must keep the mount prefix: {url}").into());
    }
    println!("job {} succeeded; output at {url}", job["id"]);

    server.abort();
    kiln.shutdown().await;
    let _ = std::fs::remove_dir_all(data_dir);
    Ok(())
}
