//! [`Notices`] on PostgreSQL's LISTEN/NOTIFY: one listening connection per
//! host (re-established when lost, each loss counted as a gap) and one
//! sender task that batches what is queued into one `pg_notify` statement.
//! A notice is `<sender's holder>\n<payload>`; a host ignores its own. A
//! payload over NOTIFY's size is written to `notice_bodies` and the notice
//! carries [`STORED`] and the row's id instead; its receivers read it there.
//! Besides the topics' channels each host listens on a channel of its own
//! ([`direct_channel`]), for what only it wants (`Notices::send_to`).

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
/// The same for large notices to one host (`Notices::send_to`, lossy): a
/// budget of their own, so they never crowd out the topics' notices.
const LARGE_DIRECT_BYTES: usize = 4 << 20;
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
        Topic::Plugins => "kiln_plugins",
    }
}

/// The channel of the host whose holder id is `holder` (a hash of it: a
/// valid channel name whatever the id holds).
fn direct_channel(holder: &str) -> String {
    format!("kiln_to_{}", &blake3::hash(holder.as_bytes()).to_hex()[..24])
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
    /// Bytes of stored notices queued, on topics (see
    /// [`LARGE_OUTBOX_BYTES`]) and to one host ([`LARGE_DIRECT_BYTES`]).
    large_queued: Arc<AtomicUsize>,
    large_direct: Arc<AtomicUsize>,
}

/// A notice queued to be sent: its channel and `<sender>\n<payload>`, or
/// (`large`) the payload alone, which goes through `notice_bodies`.
struct Outgoing {
    channel: std::borrow::Cow<'static, str>,
    text: String,
    large: bool,
    /// Counted against the budget of notices to one host.
    direct: bool,
}

/// Where the notices of each topic, and those to this host alone, are
/// handed to this host's subscribers.
#[derive(Clone)]
struct Inboxes {
    topics: [broadcast::Sender<Arc<str>>; Topic::ALL.len()],
    direct: broadcast::Sender<Arc<str>>,
    /// This host's own channel.
    direct_channel: Arc<str>,
}

impl Inboxes {
    fn new(me: &str) -> Inboxes {
        Inboxes { topics: std::array::from_fn(|_| broadcast::channel(INBOX).0), direct: broadcast::channel(INBOX).0, direct_channel: direct_channel(me).into() }
    }

    fn of(&self, topic: Topic) -> &broadcast::Sender<Arc<str>> {
        &self.topics[topic as usize]
    }

    /// The inbox of what is sent on `channel`.
    fn on(&self, channel: &str) -> Option<&broadcast::Sender<Arc<str>>> {
        if channel == &*self.direct_channel {
            return Some(&self.direct);
        }
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
        let me: Arc<str> = Arc::from(db.holder());
        let notices = PgNotices { inboxes: Inboxes::new(&me), me, outbox, counts: Counts::default(), _db: db.clone() };
        let handle = db.runtime.handle()?;
        handle.spawn(send(db.pool.clone(), notices.me.clone(), queued, notices.counts.clone()));
        handle.spawn(listen(db.pool.clone(), notices.me.clone(), notices.inboxes.clone(), notices.counts.clone()));
        Ok(notices)
    }
}

impl PgNotices {
    /// Queues `payload` on `channel` (`direct`: to one host); why not when
    /// it is not.
    fn queue(&self, channel: std::borrow::Cow<'static, str>, payload: String, direct: bool) -> Result<(), &'static str> {
        let (len, large) = (payload.len(), payload.len() > MAX_NOTICE);
        if len > MAX_LARGE_NOTICE {
            return Err("too large to send");
        }
        let (queued, cap) = self.counts.budget(direct);
        if large && queued.fetch_add(len, Ordering::SeqCst) + len > cap {
            queued.fetch_sub(len, Ordering::SeqCst);
            return Err("the outbox of large notices is full");
        }
        let text = if large { payload } else { format!("{}\n{payload}", self.me) };
        if self.outbox.try_send(Outgoing { channel, text, large, direct }).is_err() {
            if large {
                queued.fetch_sub(len, Ordering::SeqCst);
            }
            return Err("the notice outbox is full");
        }
        Ok(())
    }
}

impl Counts {
    /// The bytes queued of large notices on topics or (`direct`) to one
    /// host, and their bound.
    fn budget(&self, direct: bool) -> (&AtomicUsize, usize) {
        if direct { (&self.large_direct, LARGE_DIRECT_BYTES) } else { (&self.large_queued, LARGE_OUTBOX_BYTES) }
    }
}

impl Notices for PgNotices {
    fn send(&self, topic: Topic, payload: String) {
        if let Err(why) = self.queue(channel(topic).into(), payload, false) {
            // A notice not sent counts as one missed: streams re-read their jobs.
            tracing::warn!("{why}: a notice was dropped");
            self.counts.gaps.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn address(&self) -> &str {
        &self.me
    }

    fn send_to(&self, address: &str, payload: String) {
        if let Err(why) = self.queue(direct_channel(address).into(), payload, true) {
            tracing::debug!(to = address, "{why}: a notice to one host was dropped");
        }
    }

    fn subscribe_direct(&self) -> broadcast::Receiver<Arc<str>> {
        self.inboxes.direct.subscribe()
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

/// Sends what is queued in order, runs of small notices a statement each
/// (a stored notice in a transaction of its own), until the pool closes.
async fn send(pool: PgPool, me: Arc<str>, mut queued: mpsc::Receiver<Outgoing>, counts: Counts) {
    let mut run: Vec<Outgoing> = Vec::new();
    while let Some(first) = queued.recv().await {
        let mut next = Some(first);
        while let Some(notice) = next.take() {
            if notice.large {
                // What was queued before it goes first.
                if !send_inline(&pool, std::mem::take(&mut run)).await {
                    return;
                }
                let (len, direct) = (notice.text.len(), notice.direct);
                let sent = send_stored(&pool, &me, notice).await;
                counts.budget(direct).0.fetch_sub(len, Ordering::SeqCst);
                match sent {
                    Ok(()) => {}
                    Err(_) if pool.is_closed() => return,
                    Err(e) => tracing::warn!(error = %e, bytes = len, "cannot send a large notice"),
                }
            } else {
                run.push(notice);
            }
            if run.len() < BATCH {
                next = queued.try_recv().ok();
            }
        }
        if !send_inline(&pool, std::mem::take(&mut run)).await {
            return;
        }
    }
}

/// Sends `notices` (small ones) in one statement, in order; `false` once
/// the pool is closed.
async fn send_inline(pool: &PgPool, notices: Vec<Outgoing>) -> bool {
    if notices.is_empty() {
        return true;
    }
    let (channels, payloads): (Vec<String>, Vec<String>) = notices.into_iter().map(|n| (n.channel.into_owned(), n.text)).unzip();
    let sent = sqlx::query("SELECT pg_notify(c, p) FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS t(c, p, n) ORDER BY n")
        .bind(&channels)
        .bind(&payloads)
        .execute(pool)
        .await;
    match sent {
        Ok(_) => true,
        Err(_) if pool.is_closed() => false,
        Err(e) => {
            tracing::warn!(error = %backend(e), dropped = payloads.len(), "cannot send notices");
            true
        }
    }
}

/// Stores a large notice's payload and notifies its row, in one
/// transaction (heard only once the row is there); bodies older than
/// [`STORED_KEPT`] go.
async fn send_stored(pool: &PgPool, me: &str, notice: Outgoing) -> Result<(), StoreError> {
    in_transaction!(pool, |tx| {
        let kept = i64::try_from(STORED_KEPT.as_micros()).unwrap_or(i64::MAX);
        sqlx::query(&format!("DELETE FROM notice_bodies WHERE sent_at < {DB_NOW} - $1")).bind(kept).execute(&mut *tx).await.map_err(backend)?;
        let (id,): (i64,) = sqlx::query_as(&format!("INSERT INTO notice_bodies (body, sent_at) VALUES ($1, {DB_NOW}) RETURNING id"))
            .bind(&notice.text)
            .fetch_one(&mut *tx)
            .await
            .map_err(backend)?;
        sqlx::query("SELECT pg_notify($1, $2)").bind(notice.channel.as_ref()).bind(format!("{me}\n{STORED}{id}")).execute(&mut *tx).await.map_err(backend)?;
        Ok(())
    })
}

/// Receives the other hosts' notices until the pool closes. Each time it
/// starts listening (at first, and again after a lost connection: what was
/// sent meanwhile is missed) it counts one listen and one gap, once it
/// listens, so a re-read that follows sees everything from then on.
async fn listen(pool: PgPool, me: Arc<str>, inboxes: Inboxes, counts: Counts) {
    loop {
        let connected = async {
            let mut listener = PgListener::connect_with(&pool).await?;
            listener.listen_all(Topic::ALL.map(channel).into_iter().chain([&*inboxes.direct_channel])).await?;
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
