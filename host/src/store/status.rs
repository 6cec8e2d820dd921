//! The job state machine: a job's statuses, the one function that moves a
//! record from one to another ([`JobRecord::transition`]), and the table of
//! the moves it allows. Every status change in kiln goes through it; a move
//! the table does not allow is a bug in the caller ([`IllegalTransition`]).
//!
//! ```text
//!            ┌──────────────────────────────┐ (restart: run again)
//!            ▼                              │
//!         queued ──► running ──► canceling ─┼─► canceled ─┐
//!            │          │  └────────────────┼─► succeeded ├─► expired
//!            │          └───────────────────┴─► failed ───┘
//!            └─► canceled / failed / expired
//! ```
//!
//! How each status is named on each wire lives in `api` (the Jobs API uses
//! [`JobStatus::as_str`]).

use serde::{Deserialize, Serialize};

use super::records::{JobRecord, Micros};

/// A job's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobStatus {
    Queued,
    Running,
    Succeeded,
    Canceling,
    Canceled,
    Failed,
    Expired,
}

/// A status change the state machine does not allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("illegal job status transition {from:?} -> {to:?}")]
pub struct IllegalTransition {
    pub from: JobStatus,
    pub to: JobStatus,
}

impl JobStatus {
    /// Every status, in the order of the wire's documentation.
    pub const ALL: [JobStatus; 7] =
        [JobStatus::Queued, JobStatus::Running, JobStatus::Succeeded, JobStatus::Canceling, JobStatus::Canceled, JobStatus::Failed, JobStatus::Expired];

    /// Whether no further transition (other than expiry) can happen.
    pub fn is_terminal(self) -> bool {
        matches!(self, JobStatus::Succeeded | JobStatus::Canceled | JobStatus::Failed | JobStatus::Expired)
    }

    /// Whether a job may move from `self` to `to`:
    /// - queued → running (a worker takes it); → canceled (canceled, its
    ///   account disabled, or its submission not written); → expired
    ///   (retention); → failed (a restart finds it unable to run again);
    /// - running → canceling (cancel requested); → succeeded / failed /
    ///   canceled (its run ended, or was interrupted); → expired (retention
    ///   stopped it); → queued (a restart runs it again); → failed (a
    ///   restart gives up on it);
    /// - canceling → canceled (a cancel wins over how the run ended); →
    ///   expired (retention wins over both);
    /// - succeeded / failed / canceled → expired; expired → expired (an
    ///   expired record whose outputs are not yet deleted is expired again).
    pub fn can_become(self, to: JobStatus) -> bool {
        use JobStatus::*;
        matches!(
            (self, to),
            (Queued, Running | Canceled | Expired | Failed)
                | (Running, Canceling | Succeeded | Failed | Canceled | Expired | Queued)
                | (Canceling, Canceled | Expired)
                | (Succeeded | Failed | Canceled | Expired, Expired)
        )
    }

    /// The Jobs API's name.
    pub fn as_str(self) -> &'static str {
        match self {
            JobStatus::Queued => "queued",
            JobStatus::Running => "running",
            JobStatus::Succeeded => "succeeded",
            JobStatus::Canceling => "canceling",
            JobStatus::Canceled => "canceled",
            JobStatus::Failed => "failed",
            JobStatus::Expired => "expired",
        }
    }

    /// Parses a Jobs API name.
    pub fn parse(s: &str) -> Option<JobStatus> {
        JobStatus::ALL.into_iter().find(|st| st.as_str() == s)
    }
}

impl JobRecord {
    /// Moves the job to `to` at `now`: the one place a job's status
    /// changes. Stamps `updated_at`, and `completed_at` (unless already
    /// set) when `to` is terminal. An illegal move changes nothing.
    pub fn transition(&mut self, to: JobStatus, now: Micros) -> Result<(), IllegalTransition> {
        if !self.status.can_become(to) {
            return Err(IllegalTransition { from: self.status, to });
        }
        self.status = to;
        self.updated_at = now;
        if to.is_terminal() {
            self.completed_at.get_or_insert(now);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use JobStatus::*;

    /// The allowed moves, written out independently of `can_become`.
    const LEGAL: &[(JobStatus, JobStatus)] = &[
        (Queued, Running),
        (Queued, Canceled),
        (Queued, Expired),
        (Queued, Failed),
        (Running, Canceling),
        (Running, Succeeded),
        (Running, Failed),
        (Running, Canceled),
        (Running, Expired),
        (Running, Queued),
        (Canceling, Canceled),
        (Canceling, Expired),
        (Succeeded, Expired),
        (Failed, Expired),
        (Canceled, Expired),
        (Expired, Expired),
    ];

    #[test]
    fn every_legal_transition_moves_and_every_illegal_one_is_refused() {
        let mut legal = 0;
        for from in JobStatus::ALL {
            for to in JobStatus::ALL {
                let mut job = JobRecord { status: from, ..JobRecord::queued_for_test("j", 10, 1) };
                let before = job.clone();
                let expected = LEGAL.contains(&(from, to));
                match job.transition(to, 99) {
                    Ok(()) => {
                        assert!(expected, "{from:?} -> {to:?} must be refused");
                        legal += 1;
                        assert_eq!(job.status, to);
                        assert_eq!(job.updated_at, 99);
                        assert_eq!(job.completed_at, to.is_terminal().then_some(99), "{from:?} -> {to:?}");
                    }
                    Err(e) => {
                        assert!(!expected, "{from:?} -> {to:?} must be allowed");
                        assert_eq!(e, IllegalTransition { from, to });
                        assert_eq!(job, before, "a refused move changes nothing");
                    }
                }
            }
        }
        assert_eq!(legal, LEGAL.len());
    }

    #[test]
    fn a_terminal_job_keeps_when_it_completed() {
        let mut job = JobRecord { status: Succeeded, completed_at: Some(50), ..JobRecord::queued_for_test("j", 10, 1) };
        job.transition(Expired, 99).unwrap();
        assert_eq!((job.completed_at, job.updated_at), (Some(50), 99));
    }

    #[test]
    fn only_expiry_leaves_a_terminal_status() {
        for from in JobStatus::ALL.into_iter().filter(|s| s.is_terminal()) {
            let next: Vec<JobStatus> = JobStatus::ALL.into_iter().filter(|&to| from.can_become(to)).collect();
            assert_eq!(next, [Expired], "{from:?}");
        }
    }

    #[test]
    fn wire_names_round_trip() {
        for status in JobStatus::ALL {
            assert_eq!(JobStatus::parse(status.as_str()), Some(status));
            assert_eq!(serde_json::to_value(status).unwrap(), status.as_str());
        }
        assert_eq!(JobStatus::parse("done"), None);
    }
}
