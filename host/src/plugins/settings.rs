//! The plugin runtime's settings ([`RuntimeConfig`]) built from kiln's
//! configuration: per-node limits, the compiler's limits, the operator's
//! secret and network grants, outbound ceilings, and the GPU.
//!
//! `secret_plugins` entries that do not name a directory or a hash, bad
//! network grants, and `gpu = "required"` without an adapter are refused
//! here, when the runtime is built.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::OperatorLimits;
use super::compile::CompileConfig;
use super::identity::{GrantError, PluginGrant};
use super::network::{HostPattern, NetGrant, OutboundLimits};
use crate::config::Config;
use crate::gpu::{Gpu, GpuLimits, GpuStartError};

/// Settings of the plugin runtime (a slice of the service config).
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// Node calls that may run at once (sizes the instance pool).
    pub max_concurrency: u32,
    /// Defaults and ceilings for memory and time per node call.
    pub limits: OperatorLimits,
    /// Ceiling on the bytes of tensors one node call creates.
    pub tensor_budget_bytes: u64,
    /// Ceiling on the bytes of files one node call saves.
    pub file_budget_bytes: u64,
    /// Ceiling on the number of files one node call saves.
    pub max_files: u64,
    /// Ceiling on the captured log of one node call.
    pub log_bytes: usize,
    /// Where compiled components are cached (`None`: compile on every load).
    pub artifact_dir: Option<PathBuf>,
    /// Instance memories released per decommit batch (see `engine`).
    pub decommit_batch: usize,
    /// Linear memory an instance slot keeps resident, reset in place (see `engine`).
    pub keep_resident_bytes: usize,
    /// List JIT code in `/tmp/perf-<pid>.map` for `perf` (profiling).
    pub perf_map: bool,
    /// Plugins (by directory or component hash, see `identity`) that may
    /// read the secrets their manifests ask for; any other plugin asking
    /// for one is refused.
    pub secret_plugins: Vec<PluginGrant>,
    /// How components are compiled (in a child process under limits, or here).
    pub compile: CompileConfig,
    // Plugin network capabilities.
    /// What the operator grants plugins: outbound hosts, routes, configuration.
    pub net_grants: Vec<NetGrant>,
    /// Ceilings on every outbound request of a plugin.
    pub outbound: OutboundLimits,
    /// Largest response a plugin's route may give.
    pub route_response_bytes: usize,
    /// Most time a route call may take (the plugin's own limit if lower).
    pub route_timeout: Duration,
    /// The host's GPU, when there is one and it is not turned off.
    pub gpu: Option<Arc<crate::gpu::Gpu>>,
}

/// Why the configuration does not make a plugin runtime.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("invalid secret_plugins entry: {0}")]
    SecretPlugins(#[from] GrantError),
    #[error("invalid {field}: {reason}")]
    Network { field: &'static str, reason: String },
    #[error(transparent)]
    Gpu(#[from] GpuStartError),
}

impl RuntimeConfig {
    /// The plugin runtime's slice of `config`; refuses `secret_plugins`
    /// entries that do not name a directory or a hash, and `gpu =
    /// "required"` without an adapter (that GPU is opened here, once per
    /// process; `auto` looks for one only when a node would use it).
    pub fn from_config(config: &Config) -> Result<RuntimeConfig, SettingsError> {
        let mb = |v: u64| v.saturating_mul(1 << 20);
        Ok(RuntimeConfig {
            max_concurrency: config.max_concurrency.max(1),
            limits: OperatorLimits {
                default_memory_bytes: mb(config.node_memory_mb).min(mb(config.max_node_memory_mb)),
                max_memory_bytes: mb(config.max_node_memory_mb).min(4 << 30),
                default_timeout: Duration::from_millis(config.node_timeout_ms.min(config.max_node_timeout_ms)),
                max_timeout: Duration::from_millis(config.max_node_timeout_ms),
            },
            tensor_budget_bytes: mb(config.node_tensor_budget_mb),
            file_budget_bytes: mb(config.node_file_budget_mb),
            max_files: config.node_max_files,
            log_bytes: (config.node_log_kb as usize).saturating_mul(1024),
            artifact_dir: config.artifact_dir(),
            decommit_batch: config.decommit_batch,
            keep_resident_bytes: usize::try_from(config.node_keep_resident_kb.saturating_mul(1024)).unwrap_or(usize::MAX),
            perf_map: config.guest_perf_map,
            // The bundled partner plugin reads the partner key.
            secret_plugins: PluginGrant::parse_all(&config.secret_plugins)?.into_iter().chain([PluginGrant::Bundled("partner".into())]).collect(),
            compile: CompileConfig {
                exe: config.compiler_exe.clone(),
                timeout: Duration::from_secs(config.compile_timeout_s.max(1)),
                memory_bytes: mb(config.compile_memory_mb.max(1)),
            },
            net_grants: net_grants(config)?,
            outbound: OutboundLimits {
                connect_timeout: Duration::from_millis(config.outbound_connect_timeout_ms.max(1)),
                first_byte_timeout: Duration::from_millis(config.outbound_first_byte_timeout_ms.max(1)),
                max_response_bytes: mb(config.outbound_max_response_mb),
            },
            route_response_bytes: config.route_body_bytes(),
            route_timeout: Duration::from_millis(config.route_timeout_ms.max(1)),
            gpu: Gpu::start(config.gpu, gpu_limits(config), config.compiler_exe.as_deref())?,
        })
    }
}

impl RuntimeConfig {
    /// [`RuntimeConfig::from_config`], granting the plugin in `dir` all it
    /// may ask for (secrets, routes; no outbound host): `kiln plugin check`
    /// judges the plugin, not an operator's policy.
    pub fn granting_dir(config: &Config, dir: &std::path::Path) -> Result<RuntimeConfig, SettingsError> {
        let mut runtime = RuntimeConfig::from_config(config)?;
        let grant = || PluginGrant::Dir(dir.to_path_buf());
        runtime.secret_plugins.push(grant());
        runtime.net_grants.push(NetGrant { plugin: grant(), outbound_hosts: Vec::new(), routes: true, env: Vec::new() });
        Ok(runtime)
    }
}

/// The bounds on GPU kernels.
fn gpu_limits(config: &Config) -> GpuLimits {
    GpuLimits {
        max_buffer_bytes: config.gpu_max_buffer_mb.saturating_mul(1 << 20).max(1 << 20),
        max_workgroups_per_dim: config.gpu_max_workgroups.max(1),
        max_invocations: config.gpu_max_invocations.max(1),
        loop_budget: config.gpu_loop_budget.max(1),
        max_dispatch_iterations: config.gpu_max_dispatch_iterations.max(1),
        max_source_bytes: config.gpu_max_source_kb.saturating_mul(1024),
        min_auto_elements: config.gpu_min_auto_elements,
        max_idle_bytes: config.gpu_pool_mb.saturating_mul(1 << 20),
        ..GpuLimits::default()
    }
}

/// The operator's network grants: `plugin_network`, and the bundled
/// partner plugin's (its provider's host and port, the download hosts,
/// its routes, and the partner settings as its configuration).
fn net_grants(config: &Config) -> Result<Vec<NetGrant>, SettingsError> {
    let hosts = |field: &'static str, list: &[String]| {
        list.iter().map(|h| HostPattern::parse(h).map_err(|reason| SettingsError::Network { field, reason })).collect::<Result<Vec<_>, _>>()
    };
    let mut grants = Vec::new();
    for entry in &config.plugin_network {
        grants.push(NetGrant {
            plugin: PluginGrant::parse(&entry.plugin)?,
            outbound_hosts: hosts("plugin_network.outbound_hosts", &entry.outbound_hosts)?,
            routes: entry.routes,
            env: entry.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        });
    }
    let mut partner_hosts = hosts("partner_download_hosts", &config.partner_download_hosts)?;
    let mut env = vec![("KILN_PARTNER_TOKENS".to_string(), config.partner_tokens.join(","))];
    if let Some(url) = config.partner_base_url.as_deref().map(str::trim).filter(|u| !u.is_empty()) {
        partner_hosts.push(base_url_host(url)?);
        env.push(("KILN_PARTNER_BASE_URL".into(), url.trim_end_matches('/').to_string()));
    }
    if let Some(key) = &config.partner_api_key {
        env.push(("KILN_PARTNER_API_KEY".into(), key.clone()));
    }
    grants.push(NetGrant { plugin: PluginGrant::Bundled("partner".into()), outbound_hosts: partner_hosts, routes: true, env });
    Ok(grants)
}

/// The `host:port` of a provider base URL (`http(s)://host[:port][/path]`).
fn base_url_host(url: &str) -> Result<HostPattern, SettingsError> {
    let bad = |reason: &str| SettingsError::Network { field: "partner_base_url", reason: format!("{url:?} {reason}") };
    let uri: http::Uri = url.parse().map_err(|_| bad("is not a URL"))?;
    let port = match uri.scheme_str() {
        Some("http") => uri.port_u16().unwrap_or(80),
        Some("https") => uri.port_u16().unwrap_or(443),
        _ => return Err(bad("must start with http:// or https://")),
    };
    if uri.query().is_some() {
        return Err(bad("must not have a query"));
    }
    let host = uri.host().ok_or_else(|| bad("has no host"))?;
    let host = if host.contains(':') && !host.starts_with('[') { format!("[{host}]") } else { host.to_string() };
    HostPattern::parse(&format!("{host}:{port}")).map_err(|reason| SettingsError::Network { field: "partner_base_url", reason })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_limits_come_from_the_config() {
        let config = Config { node_timeout_ms: 250, ..Config::default() };
        assert_eq!(RuntimeConfig::from_config(&config).unwrap().limits.default_timeout, Duration::from_millis(250));
    }

    #[test]
    fn gpu_off_opens_no_device() {
        let config = Config { gpu: crate::gpu::GpuMode::Off, ..Config::default() };
        assert!(RuntimeConfig::from_config(&config).unwrap().gpu.is_none(), "off opens no device");
    }

    #[test]
    fn secret_plugins_name_directories_or_hashes() {
        let dir = tempfile::tempdir().unwrap();
        let hash = format!("blake3:{}", blake3::hash(b"wasm").to_hex());
        let config = Config { secret_plugins: vec![dir.path().display().to_string(), hash], ..Config::default() };
        assert_eq!(RuntimeConfig::from_config(&config).unwrap().secret_plugins.len(), 3, "the two, and the bundled partner plugin");
        let old_style = Config { secret_plugins: vec!["partner".into()], ..Config::default() };
        let err = RuntimeConfig::from_config(&old_style).unwrap_err().to_string();
        assert!(err.contains("secret_plugins") && err.contains("`partner` looks like a plugin name") && err.contains("blake3:"), "{err}");
    }

    #[test]
    fn partner_settings_become_the_partner_plugins_grant() {
        let config = Config {
            partner_base_url: Some("http://127.0.0.1:9999/".into()),
            partner_api_key: Some("pk".into()),
            partner_tokens: vec!["t1".into(), "t2".into()],
            partner_download_hosts: vec!["cdn.example.com".into(), "10.0.0.5:8080".into()],
            ..Config::default()
        };
        let grants = RuntimeConfig::from_config(&config).unwrap().net_grants;
        let partner = grants.iter().find(|g| g.plugin == PluginGrant::Bundled("partner".into())).unwrap();
        let hosts: Vec<String> = partner.outbound_hosts.iter().map(|h| h.to_string()).collect();
        assert_eq!(hosts, ["cdn.example.com", "10.0.0.5:8080", "127.0.0.1:9999"]);
        assert!(partner.routes);
        assert!(partner.env.contains(&("KILN_PARTNER_TOKENS".into(), "t1,t2".into())));
        assert!(partner.env.contains(&("KILN_PARTNER_BASE_URL".into(), "http://127.0.0.1:9999".into())));
        assert!(partner.env.contains(&("KILN_PARTNER_API_KEY".into(), "pk".into())));
        assert_eq!(base_url_host("https://api.freepik.com").unwrap().to_string(), "api.freepik.com:443");
        for bad in ["ftp://x", "x.com", "http://x.com/?a=1"] {
            assert!(base_url_host(bad).is_err(), "{bad}");
        }
        let unset = RuntimeConfig::from_config(&Config::default()).unwrap().net_grants;
        let partner = unset.iter().find(|g| g.plugin == PluginGrant::Bundled("partner".into())).unwrap();
        assert!(partner.outbound_hosts.is_empty(), "no base URL: no host");
    }

    #[test]
    fn plugin_network_grants_name_plugins_by_directory_or_hash() {
        let dir = tempfile::tempdir().unwrap();
        let text = format!(
            "[[plugin_network]]\nplugin = \"{}\"\noutbound_hosts = [\"api.example.com\", \"10.0.0.7:8080\"]\nroutes = true\nenv = {{ K = \"v\" }}\n",
            dir.path().display()
        );
        let config: Config = toml::from_str(&text).unwrap();
        let grants = RuntimeConfig::from_config(&config).unwrap().net_grants;
        let grant = grants.iter().find(|g| matches!(g.plugin, PluginGrant::Dir(_))).unwrap();
        assert_eq!(grant.outbound_hosts.iter().map(|h| h.to_string()).collect::<Vec<_>>(), ["api.example.com", "10.0.0.7:8080"]);
        assert!(grant.routes);
        assert_eq!(grant.env, [("K".to_string(), "v".to_string())]);
        let by_name: Config = toml::from_str("[[plugin_network]]\nplugin = \"myplugin\"\n").unwrap();
        assert!(RuntimeConfig::from_config(&by_name).is_err(), "a bare name is refused");
        let bad_host: Config =
            toml::from_str(&format!("[[plugin_network]]\nplugin = \"{}\"\noutbound_hosts = [\"http://x\"]\n", dir.path().display())).unwrap();
        assert!(RuntimeConfig::from_config(&bad_host).unwrap_err().to_string().contains("plugin_network.outbound_hosts"));
    }
}
