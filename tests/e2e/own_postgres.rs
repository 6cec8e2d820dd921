//! A PostgreSQL server of one test's own, for tests that stop and start
//! it. Shared by the test targets that need one (included by path: it uses
//! only `std` and `tempfile`).

/// A PostgreSQL server of one test's own (from the server binaries in
/// `KILN_TEST_PG_BIN`, which `.ci/run` sets), so it can be stopped and
/// started without disturbing the other tests. As root, it runs as
/// `postgres` (PostgreSQL refuses root).
pub struct OwnPostgres {
    bin: std::path::PathBuf,
    dir: tempfile::TempDir,
    port: u16,
    as_postgres: bool,
    /// Server options beyond the address (TLS).
    extra: String,
}

impl OwnPostgres {
    /// A new cluster, started; `None` (skipped) without `KILN_TEST_PG_BIN`
    /// outside CI.
    pub fn start_new() -> Option<OwnPostgres> {
        let Some(bin) = std::env::var_os("KILN_TEST_PG_BIN") else {
            assert!(std::env::var_os("CI").is_none(), "CI must set KILN_TEST_PG_BIN (.ci/run finds PostgreSQL's server binaries)");
            eprintln!("SKIPPED: KILN_TEST_PG_BIN is not set");
            return None;
        };
        let uid = std::process::Command::new("id").arg("-u").output().unwrap();
        let as_postgres = String::from_utf8_lossy(&uid.stdout).trim() == "0";
        let dir = tempfile::tempdir().unwrap();
        if as_postgres {
            assert!(std::process::Command::new("chown").arg("postgres").arg(dir.path()).status().unwrap().success());
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let pg = OwnPostgres { bin: bin.into(), dir, port, as_postgres, extra: String::new() };
        let data = pg.dir.path().join("data");
        pg.run("initdb", &["-D", data.to_str().unwrap(), "--auth=trust", "-U", "postgres", "--no-sync"]);
        pg.start();
        Some(pg)
    }

    /// A new cluster that takes TCP connections over TLS only (`hostssl`),
    /// its certificate for 127.0.0.1 issued by a CA of its own (made with
    /// `openssl`, with another CA beside it: `other.crt`); the cluster and
    /// the CA certificate's path.
    pub fn start_new_tls() -> Option<(OwnPostgres, std::path::PathBuf)> {
        let mut pg = OwnPostgres::start_new()?;
        pg.stop();
        let dir = pg.dir.path().to_path_buf();
        let openssl = |args: &[&str]| {
            let out = std::process::Command::new("openssl").args(args).current_dir(&dir).output().expect("openssl runs (.ci/run installs it)");
            assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        };
        openssl(&["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=kiln test CA"]);
        openssl(&["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "other.key", "-out", "other.crt", "-days", "2", "-subj", "/CN=another CA"]);
        openssl(&["req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1"]);
        std::fs::write(dir.join("san.ext"), "subjectAltName=IP:127.0.0.1\n").unwrap();
        openssl(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "2",
            "-extfile",
            "san.ext",
        ]);
        let key = dir.join("server.key");
        std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        if pg.as_postgres {
            assert!(std::process::Command::new("chown").arg("postgres").arg(&key).arg(dir.join("server.crt")).status().unwrap().success());
        }
        std::fs::write(dir.join("data/pg_hba.conf"), "local all all trust\nhostssl all all 127.0.0.1/32 trust\n").unwrap();
        pg.extra = format!("-c ssl=on -c ssl_cert_file={} -c ssl_key_file={}", dir.join("server.crt").display(), key.display());
        pg.start();
        Some((pg, dir.join("ca.crt")))
    }

    fn run(&self, tool: &str, args: &[&str]) {
        let exe = self.bin.join(tool);
        let mut cmd = if self.as_postgres {
            let mut c = std::process::Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(exe);
            c
        } else {
            std::process::Command::new(exe)
        };
        let out = cmd.args(args).output().unwrap();
        assert!(out.status.success(), "{tool} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }

    fn ctl(&self, action: &str) {
        let (data, dir) = (self.dir.path().join("data"), self.dir.path().to_str().unwrap().to_string());
        let options = format!("-c listen_addresses=127.0.0.1 -p {} -k {dir} -c fsync=off {}", self.port, self.extra);
        let log = self.dir.path().join("log");
        self.run("pg_ctl", &["-D", data.to_str().unwrap(), "-l", log.to_str().unwrap(), "-o", &options, "-m", "fast", "-w", action]);
    }

    pub fn start(&self) {
        self.ctl("start");
    }

    pub fn stop(&self) {
        self.ctl("stop");
    }

    /// The cluster's directory (its data, log and any certificates).
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for OwnPostgres {
    fn drop(&mut self) {
        let data = self.dir.path().join("data");
        let exe = self.bin.join("pg_ctl");
        let args = ["-D", data.to_str().unwrap_or_default(), "-m", "immediate", "stop"];
        let _ = if self.as_postgres {
            std::process::Command::new("runuser").args(["-u", "postgres", "--"]).arg(exe).args(args).output()
        } else {
            std::process::Command::new(exe).args(args).output()
        };
    }
}
