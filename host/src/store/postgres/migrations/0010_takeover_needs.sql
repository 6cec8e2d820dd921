-- The component hashes a host must have to take a job over from another
-- (`JobRecord::takeover_needs`): a host with another plugin set leaves the
-- job to one that has them. Empty for jobs written before (any host).
ALTER TABLE jobs ADD COLUMN takeover_needs TEXT[] NOT NULL DEFAULT '{}';
