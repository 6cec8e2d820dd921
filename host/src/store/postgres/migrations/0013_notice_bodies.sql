-- Notices over NOTIFY's size (a job's large execution message): the body
-- is kept here and the notice names its row; senders delete rows older
-- than a minute.
CREATE TABLE notice_bodies (
    id BIGSERIAL PRIMARY KEY,
    body TEXT NOT NULL,
    sent_at BIGINT NOT NULL
);
CREATE INDEX notice_bodies_by_time ON notice_bodies (sent_at);
