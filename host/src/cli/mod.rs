//! The `kiln` command line: argument parsing and the subcommands.

mod accounts;
pub mod admin;
mod bundle;
mod db;
mod deployments;
mod front_end;
mod migrate;
mod plugin;
mod plugins;
mod run;
mod serve;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// kiln: run ComfyUI workflows whose nodes are sandboxed WebAssembly components.
#[derive(Debug, Parser)]
#[command(name = "kiln", version, about)]
pub struct Cli {
    /// Config file (TOML); `KILN_*` environment variables override it.
    #[arg(long, global = true, env = "KILN_CONFIG")]
    pub config: Option<PathBuf>,
    /// Extra plugin directory (repeatable).
    #[arg(long = "plugins", global = true)]
    pub plugins: Vec<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

/// A kiln subcommand.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a workflow (API format) or a bundle on the embedded engine and print its output files.
    Run(run::RunArgs),
    /// Make a bundle: workflows, the exact plugin components they use, default inputs.
    Pack(bundle::PackArgs),
    /// Check a bundle and print what it holds (JSON).
    Inspect(bundle::InspectArgs),
    /// Check a bundle and write its files into a directory.
    Unpack(bundle::UnpackArgs),
    /// Print the node definitions as ComfyUI `object_info` JSON.
    Nodes,
    /// Print what kiln will use, one line each: the GPU adapter, the plugin
    /// cache, the data directory, the record store and the blob store (a
    /// database or bucket checked to answer; exit 1 when one does not).
    Doctor,
    /// Serve the Jobs API (`/api/v2`) until interrupted.
    Serve(serve::ServeArgs),
    /// Manage the accounts of a cloud or serverless server (admin API).
    Accounts(accounts::AccountsArgs),
    /// Manage serverless deployments through a server's admin API.
    Deployments(deployments::DeploymentsArgs),
    /// The PostgreSQL database of `store = "postgres"`: `kiln db migrate`.
    Db(db::DbArgs),
    /// Copy an embedded data directory into the database (and bucket) hosts
    /// share: `kiln migrate --to postgres` (resumable; each kind checked).
    Migrate(migrate::MigrateArgs),
    /// Write, build and check node plugins: `kiln plugin new | build | check`.
    Plugin(plugin::PluginArgs),
    /// Install, list and remove plugins of a running server (admin API).
    Plugins(plugins::PluginsArgs),
    /// Compile one component (kiln runs itself so to compile plugins under
    /// limits; see `plugins::compile`).
    #[command(name = "compile-component", hide = true)]
    CompileComponent(CompileArgs),
    /// Print the GPU adapter `gpu = "auto"` would use (kiln runs itself so,
    /// to keep a software driver out of the server; see `gpu::Gpu::start`).
    #[command(name = "probe-gpu", hide = true)]
    ProbeGpu,
}

/// Arguments of the hidden `kiln compile-component`.
#[derive(Debug, clap::Args)]
pub struct CompileArgs {
    /// The component (.wasm).
    #[arg(long = "in", value_name = "FILE")]
    pub input: PathBuf,
    /// Where the compiled artifact goes.
    #[arg(long = "out", value_name = "FILE")]
    pub output: PathBuf,
}

/// `kiln compile-component`: needs no configuration, logging or async
/// runtime. Returns the exit code: 0 compiled,
/// [`EXIT_REFUSED`](crate::plugins::compile::EXIT_REFUSED) the compiler
/// refused the component (message on stderr), 1 anything else.
pub fn compile_component(args: &CompileArgs) -> u8 {
    use crate::plugins::compile::{CompileFileError, EXIT_REFUSED, compile_file};
    match compile_file(&args.input, &args.output) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("{e}");
            if matches!(e, CompileFileError::Refused(_)) { EXIT_REFUSED } else { 1 }
        }
    }
}

/// The configuration the command line names: its config file, then
/// `KILN_*` variables, then `--plugins`. Plugins are compiled by this
/// executable's `compile-component`, under the configured limits.
pub fn load_config(cli: &Cli) -> anyhow::Result<crate::config::Config> {
    let mut config = crate::config::Config::load(cli.config.as_deref())?;
    config.plugin_dirs.extend(cli.plugins.iter().cloned());
    config.compiler_exe = Some(std::env::current_exe().map_err(|e| anyhow::anyhow!("cannot find the kiln executable to compile plugins with: {e}"))?);
    Ok(config)
}

/// The async runtime a command runs on: `kiln serve` answers HTTP on
/// `http_threads` threads (its jobs run on threads of their own, see
/// `service`); the one-shot commands run their nodes on every CPU.
pub fn runtime(cli: &Cli, config: &crate::config::Config) -> std::io::Result<tokio::runtime::Runtime> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    if let Command::Serve(_) = cli.command {
        builder.worker_threads(config.http_threads.max(1));
    }
    builder.build()
}

/// Runs the CLI with `config` (see [`load_config`]); returns the process exit code.
pub async fn main(cli: Cli, config: crate::config::Config) -> anyhow::Result<i32> {
    match cli.command {
        Command::Run(args) => run::run(config, args).await,
        Command::Pack(args) => bundle::pack(config, args).await,
        Command::Inspect(args) => bundle::inspect(&config, &args),
        Command::Unpack(args) => bundle::unpack(&config, &args),
        Command::Serve(args) => serve::serve(config, args).await,
        Command::Accounts(args) => accounts::run(config, args).await,
        Command::Deployments(args) => deployments::run(&config, args).await,
        Command::Db(args) => db::run(&config, args).await,
        Command::Migrate(args) => migrate::run(&config, args).await,
        Command::Plugin(args) => plugin::run(&config, args).await,
        Command::Plugins(args) => plugins::run(&config, args).await,
        Command::CompileComponent(args) => Ok(i32::from(compile_component(&args))),
        // (Handled by `main` before any set-up; here for completeness.)
        Command::ProbeGpu => {
            println!("{}", crate::gpu::probe_report());
            Ok(0)
        }
        Command::Doctor => {
            let (backends, answered) = doctor_backends(&config).await;
            for line in doctor(&config).into_iter().chain(backends) {
                println!("{line}");
            }
            Ok(if answered { 0 } else { 1 })
        }
        Command::Nodes => {
            let engine = crate::Engine::new(config).await?;
            let registry = engine.registry();
            let files = crate::files::NamedInputs::new();
            let mut all = serde_json::Map::new();
            for def in registry.definitions() {
                all.insert(def.class_type.clone(), crate::object_info::node_info(def, registry.meta(&def.class_type), &files));
            }
            println!("{}", serde_json::to_string_pretty(&all)?);
            Ok(0)
        }
    }
}

/// `kiln doctor`'s lines on where records and blobs live, each networked
/// backend checked to answer (the bucket is created when missing; the
/// local blob cache, which a running server may be using, is not touched);
/// whether all did.
pub async fn doctor_backends(config: &crate::config::Config) -> (Vec<String>, bool) {
    use crate::config::StoreKind;
    let mut answered = true;
    let store = match (config.store, config.database_url.as_deref()) {
        (StoreKind::Embedded, _) => format!("store: embedded (sled under {})", config.data_dir.join("meta").display()),
        (StoreKind::Postgres, None) => {
            answered = false;
            "store: postgres (no database_url)".to_string()
        }
        (StoreKind::Postgres, Some(url)) => match crate::store::postgres::probe(url).await {
            Ok(applied) => format!("store: postgres at {} (answers; migrations applied: {applied:?})", crate::store::postgres::redacted(url)),
            Err(e) => {
                answered = false;
                format!("store: postgres at {} (does not answer: {e})", crate::store::postgres::redacted(url))
            }
        },
    };
    let blobs = match crate::service::s3_settings(config) {
        None => format!("blobs: files under {}", config.data_dir.join("blobs").display()),
        Some(settings) => match crate::store::s3::S3Blobs::probe(&settings).await {
            Ok(place) => format!("blobs: s3 {place} (answers; local cache up to {} MiB)", config.blob_cache_mb),
            Err(e) => {
                answered = false;
                format!("blobs: s3 bucket `{}` (does not answer: {e})", settings.bucket)
            }
        },
    };
    (vec![store, blobs], answered)
}

/// `kiln doctor`'s lines: the GPU adapter (or `none` and why), the plugin
/// cache, the data directory. Probes the adapter itself, so it answers even
/// where `gpu = "required"` would refuse to start.
pub fn doctor(config: &crate::config::Config) -> Vec<String> {
    use crate::gpu::GpuMode;
    let mode = serde_json::to_value(config.gpu).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default();
    let gpu = match config.gpu {
        GpuMode::Off => "gpu: none (gpu = \"off\")".to_string(),
        _ => match crate::gpu::probe() {
            Ok((_, info)) if info.software && config.gpu == GpuMode::Auto => {
                format!("gpu: {info} (gpu = \"auto\": a software adapter, so nodes compute on the CPU; gpu = \"required\" uses it)")
            }
            Ok((_, info)) => format!("gpu: {info} (gpu = \"{mode}\")"),
            Err(reason) => format!("gpu: none ({reason})"),
        },
    };
    let cache = config.artifact_dir().map_or_else(|| "none (components compile on every start)".to_string(), |d| d.display().to_string());
    vec![gpu, format!("plugin cache: {cache}"), format!("data dir: {}", config.data_dir.display())]
}
