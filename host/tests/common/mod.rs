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
