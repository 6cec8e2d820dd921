//! The `kiln` binary.

use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = kiln::cli::Cli::parse();
    // The compiler child (see `plugins::compile`) needs none of what follows.
    if let kiln::cli::Command::CompileComponent(args) = &cli.command {
        return std::process::ExitCode::from(kiln::cli::compile_component(args));
    }
    // Nor does the GPU probe child (see `gpu::Gpu::start`).
    if let kiln::cli::Command::ProbeGpu = &cli.command {
        println!("{}", kiln::gpu::probe_report());
        return std::process::ExitCode::SUCCESS;
    }
    kiln::memory::tune_allocator();
    let config = match kiln::cli::load_config(&cli) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("error: {e:#}");
            return std::process::ExitCode::FAILURE;
        }
    };
    // The server logs a line per job (id, status, times) by default; the
    // one-shot commands only warnings. `KILN_LOG` overrides either
    // (EnvFilter syntax); `log_format` picks text or JSON lines. Lines are
    // written in batches by a thread of their own (`kiln::logging`);
    // `flush` writes the rest at exit.
    let default = if matches!(cli.command, kiln::cli::Command::Serve(_)) { "info" } else { "warn" };
    let (writer, flush) = match kiln::logging::BatchedWriter::new(std::io::stderr()) {
        Ok(pair) => pair,
        Err(e) => {
            eprintln!("error: cannot start the log writer: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let lines = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("KILN_LOG").unwrap_or_else(|_| default.into()))
        .with_writer(writer);
    match config.log_format {
        kiln::logging::LogFormat::Text => lines.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())).init(),
        kiln::logging::LogFormat::Json => lines.json().with_current_span(true).with_span_list(true).flatten_event(true).init(),
    }
    let runtime = match kiln::cli::runtime(&cli, &config) {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let outcome = runtime.block_on(kiln::cli::main(cli, config));
    // The log lines still buffered go out before the final error line.
    drop(runtime);
    drop(flush);
    match outcome {
        Ok(code) => std::process::ExitCode::from(code.clamp(0, 255) as u8),
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
