//! [`Notices`] on PostgreSQL's LISTEN/NOTIFY: one listening connection per
//! host (re-established when lost, each loss counted as a gap) and one
//! sender task that batches what is queued into one `pg_notify` statement.
//! A notice is `<sender's holder>\n<payload>`; a host ignores its own.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sqlx::postgres::{PgListener, PgPool};
use tokio::sync::{broadcast, mpsc};

use super::{PgDatabase, backend};
use crate::store::StoreError;
use crate::store::cluster::{MAX_NOTICE, Notices, Topic};

/// Notices waiting to be sent at most; past it new ones are dropped.
const OUTBOX: usize = 8192;
/// Notices sent in one statement at most.
const BATCH: usize = 256;
/// Received notices a slow subscriber may fall behind by.
const INBOX: usize = 4096;

/// The channel a topic's notices go out on (a store write that must be
/// heard sends on it in its own transaction: heard only if committed).
pub(super) fn channel(topic: Topic) -> &'static str {
    match topic {
        Topic::Control => "kiln_control",
        Topic::Events => "kiln_events",
        Topic::Accounts => "kiln_accounts",
        Topic::Deployments => "kiln_deployments",
        Topic::Queues => "kiln_queues",
    }
}

/// Announces `payload` on `topic` from `sender` (this host's holder id)
/// when the transaction `exec` is in commits: heard only if it does, and
/// never dropped by an outbox.
pub(super) async fn announce<'e>(exec: impl sqlx::PgExecutor<'e>, topic: Topic, sender: &str, payload: &str) -> Result<(), StoreError> {
    sqlx::query("SELECT pg_notify($1, $2)").bind(channel(topic)).bind(format!("{sender}\n{payload}")).execute(exec).await.map_err(backend)?;
    Ok(())
}

/// What [`Notices::gaps`] and [`Notices::listens`] count.
#[derive(Clone, Default)]
struct Counts {
    gaps: Arc<AtomicU64>,
    listens: Arc<AtomicU64>,
}

/// Where the notices of each topic are handed to this host's subscribers.
#[derive(Clone)]
struct Inboxes([broadcast::Sender<Arc<str>>; Topic::ALL.len()]);

impl Inboxes {
    fn new() -> Inboxes {
        Inboxes(std::array::from_fn(|_| broadcast::channel(INBOX).0))
    }

    fn of(&self, topic: Topic) -> &broadcast::Sender<Arc<str>> {
        &self.0[topic as usize]
    }

    /// The inbox of the topic sent on `channel`.
    fn on(&self, channel: &str) -> Option<&broadcast::Sender<Arc<str>>> {
        Topic::ALL.into_iter().find(|t| self::channel(*t) == channel).map(|t| self.of(t))
    }
}

/// This host's notices.
pub struct PgNotices {
    me: Arc<str>,
    outbox: mpsc::Sender<(&'static str, String)>,
    inboxes: Inboxes,
    counts: Counts,
    /// Keeps the database's runtime, where the tasks run, going.
    _db: PgDatabase,
}

impl PgNotices {
    /// Starts listening and sending on `db`'s runtime (the tasks end when
    /// its pool closes).
    pub fn start(db: &PgDatabase) -> Result<PgNotices, StoreError> {
        let (outbox, queued) = mpsc::channel(OUTBOX);
        let notices = PgNotices { me: Arc::from(db.holder()), outbox, inboxes: Inboxes::new(), counts: Counts::default(), _db: db.clone() };
        let handle = db.runtime.handle()?;
        handle.spawn(send(db.pool.clone(), queued));
        handle.spawn(listen(db.pool.clone(), notices.me.clone(), notices.inboxes.clone(), notices.counts.clone()));
        Ok(notices)
    }
}

impl Notices for PgNotices {
    fn send(&self, topic: Topic, payload: String) {
        // A notice not sent counts as one missed: streams re-read their jobs.
        if payload.len() > MAX_NOTICE {
            tracing::warn!(bytes = payload.len(), "a notice too large to send was dropped");
            self.counts.gaps.fetch_add(1, Ordering::SeqCst);
            return;
        }
        if self.outbox.try_send((channel(topic), format!("{}\n{payload}", self.me))).is_err() {
            tracing::warn!("the notice outbox is full: a notice was dropped");
            self.counts.gaps.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn subscribe(&self, topic: Topic) -> broadcast::Receiver<Arc<str>> {
        self.inboxes.of(topic).subscribe()
    }

    fn gaps(&self) -> u64 {
        self.counts.gaps.load(Ordering::SeqCst)
    }

    fn listens(&self) -> u64 {
        self.counts.listens.load(Ordering::SeqCst)
    }
}

/// Sends what is queued, a batch per statement, until the pool closes.
async fn send(pool: PgPool, mut queued: mpsc::Receiver<(&'static str, String)>) {
    while let Some(first) = queued.recv().await {
        let mut batch = vec![first];
        while batch.len() < BATCH {
            match queued.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        let (channels, payloads): (Vec<&str>, Vec<String>) = batch.into_iter().unzip();
        let sent = sqlx::query("SELECT pg_notify(c, p) FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS t(c, p, n) ORDER BY n")
            .bind(&channels)
            .bind(&payloads)
            .execute(&pool)
            .await;
        match sent {
            Ok(_) => {}
            Err(_) if pool.is_closed() => return,
            Err(e) => tracing::warn!(error = %backend(e), dropped = payloads.len(), "cannot send notices"),
        }
    }
}

/// Receives the other hosts' notices until the pool closes. Each time it
/// starts listening (at first, and again after a lost connection: what was
/// sent meanwhile is missed) it counts one listen and one gap, once it
/// listens, so a re-read that follows sees everything from then on.
async fn listen(pool: PgPool, me: Arc<str>, inboxes: Inboxes, counts: Counts) {
    loop {
        let connected = async {
            let mut listener = PgListener::connect_with(&pool).await?;
            listener.listen_all(Topic::ALL.map(channel)).await?;
            Ok::<_, sqlx::Error>(listener)
        };
        let mut listener = match connected.await {
            Ok(listener) => listener,
            Err(_) if pool.is_closed() => return,
            Err(e) => {
                tracing::warn!(error = %backend(e), "cannot listen for other hosts' notices; trying again");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        counts.listens.fetch_add(1, Ordering::SeqCst);
        counts.gaps.fetch_add(1, Ordering::SeqCst);
        loop {
            match listener.try_recv().await {
                Ok(Some(notice)) => {
                    let Some((from, payload)) = notice.payload().split_once('\n') else { continue };
                    if from == &*me {
                        continue;
                    }
                    // An error only says no one subscribes.
                    if let Some(to) = inboxes.on(notice.channel()) {
                        let _ = to.send(Arc::from(payload));
                    }
                }
                // The connection was lost: listen again on a new one.
                Ok(None) => break,
                Err(_) if pool.is_closed() => return,
                Err(e) => {
                    tracing::warn!(error = %backend(e), "lost the connection that hears other hosts; reconnecting");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    break;
                }
            }
        }
    }
}
