-- The user-facing API, reachable unqualified: thin wrappers in schema public
-- that forward to pgsched. They are generated from the pgsched definitions so
-- the two cannot disagree. An object of the same name that pgsched did not
-- create is left alone (with a warning); pgsched.* always works.

DO $gen$
DECLARE
    marker constant text := 'pgsched API wrapper';
    api_functions constant text[] := ARRAY['add_job', 'alter_job', 'delete_job', 'run_job', 'schedule',
                                           'unschedule', 'next_runs', 'trigger_job', 'cancel_job',
                                           'set_concurrency_limit'];
    api_views constant text[] := ARRAY['jobs', 'job_stats', 'job_history', 'concurrency_limits'];
    p record;
    v text;
    call_args text;
    existing_comment text;
BEGIN
    IF to_regnamespace('public') IS NULL THEN
        RETURN;
    END IF;
    -- Since PostgreSQL 15 only the database owner may create in public by default; a
    -- scheduler role that does not own the database installs pgsched.* only.
    IF NOT pg_catalog.has_schema_privilege('public', 'CREATE') THEN
        RAISE WARNING USING MESSAGE = format('role %I may not create in schema public: the unqualified API '
            || 'wrappers are not installed, use pgsched.* (or run pgsched init as a role that may)', current_user);
        RETURN;
    END IF;
    -- A wrapper of ours whose pgsched function changed signature (or is gone) would stay
    -- behind as an extra overload and make unqualified calls ambiguous: drop it.
    FOR p IN
        SELECT op.oid, op.prokind, op.proname, pg_catalog.pg_get_function_identity_arguments(op.oid) AS arg_ids
          FROM pg_catalog.pg_proc op
         WHERE op.pronamespace = 'public'::regnamespace AND op.proname = ANY (api_functions)
           AND obj_description(op.oid, 'pg_proc') = marker
           AND NOT EXISTS (
               SELECT 1 FROM pg_catalog.pg_proc pp
                WHERE pp.pronamespace = 'pgsched'::regnamespace AND pp.proname = op.proname
                  AND pp.prokind = op.prokind AND pp.proargtypes = op.proargtypes
                  AND pp.proargnames IS NOT DISTINCT FROM op.proargnames
                  AND pg_catalog.pg_get_function_result(pp.oid)
                      IS NOT DISTINCT FROM pg_catalog.pg_get_function_result(op.oid))
    LOOP
        EXECUTE format('DROP %s public.%I(%s)', CASE WHEN p.prokind = 'p' THEN 'PROCEDURE' ELSE 'FUNCTION' END,
                       p.proname, p.arg_ids);
    END LOOP;
    FOR p IN
        SELECT pp.oid, pp.proname, pp.prokind, pp.proretset, pp.pronargs,
               pg_catalog.pg_get_function_arguments(pp.oid) AS arg_defs,
               pg_catalog.pg_get_function_identity_arguments(pp.oid) AS arg_ids,
               pg_catalog.pg_get_function_result(pp.oid) AS result,
               pp.proargnames
          FROM pg_catalog.pg_proc pp
         WHERE pp.pronamespace = 'pgsched'::regnamespace AND pp.proname = ANY (api_functions)
    LOOP
        SELECT obj_description(op.oid, 'pg_proc') INTO existing_comment
          FROM pg_catalog.pg_proc op
         WHERE op.pronamespace = 'public'::regnamespace AND op.proname = p.proname
           AND pg_catalog.pg_get_function_identity_arguments(op.oid) = p.arg_ids;
        IF FOUND AND existing_comment IS DISTINCT FROM marker THEN
            RAISE WARNING 'public.%(%) exists and is not pgsched''s: use pgsched.% instead', p.proname, p.arg_ids,
                p.proname;
            CONTINUE;
        END IF;
        SELECT string_agg(format('%I => $%s', p.proargnames[i], i), ', ' ORDER BY i) INTO call_args
          FROM generate_series(1, p.pronargs) AS i;
        IF p.prokind = 'p' THEN
            EXECUTE format('CREATE OR REPLACE PROCEDURE public.%I(%s) LANGUAGE plpgsql AS %L',
                           p.proname, p.arg_defs, format('BEGIN CALL pgsched.%I(%s); END', p.proname, call_args));
            EXECUTE format('COMMENT ON PROCEDURE public.%I(%s) IS %L', p.proname, p.arg_ids, marker);
        ELSE
            EXECUTE format('CREATE OR REPLACE FUNCTION public.%I(%s) RETURNS %s LANGUAGE sql AS %L',
                           p.proname, p.arg_defs, p.result,
                           CASE WHEN p.proretset
                                THEN format('SELECT * FROM pgsched.%I(%s)', p.proname, call_args)
                                ELSE format('SELECT pgsched.%I(%s)', p.proname, call_args) END);
            EXECUTE format('COMMENT ON FUNCTION public.%I(%s) IS %L', p.proname, p.arg_ids, marker);
        END IF;
    END LOOP;
    FOREACH v IN ARRAY api_views LOOP
        SELECT obj_description(c.oid, 'pg_class') INTO existing_comment
          FROM pg_catalog.pg_class c WHERE c.relnamespace = 'public'::regnamespace AND c.relname = v;
        IF FOUND AND existing_comment IS DISTINCT FROM marker THEN
            RAISE WARNING 'public.% exists and is not pgsched''s: use pgsched.% instead', v, v;
            CONTINUE;
        END IF;
        -- security_invoker, like the pgsched views: without it, the reader's rights would
        -- be those of this view's owner, who owns the tables and sees every row.
        EXECUTE format('CREATE OR REPLACE VIEW public.%I WITH (security_invoker = true) AS SELECT * FROM pgsched.%I',
                       v, v);
        EXECUTE format('COMMENT ON VIEW public.%I IS %L', v, marker);
        EXECUTE format('GRANT SELECT ON public.%I TO PUBLIC', v);
    END LOOP;
END
$gen$;
