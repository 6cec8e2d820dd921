//! [`Notices`] on PostgreSQL's LISTEN/NOTIFY: one listening connection per
//! host (re-established when lost, each loss counted as a gap) and one
//! sender task that batches what is queued into one `pg_notify` statement.
//! A notice is `<sender's holder>\n<payload>`; a host ignores its own. A
//! payload over NOTIFY's size is written to `notice_bodies` and the notice
//! carries [`STORED`] and the row's id instead; its receivers read it there.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use sqlx::postgres::{PgListener, PgPool};
use tokio::sync::{broadcast, mpsc};

use super::{DB_NOW, PgDatabase, backend};
use crate::store::StoreError;
use crate::store::cluster::{MAX_LARGE_NOTICE, MAX_NOTICE, Notices, Topic};

/// Notices waiting to be sent at most; past it new ones are dropped.
const OUTBOX: usize = 8192;
/// Notices sent in one statement at most.
const BATCH: usize = 256;
/// Received notices a slow subscriber may fall behind by.
const INBOX: usize = 4096;
/// Bytes of stored (large) notices waiting to be sent at most; past it new
/// ones are dropped.
const LARGE_OUTBOX_BYTES: usize = 16 << 20;
/// How long a stored notice's body is kept (its receivers read it at once).
const STORED_KEPT: Duration = Duration::from_secs(60);
/// What a payload stored in `notice_bodies` starts with (then its row's
/// id); no payload sent inline does (they are JSON or ids).
const STORED: char = '\u{1}';

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
    /// Bytes of stored notices queued (see [`LARGE_OUTBOX_BYTES`]).
    large_queued: Arc<AtomicUsize>,
}

/// A notice queued to be sent: its channel and `<sender>\n<payload>`, or
/// (`large`) the payload alone, which goes through `notice_bodies`.
struct Outgoing {
    channel: &'static str,
    text: String,
    large: bool,
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
    outbox: mpsc::Sender<Outgoing>,
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
        handle.spawn(send(db.pool.clone(), notices.me.clone(), queued, notices.counts.clone()));
        handle.spawn(listen(db.pool.clone(), notices.me.clone(), notices.inboxes.clone(), notices.counts.clone()));
        Ok(notices)
    }
}

impl Notices for PgNotices {
    fn send(&self, topic: Topic, payload: String) {
        // A notice not sent counts as one missed: streams re-read their jobs.
        let dropped = |why: &str| {
            tracing::warn!(bytes = payload.len(), "{why}: a notice was dropped");
            self.counts.gaps.fetch_add(1, Ordering::SeqCst);
        };
        let large = payload.len() > MAX_NOTICE;
        if payload.len() > MAX_LARGE_NOTICE {
            return dropped("too large to send");
        }
        if large && self.counts.large_queued.fetch_add(payload.len(), Ordering::SeqCst) + payload.len() > LARGE_OUTBOX_BYTES {
            self.counts.large_queued.fetch_sub(payload.len(), Ordering::SeqCst);
            return dropped("the outbox of large notices is full");
        }
        let len = payload.len();
        let text = if large { payload } else { format!("{}\n{payload}", self.me) };
        if self.outbox.try_send(Outgoing { channel: channel(topic), text, large }).is_err() {
            if large {
                self.counts.large_queued.fetch_sub(len, Ordering::SeqCst);
            }
            tracing::warn!(bytes = len, "the notice outbox is full: a notice was dropped");
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

/// Sends what is queued, a batch per statement (a stored notice in a
/// transaction of its own), until the pool closes.
async fn send(pool: PgPool, me: Arc<str>, mut queued: mpsc::Receiver<Outgoing>, counts: Counts) {
    while let Some(first) = queued.recv().await {
        let mut batch = vec![first];
        while batch.len() < BATCH {
            match queued.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        let (large, inline): (Vec<Outgoing>, Vec<Outgoing>) = batch.into_iter().partition(|n| n.large);
        let (channels, payloads): (Vec<&str>, Vec<String>) = inline.into_iter().map(|n| (n.channel, n.text)).unzip();
        if !payloads.is_empty() {
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
        for notice in large {
            let len = notice.text.len();
            let sent = send_stored(&pool, &me, notice).await;
            counts.large_queued.fetch_sub(len, Ordering::SeqCst);
            match sent {
                Ok(()) => {}
                Err(_) if pool.is_closed() => return,
                Err(e) => tracing::warn!(error = %e, bytes = len, "cannot send a large notice"),
            }
        }
    }
}

/// Stores a large notice's payload and notifies its row, in one
/// transaction (heard only once the row is there); bodies older than
/// [`STORED_KEPT`] go.
async fn send_stored(pool: &PgPool, me: &str, notice: Outgoing) -> Result<(), StoreError> {
    let mut tx = pool.begin().await.map_err(backend)?;
    let kept = i64::try_from(STORED_KEPT.as_micros()).unwrap_or(i64::MAX);
    sqlx::query(&format!("DELETE FROM notice_bodies WHERE sent_at < {DB_NOW} - $1")).bind(kept).execute(&mut *tx).await.map_err(backend)?;
    let (id,): (i64,) = sqlx::query_as(&format!("INSERT INTO notice_bodies (body, sent_at) VALUES ($1, {DB_NOW}) RETURNING id"))
        .bind(&notice.text)
        .fetch_one(&mut *tx)
        .await
        .map_err(backend)?;
    sqlx::query("SELECT pg_notify($1, $2)").bind(notice.channel).bind(format!("{me}\n{STORED}{id}")).execute(&mut *tx).await.map_err(backend)?;
    tx.commit().await.map_err(backend)
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
                    let Some(to) = inboxes.on(notice.channel()) else { continue };
                    let payload = match payload.strip_prefix(STORED) {
                        None => Arc::from(payload),
                        Some(id) => match stored(&pool, id).await {
                            Some(body) => body,
                            None => {
                                counts.gaps.fetch_add(1, Ordering::SeqCst);
                                continue;
                            }
                        },
                    };
                    // An error only says no one subscribes.
                    let _ = to.send(payload);
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

/// The body of stored notice `id`; `None` (a notice missed) when it cannot
/// be read.
async fn stored(pool: &PgPool, id: &str) -> Option<Arc<str>> {
    let id: i64 = id.parse().ok()?;
    match sqlx::query_scalar::<_, String>("SELECT body FROM notice_bodies WHERE id = $1").bind(id).fetch_optional(pool).await {
        Ok(body) => body.map(Arc::from),
        Err(e) => {
            tracing::warn!(error = %backend(e), "cannot read a large notice: counted as missed");
            None
        }
    }
}
