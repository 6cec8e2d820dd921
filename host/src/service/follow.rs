//! Following what other hosts sharing the store change in the records
//! every host keeps in memory: accounts, deployments and installed
//! plugins. Each write of one is announced by the store in its own
//! transaction (`store::cluster`, [`Topic::Accounts`],
//! [`Topic::Deployments`], [`Topic::Plugins`]), a job's charge just after
//! it (`MetaStore::finish_job_charged`); a host re-reads what it
//! hears, and everything when announcements may have been missed (its
//! listening connection lost, its inbox overrun) and once at the start (a
//! change between its first read and its subscription).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast::{self, error::RecvError, error::TryRecvError};
use tokio_util::sync::CancellationToken;

use super::Service;
use super::deployments::Reconciled;
use crate::store::cluster::{Notices, Topic};

/// How often a follower checks whether notices were missed.
const GAP_CHECK: Duration = Duration::from_secs(1);
/// How often scopes of plugins this host could not bring in step are
/// followed again (`LivePlugins::take_pending`).
const PLUGINS_AGAIN: Duration = Duration::from_secs(5);
/// Ids re-read in one pass at most (more wait for the next pass).
const BATCH: usize = 256;

/// What to re-read next.
pub(super) enum Heard {
    /// These records (each once, however often announced).
    Ids(BTreeSet<Arc<str>>),
    /// Every record: announcements may have been missed.
    All,
}

/// The announcements of one topic, in batches.
pub(super) struct Follower {
    notices: Arc<dyn Notices>,
    heard: broadcast::Receiver<Arc<str>>,
    check: tokio::time::Interval,
    /// [`Notices::listens`] at the last full re-read (`None`: one is due).
    gaps: Option<u64>,
}

impl Follower {
    pub(super) fn new(notices: Arc<dyn Notices>, topic: Topic) -> Follower {
        let heard = notices.subscribe(topic);
        Follower { notices, heard, check: tokio::time::interval(GAP_CHECK), gaps: None }
    }

    /// The next batch to re-read; `None` when the host stops.
    pub(super) async fn next(&mut self, shutdown: &CancellationToken) -> Option<Heard> {
        loop {
            let first = tokio::select! {
                _ = shutdown.cancelled() => return None,
                _ = self.check.tick() => {
                    let now = self.notices.listens();
                    if self.gaps != Some(now) {
                        self.gaps = Some(now);
                        return Some(Heard::All);
                    }
                    continue;
                }
                first = self.heard.recv() => first,
            };
            // What is heard together, up to a batch (the rest waits in the
            // inbox for the next call; an inbox overrun re-reads everything).
            let mut ids = BTreeSet::new();
            let mut next = Some(first);
            while let Some(notice) = next.take() {
                match notice {
                    Ok(id) => drop(ids.insert(id)),
                    Err(RecvError::Lagged(_)) => return Some(self.all_due()),
                    Err(RecvError::Closed) => return None,
                }
                if ids.len() >= BATCH {
                    break;
                }
                next = match self.heard.try_recv() {
                    Ok(id) => Some(Ok(id)),
                    Err(TryRecvError::Lagged(n)) => Some(Err(RecvError::Lagged(n))),
                    Err(_) => None,
                };
            }
            return Some(Heard::Ids(ids));
        }
    }

    /// Everything is re-read now, and again at the next check should this
    /// pass fail ([`Follower::failed`]).
    fn all_due(&mut self) -> Heard {
        self.gaps = Some(self.notices.listens());
        Heard::All
    }

    /// A re-read failed: everything is re-read at the next check.
    fn failed(&mut self) {
        self.gaps = None;
    }
}

impl Service {
    /// Keeps this host's accounts in step with the other hosts' writes; an
    /// account another host disabled has its work here ended too (jobs
    /// canceled, streams closed), as that host ended its own.
    pub(super) async fn follow_accounts(self: Arc<Self>) {
        let Some(cluster) = self.cluster.clone() else { return };
        if !self.opts.mode.has_accounts() {
            return;
        }
        let mut follower = Follower::new(cluster.notices.clone(), Topic::Accounts);
        while let Some(heard) = follower.next(&self.shutdown).await {
            match heard {
                Heard::All => {
                    let before = self.accounts.list();
                    if let Err(e) = self.accounts.reload().await {
                        follower.failed();
                        tracing::warn!(error = %e, "cannot re-read the accounts; trying again");
                        continue;
                    }
                    for account in before.iter().filter(|a| !a.disabled) {
                        self.disabled_elsewhere(&account.id).await;
                    }
                }
                Heard::Ids(ids) => {
                    let ids: Vec<String> = ids.iter().map(|id| id.to_string()).collect();
                    let enabled: Vec<&String> = ids.iter().filter(|id| !self.accounts.is_disabled(id)).collect();
                    if let Err(e) = self.accounts.refresh(&ids).await {
                        follower.failed();
                        tracing::warn!(accounts = ids.len(), error = %e, "cannot re-read the accounts another host changed");
                        continue;
                    }
                    for id in enabled {
                        self.disabled_elsewhere(id).await;
                    }
                }
            }
        }
    }

    /// When account `id` is now disabled (by another host), ends what it
    /// has going here too.
    async fn disabled_elsewhere(&self, id: &str) {
        if self.accounts.is_disabled(id) {
            self.end_account_work(id).await;
        }
    }

    /// Keeps this host's deployments in step with what operators did
    /// through other hosts: a deployment created or started elsewhere
    /// loads its plugins here too, one stopped elsewhere stops here (its
    /// queued jobs here canceled). Each host loads on its own; a load's
    /// outcome (ready or failed) is the host's.
    pub(super) async fn follow_deployments(self: Arc<Self>) {
        let Some(cluster) = self.cluster.clone() else { return };
        let mut follower = Follower::new(cluster.notices.clone(), Topic::Deployments);
        while let Some(heard) = follower.next(&self.shutdown).await {
            let ids = match heard {
                Heard::All => None,
                Heard::Ids(ids) => Some(ids.iter().map(|id| id.to_string()).collect()),
            };
            let followed = match self.deployments.follow(ids).await {
                Ok(followed) => followed,
                Err(e) => {
                    follower.failed();
                    tracing::warn!(error = %e, "cannot re-read the deployments other hosts changed; trying again");
                    continue;
                }
            };
            for (id, done) in followed {
                match done {
                    Reconciled::Unchanged => {}
                    Reconciled::Load(generation) => self.load_deployment(&id, generation),
                    Reconciled::Stopped => self.cancel_queued_of_deployment(&id).await,
                }
            }
        }
    }

    /// Keeps this host's installed plugins (the operator's, and accounts'
    /// own) in step with what was installed or removed through other hosts
    /// (`plugins::shared`).
    pub(super) async fn follow_plugins(self: Arc<Self>) {
        let Some(cluster) = self.cluster.clone() else { return };
        let mut follower = Follower::new(cluster.notices.clone(), Topic::Plugins);
        let mut again = tokio::time::interval(PLUGINS_AGAIN);
        loop {
            let scopes = tokio::select! {
                heard = follower.next(&self.shutdown) => match heard {
                    None => return,
                    Some(Heard::All) => None,
                    Some(Heard::Ids(scopes)) => Some(scopes.iter().map(|scope| scope.to_string()).collect()),
                },
                _ = again.tick() => match self.plugins.take_pending() {
                    pending if pending.is_empty() => continue,
                    pending => Some(pending),
                },
            };
            if let Err(e) = self.plugins.follow_shared(scopes).await {
                follower.failed();
                tracing::warn!(error = %e, "cannot follow the plugins other hosts installed; trying again");
            }
        }
    }
}
