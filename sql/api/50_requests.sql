-- Asking the schedulers to act on a job now: trigger_job (run it now, on a scheduler,
-- recorded with trigger 'manual') and cancel_job (cancel its runs in progress, outcome
-- 'cancelled'). `pgsched trigger` and `pgsched cancel` call them.
--
-- A request is a notification on pgsched_catalog, not a row: no migration may be added
-- while API 1 is served (pgsched/api.py). What makes it safe without a row:
--   trigger:<job_id>:<micros> names the manual run's plan_time (the instant of the request,
--     in microseconds since the epoch), and a run is unique by (job, scope, plan_time): so
--     whichever scheduler starts it first, the others find it taken, and it runs once.
--   cancel:<run_id>:<role> names a run, which only the scheduler holding it acts on.
-- A request that no scheduler hears (none is running) is lost; the CLI therefore waits for
-- the run to start (or end) and says so when it does not.
-- Both check that the session's user may act for the job's owner, as run_job does; a job
-- the caller may not act for is reported as not found (42704), like run_job's.

-- The functions of this file the scheduler calls: replaced whole on every upgrade.
SELECT pgsched._drop_functions(ARRAY[
    '_start_manual_v2']);

-- Ask the schedulers to run a job now. Returns the manual run's plan_time: the run is the
-- job's job_history row with trigger 'manual' and that plan_time, once a scheduler (one
-- that loaded the job's module, for a Python job) has a worker free and the job has no
-- run in progress. A paused job runs too, and stays paused (as with run_job).
CREATE OR REPLACE FUNCTION pgsched.trigger_job(job_id integer)
RETURNS timestamptz LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    -- A plan_time in whole microseconds, as the notification carries it.
    at timestamptz := pg_catalog.clock_timestamp();
BEGIN
    PERFORM pgsched._check_may_act(trigger_job.job_id);
    PERFORM pg_catalog.pg_notify('pgsched_catalog', format('trigger:%s:%s', trigger_job.job_id,
                                                           (extract(epoch FROM at) * 1000000)::bigint));
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
    rid bigint;
BEGIN
    PERFORM pgsched._check_may_act(cancel_job.job_id);
    FOR rid IN
        SELECT r.run_id FROM pgsched.job_run_live r
         WHERE r.job_id = cancel_job.job_id AND r.outcome = 'running' AND r.instance_id IS NOT NULL
         ORDER BY r.run_id
    LOOP
        PERFORM pg_catalog.pg_notify('pgsched_catalog', format('cancel:%s:%s', rid, session_user));
        RETURN NEXT rid;
    END LOOP;
END
$$;

-- A scheduler starts the manual run a trigger_job asked for (its plan_time), on one of its
-- workers: returns its launch row, or nothing when it is not this scheduler's to start
-- (another started it, the job is gone, or it is a Python job of a module not loaded
-- here). Raises 55006 while the job has a run in progress (pgsched._mark_start): the
-- scheduler keeps the request and tries again. Off the claim's path: called only when a
-- request arrived.
CREATE OR REPLACE FUNCTION pgsched._start_manual_v2(instance_id bigint, job_id integer, plan_time timestamptz,
                                                    worker_pid integer, backend_pid integer,
                                                    code_modules text[] DEFAULT '{}',
                                                    now timestamptz DEFAULT now())
RETURNS SETOF pgsched._launch_row_v2 LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    st pgsched.job_stat;
    rid bigint;
BEGIN
    SELECT * INTO st FROM pgsched.job_stat s WHERE s.job_id = _start_manual_v2.job_id FOR UPDATE;
    IF NOT FOUND
       OR NOT EXISTS (SELECT 1 FROM pgsched.job j WHERE j.job_id = _start_manual_v2.job_id
                                                    AND (j.kind <> 'python' OR j.code_module = ANY (code_modules)))
       OR EXISTS (SELECT 1 FROM pgsched.job_run_live r WHERE r.job_id = _start_manual_v2.job_id AND r.scope = ''
                                                    AND r.plan_time = _start_manual_v2.plan_time) THEN
        RETURN;
    END IF;
    rid := pgsched._mark_start(_start_manual_v2.job_id, _start_manual_v2.plan_time, 'manual', worker_pid,
                               backend_pid, instance_id, nextval('pgsched.lease_token_seq'), _start_manual_v2.now);
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
