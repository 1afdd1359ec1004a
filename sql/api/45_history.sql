-- History that stays bounded (README "History and retention", migration 0014): the database's
-- retention (set_retention, the settings view), a job's history level (_forget_runs, called by
-- every close), and the purge (purge_history; a scheduler takes its turn with _purge_turn).
--
-- Which retention a run's row has: its job's own, else the database's, by the run's outcome.
-- success_retention for what went as planned or was passed over on purpose (success, skipped,
-- missed), failure_retention for what went wrong or was stopped (failure, timeout, crash,
-- cancelled): the rows someone will come back to look at.

-- The accepted form of a retention, in every error about one.
CREATE OR REPLACE FUNCTION pgsched._retention_form(job_setting boolean)
RETURNS text LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT 'a positive duration such as ''7 days'' or ''12 hours'' (how long a run''s row is kept after the run '
           || 'ends)' || CASE WHEN job_setting THEN ', or NULL for the database''s (pgsched.settings; in alter_job: '
                                                 || 'NULL keeps it, ''0'' returns to the database''s)'
                             ELSE ', or NULL to keep the current one' END
$$;

CREATE OR REPLACE FUNCTION pgsched._history_form()
RETURNS text LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT '''all'' (every run keeps its row; the default), ''failures'' (only failed, timed-out, crashed and '
           || 'cancelled runs do) or ''none'' (no run does: only the counters in pgsched.job_stats)'
$$;

-- A retention is NULL (not given) or positive.
CREATE OR REPLACE FUNCTION pgsched._check_retention(iv interval, argument text, job_setting boolean)
RETURNS void LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF iv IS NOT NULL AND iv <= interval '0' THEN
        PERFORM pgsched._bad_arg(argument, format('%s is %s', iv, CASE WHEN iv = interval '0' THEN 'zero'
                                                                      ELSE 'negative' END),
                                 pgsched._retention_form(job_setting));
    END IF;
END
$$;

-- The policy in force: the stored values, else the defaults (their one definition). One row.
CREATE OR REPLACE VIEW pgsched._history_policy AS
SELECT coalesce(p.success_retention, d.success_retention) AS success_retention,
       coalesce(p.failure_retention, d.failure_retention) AS failure_retention,
       d.success_retention AS success_default, d.failure_retention AS failure_default, p.purged_at
  FROM (VALUES (interval '7 days', interval '30 days')) AS d(success_retention, failure_retention)
  LEFT JOIN pgsched.history_policy p ON true;
GRANT SELECT ON pgsched._history_policy TO PUBLIC;

-- The database's retention. Shared by every owner's jobs, so only the catalog's administrators
-- set it. NULL keeps a value as it is. Returns the policy now in force.
CREATE OR REPLACE FUNCTION pgsched.set_retention(success interval DEFAULT NULL, failure interval DEFAULT NULL)
RETURNS TABLE (success_retention interval, failure_retention interval)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM pgsched._check_retention(set_retention.success, 'success', job_setting => false),
            pgsched._check_retention(set_retention.failure, 'failure', job_setting => false);
    IF NOT pgsched._catalog_admin() THEN
        RAISE EXCEPTION USING ERRCODE = '42501',
            MESSAGE = 'permission denied to set the retention of pgsched''s history',
            HINT = 'the retention applies to every owner''s runs: only the pgsched catalog''s owner role and its '
                   || 'members set it; a job''s owner may set the job''s own (add_job or alter_job: '
                   || 'success_retention, failure_retention)';
    END IF;
    INSERT INTO pgsched.history_policy AS p (success_retention, failure_retention)
    VALUES (set_retention.success, set_retention.failure)
    ON CONFLICT ON CONSTRAINT history_policy_pkey DO UPDATE
       SET success_retention = coalesce(set_retention.success, p.success_retention),
           failure_retention = coalesce(set_retention.failure, p.failure_retention),
           updated_at = pg_catalog.now();
    RETURN QUERY SELECT v.success_retention, v.failure_retention FROM pgsched._history_policy v;
END
$$;

-- The database-wide settings a user may read: name, value, default, what it does.
CREATE OR REPLACE VIEW pgsched.settings AS
SELECT s.name, s.value, s.default_value, s.description
  FROM pgsched._history_policy p,
       LATERAL (VALUES
           ('success_retention', pgsched._interval_text(p.success_retention),
            pgsched._interval_text(p.success_default),
            'how long a successful, skipped or missed run keeps its row in job_history after it ends '
            || '(pgsched.set_retention; a job''s success_retention replaces it)'),
           ('failure_retention', pgsched._interval_text(p.failure_retention),
            pgsched._interval_text(p.failure_default),
            'how long a failed, timed-out, crashed or cancelled run keeps its row after it ends '
            || '(pgsched.set_retention; a job''s failure_retention replaces it)'),
           ('last_purge', p.purged_at::text, NULL,
            'when a scheduler last applied the retention (pgsched.purge_history)')
       ) AS s(name, value, default_value, description);
GRANT SELECT ON pgsched.settings TO PUBLIC;

-- The rows of closed runs whose job's history level does not keep them (README "History and
-- retention"). Called by every close (pgsched._end_runs, or _close_batch once it is done with
-- the closed rows): the run's row has served its purpose by then. Its start was committed, so a
-- crash was counted; the close counted the outcome in job_stat; and the close moved the job's
-- next_start past the plan in the same transaction, so the plan cannot be claimed again.
-- Two kinds of row stay whatever the level, and go by the retention: they are what keeps a run
-- from happening twice. A run trigger_job started on a scheduler (every scheduler that heard the
-- request retries it while the job is busy, and its row's key is what tells them it ran:
-- _start_manual_v2; a run_job in somebody's session has no instance, and nobody retries it), and
-- an '@restart' job's plan run (its key is what passes over the server start it ran for:
-- _arm_restart_jobs, the claim's ON CONFLICT).
CREATE OR REPLACE FUNCTION pgsched._forget_runs(run_ids bigint[])
RETURNS void LANGUAGE sql
SET search_path = pg_catalog, pg_temp AS $$
    DELETE FROM pgsched.job_run r
     USING pgsched.job j
     WHERE r.run_id = ANY (run_ids) AND j.job_id = r.job_id AND j.history <> 'all'
       AND r.outcome NOT IN ('running', 'queued') AND NOT pgsched._kept(j.history, r.outcome)
       AND NOT (r.trigger = 'manual' AND r.instance_id IS NOT NULL) AND NOT (j.schedule = '@restart' AND r.scope = '')
$$;

-- Apply the retention now: delete the rows of runs that ended longer ago than their retention,
-- then the rows of scheduler instances stopped (or silent) for longer than the longer of the two
-- retentions that have no run in progress. `now` is the clock to judge by (default: the
-- transaction's); max_rows bounds the runs deleted by one call (the schedulers purge in batches
-- of this many, a transaction each), NULL for all. Safe to call from several sessions at once
-- (each skips the rows another is deleting) and again (what is gone is gone).
CREATE OR REPLACE FUNCTION pgsched.purge_history(now timestamptz DEFAULT now(), max_rows integer DEFAULT NULL)
RETURNS TABLE (runs bigint, instances bigint)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    p record;
    shortest interval;
BEGIN
    IF purge_history.now IS NULL THEN
        PERFORM pgsched._bad_arg('now', 'NULL', 'a timestamptz: the time to judge the rows'' age by', '22004');
    END IF;
    IF max_rows IS NOT NULL AND max_rows < 1 THEN
        PERFORM pgsched._bad_arg('max_rows', format('%s is less than 1', max_rows),
                                 'a whole number from 1 up, or NULL for every row past its retention');
    END IF;
    -- Every owner's rows go, by the one policy: the catalog's administrators only (a `now` in the
    -- future would delete rows the policy keeps), who as owners of the tables pass their
    -- row-level security.
    IF NOT pgsched._catalog_admin() THEN
        RAISE EXCEPTION USING ERRCODE = '42501',
            MESSAGE = 'permission denied to purge pgsched''s history',
            HINT = 'the schedulers apply the retention on their own (pgsched.settings shows when they last did); '
                   || 'only the pgsched catalog''s owner role and its members purge by hand';
    END IF;
    SELECT * INTO p FROM pgsched._history_policy;
    -- The shortest retention any row may have: the rows older than that are the candidates, read
    -- by job_run_finished_idx from the oldest.
    SELECT least(p.success_retention, p.failure_retention, min(j.success_retention), min(j.failure_retention))
      INTO shortest FROM pgsched.job j;
    WITH doomed AS (
        SELECT r.run_id
          FROM pgsched.job_run r
          JOIN pgsched.job j ON j.job_id = r.job_id
         WHERE r.finished_at < purge_history.now - shortest
           AND r.finished_at < purge_history.now - pgsched._retention(r.outcome, j.success_retention,
                                                                      j.failure_retention, p.success_retention,
                                                                      p.failure_retention)
           AND r.outcome NOT IN ('running', 'queued')
           -- the rows that keep a run from happening twice (see _forget_runs), while they do: a
           -- triggered run's for as long as schedulers retry the request (pgsched/requests.py,
           -- TRIGGER_TTL), an '@restart' run's for as long as the server start it ran for lasts
           AND NOT (r.trigger = 'manual' AND r.finished_at > purge_history.now - interval '10 minutes')
           AND NOT (r.scope = '' AND r.plan_time = pg_catalog.pg_postmaster_start_time()
                    AND j.schedule = '@restart')
         ORDER BY r.finished_at
         LIMIT max_rows
           FOR UPDATE OF r SKIP LOCKED
    ), gone AS (
        DELETE FROM pgsched.job_run r USING doomed d WHERE r.run_id = d.run_id RETURNING 1
    )
    SELECT count(*) INTO runs FROM gone;
    WITH gone AS (
        DELETE FROM pgsched.instance i
         WHERE coalesce(i.stopped_at, i.heartbeat_at)
               < purge_history.now - greatest(p.success_retention, p.failure_retention)
           AND NOT EXISTS (SELECT 1 FROM pgsched.job_run r
                            WHERE r.outcome = 'running' AND r.instance_id = i.instance_id)
        RETURNING 1
    )
    SELECT count(*) INTO instances FROM gone;
    RETURN NEXT;
END
$$;

-- A scheduler's turn to purge: true for the one instance that asks first once `every` has passed
-- since the last turn (the policy row's lock orders them; the others get false until the next).
CREATE OR REPLACE FUNCTION pgsched._purge_turn(every interval, now timestamptz DEFAULT now())
RETURNS boolean LANGUAGE sql
SET search_path = pg_catalog, pg_temp AS $$
    WITH t AS (
        INSERT INTO pgsched.history_policy AS p (purged_at) VALUES (_purge_turn.now)
        ON CONFLICT ON CONSTRAINT history_policy_pkey DO UPDATE SET purged_at = excluded.purged_at
         WHERE p.purged_at IS NULL OR p.purged_at <= excluded.purged_at - every
        RETURNING 1)
    SELECT EXISTS (SELECT 1 FROM t)
$$;
