//! A data directory on a small filesystem of its own (a tmpfs, mounted for
//! the test: root's, as in CI): uploads that fill it get 507
//! `storage_full` in the envelope and a log line, readiness turns 503
//! (`checks.disk: "low"`) before that, what was stored stays whole, jobs
//! still run in the room kept for the store's own writes, a user data file
//! that finds the disk full is 507 as well, and once there is room again
//! the same server takes uploads and jobs. A
//! data directory on a read-only filesystem stops the start with the
//! system's reason. The embedded store only: PostgreSQL and S3 keep
//! nothing there.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use super::{TestServer, start_in, trivial};

/// A tmpfs mounted on a temporary directory; unmounted when dropped.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    /// `None` (the test skipped) where this process may not mount, outside
    /// CI; in CI the suite runs as root and must be able to.
    fn mount(options: &str) -> Option<Tmpfs> {
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new("mount").args(["-t", "tmpfs", "-o", options, "kiln-test"]).arg(dir.path()).output();
        match out {
            Ok(out) if out.status.success() => Some(Tmpfs { dir }),
            other => {
                assert!(std::env::var_os("CI").is_none(), "CI runs as root and must mount a tmpfs: {other:?}");
                eprintln!("SKIPPED: cannot mount a tmpfs here: {other:?}");
                None
            }
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn remount(&self, options: &str) {
        let out = Command::new("mount").args(["-o", &format!("remount,{options}")]).arg(self.path()).output().unwrap();
        assert!(out.status.success(), "{out:?}");
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.path()).status();
    }
}

/// Whether the suites keep this run's records and blobs elsewhere.
fn stores_elsewhere() -> bool {
    let skip = std::env::var("KILN_TEST_STORE").as_deref() == Ok("postgres") || std::env::var("KILN_TEST_BLOB_STORE").as_deref() == Ok("s3");
    if skip {
        eprintln!("SKIPPED: the store of this run is not on the data directory");
    }
    skip
}

async fn ready(s: &TestServer) -> (u16, Value) {
    // Past the readiness probe's one-second reuse.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    s.get("/ready").await
}

/// Distinct bytes that do not compress: `mib` MiB.
fn noise(mib: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..mib << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A file that takes all of `dir`'s filesystem but `room` bytes; removed
/// when dropped.
struct Ballast(std::path::PathBuf);

fn fill_but(dir: &Path, room: u64) -> Ballast {
    use std::io::Write;
    let path = dir.join("ballast");
    let mut file = std::fs::File::create(&path).unwrap();
    let chunk = vec![0x5a_u8; 64 << 10];
    let mut written = 0u64;
    while let Ok(n) = file.write(&chunk) {
        if n == 0 {
            break;
        }
        written += n as u64;
    }
    file.set_len(written.saturating_sub(room)).unwrap();
    Ballast(path)
}

impl Drop for Ballast {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[tokio::test]
async fn a_full_disk_is_507_and_not_ready_and_the_server_recovers_when_space_returns() {
    if stores_elsewhere() {
        return;
    }
    let Some(fs) = Tmpfs::mount("size=24m") else { return };
    let data = tempfile::tempdir_in(fs.path()).unwrap();
    let s = start_in(data, |c, o| {
        c.ready_min_free_mb = 12;
        o.disk_floor.min_free = 12 << 20;
    })
    .await;
    let (status, body) = ready(&s).await;
    assert_eq!((status, body["checks"]["disk"].as_str()), (200, Some("ok")), "{body}");

    let first = noise(2, 1);
    let (status, stored) = s.upload("first.bin", first.clone(), None).await;
    assert_eq!(status, 201, "{stored}");
    let mut full = None;
    for i in 2..20 {
        let (status, body) = s.upload(&format!("{i}.bin"), noise(2, i), None).await;
        if status != 201 {
            full = Some((status, body));
            break;
        }
    }
    let (status, body) = full.expect("24 MiB fills up");
    assert_eq!((status, body["error"]["code"].as_str()), (507, Some("storage_full")), "{body}");
    assert!(!body.to_string().contains(&s.data.path().display().to_string()), "no path on the wire: {body}");
    let (status, body) = ready(&s).await;
    assert_eq!((status, body["status"].as_str(), body["checks"]["disk"].as_str()), (503, Some("not_ready"), Some("low")), "{body}");
    // Uploads stopped while half the floor was still free: the store's own
    // writes (a submission, its commit log frame, the job's small output
    // and terminal record) still fit, and nothing refuses writes later.
    let job = s.submit(trivial(5)).await;
    let done = s.wait(job["id"].as_str().unwrap()).await;
    assert_eq!(done["status"], "succeeded", "a job runs on the nearly full disk: {done}");
    let (status, body) = s.upload("still-full.bin", noise(2, 50), None).await;
    assert_eq!((status, body["error"]["code"].as_str()), (507, Some("storage_full")), "{body}");
    // The disk filled to within 1 MiB by someone else: a user data file
    // that does not fit is 507 too (the write fails, not a rule of kiln's).
    // (After sled's 200 ms background flush has written the job's records:
    // a write of its own refused would stop it taking writes.)
    tokio::time::sleep(Duration::from_millis(500)).await;
    let ballast = fill_but(fs.path(), 1 << 20);
    let saved = s.http.post(format!("{}/api/userdata/workflows%2Fbig.json", s.server.url())).body(noise(2, 60)).send().await.unwrap();
    let status = saved.status();
    let body: Value = saved.json().await.unwrap_or_default();
    assert_eq!((status.as_u16(), body["error"]["code"].as_str()), (507, Some("storage_full")), "{body}");
    assert!(!body.to_string().contains(&s.data.path().display().to_string()), "no path on the wire: {body}");
    drop(ballast);
    // What was stored before is whole.
    let content = s.http.get(s.url(&format!("/assets/{}/content", stored["id"].as_str().unwrap()))).send().await.unwrap();
    assert_eq!(content.status(), 200);
    assert!(content.bytes().await.unwrap()[..] == first[..], "the first upload reads back as it was");

    fs.remount("size=96m");
    let (status, body) = ready(&s).await;
    assert_eq!((status, body["checks"]["disk"].as_str()), (200, Some("ok")), "{body}");
    let (status, body) = s.upload("after.bin", noise(2, 99), None).await;
    assert_eq!(status, 201, "{body}");
    let job = s.submit(trivial(7)).await;
    assert_eq!(s.wait(job["id"].as_str().unwrap()).await["status"], "succeeded");
}

#[tokio::test]
async fn a_data_directory_on_a_read_only_filesystem_stops_the_start_with_its_reason() {
    if stores_elsewhere() {
        return;
    }
    let Some(fs) = Tmpfs::mount("size=8m,ro") else { return };
    let config = kiln::config::Config { data_dir: fs.path().join("data"), ..super::config(fs.path()) };
    let env = crate::support::env().await;
    let options = kiln::service::ServiceOptions::from_config(&config);
    let started = kiln::server::Server::start_with(config, options, env.runtime.clone(), env.registry.clone()).await;
    let error = format!("{:#}", started.err().expect("no start on a read-only data directory"));
    assert!(error.contains("Read-only file system"), "{error}");
}
