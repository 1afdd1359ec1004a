-- Concurrency limits (issue 14): jobs that share a concurrency_key run at most max_running at
-- once, counted over every instance; the claim enforces it (README "Concurrency limits").
-- NULL: no limit. The CHECK repeats _check_settings' rule for direct writes of the table.
ALTER TABLE pgsched.job ADD COLUMN concurrency_key text
    CHECK (concurrency_key IS NULL OR (btrim(concurrency_key) <> '' AND length(concurrency_key) <= 200));

-- A key's limit; a key used by a job but absent here has the default limit, 1 (one at a time).
-- Written by pgsched.set_concurrency_limit (the catalog's administrators only), read by all.
CREATE TABLE pgsched.concurrency_limit (
    concurrency_key text PRIMARY KEY,
    max_running integer NOT NULL CHECK (max_running >= 0),
    updated_at timestamptz NOT NULL DEFAULT now()
);
GRANT SELECT ON pgsched.concurrency_limit TO PUBLIC;

-- The job's key beside next_start, copied by the job's trigger (as priority is, 0008): the claim
-- and the scheduler's sleep test it on the rows they walk without a join.
ALTER TABLE pgsched.job_stat ADD COLUMN concurrency_key text;

-- The key a run holds, as its job had it when the run started (NULL: none): runs are counted by
-- this, so that altering a job's key while it runs neither frees nor fills a key it did not take.
ALTER TABLE pgsched.job_run ADD COLUMN concurrency_key text;
CREATE INDEX job_run_key_running_idx ON pgsched.job_run (concurrency_key)
    WHERE outcome = 'running' AND concurrency_key IS NOT NULL;

-- Whether a due job holds a key: the claim asks this before anything else, and only then
-- serialises with other instances (sql/api/40_scheduler.sql, _claim_v2).
CREATE INDEX job_stat_keyed_due_idx ON pgsched.job_stat (pgsched._due_at(job_id, next_start, jitter_us))
    WHERE state = 'scheduled' AND concurrency_key IS NOT NULL;
