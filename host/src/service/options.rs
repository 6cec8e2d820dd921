//! The service's limits and policies, built from the configuration.

use std::time::Duration;

use super::fair;
use crate::config::Config;

/// The service's limits and policies (from [`Config`]).
#[derive(Debug, Clone)]
pub struct ServiceOptions {
    pub max_queued_jobs: usize,
    pub max_running_jobs: usize,
    pub retention: Duration,
    pub sweep_interval: Duration,
    /// How long a web sign-in session lasts (config `session_ttl_s`).
    pub session_ttl_s: u64,
    pub max_upload_bytes: u64,
    /// Largest bundle, decompressed (`max_bundle_mb`).
    pub max_bundle_bytes: u64,
    /// Largest component the operator installs, a bundle's included
    /// (`max_plugin_mb`).
    pub max_plugin_bytes: u64,
    pub max_event_streams: usize,
    /// With accounts: the most jobs one scheduling key may have waiting,
    /// whatever its tier (config `max_queued_jobs_per_account`).
    pub max_queued_per_account: usize,
    /// With accounts: the most streams one owner may hold open (config
    /// `max_event_streams_per_account`).
    pub max_streams_per_account: usize,
    pub owner: String,
    /// Bounds on a submitted workflow.
    pub workflow_limits: crate::workflow::WorkflowLimits,
    /// What each job may consume while it runs.
    pub job_limits: crate::budget::JobLimits,
    /// Whether `GET /jobs/{id}` shows the job's captured log. The spec gives
    /// `logs` to serverless jobs only: on in serverless mode; other modes
    /// capture and store them all the same and leave them out of reads
    /// (except a deployment's jobs: [`Service::shows_logs`]).
    pub logs_on_read: bool,
    /// The deployment kind: with accounts, each job's owner is
    /// an account, charged when its job ends; the result cache is per owner.
    pub mode: crate::config::Mode,
    /// What a job costs its account.
    pub pricing: crate::accounts::Pricing,
    /// Named tiers and the default tier (see `fair`).
    pub tiers: fair::Tiers,
    /// The tail of a job's stdout + stderr kept as its log, bytes.
    pub job_log_bytes: usize,
    /// Memory submissions being parsed and uploads being decoded may hold
    /// at once, bytes (`intake_memory_mb`).
    pub intake_memory_bytes: u64,
    /// Memory queued jobs may hold as parsed workflows, bytes (`queued_parsed_mb`).
    pub queued_parsed_bytes: u64,
    /// A host's lease on its jobs and how often it renews it, where hosts
    /// share the store (`lease_s`, `heartbeat_s`; see `cluster`).
    pub lease: Duration,
    pub heartbeat: Duration,
    /// The data directory, and the free space on its filesystem below which
    /// the host is not ready (`ready_min_free_mb`; 0: not checked); uploads
    /// and outputs stop at half of it.
    pub disk_floor: crate::store::space::DiskFloor,
}

impl ServiceOptions {
    /// The limits of a key with no tier of its own: the default tier, else
    /// the global ones.
    pub fn global_limits(&self) -> fair::OwnerLimits {
        self.tiers.resolve(None, fair::OwnerLimits { max_running: self.max_running_jobs, max_queued: self.max_queued_jobs })
    }

    pub fn from_config(config: &Config) -> ServiceOptions {
        ServiceOptions {
            max_queued_jobs: config.max_queued_jobs,
            max_running_jobs: config.max_running_jobs.max(1),
            retention: Duration::from_secs(config.job_retention_s.max(1)),
            sweep_interval: Duration::from_secs(config.sweep_interval_s.max(1)),
            session_ttl_s: config.session_ttl_s.max(1),
            max_upload_bytes: config.max_upload_mb.saturating_mul(1 << 20),
            max_bundle_bytes: config.max_bundle_mb.saturating_mul(1 << 20),
            max_plugin_bytes: config.max_plugin_mb.saturating_mul(1 << 20),
            max_event_streams: config.max_event_streams,
            max_queued_per_account: config.queued_jobs_per_account(),
            max_streams_per_account: config.event_streams_per_account(),
            owner: "local".into(),
            workflow_limits: crate::workflow::WorkflowLimits::from_config(config),
            job_limits: crate::budget::JobLimits::from_config(config),
            logs_on_read: config.mode == crate::config::Mode::Serverless,
            mode: config.mode,
            pricing: crate::accounts::Pricing { credits_per_second: config.credits_per_second, min_per_job: config.credits_min_per_job },
            tiers: fair::Tiers::from_config(config),
            job_log_bytes: (config.job_log_kb as usize).saturating_mul(1024),
            intake_memory_bytes: config.intake_memory_mb.saturating_mul(1 << 20),
            queued_parsed_bytes: config.queued_parsed_mb.saturating_mul(1 << 20),
            lease: Duration::from_secs(config.lease_s.max(2)),
            heartbeat: Duration::from_secs(config.heartbeat_s.max(1)),
            disk_floor: crate::store::space::DiskFloor { dir: config.data_dir.clone(), min_free: config.ready_min_free_mb.saturating_mul(1 << 20) },
        }
    }
}
