-- Hosts sharing the database. Each start of a host registers a holder id
-- (`<host_id>/<nonce>`) with a lease it renews; `jobs.holder` names the
-- host that queues or runs an unfinished job. When a host's lease lapses
-- another deletes its row and takes its jobs; the lapsed host's late
-- writes to them are refused (they name a holder that no longer holds).
CREATE TABLE hosts (
    holder TEXT PRIMARY KEY,
    host_id TEXT NOT NULL,
    started_at BIGINT NOT NULL,
    lease_until BIGINT NOT NULL
);
ALTER TABLE jobs ADD COLUMN holder TEXT;
-- Another host asked the holder to cancel the job (kept until it ends).
ALTER TABLE jobs ADD COLUMN cancel_requested BOOLEAN NOT NULL DEFAULT FALSE;
CREATE INDEX jobs_by_holder ON jobs (holder) WHERE holder IS NOT NULL;
