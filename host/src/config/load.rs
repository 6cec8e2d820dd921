//! Loading the configuration: built-in defaults, then the TOML file, then
//! `KILN_*` environment variables (command-line flags are applied by the
//! CLI on top). The file and the variables are merged as one TOML table
//! before it is deserialized, so both are checked the same way.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::Config;

/// Why the configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("invalid config: {0}")]
    Parse(#[from] toml::de::Error),
    #[error("invalid value for {var}: {value:?}")]
    Env { var: String, value: String },
}

impl Config {
    /// Defaults, then `file`, then `KILN_*` environment variables.
    pub fn load(file: Option<&Path>) -> Result<Config, ConfigError> {
        let mut table = match file {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })?;
                toml::from_str::<toml::Table>(&text)?
            }
            None => toml::Table::new(),
        };
        apply_env(&mut table, std::env::vars())?;
        Ok(Config::deserialize(toml::Value::Table(table))?)
    }
}

/// The settings a `KILN_<FIELD>` variable may set.
const ENV_FIELDS: &[&str] = &[
    "plugin_dirs",
    "secret_plugins",
    "cache_dir",
    "max_concurrency",
    "node_memory_mb",
    "max_node_memory_mb",
    "node_timeout_ms",
    "max_node_timeout_ms",
    "node_tensor_budget_mb",
    "node_file_budget_mb",
    "node_log_kb",
    "result_cache_mb",
    "decommit_batch",
    "node_keep_resident_kb",
    "compile_timeout_s",
    "compile_memory_mb",
    "guest_perf_map",
    "max_workflow_nodes",
    "max_workflow_kb",
    "max_workflow_values",
    "intake_memory_mb",
    "queued_parsed_mb",
    "job_memory_mb",
    "node_max_files",
    "job_max_files",
    "job_output_mb",
    "http_threads",
    "log_format",
    "host",
    "port",
    "data_dir",
    "token",
    "mount_prefix",
    "max_queued_jobs",
    "ready_min_free_mb",
    "durability",
    "max_queued_jobs_per_account",
    "max_running_jobs",
    "job_retention_s",
    "sweep_interval_s",
    "max_upload_mb",
    "max_plugin_mb",
    "max_bundle_mb",
    "max_plugins_per_account",
    "max_account_plugin_mb",
    "account_plugin_gpu",
    "max_event_streams",
    "max_event_streams_per_account",
    "download_redirect",
    "signed_url_ttl_s",
    "session_ttl_s",
    "sse_keepalive_s",
    "trust_forwarded_headers",
    "serverless_host",
    "store",
    "database_url",
    "database_max_connections",
    "blob_store",
    "s3_endpoint",
    "s3_bucket",
    "s3_region",
    "blob_cache_mb",
    "host_id",
    "lease_s",
    "heartbeat_s",
    "front_end_root",
    "max_userdata_file_kb",
    "max_userdata_mb",
    "max_userdata_files",
    "max_settings_kb",
    "http_header_timeout_s",
    "http_idle_timeout_s",
    "http_body_timeout_s",
    "max_connections",
    "max_connections_per_ip",
    "mode",
    "admin_token",
    "credits_per_second",
    "credits_min_per_job",
    "default_tier",
    "job_log_kb",
    "partner_base_url",
    "partner_api_key",
    "partner_tokens",
    "partner_download_hosts",
    "outbound_connect_timeout_ms",
    "outbound_first_byte_timeout_ms",
    "outbound_max_response_mb",
    "route_max_body_mb",
    "route_timeout_ms",
    "gpu",
    "gpu_max_buffer_mb",
    "gpu_max_workgroups",
    "gpu_max_invocations",
    "gpu_loop_budget",
    "gpu_max_dispatch_iterations",
    "gpu_max_source_kb",
    "gpu_min_auto_elements",
    "gpu_pool_mb",
];

/// Overlays `KILN_<FIELD>` variables on `table` (lists are `:`-separated).
fn apply_env(table: &mut toml::Table, vars: impl Iterator<Item = (String, String)>) -> Result<(), ConfigError> {
    for (var, value) in vars {
        let Some(field) = var.strip_prefix("KILN_").map(str::to_ascii_lowercase) else { continue };
        if !ENV_FIELDS.contains(&field.as_str()) {
            continue;
        }
        let parsed = match field.as_str() {
            "plugin_dirs" | "secret_plugins" => toml::Value::Array(value.split(':').filter(|s| !s.is_empty()).map(|s| toml::Value::String(s.into())).collect()),
            "partner_tokens" | "partner_download_hosts" => {
                toml::Value::Array(value.split(',').map(str::trim).filter(|s| !s.is_empty()).map(|s| toml::Value::String(s.into())).collect())
            }
            "partner_base_url" | "partner_api_key" => toml::Value::String(value),
            "cache_dir" | "host" | "data_dir" | "token" | "mount_prefix" | "front_end_root" | "mode" | "admin_token" | "default_tier" | "gpu"
            | "serverless_host" | "store" | "database_url" | "blob_store" | "s3_endpoint" | "s3_bucket" | "s3_region" | "host_id" | "log_format"
            | "durability" => toml::Value::String(value),
            "download_redirect" | "trust_forwarded_headers" | "guest_perf_map" => match value.as_str() {
                "1" | "true" => toml::Value::Boolean(true),
                "0" | "false" => toml::Value::Boolean(false),
                _ => return Err(ConfigError::Env { var: var.clone(), value: value.clone() }),
            },
            _ => toml::Value::Integer(value.parse().map_err(|_| ConfigError::Env { var: var.clone(), value: value.clone() })?),
        };
        table.insert(field, parsed);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::TierConfig;
    use crate::gpu::GpuMode;

    #[test]
    fn durability_is_power_loss_unless_told() {
        use crate::store::Durability;
        assert_eq!(Config::default().durability, Durability::PowerLoss);
        assert_eq!(from_env(&[("KILN_DURABILITY", "os_crash")]).unwrap().durability, Durability::OsCrash);
        assert_eq!(from_env(&[("KILN_DURABILITY", "power_loss")]).unwrap().durability, Durability::PowerLoss);
        assert!(from_env(&[("KILN_DURABILITY", "none")]).is_err());
    }

    #[test]
    fn log_format_is_text_or_json() {
        assert_eq!(Config::default().log_format, crate::logging::LogFormat::Text);
        assert_eq!(from_env(&[("KILN_LOG_FORMAT", "json")]).unwrap().log_format, crate::logging::LogFormat::Json);
        assert!(from_env(&[("KILN_LOG_FORMAT", "xml")]).is_err());
    }

    fn from_env(vars: &[(&str, &str)]) -> Result<Config, toml::de::Error> {
        let mut table = toml::Table::new();
        apply_env(&mut table, vars.iter().map(|(k, v)| (k.to_string(), v.to_string()))).unwrap();
        Config::deserialize(toml::Value::Table(table))
    }

    #[test]
    fn tiers_come_from_the_file_and_default_tier_must_name_one() {
        let table = toml::from_str::<toml::Table>(
            "default_tier = \"free\"\n[tiers.free]\nmax_running = 1\nmax_queued = 20\n[tiers.pro]\nmax_running = 0\nmax_queued = 5\n",
        )
        .unwrap();
        let config = Config::deserialize(toml::Value::Table(table)).unwrap();
        assert!(config.check_tiers().is_ok());
        assert_eq!(config.tiers["free"], TierConfig { max_running: 1, max_queued: 20 });
        assert_eq!(config.tiers["pro"], TierConfig { max_running: 0, max_queued: 5 });
        let unknown = Config { default_tier: Some("gold".into()), ..config.clone() };
        assert!(unknown.check_tiers().unwrap_err().contains("gold"));
        let bad = toml::from_str::<toml::Table>("[tiers.free]\nmax_running = 1\n").unwrap();
        assert!(Config::deserialize(toml::Value::Table(bad)).is_err(), "both limits are required");
    }

    #[test]
    fn file_then_env_override_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kiln.toml");
        std::fs::write(&path, "node_timeout_ms = 5000\nresult_cache_mb = 7\n").unwrap();
        let mut table = toml::from_str::<toml::Table>(&std::fs::read_to_string(&path).unwrap()).unwrap();
        apply_env(&mut table, [("KILN_NODE_TIMEOUT_MS".to_string(), "250".to_string()), ("KILN_PLUGIN_DIRS".into(), "/a:/b".into())].into_iter()).unwrap();
        let config = Config::deserialize(toml::Value::Table(table)).unwrap();
        assert_eq!(config.node_timeout_ms, 250);
        assert_eq!(config.result_cache_mb, 7);
        assert_eq!(config.plugin_dirs, vec![PathBuf::from("/a"), PathBuf::from("/b")]);
        assert_eq!(config.node_memory_mb, Config::default().node_memory_mb);
    }

    #[test]
    fn per_account_shares_default_to_a_quarter_and_come_from_the_environment() {
        let defaults = Config::default();
        assert_eq!((defaults.queued_jobs_per_account(), defaults.event_streams_per_account()), (250, 2500));
        let tiny = Config { max_queued_jobs: 2, max_event_streams: 0, ..Config::default() };
        assert_eq!((tiny.queued_jobs_per_account(), tiny.event_streams_per_account()), (1, 1), "never 0");
        let config = from_env(&[("KILN_MAX_QUEUED_JOBS_PER_ACCOUNT", "40"), ("KILN_MAX_EVENT_STREAMS_PER_ACCOUNT", "7")]).unwrap();
        assert_eq!((config.queued_jobs_per_account(), config.event_streams_per_account()), (40, 7));
    }

    #[test]
    fn the_store_and_its_database_come_from_the_environment_and_are_checked() {
        use crate::config::StoreKind;
        assert_eq!(Config::default().store, StoreKind::Embedded);
        assert!(Config::default().check_store().is_ok());
        let config = from_env(&[("KILN_STORE", "postgres"), ("KILN_DATABASE_URL", "postgres://kiln@db:5432/kiln")]).unwrap();
        assert_eq!((config.store, config.database_url.as_deref()), (StoreKind::Postgres, Some("postgres://kiln@db:5432/kiln")));
        assert!(config.check_store().is_ok());
        assert!(from_env(&[("KILN_STORE", "postgres")]).unwrap().check_store().is_err(), "no URL");
        assert!(from_env(&[("KILN_STORE", "postgres"), ("KILN_DATABASE_URL", "mysql://x")]).unwrap().check_store().is_err());
        assert!(from_env(&[("KILN_STORE", "oracle")]).is_err());
        assert_eq!(Config::default().database_max_connections, 16);
        let pool = [("KILN_STORE", "postgres"), ("KILN_DATABASE_URL", "postgres://kiln@db/kiln"), ("KILN_DATABASE_MAX_CONNECTIONS", "4")];
        assert_eq!(from_env(&pool).unwrap().database_max_connections, 4);
        let none = [("KILN_STORE", "postgres"), ("KILN_DATABASE_URL", "postgres://kiln@db/kiln"), ("KILN_DATABASE_MAX_CONNECTIONS", "1")];
        assert!(from_env(&none).unwrap().check_store().is_err(), "one connection listens for the other hosts: two at least");
    }

    #[test]
    fn a_hosts_id_lease_and_heartbeat_come_from_the_environment_and_are_checked() {
        let defaults = Config::default();
        assert_eq!((defaults.host_id.as_deref(), defaults.lease_s, defaults.heartbeat_s), (None, 30, 10));
        assert_ne!(defaults.host_id(), defaults.host_id(), "a random id per start");
        let config = from_env(&[("KILN_HOST_ID", "web-1"), ("KILN_LEASE_S", "6"), ("KILN_HEARTBEAT_S", "2")]).unwrap();
        assert_eq!((config.host_id().as_str(), config.lease_s, config.heartbeat_s), ("web-1", 6, 2));
        assert!(config.check_store().is_ok());
        for bad in [
            vec![("KILN_HOST_ID", "a b")],
            vec![("KILN_HOST_ID", "")],
            vec![("KILN_LEASE_S", "10"), ("KILN_HEARTBEAT_S", "6")],
            vec![("KILN_HEARTBEAT_S", "0")],
        ] {
            assert!(from_env(&bad).unwrap().check_store().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_blob_store_and_its_bucket_come_from_the_environment_and_are_checked() {
        use crate::config::BlobStoreKind;
        let defaults = Config::default();
        assert_eq!((defaults.blob_store, defaults.s3_region.as_str(), defaults.blob_cache_mb), (BlobStoreKind::Fs, "us-east-1", 10240));
        let s3 = [("KILN_BLOB_STORE", "s3"), ("KILN_S3_BUCKET", "kiln-blobs"), ("KILN_S3_ENDPOINT", "http://127.0.0.1:8333"), ("KILN_BLOB_CACHE_MB", "64")];
        let config = from_env(&s3).unwrap();
        assert_eq!(
            (config.blob_store, config.s3_bucket.as_deref(), config.s3_endpoint.as_deref()),
            (BlobStoreKind::S3, Some("kiln-blobs"), Some("http://127.0.0.1:8333"))
        );
        assert_eq!(config.blob_cache_mb, 64);
        assert!(config.check_store().is_ok());
        assert_eq!(from_env(&[("KILN_S3_REGION", "eu-central-1")]).unwrap().s3_region, "eu-central-1");
        assert!(from_env(&[("KILN_BLOB_STORE", "s3")]).unwrap().check_store().unwrap_err().contains("s3_bucket"), "no bucket");
        for bad in ["Kiln", "ab", "-kiln", "kiln_blobs", "kiln-"] {
            assert!(from_env(&[("KILN_BLOB_STORE", "s3"), ("KILN_S3_BUCKET", bad)]).unwrap().check_store().is_err(), "{bad}");
        }
        let no_scheme = [("KILN_BLOB_STORE", "s3"), ("KILN_S3_BUCKET", "kiln"), ("KILN_S3_ENDPOINT", "127.0.0.1:8333")];
        assert!(from_env(&no_scheme).unwrap().check_store().unwrap_err().contains("http"));
        assert!(from_env(&[("KILN_BLOB_STORE", "gcs")]).is_err());
    }

    #[test]
    fn the_serverless_host_comes_from_the_environment_and_is_checked() {
        let config = from_env(&[("KILN_SERVERLESS_HOST", "run.example.com")]).unwrap();
        assert_eq!(config.serverless_host.as_deref(), Some("run.example.com"));
        assert!(config.check_serverless_host().is_ok());
        assert_eq!(Config::default().serverless_host, None);
        for bad in ["", ".run.example.com", "run example.com", "run/x"] {
            let config = from_env(&[("KILN_SERVERLESS_HOST", bad)]).unwrap();
            assert!(config.check_serverless_host().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn gpu_mode_comes_from_kiln_gpu() {
        assert_eq!(from_env(&[("KILN_GPU", "required")]).unwrap().gpu, GpuMode::Required);
        assert_eq!(from_env(&[("KILN_GPU", "off")]).unwrap().gpu, GpuMode::Off);
        assert!(from_env(&[("KILN_GPU", "fast")]).is_err(), "only auto, off, required");
        assert_eq!(Config::default().gpu, GpuMode::Auto);
    }

    #[test]
    fn secret_plugins_are_colon_separated_and_compiler_exe_is_not_a_setting() {
        let config = from_env(&[("KILN_SECRET_PLUGINS", "/srv/partner:./other")]).unwrap();
        assert_eq!(config.secret_plugins, ["/srv/partner", "./other"]);
        // Not settable from a file: only the binary names itself.
        assert!(toml::from_str::<Config>("compiler_exe = '/bin/sh'").is_err());
    }

    #[test]
    fn partner_settings_come_from_the_environment() {
        let config = from_env(&[
            ("KILN_PARTNER_BASE_URL", "http://127.0.0.1:9999/"),
            ("KILN_PARTNER_API_KEY", "pk"),
            ("KILN_PARTNER_TOKENS", "t1, t2"),
            ("KILN_PARTNER_DOWNLOAD_HOSTS", "cdn.example.com,10.0.0.5:8080"),
        ])
        .unwrap();
        assert_eq!(config.partner_base_url.as_deref(), Some("http://127.0.0.1:9999/"));
        assert_eq!(config.partner_api_key.as_deref(), Some("pk"));
        assert_eq!(config.partner_tokens, ["t1", "t2"]);
        assert_eq!(config.partner_download_hosts, ["cdn.example.com", "10.0.0.5:8080"]);
    }

    #[test]
    fn plugin_network_grants_are_read_from_the_file() {
        let text = "[[plugin_network]]\nplugin = \"/x\"\noutbound_hosts = [\"api.example.com\"]\nroutes = true\nenv = { K = \"v\" }\n";
        let config: Config = toml::from_str(text).unwrap();
        let entry = &config.plugin_network[0];
        assert_eq!((entry.plugin.as_str(), entry.outbound_hosts.as_slice(), entry.routes), ("/x", ["api.example.com".to_string()].as_slice(), true));
        assert_eq!(entry.env["K"], "v");
        assert!(toml::from_str::<Config>("[[plugin_network]]\nplugin = \"/x\"\nsurprise = 1\n").is_err());
    }

    #[test]
    fn rejects_unknown_fields_and_bad_env() {
        assert!(toml::from_str::<Config>("surprise = 1").is_err());
        let mut table = toml::Table::new();
        assert!(apply_env(&mut table, [("KILN_NODE_LOG_KB".to_string(), "lots".to_string())].into_iter()).is_err());
    }
}
