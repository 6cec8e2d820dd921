//! The `kiln` binary.

use clap::Parser;

fn main() -> std::process::ExitCode {
    kiln::memory::tune_allocator();
    let cli = kiln::cli::Cli::parse();
    // The server logs each job (ids, status) by default; the one-shot
    // commands only warnings. `KILN_LOG` overrides either (EnvFilter syntax).
    // Lines are written by a logging thread, so a slow terminal or pipe
    // never holds up a request or a job (lines are dropped, not waited
    // for, if it falls far behind); `_flush` writes the rest at exit.
    let default = if matches!(cli.command, kiln::cli::Command::Serve(_)) { "info" } else { "warn" };
    let (writer, _flush) = tracing_appender::non_blocking(std::io::stderr());
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("KILN_LOG").unwrap_or_else(|_| default.into()))
        .with_writer(writer)
        .init();
    let config = match kiln::cli::load_config(&cli) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("error: {e:#}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let runtime = match kiln::cli::runtime(&cli, &config) {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(kiln::cli::main(cli, config)) {
        Ok(code) => std::process::ExitCode::from(code.clamp(0, 255) as u8),
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
