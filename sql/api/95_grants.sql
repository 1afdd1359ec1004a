-- Who may execute which pgsched function (docs/security.md). Runs after every
-- other API file (pgsched/migrate.py applies files numbered 90 and up last), so
-- it sees every function there is, and is re-applied with them.
--
-- PostgreSQL lets PUBLIC execute every new function. Here that is kept only for
-- an allowlist: the user-facing API and the internal helpers it calls as the
-- invoker (all SECURITY INVOKER, so calling one directly gives no more than the
-- API does: row-level security and the table grants decide). Everything else,
-- the scheduler's functions (_claim, _finish_runs, _abandoned_runs,
-- _register_instance, ...) and the raw run marks (_mark_start, _mark_end), is
-- revoked from PUBLIC: only the role that owns the schema, the scheduler's,
-- executes them. A new function is therefore private until listed here.

DO $grants$
DECLARE
    public_api constant text[] := ARRAY[
        -- the API (also reachable unqualified through the public wrappers)
        'add_job', 'alter_job', 'delete_job', 'run_job', 'schedule', 'unschedule', 'next_runs', 'trigger_job',
        'cancel_job', 'set_concurrency_limit', 'set_retention', 'purge_history',
        'plpython_available',
        -- what the API calls as the invoker
        '_bad_arg', '_is_cron', '_check_cron_syntax', '_check_timezone', '_parse_schedule', '_check_interval',
        '_check_min_period', '_interval_parts', '_interval_text', '_delayed', '_check_schedule_exact', '_first_start',
        '_check_proc', '_check_config', '_check_owner_can_login', '_check_database', '_check_job_writable', '_job_not_found',
        '_check_settings', '_exclude_leaves_no_start', '_insert_job', '_alter_job', '_catalog_admin',
        '_plannable', '_plannable_form', '_plus',
        -- who may act as a job's owner, asked by the write policies as the writer (migration 0017),
        -- and who may see its jobs, asked by the read policy as the reader (migration 0018)
        '_may_act_as', '_may_see_as',
        '_settings', '_settings_defaults', '_job_settings', '_settings_columns', '_store_settings',
        '_store_new_job', '_first_next_start', '_replan', '_iv_months', '_iv_days', '_iv_micros',
        -- run_job's marks: SECURITY DEFINER, limited to the caller's own manual run (20_runs.sql)
        '_run_job_start', '_run_job_end',
        -- the plain-SQL cron engine (05_cron.sql) behind the same three
        '_cron_fail', '_cron_value', '_cron_expand', '_cron_parse', '_cron_day_list', '_cron_ge', '_tz_offset',
        '_tz_transition', '_resolve_local', '_cron_next_wall', '_cron_next_n', '_add_interval_local',
        -- PL/Python schedule code behind _check_schedule_exact, _first_start and next_runs
        '_ts_micros', '_micros_ts', '_py_check_cron', '_py_first_start', '_py_next_runs',
        -- trigger functions (only callable as triggers anyway)
        '_notify_change', '_job_row_change', '_touch_updated_at', '_derive_schedule_interval',
        '_check_state_change',
        -- the state table, evaluated with the rights of whoever writes job_stat.state (00_internal.sql)
        '_state_allowed',
        -- the expressions of job_stat's claim indexes (migration 0010), evaluated for whoever writes
        -- job_stat, and read by job_stats
        '_start_key', '_due_at', '_jitter_us',
        -- a concurrency key's limit and wait, read by job_stats and concurrency_limits (25_concurrency.sql);
        -- _key_running is SECURITY DEFINER and returns a count only
        '_key_limit', '_key_default_limit', '_key_running', '_key_wait',
        -- dependencies (07_dependencies.sql): add_job/alter_job resolve depends_on as the invoker
        -- (the job's trigger checks it as the schema owner: _sync_dependencies, _check_upstreams);
        -- job_stats reads the wait; the trigger of deleted upstreams
        '_resolve_upstreams', '_may_see', '_depends_form', '_upstream_wait', '_upstream_deleted', '_check_edges_made',
        -- a job's history level and retentions, checked by _check_settings (45_history.sql)
        '_check_retention', '_retention_form', '_history_form',
        -- the API version and release (constants): the operator commands (`pgsched jobs`, ...) check
        -- it before anything else, as whichever role runs them
        '_api'];
    f record;
BEGIN
    FOR f IN
        SELECT p.oid::regprocedure AS sig, p.prokind, p.proname = ANY (public_api) AS allowed
          FROM pg_catalog.pg_proc p
         WHERE p.pronamespace = 'pgsched'::regnamespace
    LOOP
        EXECUTE format(CASE WHEN f.allowed THEN 'GRANT EXECUTE ON %s %s TO PUBLIC'
                            ELSE 'REVOKE EXECUTE ON %s %s FROM PUBLIC' END,
                       CASE WHEN f.prokind = 'p' THEN 'PROCEDURE' ELSE 'FUNCTION' END, f.sig);
    END LOOP;
END
$grants$;
