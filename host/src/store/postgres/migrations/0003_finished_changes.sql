-- A counter per owner, bumped with every write or deletion of one of the
-- owner's finished jobs: what a cached view of the owner's history compares
-- (MetaStore::finished_changes).
CREATE TABLE finished_changes (
    owner TEXT PRIMARY KEY,
    n BIGINT NOT NULL
);
