//! `kiln plugins install DIR | list | remove NAME`: the admin API's plugin
//! routes over HTTP, with the operator token (`KILN_ADMIN_TOKEN`). A plugin
//! installs into the running server without a restart (see
//! `plugins::live`); `DIR` is a plugin folder (`kiln plugin build` prints one).

use std::path::PathBuf;

use anyhow::Context;

use super::admin::{AdminClient, AdminTarget};

/// Arguments of `kiln plugins`.
#[derive(Debug, clap::Args)]
pub struct PluginsArgs {
    #[command(flatten)]
    target: AdminTarget,
    #[command(subcommand)]
    action: Action,
}

#[derive(Debug, clap::Subcommand)]
enum Action {
    /// Install (or upgrade: the same name) the plugin folder DIR: its
    /// kiln-plugin.toml and the component it names.
    Install { dir: PathBuf },
    /// List the server's plugins.
    List,
    /// Remove an installed plugin: new jobs no longer see its classes.
    Remove { name: String },
}

/// How long an install may take: the server compiles the component first.
const INSTALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

/// Runs `kiln plugins`; prints the server's answer (JSON).
pub async fn run(config: &crate::config::Config, args: PluginsArgs) -> anyhow::Result<i32> {
    let client = AdminClient::new(&args.target, config)?;
    let answer = match args.action {
        Action::Install { dir } => {
            let manifest_path = dir.join("kiln-plugin.toml");
            let text = std::fs::read_to_string(&manifest_path).with_context(|| format!("reading {}", manifest_path.display()))?;
            let manifest = crate::plugins::Manifest::parse(&text).with_context(|| manifest_path.display().to_string())?;
            let wasm_path = dir.join(&manifest.component);
            let wasm = std::fs::read(&wasm_path).with_context(|| format!("reading {}", wasm_path.display()))?;
            let form = reqwest::multipart::Form::new()
                .text("manifest", text)
                .part("component", reqwest::multipart::Part::bytes(wasm).file_name(manifest.component.clone()));
            client.upload("/plugins", form, INSTALL_TIMEOUT).await?
        }
        Action::List => client.call(reqwest::Method::GET, "/plugins", None).await?,
        Action::Remove { name } => client.call(reqwest::Method::DELETE, &format!("/plugins/{name}"), None).await?,
    };
    if !answer.is_null() {
        println!("{}", serde_json::to_string_pretty(&answer)?);
    }
    Ok(0)
}
