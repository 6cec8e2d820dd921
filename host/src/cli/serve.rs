//! `kiln serve`: the HTTP service on the embedded defaults.

use std::path::PathBuf;

use crate::config::Config;
use crate::server::Server;

/// Arguments of `kiln serve` (each also a config field / `KILN_*` variable).
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Address to listen on [default: 127.0.0.1].
    #[arg(long)]
    pub host: Option<String>,
    /// Port to listen on (0 picks a free one) [default: 8188].
    #[arg(long)]
    pub port: Option<u16>,
    /// Where jobs, assets and blobs are kept [default: ./kiln-data].
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Require `Authorization: Bearer TOKEN` on the Jobs API.
    #[arg(long, env = "KILN_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Deployment kind: self-hosted (open, or one --token), cloud or
    /// serverless (account keys; see OPERATORS.md) [default: self-hosted;
    /// also `mode` / KILN_MODE].
    #[arg(long, value_enum)]
    pub mode: Option<crate::config::Mode>,
    /// Serve the ComfyUI web frontend from DIR at `/` (the `static/`
    /// directory of PyPI's `comfyui-frontend-package`).
    #[arg(long, value_name = "DIR")]
    pub front_end_root: Option<PathBuf>,
    /// Fetch the ComfyUI web frontend from PyPI into the data directory
    /// (once; needs python3 with pip) and serve it at `/`.
    #[arg(long, conflicts_with = "front_end_root")]
    pub fetch_front_end: bool,
}

pub async fn serve(mut config: Config, args: ServeArgs) -> anyhow::Result<i32> {
    if let Some(h) = args.host {
        config.host = h;
    }
    if let Some(p) = args.port {
        config.port = p;
    }
    if let Some(d) = args.data_dir {
        config.data_dir = d;
    }
    if let Some(root) = args.front_end_root {
        config.front_end_root = Some(root);
    }
    if args.token.is_some() {
        config.token = args.token;
    }
    if let Some(mode) = args.mode {
        config.mode = mode;
    }
    if config.mode.has_accounts() && config.token.is_some() {
        tracing::warn!("`token` is not used in cloud and serverless modes: callers use their accounts' keys");
    }
    if config.mode.has_accounts() && config.admin_token.is_none() {
        tracing::warn!("no admin_token: the admin API is off, so no account can be created or changed");
    }
    if args.fetch_front_end {
        let data_dir = config.data_dir.clone();
        let root = tokio::task::spawn_blocking(move || super::front_end::ensure(&data_dir, super::front_end::FRONT_END_VERSION)).await??;
        config.front_end_root = Some(root);
    }
    raise_open_file_limit();
    let server = Server::start(config).await?;
    println!("kiln listening on {}", server.url());
    tracing::info!(addr = %server.addr, "listening");
    let lost = tokio::select! {
        () = shutdown_signal() => false,
        () = server.state.service.lease_lost() => true,
    };
    tracing::info!("shutting down");
    server.shutdown().await?;
    if lost {
        // Another host may run this host's jobs now: this start is over;
        // its supervisor starts it again as a new host.
        tracing::error!("this host lost its lease on its jobs (the database was out of reach for longer than lease_s)");
        return Ok(1);
    }
    Ok(0)
}

/// Raises this process's soft limit on open files to its hard limit: the
/// common soft default (1024) is what a few hundred idle connections and
/// the server's own files exhaust, and `max_connections` is fitted under
/// whatever limit is in force (`Server::start`).
fn raise_open_file_limit() {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes one rlimit to a valid, exclusive pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 || limit.rlim_cur >= limit.rlim_max {
        return;
    }
    let soft = limit.rlim_cur;
    limit.rlim_cur = limit.rlim_max;
    // SAFETY: setrlimit reads one rlimit from a valid pointer; raising the
    // soft limit up to the hard one needs no privilege.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } == 0 {
        tracing::debug!(from = soft, to = limit.rlim_max, "raised the open-file limit (RLIMIT_NOFILE)");
    } else {
        tracing::warn!(soft, hard = limit.rlim_max, error = %std::io::Error::last_os_error(), "could not raise the open-file limit (RLIMIT_NOFILE)");
    }
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => return std::future::pending().await,
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = tokio::signal::ctrl_c().await;
}
