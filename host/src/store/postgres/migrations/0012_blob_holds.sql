-- Blobs a claimant needs while no asset record may name them yet: a job's
-- inputs, and its outputs written before its end (claimant: the job's id);
-- an upload before its record (claimant: `upload:<uuid>`, of its host). A
-- collection pass on any host deletes no blob a live claimant holds
-- (`MetaStore::hold_blobs`, `MetaStore::lock_blob`); holds of ended
-- claimants are pruned by the retention sweep.
CREATE TABLE blob_holds (
    hash TEXT NOT NULL,
    claimant TEXT NOT NULL,
    holder TEXT NOT NULL,
    PRIMARY KEY (hash, claimant)
);
CREATE INDEX blob_holds_by_claimant ON blob_holds (claimant);
