//! Helpers shared by the binary's process-level suites (each suite uses
//! some of them).
#![allow(dead_code)]

pub mod cdylib;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// A valid component that Cranelift takes long to compile: one function
/// whose `locals` i64 locals are all live around a loop of `ops` additions
/// (5000 and 50 000: ~50 s on one core here; 0.5 MB of wasm).
pub fn slow_to_compile(locals: u32, ops: u32) -> Vec<u8> {
    use wasm_encoder::{
        BlockType, CodeSection, Component, ExportKind, ExportSection, Function, FunctionSection, Instruction, Module, ModuleSection, TypeSection, ValType,
    };
    let mut module = Module::new();
    let mut types = TypeSection::new();
    types.ty().function([], []);
    module.section(&types);
    let mut funcs = FunctionSection::new();
    funcs.function(0);
    module.section(&funcs);
    let mut exports = ExportSection::new();
    exports.export("f", ExportKind::Func, 0);
    module.section(&exports);
    let mut body = Function::new([(locals, ValType::I64)]);
    body.instruction(&Instruction::Loop(BlockType::Empty));
    for i in 0..ops {
        body.instruction(&Instruction::LocalGet(i.wrapping_mul(7919) % locals));
        body.instruction(&Instruction::LocalGet((i.wrapping_mul(104_729) + 1) % locals));
        body.instruction(&Instruction::I64Add);
        body.instruction(&Instruction::LocalSet(i % locals));
    }
    body.instruction(&Instruction::LocalGet(0));
    body.instruction(&Instruction::I64Eqz);
    body.instruction(&Instruction::BrIf(0));
    body.instruction(&Instruction::End);
    body.instruction(&Instruction::End);
    let mut code = CodeSection::new();
    code.function(&body);
    module.section(&code);
    let mut component = Component::new();
    component.section(&ModuleSection(&module));
    component.finish()
}

/// A running `kiln serve`.
pub struct Kiln {
    pub child: Child,
    pub base: String,
}

pub fn spawn(data: &Path, extra_env: &[(&str, &str)], args: &[&str]) -> Kiln {
    spawn_with(data, extra_env, args, Stdio::inherit())
}

pub fn spawn_with(data: &Path, extra_env: &[(&str, &str)], args: &[&str], stderr: Stdio) -> Kiln {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kiln"));
    cmd.args(["serve", "--port", "0", "--data-dir"])
        .arg(data)
        .args(args)
        .env("KILN_CACHE_DIR", Path::new(env!("CARGO_TARGET_TMPDIR")).join("kiln-artifacts"))
        .envs(store_of_the_run(data))
        .stdout(Stdio::piped())
        .stderr(stderr);
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("kiln serve starts");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let base = line.trim().strip_prefix("kiln listening on ").unwrap_or_else(|| panic!("unexpected first line {line:?}")).to_string();
    Kiln { child, base }
}

/// The settings of the run's stores for a server on `data`: with
/// `KILN_TEST_STORE=postgres` its records in a database of its own on the
/// PostgreSQL test server (`KILN_TEST_DATABASE_URL`), with
/// `KILN_TEST_BLOB_STORE=s3` its blobs in a bucket of its own on
/// `KILN_TEST_S3_ENDPOINT`; each remembered in the data directory, with a
/// host id, so a restart on it finds them again and takes its jobs back.
/// Nothing (the embedded stores) otherwise.
pub fn store_of_the_run(data: &Path) -> Vec<(&'static str, String)> {
    let remembered = |file: &str, make: &dyn Fn() -> String| {
        let path = data.join(file);
        std::fs::read_to_string(&path).unwrap_or_else(|_| {
            let value = make();
            std::fs::create_dir_all(data).unwrap();
            std::fs::write(&path, &value).unwrap();
            value
        })
    };
    let mut env = Vec::new();
    if std::env::var("KILN_TEST_STORE").as_deref() == Ok("postgres") {
        let server = std::env::var("KILN_TEST_DATABASE_URL").expect("KILN_TEST_STORE=postgres needs KILN_TEST_DATABASE_URL");
        let url = remembered("test-database-url", &|| fresh_database(&server));
        env.extend([("KILN_STORE", "postgres".to_string()), ("KILN_DATABASE_URL", url)]);
        env.push(("KILN_HOST_ID", remembered("test-host-id", &|| format!("serve-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]))));
    }
    if std::env::var("KILN_TEST_BLOB_STORE").as_deref() == Ok("s3") {
        let endpoint = std::env::var("KILN_TEST_S3_ENDPOINT").expect("KILN_TEST_BLOB_STORE=s3 needs KILN_TEST_S3_ENDPOINT");
        let bucket = remembered("test-bucket", &|| format!("kiln-serve-{}", uuid::Uuid::new_v4().simple()));
        env.extend([("KILN_BLOB_STORE", "s3".to_string()), ("KILN_S3_ENDPOINT", endpoint), ("KILN_S3_BUCKET", bucket)]);
    }
    env
}

/// A new database on the PostgreSQL server at `server`: its URL.
fn fresh_database(server: &str) -> String {
    let name = format!("kiln_serve_{}", uuid::Uuid::new_v4().simple());
    let (server, create) = (server.to_string(), format!("CREATE DATABASE {name}"));
    // Callers may be on a runtime already: the database is made on a
    // thread and runtime of its own.
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let admin = sqlx::PgPool::connect(&server).await.unwrap();
            sqlx::query(&create).execute(&admin).await.unwrap();
            admin.close().await;
        })
    })
    .join()
    .unwrap();
    let server = std::env::var("KILN_TEST_DATABASE_URL").unwrap_or_default();
    format!("{}/{name}", server.rsplit_once('/').map_or(server.as_str(), |(base, _)| base))
}

impl Drop for Kiln {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A new account `name` holding `credits`, made through the admin API of
/// the server at `base` with the operator token `token` (201 expected):
/// the answer (`account`, `key`).
pub async fn new_account(http: &reqwest::Client, base: &str, token: &str, name: &str, credits: i64) -> serde_json::Value {
    let resp =
        http.post(format!("{base}/admin/accounts")).bearer_auth(token).json(&serde_json::json!({ "name": name, "credits": credits })).send().await.unwrap();
    let status = resp.status();
    let made: serde_json::Value = resp.json().await.unwrap_or_default();
    assert_eq!(status, 201, "{made}");
    made
}
