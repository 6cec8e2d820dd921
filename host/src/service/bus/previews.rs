//! Which previews cross hosts. A preview (an image, up to hundreds of KiB)
//! is sent only to the hosts where a stream watches its job: an event
//! stream following the job, or a ComfyUI WebSocket of the job's owner.
//! Each host announces what its streams watch, with its address
//! (`Wire::Watch` on the `Events` topic): at once when a watch begins, then
//! every [`RENEW`] while it lasts; the host running a job sends each
//! preview to each host whose announcement is less than [`EXPIRES`] old
//! (`Notices::send_to`), and a job's latest preview at once to a host that
//! just began watching it. A stream that closed costs the previews of at
//! most that long.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use parking_lot::Mutex;
use serde::Serialize;

use super::{ExecBody, ExecMessage};
use crate::store::cluster::{MAX_LARGE_NOTICE, MAX_NOTICE, Notices, Topic};

/// How often a host announces again what its streams watch.
pub const RENEW: Duration = Duration::from_secs(5);
/// How long an announcement holds (three missed renewals).
const EXPIRES: Duration = Duration::from_secs(15);

/// The only preview type nodes make (`ExecBody::Preview`).
pub const PNG: &str = "image/png";

/// What is watched: one job's events, or every job of an owner.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Watched {
    Job(Arc<str>),
    Owner(Arc<str>),
}

/// This host's side (the owners whose sockets are open here) and the
/// other hosts' announcements.
#[derive(Default)]
struct Watches {
    /// Sockets open here, by owner.
    owners_here: Mutex<HashMap<Arc<str>, usize>>,
    /// What other hosts' streams watch: by whom (their address), until
    /// when. Bounded by what they announce (their open streams); expired
    /// entries leave at each announcement.
    elsewhere: Mutex<HashMap<Watched, HashMap<Arc<str>, Instant>>>,
}

impl Watches {
    /// A socket of `owner` opened here; whether it is the owner's first.
    fn owner_opened(&self, owner: &Arc<str>) -> bool {
        let mut here = self.owners_here.lock();
        let n = here.entry(owner.clone()).or_insert(0);
        *n += 1;
        *n == 1
    }

    /// A socket of `owner` closed here.
    fn owner_closed(&self, owner: &str) {
        let mut here = self.owners_here.lock();
        if let Some(n) = here.get_mut(owner) {
            *n -= 1;
            if *n == 0 {
                here.remove(owner);
            }
        }
    }

    /// Whether a socket of `owner` is open here.
    fn owner_here(&self, owner: &str) -> bool {
        self.owners_here.lock().contains_key(owner)
    }

    /// The owners with a socket open here.
    fn owners_here(&self) -> Vec<Arc<str>> {
        self.owners_here.lock().keys().cloned().collect()
    }

    /// The host at `by` announced that its streams watch `watched`: what
    /// it did not watch before.
    fn announced(&self, by: &Arc<str>, watched: impl IntoIterator<Item = Watched>) -> Vec<Watched> {
        let now = Instant::now();
        let mut elsewhere = self.elsewhere.lock();
        elsewhere.retain(|_, hosts| {
            hosts.retain(|_, until| *until > now);
            !hosts.is_empty()
        });
        let mut new = Vec::new();
        for w in watched {
            if elsewhere.entry(w.clone()).or_default().insert(by.clone(), now + EXPIRES).is_none() {
                new.push(w);
            }
        }
        new
    }

    /// The addresses of the hosts whose streams watch job `job` of `owner`.
    fn wanted_by(&self, job: &Arc<str>, owner: &Arc<str>) -> Vec<Arc<str>> {
        let now = Instant::now();
        let elsewhere = self.elsewhere.lock();
        let mut hosts: Vec<Arc<str>> = [Watched::Job(job.clone()), Watched::Owner(owner.clone())]
            .iter()
            .filter_map(|w| elsewhere.get(w))
            .flat_map(|hosts| hosts.iter().filter(|(_, until)| **until > now).map(|(host, _)| host.clone()))
            .collect();
        hosts.sort_unstable();
        hosts.dedup();
        hosts
    }
}

/// Jobs whose latest preview is kept at most (more than run at once on a
/// host; a run that ended without saying so — its host's lease lapsed —
/// leaves its entry until it is the oldest of this many).
const MAX_LATEST: usize = 256;

/// A job's latest preview, kept while it runs here.
#[derive(Clone)]
struct Latest {
    owner: Arc<str>,
    node: String,
    data: Arc<Vec<u8>>,
    /// The order previews were kept in.
    order: u64,
}

/// `Wire::Watch` as sent.
#[derive(Serialize)]
struct WatchOut<'a> {
    t: &'static str,
    h: &'a str,
    j: Vec<&'a str>,
    o: Vec<&'a str>,
}

/// `Wire::Preview` as sent.
#[derive(Serialize)]
struct PreviewOut<'a> {
    t: &'static str,
    j: &'a str,
    o: &'a str,
    n: &'a str,
    d: String,
}

/// Previews across hosts: what this host's streams watch, announced; the
/// previews of the jobs run here, sent where they are watched.
pub struct Previews {
    notices: Arc<dyn Notices>,
    watches: Watches,
    /// The latest preview of each job running here that made one (until
    /// its run is over; at most [`MAX_LATEST`]).
    latest: Mutex<HashMap<Arc<str>, Latest>>,
    kept: std::sync::atomic::AtomicU64,
}

impl Previews {
    pub fn new(notices: Arc<dyn Notices>) -> Previews {
        Previews { notices, watches: Watches::default(), latest: Mutex::default(), kept: Default::default() }
    }

    /// A message published here: a preview is kept as its job's latest and
    /// sent to the hosts watching the job; the end of a run forgets it.
    pub fn published(&self, message: &ExecMessage) {
        match (&message.body, &message.owner) {
            (ExecBody::Preview { node, data, .. }, Some(owner)) => {
                let order = self.kept.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let latest = Latest { owner: owner.clone(), node: node.clone(), data: data.clone(), order };
                let mut kept = self.latest.lock();
                kept.insert(message.job_id.clone(), latest);
                if kept.len() > MAX_LATEST
                    && let Some(oldest) = kept.iter().min_by_key(|(_, l)| l.order).map(|(job, _)| job.clone())
                {
                    kept.remove(&oldest);
                }
                drop(kept);
                let hosts = self.watches.wanted_by(&message.job_id, owner);
                self.send(&message.job_id, owner, node, data, &hosts);
            }
            (ExecBody::Executing { node: None }, _) => {
                self.latest.lock().remove(&message.job_id);
            }
            _ => {}
        }
    }

    /// Sends a preview to the hosts at `hosts` (one too large for a notice
    /// stays here).
    fn send(&self, job: &str, owner: &str, node: &str, data: &[u8], hosts: &[Arc<str>]) {
        if hosts.is_empty() {
            return;
        }
        if base64::encoded_len(data.len(), true).is_none_or(|len| len > MAX_LARGE_NOTICE) {
            return tracing::debug!(job_id = job, bytes = data.len(), "a preview too large for another host");
        }
        let out = PreviewOut { t: "v", j: job, o: owner, n: node, d: base64::engine::general_purpose::STANDARD.encode(data) };
        let Ok(text) = serde_json::to_string(&out) else { return };
        if text.len() > MAX_LARGE_NOTICE {
            return tracing::debug!(job_id = job, bytes = text.len(), "a preview too large for another host");
        }
        for host in hosts {
            self.notices.send_to(host, text.clone());
        }
    }

    /// The host at `by` announced what its streams watch: remembered, and
    /// the latest preview of each job it just began watching sent to it.
    pub fn announced(&self, by: &str, jobs: Vec<String>, owners: Vec<String>) {
        let by: Arc<str> = Arc::from(by);
        let watched = jobs.into_iter().map(|j| Watched::Job(Arc::from(j))).chain(owners.into_iter().map(|o| Watched::Owner(Arc::from(o))));
        let new = self.watches.announced(&by, watched);
        if new.is_empty() {
            return;
        }
        let wanted: Vec<(Arc<str>, Latest)> = self
            .latest
            .lock()
            .iter()
            .filter(|(job, l)| new.iter().any(|w| matches!(w, Watched::Job(j) if j == *job) || matches!(w, Watched::Owner(o) if *o == l.owner)))
            .map(|(job, l)| (job.clone(), l.clone()))
            .collect();
        for (job, l) in wanted {
            self.send(&job, &l.owner, &l.node, &l.data, std::slice::from_ref(&by));
        }
    }

    /// A stream here began following job `id`, run by another host.
    pub fn watching_job(&self, id: &str) {
        self.announce(&[id], &[]);
    }

    /// A socket of `owner` opened here (see `ExecBus::watch_owner`).
    pub fn owner_opened(&self, owner: &Arc<str>) {
        if self.watches.owner_opened(owner) {
            self.announce(&[], &[owner.as_ref()]);
        }
    }

    /// A socket of `owner` closed here.
    pub fn owner_closed(&self, owner: &str) {
        self.watches.owner_closed(owner);
    }

    /// Whether a socket of `owner` is open here.
    pub fn owner_here(&self, owner: &str) -> bool {
        self.watches.owner_here(owner)
    }

    /// Tells the other hosts again what the streams here watch (`jobs`
    /// followed, owners' sockets), in notices of at most `MAX_NOTICE`
    /// bytes.
    pub fn renew(&self, jobs: Vec<Arc<str>>) {
        let budget = MAX_NOTICE - 64 - self.notices.address().len();
        for chunk in chunks(jobs, budget) {
            self.announce(&chunk.iter().map(AsRef::as_ref).collect::<Vec<_>>(), &[]);
        }
        for chunk in chunks(self.watches.owners_here(), budget) {
            self.announce(&[], &chunk.iter().map(AsRef::as_ref).collect::<Vec<_>>());
        }
    }

    fn announce(&self, jobs: &[&str], owners: &[&str]) {
        let out = WatchOut { t: "w", h: self.notices.address(), j: jobs.to_vec(), o: owners.to_vec() };
        match serde_json::to_string(&out) {
            Ok(text) => self.notices.send(Topic::Events, text),
            Err(e) => tracing::warn!(error = %e, "cannot encode a notice"),
        }
    }
}

/// `items` in chunks whose lengths add up to at most `budget` bytes each
/// (an item longer than that alone in its chunk).
fn chunks(items: Vec<Arc<str>>, budget: usize) -> Vec<Vec<Arc<str>>> {
    let mut out: Vec<Vec<Arc<str>>> = Vec::new();
    let mut used = 0;
    for item in items {
        let len = item.len() + 3;
        match out.last_mut() {
            Some(last) if used + len <= budget => last.push(item),
            _ => {
                out.push(vec![item]);
                used = 0;
            }
        }
        used += len;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_announcement_holds_for_its_job_or_owner_and_its_host_only() {
        let watches = Watches::default();
        let (job, other, owner) = (Arc::from("j1"), Arc::from("j2"), Arc::from("alice"));
        let (h2, h3): (Arc<str>, Arc<str>) = (Arc::from("h2/1"), Arc::from("h3/1"));
        assert!(watches.wanted_by(&job, &owner).is_empty());
        assert_eq!(watches.announced(&h2, [Watched::Job(job.clone())]), [Watched::Job(job.clone())]);
        assert_eq!(watches.wanted_by(&job, &owner), std::slice::from_ref(&h2));
        assert!(watches.wanted_by(&other, &owner).is_empty());
        assert!(watches.announced(&h2, [Watched::Job(job.clone())]).is_empty(), "a renewal is nothing new");
        watches.announced(&h3, [Watched::Owner(owner.clone())]);
        assert_eq!(watches.wanted_by(&other, &owner), std::slice::from_ref(&h3), "every job of a watched owner");
        assert_eq!(watches.wanted_by(&job, &owner), [h2, h3], "each host once");
        assert!(watches.wanted_by(&other, &Arc::from("bob")).is_empty());
    }

    /// Notices that record what is sent to one host.
    #[derive(Default)]
    struct Recorded(Mutex<Vec<(String, String)>>);

    impl Notices for Recorded {
        fn send(&self, _topic: Topic, _payload: String) {}
        fn subscribe(&self, _topic: Topic) -> tokio::sync::broadcast::Receiver<Arc<str>> {
            tokio::sync::broadcast::channel(1).1
        }
        fn gaps(&self) -> u64 {
            0
        }
        fn listens(&self) -> u64 {
            1
        }
        fn address(&self) -> &str {
            "h1/1"
        }
        fn send_to(&self, address: &str, payload: String) {
            self.0.lock().push((address.to_string(), payload));
        }
        fn subscribe_direct(&self) -> tokio::sync::broadcast::Receiver<Arc<str>> {
            tokio::sync::broadcast::channel(1).1
        }
    }

    fn message(job: &str, body: ExecBody) -> ExecMessage {
        ExecMessage::new(Arc::from(job), Some(Arc::from("alice")), body)
    }

    fn preview(job: &str) -> ExecMessage {
        message(job, ExecBody::Preview { node: "p".into(), content_type: PNG, data: Arc::new(b"\x89PNG".to_vec()) })
    }

    #[test]
    fn a_host_that_begins_watching_gets_the_latest_preview_of_a_running_job() {
        let notices = Arc::new(Recorded::default());
        let previews = Previews::new(notices.clone());
        previews.published(&preview("j1"));
        assert!(notices.0.lock().is_empty(), "watched nowhere: sent nowhere");
        previews.announced("h2/1", vec!["j1".into()], vec![]);
        let sent = std::mem::take(&mut *notices.0.lock());
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0].0, "h2/1");
        assert!(sent[0].1.contains("\"j\":\"j1\"") && sent[0].1.contains("\"n\":\"p\""), "{}", sent[0].1);
        previews.announced("h2/1", vec!["j1".into()], vec![]);
        assert!(notices.0.lock().is_empty(), "a renewal sends nothing again");
        previews.published(&preview("j1"));
        assert_eq!(notices.0.lock().len(), 1, "the next preview goes to the watcher");
        previews.published(&message("j1", ExecBody::Executing { node: None }));
        previews.announced("h3/1", vec![], vec!["alice".into()]);
        assert_eq!(notices.0.lock().len(), 1, "a run that is over has no latest preview");
    }

    #[test]
    fn latest_previews_are_kept_for_a_bounded_number_of_jobs() {
        let previews = Previews::new(Arc::new(Recorded::default()));
        for n in 0..=MAX_LATEST {
            previews.published(&preview(&format!("j{n}")));
        }
        let kept = previews.latest.lock();
        assert_eq!(kept.len(), MAX_LATEST);
        assert!(!kept.contains_key("j0"), "the oldest left");
    }

    #[test]
    fn owners_here_count_their_sockets() {
        let watches = Watches::default();
        let owner: Arc<str> = Arc::from("alice");
        assert!(watches.owner_opened(&owner));
        assert!(!watches.owner_opened(&owner), "a second socket is not the first");
        watches.owner_closed(&owner);
        assert!(watches.owner_here(&owner));
        watches.owner_closed(&owner);
        assert!(!watches.owner_here(&owner) && watches.owners_here().is_empty());
    }

    #[test]
    fn chunks_stay_within_their_budget() {
        let items: Vec<Arc<str>> = (0..100).map(|n| Arc::from(format!("item-{n:04}").as_str())).collect();
        let chunks = chunks(items.clone(), 100);
        assert!(chunks.iter().all(|c| c.iter().map(|i| i.len() + 3).sum::<usize>() <= 100));
        assert_eq!(chunks.concat(), items, "every item once, in order");
    }
}
