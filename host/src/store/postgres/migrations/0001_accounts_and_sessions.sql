-- Accounts (AccountStore) and web sign-in sessions (SessionStore).
CREATE TABLE accounts (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    key_hashes TEXT[] NOT NULL,
    credits BIGINT NOT NULL,
    tier TEXT NOT NULL,
    subscription_active BOOLEAN NOT NULL,
    disabled BOOLEAN NOT NULL,
    created_at BIGINT NOT NULL
);

CREATE TABLE sessions (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL
);
CREATE INDEX sessions_by_owner ON sessions (owner);
CREATE INDEX sessions_by_expiry ON sessions (expires_at);
