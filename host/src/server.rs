//! `kiln serve` as a library: load plugins, open the job service on the
//! data directory, bind the listener and serve the APIs until shut down.
//! The binary and the end-to-end tests start servers the same way.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;

use crate::api::listener::ConnectionLimits;
use crate::api::{self, AppState};
use crate::config::Config;
use crate::executor::Executor;
use crate::plugins::{NodeRegistry, PluginRuntime};
use crate::service::{Service, ServiceOptions};

/// The configured connection limits, `max_connections` fitted under this
/// process's open-file limit (with a warning when that lowers it).
fn connection_limits(config: &Config) -> ConnectionLimits {
    let limits = ConnectionLimits::from_config(config);
    let Some(open_files) = api::listener::open_file_limit() else { return limits };
    let (fitted, lowered) = limits.within_open_files(open_files);
    if lowered {
        tracing::warn!(
            max_connections = fitted.max_connections,
            configured = limits.max_connections,
            open_files,
            "max_connections lowered to fit the open-file limit (RLIMIT_NOFILE): a descriptor per connection and one for the file it may stream, besides the store's and the plugins'"
        );
    }
    fitted
}

/// A running server.
pub struct Server {
    pub addr: SocketAddr,
    pub state: Arc<AppState>,
    /// The HTTP listener's task (taken by [`Server::shutdown`]).
    task: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

impl Server {
    /// Starts a server with already-loaded plugins.
    /// The listener is bound first: a server that cannot listen must not
    /// start the recovered jobs (each start counts as an attempt).
    pub async fn start_with(config: Config, options: ServiceOptions, runtime: Arc<PluginRuntime>, registry: Arc<NodeRegistry>) -> anyhow::Result<Server> {
        let listener = Server::bind(&config).await?;
        let service = open_service(&config, options, runtime, registry).await?;
        Server::serve(config, service, listener)
    }

    /// Serves an already started service (the signing key still lives in
    /// `config.data_dir`).
    pub async fn start_on(config: Config, service: Arc<Service>) -> anyhow::Result<Server> {
        let listener = Server::bind(&config).await?;
        Server::serve(config, service, listener)
    }

    async fn bind(config: &Config) -> anyhow::Result<tokio::net::TcpListener> {
        check_config(config)?;
        tokio::net::TcpListener::bind((config.host.as_str(), config.port)).await.with_context(|| format!("cannot listen on {}:{}", config.host, config.port))
    }

    fn serve(config: Config, service: Arc<Service>, listener: tokio::net::TcpListener) -> anyhow::Result<Server> {
        let addr = listener.local_addr()?;
        let limits = connection_limits(&config);
        let state = app_state(config, service, addr)?;
        let router = api::router(state.clone());
        let task = tokio::spawn(api::listener::serve(listener, router, limits, state.closing.clone()));
        Ok(Server { addr, state, task: Some(task) })
    }

    /// Loads the configured plugins and starts a server.
    pub async fn start(config: Config) -> anyhow::Result<Server> {
        let (runtime, registry) = crate::embed::load_plugins(&config).await?;
        let options = ServiceOptions::from_config(&config);
        Server::start_with(config, options, runtime, registry).await
    }

    /// The base URL, e.g. `http://127.0.0.1:8188`.
    pub fn url(&self) -> String {
        format!("http://{}{}", self.addr, self.state.config.mount_prefix.trim_end_matches('/'))
    }

    /// Graceful shutdown: stop accepting, end event streams, let requests
    /// finish, then stop the workers (running jobs re-run at the next start).
    pub async fn shutdown(mut self) -> anyhow::Result<()> {
        self.state.closing.cancel();
        if let Some(task) = self.task.take() {
            task.await??;
        }
        self.state.service.shutdown().await;
        Ok(())
    }
}

impl Drop for Server {
    /// A server dropped without [`Server::shutdown`] stops as well, without
    /// waiting: it takes no more connections and its workers end (running
    /// jobs are left to the next start, as after a crash), so nothing it
    /// holds — a database's connections — outlives it.
    fn drop(&mut self) {
        self.state.closing.cancel();
        self.state.service.stop();
    }
}

/// The configuration checks a server makes before it starts.
fn check_config(config: &Config) -> anyhow::Result<()> {
    api::check_mount_prefix(config.mount_prefix.trim()).map_err(anyhow::Error::msg)?;
    config.check_tiers().map_err(anyhow::Error::msg)?;
    config.check_serverless_host().map_err(anyhow::Error::msg)
}

/// Opens the stores and starts the job service on `registry` (plus the
/// plugins installed into this data directory).
async fn open_service(config: &Config, options: ServiceOptions, runtime: Arc<PluginRuntime>, registry: Arc<NodeRegistry>) -> anyhow::Result<Arc<Service>> {
    let executor = Arc::new(Executor::new(runtime.clone(), config.result_cache_mb << 20, config.max_concurrency as usize));
    config.check_store().map_err(anyhow::Error::msg)?;
    let backends = crate::service::Backends::from_config(config).await.with_context(|| format!("opening the {:?} store", config.store))?;
    // Plugins installed through the admin API, on top of those it started
    // with, and (with accounts) each account's own.
    let accounts_dir = config.data_dir.join(crate::plugins::live::ACCOUNT_INSTALLS_DIR);
    let account_plugins = (config.mode.has_accounts() && config.max_plugins_per_account > 0)
        .then_some((accounts_dir.as_path(), crate::plugins::AccountQuota { max_plugins: config.max_plugins_per_account, gpu: config.account_plugin_gpu }));
    let plugins = crate::plugins::LivePlugins::open(runtime, registry, &config.data_dir.join(crate::plugins::live::INSTALLS_DIR), account_plugins).await?;
    Service::start_on(options, backends, plugins, executor).await.with_context(|| format!("opening the data directory {}", config.data_dir.display()))
}

/// The APIs' shared state for `service`, answering as `local` when a
/// request names no host.
fn app_state(config: Config, service: Arc<Service>, local: SocketAddr) -> anyhow::Result<Arc<AppState>> {
    let signer = api::signing::Signer::new(service.signing_key());
    let frontend = config.front_end_root.as_deref().map(api::compat::Frontend::load).transpose()?;
    Ok(AppState::new(service, config, signer, local, frontend))
}

/// kiln's HTTP surfaces for an application that serves them itself: the
/// Jobs API, the ComfyUI API and `/ws`, the admin API, all at their full
/// paths under `mount_prefix` (so the application merges the router beside
/// its own routes and middleware, and links keep the prefix). The
/// application's server owns the connections, so kiln's connection limits
/// and timeouts are its to set.
pub struct Mounted {
    state: Arc<AppState>,
}

impl Mounted {
    /// Loads the configured plugins and starts the job service; `local`
    /// is the address the application serves on (links use it when a
    /// request names no host).
    pub async fn start(config: Config, local: SocketAddr) -> anyhow::Result<Mounted> {
        check_config(&config)?;
        let (runtime, registry) = crate::embed::load_plugins(&config).await?;
        let options = ServiceOptions::from_config(&config);
        let service = open_service(&config, options, runtime, registry).await?;
        Ok(Mounted { state: app_state(config, service, local)? })
    }

    /// The routes, to merge into the application's router.
    pub fn router(&self) -> axum::Router {
        api::router(self.state.clone())
    }

    /// Ends event streams and stops the workers (running jobs re-run at
    /// the next start); the application stops its own server first.
    pub async fn shutdown(self) {
        self.state.closing.cancel();
        self.state.service.shutdown().await;
    }
}
