-- A scheduling key's running jobs on every host: a job starts only while
-- its key runs fewer than its limit (`MetaStore::start_admitted`).
CREATE INDEX jobs_running_by_key ON jobs (sched_key) WHERE status IN ('running', 'canceling');
