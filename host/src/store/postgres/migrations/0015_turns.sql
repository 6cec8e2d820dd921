-- Busy hosts take turns for keys queued only elsewhere
-- (`HostLeases::take_queued`, `TakeFor::Turns`), counting a key's queued
-- jobs per holder. Every row written from now on names its scheduling key
-- (`JobRecord::sched_key`: `deployment/<id>` for a deployment's job, else
-- its owner); unfinished rows written before get theirs here, from their
-- record (JSON), so admission and turns count them too. A record that
-- PostgreSQL cannot read as `jsonb` (a `\u0000` in one of its strings)
-- counts under its owner.
DO $$
DECLARE
    r RECORD;
    deployment TEXT;
BEGIN
    FOR r IN SELECT id, owner, record FROM jobs WHERE sched_key IS NULL AND status IN ('queued', 'running', 'canceling') LOOP
        BEGIN
            deployment := convert_from(r.record, 'UTF8')::jsonb ->> 'deployment';
        EXCEPTION WHEN others THEN
            deployment := NULL;
        END;
        UPDATE jobs SET sched_key = COALESCE('deployment/' || deployment, r.owner) WHERE id = r.id;
    END LOOP;
END $$;
-- A key's queued jobs on one holder.
CREATE INDEX jobs_queued_by_key_and_holder ON jobs (sched_key, holder) WHERE status = 'queued';
