//! The codes a job failure is known by: [`JobErrorCode`], what `job.error.code`
//! holds (service-interface.md, JobError), with its one wire name and its
//! one ComfyUI `exception_type`. Every surface that shows a failed job —
//! the Jobs API's JobError, the compatibility API's WebSocket
//! `execution_error`, `/api/history` status messages and ComfyUI's
//! `/api/jobs` — names it through these two maps.
//!
//! Also [`code_table!`], which declares a code enum from one table
//! (used here and for `api::error::ApiCode`).
//!
//! **Stored form.** A [`JobErrorCode`] is stored and sent as its snake_case
//! wire name (a JSON string), exactly as the plain strings were before the
//! enum, so existing records load unchanged. The enum has no catch-all
//! variant: a stored name this build does not know (written by a newer
//! build, or edited by hand) loads as [`JobErrorCode::InternalError`] — a
//! failure this build cannot name more precisely — so a job record never
//! becomes unreadable over its error code. The record's `message` is kept
//! as stored; if the record is written again, it is written with
//! `internal_error`.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Declares a fieldless code enum from one table of `Variant => value`
/// rows: the enum, `ALL` (every variant, in table order) and one
/// exhaustive `match` from variant to value, named by the `fn` line.
/// Generating all three from the same table keeps `ALL` complete: a code
/// cannot be added to the enum and be missed by the tests and parsers that
/// walk `ALL`.
macro_rules! code_table {
    (
        $(#[$enum_meta:meta])*
        $vis:vis enum $name:ident {
            $( $(#[$meta:meta])* $variant:ident => $value:expr, )+
        }
        $(#[$fn_meta:meta])*
        fn $map:ident -> $ty:ty;
    ) => {
        $(#[$enum_meta])*
        $vis enum $name {
            $( $(#[$meta])* $variant, )+
        }

        impl $name {
            /// Every variant, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            $(#[$fn_meta])*
            pub const fn $map(self) -> $ty {
                match self {
                    $( $name::$variant => $value, )+
                }
            }
        }
    };
}
pub(crate) use code_table;

code_table! {
    /// Why a job failed: the `code` of its JobError.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub enum JobErrorCode {
        /// The workflow did not validate when its turn came (plugins changed
        /// since it was submitted, or it was over the intake budget).
        InvalidWorkflow => "invalid_workflow",
        /// A node reported an error about its inputs or its work.
        NodeExecutionError => "node_execution_error",
        /// A node ran past its wall-clock limit.
        NodeTimeout => "node_timeout",
        /// A node wanted more memory than its ceiling.
        NodeOutOfMemory => "node_out_of_memory",
        /// The job's memory bound refused a node.
        JobOutOfMemory => "job_out_of_memory",
        /// A node's plugin trapped or panicked.
        NodeCrashed => "node_crashed",
        /// A node returned outputs that do not match its definition, or
        /// exceeded its output budget.
        NodeInvalidOutput => "node_invalid_output",
        /// The run was cut off: a node call was cancelled, or a restart
        /// ended the job it was running.
        Interrupted => "interrupted",
        /// A partner service refused for lack of credits.
        InsufficientFunds => "insufficient_funds",
        /// The job's account had no credits left when its turn came.
        InsufficientCredits => "insufficient_credits",
        /// The account's subscription is not active (the hosted cloud's
        /// compatibility API; shown on the WebSocket, never stored).
        InactiveSubscription => "inactive_subscription",
        /// The job's deployment was stopped before the job could run.
        DeploymentStopped => "deployment_stopped",
        /// The host failed: the workflow could not be read back from the
        /// store, or the run failed unexpectedly. Also what a stored code
        /// this build does not know loads as.
        InternalError => "internal_error",
    }
    /// The wire name: `job.error.code` on the Jobs API, and the stored form.
    fn as_str -> &'static str;
}

impl JobErrorCode {
    /// The code of a wire name; `None` for a name this build does not know.
    pub fn parse(name: &str) -> Option<JobErrorCode> {
        JobErrorCode::ALL.iter().copied().find(|c| c.as_str() == name)
    }

    /// ComfyUI's `exception_type` of a failure with this code: the one map
    /// for every compatibility surface (WebSocket `execution_error`,
    /// `/api/history` status messages, `/api/jobs` `execution_error`).
    ///
    /// The spec's names (service-interface.md, "Compatibility API execution
    /// errors") where it lists one; otherwise the Python exception ComfyUI
    /// reports for such a failure (compat-protocol.md 3.4): `RuntimeError`
    /// for a node or host failure, `TimeoutError` for a time limit.
    ///
    /// `interrupted`: the spec lists no name for it. ComfyUI's own
    /// exception for a stopped run is `InterruptProcessingException`
    /// (`comfy.model_management`), the name used here on every surface
    /// (unqualified, like the spec's own names).
    pub const fn exception_type(self) -> &'static str {
        match self {
            JobErrorCode::InvalidWorkflow => "ValidationError",
            JobErrorCode::NodeOutOfMemory | JobErrorCode::JobOutOfMemory => "OOMError",
            JobErrorCode::InsufficientFunds | JobErrorCode::InsufficientCredits => "InsufficientFundsError",
            JobErrorCode::InactiveSubscription => "InactiveSubscriptionError",
            JobErrorCode::NodeTimeout => "TimeoutError",
            JobErrorCode::Interrupted => "InterruptProcessingException",
            JobErrorCode::NodeExecutionError
            | JobErrorCode::NodeCrashed
            | JobErrorCode::NodeInvalidOutput
            | JobErrorCode::DeploymentStopped
            | JobErrorCode::InternalError => "RuntimeError",
        }
    }
}

impl std::fmt::Display for JobErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for JobErrorCode {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

/// Any string loads (module docs: an unknown name is `internal_error`).
impl<'de> Deserialize<'de> for JobErrorCode {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<JobErrorCode, D::Error> {
        let name = String::deserialize(deserializer)?;
        Ok(JobErrorCode::parse(&name).unwrap_or(JobErrorCode::InternalError))
    }
}

/// `exception_type` values the spec allows: service-interface.md's list,
/// and the Python exceptions ComfyUI itself reports.
#[cfg(test)]
pub(crate) const SPEC_EXCEPTION_TYPES: &[&str] = &[
    "ValidationError",
    "ModelDownloadError",
    "ImageDownloadError",
    "OOMError",
    "InsufficientFundsError",
    "InactiveSubscriptionError",
    "RuntimeError",
    "TimeoutError",
    "InterruptProcessingException",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_names_are_unique_snake_case_and_round_trip() {
        let mut seen = std::collections::HashSet::new();
        for &code in JobErrorCode::ALL {
            let name = code.as_str();
            assert!(!name.is_empty() && name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'), "{name}");
            assert!(seen.insert(name), "{name} twice");
            assert_eq!(JobErrorCode::parse(name), Some(code));
            assert_eq!(serde_json::to_value(code).unwrap(), serde_json::json!(name));
            assert_eq!(serde_json::from_value::<JobErrorCode>(serde_json::json!(name)).unwrap(), code);
            assert_eq!(code.to_string(), name);
        }
    }

    #[test]
    fn every_code_has_a_spec_exception_type() {
        for &code in JobErrorCode::ALL {
            assert!(SPEC_EXCEPTION_TYPES.contains(&code.exception_type()), "{code}: {}", code.exception_type());
        }
        // The spec's own names.
        assert_eq!(JobErrorCode::InvalidWorkflow.exception_type(), "ValidationError");
        assert_eq!(JobErrorCode::NodeOutOfMemory.exception_type(), "OOMError");
        assert_eq!(JobErrorCode::JobOutOfMemory.exception_type(), "OOMError");
        assert_eq!(JobErrorCode::InsufficientFunds.exception_type(), "InsufficientFundsError");
        assert_eq!(JobErrorCode::InactiveSubscription.exception_type(), "InactiveSubscriptionError");
        assert_eq!(JobErrorCode::Interrupted.exception_type(), "InterruptProcessingException");
    }

    #[test]
    fn an_unknown_stored_code_loads_as_internal_error() {
        let code: JobErrorCode = serde_json::from_str(r#""some_future_code""#).unwrap();
        assert_eq!(code, JobErrorCode::InternalError);
        assert_eq!(JobErrorCode::parse("some_future_code"), None);
        assert!(serde_json::from_str::<JobErrorCode>("3").is_err(), "only a string is a code");
    }

    #[test]
    fn stored_error_records_keep_their_form() {
        use crate::store::JobErrorRecord;
        // As records were written when the code was a plain string.
        let stored = r#"{"code":"node_timeout","message":"too slow","node_id":"3","class_type":"Sleep","traceback":null}"#;
        let rec: JobErrorRecord = serde_json::from_str(stored).unwrap();
        assert_eq!(rec.code, JobErrorCode::NodeTimeout);
        assert_eq!(serde_json::to_string(&rec).unwrap(), stored);
        // A code this build does not know: the record still loads, message kept.
        let future = r#"{"code":"gpu_lost","message":"the GPU went away","node_id":null,"class_type":null,"traceback":null}"#;
        let rec: JobErrorRecord = serde_json::from_str(future).unwrap();
        assert_eq!((rec.code, rec.message.as_str()), (JobErrorCode::InternalError, "the GPU went away"));
    }
}
