-- The metadata store (MetaStore): jobs with their workflows, assets and
-- Idempotency-Key claims. Each row keeps its record as JSON (`record`)
-- beside the columns the queries select and order by.
CREATE TABLE jobs (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    seq BIGINT NOT NULL,
    status TEXT NOT NULL,
    expires_at BIGINT NOT NULL,
    record BYTEA NOT NULL,
    workflow BYTEA
);
CREATE INDEX jobs_by_time ON jobs (created_at DESC, id DESC);
CREATE INDEX jobs_by_owner ON jobs (owner, created_at DESC, id DESC);
CREATE INDEX jobs_unfinished ON jobs (seq) WHERE status IN ('queued', 'running', 'canceling');
CREATE INDEX jobs_by_expiry ON jobs (expires_at);

CREATE TABLE assets (
    id TEXT PRIMARY KEY,
    hash TEXT NOT NULL,
    job_id TEXT,
    expires_at BIGINT,
    tags TEXT[] NOT NULL,
    record BYTEA NOT NULL
);
CREATE INDEX assets_by_hash ON assets (hash);
CREATE INDEX assets_by_job ON assets (job_id) WHERE job_id IS NOT NULL;
CREATE INDEX uploads_by_expiry ON assets (expires_at) WHERE job_id IS NULL AND expires_at IS NOT NULL;

CREATE TABLE claims (
    key TEXT PRIMARY KEY,
    expires_at BIGINT NOT NULL,
    record BYTEA NOT NULL
);
CREATE INDEX claims_by_expiry ON claims (expires_at);

-- A bound on the queue seq of jobs since deleted (`max_seq` is the larger
-- of it and the jobs' own): raised by each deletion, one row.
CREATE TABLE seq_bound (
    one BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (one),
    value BIGINT NOT NULL
);
INSERT INTO seq_bound (value) VALUES (0);
