//! What a finished job's account pays, and when. Where the store keeps the
//! accounts too (PostgreSQL), the charge is made in the transaction that
//! records the job's end, so no admission on any host ever sees the job
//! ended and its account not yet charged (an unfinished job holds its
//! account's minimum price: `accounts::Pricing::admits`). Otherwise it is
//! made through the account store just after that write, before the job
//! leaves the live set, whose count of the account's jobs holds it until
//! then.

use super::outcome::NO_CREDITS;
use crate::accounts::Pricing;
use crate::service::Service;
use crate::store::{Charge, CreditChange, JobRecord};

/// A charge a finished job owes: its billed account, and the execution it
/// pays for.
pub(super) struct Due {
    account: String,
    execution_ms: u64,
}

impl Due {
    /// The charge at `pricing`.
    pub(super) fn charge(&self, pricing: Pricing) -> Charge<'_> {
        Charge { account: &self.account, amount: pricing.cost(self.execution_ms) }
    }
}

impl Service {
    /// What `terminal` owes, with accounts: the time it executed (a job
    /// that never started, or one stopped for want of credits, costs
    /// nothing).
    pub(super) fn charge_due(&self, terminal: &JobRecord) -> Option<Due> {
        if !self.opts.mode.has_accounts() || terminal.error.as_ref().is_some_and(|e| e.code == NO_CREDITS) {
            return None;
        }
        let execution_ms = u64::try_from(terminal.execution_ms?).unwrap_or(0);
        Some(Due { account: self.billed_account(terminal), execution_ms })
    }

    /// A charge the store made with the job's end (`change`: `None` when
    /// the end had been recorded before, by an earlier try): this host's
    /// view of the account is read again from the store (rather than shown
    /// as this write returned it: another change made here meanwhile may
    /// have shown a newer balance).
    pub(super) async fn charged_with_end(&self, terminal: &JobRecord, due: Option<Due>, change: Option<CreditChange>) {
        let Some(due) = due else { return };
        // The account the store charged (the one the job's admission held).
        let mut payer = due.account.clone();
        match change {
            Some(CreditChange::Changed(account)) => {
                tracing::debug!(job_id = %terminal.id, account = %account.id, execution_ms = due.execution_ms, balance = account.credits, "job charged");
                self.metrics.credits_charged(self.accounts.pricing().cost(due.execution_ms));
                payer = account.id;
            }
            Some(CreditChange::Overflow) => {
                return tracing::error!(job_id = %terminal.id, account = %due.account, "a charge would overflow the balance; not recorded");
            }
            Some(CreditChange::NoAccount) => return,
            // An earlier try, whose answer was lost, charged it.
            None => {}
        }
        // This host does not hear its own notices: read again now (a
        // failure here leaves the older balance until the account next
        // changes or the notices are re-read).
        if let Err(e) = self.accounts.refresh(std::slice::from_ref(&payer)).await {
            tracing::warn!(account = %payer, error = %e, "cannot read a charged account again");
        }
    }

    /// Charges `due` through the account store (a store that keeps no
    /// accounts recorded the end).
    pub(super) async fn charge_apart(&self, terminal: &JobRecord, due: Option<Due>) {
        let Some(due) = due else { return };
        let balance = self.accounts.charge(&due.account, due.execution_ms).await;
        if balance.is_some() {
            self.metrics.credits_charged(self.accounts.pricing().cost(due.execution_ms));
        }
        tracing::debug!(job_id = %terminal.id, account = %due.account, execution_ms = due.execution_ms, ?balance, "job charged");
    }
}
