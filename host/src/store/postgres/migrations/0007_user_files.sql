-- The web frontend's settings and user files, per user: any host serves
-- them. A file's directories are implicit in its path.
CREATE TABLE user_settings (
    user_id TEXT PRIMARY KEY,
    bytes BYTEA NOT NULL
);
CREATE TABLE user_files (
    user_id TEXT NOT NULL,
    path TEXT NOT NULL,
    bytes BYTEA NOT NULL,
    created_ms BIGINT NOT NULL,
    modified_ms BIGINT NOT NULL,
    PRIMARY KEY (user_id, path)
);
