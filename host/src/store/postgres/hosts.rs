//! [`HostLeases`] on PostgreSQL: table `hosts` (one row per start of a
//! host, with its lease) and `jobs.holder` (see migration 0008). Leases
//! are measured by the database's clock.

use std::time::Duration;

use sqlx::Row;

use super::{
    DB_NOW, PgDatabase, backend,
    meta::{record, records},
};
use crate::store::cluster::{Adopted, HostLeases, LEFT_COUNTED, Runnable, TakeFor, Taken, Topic};
use crate::store::{JobRecord, JobStatus, StoreError};

/// The advisory lock takeovers run under.
const ADOPT_LOCK: &str = "kiln: take over lapsed hosts' jobs";
/// Pages of candidates one look reads at most (each of its `limit`).
const ADOPT_PAGES: usize = 8;
/// Candidates a page of [`HostLeases::take_queued`] reads per job it may
/// take (it takes each key's oldest in turn among them; those this host
/// cannot run are skipped, and the next page read).
const TAKE_PAGE: usize = 8;
/// Ids one query of [`HostLeases::taken_away`] checks.
const TAKEN_AWAY_CHUNK: usize = 1000;

/// Jobs `ids` are held by `me` from now on (taken over, or taken from
/// another host's queue): no longer orphaned, and held here since now.
async fn hold_here(tx: &mut sqlx::PgConnection, me: &str, ids: Vec<&str>) -> Result<(), StoreError> {
    sqlx::query(&format!("UPDATE jobs SET holder = $1, orphaned_at = NULL, held_since = {DB_NOW} WHERE id = ANY($2)"))
        .bind(me)
        .bind(&ids)
        .execute(&mut *tx)
        .await
        .map_err(backend)?;
    Ok(())
}

/// Up to `limit` of `jobs` (each with its scheduling key and holder,
/// oldest first): each key's oldest in
/// turn, so one key's backlog on a busy host does not fill every idle
/// worker before another key's job.
fn round_robin(jobs: Vec<(String, String, JobRecord)>, limit: usize) -> Vec<(String, JobRecord)> {
    // Each key's jobs, keys in the order of their oldest.
    let mut keys: Vec<std::collections::VecDeque<(String, JobRecord)>> = Vec::new();
    let mut index: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for (key, holder, job) in jobs {
        let at = *index.entry(key).or_insert_with(|| {
            keys.push(std::collections::VecDeque::new());
            keys.len() - 1
        });
        keys[at].push_back((holder, job));
    }
    let mut taken = Vec::new();
    while taken.len() < limit && !keys.is_empty() {
        keys.retain_mut(|queue| {
            if taken.len() < limit
                && let Some(next) = queue.pop_front()
            {
                taken.push(next);
            }
            !queue.is_empty()
        });
    }
    taken
}

/// A turn's condition on queued job `j`: its holder has another job of its
/// key in line (queued, not asked to be canceled, not waiting on the key's
/// running limit), so it is not the key's last there. An index probe
/// (`jobs_queued_by_key_and_holder`).
const IN_LINE: &str = "EXISTS (SELECT 1 FROM jobs k WHERE k.status = 'queued' AND k.sched_key = j.sched_key AND k.holder = j.holder \
     AND k.id <> j.id AND NOT k.cancel_requested AND k.start_wanted_at IS NULL)";

/// How a look reads the queued jobs it may take (see
/// [`HostLeases::take_queued`]).
struct Candidates<'a> {
    me: &'a str,
    /// How long a job must have been held where it is (µs).
    before: i64,
    here: &'a Runnable,
    /// Jobs (or, for turns, keys) wanted.
    limit: usize,
    turns: bool,
}

impl Candidates<'_> {
    /// Pages of candidates, oldest first, each asked whether it runs here
    /// (for its owner): a page of jobs it cannot run never hides others;
    /// never of a key in `skipped`. For idle workers the rows are locked as
    /// read (a holder's start of one waits for this transaction and is
    /// then refused: the row names this host). For turns they are read
    /// unlocked (most are the same few keys' jobs: those chosen are locked
    /// after), a key's oldest runnable job stands for it, and the next
    /// pages skip the keys found, so one key's flood never hides the others.
    async fn pages(&self, tx: &mut sqlx::PgConnection, mut skipped: Vec<String>) -> Result<Vec<(String, String, JobRecord)>, StoreError> {
        let page = i64::try_from(self.limit.saturating_mul(TAKE_PAGE)).unwrap_or(i64::MAX);
        let lock = if self.turns { "" } else { "FOR UPDATE OF j SKIP LOCKED" };
        let mut found: std::collections::HashSet<String> = skipped.iter().cloned().collect();
        let mut runnable = Vec::new();
        let mut after = (i64::MIN, String::new());
        for _ in 0..ADOPT_PAGES {
            let rows = sqlx::query(&format!(
                "SELECT id, created_at, holder, COALESCE(sched_key, owner) AS key, record FROM jobs j WHERE j.status = 'queued' AND j.holder <> $1 \
                 AND j.movable AND NOT j.cancel_requested AND j.start_wanted_at IS NULL AND j.expires_at > {DB_NOW} \
                 AND j.held_since <= {DB_NOW} - $2 AND j.takeover_needs <@ $3 AND EXISTS (SELECT 1 FROM hosts h WHERE h.holder = j.holder) \
                 AND (j.created_at, j.id) > ($4, $5) AND NOT (COALESCE(j.sched_key, j.owner) = ANY($7)) \
                 AND (NOT $8 OR {IN_LINE}) ORDER BY j.created_at, j.id LIMIT $6 {lock}"
            ))
            .bind(self.me)
            .bind(self.before)
            .bind(&self.here.hashes)
            .bind(after.0)
            .bind(&after.1)
            .bind(page)
            .bind(&skipped)
            .bind(self.turns)
            .fetch_all(&mut *tx)
            .await
            .map_err(backend)?;
            let Some(last) = rows.last() else { break };
            after = (last.try_get("created_at").map_err(backend)?, last.try_get("id").map_err(backend)?);
            let full = i64::try_from(rows.len()).unwrap_or(i64::MAX) == page;
            for row in &rows {
                let key: String = row.try_get("key").map_err(backend)?;
                // (A key found already is not decoded again.)
                if self.turns && found.contains(&key) {
                    continue;
                }
                let job: JobRecord = record("job", row)?;
                if !(self.here.job)(&job) {
                    continue;
                }
                if self.turns {
                    found.insert(key.clone());
                    skipped.push(key.clone());
                }
                runnable.push((key, row.try_get::<String, _>("holder").map_err(backend)?, job));
            }
            if !full || runnable.len() >= self.limit.saturating_mul(if self.turns { 1 } else { TAKE_PAGE }) {
                break;
            }
        }
        Ok(runnable)
    }
}

/// Of the turns chosen from rows read unlocked (each with the holder read),
/// those still queued there, takeable and not their key's last in line
/// there, locked now; one another look locked, took or its holder started
/// meanwhile drops out.
async fn lock_as_read(tx: &mut sqlx::PgConnection, chosen: Vec<(String, JobRecord)>) -> Result<Vec<(String, JobRecord)>, StoreError> {
    if chosen.is_empty() {
        return Ok(chosen);
    }
    let (holders, ids): (Vec<&str>, Vec<&str>) = chosen.iter().map(|(holder, job)| (holder.as_str(), job.id.as_str())).unzip();
    let locked: Vec<(String,)> = sqlx::query_as(&format!(
        "SELECT j.id FROM jobs j JOIN unnest($1::text[], $2::text[]) AS c(id, holder) ON j.id = c.id AND j.holder = c.holder \
         WHERE j.status = 'queued' AND NOT j.cancel_requested AND j.start_wanted_at IS NULL AND {IN_LINE} FOR UPDATE OF j SKIP LOCKED"
    ))
    .bind(&ids)
    .bind(&holders)
    .fetch_all(&mut *tx)
    .await
    .map_err(backend)?;
    let locked: std::collections::HashSet<String> = locked.into_iter().map(|(id,)| id).collect();
    Ok(chosen.into_iter().filter(|(_, job)| locked.contains(&job.id)).collect())
}

/// An orphan any host takes whatever components it needs (table alias
/// `j`; `$own`: this host's id and `/`, `$wait`: [`Runnable::wait`] in
/// µs): one an earlier start of this very host held (a restart takes its
/// own jobs back, re-validated, as one host alone does), one asked to be
/// canceled or past its expiry (ended, not run), and one that waited for
/// a host with its components longer than `wait`.
fn forced(own: usize, wait: usize) -> String {
    // (A job held by none, or not yet seen orphaned, compares to NULL.)
    format!(
        "COALESCE(starts_with(j.holder, ${own}) OR j.cancel_requested OR j.expires_at <= {DB_NOW} \
          OR j.orphaned_at <= {DB_NOW} - ${wait}, FALSE)"
    )
}

/// An unfinished job no registered host holds (table alias `j`).
const ORPHAN: &str = "j.status IN ('queued', 'running', 'canceling') AND (j.holder IS NULL OR NOT EXISTS (SELECT 1 FROM hosts h WHERE h.holder = j.holder))";

/// This host's lease, in the shared database.
pub struct PgHosts {
    db: PgDatabase,
    host_id: String,
}

impl PgHosts {
    /// The leases of `db`'s holder, registered as host `host_id`.
    pub fn new(db: PgDatabase, host_id: &str) -> PgHosts {
        PgHosts { db, host_id: host_id.to_string() }
    }

    fn me(&self) -> String {
        self.db.holder().to_string()
    }
}

fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

#[async_trait::async_trait]
impl HostLeases for PgHosts {
    fn holder(&self) -> &str {
        self.db.holder()
    }

    async fn register(&self, lease: Duration) -> Result<(), StoreError> {
        let (me, host, lease) = (self.me(), self.host_id.clone(), micros(lease));
        on_pool!(self, |pool| {
            in_transaction!(pool, |tx| {
                // Earlier starts of this host are over (one process per host
                // id): their jobs are taken over at once, not after their lease.
                sqlx::query("DELETE FROM hosts WHERE host_id = $1").bind(&host).execute(&mut *tx).await.map_err(backend)?;
                let sql = format!("INSERT INTO hosts (holder, host_id, started_at, lease_until) VALUES ($1, $2, {DB_NOW}, {DB_NOW} + $3)");
                sqlx::query(&sql).bind(&me).bind(&host).bind(lease).execute(&mut *tx).await.map_err(backend)?;
                Ok(())
            })
        })
    }

    async fn renew(&self, lease: Duration) -> Result<(), StoreError> {
        let (me, lease) = (self.me(), micros(lease));
        on_pool!(self, |pool| {
            let sql = format!("UPDATE hosts SET lease_until = {DB_NOW} + $2 WHERE holder = $1 RETURNING 1");
            let renewed: Option<(i32,)> = sqlx::query_as(&sql).bind(&me).bind(lease).fetch_optional(&pool).await.map_err(backend)?;
            renewed.map(|_| ()).ok_or_else(|| StoreError::Fenced(format!("the lease of {me} lapsed and another host ended it")))
        })
    }

    async fn adopt(&self, limit: usize, here: &Runnable) -> Result<Adopted, StoreError> {
        let (me, here, limit) = (self.me(), here.clone(), limit.max(1));
        let (own, wait) = (format!("{}/", self.host_id), micros(here.wait));
        on_pool!(self, |pool| {
            in_transaction!(pool, |tx| {
                // One host looks at a time: a row another host took over (and
                // committed) while this statement ran would otherwise pass the
                // `hosts` check against this statement's older snapshot.
                sqlx::query("SELECT pg_advisory_xact_lock($1)").bind(super::advisory_key(ADOPT_LOCK)).execute(&mut *tx).await.map_err(backend)?;
                let ended: Vec<(String,)> =
                    sqlx::query_as(&format!("DELETE FROM hosts WHERE lease_until < {DB_NOW} RETURNING holder")).fetch_all(&mut *tx).await.map_err(backend)?;
                for (holder,) in &ended {
                    tracing::warn!(holder = %holder, "a host's lease lapsed: its jobs are taken over");
                }
                // When each orphan was first seen so (what `here.wait` counts from).
                sqlx::query(&format!("UPDATE jobs j SET orphaned_at = {DB_NOW} WHERE {ORPHAN} AND j.orphaned_at IS NULL"))
                    .execute(&mut *tx)
                    .await
                    .map_err(backend)?;
                let mut adopted = Adopted::default();
                // Pages of the orphans this host may take — those whose
                // components it has (by hash) and those taken whatever they
                // need (`forced`) — oldest first, the former each asked whether
                // it runs here (for its owner): a page of jobs it cannot run
                // never hides others.
                let page = i64::try_from(limit).unwrap_or(i64::MAX);
                let mut after = (i64::MIN, String::new());
                for _ in 0..ADOPT_PAGES {
                    let rows = sqlx::query(&format!(
                    "SELECT id, seq, record, cancel_requested, j.expires_at <= {DB_NOW} AS expired, {forced} AS forced FROM jobs j WHERE {ORPHAN} AND ({forced} OR j.takeover_needs <@ $1) \
                     AND (j.seq, j.id) > ($2, $3) ORDER BY j.seq, j.id LIMIT $4 FOR UPDATE SKIP LOCKED",
                    forced = forced(5, 6)
                ))
                .bind(&here.hashes)
                .bind(after.0)
                .bind(&after.1)
                .bind(page)
                .bind(&own)
                .bind(wait)
                .fetch_all(&mut *tx)
                .await
                .map_err(backend)?;
                    let Some(last) = rows.last() else { break };
                    after = (last.try_get("seq").map_err(backend)?, last.try_get("id").map_err(backend)?);
                    let full = rows.len() == limit;
                    for (row, job) in rows.iter().zip(records::<JobRecord>("job", &rows)?) {
                        if adopted.jobs.len() == limit {
                            break;
                        }
                        let forced: bool = row.try_get("forced").map_err(backend)?;
                        if !forced && !(here.job)(&job) {
                            adopted.left += 1;
                            continue;
                        }
                        if row.try_get::<bool, _>("cancel_requested").map_err(backend)? {
                            adopted.ends.insert(job.id.clone(), JobStatus::Canceled);
                        } else if row.try_get::<bool, _>("expired").map_err(backend)? {
                            adopted.ends.insert(job.id.clone(), JobStatus::Expired);
                        }
                        adopted.jobs.push(job);
                    }
                    if !full || adopted.jobs.len() == limit {
                        break;
                    }
                }
                hold_here(tx, &me, adopted.jobs.iter().map(|j| j.id.as_str()).collect()).await?;
                let (lacking,): (i64,) = sqlx::query_as(&format!(
                    "SELECT count(*) FROM (SELECT 1 FROM jobs j WHERE {ORPHAN} AND NOT {forced} AND NOT j.takeover_needs <@ $1 LIMIT {LEFT_COUNTED}) l",
                    forced = forced(2, 3)
                ))
                .bind(&here.hashes)
                .bind(&own)
                .bind(wait)
                .fetch_one(&mut *tx)
                .await
                .map_err(backend)?;
                adopted.left = (adopted.left + usize::try_from(lacking).unwrap_or(0)).min(LEFT_COUNTED);
                Ok(adopted)
            })
        })
    }

    async fn take_queued(&self, want: TakeFor<'_>, here: &Runnable, waited: Duration) -> Result<Taken, StoreError> {
        // Turns take one job per key, never of a key queued here, nor a
        // key's last job on its host.
        let (limit, queued_here, turns) = match want {
            TakeFor::Idle(workers) => (workers, Vec::new(), false),
            // (The candidates hold one job per key then.)
            TakeFor::Turns { keys, queued_here } => (keys, queued_here.to_vec(), true),
        };
        let (me, here, limit) = (self.me(), here.clone(), limit.max(1));
        let before = micros(waited);
        on_pool!(self, |pool| {
            in_transaction!(pool, |tx| {
                let read = Candidates { me: &me, before, here: &here, limit, turns };
                let runnable = read.pages(tx, queued_here.clone()).await?;
                let mut taken = round_robin(runnable, limit);
                if turns {
                    taken = lock_as_read(tx, taken).await?;
                }
                if !taken.is_empty() {
                    hold_here(tx, &me, taken.iter().map(|(_, job)| job.id.as_str()).collect()).await?;
                    let mut told: Vec<&str> = taken.iter().map(|(holder, _)| holder.as_str()).collect();
                    told.sort_unstable();
                    told.dedup();
                    for holder in told {
                        super::notices::announce(&mut *tx, Topic::Control, &me, holder).await?;
                    }
                }
                // When the next job that has not waited long enough yet may be
                // taken (this host looks again then, if it still may take it):
                // for turns, a job of a key not queued here.
                let soonest: Option<i64> = sqlx::query_scalar(&format!(
                    "SELECT min(j.held_since) + $2 - {DB_NOW} FROM jobs j WHERE j.status = 'queued' AND j.holder <> $1 AND j.movable \
                 AND j.held_since > {DB_NOW} - $2 AND NOT (COALESCE(j.sched_key, j.owner) = ANY($3))"
                ))
                .bind(&me)
                .bind(before)
                .bind(&queued_here)
                .fetch_one(&mut *tx)
                .await
                .map_err(backend)?;
                let next_in = soonest.map(|us| std::time::Duration::from_micros(u64::try_from(us).unwrap_or(0)));
                Ok(Taken { jobs: taken.into_iter().map(|(_, job)| job).collect(), next_in })
            })
        })
    }

    async fn taken_away(&self, ids: &[String]) -> Result<Vec<String>, StoreError> {
        let (me, ids) = (self.me(), ids.to_vec());
        on_pool!(self, |pool| {
            let mut taken = Vec::new();
            for chunk in ids.chunks(TAKEN_AWAY_CHUNK) {
                // Only rows that exist: a submission not yet committed is
                // still this host's.
                let rows: Vec<(String,)> = sqlx::query_as("SELECT id FROM jobs WHERE id = ANY($1) AND holder IS DISTINCT FROM $2")
                    .bind(chunk)
                    .bind(&me)
                    .fetch_all(&pool)
                    .await
                    .map_err(backend)?;
                taken.extend(rows.into_iter().map(|(id,)| id));
            }
            Ok(taken)
        })
    }

    async fn request_cancel(&self, id: &str) -> Result<bool, StoreError> {
        let (me, id) = (self.me(), id.to_string());
        on_pool!(self, |pool| {
            in_transaction!(pool, |tx| {
                let holder: Option<(Option<String>,)> =
                    sqlx::query_as("UPDATE jobs SET cancel_requested = TRUE WHERE id = $1 AND status IN ('queued', 'running', 'canceling') RETURNING holder")
                        .bind(&id)
                        .fetch_optional(&mut *tx)
                        .await
                        .map_err(backend)?;
                let Some((holder,)) = holder else { return Ok(false) };
                // Delivered when the transaction commits (a notice names the
                // sender, then the holder it is for).
                if let Some(holder) = holder {
                    super::notices::announce(&mut *tx, Topic::Control, &me, &holder).await?;
                }
                Ok(true)
            })
        })
    }

    async fn cancel_requests(&self) -> Result<Vec<String>, StoreError> {
        let me = self.me();
        on_pool!(self, |pool| {
            let rows: Vec<(String,)> = sqlx::query_as("SELECT id FROM jobs WHERE holder = $1 AND cancel_requested AND status IN ('queued', 'running')")
                .bind(&me)
                .fetch_all(&pool)
                .await
                .map_err(backend)?;
            Ok(rows.into_iter().map(|(id,)| id).collect())
        })
    }

    async fn release(&self) -> Result<(), StoreError> {
        let me = self.me();
        on_pool!(self, |pool| {
            sqlx::query("DELETE FROM hosts WHERE holder = $1").bind(&me).execute(&pool).await.map_err(backend)?;
            Ok(())
        })
    }
}
