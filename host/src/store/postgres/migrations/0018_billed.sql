-- The account a job is billed to (NULL: none). A new job is admitted only
-- while its account's balance covers the minimum price of every unfinished
-- job billed to it, on every host, counted through this index.
ALTER TABLE jobs ADD COLUMN billed TEXT;
CREATE INDEX jobs_unfinished_by_billed ON jobs (billed) WHERE status IN ('queued', 'running', 'canceling') AND billed IS NOT NULL;
-- Jobs unfinished when this runs are billed to their owners; a public
-- demo's (owner `demo/<id>`, no account) holds nothing.
UPDATE jobs SET billed = owner WHERE status IN ('queued', 'running', 'canceling') AND owner NOT LIKE 'demo/%';
