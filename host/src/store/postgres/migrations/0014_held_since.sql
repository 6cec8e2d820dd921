-- When a job's holder got it (the row first written, or taken from another
-- host), by the database's clock: an idle host takes over jobs queued on a
-- busy one only after they waited a moment there
-- (`HostLeases::take_queued`), so a host that starts a job at once is not
-- raced for it. Rows from before this migration read 0.
ALTER TABLE jobs ADD COLUMN held_since BIGINT NOT NULL DEFAULT 0;
ALTER TABLE jobs ALTER COLUMN held_since SET DEFAULT (extract(epoch from clock_timestamp()) * 1000000)::bigint;
