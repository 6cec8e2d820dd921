-- Taking over the jobs of hosts that are gone (`HostLeases::adopt`).
-- The component hashes a host must have to take a job over from another
-- (`JobRecord::takeover_needs`): a host with another plugin set leaves the
-- job to one that has them. Empty for jobs written before (any host).
ALTER TABLE jobs ADD COLUMN takeover_needs TEXT[] NOT NULL DEFAULT '{}';
-- When a host looking for jobs to take over first saw the job held by no
-- live host (database µs; cleared when a host takes it): a job waits for a
-- host with its components only so long (`Runnable::wait`).
ALTER TABLE jobs ADD COLUMN orphaned_at BIGINT;
