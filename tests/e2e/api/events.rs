//! The SSE event stream.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::Value;

use super::{TestServer, spinner, start, start_default, trivial};

/// One SSE frame: an event with JSON data, or a comment.
#[derive(Debug)]
pub(super) enum Frame {
    Event { name: String, data: Value, has_id: bool },
    Comment(String),
}

/// Reads frames until the server ends the stream (or `limit` passes).
pub(super) async fn read_stream(s: &TestServer, url: &str, limit: Duration) -> (Vec<Frame>, bool, reqwest::header::HeaderMap) {
    let resp = s.http.get(url).header("accept", "text/event-stream").send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let headers = resp.headers().clone();
    let mut body = resp.bytes_stream();
    let mut buf = String::new();
    let mut frames = Vec::new();
    let deadline = Instant::now() + limit;
    let ended = loop {
        let chunk = match tokio::time::timeout_at(deadline.into(), body.next()).await {
            Err(_) => break false,
            Ok(None) => break true,
            Ok(Some(c)) => c.unwrap(),
        };
        buf.push_str(std::str::from_utf8(&chunk).unwrap());
        while let Some(end) = buf.find("\n\n") {
            let block: String = buf.drain(..end + 2).collect();
            let (mut name, mut data, mut has_id, mut comment) = (String::new(), String::new(), false, None);
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("event:") {
                    name = v.trim().into();
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push_str(v.trim_start());
                } else if line.starts_with("id:") {
                    has_id = true;
                } else if let Some(c) = line.strip_prefix(':') {
                    comment = Some(c.trim().to_string());
                }
            }
            match comment {
                Some(c) if name.is_empty() => frames.push(Frame::Comment(c)),
                _ => frames.push(Frame::Event { name, data: serde_json::from_str(&data).unwrap(), has_id }),
            }
        }
    };
    (frames, ended, headers)
}

pub(super) fn events(frames: &[Frame]) -> Vec<(&str, &Value)> {
    frames
        .iter()
        .filter_map(|f| match f {
            Frame::Event { name, data, has_id } => {
                assert!(!has_id, "no id: lines");
                Some((name.as_str(), data))
            }
            Frame::Comment(_) => None,
        })
        .collect()
}

#[tokio::test]
async fn live_stream_sends_status_outputs_then_terminal_status_and_ends() {
    let s = start(|_, o| o.max_running_jobs = 1).await;
    // Hold the worker so the stream opens on a queued job.
    let blocker = s.submit(spinner(7)).await;
    s.wait_for(blocker["id"].as_str().unwrap(), "running").await;
    let job = s.submit(trivial(11)).await;
    let url = format!("{}{}", s.server.url().split("/api").next().unwrap(), job["urls"]["events"].as_str().unwrap());
    let (frames, ended, headers) = {
        let canceller = s.cancel_later(blocker["id"].as_str().unwrap(), 300);
        let r = read_stream(&s, &url, Duration::from_secs(20)).await;
        canceller.await.unwrap();
        r
    };
    assert!(ended, "the stream ends after the terminal status");
    assert_eq!(headers["content-type"], "text/event-stream");
    let evs = events(&frames);
    assert_eq!(evs[0].0, "status", "{frames:?}");
    assert_eq!(evs[0].1["status"], "queued");
    assert_eq!(evs[0].1["queue_position"], 1);
    assert!(evs[0].1.get("logs").is_none());
    let (last_name, last) = evs.last().unwrap();
    assert_eq!((*last_name, last["status"].as_str()), ("status", Some("succeeded")), "{frames:?}");
    let outputs: Vec<usize> = evs.iter().enumerate().filter(|(_, e)| e.0 == "output").map(|(i, _)| i).collect();
    assert_eq!(outputs.len(), 1, "{frames:?}");
    assert!(outputs[0] < evs.len() - 1, "outputs come before the terminal status");
    let out = evs[outputs[0]].1;
    assert!(out["url"].as_str().unwrap().starts_with("http://") && out["hash"].as_str().unwrap().starts_with("blake3:"));
    assert!(evs.iter().any(|e| e.0 == "status" && e.1["status"] == "running"));
    for (name, data) in &evs {
        if *name == "progress" {
            let v = data["value"].as_f64().unwrap();
            assert!((0.0..=1.0).contains(&v) && data["nodes_done"].is_u64() && data["nodes_total"].is_u64(), "{data}");
        }
    }
}

#[tokio::test]
async fn a_finished_job_streams_outputs_and_status_then_closes() {
    let s = start_default().await;
    let job = s.submit(trivial(12)).await;
    let id = job["id"].as_str().unwrap();
    s.wait(id).await;
    let (frames, ended, headers) = read_stream(&s, &s.url(&format!("/jobs/{id}/events")), Duration::from_secs(5)).await;
    assert!(ended);
    assert_eq!(headers["cache-control"], "no-cache");
    let evs = events(&frames);
    assert_eq!(evs.iter().map(|e| e.0).collect::<Vec<_>>(), vec!["output", "status"]);
    assert_eq!(evs[1].1["status"], "succeeded");
}

#[tokio::test]
async fn keepalives_flow_while_a_job_is_quiet() {
    let s = start(|c, o| {
        c.sse_keepalive_s = 1;
        o.max_running_jobs = 1;
    })
    .await;
    let job = s.submit(spinner(8)).await;
    let (frames, ended, _) = read_stream(&s, &s.url(&format!("/jobs/{}/events", job["id"].as_str().unwrap())), Duration::from_millis(3500)).await;
    let comments = frames.iter().filter(|f| matches!(f, Frame::Comment(c) if c == "keepalive")).count();
    assert!(comments >= 1, "{frames:?}");
    // The spinner ends by its own 2 s limit: failed, with the stream closed.
    if ended {
        let evs = events(&frames);
        assert_eq!(evs.last().unwrap().1["status"], "failed");
        assert_eq!(evs.last().unwrap().1["error"]["code"], "node_timeout");
    }
}

#[tokio::test]
async fn too_many_streams_is_429_while_polling_still_works() {
    let s = start(|_, o| {
        o.max_event_streams = 1;
        o.max_running_jobs = 1;
    })
    .await;
    let job = s.submit(spinner(9)).await;
    let id = job["id"].as_str().unwrap();
    let url = s.url(&format!("/jobs/{id}/events"));
    let first = s.http.get(&url).send().await.unwrap();
    assert_eq!(first.status(), 200);
    let second = s.http.get(&url).send().await.unwrap();
    assert_eq!(second.status(), 429);
    assert!(second.headers()["retry-after"].to_str().unwrap().parse::<u64>().is_ok());
    assert_eq!(second.json::<Value>().await.unwrap()["error"]["code"], "too_many_streams");
    assert_eq!(s.get(&format!("/jobs/{id}")).await.0, 200);
    drop(first);
    // The slot frees when the client goes away.
    let mut freed = false;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        if s.server.state.service.open_streams() == 0 {
            freed = true;
            break;
        }
    }
    assert!(freed);
    assert_eq!(s.http.get(&url).send().await.unwrap().status(), 200);
}

#[tokio::test]
async fn previews_from_plugins_reach_the_stream() {
    use base64::Engine;
    // A registry with the example plugin, which reports progress and a preview.
    let env = crate::support::env().await;
    let dir = tempfile::tempdir().unwrap();
    crate::support::install_plugin(&dir.path().join("example"), crate::support::EXAMPLE_MANIFEST, crate::support::EXAMPLE_WASM);
    crate::support::install_plugin(&dir.path().join("hostile"), crate::support::HOSTILE_MANIFEST, crate::support::HOSTILE_WASM);
    let registry = std::sync::Arc::new(kiln::plugins::NodeRegistry::load_all(&env.runtime, &[dir.path().to_path_buf()]).await.unwrap());
    let data = tempfile::tempdir().unwrap();
    let config = super::config(data.path());
    let mut options = kiln::service::ServiceOptions::from_config(&config);
    options.max_running_jobs = 1;
    let server = kiln::server::Server::start_with(config, options, env.runtime.clone(), registry).await.unwrap();
    let s = TestServer { base: format!("{}/api/v2", server.url()), server, http: reqwest::Client::new(), data };

    let blocker = s.submit(spinner(31)).await;
    s.wait_for(blocker["id"].as_str().unwrap(), "running").await;
    let job = s
        .submit(serde_json::json!({
            "1": { "class_type": "EmptyImage", "inputs": { "width": 40, "height": 20, "batch_size": 3, "color": 0x336699 } },
            "2": { "class_type": "ExamplePosterize", "inputs": { "image": ["1", 0], "levels": 3 } },
            "3": { "class_type": "SaveImage", "inputs": { "images": ["2", 0], "filename_prefix": "poster" } },
        }))
        .await;
    let canceller = s.cancel_later(blocker["id"].as_str().unwrap(), 200);
    let (frames, ended, _) = read_stream(&s, &s.url(&format!("/jobs/{}/events", job["id"].as_str().unwrap())), Duration::from_secs(20)).await;
    canceller.await.unwrap();
    assert!(ended);
    let evs = events(&frames);
    let preview = evs.iter().find(|e| e.0 == "preview").unwrap_or_else(|| panic!("a preview frame: {frames:?}")).1;
    assert_eq!((preview["node_id"].as_str(), preview["content_type"].as_str()), (Some("2"), Some("image/png")));
    let png = base64::engine::general_purpose::STANDARD.decode(preview["data_base64"].as_str().unwrap()).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    assert_eq!(evs.last().unwrap().1["status"], "succeeded");
}

/// While a long job runs, `GET` shows progress snapshots that advance with
/// the nodes, and its stream carries progress frames no more often than
/// about twice a second (each a full snapshot), however many nodes finish.
#[tokio::test]
async fn progress_advances_while_running_and_its_frames_are_throttled() {
    let s = start_default().await;
    let blurs = 40;
    let mut wf = serde_json::Map::new();
    wf.insert("0".into(), serde_json::json!({ "class_type": "EmptyImage", "inputs": { "width": 1024, "height": 1024, "batch_size": 1, "color": 0x808080 } }));
    for i in 1..=blurs {
        wf.insert(
            i.to_string(),
            serde_json::json!({ "class_type": "ImageBlur", "inputs": { "image": [(i - 1).to_string(), 0], "blur_radius": 15, "sigma": 5.0 } }),
        );
    }
    wf.insert("out".into(), serde_json::json!({ "class_type": "PreviewImage", "inputs": { "images": [blurs.to_string(), 0] } }));
    let job = s.submit(Value::Object(wf)).await;
    let id = job["id"].as_str().unwrap().to_string();

    // The stream, timed: when each progress frame arrived.
    let url = s.url(&format!("/jobs/{id}/events"));
    let http = s.http.clone();
    let stream = tokio::spawn(async move {
        let started = Instant::now();
        let mut body = http.get(url).send().await.unwrap().bytes_stream();
        let (mut buf, mut progress) = (String::new(), Vec::new());
        while let Some(chunk) = body.next().await {
            buf.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
            while let Some(end) = buf.find("\n\n") {
                let block: String = buf.drain(..end + 2).collect();
                if let Some(data) = block.strip_prefix("event: progress\ndata: ") {
                    progress.push(serde_json::from_str::<Value>(data.trim()).unwrap());
                }
            }
        }
        (progress, started.elapsed())
    });

    // Polls see the snapshot move through the chain.
    let mut seen = Vec::new();
    loop {
        let now = s.job(&id).await;
        if now["status"] == "succeeded" {
            assert_eq!(now["progress"]["value"], 1.0, "{now}");
            break;
        }
        if now["status"] == "running" && now["progress"].is_object() {
            let p = &now["progress"];
            assert_eq!(p["nodes_total"], blurs + 2, "{p}");
            seen.push((p["nodes_done"].as_u64().unwrap(), p["value"].as_f64().unwrap()));
        }
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    assert!(seen.windows(2).all(|w| w[0].0 <= w[1].0 && w[0].1 <= w[1].1), "progress never goes back: {seen:?}");
    let midway = seen.iter().filter(|(done, v)| *done > 0 && *done < blurs + 2 && *v > 0.0 && *v < 1.0).count();
    assert!(midway >= 2, "snapshots between start and end: {seen:?}");

    let (frames, elapsed) = stream.await.unwrap();
    assert!(!frames.is_empty(), "at least one progress frame");
    assert!(frames.iter().all(|f| f["nodes_total"] == blurs + 2 && f["value"].is_f64()), "full snapshots: {frames:?}");
    // 42 nodes start and finish, but frames go out at most every 0.5 s.
    let bound = (elapsed.as_secs_f64() / 0.5).ceil() as usize + 1;
    assert!(frames.len() <= bound, "{} frames in {elapsed:?}", frames.len());
}

/// A bus whose `follow` hands out a channel the test feeds, as a bus
/// shared by several hosts would relay a job another host runs.
struct RelayBus {
    local: kiln::service::bus::LocalBus,
    relay: tokio::sync::broadcast::Sender<kiln::service::JobEvent>,
}

impl kiln::service::bus::ExecBus for RelayBus {
    fn publish(&self, message: std::sync::Arc<kiln::service::bus::ExecMessage>) {
        self.local.publish(message)
    }
    fn subscribe(&self) -> tokio::sync::broadcast::Receiver<std::sync::Arc<kiln::service::bus::ExecMessage>> {
        self.local.subscribe()
    }
    fn watched(&self) -> bool {
        self.local.watched()
    }
    fn job_channel(&self, id: &str) -> std::sync::Arc<dyn kiln::service::bus::JobChannel> {
        self.local.job_channel(id)
    }
    fn follow(&self, _id: &str) -> Option<tokio::sync::broadcast::Receiver<kiln::service::JobEvent>> {
        Some(self.relay.subscribe())
    }
}

#[tokio::test]
async fn a_stream_on_a_job_another_process_runs_relays_the_bus_until_it_ends() {
    use std::sync::Arc;

    use kiln::service::JobEvent;
    use kiln::store::{JobStatus, MetaStore};

    let relay = tokio::sync::broadcast::channel(16).0;
    let mut store = None;
    let s = super::start_on_backends(|data| {
        let meta = Arc::new(kiln::store::SledMeta::open(&data.join("meta")).unwrap());
        let blobs = Arc::new(kiln::store::DiskBlobs::open(data.join("blobs")).unwrap());
        store = Some(meta.clone());
        let mut backends = kiln::service::Backends::with_stores(meta, blobs, data).unwrap();
        backends.bus = Arc::new(RelayBus { local: Default::default(), relay: relay.clone() });
        backends
    })
    .await;
    let meta = store.unwrap();

    // A record as another process would have written it: running, and not
    // in this process's live set.
    let done = s.submit(trivial(3)).await;
    let done = s.wait(done["id"].as_str().unwrap()).await;
    let mut record = meta.get_job(done["id"].as_str().unwrap()).await.unwrap().unwrap();
    record.id = uuid::Uuid::now_v7().to_string();
    (record.status, record.completed_at, record.outputs, record.execution_ms) = (JobStatus::Running, None, Vec::new(), None);
    meta.put_job(&record).await.unwrap();

    let url = s.url(&format!("/jobs/{}/events", record.id));
    let feeder = {
        let (relay, mut running, mut finished) = (relay.clone(), record.clone(), record.clone());
        tokio::spawn(async move {
            while relay.receiver_count() == 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            running.updated_at += 1;
            relay.send(JobEvent::Status(Arc::new(running))).unwrap();
            (finished.status, finished.completed_at) = (JobStatus::Succeeded, Some(finished.updated_at + 2));
            relay.send(JobEvent::Status(Arc::new(finished))).unwrap();
        })
    };
    let (frames, ended, _) = read_stream(&s, &url, Duration::from_secs(20)).await;
    feeder.await.unwrap();
    let statuses: Vec<&str> = events(&frames).iter().filter(|(n, _)| *n == "status").map(|(_, d)| d["status"].as_str().unwrap()).collect();
    assert_eq!(statuses, ["running", "running", "succeeded"], "the stored snapshot, then what the bus relayed");
    assert!(ended, "the stream ends at the relayed terminal status");
}
