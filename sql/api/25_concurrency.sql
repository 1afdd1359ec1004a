-- Concurrency limits (README "Concurrency limits"): jobs that share a concurrency_key run at most
-- the key's max_running at once over every instance. This file owns the rule's parts that are
-- not the claim: the limit of a key, how many runs hold it, whether a job waits for it, and
-- set_concurrency_limit. The claim (_claim_v2, 40_scheduler.sql) enforces it.

-- The limit of a key that has no row in pgsched.concurrency_limit: one at a time. Inlined where
-- it is used (no SET clause; the body names nothing).
CREATE OR REPLACE FUNCTION pgsched._key_default_limit()
RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN 1;

-- A key's limit: its row in pgsched.concurrency_limit, else the default.
CREATE OR REPLACE FUNCTION pgsched._key_limit(concurrency_key text)
RETURNS integer LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT coalesce((SELECT l.max_running FROM pgsched.concurrency_limit l
                      WHERE l.concurrency_key = _key_limit.concurrency_key), pgsched._key_default_limit())
$$;

-- How many runs hold the key now: running runs (claimed, started, manual, or a scope run) that
-- took it when they started (job_run.concurrency_key). SECURITY DEFINER: a job waits for runs of
-- other owners that share its key, so whoever may see the job sees this count (a number, not
-- which runs: job_history stays under row-level security).
CREATE OR REPLACE FUNCTION pgsched._key_running(concurrency_key text)
RETURNS integer LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
    SELECT count(*)::integer FROM pgsched.job_run_live r
     WHERE r.outcome = 'running' AND r.concurrency_key = _key_running.concurrency_key
$$;

-- Each key's free places now (its limit less the runs holding it; 0 or less: full), for the keys
-- with a limit row or a run holding them: any other key has the default limit and no run. The
-- scheduler's questions read it (the claim, its sleep, the close's wake-up): a view, so that it
-- is inlined into their cached plans, where a function would be planned again on every call.
-- Not granted: it counts every owner's runs.
SELECT pgsched._replace_if_changed('pgsched._key_room', NULL, $ddl$
CREATE OR REPLACE VIEW pgsched._key_room AS
SELECT coalesce(l.concurrency_key, b.concurrency_key) AS concurrency_key,
       coalesce(l.max_running, pgsched._key_default_limit()) - coalesce(b.n, 0) AS free
  FROM pgsched.concurrency_limit l
  FULL JOIN (SELECT r.concurrency_key, count(*) AS n
               FROM pgsched.job_run_live r
              WHERE r.outcome = 'running' AND r.concurrency_key IS NOT NULL
              GROUP BY r.concurrency_key) b ON b.concurrency_key = l.concurrency_key
$ddl$);
REVOKE ALL ON pgsched._key_room FROM PUBLIC;

-- Why a job whose plan is due does not start, if its key is the reason (job_stats.waiting_for).
CREATE OR REPLACE FUNCTION pgsched._key_wait(concurrency_key text)
RETURNS text LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT CASE WHEN r.n >= l.n
                THEN pg_catalog.format('concurrency limit of %L: %s of %s running', _key_wait.concurrency_key, r.n, l.n)
           END
      FROM (SELECT pgsched._key_running(_key_wait.concurrency_key) AS n) r,
           (SELECT pgsched._key_limit(_key_wait.concurrency_key) AS n) l
$$;

-- Set how many runs of the jobs sharing `concurrency_key` may run at once, over every instance
-- (0: none, they wait); NULL max_running returns the key to the default, 1. Only the catalog's
-- administrators (the scheduler's role and the roles that may SET ROLE to it and have its rights:
-- _catalog_admin)
-- set limits: a key is shared by every owner's jobs, so a limit is a setting of the database,
-- not of one job. The schedulers are woken, so a raised limit takes effect at once. Returns the
-- key's limit now.
CREATE OR REPLACE FUNCTION pgsched.set_concurrency_limit(concurrency_key text, max_running integer)
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    key_form constant text := 'a name of 1 to 200 characters, as add_job''s concurrency_key';
    limit_form constant text := 'a whole number from 0 (none at once: the key''s jobs wait) up, or NULL for '
        || 'the default, 1';
    k constant text := set_concurrency_limit.concurrency_key;
    n constant integer := set_concurrency_limit.max_running;
BEGIN
    IF k IS NULL THEN
        PERFORM pgsched._bad_arg('concurrency_key', 'NULL', key_form, '22004');
    ELSIF btrim(k) = '' OR length(k) > 200 THEN
        PERFORM pgsched._bad_arg('concurrency_key',
                                 CASE WHEN btrim(k) = '' THEN format('%L is empty', k)
                                      ELSE format('%s characters long', length(k)) END, key_form);
    END IF;
    IF n < 0 THEN
        PERFORM pgsched._bad_arg('max_running', format('%s is negative', n), limit_form);
    END IF;
    IF NOT pgsched._catalog_admin() THEN
        RAISE EXCEPTION USING ERRCODE = '42501',
            MESSAGE = format('permission denied to set the concurrency limit of %L', k),
            HINT = 'limits are shared by every owner''s jobs: only the pgsched catalog''s owner role and the '
                   || 'roles that may SET ROLE to it set them';
    END IF;
    IF n IS NULL THEN
        DELETE FROM pgsched.concurrency_limit l WHERE l.concurrency_key = k;
    ELSE
        INSERT INTO pgsched.concurrency_limit AS l (concurrency_key, max_running) VALUES (k, n)
        ON CONFLICT ON CONSTRAINT concurrency_limit_pkey
        DO UPDATE SET max_running = excluded.max_running, updated_at = now();
    END IF;
    PERFORM pg_catalog.pg_notify('pgsched_catalog', 'concurrency_limit:update');
    RETURN pgsched._key_limit(k);
END
$$;
