//! What hosts sharing one store coordinate through: each host's lease on
//! the unfinished jobs it holds ([`HostLeases`]), small notices every
//! host hears ([`Notices`]), the numbers they hand out ([`SharedNumbers`])
//! and the plugins installed into all of them ([`SharedPlugins`]).
//! The embedded store has none of these: one process holds every job and
//! counts alone.
//!
//! The lease is per host, not per job: a heartbeat renews one row however
//! many jobs the host holds. A job names its holder; a host whose lease
//! lapsed is ended by the next host that looks, which takes its jobs in
//! the same transaction, and from then on the lapsed host's writes to
//! those jobs are refused ([`StoreError::Fenced`]): the holder it names no
//! longer holds them.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast;

use super::{JobRecord, StoreError};

/// This host's lease on the jobs it holds, and the jobs of hosts whose
/// lease lapsed.
#[async_trait::async_trait]
pub trait HostLeases: Send + Sync {
    /// This start of this host: `<host_id>/<nonce>` (a restart is a new
    /// holder, so a host never mistakes its dead self's jobs for its own).
    fn holder(&self) -> &str;
    /// Registers this holder with a lease of `lease` (from the store's
    /// clock, so hosts' clocks need not agree), ending the earlier starts
    /// of the same host id (one process per host id): a restarted host
    /// takes its own jobs back at once rather than after their lease.
    async fn register(&self, lease: Duration) -> Result<(), StoreError>;
    /// Extends the lease to `lease` from now; [`StoreError::Fenced`] when
    /// it lapsed and another host ended it.
    async fn renew(&self, lease: Duration) -> Result<(), StoreError>;
    /// Ends the hosts whose lease lapsed, and takes up to `limit` of the
    /// unfinished jobs no registered host holds (theirs, and any held by
    /// none) that `here` can run, oldest first: their records, now held by
    /// this host. Two hosts looking at once never take the same job. The
    /// others are left for a host that has their components, and counted.
    async fn adopt(&self, limit: usize, here: &Runnable) -> Result<Adopted, StoreError>;
    /// Takes jobs queued on other registered hosts, as `want` says (for
    /// idle workers, or turns for keys queued only elsewhere), of those
    /// held there for at least `waited` (by the store's clock; a job taken
    /// moves on no sooner; [`QUEUED_BEFORE_TAKEN`]) and
    /// [`JobRecord::movable`], that `here` can run: never one whose start
    /// its key's running limit refused, one asked to be canceled or past
    /// its expiry; the oldest of each scheduling key in turn. Their
    /// records, held by this host now; each former holder is told (a
    /// [`Topic::Control`] notice naming it) and its late start of one is
    /// refused ([`StoreError::Fenced`]).
    async fn take_queued(&self, want: TakeFor<'_>, here: &Runnable, waited: Duration) -> Result<Taken, StoreError>;
    /// Of the jobs `ids` this host has queued, those another host holds
    /// now ([`HostLeases::take_queued`]; one not written yet is not).
    async fn taken_away(&self, ids: &[String]) -> Result<Vec<String>, StoreError>;
    /// Asks the holder of the unfinished job stored under `id` to cancel it
    /// (durably: a holder that misses the notice finds the request at its
    /// next heartbeat, a host that takes the job over finds it too).
    /// `false` when the job is not unfinished.
    async fn request_cancel(&self, id: &str) -> Result<bool, StoreError>;
    /// The jobs this host holds, queued or running, that another host asked
    /// to cancel.
    async fn cancel_requests(&self) -> Result<Vec<String>, StoreError>;
    /// Ends this holder's lease (a clean stop): the other hosts take its
    /// jobs at their next look rather than after the lease.
    async fn release(&self) -> Result<(), StoreError>;
}

/// What a host can run, asked before it takes a job over: a job runs
/// on the very components it was validated against when submitted
/// ([`JobRecord::takeover_needs`]), so a host with another plugin set
/// leaves it to one that has them (for [`Runnable::wait`] at most).
#[derive(Clone)]
pub struct Runnable {
    /// `blake3:<hex>` of every component this host has (a first filter, in
    /// the store: a job needing another is never read).
    pub hashes: Vec<String>,
    /// Whether this host has this job's components where the job would
    /// run (its owner's plugins: a hash held for another account is not
    /// this one's).
    pub job: Arc<dyn Fn(&JobRecord) -> bool + Send + Sync>,
    /// How long a job waits for a host with its components. After that
    /// (every host upgraded, or the only hosts with them gone), any host
    /// takes it and validates it again against its own plugins, as one
    /// host does after an upgrade. A job an earlier start of this host
    /// held, or one asked to be canceled or past its expiry, is taken at
    /// once whatever it needs.
    pub wait: std::time::Duration,
}

/// What a look for jobs queued on other hosts takes
/// ([`HostLeases::take_queued`]).
#[derive(Debug, Clone, Copy)]
pub enum TakeFor<'a> {
    /// Jobs for this many idle workers.
    Idle(usize),
    /// Turns in this host's round-robin for keys whose jobs wait only
    /// elsewhere, so a key flooding one host is served by all of them
    /// alongside the keys queued everywhere: one job of each such key (at
    /// most `keys` of them), never of a key in `queued_here` (it has its
    /// turns here already) nor a key's last job on its host (that host
    /// serves it in its own turn; taking it would only move it back and
    /// forth).
    Turns { keys: usize, queued_here: &'a [String] },
}

/// One look for jobs queued on other hosts.
#[derive(Debug, Default)]
pub struct Taken {
    /// The jobs taken: this host's now.
    pub jobs: Vec<JobRecord>,
    /// When a job not taken because it had not waited long enough on its
    /// host may be (the soonest), if any.
    pub next_in: Option<Duration>,
}

/// One look for jobs to take over.
#[derive(Debug, Default)]
pub struct Adopted {
    /// The jobs taken: this host's now.
    pub jobs: Vec<JobRecord>,
    /// Those of them taken to be ended, never run, and how: `Canceled` (a
    /// client asked to cancel it) or `Expired` (past its expiry by the
    /// store's clock, which the hosts' clocks need not agree with).
    pub ends: std::collections::HashMap<String, super::JobStatus>,
    /// Jobs no host holds that this one lacks the components of (counted
    /// up to [`LEFT_COUNTED`]): they wait for a host that has them, for
    /// [`Runnable::wait`] at most.
    pub left: usize,
}

/// How long a job waits queued on its host before an idle host may take it
/// ([`HostLeases::take_queued`]): a host with a free worker starts its own
/// jobs, and those it just took, well within this.
pub const QUEUED_BEFORE_TAKEN: Duration = Duration::from_millis(100);

/// The most jobs left behind one look counts.
pub const LEFT_COUNTED: usize = 10_000;

/// The notice streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Topic {
    /// Coordination between hosts: a cancel request, or a queued job taken
    /// by an idle host, names the holder it concerns.
    Control,
    /// Job events and execution messages, for streams on other hosts.
    Events,
    /// The id of an account another host changed (its record re-read).
    Accounts,
    /// The id of a deployment another host changed.
    Deployments,
    /// The owner whose queue (jobs queued or running) changed on another
    /// host (ComfyUI's `queue_remaining`).
    Queues,
    /// The scope (see [`SharedPlugin::scope`]) whose installed plugins
    /// another host changed.
    Plugins,
}

impl Topic {
    pub const ALL: [Topic; 6] = [Topic::Control, Topic::Events, Topic::Accounts, Topic::Deployments, Topic::Queues, Topic::Plugins];
}

/// The scope of the plugins an operator installs for every caller.
pub const OPERATOR_SCOPE: &str = "";

/// A plugin installed through one host for every host sharing the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedPlugin {
    /// Whose it is: [`OPERATOR_SCOPE`] (every caller's), else the id of
    /// the account it belongs to.
    pub scope: String,
    pub name: String,
    /// Its manifest's text, as installed.
    pub manifest: String,
    /// Its component's blake3 hash (64 hex digits); the bytes are
    /// [`SharedPlugins::component`].
    pub component: String,
}

impl SharedPlugin {
    /// What a host compares with what it installed: the manifest's text
    /// and the component, together.
    pub fn revision(&self) -> String {
        format!("{}.{}", &blake3::hash(self.manifest.as_bytes()).to_hex()[..32], self.component)
    }
}

/// How [`SharedPlugins::publish`] writes a plugin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Publish {
    /// Only while the scope holds fewer other plugins than this.
    pub limit: Option<usize>,
    /// Replacing the scope's plugin of that name (an install); else only
    /// where the scope has none (a copy of one kept elsewhere).
    pub replace: bool,
}

/// What [`SharedPlugins::publish`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Published {
    Done,
    /// Nothing written: the scope holds its limit of other plugins.
    Full,
    /// Nothing written: the scope has a plugin of that name, kept.
    Present,
}

/// The plugins installed into every host sharing the store. Each write is
/// announced on [`Topic::Plugins`] in its own transaction; each host
/// compiles and checks what it follows on its own.
#[async_trait::async_trait]
pub trait SharedPlugins: Send + Sync {
    /// The plugins of `scopes` (every scope's: `None`).
    async fn plugins(&self, scopes: Option<Vec<String>>) -> Result<Vec<SharedPlugin>, StoreError>;
    /// Installs `plugin` (its component's bytes `component`, which hash to
    /// `plugin.component`) as `how` says.
    async fn publish(&self, plugin: &SharedPlugin, component: &[u8], how: Publish) -> Result<Published, StoreError>;
    /// Removes `scope`'s plugin `name`; whether there was one.
    async fn withdraw(&self, scope: &str, name: &str) -> Result<bool, StoreError>;
    /// The component whose hash is `hash`, while a plugin names it.
    async fn component(&self, hash: &str) -> Result<Option<Vec<u8>>, StoreError>;
}

/// The numbers every host sharing the store hands out: no two hosts hand
/// out the same one, and a number drawn later is larger.
#[async_trait::async_trait]
pub trait SharedNumbers: Send + Sync {
    /// `n` (at least one) submission numbers (`JobRecord::seq`), in
    /// increasing order: each larger than every number drawn before, by any
    /// host, and than every job's in the store.
    async fn draw_seqs(&self, n: u32) -> Result<Vec<u64>, StoreError>;
    /// Takes the next number of `owner`'s ComfyUI priority counter (0 for
    /// the owner's first prompt request).
    async fn next_prompt_number(&self, owner: &str) -> Result<i64, StoreError>;
}

/// The largest payload a notice carries itself (PostgreSQL's NOTIFY takes
/// under 8000 bytes, with the sender's id).
pub const MAX_NOTICE: usize = 7000;
/// The largest payload a notice may have: one over [`MAX_NOTICE`] is kept
/// in the store and the notice names it (a round trip more on each side).
pub const MAX_LARGE_NOTICE: usize = 1 << 20;

/// Messages to every other host sharing the store (or to one: previews).
/// Delivery is best
/// effort: a host whose connection dropped misses what was sent meanwhile
/// (its [`Notices::gaps`] count rises), so what matters is also kept in
/// the store and re-read.
pub trait Notices: Send + Sync {
    /// Sends `payload` (at most [`MAX_LARGE_NOTICE`] bytes; longer ones
    /// are dropped) to the other hosts listening on `topic`; never waits (a
    /// full outbox drops it).
    fn send(&self, topic: Topic, payload: String);
    /// What other hosts send on `topic` from now on.
    fn subscribe(&self, topic: Topic) -> broadcast::Receiver<Arc<str>>;
    /// This host's address for [`Notices::send_to`].
    fn address(&self) -> &str;
    /// Sends `payload` (as [`Notices::send`]) to the host at `address`
    /// alone, for what only it wants. Lossy: one not sent (too large, the
    /// outbox full) is dropped without counting as a gap.
    fn send_to(&self, address: &str, payload: String);
    /// What other hosts send this host alone from now on.
    fn subscribe_direct(&self) -> broadcast::Receiver<Arc<str>>;
    /// How many times notices may have been missed: this host's listening
    /// connection lost (what was sent meanwhile), or one of its own not
    /// sent (too large, the outbox full). Not other hosts' drops: theirs
    /// count on their side, where the job's own streams are.
    fn gaps(&self) -> u64;
    /// How many times this host started listening: at first, then after
    /// each lost connection (what was sent meanwhile was missed). Counted
    /// once listening again, so a re-read after it misses nothing. Notices
    /// sent by a store write in its transaction are never dropped by a
    /// sender: for those, this is the only gap.
    fn listens(&self) -> u64;
}
