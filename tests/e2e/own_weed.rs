//! An S3-compatible server of one test's own (SeaweedFS's `weed server
//! -s3`, from `KILN_TEST_WEED`, which `.ci/run` sets), for tests that stop
//! and start it. Shared by the test targets that need one (included by
//! path: it uses only `std` and `tempfile`).

/// A `weed server -s3` of one test's own, on free loopback ports.
pub struct OwnWeed {
    exe: std::path::PathBuf,
    pub dir: tempfile::TempDir,
    ports: [u16; 4],
    child: Option<std::process::Child>,
}

/// A loopback port that is free, with the one 10000 above it (weed's gRPC),
/// neither of them one of `taken`'s pairs (nothing listens on those yet).
fn free_port_pair(taken: &[u16]) -> u16 {
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let clashes = taken.iter().any(|&t| t == port || t + 10000 == port || port + 10000 == t);
        if port < 55000 && !clashes && std::net::TcpListener::bind(("127.0.0.1", port + 10000)).is_ok() {
            return port;
        }
    }
}

impl OwnWeed {
    pub fn start_new() -> Option<OwnWeed> {
        // The server takes the credentials kiln's store reads from the
        // standard variables.
        let (Some(exe), Ok(key), Ok(secret)) = (std::env::var_os("KILN_TEST_WEED"), std::env::var("AWS_ACCESS_KEY_ID"), std::env::var("AWS_SECRET_ACCESS_KEY"))
        else {
            assert!(std::env::var_os("CI").is_none(), "CI must set KILN_TEST_WEED and the AWS_* credentials (.ci/run installs SeaweedFS)");
            eprintln!("SKIPPED: KILN_TEST_WEED or AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY is not set");
            return None;
        };
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("data")).unwrap();
        std::fs::write(dir.path().join("master.toml"), "[master.volume_growth]\ncopy_1 = 1\n").unwrap();
        let identities = format!(
            r#"{{"identities":[{{"name":"kiln","credentials":[{{"accessKey":"{}","secretKey":"{}"}}],"actions":["Admin","Read","Write","List","Tagging"]}}]}}"#,
            key, secret
        );
        std::fs::write(dir.path().join("s3.json"), identities).unwrap();
        let mut ports = [0; 4];
        for i in 0..4 {
            ports[i] = free_port_pair(&ports[..i]);
        }
        let mut weed = OwnWeed { exe: exe.into(), dir, ports, child: None };
        weed.start();
        Some(weed)
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.ports[3])
    }

    /// Starts the server on its directory and waits until S3 answers.
    pub fn start(&mut self) {
        let [master, volume, filer, s3] = self.ports;
        let d = self.dir.path();
        let child = std::process::Command::new(&self.exe)
            .current_dir(d)
            .args(["server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-s3", "-s3.port.iceberg=0", "-s3.port.lance=0", "-master.telemetry=false"])
            .arg(format!("-dir={}", d.join("data").display()))
            .arg(format!("-master.port={master}"))
            .arg(format!("-volume.port={volume}"))
            .arg(format!("-filer.port={filer}"))
            .arg(format!("-s3.port={s3}"))
            .arg(format!("-s3.config={}", d.join("s3.json").display()))
            .args(["-master.volumeSizeLimitMB=64", "-volume.max=100"])
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(d.join("log")).unwrap())
            .spawn()
            .expect("weed starts");
        self.child = Some(child);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while std::net::TcpStream::connect(("127.0.0.1", s3)).is_err() {
            assert!(std::time::Instant::now() < deadline, "weed did not answer: {}", std::fs::read_to_string(d.join("log")).unwrap_or_default());
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    }

    /// Stops the server (as a crash would: killed).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for OwnWeed {
    fn drop(&mut self) {
        self.stop();
    }
}
