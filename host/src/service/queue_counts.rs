//! ComfyUI's `queue_remaining` (the WebSocket's status messages) where
//! hosts share the store: an owner's jobs queued or running on every host.
//!
//! A change to an owner's queue here is shown at once, with the other
//! hosts' count as last read, and announced to the other hosts
//! ([`Topic::Queues`], the owner's id; once per owner per [`GATHER`]).
//! A host with a stream of that owner open reads the other hosts' count
//! again (one count per owner per [`GATHER`], however many changes) and
//! shows the new total when it changed. Everything shown is read again
//! when announcements may have been missed (see `follow`).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Notify;

use super::Service;
use super::follow::{Follower, Heard};
use crate::store::cluster::Topic;

/// How long changes are gathered before they are announced and counted.
const GATHER: Duration = Duration::from_millis(50);
/// The longest wait before a failed count is tried again.
const RETRY_MAX: Duration = Duration::from_secs(5);

/// The owners whose queues changed, and the other hosts' counts shown.
#[derive(Default)]
pub(super) struct QueueCounts {
    inner: Mutex<Marks>,
    wake: Notify,
}

#[derive(Default)]
struct Marks {
    /// Owners whose queue changed here since the last pass (announced then).
    changed_here: HashSet<Arc<str>>,
    /// Owners to count again at the next pass.
    due: HashSet<Arc<str>>,
    /// The other hosts' count of each owner with a stream open here, as
    /// last read (owners without one are dropped at each pass, which runs
    /// at each change here or heard).
    elsewhere: HashMap<Arc<str>, usize>,
}

impl QueueCounts {
    /// `owner`'s queue changed here: announced and counted at the next
    /// pass. Returns the other hosts' count as last read.
    pub fn changed_here(&self, owner: &str) -> usize {
        let elsewhere = {
            let mut marks = self.inner.lock();
            if !marks.changed_here.contains(owner) {
                marks.changed_here.insert(Arc::from(owner));
            }
            marks.elsewhere.get(owner).copied().unwrap_or(0)
        };
        self.wake.notify_one();
        elsewhere
    }

    /// The other hosts' count of `owner` as last read, without marking a
    /// change here (a job's start leaves its owner's count as it was).
    pub fn shown_elsewhere(&self, owner: &str) -> usize {
        self.inner.lock().elsewhere.get(owner).copied().unwrap_or(0)
    }

    /// The other hosts' count of `owner` was just read (a socket opened):
    /// kept if none is (a newer count than the one shown goes through the
    /// next pass, which shows it).
    pub fn read(&self, owner: &str, elsewhere: usize) {
        let mut marks = self.inner.lock();
        if !marks.elsewhere.contains_key(owner) {
            marks.elsewhere.insert(Arc::from(owner), elsewhere);
        }
    }

    /// Owners counted at the next pass: `heard` from other hosts, or all
    /// those shown when announcements may have been missed.
    fn heard(&self, heard: Heard) {
        let mut marks = self.inner.lock();
        match heard {
            Heard::Ids(owners) => marks.due.extend(owners),
            Heard::All => {
                let shown: Vec<Arc<str>> = marks.elsewhere.keys().cloned().collect();
                marks.due.extend(shown);
            }
        }
    }

    /// Takes this pass's work: the owners to announce, and those to count.
    fn take(&self) -> (Vec<Arc<str>>, Vec<Arc<str>>) {
        let mut marks = self.inner.lock();
        let here: Vec<Arc<str>> = marks.changed_here.drain().collect();
        let mut due: HashSet<Arc<str>> = marks.due.drain().collect();
        due.extend(here.iter().cloned());
        (here, due.into_iter().collect())
    }

    /// Records `owner`'s new count elsewhere; whether it changed.
    fn update(&self, owner: &Arc<str>, elsewhere: usize) -> bool {
        self.inner.lock().elsewhere.insert(owner.clone(), elsewhere) != Some(elsewhere)
    }

    /// Drops the counts of owners with no stream open here.
    fn forget_unwatched(&self, watched: impl Fn(&str) -> bool) {
        self.inner.lock().elsewhere.retain(|owner, _| watched(owner));
    }
}

impl Service {
    /// Announces this host's queue changes and shows the other hosts' (see
    /// the module doc), until the service stops.
    pub(super) async fn count_queues(self: Arc<Self>) {
        let (Some(cluster), Some(counts)) = (self.cluster.clone(), self.queue_counts.as_ref()) else { return };
        let mut follower = Follower::new(cluster.notices.clone(), Topic::Queues);
        // After a count failed (the store unreachable): when to count again.
        let mut retry: Option<Duration> = None;
        loop {
            tokio::select! {
                heard = follower.next(&self.shutdown) => match heard {
                    Some(heard) => counts.heard(heard),
                    None => return,
                },
                () = counts.wake.notified() => {}
                () = tokio::time::sleep(retry.unwrap_or(GATHER)), if retry.is_some() => {}
            }
            tokio::select! {
                _ = self.shutdown.cancelled() => return,
                _ = tokio::time::sleep(GATHER) => {}
            }
            let (here, due) = counts.take();
            for owner in here {
                cluster.notices.send(Topic::Queues, owner.to_string());
            }
            counts.forget_unwatched(|owner| self.open_streams_of(owner) > 0);
            let mut failed = BTreeSet::new();
            for owner in due {
                if self.open_streams_of(&owner) == 0 {
                    continue;
                }
                let elsewhere = match self.meta.unfinished_count_elsewhere(&owner).await {
                    Ok(n) => n,
                    Err(e) => {
                        if failed.is_empty() && retry.is_none() {
                            tracing::warn!(error = %e, "cannot count the other hosts' jobs: counting again shortly");
                        }
                        failed.insert(owner);
                        continue;
                    }
                };
                if counts.update(&owner, elsewhere) {
                    let remaining = self.queue.remaining_of(&owner) + elsewhere;
                    self.bus.queue(owner, remaining);
                }
            }
            // Those not counted are counted again, later each time the
            // store stays unreachable (at most every RETRY_MAX).
            retry = if failed.is_empty() {
                None
            } else {
                counts.heard(Heard::Ids(failed));
                Some(retry.map_or(GATHER, |r| (r * 2).min(RETRY_MAX)))
            };
        }
    }
}
