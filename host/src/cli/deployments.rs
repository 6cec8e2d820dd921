//! `kiln deployments create|stop|start|list`: the admin API's deployment
//! routes over HTTP, with the operator token (`KILN_ADMIN_TOKEN`, or
//! `admin_token` in the config file).

use std::path::PathBuf;

use anyhow::Context;

/// Arguments of `kiln deployments`.
#[derive(Debug, clap::Args)]
pub struct DeploymentsArgs {
    /// The server (with its mount prefix, if any).
    #[arg(long, env = "KILN_URL", default_value = "http://127.0.0.1:8188")]
    pub url: String,
    #[command(subcommand)]
    pub action: Action,
}

/// What to do.
#[derive(Debug, clap::Subcommand)]
pub enum Action {
    /// Create a deployment; its plugins load in the background.
    Create {
        /// Its id: 1-63 of a-z 0-9 - (the `/deployment/{id}` segment and the `{id}.{serverless_host}` label).
        id: String,
        /// The account that owns it.
        #[arg(long)]
        owner: String,
        /// A plugin directory on the server to load for it (repeatable).
        #[arg(long = "plugin-dir")]
        plugin_dirs: Vec<PathBuf>,
        /// A bundle (`kiln pack`), sent to the server: the deployment runs
        /// exactly its components.
        #[arg(long, value_name = "FILE", conflicts_with = "plugin_dirs")]
        bundle: Option<PathBuf>,
        /// Callers need no credentials (one shared demo identity; logs withheld).
        #[arg(long)]
        public_demo: bool,
        /// Jobs of it running at once (with --max-queued).
        #[arg(long, requires = "max_queued")]
        max_running: Option<usize>,
        /// Jobs of it waiting at once (with --max-running).
        #[arg(long, requires = "max_running")]
        max_queued: Option<usize>,
    },
    /// Stop a deployment (its requests get 422 deployment_stopped).
    Stop { id: String },
    /// Start a stopped deployment again.
    Start { id: String },
    /// List the deployments.
    List,
}

/// Runs `kiln deployments`; prints the server's answer (JSON). Exit code 0
/// on success, 1 when the server refused.
pub async fn run(config: &crate::config::Config, args: DeploymentsArgs) -> anyhow::Result<i32> {
    let token = config.admin_token.as_deref().filter(|t| !t.is_empty()).context("set KILN_ADMIN_TOKEN (or admin_token in the config file)")?;
    let base = format!("{}/admin/deployments", args.url.trim_end_matches('/'));
    let http = reqwest::Client::new();
    let request = match args.action {
        Action::Create { id, owner, plugin_dirs, bundle, public_demo, max_running, max_queued } => {
            let limits = max_running.zip(max_queued).map(|(r, q)| serde_json::json!({ "max_running": r, "max_queued": q }));
            let body = serde_json::json!({ "id": id, "owner": owner, "plugin_dirs": plugin_dirs, "public_demo": public_demo, "limits": limits });
            match bundle {
                None => http.post(&base).json(&body),
                Some(path) => {
                    let bytes = tokio::fs::read(&path).await.with_context(|| format!("reading {}", path.display()))?;
                    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "bundle.kiln".into());
                    let form = reqwest::multipart::Form::new()
                        .part("deployment", reqwest::multipart::Part::text(body.to_string()).mime_str("application/json")?)
                        .part("bundle", reqwest::multipart::Part::bytes(bytes).file_name(name).mime_str("application/gzip")?);
                    http.post(&base).multipart(form)
                }
            }
        }
        Action::Stop { id } => http.post(format!("{base}/{id}/stop")),
        Action::Start { id } => http.post(format!("{base}/{id}/start")),
        Action::List => http.get(&base),
    };
    let response = request.bearer_auth(token).send().await.with_context(|| format!("cannot reach {}", args.url))?;
    let status = response.status();
    let body: serde_json::Value = response.json().await.with_context(|| format!("{} answered {status} without JSON", args.url))?;
    if status.is_success() {
        println!("{}", serde_json::to_string_pretty(&body)?);
        Ok(0)
    } else {
        let message = body["error"]["message"].as_str().unwrap_or("refused");
        eprintln!("error: {status}: {message}");
        Ok(1)
    }
}
