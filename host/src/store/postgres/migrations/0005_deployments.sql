-- Serverless deployments (their records, as the service writes them) and
-- the bundles they were created from (bytes by the bundle's hash), so a
-- host that is lost loses neither.
CREATE TABLE deployments (
    id TEXT PRIMARY KEY,
    record JSONB NOT NULL
);
CREATE TABLE bundles (
    hash TEXT PRIMARY KEY,
    bytes BYTEA NOT NULL
);
