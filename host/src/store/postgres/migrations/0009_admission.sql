-- The scheduling key of a job (its account's id, or `deployment/<id>`):
-- hosts admitting a new job count the key's waiting jobs across all hosts.
ALTER TABLE jobs ADD COLUMN sched_key TEXT;
CREATE INDEX jobs_queued_by_key ON jobs (sched_key) WHERE status = 'queued';
-- An owner's unfinished jobs on every host (the ComfyUI queue view).
CREATE INDEX jobs_unfinished_by_owner ON jobs (owner, seq) WHERE status IN ('queued', 'running', 'canceling');
