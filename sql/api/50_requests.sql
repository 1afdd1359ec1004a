-- Asking the schedulers to act on a job now: trigger_job (run it now, on a scheduler,
-- recorded with trigger 'manual') and cancel_job (cancel its runs in progress, outcome
-- 'cancelled'). `pgsched trigger` and `pgsched cancel` call them.
--
-- A request is a row of pgsched.request (migration 0016), and the notification on
-- pgsched_catalog, 'request:<request_id>', only wakes the schedulers. Why a row: pg_notify is
-- open to every role that can connect, so a notification cannot say who sent it; when the
-- payload was the request ('trigger:<job>:<plan_time>', 'cancel:<run>:<role>'), anyone could
-- start any job, paused or not, at a plan_time of their choosing (a job's next slot, which then
-- never ran as scheduled), or cancel a run in a name of their choosing. Only the SECURITY
-- DEFINER functions below write pgsched.request, after _check_may_act, so a row is a request a
-- role with the right made, and everything the scheduler acts on (the job, the plan_time, the
-- run, who asked) is read from it. A forged 'request:<id>' names at most a real request, which
-- the scheduler acts on once, as its maker asked (a started trigger's row is gone, a cancel
-- reaches only the run it names). A row beats a MAC in the payload: no key to keep, rotate or
-- leak, no replay to think about, and the request is visible (SELECT * FROM pgsched.request, as
-- the scheduler's role).
--   A trigger names its manual run's plan_time (the instant of the request), and a run is
--     unique by (job, scope, plan_time); the scheduler that starts it deletes the row in the
--     same transaction (_start_request), so whichever scheduler starts it first, the others find
--     it gone, and it runs once.
--   A cancel names a run, which only the scheduler holding it takes (_requests).
-- A request older than _request_ttl() is not acted on, and the purge deletes it. A scheduler
-- reads a request when it is woken for it, and reads every pending one when it begins to listen
-- (at start, after a reconnect, when its server is promoted: Store.take_pending_requests), so a
-- request made while no scheduler listened is acted on by the first that starts within the TTL.
-- The CLI waits for the run to start (or end) and says so when it does not.
-- Both check that the session's user may act for the job's owner, as run_job does; a job
-- the caller may not act for is reported as not found (42704), like run_job's.

-- The functions of this file the scheduler calls: replaced whole on every upgrade. (Its
-- _start_manual_v2 of before migration 0016 is defined by no file now: init drops it.)
SELECT pgsched._drop_functions(ARRAY[
    '_start_request', '_requests']);

-- How long a request is acted on: a trigger whose job keeps running (maybe on another instance),
-- or that finds no worker free, is dropped after this; the purge deletes older rows.
CREATE OR REPLACE FUNCTION pgsched._request_ttl()
RETURNS interval LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN interval '10 minutes';

-- Ask the schedulers to run a job now. Returns the manual run's plan_time: the run is the
-- job's job_history row with trigger 'manual' and that plan_time, once a scheduler (one
-- that loaded the job's module, for a Python job) has a worker free and the job has no
-- run in progress. A paused job runs too, and stays paused (as with run_job).
CREATE OR REPLACE FUNCTION pgsched.trigger_job(job_id integer)
RETURNS timestamptz LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    at timestamptz := pg_catalog.clock_timestamp();
    rid bigint;
BEGIN
    PERFORM pgsched._check_may_act(trigger_job.job_id);
    INSERT INTO pgsched.request (kind, job_id, plan_time, requested_by)
    VALUES ('trigger', trigger_job.job_id, at, session_user)
    RETURNING request_id INTO rid;
    PERFORM pg_catalog.pg_notify('pgsched_catalog', format('request:%s', rid));
    RETURN at;
END
$$;

-- Ask the scheduler running a job's runs to cancel them: each ends with outcome
-- 'cancelled' (its query is cancelled, its worker killed after the grace period). Returns
-- the runs asked for; none: the job has no run in progress on a scheduler (a run_job in
-- somebody's session is theirs to cancel, with pg_cancel_backend).
CREATE OR REPLACE FUNCTION pgsched.cancel_job(job_id integer)
RETURNS SETOF bigint LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    run bigint;
    rid bigint;
BEGIN
    PERFORM pgsched._check_may_act(cancel_job.job_id);
    FOR run IN
        SELECT r.run_id FROM pgsched.job_run_live r
         WHERE r.job_id = cancel_job.job_id AND r.outcome = 'running' AND r.instance_id IS NOT NULL
         ORDER BY r.run_id
    LOOP
        INSERT INTO pgsched.request (kind, job_id, run_id, requested_by)
        VALUES ('cancel', cancel_job.job_id, run, session_user)
        RETURNING request_id INTO rid;
        PERFORM pg_catalog.pg_notify('pgsched_catalog', format('request:%s', rid));
        RETURN NEXT run;
    END LOOP;
END
$$;

-- The requests a scheduler was woken for (the ids of the notifications it heard, which anyone
-- may send: only rows are acted on). A trigger is returned to every scheduler that heard it (any
-- of them may start it: _start_request); a cancel only to the instance holding its run, and
-- deleted, for it is taken. expires_in: seconds until the request is past _request_ttl() (none
-- older is returned).
CREATE OR REPLACE FUNCTION pgsched._requests(request_ids bigint[], instance_id bigint,
                                            now timestamptz DEFAULT pg_catalog.clock_timestamp())
RETURNS TABLE (request_id bigint, kind text, job_id integer, plan_time timestamptz, run_id bigint,
               requested_by name, expires_in double precision)
LANGUAGE sql
SET search_path = pg_catalog, pg_temp AS $$
    WITH taken AS (
        DELETE FROM pgsched.request q
         USING pgsched.job_run_live r
         WHERE q.request_id = ANY (_requests.request_ids) AND q.kind = 'cancel'
           AND q.requested_at > _requests.now - pgsched._request_ttl()
           AND r.run_id = q.run_id AND r.outcome = 'running' AND r.instance_id = _requests.instance_id
        RETURNING q.*
    )
    SELECT q.request_id, q.kind, q.job_id, q.plan_time, q.run_id, q.requested_by,
           extract(epoch FROM q.requested_at + pgsched._request_ttl() - _requests.now)::double precision
      FROM (SELECT * FROM taken
            UNION ALL
            SELECT * FROM pgsched.request t
             WHERE t.request_id = ANY (_requests.request_ids) AND t.kind = 'trigger'
               AND t.requested_at > _requests.now - pgsched._request_ttl()) q
     ORDER BY q.request_id
$$;

-- A scheduler starts the manual run a trigger request asks for (its row in pgsched.request, whose
-- job and plan_time are the run's), on one of its workers: returns its launch row and deletes the
-- request, in one transaction; nothing when it is not this scheduler's to start (another started
-- it, so the request is gone; it is past _request_ttl(); the job is gone; or it is a Python job of
-- a module not loaded here, which leaves the request to an instance that has it). Raises 55006
-- while the job has a run in progress (pgsched._mark_start): the request stays and the scheduler
-- tries again. Off the claim's path: called only when a request arrived.
CREATE OR REPLACE FUNCTION pgsched._start_request(instance_id bigint, request_id bigint,
                                                 worker_pid integer, backend_pid integer,
                                                 code_modules text[] DEFAULT '{}',
                                                 now timestamptz DEFAULT now())
RETURNS SETOF pgsched._launch_row_v2 LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    q pgsched.request;
    st pgsched.job_stat;
    rid bigint;
BEGIN
    -- The request's lock is what makes the schedulers that heard it take turns: the first
    -- deletes it, the next finds nothing.
    SELECT * INTO q FROM pgsched.request r
     WHERE r.request_id = _start_request.request_id AND r.kind = 'trigger'
       AND r.requested_at > pg_catalog.clock_timestamp() - pgsched._request_ttl()
       FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    SELECT * INTO st FROM pgsched.job_stat s WHERE s.job_id = q.job_id FOR UPDATE;
    IF NOT FOUND
       OR EXISTS (SELECT 1 FROM pgsched.job_run_live r WHERE r.job_id = q.job_id AND r.scope = ''
                                                         AND r.plan_time = q.plan_time) THEN
        DELETE FROM pgsched.request r WHERE r.request_id = q.request_id;  -- moot: the job is gone, or it ran
        RETURN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pgsched.job j WHERE j.job_id = q.job_id
                                                 AND (j.kind <> 'python' OR j.code_module = ANY (code_modules))) THEN
        RETURN;
    END IF;
    rid := pgsched._mark_start(q.job_id, q.plan_time, 'manual', worker_pid, backend_pid, instance_id,
                               nextval('pgsched.lease_token_seq'), _start_request.now);
    DELETE FROM pgsched.request r WHERE r.request_id = q.request_id;
    RETURN QUERY
    SELECT r.run_id, r.job_id, r.scope, r.attempt, r.plan_time, r.started_at, r.lease_token, r.worker_pid,
           r.backend_pid, st.consecutive_failures, st.consecutive_crashes,
           v.job_name, v.kind, v.owner, v.proc_schema, v.proc_name, v.is_procedure, v.command, v.code_module,
           v.code_function, v.config, v.schedule, v.months, v.days, v.micros, v.fixed_schedule, v.initial_start,
           v.timezone, v.max_runtime_s, v.max_retries, v.retry_period_s, v.catch_up, v.catch_up_window_s,
           v.max_plans_per_tick, v.schedule_delay_s, v.allow_stale_reentry, v.scope_query,
           NULL::timestamptz, pg_catalog.clock_timestamp(), v.scheduled, s.state, v.database, v.priority, v.exclude,
           v.jitter_s, v.concurrency_key, v.depends_on,
           v.history, v.success_retention_s, v.failure_retention_s
      FROM pgsched.job_run_live r
      JOIN pgsched._job_launch v ON v.job_id = r.job_id
      JOIN pgsched.job_stat s ON s.job_id = r.job_id
     WHERE r.run_id = rid;
END
$$;
