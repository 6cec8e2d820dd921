-- The secrets every host of an installation shares (the API-key hasher's,
-- the download-URL signer's): 32 bytes each, written once.
CREATE TABLE server_secrets (
    name TEXT PRIMARY KEY,
    secret BYTEA NOT NULL CHECK (length(secret) = 32)
);
