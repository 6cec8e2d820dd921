//! How each wire names a job's status: one map per vocabulary, each an
//! exhaustive match over [`JobStatus`] (a new status does not compile
//! until every surface names it).
//!
//! - the Jobs API (`/api/v2`): the status itself ([`v2`]);
//! - the compatibility API's `GET /api/job/{id}/status` ([`comfy_job`]);
//! - ComfyUI's job listing, `GET /api/jobs` ([`comfy_jobs_list`]).

use crate::codes::JobErrorCode;
use crate::store::{JobRecord, JobStatus};

/// The Jobs API's name of a status.
pub fn v2(status: JobStatus) -> &'static str {
    status.as_str()
}

/// `GET /api/job/{id}/status`: a running job that has not started a node
/// is `preparing`; a failure of the workflow itself (it did not validate,
/// a node refused its inputs) is `non_retryable_error`, a run cut off by a
/// restart `lost`.
pub fn comfy_job(record: &JobRecord) -> &'static str {
    match record.status {
        JobStatus::Queued => "queued_waiting",
        JobStatus::Running if record.progress.as_ref().is_none_or(|p| p.nodes_done == 0 && p.current_node.is_none()) => "preparing",
        JobStatus::Running => "executing",
        JobStatus::Canceling => "cancel_requested",
        JobStatus::Succeeded => "success",
        JobStatus::Canceled => "cancelled",
        JobStatus::Expired => "lost",
        JobStatus::Failed => match record.error.as_ref().map(|e| e.code) {
            Some(JobErrorCode::Interrupted) => "lost",
            Some(JobErrorCode::InvalidWorkflow | JobErrorCode::NodeExecutionError) => "non_retryable_error",
            _ => "error",
        },
    }
}

/// The statuses `GET /api/jobs` accepts as a filter, in its order.
pub const COMFY_JOBS_LIST: [&str; 5] = ["pending", "in_progress", "completed", "failed", "cancelled"];

/// ComfyUI's `GET /api/jobs` name of a job's status.
pub fn comfy_jobs_list(record: &JobRecord) -> &'static str {
    match record.status {
        JobStatus::Queued => "pending",
        JobStatus::Running | JobStatus::Canceling => "in_progress",
        JobStatus::Succeeded => "completed",
        JobStatus::Canceled => "cancelled",
        JobStatus::Failed | JobStatus::Expired => "failed",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{JobErrorRecord, ProgressSnapshot};

    fn record(status: JobStatus, code: Option<JobErrorCode>) -> JobRecord {
        let mut rec = JobRecord::queued_for_test("j", 0, 1);
        rec.status = status;
        rec.error = code.map(|code| JobErrorRecord { code, message: String::new(), node_id: None, class_type: None, traceback: None });
        rec
    }

    /// Every status, on every surface, named as the specs list it.
    #[test]
    fn every_status_has_a_name_on_every_surface() {
        let expected = [
            (JobStatus::Queued, "queued", "queued_waiting", "pending"),
            (JobStatus::Running, "running", "preparing", "in_progress"),
            (JobStatus::Succeeded, "succeeded", "success", "completed"),
            (JobStatus::Canceling, "canceling", "cancel_requested", "in_progress"),
            (JobStatus::Canceled, "canceled", "cancelled", "cancelled"),
            (JobStatus::Failed, "failed", "error", "failed"),
            (JobStatus::Expired, "expired", "lost", "failed"),
        ];
        assert_eq!(expected.map(|e| e.0), JobStatus::ALL, "every status is listed");
        for (status, v2_name, job, list) in expected {
            let rec = record(status, (status == JobStatus::Failed).then_some(JobErrorCode::NodeTimeout));
            assert_eq!(v2(status), v2_name);
            assert_eq!(comfy_job(&rec), job, "{status:?}");
            assert_eq!(comfy_jobs_list(&rec), list, "{status:?}");
            assert!(COMFY_JOBS_LIST.contains(&comfy_jobs_list(&rec)), "a filter can find {status:?}");
        }
    }

    #[test]
    fn a_running_job_executes_once_a_node_started() {
        let mut rec = record(JobStatus::Running, None);
        let progress = ProgressSnapshot {
            value: 0.0,
            nodes_done: 0,
            nodes_total: 2,
            current_node: None,
            current_node_class: None,
            step: None,
            steps: None,
            message: None,
        };
        rec.progress = Some(progress.clone());
        assert_eq!(comfy_job(&rec), "preparing");
        rec.progress = Some(ProgressSnapshot { current_node: Some("1".into()), ..progress.clone() });
        assert_eq!(comfy_job(&rec), "executing");
        rec.progress = Some(ProgressSnapshot { nodes_done: 1, ..progress });
        assert_eq!(comfy_job(&rec), "executing");
    }

    /// The workflow's own failure cannot succeed on a retry; a crash, a
    /// timeout or a memory limit might; a restart cut the run off.
    #[test]
    fn a_failure_is_named_by_whether_a_retry_can_help() {
        use JobErrorCode as C;
        for code in JobErrorCode::ALL.iter().copied() {
            let want = match code {
                C::Interrupted => "lost",
                C::InvalidWorkflow | C::NodeExecutionError => "non_retryable_error",
                _ => "error",
            };
            assert_eq!(comfy_job(&record(JobStatus::Failed, Some(code))), want, "{code}");
        }
        assert_eq!(comfy_job(&record(JobStatus::Failed, Some(C::NodeCrashed))), "error", "a crash may not happen again");
    }
}
