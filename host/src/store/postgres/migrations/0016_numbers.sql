-- Submission numbers every host draws from (`SharedNumbers::draw_seqs`):
-- above every number a job holds or held. It replaces `seq_bound` (the
-- bound deleted jobs' numbers left): a sequence never goes back.
CREATE SEQUENCE job_numbers AS BIGINT MINVALUE 1;
SELECT setval('job_numbers', GREATEST((SELECT COALESCE(MAX(seq), 0) FROM jobs), (SELECT value FROM seq_bound)) + 1, false);
DROP TABLE seq_bound;
-- Each owner's ComfyUI priority counter: the number its next prompt
-- request takes (`SharedNumbers::next_prompt_number`). One row per owner
-- that sent a prompt.
CREATE TABLE prompt_counters (
    owner TEXT PRIMARY KEY,
    next BIGINT NOT NULL
);
