-- A scheduling key's running jobs on every host: a job starts only while
-- its key runs fewer than its limit (`MetaStore::start_admitted`).
CREATE INDEX jobs_running_by_key ON jobs (sched_key) WHERE status IN ('running', 'canceling');
-- When a queued job's start was first refused by its key's limit: starts
-- of the key's newer jobs on other hosts wait for it (first come, first
-- started, across hosts).
ALTER TABLE jobs ADD COLUMN start_wanted_at BIGINT;
CREATE INDEX jobs_start_wanted_by_key ON jobs (sched_key, created_at) WHERE status = 'queued' AND start_wanted_at IS NOT NULL;
