-- The two bracketing writes around every run, and run_job.
--
-- Why the crash counters go up BEFORE the run: a run can end in a way that
-- leaves nobody able to write (the worker is killed, the scheduler is killed,
-- the server restarts). So mark_start commits total_crashes + 1 and
-- consecutive_crashes + 1 together with the 'running' history row, and
-- mark_end takes the crash back when the run ends in any other way. A run that
-- never reaches mark_end is thereby already counted as a crash; whoever later
-- finds its 'running' row only has to close it, never to count it again.

-- All of this file's functions are internal: replaced whole on every upgrade.
SELECT pgsched._drop_functions(ARRAY[
    '_check_may_act',
    '_end_run',
    '_end_runs',
    '_event',
    '_mark_end',
    '_mark_end_v2',
    '_mark_start',
    '_run_job_end',
    '_run_job_start',
    '_session_may_act']);

CREATE OR REPLACE FUNCTION pgsched._mark_start(job_id integer, plan_time timestamptz, trigger text,
                                               worker_pid integer DEFAULT NULL,
                                               backend_pid integer DEFAULT NULL,
                                               instance_id bigint DEFAULT NULL,
                                               lease_token bigint DEFAULT NULL,
                                               started_at timestamptz DEFAULT clock_timestamp())
RETURNS bigint LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    st pgsched.job_stat;
    rid bigint;
BEGIN
    SELECT * INTO st FROM pgsched.job_stat s WHERE s.job_id = _mark_start.job_id FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM pgsched._job_not_found(_mark_start.job_id);
    END IF;
    -- A run in progress: its job is starting or terminating, or, paused and run by hand
    -- (see below), disabled with its current run still open.
    IF st.state IN ('starting', 'terminating')
       OR (st.state = 'disabled' AND st.current_run_id IS NOT NULL
           AND EXISTS (SELECT 1 FROM pgsched.job_run_live r
                        WHERE r.run_id = st.current_run_id AND r.outcome = 'running')) THEN
        RAISE EXCEPTION USING ERRCODE = '55006',
            MESSAGE = format('job %s is already running (run %s)', _mark_start.job_id, st.current_run_id),
            HINT = 'wait for the run to end (see pgsched.job_stats), then try again';
    END IF;
    INSERT INTO pgsched.job_run_live (job_id, plan_time, trigger, started_at, outcome, worker_pid, backend_pid,
                                      instance_id, lease_token, heartbeat_at, concurrency_key)
    VALUES (_mark_start.job_id, _mark_start.plan_time, _mark_start.trigger, _mark_start.started_at, 'running',
            _mark_start.worker_pid, _mark_start.backend_pid, _mark_start.instance_id, _mark_start.lease_token,
            _mark_start.started_at, st.concurrency_key)
    RETURNING run_id INTO rid;
    -- A paused job run by hand (run_job, `pgsched run`) stays disabled: the state machine
    -- has no disabled -> starting, and its scheduled flag is what a scheduler goes by.
    UPDATE pgsched.job_stat s
       SET state = CASE WHEN s.state = 'disabled' THEN s.state ELSE 'starting' END,
           current_run_id = rid, last_start = _mark_start.started_at,
           total_runs = s.total_runs + 1, total_crashes = s.total_crashes + 1,
           consecutive_crashes = s.consecutive_crashes + 1
     WHERE s.job_id = _mark_start.job_id;
    RETURN rid;
END
$$;

-- The payload of a pgsched_events notification (README "Events"): ids, the outcome and
-- the plan, never a job's name, message or config (anyone may LISTEN).
CREATE OR REPLACE FUNCTION pgsched._event(event text, job_id integer, run_id bigint, outcome text,
                                          attempt integer, plan_time timestamptz)
RETURNS text LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT pg_catalog.json_build_object('event', event, 'job_id', job_id, 'run_id', run_id, 'outcome', outcome,
                                        'attempt', attempt, 'plan_time', plan_time)::text
$$;

-- Close runs: one writer of a run's end and of what it does to its job. Each element of
-- `ends` (a jsonb array) closes one run: run_id, outcome (success | failure | timeout |
-- crash | cancelled), sqlstate, message, rows_affected, result, finished_at, next_start
-- (NULL keeps the stored one: manual runs do not move the schedule), schedule_delay_s (the
-- delay next_start was computed with: re-based on the job's delay now, so that no plan falls
-- between the two if it was changed during the run), disable_reason, and lease_token (when
-- given, the run must still carry it: another scheduler may have taken it over).
-- A run already closed (by a scheduler that found it crashed, or because the job was
-- deleted) or no longer carrying the lease is left as it is, so an outcome is never recorded
-- twice; the check is made under the run's row lock, kept until commit.
-- The end of a plan run decides its job's state: disabled when disable_reason is given or the
-- job was paused meanwhile, else scheduled; a scope run counts in the totals and leaves the
-- state and next start to its plan run. counters = false closes without touching the job's
-- counters and times (_close_runs' fallback for rows that cannot be updated).
-- Returns the runs it closed with their job's state before and after.
-- Set-based: a batch of runs costs a few statements, not a few per run (the close runs for
-- every run; per-run statements were a quarter of the scheduler's database time).
-- forget => false: the caller still reads the closed rows, and calls _forget_runs itself after.
CREATE OR REPLACE FUNCTION pgsched._end_runs(ends jsonb, counters boolean DEFAULT true, forget boolean DEFAULT true)
-- drop_row: the run's row goes at the end of its close (its job's history level keeps none of it;
-- _forget_runs keeps the rows that guard against a second run all the same).
RETURNS TABLE (run_id bigint, job_id integer, scope text, outcome text, old_state text, new_state text,
               drop_row boolean)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
-- Everything here is read by key, a few rows of large tables. A statement's plan is kept for the
-- session from its first calls, which a new scheduler makes while job_run is a few pages: a
-- sequential scan of it then (0.5 ms a close with 2,400 runs, bench/claim_close.py) stayed until
-- an ANALYZE of the table replaced the plan. And no JIT: with sequential scans off, a scan the
-- planner has no other way for (an empty table's) costs the statement past jit_above_cost, and
-- compiling it took a second a close.
SET enable_seqscan = off
SET jit = off AS $$
DECLARE
    c record;
    bad text;
    disable integer[] := '{}';
    keys_freed text[] := '{}';
    ok_jobs integer[] := '{}';
    ok_plans timestamptz[] := '{}';
    ok_at timestamptz;  -- when the last of them ended: the clock of what is due then
    run_ids bigint[];
    run_jobs integer[];
    forgotten bigint[] := '{}';
    -- The retention and the partitions' range, read apart: joined into the statement, the policy
    -- table (empty, or one row) counted for hundreds of rows, and the close then read all of
    -- job_run_live to update its few.
    policy record;
BEGIN
    SELECT x.outcome INTO bad
      FROM jsonb_to_recordset(ends) AS x(outcome text)
     WHERE x.outcome IS NULL
        OR x.outcome NOT IN ('success', 'failure', 'timeout', 'crash', 'cancelled', 'skipped')
     LIMIT 1;
    IF FOUND THEN
        PERFORM pgsched._bad_arg('outcome', coalesce(quote_literal(bad), 'NULL'),
                                 'one of success, failure, timeout, crash, cancelled, skipped');
    END IF;
    -- A close that disables jobs (disable_reason) pauses them at its end (UPDATE pgsched.job below),
    -- and one that queues scope runs (_close_batch: a plan's scopes, a scope's retry) inserts runs
    -- whose foreign key locks their job's row: those rows first, in the order of their ids, before
    -- the runs and job_stat rows, as alter_job, _disable_job_v2, delete_job and an upstream's
    -- deletion (_upstream_deleted) take a job's row first. Else such a close and one of those, at
    -- once, wait for each other (40P01). Each with the lock it will take anyway: the pause's, and
    -- the foreign key's (KEY SHARE, which waits for a deletion but not for alter_job). A test of
    -- the argument only, for the other closes.
    IF ends @? '$[*] ? (@.disable_reason != null || @.scopes.type() == "array" || @.retry_at.type() == "string")' THEN
        PERFORM 1 FROM pgsched.job j
         WHERE j.job_id IN (SELECT jr.job_id FROM pgsched.job_run_live jr
                             WHERE jr.run_id IN (SELECT (x->>'run_id')::bigint FROM jsonb_array_elements(ends) x
                                                  WHERE x->>'disable_reason' IS NOT NULL))
         ORDER BY j.job_id FOR NO KEY UPDATE;
        PERFORM 1 FROM pgsched.job j
         WHERE j.job_id IN (SELECT jr.job_id FROM pgsched.job_run_live jr
                             WHERE jr.run_id IN (SELECT (x->>'run_id')::bigint FROM jsonb_array_elements(ends) x
                                                  WHERE jsonb_typeof(x->'scopes') = 'array'
                                                     OR jsonb_typeof(x->'retry_at') = 'string'))
         ORDER BY j.job_id FOR KEY SHARE;
    END IF;
    -- Where jobs depend on the ones closed, the job_stat rows this close writes are locked first, in
    -- one order (job_id): the closed runs' jobs and the '@after' dependents their success may plan
    -- (07_dependencies.sql, _upstreams_succeeded). Else a close of A (A -> B) holding A's row and
    -- waiting for B's would deadlock with a close of B (B -> C) holding B's and waiting for C's,
    -- where the first also closes a run of C. (Claims take these rows with SKIP LOCKED: never a
    -- wait.) Every close does it while any job depends on another, so that two closes of one run
    -- (its scheduler's and a takeover's) lock in one order too; one probe of an empty table when
    -- none does.
    IF EXISTS (SELECT 1 FROM pgsched.job_dependency) THEN
        run_ids := ARRAY(SELECT (x->>'run_id')::bigint FROM jsonb_array_elements(ends) x);
        -- The runs first, as the statement below and a takeover (_take_over_v2) lock them: run, then
        -- its job's row.
        SELECT pg_catalog.array_agg(l.job_id) INTO run_jobs
          FROM (SELECT jr.job_id FROM pgsched.job_run_live jr WHERE jr.run_id = ANY (run_ids)
                 ORDER BY jr.run_id FOR UPDATE) l;
        -- The rows by key, from arrays: as one statement joining runs and edges, its plan (made for
        -- the session from the first calls) read every job_stat row and every edge at each close.
        PERFORM 1 FROM pgsched.job_stat s
         WHERE s.job_id = ANY (run_jobs || ARRAY(SELECT d.job_id FROM pgsched.job_dependency d
                                                  WHERE d.upstream_id = ANY (run_jobs)))
         ORDER BY s.job_id
           FOR UPDATE OF s;
    END IF;
    SELECT * INTO policy FROM pgsched._history_policy;
    FOR c IN
        WITH e AS (
            SELECT * FROM jsonb_to_recordset(ends) AS x(
                run_id bigint, outcome text, sqlstate text, message text, next_start timestamptz,
                finished_at timestamptz, disable_reason text, rows_affected bigint, result jsonb,
                lease_token bigint, schedule_delay_s float8, excluded integer, worker_pid integer,
                backend_pid integer)
        ), r AS (
            -- The runs still open to this close, locked in one order (no deadlock between two closes).
            SELECT jr.run_id, jr.job_id, jr.scope, jr.started_at, jr.attempt, jr.plan_time, e.outcome, e.sqlstate,
                   e.message,
                   e.rows_affected, e.result, e.disable_reason, coalesce(e.excluded, 0) AS excluded,
                   e.worker_pid, e.backend_pid,
                   -- One clock stamps a run; never let a finish precede its start.
                   greatest(coalesce(e.finished_at, pg_catalog.clock_timestamp()), jr.started_at) AS fin,
                   CASE WHEN e.next_start IS NOT NULL AND e.schedule_delay_s IS NOT NULL
                        THEN pgsched._delayed(pgsched._delayed(e.next_start,
                                 -pg_catalog.make_interval(secs => e.schedule_delay_s)), j.schedule_delay)
                        ELSE e.next_start END AS next_start,
                   j.scheduled, jr.concurrency_key, j.schedule = '@after' AS after_upstreams, j.schedule_delay,
                   -- whether the job's history level keeps the row, and if so whether it moves to the
                   -- partition of job_run of its end of retention (migration 0015)
                   pgsched._kept(j.history, e.outcome) AS kept,
                   NOT pgsched._kept_in_place(jr.trigger, jr.instance_id, j.schedule, jr.scope) AS movable,
                   pgsched._retention(e.outcome, j.success_retention, j.failure_retention, policy.success_retention,
                                      policy.failure_retention) AS retention
              FROM pgsched.job_run_live jr
              JOIN e ON e.run_id = jr.run_id
              JOIN pgsched.job j ON j.job_id = jr.job_id
             WHERE jr.outcome = 'running' AND (e.lease_token IS NULL OR jr.lease_token = e.lease_token)
             ORDER BY jr.run_id
               FOR UPDATE OF jr
        ), closed AS (
            -- Through job_run, with the end of retention: the row moves to its partition (a row its
            -- level drops, or kept in place, stays in job_run_live: pgsched._forget_runs).
            UPDATE pgsched.job_run jr
               SET finished_at = r.fin, outcome = r.outcome, sqlstate = r.sqlstate, message = r.message,
                   rows_affected = r.rows_affected, result = r.result,
                   -- The claim recorded the worker it meant; another ran it (owner matching, a
                   -- reconnect): written here, in the row's one update, and not by a later
                   -- statement, which would find the row in its time partition by a scan. A
                   -- backend_pid may be NULL with a worker_pid (a worker not Ready yet). Every
                   -- close says so, _close_runs' one-run fallback included.
                   worker_pid = coalesce(r.worker_pid, jr.worker_pid),
                   backend_pid = CASE WHEN r.worker_pid IS NULL THEN jr.backend_pid ELSE r.backend_pid END,
                   keep_until = CASE WHEN r.kept AND r.movable
                                     THEN pgsched._keep_until(r.fin, r.retention, policy.partitions_from,
                                                              policy.partitions_until) END
              FROM r
             WHERE jr.run_id = r.run_id AND jr.keep_until IS NULL
            RETURNING jr.run_id
        ), per_job AS (
            -- A job has at most one plan run open; its scope runs only add to the totals.
            SELECT r.job_id, max(r.run_id) FILTER (WHERE r.scope = '') AS plan_run,
                   max(r.fin) AS last_fin,
                   max(r.fin) FILTER (WHERE r.outcome = 'success') AS last_ok,
                   max(r.outcome) FILTER (WHERE r.scope = '') AS plan_outcome,
                   max(r.fin - r.started_at) FILTER (WHERE r.scope = '') AS plan_duration,
                   max(r.next_start) FILTER (WHERE r.scope = '') AS plan_next,
                   max(r.plan_time) FILTER (WHERE r.scope = '') AS plan_time,
                   bool_or(r.after_upstreams) AS after_upstreams, max(r.schedule_delay) AS schedule_delay,
                   max(r.disable_reason) FILTER (WHERE r.scope = '') AS disable_reason,
                   bool_and(r.scheduled) AS scheduled,
                   count(*) FILTER (WHERE r.outcome = 'success')::integer AS oks,
                   count(*) FILTER (WHERE r.outcome IN ('failure', 'timeout'))::integer AS fails,
                   count(*) FILTER (WHERE r.outcome <> 'crash')::integer AS not_crashed,
                   -- 'skipped': a plan the job's exclusion window passed over (pgsched/exclusion.py).
                   -- The claim counted it as a run; it is not one.
                   count(*) FILTER (WHERE r.outcome = 'skipped')::integer AS skips,
                   coalesce(sum(r.excluded) FILTER (WHERE r.outcome = 'skipped'), 0)::integer AS passed_over
              FROM r GROUP BY r.job_id
        ), before AS (
            -- The statement's snapshot: the jobs' state before this close.
            SELECT s.job_id, s.state FROM pgsched.job_stat s WHERE s.job_id IN (SELECT p.job_id FROM per_job p)
        ), after AS (
            UPDATE pgsched.job_stat s
               SET state = CASE WHEN p.plan_run IS NULL THEN s.state
                                WHEN p.disable_reason IS NOT NULL OR NOT p.scheduled THEN 'disabled'
                                ELSE 'scheduled' END,
                   disabled_reason = coalesce(p.disable_reason, s.disabled_reason),
                   current_run_id = CASE WHEN s.current_run_id = p.plan_run THEN NULL ELSE s.current_run_id END,
                   last_finish = CASE WHEN NOT counters OR p.plan_outcome = 'skipped' THEN s.last_finish
                                      WHEN p.plan_run IS NOT NULL THEN p.last_fin
                                      ELSE greatest(s.last_finish, p.last_fin) END,
                   last_successful_finish = CASE WHEN NOT counters OR p.last_ok IS NULL THEN s.last_successful_finish
                                                 WHEN p.plan_run IS NOT NULL THEN p.last_ok
                                                 ELSE greatest(s.last_successful_finish, p.last_ok) END,
                   last_run_success = CASE WHEN counters AND p.plan_run IS NOT NULL AND p.plan_outcome <> 'skipped'
                                           THEN p.plan_outcome = 'success' ELSE s.last_run_success END,
                   last_run_duration = CASE WHEN counters AND p.plan_run IS NOT NULL AND p.plan_outcome <> 'skipped'
                                            THEN p.plan_duration ELSE s.last_run_duration END,
                   total_runs = s.total_runs - CASE WHEN counters THEN p.skips ELSE 0 END,
                   total_skipped = s.total_skipped + CASE WHEN counters THEN p.skips + p.passed_over ELSE 0 END,
                   total_successes = s.total_successes + CASE WHEN counters THEN p.oks ELSE 0 END,
                   total_failures = s.total_failures + CASE WHEN counters THEN p.fails ELSE 0 END,
                   total_crashes = s.total_crashes - CASE WHEN counters THEN p.not_crashed ELSE 0 END,
                   consecutive_crashes = CASE WHEN NOT counters OR p.plan_run IS NULL OR p.plan_outcome = 'crash'
                                                  THEN s.consecutive_crashes
                                              -- the claim's count of it, taken back: not a run
                                              WHEN p.plan_outcome = 'skipped' THEN greatest(s.consecutive_crashes - 1, 0)
                                              ELSE 0 END,
                   consecutive_failures = CASE WHEN NOT counters OR p.plan_run IS NULL THEN s.consecutive_failures
                                               WHEN p.plan_outcome = 'success' THEN 0
                                               WHEN p.plan_outcome IN ('failure', 'timeout')
                                                   THEN s.consecutive_failures + 1
                                               ELSE s.consecutive_failures END,
                   -- An @after job's plan that ran was its pending one: the next waiting takes its place
                   -- (07_dependencies.sql). Not another run's (run by hand), which leaves it pending.
                   next_start = CASE WHEN p.after_upstreams AND p.plan_run IS NOT NULL
                                          AND s.next_start = pgsched._delayed(p.plan_time, p.schedule_delay)
                                     THEN pgsched._delayed(s.upstream_backlog[1], p.schedule_delay)
                                     -- its upstreams plan it, whatever the run's scheduler computed (a
                                     -- schedule it had when the run started)
                                     WHEN p.after_upstreams AND p.plan_run IS NOT NULL THEN s.next_start
                                     WHEN counters AND p.plan_run IS NOT NULL THEN coalesce(p.plan_next, s.next_start)
                                     ELSE s.next_start END,
                   upstream_backlog = CASE WHEN p.after_upstreams AND p.plan_run IS NOT NULL
                                                AND s.next_start = pgsched._delayed(p.plan_time, p.schedule_delay)
                                           THEN nullif(s.upstream_backlog[2:], '{}')
                                           ELSE s.upstream_backlog END
              FROM per_job p
             WHERE s.job_id = p.job_id
            RETURNING s.job_id, s.state, p.disable_reason IS NOT NULL AND p.plan_run IS NOT NULL AS disable
        )
        SELECT r.run_id, r.job_id, r.scope, r.outcome, b.state AS old_state, a.state AS new_state,
               coalesce(a.disable, false) AS disable, r.attempt, r.plan_time, r.concurrency_key, r.fin,
               NOT r.kept AS drop_row
          FROM r
          LEFT JOIN before b ON b.job_id = r.job_id
          LEFT JOIN after a ON a.job_id = r.job_id
    LOOP
        run_id := c.run_id; job_id := c.job_id; scope := c.scope; outcome := c.outcome;
        old_state := c.old_state; new_state := c.new_state; drop_row := c.drop_row;
        RETURN NEXT;
        IF c.drop_row THEN
            forgotten := forgotten || c.run_id;
        END IF;
        -- Events (README "Events"): a run that ends other than in success, and a job this close
        -- disables, are announced on pgsched_events. Here, not in a trigger: a success costs one
        -- test (a NOTIFY per success would serialize commits on the notify queue's lock). The
        -- payload names ids only; whoever LISTENs reads the details through the views, under
        -- row-level security.
        -- (A plan its exclusion window skipped is what the job asked for: no event either.)
        IF c.outcome NOT IN ('success', 'skipped') THEN
            PERFORM pg_catalog.pg_notify('pgsched_events', pgsched._event('run_end', c.job_id, c.run_id,
                                                                          c.outcome, c.attempt, c.plan_time));
        END IF;
        IF c.concurrency_key IS NOT NULL THEN
            keys_freed := keys_freed || c.concurrency_key;
        END IF;
        IF c.outcome = 'success' AND c.scope = '' THEN
            ok_jobs := ok_jobs || c.job_id;
            ok_plans := ok_plans || c.plan_time;
            ok_at := greatest(ok_at, c.fin);
        END IF;
        IF c.disable THEN
            disable := disable || c.job_id;
            PERFORM pg_catalog.pg_notify('pgsched_events', pgsched._event('job_disabled', c.job_id, c.run_id,
                                                                          c.outcome, c.attempt, c.plan_time));
        END IF;
    END LOOP;
    -- Runs that held a concurrency key ended: a job waiting for the key may start now, on any
    -- instance (README "Concurrency limits"). Only when the key was full before this close and
    -- one waits (a due job, or a queued scope run, with the key): a NOTIFY per run would
    -- serialise commits on the notify queue's lock, and wakes every instance.
    IF keys_freed <> '{}' THEN
        -- The keys that were full before this close: their free places now, less the ones this
        -- close freed, are none.
        SELECT coalesce(array_agg(f.k), '{}') INTO keys_freed
          FROM (SELECT k, count(*) AS n FROM unnest(keys_freed) AS k GROUP BY k) f
          LEFT JOIN pgsched._key_room kr ON kr.concurrency_key = f.k
         WHERE coalesce(kr.free, pgsched._key_default_limit()) - f.n <= 0;
        IF keys_freed <> '{}'
           AND (EXISTS (SELECT 1 FROM pgsched.job_stat w
                         WHERE w.state = 'scheduled' AND w.concurrency_key = ANY (keys_freed)
                           AND pgsched._due_at(w.job_id, w.next_start, w.jitter_us)
                               <= pg_catalog.timezone('UTC', pg_catalog.now()))
                OR EXISTS (SELECT 1 FROM pgsched.job_run_live q JOIN pgsched.job_stat w ON w.job_id = q.job_id
                            WHERE q.outcome = 'queued' AND q.plan_time <= pg_catalog.now()
                              AND w.concurrency_key = ANY (keys_freed))) THEN
            PERFORM pg_catalog.pg_notify('pgsched_catalog', 'concurrency_key:free');
        END IF;
    END IF;
    -- Plan runs that succeeded feed the jobs that depend on theirs (07_dependencies.sql), in this
    -- transaction: an upstream's success and its dependents' runs are committed together. One probe
    -- of an index when no job depends on them.
    IF ok_jobs <> '{}' AND EXISTS (SELECT 1 FROM pgsched.job_dependency d WHERE d.upstream_id = ANY (ok_jobs)) THEN
        PERFORM pgsched._upstreams_succeeded(ok_jobs, ok_plans, now => ok_at);
    END IF;
    IF disable <> '{}' THEN
        -- After the statement above: pausing the job fires its trigger, which writes job_stat too.
        UPDATE pgsched.job j SET scheduled = false WHERE j.job_id = ANY (disable) AND j.scheduled;
    END IF;
    -- Only when a closed run's job keeps no row of it: a statement less per close for the others.
    IF forget AND forgotten <> '{}' THEN
        PERFORM pgsched._forget_runs(forgotten);
    END IF;
END
$$;

-- One run's close (_end_runs) as run_job and pgsched run read it: whether it closed (API 1's
-- _mark_end, 41_api1.sql, is this without counters).
CREATE OR REPLACE FUNCTION pgsched._mark_end_v2(run_id bigint, outcome text, sqlstate text, message text,
                                             next_start timestamptz,
                                             finished_at timestamptz DEFAULT clock_timestamp(),
                                             disable_reason text DEFAULT NULL,
                                             rows_affected bigint DEFAULT NULL,
                                             result jsonb DEFAULT NULL,
                                             lease_token bigint DEFAULT NULL,
                                             counters boolean DEFAULT true)
RETURNS boolean LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
-- PL/pgSQL rather than SQL: it keeps its statement's plan for the session.
BEGIN
    RETURN EXISTS (SELECT 1 FROM pgsched._end_runs(pg_catalog.jsonb_build_array(pg_catalog.jsonb_build_object(
        'run_id', _mark_end_v2.run_id, 'outcome', _mark_end_v2.outcome, 'sqlstate', _mark_end_v2.sqlstate,
        'message', _mark_end_v2.message, 'next_start', _mark_end_v2.next_start, 'finished_at', _mark_end_v2.finished_at,
        'disable_reason', _mark_end_v2.disable_reason, 'rows_affected', _mark_end_v2.rows_affected,
        'result', _mark_end_v2.result, 'lease_token', _mark_end_v2.lease_token)), _mark_end_v2.counters));
END
$$;

-- run_job's two marks. The caller may not write job_stat and job_run itself
-- (0002_security.sql), so these run as the schema owner, and allow only what
-- run_job does: start a manual run of a job the session's user may act as
-- (session_user: every role this session can become, the session user may SET ROLE
-- to), and close a manual run that this very backend started.
-- Whether the session's user may act as `owner`, a role that still exists (pgsched._may_act_as,
-- migration 0017): the one test of run_job, trigger_job, cancel_job (_check_may_act) and of
-- cron._forget_run. session_user, not current_user: these run as the schema's owner.
CREATE OR REPLACE FUNCTION pgsched._session_may_act(owner oid)
RETURNS boolean LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.oid = _session_may_act.owner)
           AND pgsched._may_act_as(session_user, _session_may_act.owner)
$$;

-- The job's owner, if the session's user may act as it (_session_may_act); else job-not-found.
CREATE OR REPLACE FUNCTION pgsched._check_may_act(job_id integer)
RETURNS regrole LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    job_owner oid;
BEGIN
    IF _check_may_act.job_id IS NULL THEN
        PERFORM pgsched._bad_arg('job_id', 'NULL', 'the id of an existing job', '22004');
    END IF;
    SELECT j.owner INTO job_owner FROM pgsched.job j WHERE j.job_id = _check_may_act.job_id;
    IF job_owner IS NULL OR NOT pgsched._session_may_act(job_owner) THEN
        PERFORM pgsched._job_not_found(_check_may_act.job_id);
    END IF;
    RETURN job_owner::regrole;
END
$$;

CREATE OR REPLACE FUNCTION pgsched._run_job_start(job_id integer)
RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM pgsched._check_may_act(_run_job_start.job_id);
    RETURN pgsched._mark_start(_run_job_start.job_id, pg_catalog.clock_timestamp(), 'manual', NULL,
                               pg_catalog.pg_backend_pid());
END
$$;

CREATE OR REPLACE FUNCTION pgsched._run_job_end(run_id bigint, sqlstate text, message text)
RETURNS boolean LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pgsched.job_run_live r
                    WHERE r.run_id = _run_job_end.run_id AND r.trigger = 'manual' AND r.instance_id IS NULL
                      AND r.backend_pid = pg_catalog.pg_backend_pid() AND r.outcome = 'running') THEN
        RETURN false;
    END IF;
    RETURN pgsched._mark_end_v2(_run_job_end.run_id, CASE WHEN _run_job_end.sqlstate IS NULL THEN 'success'
                                                       ELSE 'failure' END,
                             _run_job_end.sqlstate, _run_job_end.message, NULL);
END
$$;

-- Run a job now in the calling session, recorded like any run. Must be called
-- with CALL outside an explicit transaction block: it commits the start mark
-- before running the job, so a session that dies mid-run is counted as a crash.
-- The job runs inside a subtransaction so that its failure can be recorded;
-- a procedure run this way therefore cannot COMMIT (the scheduler runs
-- procedures at top level, where they can).
-- The job runs as its owner: a caller who is not the owner but may SET ROLE to it
-- (pgsched._may_act_as) runs it under SET LOCAL ROLE; anyone else (the database
-- owner, who sees all jobs, or a member granted the owner WITH SET FALSE) is
-- refused, since running another role's SQL with one's own rights is how a
-- trojan works. The session is still the caller's, so the job's SQL could
-- RESET ROLE back to the caller: run by hand only jobs you trust; the
-- scheduler's sessions, opened as the owner, are the isolated path.
CREATE OR REPLACE PROCEDURE pgsched.run_job(job_id integer)
LANGUAGE plpgsql AS $$
DECLARE
    j pgsched.job;
    is_procedure boolean;
    rid bigint;
    err_state text;
    err_msg text;
    err_detail text;
    err_hint text;
    owner_name name;
BEGIN
    IF run_job.job_id IS NULL THEN
        PERFORM pgsched._bad_arg('job_id', 'NULL', 'the id of an existing job', '22004');
    END IF;
    SELECT * INTO j FROM pgsched.job WHERE job.job_id = run_job.job_id;
    IF NOT FOUND THEN
        PERFORM pgsched._job_not_found(run_job.job_id);
    END IF;
    SELECT r.rolname INTO owner_name FROM pg_catalog.pg_roles r WHERE r.oid = j.owner;
    IF owner_name IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '42704',
            MESSAGE = format('job %s belongs to role %s, which no longer exists', j.job_id, j.owner::oid),
            HINT = 'delete the job with delete_job';
    ELSIF owner_name <> current_user AND NOT pgsched._may_act_as(current_user, j.owner) THEN
        RAISE EXCEPTION USING ERRCODE = '42501',
            MESSAGE = format('job %s belongs to role %I, which role %I may not become', j.job_id, owner_name,
                             current_user),
            DETAIL = 'run_job runs the job in your session as its owner',
            HINT = 'only the owner (or a role that may SET ROLE to it) may run it by hand; the scheduler runs it as '
                   || 'its owner';
    END IF;
    IF j.kind = 'python' THEN
        RAISE EXCEPTION USING ERRCODE = '0A000',
            MESSAGE = format('job %s is a Python job: run it with `pgsched run %s` where its module is importable',
                             j.job_id, j.job_id);
    END IF;
    rid := pgsched._run_job_start(j.job_id);
    COMMIT;
    -- What the scheduler's worker tells a run (see pgsched/worker.py), for this transaction: a
    -- manual run's plan time is its start.
    PERFORM pg_catalog.set_config('pgsched.run_id', rid::text, true),
            pg_catalog.set_config('pgsched.plan_time',
                                  (SELECT r.plan_time FROM pgsched.job_run_live r WHERE r.run_id = rid)::text, true),
            pg_catalog.set_config('pgsched.scope', '', true);
    IF owner_name <> current_user THEN
        EXECUTE format('SET LOCAL ROLE %I', owner_name);
    END IF;
    BEGIN
        IF j.kind = 'command' THEN
            EXECUTE j.command;
        ELSE
            SELECT p.prokind = 'p' INTO is_procedure
              FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
             WHERE n.nspname = j.proc_schema AND p.proname = j.proc_name
               AND p.proargtypes = '23 3802'::pg_catalog.oidvector;
            IF is_procedure IS NULL THEN
                RAISE EXCEPTION USING ERRCODE = '42883',
                    MESSAGE = format('function %I.%I(integer, jsonb) of job %s does not exist', j.proc_schema,
                                     j.proc_name, j.job_id);
            END IF;
            EXECUTE format(CASE WHEN is_procedure THEN 'CALL %I.%I($1, $2)' ELSE 'SELECT %I.%I($1, $2)' END,
                           j.proc_schema, j.proc_name)
              USING j.job_id, j.config;
        END IF;
    EXCEPTION WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS err_state = RETURNED_SQLSTATE, err_msg = MESSAGE_TEXT,
                                err_detail = PG_EXCEPTION_DETAIL, err_hint = PG_EXCEPTION_HINT;
    END;
    PERFORM pgsched._run_job_end(rid, err_state, err_msg);
    COMMIT;
    -- Re-raise the job's own error; RAISE cannot take a NULL option and an empty one
    -- would still be shown, so only the parts the error had are passed on.
    IF err_state IS NULL THEN
        RETURN;
    ELSIF nullif(err_detail, '') IS NULL AND nullif(err_hint, '') IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = err_state, MESSAGE = err_msg;
    ELSIF nullif(err_hint, '') IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = err_state, MESSAGE = err_msg, DETAIL = err_detail;
    ELSIF nullif(err_detail, '') IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = err_state, MESSAGE = err_msg, HINT = err_hint;
    END IF;
    RAISE EXCEPTION USING ERRCODE = err_state, MESSAGE = err_msg, DETAIL = err_detail, HINT = err_hint;
END
$$;
