-- API 1 (release 0.1.0): what its instances call whose arguments or result API 2 changed, kept so that they
-- go on working through a rolling upgrade until they are replaced (README, "Upgrading").
-- Each is API 1's signature and result exactly (a running instance's prepared statements depend
-- on both), over API 2's function. The release that stops serving API 1 deletes this file, and
-- init then drops what it defined (pgsched/migrate.py).

-- API 1's launch row: API 2's _launch_row_v2 without scheduled and job_state.
SELECT pgsched._define_type('_launch_row', $$
    run_id bigint, job_id integer, scope text, attempt integer, plan_time timestamptz, started_at timestamptz,
    lease_token bigint, worker_pid integer, backend_pid integer, consecutive_failures integer,
    consecutive_crashes integer, job_name text, kind text, owner text, proc_schema name, proc_name name,
    is_procedure boolean, command text, code_module text, code_function text, config jsonb, schedule text,
    months integer, days integer, micros bigint, fixed_schedule boolean, initial_start timestamptz,
    timezone text, max_runtime_s double precision, max_retries integer, retry_period_s double precision,
    catch_up text, catch_up_window_s double precision, max_plans_per_tick integer,
    schedule_delay_s double precision, allow_stale_reentry boolean, scope_query text, next_due timestamptz,
    db_now timestamptz$$);

CREATE OR REPLACE FUNCTION pgsched._claim(instance_id bigint, worker_pids integer[], backend_pids integer[],
                                          ahead interval DEFAULT interval '0', code_modules text[] DEFAULT '{}')
RETURNS SETOF pgsched._launch_row
LANGUAGE sql
SET search_path = pg_catalog, pg_temp AS $$
    SELECT c.run_id, c.job_id, c.scope, c.attempt, c.plan_time, c.started_at, c.lease_token, c.worker_pid,
           c.backend_pid, c.consecutive_failures, c.consecutive_crashes, c.job_name, c.kind, c.owner,
           c.proc_schema, c.proc_name, c.is_procedure, c.command, c.code_module, c.code_function, c.config,
           c.schedule, c.months, c.days, c.micros, c.fixed_schedule, c.initial_start, c.timezone, c.max_runtime_s,
           c.max_retries, c.retry_period_s, c.catch_up, c.catch_up_window_s, c.max_plans_per_tick,
           c.schedule_delay_s, c.allow_stale_reentry, c.scope_query, c.next_due, c.db_now
      FROM pgsched._claim_v2(instance_id, worker_pids, backend_pids, ahead, code_modules) c
$$;

CREATE OR REPLACE FUNCTION pgsched._take_over(instance_id bigint, run_ids bigint[], tokens bigint[],
                                              worker_pids integer[], backend_pids integer[])
RETURNS SETOF pgsched._launch_row
LANGUAGE sql
SET search_path = pg_catalog, pg_temp AS $$
    SELECT c.run_id, c.job_id, c.scope, c.attempt, c.plan_time, c.started_at, c.lease_token, c.worker_pid,
           c.backend_pid, c.consecutive_failures, c.consecutive_crashes, c.job_name, c.kind, c.owner,
           c.proc_schema, c.proc_name, c.is_procedure, c.command, c.code_module, c.code_function, c.config,
           c.schedule, c.months, c.days, c.micros, c.fixed_schedule, c.initial_start, c.timezone, c.max_runtime_s,
           c.max_retries, c.retry_period_s, c.catch_up, c.catch_up_window_s, c.max_plans_per_tick,
           c.schedule_delay_s, c.allow_stale_reentry, c.scope_query, c.next_due, c.db_now
      FROM pgsched._take_over_v2(instance_id, run_ids, tokens, worker_pids, backend_pids) c
$$;

CREATE OR REPLACE FUNCTION pgsched._disable_job(job_id integer, reason text)
RETURNS void LANGUAGE sql
SET search_path = pg_catalog, pg_temp AS $$
    SELECT pgsched._disable_job_v2(job_id, reason);
$$;

-- API 1's _behind: API 2's without jitter_s (its result type is in 0.1.0's prepared statements).
CREATE OR REPLACE FUNCTION pgsched._behind(late interval, max_rows integer)
RETURNS TABLE (job_id integer, next_start timestamptz, schedule text, months integer, days integer,
               micros bigint, fixed_schedule boolean, initial_start timestamptz, timezone text, catch_up text,
               catch_up_window_s double precision, max_plans_per_tick integer, schedule_delay_s double precision,
               db_now timestamptz)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT b.job_id, b.next_start, b.schedule, b.months, b.days, b.micros, b.fixed_schedule, b.initial_start,
           b.timezone, b.catch_up, b.catch_up_window_s, b.max_plans_per_tick, b.schedule_delay_s, b.db_now
      FROM pgsched._behind_v2(late, max_rows) b
$$;

-- API 1's calls of the functions API 2 gave a trailing argument (the time, `now`, that tests
-- pass instead of sleeping; run_job's `counters`). To PostgreSQL a function with one more
-- argument is another function: had API 2 kept the name, init would drop the one 0.1.0 calls,
-- and an old instance's statement that looked it up and then waited on init's locks would fail
-- at init's commit ("cache lookup failed for function N"), which 0.1.0's reconnect does not
-- survive. So API 2 calls the _v2 names, and these keep API 1's own, replaced in place
-- (tests/integration/test_api_compat.py checks that each keeps its oid through init).
CREATE OR REPLACE FUNCTION pgsched._abandoned_runs(self_id bigint, dead_after interval, grace interval,
                                                   held bigint[])
RETURNS TABLE (run_id bigint, job_id integer, plan_time timestamptz, lease_token bigint, cause text,
               holder text, orphan_app text, orphan_pid integer, allow_stale_reentry boolean,
               consecutive_crashes integer, schedule text, months integer, days integer, micros bigint,
               fixed_schedule boolean, initial_start timestamptz, timezone text, retry_period_s double precision,
               schedule_delay_s double precision, after_restart boolean, scope text, code_module text)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT * FROM pgsched._abandoned_runs_v2(self_id, dead_after, grace, held)
$$;

CREATE OR REPLACE FUNCTION pgsched._catch_up(decisions jsonb)
RETURNS integer LANGUAGE sql
SET search_path = pg_catalog, pg_temp AS $$
    SELECT pgsched._catch_up_v2(decisions)
$$;

CREATE OR REPLACE FUNCTION pgsched._heartbeat(instance_id bigint, max_workers integer, held bigint[],
                                              tokens bigint[])
RETURNS TABLE (lost bigint[], db_now timestamptz)
LANGUAGE sql
SET search_path = pg_catalog, pg_temp AS $$
    SELECT * FROM pgsched._heartbeat_v2(instance_id, max_workers, held, tokens)
$$;

CREATE OR REPLACE FUNCTION pgsched._instance_stop(instance_id bigint)
RETURNS void LANGUAGE sql
SET search_path = pg_catalog, pg_temp AS $$
    SELECT pgsched._instance_stop_v2(instance_id)
$$;

CREATE OR REPLACE FUNCTION pgsched._mark_end(run_id bigint, outcome text, sqlstate text, message text,
                                             next_start timestamptz,
                                             finished_at timestamptz DEFAULT clock_timestamp(),
                                             disable_reason text DEFAULT NULL,
                                             rows_affected bigint DEFAULT NULL,
                                             result jsonb DEFAULT NULL,
                                             lease_token bigint DEFAULT NULL)
RETURNS boolean LANGUAGE sql
SET search_path = pg_catalog, pg_temp AS $$
    SELECT pgsched._mark_end_v2(run_id, outcome, sqlstate, message, next_start, finished_at, disable_reason,
                                rows_affected, result, lease_token)
$$;

CREATE OR REPLACE FUNCTION pgsched._next_due(code_modules text[] DEFAULT '{}')
RETURNS TABLE (next_due timestamptz, unplanned boolean, db_now timestamptz)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT * FROM pgsched._next_due_v2(code_modules)
$$;

CREATE OR REPLACE FUNCTION pgsched._register_instance(host text, pid integer, version text, max_workers integer)
RETURNS TABLE (instance_id bigint, db_now timestamptz)
LANGUAGE sql
SET search_path = pg_catalog, pg_temp AS $$
    SELECT * FROM pgsched._register_instance_v2(host, pid, version, max_workers)
$$;

-- Called by API 1's own function bodies (_heartbeat, _finish_runs) as 0.1.0 wrote them: a statement
-- of an old instance that began such a body before init's commit calls these after it.
CREATE OR REPLACE FUNCTION pgsched._instance_heartbeat(instance_id bigint, max_workers integer)
RETURNS timestamptz LANGUAGE sql
SET search_path = pg_catalog, pg_temp AS $$
    SELECT pgsched._instance_heartbeat_v2(instance_id, max_workers)
$$;

CREATE OR REPLACE FUNCTION pgsched._record_skipped(run_id bigint, skipped integer, first_slot timestamptz,
                                                   last_slot timestamptz)
RETURNS void LANGUAGE sql
SET search_path = pg_catalog, pg_temp AS $$
    SELECT pgsched._record_skipped_v2(run_id, skipped, first_slot, last_slot)
$$;
