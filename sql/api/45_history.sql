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
-- partition_width: how much of keep_until one partition of job_run covers (migration 0015): a
-- day's worth of ends of retention, so a row is kept at most a day past its retention, and the
-- failures' 30 days take about 31 partitions.
SELECT pgsched._replace_if_changed('pgsched._history_policy', NULL, $ddl$
CREATE OR REPLACE VIEW pgsched._history_policy AS
SELECT coalesce(p.success_retention, d.success_retention) AS success_retention,
       coalesce(p.failure_retention, d.failure_retention) AS failure_retention,
       d.success_retention AS success_default, d.failure_retention AS failure_default, p.purged_at,
       coalesce(p.partition_width, d.partition_width) AS partition_width, d.partition_width AS partition_width_default,
       p.partitions_from, p.partitions_until
  FROM (VALUES (interval '7 days', interval '30 days', interval '1 day'))
           AS d(success_retention, failure_retention, partition_width)
  -- ON p.one, not ON true: its key reads it, also where sequential scans are off (the close,
  -- pgsched._end_runs), which would otherwise cost the close past jit_above_cost.
  LEFT JOIN pgsched.history_policy p ON p.one
$ddl$);
GRANT SELECT ON pgsched._history_policy TO PUBLIC;

-- The database's retention. Shared by every owner's jobs, so only the catalog's administrators
-- set it. NULL keeps a value as it is. Returns the policy now in force. A change applies to the
-- runs that end after it: a closed run's row keeps the end of retention its close gave it (the
-- partition it is in is dropped whole then). "partition": the partitions' width (see
-- _history_policy), for the partitions made after the change.
DROP FUNCTION IF EXISTS pgsched.set_retention(interval, interval);
CREATE OR REPLACE FUNCTION pgsched.set_retention(success interval DEFAULT NULL, failure interval DEFAULT NULL,
                                                 "partition" interval DEFAULT NULL)
RETURNS TABLE (success_retention interval, failure_retention interval, partition_width interval)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM pgsched._check_retention(set_retention.success, 'success', job_setting => false),
            pgsched._check_retention(set_retention.failure, 'failure', job_setting => false);
    -- In days and smaller units: the partitions' bounds are multiples of it (date_bin).
    IF set_retention.partition < interval '1 second'
       OR pg_catalog.date_part('month', set_retention.partition) <> 0
       OR pg_catalog.date_part('year', set_retention.partition) <> 0 THEN
        PERFORM pgsched._bad_arg('partition', format('%s is %s', set_retention.partition,
                                                           CASE WHEN set_retention.partition < interval '1 second'
                                                                THEN 'less than a second'
                                                                ELSE 'in months or years' END),
                                 'a duration of a second or more in days, hours, minutes or seconds such as '
                                 || '''1 day'' (how much of the rows'' ends of retention one partition of job_run '
                                 || 'covers), or NULL to keep the current one');
    END IF;
    IF NOT pgsched._catalog_admin() THEN
        RAISE EXCEPTION USING ERRCODE = '42501',
            MESSAGE = 'permission denied to set the retention of pgsched''s history',
            HINT = 'the retention applies to every owner''s runs: only the pgsched catalog''s owner role and the '
                   || 'roles that may SET ROLE to it set it; a job''s owner may set the job''s own (add_job or alter_job: '
                   || 'success_retention, failure_retention)';
    END IF;
    INSERT INTO pgsched.history_policy AS p (success_retention, failure_retention, partition_width)
    VALUES (set_retention.success, set_retention.failure, set_retention.partition)
    ON CONFLICT ON CONSTRAINT history_policy_pkey DO UPDATE
       SET success_retention = coalesce(set_retention.success, p.success_retention),
           failure_retention = coalesce(set_retention.failure, p.failure_retention),
           partition_width = coalesce(set_retention.partition, p.partition_width),
           updated_at = pg_catalog.now();
    RETURN QUERY SELECT v.success_retention, v.failure_retention, v.partition_width FROM pgsched._history_policy v;
END
$$;

-- The database-wide settings a user may read: name, value, default, what it does.
SELECT pgsched._replace_if_changed('pgsched.settings', NULL, $ddl$
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
           ('partition_width', pgsched._interval_text(p.partition_width),
            pgsched._interval_text(p.partition_width_default),
            'how much of the rows'' ends of retention one partition of job_run covers: a row is kept up to '
            || 'that much past its retention, and its partition dropped whole (pgsched.set_retention)'),
           ('last_purge', p.purged_at::text, NULL,
            'when a scheduler last applied the retention (pgsched.purge_history)')
       ) AS s(name, value, default_value, description)
$ddl$);
GRANT SELECT ON pgsched.settings TO PUBLIC;

-- The rows of closed runs whose job's history level does not keep them (README "History and
-- retention"). Called by every close (pgsched._end_runs, or _close_batch once it is done with
-- the closed rows): the run's row has served its purpose by then. Its start was committed, so a
-- crash was counted; the close counted the outcome in job_stat; and the close moved the job's
-- next_start past the plan in the same transaction, so the plan cannot be claimed again.
-- Two kinds of row stay whatever the level, and go by the retention: they are what keeps a run
-- from happening twice. A run trigger_job started on a scheduler (every scheduler that heard the
-- request retries it while the job is busy, and its row's key is what tells them it ran:
-- _start_request; a run_job in somebody's session has no instance, and nobody retries it), and
-- an '@restart' job's plan run (its key is what passes over the server start it ran for:
-- _arm_restart_jobs, the claim's ON CONFLICT).
CREATE OR REPLACE FUNCTION pgsched._forget_runs(run_ids bigint[])
RETURNS void LANGUAGE sql
SET search_path = pg_catalog, pg_temp AS $$
    -- The close left them in job_run_live (pgsched._keep_until gives them none).
    DELETE FROM pgsched.job_run_live r
     USING pgsched.job j
     WHERE r.run_id = ANY (run_ids) AND j.job_id = r.job_id AND j.history <> 'all'
       AND r.outcome NOT IN ('running', 'queued') AND NOT pgsched._kept(j.history, r.outcome)
       AND NOT pgsched._kept_in_place(r.trigger, r.instance_id, j.schedule, r.scope)
$$;

-- The time partitions of job_run (migration 0015), with the range of keep_until each covers.
SELECT pgsched._replace_if_changed('pgsched._history_partitions', NULL, $ddl$
CREATE OR REPLACE VIEW pgsched._history_partitions AS
SELECT c.relname::text AS name, b[1]::timestamptz AS lower, b[2]::timestamptz AS upper
  FROM pg_catalog.pg_inherits i
  JOIN pg_catalog.pg_class c ON c.oid = i.inhrelid
 CROSS JOIN LATERAL pg_catalog.regexp_match(pg_catalog.pg_get_expr(c.relpartbound, c.oid),
                                            'FROM \(''([^'']+)''\) TO \(''([^'']+)''\)') AS b
 WHERE i.inhparent = 'pgsched.job_run'::pg_catalog.regclass AND b IS NOT NULL  -- not job_run_live (DEFAULT)
$ddl$);

-- What keeps job_run's partitions in step with the policy at `now`, in the order to take them:
-- 'validate' job_run_live's constraint first (once, after migration 0015: until then an attach
-- would read all of it), 'drop' the partitions whose every row is past its retention (upper <=
-- now), 'create' the missing ones ahead, as far as the longer of the database's retentions and a
-- width beyond. Reads only: pgsched._history_step takes a step, a transaction each for a
-- scheduler (pgsched/retention.py), all in one for purge_history.
CREATE OR REPLACE FUNCTION pgsched._history_steps(now timestamptz)
RETURNS TABLE (step text, name text, lower timestamptz, upper timestamptz)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    p record;
    start timestamptz;
    horizon timestamptz;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_constraint c
                    WHERE c.conrelid = 'pgsched.job_run_live'::regclass
                      AND c.conname = 'job_run_live_kept_in_place' AND c.convalidated) THEN
        step := 'validate';
        RETURN NEXT;
        RETURN;
    END IF;
    FOR name, lower, upper IN
        SELECT h.name, h.lower, h.upper FROM pgsched._history_partitions h
         WHERE h.upper <= _history_steps.now ORDER BY h.lower
    LOOP
        step := 'drop';
        RETURN NEXT;
    END LOOP;
    SELECT * INTO p FROM pgsched._history_policy;
    horizon := _history_steps.now + greatest(p.success_retention, p.failure_retention) + p.partition_width;
    -- On from the last partition, or from now after a pause that outlived them all; aligned on
    -- the width from 2000-01-01 UTC, so the bounds read well.
    SELECT greatest(max(h.upper), pg_catalog.date_bin(p.partition_width, _history_steps.now,
                                                      timestamptz '2000-01-01 00:00:00+00'))
      INTO start FROM pgsched._history_partitions h;
    WHILE start < horizon LOOP
        step := 'create';
        lower := start;
        upper := start + p.partition_width;
        name := 'job_run_' || pg_catalog.to_char(pg_catalog.timezone('UTC', start), 'YYYYMMDD_HH24MISS');
        RETURN NEXT;
        start := upper;
    END LOOP;
END
$$;

-- Take one of _history_steps' steps, and keep the range the partitions cover
-- (history_policy.partitions_from/until, what a close stamps inside of) in step with it. Each
-- holds job_run_live's lock for a moment (PostgreSQL changes the default partition's bounds with
-- each attach and drop): they wait no longer than lock_wait for it, and a step that could not
-- have it is left to the next turn (returns false). A partition belongs to job_run's owner, whoever
-- of the administrators made it.
CREATE OR REPLACE FUNCTION pgsched._history_step(step text, name text, lower timestamptz, upper timestamptz,
                                                 lock_wait interval DEFAULT interval '50 milliseconds')
RETURNS boolean LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    before text := pg_catalog.current_setting('lock_timeout');
BEGIN
    -- A validation's lock lets the claims and closes through (only another validation, DDL or a
    -- vacuum waits for it, or it for them): it waits longer, for a vacuum of job_run_live to give way.
    PERFORM pg_catalog.set_config('lock_timeout', (extract(epoch FROM CASE WHEN step = 'validate'
                                                                          THEN greatest(lock_wait, interval '5 s')
                                                                          ELSE lock_wait END)
                                                   * 1000)::bigint::text, true);
    BEGIN
        IF step = 'validate' THEN
            ALTER TABLE pgsched.job_run_live VALIDATE CONSTRAINT job_run_live_kept_in_place;
        ELSIF step = 'create' THEN
            EXECUTE format('CREATE TABLE pgsched.%I (LIKE pgsched.job_run INCLUDING DEFAULTS INCLUDING CONSTRAINTS)',
                           name);
            -- What reads a closed run: its job's history (job_history), a run by its id, the runs
            -- of a time window (the dashboard's timeline).
            EXECUTE format('CREATE INDEX ON pgsched.%I (job_id, run_id DESC)', name);
            EXECUTE format('CREATE INDEX ON pgsched.%I (run_id)', name);
            EXECUTE format('CREATE INDEX ON pgsched.%I (finished_at)', name);
            EXECUTE format('ALTER TABLE pgsched.%I OWNER TO %I', name,
                           (SELECT c.relowner::regrole::text FROM pg_catalog.pg_class c
                             WHERE c.oid = 'pgsched.job_run'::regclass));
            EXECUTE format('ALTER TABLE pgsched.job_run ATTACH PARTITION pgsched.%I FOR VALUES FROM (%L) TO (%L)',
                           name, lower, upper);
            INSERT INTO pgsched.history_policy AS p (partitions_from, partitions_until)
            VALUES (_history_step.lower, _history_step.upper)
            ON CONFLICT ON CONSTRAINT history_policy_pkey DO UPDATE
               SET partitions_from = CASE WHEN p.partitions_until = _history_step.lower THEN p.partitions_from
                                          ELSE _history_step.lower END,
                   partitions_until = _history_step.upper;
        ELSIF step = 'drop' THEN
            EXECUTE format('DROP TABLE pgsched.%I', name);
            UPDATE pgsched.history_policy p
               SET partitions_from = greatest(p.partitions_from, _history_step.upper),
                   partitions_until = greatest(p.partitions_until, _history_step.upper);
        ELSE
            PERFORM pgsched._bad_arg('step', quote_literal(step), 'validate, drop or create');
        END IF;
    -- lock_not_available: the lock was not to be had; the others: another session took the same
    -- step first (two purges at once).
    EXCEPTION WHEN lock_not_available OR duplicate_table OR undefined_table OR invalid_object_definition THEN
        PERFORM pg_catalog.set_config('lock_timeout', before, true);
        RETURN false;
    END;
    PERFORM pg_catalog.set_config('lock_timeout', before, true);
    RETURN true;
END
$$;

-- Apply the retention now: delete the rows left in job_run_live (see migration 0015) of runs that
-- ended longer ago than their retention, the rows of scheduler instances stopped (or silent) for longer
-- than the longer of the two retentions that have no run in progress, and the trigger_job and cancel_job
-- requests past pgsched._request_ttl() (50_requests.sql), then drop the partitions of
-- job_run past their end of retention and make the ones ahead. `now` is the clock to judge
-- by (default: the transaction's); max_rows bounds the rows deleted by one call (the schedulers
-- purge in batches of this many, a transaction each), NULL for all. Safe to call from several
-- sessions at once (each skips the rows another is deleting; a partition another is making or
-- dropping waits for it) and again (what is gone is gone). with_partitions => false: the rows only, no
-- partition made or dropped (a scheduler takes those steps apart, a transaction each:
-- pgsched/retention.py). Returns how many runs, instances and partitions it removed.
DROP FUNCTION IF EXISTS pgsched.purge_history(timestamptz, integer);
CREATE OR REPLACE FUNCTION pgsched.purge_history(now timestamptz DEFAULT now(), max_rows integer DEFAULT NULL,
                                                 with_partitions boolean DEFAULT true)
RETURNS TABLE (runs bigint, instances bigint, partitions bigint)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    p record;
    s record;
    shortest interval;
    purged bigint;
    pruned bigint;
    dropped bigint;
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
                   || 'only the pgsched catalog''s owner role and the roles that may SET ROLE to it purge by hand';
    END IF;
    dropped := 0;
    IF purge_history.with_partitions
       AND EXISTS (SELECT 1 FROM pgsched._history_steps(purge_history.now) h WHERE h.step = 'validate') THEN
        PERFORM pgsched._history_step('validate', NULL, NULL, NULL);
    END IF;
    SELECT * INTO p FROM pgsched._history_policy;
    -- The shortest retention any row may have: the rows older than that are the candidates, read
    -- by job_run_finished_idx from the oldest.
    SELECT least(p.success_retention, p.failure_retention, min(j.success_retention), min(j.failure_retention))
      INTO shortest FROM pgsched.job j;
    WITH doomed AS (
        SELECT r.run_id
          FROM pgsched.job_run_live r
          JOIN pgsched.job j ON j.job_id = r.job_id
         WHERE r.finished_at < purge_history.now - shortest
           AND r.finished_at < purge_history.now - pgsched._retention(r.outcome, j.success_retention,
                                                                      j.failure_retention, p.success_retention,
                                                                      p.failure_retention)
           AND r.outcome NOT IN ('running', 'queued')
           -- the rows that keep a run from happening twice (see _forget_runs), while they do: a
           -- triggered run's for as long as schedulers retry the request (_request_ttl), an
           -- '@restart' run's for as long as the server start it ran for lasts
           AND NOT (r.trigger = 'manual' AND r.finished_at > purge_history.now - pgsched._request_ttl())
           AND NOT (r.scope = '' AND r.plan_time = pg_catalog.pg_postmaster_start_time()
                    AND j.schedule = '@restart')
         ORDER BY r.finished_at
         LIMIT max_rows
           FOR UPDATE OF r SKIP LOCKED
    ), gone AS (
        DELETE FROM pgsched.job_run_live r USING doomed d WHERE r.run_id = d.run_id RETURNING 1
    )
    SELECT count(*) INTO purged FROM gone;
    WITH gone AS (
        DELETE FROM pgsched.instance i
         WHERE coalesce(i.stopped_at, i.heartbeat_at)
               < purge_history.now - greatest(p.success_retention, p.failure_retention)
           AND NOT EXISTS (SELECT 1 FROM pgsched.job_run_live r
                            WHERE r.outcome = 'running' AND r.instance_id = i.instance_id)
        RETURNING 1
    )
    SELECT count(*) INTO pruned FROM gone;
    -- trigger_job and cancel_job requests no scheduler took (50_requests.sql): past their TTL,
    -- nothing acts on them any more. Not counted: they are not history.
    DELETE FROM pgsched.request q WHERE q.requested_at < purge_history.now - pgsched._request_ttl();
    -- Last: an attach or a drop holds job_run_live's lock until the caller commits (call it in a
    -- transaction of its own). A step whose lock another session holds ends the steps: the next
    -- purge takes them.
    FOR s IN SELECT * FROM pgsched._history_steps(purge_history.now) h
              WHERE purge_history.with_partitions AND h.step <> 'validate' LOOP
        EXIT WHEN NOT pgsched._history_step(s.step, s.name, s.lower, s.upper);
        dropped := dropped + (s.step = 'drop')::integer;
    END LOOP;
    RETURN QUERY SELECT purged, pruned, dropped;
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
