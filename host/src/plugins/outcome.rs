//! What loading a plugin or calling a node ends with: a node's outputs, a
//! node failure and its kind (each kind its own job error code), a load
//! error.

use std::path::PathBuf;

use super::compile::CompileError;
use super::log_pipe::CapturedLog;
use crate::files::SavedFile;
use crate::value::Value;

/// How a node call failed. Each kind maps to its own error code on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    /// The node ran past its wall-clock limit.
    Timeout,
    /// The node wanted more memory than its ceiling.
    OutOfMemory,
    /// The job's memory bound (`job_memory_mb`) refused the node: the job
    /// as a whole holds too much, whichever node asked last.
    JobOutOfMemory,
    /// The guest trapped or panicked.
    Crashed,
    /// The node returned outputs that do not match its definition, or
    /// exceeded its output budget.
    InvalidOutput,
    /// The node reported an error about its inputs or its work.
    Failed,
    /// The call was cancelled.
    Interrupted,
    /// A partner service refused for lack of credits (`host.insufficient-funds`).
    InsufficientFunds,
}

/// A failed node call.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{kind:?}: {message}")]
pub struct NodeFailure {
    pub kind: FailureKind,
    pub message: String,
    /// What the plugin printed before failing (its tail, when long).
    pub log: CapturedLog,
}

/// A successful node call.
#[derive(Debug, Clone)]
pub struct NodeOutput {
    /// One value per declared output.
    pub values: Vec<Value>,
    /// Files the node saved.
    pub saved: Vec<SavedFile>,
    /// What the plugin printed (its tail, when long).
    pub log: CapturedLog,
    /// Whether any of the node's work ran on the GPU.
    pub on_gpu: bool,
}

/// Why a plugin could not be loaded. `plugin` names it by manifest name and
/// identity (`name (/its/directory)`), or by directory before its manifest
/// is read.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("plugin `{plugin}`: {source}")]
    Manifest { plugin: String, source: super::manifest::ManifestError },
    #[error("plugin `{plugin}`: cannot read {path}: {source}")]
    Io { plugin: String, path: PathBuf, source: std::io::Error },
    #[error("plugin `{plugin}`: {reason}")]
    Component { plugin: String, reason: CompileError },
    #[error("plugin `{plugin}` is not a valid component: {message}")]
    Compile { plugin: String, message: String },
    #[error(
        "plugin `{plugin}` asks for secret `{secret}`, which the operator has not granted it; \
         to grant it, add its directory or \"{hash_grant}\" to secret_plugins"
    )]
    SecretNotGranted { plugin: String, secret: String, hash_grant: String },
    #[error(
        "plugin `{plugin}` asks for {capability}, which the operator has not granted it; \
         to grant it, add a [[plugin_network]] entry naming its directory or \"{hash_grant}\" (with the hosts it may reach, routes = true for routes)"
    )]
    NetworkNotGranted { plugin: String, capability: String, hash_grant: String },
    #[error("plugin `{plugin}` declares routes but does not export wasi:http/incoming-handler: {message}")]
    NoHttpHandler { plugin: String, message: String },
    #[error("plugin `{plugin}` {refusal}")]
    Import { plugin: String, refusal: super::manifest::ImportError },
    #[error("plugin `{plugin}` failed to describe its nodes: {failure}")]
    Definitions { plugin: String, failure: NodeFailure },
    #[error("plugin `{plugin}` failed to describe its nodes' extras: {failure}")]
    Meta { plugin: String, failure: NodeFailure },
    #[error("plugin `{plugin}` defines an invalid node: {reason}")]
    InvalidDefinition { plugin: String, reason: String },
}
