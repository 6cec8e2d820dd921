//! Compiling components, bounded in time and memory.
//!
//! Cranelift cannot be interrupted while it compiles, and a component can be
//! crafted to compile slowly or to make the compiler allocate without end:
//! compiled inside kiln, it would stall start-up or take the host's memory.
//! So the `kiln` binary compiles in a child process of its own,
//! `kiln compile-component --in FILE --out FILE`, which builds an engine
//! with the same compilation settings ([`super::engine::compile_engine`];
//! the artifact records them and loading checks them) and writes
//! `Engine::precompile_component`'s output. The parent caps the child's
//! address space (`RLIMIT_AS`) and CPU time (`RLIMIT_CPU`), kills it past a
//! wall-clock timeout, and deserializes what it wrote (see `artifacts`).
//!
//! Linked as a library (the test suites), the current executable has no such
//! subcommand, so [`CompileConfig::exe`] is `None` and compilation happens in
//! this process, without these limits.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use wasmtime::Engine;

/// The hidden subcommand the child runs.
pub const SUBCOMMAND: &str = "compile-component";

/// Exit code of the child when the compiler refused the component (its
/// message is on stderr); any other failure is the child's own.
pub const EXIT_REFUSED: u8 = 3;

/// Most of the child's stderr kept for an error message.
const STDERR_TAIL: u64 = 4096;

/// How components are compiled.
#[derive(Debug, Clone)]
pub struct CompileConfig {
    /// The executable to run as `<exe> compile-component`; `None` compiles
    /// in this process, unbounded.
    pub exe: Option<PathBuf>,
    /// Wall-clock limit of one compilation (`compile_timeout_s`).
    pub timeout: Duration,
    /// Address-space limit of the child (`compile_memory_mb`).
    pub memory_bytes: u64,
}

/// Why a component could not be compiled or loaded.
#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    #[error("not a valid component: {0}")]
    Invalid(String),
    #[error("compiling it took longer than compile_timeout_s = {} s; the compiler was stopped", .0.as_secs())]
    TimedOut(Duration),
    #[error("compiling it used more CPU time than compile_timeout_s = {} s allows (RLIMIT_CPU); the compiler was stopped", .0.as_secs())]
    CpuTime(Duration),
    #[error("compiling it needed more memory than compile_memory_mb = {} allows (RLIMIT_AS); the compiler was stopped", .0 >> 20)]
    OutOfMemory(u64),
    #[error("the compiler process failed ({status}) under compile_memory_mb = {}: {detail}", .memory_bytes >> 20)]
    Died { status: String, memory_bytes: u64, detail: String },
    #[error("cannot run the compiler {}: {source}", .exe.display())]
    Spawn { exe: PathBuf, source: std::io::Error },
    #[error("compiler scratch files: {0}")]
    Scratch(std::io::Error),
    #[error("the compiled component cannot be loaded: {0}")]
    Unloadable(String),
}

impl CompileConfig {
    /// Compiles `wasm` for `engine`: in a child process under the limits
    /// when there is an executable, else here. Scratch files go into a
    /// fresh owner-only directory under `scratch_in` (or the system's
    /// temporary directory), removed afterwards.
    pub fn precompile(&self, engine: &Engine, wasm: &[u8], scratch_in: Option<&Path>) -> Result<Vec<u8>, CompileError> {
        match &self.exe {
            None => engine.precompile_component(wasm).map_err(|e| CompileError::Invalid(format!("{e:#}"))),
            Some(exe) => {
                let scratch = Scratch::new(scratch_in.map_or_else(std::env::temp_dir, Path::to_path_buf)).map_err(CompileError::Scratch)?;
                self.in_child(exe, wasm, &scratch.0)
            }
        }
    }

    fn in_child(&self, exe: &Path, wasm: &[u8], scratch: &Path) -> Result<Vec<u8>, CompileError> {
        let (input, output, errors) = (scratch.join("in.wasm"), scratch.join("out.cwasm"), scratch.join("stderr"));
        std::fs::write(&input, wasm).map_err(CompileError::Scratch)?;
        let stderr = std::fs::File::options().create_new(true).read(true).write(true).open(&errors).map_err(CompileError::Scratch)?;
        let mut command = Command::new(exe);
        command.arg(SUBCOMMAND).arg("--in").arg(&input).arg("--out").arg(&output);
        command.stdin(Stdio::null()).stdout(Stdio::null()).stderr(stderr.try_clone().map_err(CompileError::Scratch)?);
        // Compilation runs on every CPU, so CPU time may run ahead of the
        // wall clock by that factor; this is the backstop should the parent
        // die before its timeout fires.
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
        let cpu_seconds = self.timeout.as_secs().max(1).saturating_mul(cpus).saturating_add(1);
        limit_child(&mut command, self.memory_bytes, cpu_seconds);
        let mut child = command.spawn().map_err(|source| CompileError::Spawn { exe: exe.to_path_buf(), source })?;
        let deadline = Instant::now() + self.timeout;
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() >= deadline => {
                    // Kill, then reap: no zombie is left behind.
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(CompileError::TimedOut(self.timeout));
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(10)),
                Err(e) => return Err(CompileError::Spawn { exe: exe.to_path_buf(), source: e }),
            }
        };
        if status.success() {
            return std::fs::read(&output).map_err(CompileError::Scratch);
        }
        let detail = tail(stderr);
        Err(self.classify(status, detail))
    }

    /// Names the limit a failed child most likely hit.
    fn classify(&self, status: ExitStatus, detail: String) -> CompileError {
        use std::os::unix::process::ExitStatusExt;
        if status.code() == Some(i32::from(EXIT_REFUSED)) {
            return CompileError::Invalid(detail);
        }
        if status.signal() == Some(libc::SIGXCPU) {
            return CompileError::CpuTime(self.timeout);
        }
        // Under RLIMIT_AS an allocation fails: Rust aborts with this line,
        // a failed mmap reports ENOMEM.
        if detail.contains("memory allocation of") || detail.contains("Cannot allocate memory") || detail.contains("out of memory") {
            return CompileError::OutOfMemory(self.memory_bytes);
        }
        let status = match (status.code(), status.signal()) {
            (Some(code), _) => format!("exit code {code}"),
            (None, Some(signal)) => format!("signal {signal}"),
            _ => status.to_string(),
        };
        CompileError::Died { status, memory_bytes: self.memory_bytes, detail }
    }
}

/// Sets the child's resource limits and ties its life to this thread's.
#[cfg(target_os = "linux")]
fn limit_child(command: &mut Command, memory_bytes: u64, cpu_seconds: u64) {
    use std::os::unix::process::CommandExt;
    let memory = libc::rlimit { rlim_cur: memory_bytes, rlim_max: memory_bytes };
    // SIGXCPU at the soft limit (reported as such), SIGKILL a second later.
    let cpu = libc::rlimit { rlim_cur: cpu_seconds, rlim_max: cpu_seconds.saturating_add(1) };
    // A child stopped by a limit dumps no core (of up to compile_memory_mb).
    let no_core = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: runs in the forked child before exec; it only makes system
    // calls (async-signal-safe), allocates nothing and touches no lock. The
    // rlimit values were built before the fork.
    unsafe {
        command.pre_exec(move || {
            if libc::setrlimit(libc::RLIMIT_AS, &memory) != 0
                || libc::setrlimit(libc::RLIMIT_CPU, &cpu) != 0
                || libc::setrlimit(libc::RLIMIT_CORE, &no_core) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            // Killed should this thread (waiting on it) die first.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
fn limit_child(_command: &mut Command, _memory_bytes: u64, _cpu_seconds: u64) {
    // Only the wall-clock timeout applies.
}

/// The end of what the child wrote to stderr, trimmed.
fn tail(mut file: std::fs::File) -> String {
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let mut text = String::new();
    if file.seek(SeekFrom::Start(len.saturating_sub(STDERR_TAIL))).is_ok() {
        let mut bytes = Vec::new();
        let _ = file.read_to_end(&mut bytes);
        text = String::from_utf8_lossy(&bytes).trim().to_string();
    }
    if text.is_empty() { "no output".into() } else { text }
}

/// A fresh directory only this user can enter, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(parent: PathBuf) -> std::io::Result<Scratch> {
        use std::os::unix::fs::DirBuilderExt;
        let dir = parent.join(format!(".kiln-compile-{}", uuid::Uuid::new_v4()));
        // `create`, not `create_all`: fails if anything is already there.
        std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
        Ok(Scratch(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The child's side (`kiln compile-component`): compiles `input` with the
/// engine's compilation settings and writes the artifact to `output`. On
/// [`CompileFileError::Refused`] the child exits with [`EXIT_REFUSED`].
pub fn compile_file(input: &Path, output: &Path) -> Result<(), CompileFileError> {
    let wasm = std::fs::read(input).map_err(|e| CompileFileError::Io(format!("reading {}: {e}", input.display())))?;
    let engine = super::engine::compile_engine().map_err(|e| CompileFileError::Io(format!("building the engine: {e:#}")))?;
    let artifact = engine.precompile_component(&wasm).map_err(|e| CompileFileError::Refused(format!("{e:#}")))?;
    std::fs::write(output, artifact).map_err(|e| CompileFileError::Io(format!("writing {}: {e}", output.display())))
}

/// Why `kiln compile-component` failed.
#[derive(Debug, thiserror::Error)]
pub enum CompileFileError {
    /// The compiler refused the component.
    #[error("{0}")]
    Refused(String),
    /// Anything else.
    #[error("{0}")]
    Io(String),
}
