//! The bus of hosts sharing a store: this process's [`LocalBus`], with
//! each job event and execution message published here also sent to the
//! other hosts as a notice (`store::cluster::Notices`, topic `Events`), and
//! theirs relayed to this host's subscribers: a WebSocket on any host hears
//! its account's jobs wherever they run, and an event stream on any host
//! follows a job another host runs ([`ExecBus::follow`]).
//!
//! Notices stay small: a status change says only which job changed, and a
//! host with a stream on that job re-reads its record from the store; so
//! does every followed job when notices may have been missed (this host's
//! listening connection lost, or one of its own not sent), and every ten
//! seconds in any case (another host's notice not sent). Previews (images)
//! go only to the hosts where a stream watches their job, each host alone
//! (see `previews`); queue-count messages stay on their host (each host
//! shows every host's count, see `service::queue_counts`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;
use tokio_util::sync::{CancellationToken, DropGuard};

use base64::Engine;

use super::previews::{self, Previews};
use super::{ExecBody, ExecBus, ExecMessage, JobChannel, LocalBus, LocalJobChannel, OwnerWatch};
use crate::service::live::JobEvent;
use crate::store::cluster::{Notices, Topic};
use crate::store::{MetaStore, OutputRecord, ProgressSnapshot};

/// How often the relay checks for a lost listening connection.
const GAP_CHECK: Duration = Duration::from_secs(1);
/// How often followed jobs are re-read whatever was heard: a notice
/// another host could not send (its outbox full) delays a stream's end by
/// this at most.
const RESYNC_EVERY: Duration = Duration::from_secs(10);
/// Events a follower may fall behind by (it then re-syncs from the record).
const FOLLOW_CAPACITY: usize = 32;

/// A notice on the `Events` topic.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "t")]
enum Wire {
    /// Job `j`'s record changed: read it again.
    #[serde(rename = "s")]
    Status { j: String },
    #[serde(rename = "p")]
    Progress { j: String, p: ProgressSnapshot },
    #[serde(rename = "o")]
    Output { j: String, o: OutputRecord },
    #[serde(rename = "m")]
    Message { m: ExecMessage },
    /// Streams on the host at address `h` watch these jobs (`j`) and every
    /// job of these owners (`o`): send it their previews (see `previews`).
    #[serde(rename = "w")]
    Watch {
        h: String,
        #[serde(default)]
        j: Vec<String>,
        #[serde(default)]
        o: Vec<String>,
    },
    /// A preview of job `j` of owner `o`, made by node `n`: a PNG, base64
    /// (sent to this host alone).
    #[serde(rename = "v")]
    Preview { j: String, o: String, n: String, d: String },
}

/// Streams on this host following jobs other hosts run, by store key.
type Followed = Arc<Mutex<HashMap<Arc<str>, broadcast::Sender<JobEvent>>>>;

/// The bus of one host among several.
pub struct SharedBus {
    local: LocalBus,
    notices: Arc<dyn Notices>,
    followed: Followed,
    previews: Arc<Previews>,
    /// Ends the relay when the bus goes.
    _relay: DropGuard,
}

impl SharedBus {
    /// The bus, relaying the other hosts' notices (a task on the current
    /// runtime; it reads records from `meta`).
    pub fn start(notices: Arc<dyn Notices>, meta: Arc<dyn MetaStore>) -> SharedBus {
        let (local, followed, stop) = (LocalBus::default(), Followed::default(), CancellationToken::new());
        let previews = Arc::new(Previews::new(notices.clone()));
        let relay = Relay { tx: local.tx.clone(), followed: followed.clone(), meta, notices: notices.clone(), previews: previews.clone() };
        let heard = (notices.subscribe(Topic::Events), notices.subscribe_direct());
        tokio::spawn(relay.run(heard, stop.clone()));
        SharedBus { local, notices, followed, previews, _relay: stop.drop_guard() }
    }

    fn send(notices: &dyn Notices, wire: &impl Serialize) {
        match serde_json::to_string(wire) {
            Ok(text) => notices.send(Topic::Events, text),
            Err(e) => tracing::warn!(error = %e, "cannot encode a notice"),
        }
    }
}

impl ExecBus for SharedBus {
    fn publish(&self, message: Arc<ExecMessage>) {
        // Queue counts are each host's to make (see `queue_counts`);
        // previews go where a stream watches them.
        match message.body {
            ExecBody::Queue { .. } | ExecBody::Preview { .. } => {}
            _ => SharedBus::send(self.notices.as_ref(), &MessageOut { t: "m", m: &message }),
        }
        self.previews.published(&message);
        self.local.publish(message);
    }

    fn subscribe(&self) -> broadcast::Receiver<Arc<ExecMessage>> {
        self.local.subscribe()
    }

    /// Always: a socket on another host may listen.
    fn watched(&self) -> bool {
        true
    }

    fn job_channel(&self, id: &str) -> Arc<dyn JobChannel> {
        Arc::new(SharedJobChannel {
            local: LocalJobChannel::default(),
            id: id.to_string(),
            notices: self.notices.clone(),
            followed: self.followed.clone(),
            previews: self.previews.clone(),
        })
    }

    fn follow(&self, id: &str) -> Option<broadcast::Receiver<JobEvent>> {
        Some(follow(&self.followed, id))
    }

    fn following(&self, id: &str) {
        self.previews.watching_job(id);
    }

    fn watch_owner(&self, owner: &Arc<str>) -> OwnerWatch {
        self.previews.owner_opened(owner);
        let (previews, owner) = (self.previews.clone(), owner.clone());
        OwnerWatch::new(move || previews.owner_closed(&owner))
    }
}

/// A receiver of job `id`'s events from the host that runs it.
fn follow(followed: &Followed, id: &str) -> broadcast::Receiver<JobEvent> {
    let mut followed = followed.lock();
    // Bounded by the open streams (`max_event_streams`).
    followed.retain(|_, tx| tx.receiver_count() > 0);
    followed.entry(Arc::from(id)).or_insert_with(|| broadcast::channel(FOLLOW_CAPACITY).0).subscribe()
}

/// [`Wire::Message`] as sent, borrowing the message.
#[derive(Serialize)]
struct MessageOut<'a> {
    t: &'static str,
    m: &'a ExecMessage,
}

/// A job's channel on the host that runs it: its streams here, and a
/// notice to the other hosts for each status change, progress snapshot and
/// output.
struct SharedJobChannel {
    local: LocalJobChannel,
    id: String,
    notices: Arc<dyn Notices>,
    /// Streams here that began following the job while another host held
    /// it (this host took it over since): they hear it from here.
    followed: Followed,
    previews: Arc<Previews>,
}

impl JobChannel for SharedJobChannel {
    fn publish(&self, event: JobEvent) {
        let j = self.id.clone();
        let wire = match &event {
            JobEvent::Status(_) => Some(Wire::Status { j }),
            JobEvent::Progress(p) => Some(Wire::Progress { j, p: p.clone() }),
            JobEvent::Output(o) => Some(Wire::Output { j, o: o.clone() }),
            JobEvent::Preview { .. } => None,
        };
        if let Some(wire) = wire {
            SharedBus::send(self.notices.as_ref(), &wire);
        }
        if let Some(tx) = self.followed.lock().get(self.id.as_str()) {
            let _ = tx.send(event.clone());
        }
        self.local.publish(event);
    }

    fn subscribe(&self) -> broadcast::Receiver<JobEvent> {
        self.local.subscribe()
    }

    /// Streams open here (queue positions, which only this host knows, go
    /// to them alone).
    fn watched(&self) -> bool {
        self.local.watched()
    }

    /// The streams open here follow the job where it runs now, until it
    /// ends or they close (noticed at its next event: a re-sync at least
    /// every [`RESYNC_EVERY`]).
    fn moved(&self, now: Option<Arc<crate::store::JobRecord>>) {
        if !self.local.watched() {
            return;
        }
        let mut heard = follow(&self.followed, &self.id);
        self.previews.watching_job(&self.id);
        let streams = self.local.sender();
        if let Some(now) = now {
            let ended = now.status.is_terminal();
            if streams.send(JobEvent::Status(now)).is_err() || ended {
                return;
            }
        }
        tokio::spawn(async move {
            loop {
                let event = match heard.recv().await {
                    Ok(event) => event,
                    // The next status (a re-sync at the latest) catches up.
                    Err(broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(broadcast::error::RecvError::Closed) => return,
                };
                let ended = matches!(&event, JobEvent::Status(rec) if rec.status.is_terminal());
                if streams.send(event).is_err() || ended {
                    return;
                }
            }
        });
    }
}

/// Relays the other hosts' notices to this host's subscribers.
struct Relay {
    tx: broadcast::Sender<Arc<ExecMessage>>,
    followed: Followed,
    meta: Arc<dyn MetaStore>,
    notices: Arc<dyn Notices>,
    previews: Arc<Previews>,
}

impl Relay {
    /// Relays what is `heard` on the `Events` topic and `direct`ly.
    async fn run(self, (mut heard, mut direct): (broadcast::Receiver<Arc<str>>, broadcast::Receiver<Arc<str>>), stop: CancellationToken) {
        let mut gaps = self.notices.gaps();
        let mut check = tokio::time::interval(GAP_CHECK);
        let (mut resynced, mut announced) = (tokio::time::Instant::now(), tokio::time::Instant::now());
        loop {
            let notice = tokio::select! {
                _ = stop.cancelled() => return,
                _ = check.tick() => {
                    if announced.elapsed() >= previews::RENEW {
                        announced = tokio::time::Instant::now();
                        self.previews.renew(self.followed_jobs());
                    }
                    let now = self.notices.gaps();
                    if now != gaps || resynced.elapsed() >= RESYNC_EVERY {
                        gaps = now;
                        resynced = tokio::time::Instant::now();
                        self.resync().await;
                    }
                    continue;
                }
                notice = heard.recv() => notice,
                // Previews only: one missed costs nothing more.
                notice = direct.recv() => match notice {
                    Ok(text) => Ok(text),
                    Err(broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(broadcast::error::RecvError::Closed) => return,
                },
            };
            match notice {
                Ok(text) => self.relay(&text).await,
                Err(broadcast::error::RecvError::Lagged(_)) => self.resync().await,
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    }

    async fn relay(&self, text: &str) {
        let wire: Wire = match serde_json::from_str(text) {
            Ok(wire) => wire,
            Err(e) => return tracing::debug!(error = %e, "an event notice this host cannot read"),
        };
        let (j, event) = match wire {
            Wire::Message { m } => {
                // An error only says no socket listens here.
                let _ = self.tx.send(Arc::new(m));
                return;
            }
            Wire::Watch { h, j, o } => return self.previews.announced(&h, j, o),
            Wire::Preview { j, o, n, d } => return self.relay_preview(j, o, n, &d),
            Wire::Progress { j, p } => (j, JobEvent::Progress(p)),
            Wire::Output { j, o } => (j, JobEvent::Output(o)),
            Wire::Status { j } => {
                if !self.follows(&j) {
                    return;
                }
                match self.meta.get_job(&j).await {
                    Ok(Some(record)) => (j, JobEvent::Status(Arc::new(record))),
                    Ok(None) => return,
                    Err(e) => return tracing::warn!(job_id = %j, error = %e, "cannot read a job another host changed"),
                }
            }
        };
        if let Some(tx) = self.followed.lock().get(j.as_str()) {
            let _ = tx.send(event);
        }
    }

    /// Another host's preview, to the streams here that watch its job.
    fn relay_preview(&self, j: String, o: String, node: String, data: &str) {
        let (to_sockets, to_streams) = (self.previews.owner_here(&o), self.follows(&j));
        if !to_sockets && !to_streams {
            return;
        }
        let Ok(data) = base64::engine::general_purpose::STANDARD.decode(data) else {
            return tracing::debug!(job_id = %j, "a preview notice this host cannot read");
        };
        let data = Arc::new(data);
        if to_streams && let Some(tx) = self.followed.lock().get(j.as_str()) {
            let _ = tx.send(JobEvent::Preview { node_id: node.clone(), content_type: previews::PNG.into(), data: data.clone() });
        }
        if to_sockets {
            let body = ExecBody::Preview { node, content_type: previews::PNG, data };
            let _ = self.tx.send(Arc::new(ExecMessage::new(Arc::from(j), Some(Arc::from(o)), body)));
        }
    }

    /// The jobs streams here follow.
    fn followed_jobs(&self) -> Vec<Arc<str>> {
        self.followed.lock().iter().filter(|(_, tx)| tx.receiver_count() > 0).map(|(id, _)| id.clone()).collect()
    }

    fn follows(&self, id: &str) -> bool {
        self.followed.lock().get(id).is_some_and(|tx| tx.receiver_count() > 0)
    }

    /// Notices may have been missed: every followed job's record again.
    async fn resync(&self) {
        let ids: Vec<Arc<str>> = {
            let mut followed = self.followed.lock();
            followed.retain(|_, tx| tx.receiver_count() > 0);
            followed.keys().cloned().collect()
        };
        for id in ids {
            if let Ok(Some(record)) = self.meta.get_job(&id).await
                && let Some(tx) = self.followed.lock().get(&id)
            {
                let _ = tx.send(JobEvent::Status(Arc::new(record)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;
    use crate::store::{JobRecord, JobStatus};

    /// Notices of one host alone: nothing is heard but what the test sends,
    /// and the gaps are the test's to count.
    #[derive(Default)]
    struct Silent {
        gaps: AtomicU64,
        heard: std::sync::OnceLock<broadcast::Sender<Arc<str>>>,
        direct: std::sync::OnceLock<broadcast::Sender<Arc<str>>>,
    }

    impl Notices for Silent {
        fn send(&self, _topic: Topic, _payload: String) {}
        fn subscribe(&self, _topic: Topic) -> broadcast::Receiver<Arc<str>> {
            self.heard.get_or_init(|| broadcast::channel(8).0).subscribe()
        }
        fn gaps(&self) -> u64 {
            self.gaps.load(Ordering::SeqCst)
        }
        fn listens(&self) -> u64 {
            1
        }
        fn address(&self) -> &str {
            "h1/1"
        }
        fn send_to(&self, _address: &str, _payload: String) {}
        fn subscribe_direct(&self) -> broadcast::Receiver<Arc<str>> {
            // (Kept open: a closed channel ends the relay.)
            self.direct.get_or_init(|| broadcast::channel(1).0).subscribe()
        }
    }

    /// A stream following a job another host runs, whose end's notice this
    /// host missed (its listening connection was lost meanwhile): once the
    /// gap is counted, the relay reads the job again and the stream hears
    /// the end within a gap check, not the ten seconds of the routine
    /// re-read. A status notice heard is read at once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stream_whose_notice_was_missed_hears_the_end_after_the_gap() {
        let dir = tempfile::tempdir().unwrap();
        let meta: Arc<dyn MetaStore> = Arc::new(crate::store::SledMeta::open(&dir.path().join("meta")).unwrap());
        let notices = Arc::new(Silent::default());
        let bus = SharedBus::start(notices.clone(), meta.clone());
        let mut job = JobRecord::queued_for_test("j1", 1, 1);
        meta.put_job(&job).await.unwrap();
        let mut stream = bus.follow("j1").unwrap();
        // Another host runs it to its end; its notices never arrive here.
        job.transition(JobStatus::Running, 2).unwrap();
        job.transition(JobStatus::Succeeded, 3).unwrap();
        meta.put_job(&job).await.unwrap();
        let wait = 2 * GAP_CHECK + Duration::from_millis(500);
        let quiet = tokio::time::timeout(wait, stream.recv()).await;
        assert!(quiet.is_err(), "nothing is re-read before a gap (or the routine re-read): {quiet:?}");
        notices.gaps.fetch_add(1, Ordering::SeqCst);
        match tokio::time::timeout(wait, stream.recv()).await {
            Ok(Ok(JobEvent::Status(record))) => assert_eq!(record.status, JobStatus::Succeeded),
            other => panic!("the end, re-read after the gap: {other:?}"),
        }
        let mut other = JobRecord::queued_for_test("j2", 1, 2);
        meta.put_job(&other).await.unwrap();
        let mut second = bus.follow("j2").unwrap();
        other.transition(JobStatus::Canceled, 4).unwrap();
        meta.put_job(&other).await.unwrap();
        let _ = notices.heard.get().unwrap().send(Arc::from(r#"{"t":"s","j":"j2"}"#));
        match tokio::time::timeout(Duration::from_millis(800), second.recv()).await {
            Ok(Ok(JobEvent::Status(record))) => assert_eq!(record.status, JobStatus::Canceled),
            other => panic!("the notice's re-read: {other:?}"),
        }
    }
}
