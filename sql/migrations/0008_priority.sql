-- A job's priority (issue 14): among the jobs due when workers are short, a job of priority p
-- goes as if it had been due p seconds earlier. So a higher one goes first, and a lower one
-- ages: a job due later than it by more than the difference never passes it (README "Priority").
ALTER TABLE pgsched.job ADD COLUMN priority integer NOT NULL DEFAULT 0;

-- The claim's order, next_start less the priority in seconds: in job_stat beside next_start, so
-- that one index serves the claim, as job_stat_due_order_idx did (0003): the scan stops after the
-- rows it claims. The job's own priority is copied here by its trigger (sql/api/00_internal.sql).
ALTER TABLE pgsched.job_stat ADD COLUMN priority integer NOT NULL DEFAULT 0;

-- The key in UTC wall time (timestamp without time zone): every step is IMMUTABLE, so PostgreSQL
-- inlines it (timestamptz - interval is STABLE, and a function declared stricter than its body
-- runs through the SQL-function executor on every call: that doubled the claim). Made here, not
-- in sql/api/, because the index depends on it.
CREATE FUNCTION pgsched._claim_key(next_start timestamptz, priority integer)
RETURNS timestamp LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN pg_catalog.timezone('UTC', next_start) - pg_catalog.make_interval(secs => priority);

CREATE INDEX job_stat_claim_order_idx ON pgsched.job_stat (pgsched._claim_key(next_start, priority), job_id)
    WHERE state = 'scheduled';
