-- Busy hosts take turns for keys queued only elsewhere
-- (`HostLeases::take_queued`, `TakeFor::Turns`), counting a key's queued
-- jobs per holder. Every row written from now on names its scheduling key
-- (`JobRecord::sched_key`: `deployment/<id>` for a deployment's job, else
-- its owner); unfinished rows written before get theirs here, from their
-- record (JSON), so admission and turns count them too.
UPDATE jobs SET sched_key = CASE
        WHEN convert_from(record, 'UTF8')::jsonb ->> 'deployment' IS NOT NULL
        THEN 'deployment/' || (convert_from(record, 'UTF8')::jsonb ->> 'deployment')
        ELSE owner END
    WHERE sched_key IS NULL AND status IN ('queued', 'running', 'canceling');
-- A key's queued jobs on one holder.
CREATE INDEX jobs_queued_by_key_and_holder ON jobs (sched_key, holder) WHERE status = 'queued';
