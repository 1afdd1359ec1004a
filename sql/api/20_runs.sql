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
    '_end_run',
    '_event',
    '_mark_end',
    '_mark_start',
    '_run_job_end',
    '_run_job_start']);

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
           AND EXISTS (SELECT 1 FROM pgsched.job_run r
                        WHERE r.run_id = st.current_run_id AND r.outcome = 'running')) THEN
        RAISE EXCEPTION USING ERRCODE = '55006',
            MESSAGE = format('job %s is already running (run %s)', _mark_start.job_id, st.current_run_id),
            HINT = 'wait for the run to end (see pgsched.job_stats), then try again';
    END IF;
    INSERT INTO pgsched.job_run (job_id, plan_time, trigger, started_at, outcome, worker_pid, backend_pid,
                                 instance_id, lease_token, heartbeat_at)
    VALUES (_mark_start.job_id, _mark_start.plan_time, _mark_start.trigger, _mark_start.started_at, 'running',
            _mark_start.worker_pid, _mark_start.backend_pid, _mark_start.instance_id, _mark_start.lease_token,
            _mark_start.started_at)
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

-- Close a run; returns its job's state after the close. Returns NULL when the run was
-- already closed (by a scheduler that found it crashed, or because the job was deleted),
-- or when lease_token is given and the run no longer carries it (another scheduler took
-- it over): then nothing changes, so an outcome is never recorded twice. The check is made under
-- the run's row lock, which the close keeps until it commits.
-- outcome: success | failure | timeout | crash | cancelled.
-- next_start NULL keeps the stored next_start (manual runs do not move the schedule).
-- The end of a plan run also decides its job's state: disabled when disable_reason is
-- given or the job was paused meanwhile, else scheduled. This is the only place a run
-- ends; counters = false closes it without touching the job's counters and times,
-- for _finish_runs' fallback when they cannot be updated (absurd values written by hand).
-- The payload of a pgsched_events notification (README "Events"): ids, the outcome and
-- the plan, never a job's name, message or config (anyone may LISTEN).
CREATE OR REPLACE FUNCTION pgsched._event(event text, job_id integer, run_id bigint, outcome text,
                                          attempt integer, plan_time timestamptz)
RETURNS text LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT pg_catalog.json_build_object('event', event, 'job_id', job_id, 'run_id', run_id, 'outcome', outcome,
                                        'attempt', attempt, 'plan_time', plan_time)::text
$$;

CREATE OR REPLACE FUNCTION pgsched._end_run(run_id bigint, outcome text, sqlstate text, message text,
                                            next_start timestamptz,
                                            finished_at timestamptz DEFAULT clock_timestamp(),
                                            disable_reason text DEFAULT NULL,
                                            rows_affected bigint DEFAULT NULL,
                                            result jsonb DEFAULT NULL,
                                            lease_token bigint DEFAULT NULL,
                                            counters boolean DEFAULT true)
RETURNS text LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r pgsched.job_run;
    ok boolean := _end_run.outcome = 'success';
    failed boolean := _end_run.outcome IN ('failure', 'timeout');
    crashed boolean := _end_run.outcome = 'crash';
    fin timestamptz;
    new_state text;
BEGIN
    IF outcome NOT IN ('success', 'failure', 'timeout', 'crash', 'cancelled') THEN
        PERFORM pgsched._bad_arg('outcome', quote_literal(outcome),
                                 'one of success, failure, timeout, crash, cancelled');
    END IF;
    SELECT * INTO r FROM pgsched.job_run jr WHERE jr.run_id = _end_run.run_id FOR UPDATE;
    IF NOT FOUND OR r.outcome <> 'running'
       OR (_end_run.lease_token IS NOT NULL AND r.lease_token IS DISTINCT FROM _end_run.lease_token) THEN
        RETURN NULL;
    END IF;
    -- One clock stamps a run; never let a finish precede its start.
    fin := greatest(_end_run.finished_at, r.started_at);
    UPDATE pgsched.job_run jr
       SET finished_at = fin, outcome = _end_run.outcome, sqlstate = _end_run.sqlstate,
           message = _end_run.message, rows_affected = _end_run.rows_affected, result = _end_run.result
     WHERE jr.run_id = _end_run.run_id;
    -- The job's state after comes back from the statement that writes it (RETURNING): every
    -- statement more here runs once per run.
    IF r.scope <> '' AND counters THEN
        -- A scope run counts in the totals; the job's state and next start belong to its plan run.
        UPDATE pgsched.job_stat s
           SET last_finish = greatest(s.last_finish, fin),
               last_successful_finish = CASE WHEN ok THEN greatest(s.last_successful_finish, fin)
                                             ELSE s.last_successful_finish END,
               total_successes = s.total_successes + ok::int,
               total_failures = s.total_failures + failed::int,
               total_crashes = s.total_crashes - (NOT crashed)::int
         WHERE s.job_id = r.job_id
        RETURNING s.state INTO new_state;
    ELSIF r.scope <> '' THEN
        SELECT s.state INTO new_state FROM pgsched.job_stat s WHERE s.job_id = r.job_id;
    ELSIF counters THEN
        UPDATE pgsched.job_stat s
           SET state = CASE WHEN _end_run.disable_reason IS NOT NULL
                                 OR NOT (SELECT j.scheduled FROM pgsched.job j WHERE j.job_id = r.job_id)
                            THEN 'disabled' ELSE 'scheduled' END,
               disabled_reason = coalesce(_end_run.disable_reason, s.disabled_reason),
               current_run_id = CASE WHEN s.current_run_id = r.run_id THEN NULL ELSE s.current_run_id END,
               last_finish = fin,
               last_run_success = ok,
               last_successful_finish = CASE WHEN ok THEN fin ELSE s.last_successful_finish END,
               last_run_duration = fin - r.started_at,
               total_successes = s.total_successes + ok::int,
               total_failures = s.total_failures + failed::int,
               total_crashes = s.total_crashes - (NOT crashed)::int,
               consecutive_crashes = CASE WHEN crashed THEN s.consecutive_crashes ELSE 0 END,
               consecutive_failures = CASE WHEN ok THEN 0 WHEN failed THEN s.consecutive_failures + 1
                                           ELSE s.consecutive_failures END,
               next_start = coalesce(_end_run.next_start, s.next_start)
         WHERE s.job_id = r.job_id
        RETURNING s.state INTO new_state;
    ELSE
        UPDATE pgsched.job_stat s
           SET state = CASE WHEN _end_run.disable_reason IS NOT NULL
                                 OR NOT (SELECT j.scheduled FROM pgsched.job j WHERE j.job_id = r.job_id)
                            THEN 'disabled' ELSE 'scheduled' END,
               disabled_reason = coalesce(_end_run.disable_reason, s.disabled_reason),
               current_run_id = CASE WHEN s.current_run_id = r.run_id THEN NULL ELSE s.current_run_id END
         WHERE s.job_id = r.job_id
        RETURNING s.state INTO new_state;
    END IF;
    IF _end_run.disable_reason IS NOT NULL AND r.scope = '' THEN
        UPDATE pgsched.job j SET scheduled = false WHERE j.job_id = r.job_id;
    END IF;
    -- Events (README "Events"): a run that ends other than in success, and a job this close
    -- disables, are announced on pgsched_events. Here, not in a trigger: a success costs one
    -- boolean test (a NOTIFY per success would serialize commits: the notify queue's lock).
    -- The payload names ids only; whoever LISTENs reads the details through the views, under
    -- row-level security.
    IF NOT ok THEN
        PERFORM pg_catalog.pg_notify('pgsched_events', pgsched._event('run_end', r.job_id, r.run_id,
                                                                      _end_run.outcome, r.attempt, r.plan_time));
    END IF;
    IF _end_run.disable_reason IS NOT NULL THEN
        PERFORM pg_catalog.pg_notify('pgsched_events', pgsched._event('job_disabled', r.job_id, r.run_id,
                                                                      _end_run.outcome, r.attempt, r.plan_time));
    END IF;
    -- '' only if the job has no job_stat row, which its trigger rules out: the run is closed all the same.
    RETURN coalesce(new_state, '');
END
$$;

-- _end_run as release 0.1.0's callers and run_job read it: whether the run was closed.
CREATE OR REPLACE FUNCTION pgsched._mark_end(run_id bigint, outcome text, sqlstate text, message text,
                                             next_start timestamptz,
                                             finished_at timestamptz DEFAULT clock_timestamp(),
                                             disable_reason text DEFAULT NULL,
                                             rows_affected bigint DEFAULT NULL,
                                             result jsonb DEFAULT NULL,
                                             lease_token bigint DEFAULT NULL,
                                             counters boolean DEFAULT true)
RETURNS boolean LANGUAGE sql
SET search_path = pg_catalog, pg_temp AS $$
    SELECT pgsched._end_run(run_id, outcome, sqlstate, message, next_start, finished_at, disable_reason,
                            rows_affected, result, lease_token, counters) IS NOT NULL
$$;

-- run_job's two marks. The caller may not write job_stat and job_run itself
-- (0002_security.sql), so these run as the schema owner, and allow only what
-- run_job does: start a manual run of a job the session's user may act for
-- (session_user: every role this session can be is one it is a member of), and
-- close a manual run that this very backend started.
CREATE OR REPLACE FUNCTION pgsched._run_job_start(job_id integer)
RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    job_owner oid;
BEGIN
    SELECT j.owner INTO job_owner FROM pgsched.job j WHERE j.job_id = _run_job_start.job_id;
    IF job_owner IS NULL OR NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.oid = job_owner)
       OR NOT pg_catalog.pg_has_role(session_user, job_owner, 'MEMBER') THEN
        PERFORM pgsched._job_not_found(_run_job_start.job_id);
    END IF;
    RETURN pgsched._mark_start(_run_job_start.job_id, pg_catalog.clock_timestamp(), 'manual', NULL,
                               pg_catalog.pg_backend_pid());
END
$$;

CREATE OR REPLACE FUNCTION pgsched._run_job_end(run_id bigint, sqlstate text, message text)
RETURNS boolean LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pgsched.job_run r
                    WHERE r.run_id = _run_job_end.run_id AND r.trigger = 'manual' AND r.instance_id IS NULL
                      AND r.backend_pid = pg_catalog.pg_backend_pid() AND r.outcome = 'running') THEN
        RETURN false;
    END IF;
    RETURN pgsched._mark_end(_run_job_end.run_id, CASE WHEN _run_job_end.sqlstate IS NULL THEN 'success'
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
-- The job runs as its owner: a caller who is not the owner but a member of it
-- runs it under SET LOCAL ROLE; anyone else (the database owner, who sees all
-- jobs) is refused, since running another role's SQL with one's own rights is
-- how a trojan works. The session is still the caller's, so the job's SQL could
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
    ELSIF owner_name <> current_user AND NOT pg_catalog.pg_has_role(current_user, j.owner, 'MEMBER') THEN
        RAISE EXCEPTION USING ERRCODE = '42501',
            MESSAGE = format('job %s belongs to role %I, which role %I may not become', j.job_id, owner_name,
                             current_user),
            DETAIL = 'run_job runs the job in your session as its owner',
            HINT = 'only the owner (or a member of the owner role) may run it by hand; the scheduler runs it as '
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
                                  (SELECT r.plan_time FROM pgsched.job_run r WHERE r.run_id = rid)::text, true),
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
