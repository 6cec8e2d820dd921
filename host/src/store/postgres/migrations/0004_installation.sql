-- The installation's id (one row, made with the schema): what its S3
-- bucket is marked with, so a second installation cannot share it.
CREATE TABLE installation (
    only_row BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (only_row),
    id TEXT NOT NULL
);
INSERT INTO installation (id) VALUES (gen_random_uuid()::text);
