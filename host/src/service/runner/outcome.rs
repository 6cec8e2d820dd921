//! How a run ended, as a terminal job record: the status it moves to (a
//! cancel wins over the run's own end, retention over both), its error and
//! its log.

use crate::codes::JobErrorCode;
use crate::executor::{RunOutcome, RunStatus};
use crate::plugins::FailureKind;
use crate::store::{IllegalTransition, JobErrorRecord, JobLogRecord, JobRecord, JobStatus, Micros};

/// The JobError code of a node failure.
pub fn failure_code(kind: FailureKind) -> JobErrorCode {
    match kind {
        FailureKind::Timeout => JobErrorCode::NodeTimeout,
        FailureKind::OutOfMemory => JobErrorCode::NodeOutOfMemory,
        FailureKind::JobOutOfMemory => JobErrorCode::JobOutOfMemory,
        FailureKind::Crashed => JobErrorCode::NodeCrashed,
        FailureKind::InvalidOutput => JobErrorCode::NodeInvalidOutput,
        FailureKind::Failed => JobErrorCode::NodeExecutionError,
        FailureKind::Interrupted => JobErrorCode::Interrupted,
        FailureKind::InsufficientFunds => JobErrorCode::InsufficientFunds,
    }
}

/// The JobError code of a job whose account had no credits left when its
/// turn came.
pub(super) const NO_CREDITS: JobErrorCode = JobErrorCode::InsufficientCredits;

/// A job that did not run to an outcome: it could not be prepared, or the
/// host failed mid-run (`output_lost`: what its nodes printed is gone).
pub(super) struct NotRun {
    pub error: JobErrorRecord,
    pub output_lost: bool,
}

/// Sets the terminal state of a job record from how its run ended.
pub(super) fn end_record(
    rec: &mut JobRecord,
    outcome: Result<RunOutcome, NotRun>,
    expired: bool,
    now: Micros,
    log_limit: usize,
) -> Result<(), IllegalTransition> {
    let canceling = rec.status == JobStatus::Canceling;
    let ended = match outcome {
        Ok(outcome) => {
            let ended = match outcome.status {
                RunStatus::Succeeded => {
                    if let Some(p) = rec.progress.as_mut() {
                        (p.value, p.nodes_done, p.step, p.steps) = (1.0, p.nodes_total, None, None);
                    }
                    JobStatus::Succeeded
                }
                RunStatus::Failed { node, class_type, failure } => {
                    rec.error = Some(JobErrorRecord {
                        code: failure_code(failure.kind),
                        message: failure.message,
                        node_id: Some(node),
                        class_type: Some(class_type),
                        traceback: None,
                    });
                    JobStatus::Failed
                }
                RunStatus::Interrupted => JobStatus::Canceled,
            };
            rec.logs = Some(log_record(outcome.log, outcome.log_truncated, now, log_limit));
            ended
        }
        Err(NotRun { error, output_lost }) => {
            // An empty log: nothing ran, or what ran was lost (shed).
            rec.logs = Some(JobLogRecord { text: String::new(), truncated: output_lost, captured_at: now });
            rec.error = Some(error);
            JobStatus::Failed
        }
    };
    // A cancel request wins over however the run ended (canceling →
    // canceled is the only way out), and retention over both.
    if canceling {
        rec.error = None;
    }
    let to = match (expired, canceling) {
        (true, _) => JobStatus::Expired,
        (false, true) => JobStatus::Canceled,
        (false, false) => ended,
    };
    rec.execution_ms = rec.started_at.map(|s| (now - s) / 1000);
    rec.transition(to, now)
}

/// The job log: the tail of the plugins' output when it is longer than
/// `limit` bytes; `truncated` when any of it was shed (here or in a node's
/// own log).
pub(super) fn log_record(mut text: String, node_truncated: bool, now: Micros, limit: usize) -> JobLogRecord {
    let cut = text.len() > limit;
    if cut {
        let mut at = text.len() - limit;
        while !text.is_char_boundary(at) {
            at += 1;
        }
        text.drain(..at);
    }
    JobLogRecord { text, truncated: cut || node_truncated, captured_at: now }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_logs_keep_their_tail() {
        const LIMIT: usize = 1 << 20;
        let text = format!("{}end", "x".repeat(LIMIT + 10));
        let log = log_record(text, false, 7, LIMIT);
        assert!(log.truncated && log.text.len() == LIMIT && log.text.ends_with("end"));
        let short = log_record("ok".into(), false, 7, LIMIT);
        assert!(!short.truncated && short.text == "ok");
        assert!(log_record("ok".into(), true, 7, LIMIT).truncated, "a node's own log was cut");
        // A multi-byte character on the cut is dropped whole.
        let cut = log_record("é".repeat(10), false, 7, 5);
        assert!(cut.truncated && cut.text == "éé", "{:?}", cut.text);
        // A limit of 0 sheds everything: truncated with empty text.
        let shed = log_record("abc".into(), false, 7, 0);
        assert!(shed.truncated && shed.text.is_empty());
    }
}
