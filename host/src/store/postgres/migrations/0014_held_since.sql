-- Idle hosts take jobs queued on busy ones (`HostLeases::take_queued`).
-- When a job's holder got it (the row first written, or taken from another
-- host), by the database's clock: a job moves only after it waited a
-- moment on its holder, so a host that starts a job at once is not raced
-- for it. Rows from before this migration read 0.
ALTER TABLE jobs ADD COLUMN held_since BIGINT NOT NULL DEFAULT 0;
ALTER TABLE jobs ALTER COLUMN held_since SET DEFAULT (extract(epoch from clock_timestamp()) * 1000000)::bigint;
-- Whether another host may take it (`JobRecord::movable`: its host holds
-- none of it in memory alone), written with each record.
ALTER TABLE jobs ADD COLUMN movable BOOLEAN NOT NULL DEFAULT FALSE;
-- The queued jobs oldest first, as idle hosts look for them.
CREATE INDEX jobs_queued_by_time ON jobs (created_at, id) WHERE status = 'queued';
