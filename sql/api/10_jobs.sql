-- The job API: add_job (TimescaleDB-compatible), alter_job, delete_job, and
-- pg_cron-style schedule/unschedule. Every entry point checks all of its input
-- before writing anything, so a rejected call leaves the catalog untouched.
--
-- schedule_delay: job_stat.next_start is when the next run becomes eligible, its
-- plan time + schedule_delay; the scheduler takes plan_time = next_start - delay
-- when it claims. The delay is a fixed duration (no months; a day is 24 hours) and
-- is added as elapsed time, as the scheduler subtracts it, so the two are exact
-- inverses whatever the session's TimeZone.

-- This file is re-applied with CREATE OR REPLACE, which cannot change a function's
-- arguments: a new argument list makes a second overload (and ambiguous calls).
-- So a signature that changed is dropped here first: those of the last release,
-- before catch_up_window, max_plans_per_tick, schedule_delay and allow_stale_reentry
-- (migration 0004), then those between that and scope_query (migration 0005), which
-- were never released but a database may have been initialised with them (commit
-- 8b9e5d9). public's wrappers of them go in 90_public.sql.
DO $drop_old$
DECLARE
    old_signature text;
BEGIN
    FOREACH old_signature IN ARRAY ARRAY[
        -- the last release
        'pgsched._check_settings(text, boolean, text, interval, integer, interval, text, text)',
        'pgsched._insert_job(text, regproc, text, text, jsonb, timestamptz, boolean, regproc, boolean, text, '
            || 'text, interval, integer, interval, text, boolean)',
        'pgsched.add_job(regproc, text, jsonb, timestamptz, boolean, regproc, boolean, text, text, interval, '
            || 'integer, interval, text, boolean)',
        'pgsched.add_job(regproc, interval, jsonb, timestamptz, boolean, regproc, boolean, text, text, interval, '
            || 'integer, interval, text, boolean)',
        'pgsched._alter_job(integer, interval, interval, integer, interval, boolean, jsonb, timestamptz, boolean, '
            || 'regproc, boolean, timestamptz, text, text, text, text, jsonb)',
        'pgsched.alter_job(integer, interval, interval, integer, interval, boolean, jsonb, timestamptz, boolean, '
            || 'regproc, boolean, timestamptz, text, text, text, text, jsonb)',
        -- unreleased: with the settings of migration 0004, without scope_query
        'pgsched._check_settings(text, boolean, text, interval, integer, interval, text, text, interval, integer, '
            || 'interval, boolean)',
        'pgsched._insert_job(text, regproc, text, text, jsonb, timestamptz, boolean, regproc, boolean, text, '
            || 'text, interval, integer, interval, text, boolean, interval, integer, interval, boolean)',
        'pgsched.add_job(regproc, text, jsonb, timestamptz, boolean, regproc, boolean, text, text, interval, '
            || 'integer, interval, text, boolean, interval, integer, interval, boolean)',
        'pgsched.add_job(regproc, interval, jsonb, timestamptz, boolean, regproc, boolean, text, text, interval, '
            || 'integer, interval, text, boolean, interval, integer, interval, boolean)',
        'pgsched._alter_job(integer, interval, interval, integer, interval, boolean, jsonb, timestamptz, boolean, '
            || 'regproc, boolean, timestamptz, text, text, text, text, jsonb, interval, integer, interval, boolean)',
        'pgsched.alter_job(integer, interval, interval, integer, interval, boolean, jsonb, timestamptz, boolean, '
            || 'regproc, boolean, timestamptz, text, text, text, text, jsonb, interval, integer, interval, boolean)']
    LOOP
        -- to_regprocedure first: DROP ... IF EXISTS would send a NOTICE on every install.
        IF pg_catalog.to_regprocedure(old_signature) IS NOT NULL THEN
            EXECUTE 'DROP FUNCTION ' || old_signature;
        END IF;
    END LOOP;
END
$drop_old$;

-- The one place a job row is written from settings; add_job, schedule and
-- alter_job all end here so the checks cannot drift apart.
--
-- scope_query NULL means there is nothing to check: the job is not scoped, or (alter_job,
-- schedule, a deploy) its stored query is not being changed. A given query is planned
-- here, as the caller, exactly as the scheduler will run it (pgsched/worker.py):
-- SELECT s.* FROM (<query>) AS s. VOLATILE because EXPLAIN is a utility statement, which
-- PostgreSQL refuses in a STABLE function. Not SECURITY DEFINER (nor is anything that
-- calls it): the query is planned with the caller's rights, never the schema owner's.
CREATE OR REPLACE FUNCTION pgsched._check_settings(
    schedule text, fixed_schedule boolean, timezone text, max_runtime interval, max_retries integer,
    retry_period interval, catch_up text, job_name text, catch_up_window interval, max_plans_per_tick integer,
    schedule_delay interval, allow_stale_reentry boolean, scope_query text)
RETURNS interval LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    iv interval;
    delay_form constant text := 'a duration from 0 up to 365 days without months or years, such as ''0'', '
        || '''90 seconds'' or ''2 hours''';
    scope_form constant text := 'one query of at most 10000 characters returning the scope keys in its first '
        || 'column, such as ''SELECT region FROM regions'' (no trailing semicolon: it runs as SELECT s.* FROM '
        || '(<query>) AS s), or NULL for a job that is not scoped (in alter_job: NULL keeps the query, '''' '
        || 'removes it)';
    plan_line record;
BEGIN
    IF fixed_schedule IS NULL THEN
        PERFORM pgsched._bad_arg('fixed_schedule', 'NULL', 'true or false', '22004');
    END IF;
    iv := pgsched._parse_schedule(schedule, fixed_schedule);
    PERFORM pgsched._check_timezone(timezone);
    IF iv IS NULL THEN
        PERFORM pgsched._check_schedule_exact(schedule, timezone);
    END IF;
    IF max_runtime IS NOT NULL AND max_runtime <= interval '0' THEN
        PERFORM pgsched._bad_arg('max_runtime', format('%s is not positive', max_runtime),
                                 'a positive interval, or NULL for no limit');
    END IF;
    IF max_retries IS NULL OR max_retries < -1 THEN
        PERFORM pgsched._bad_arg('max_retries', coalesce(max_retries::text, 'NULL'),
                                 '-1 (unlimited), 0 or a positive number');
    END IF;
    IF retry_period IS NULL OR retry_period <= interval '0' THEN
        PERFORM pgsched._bad_arg('retry_period', coalesce(retry_period::text, 'NULL'), 'a positive interval');
    END IF;
    IF catch_up IS NULL OR catch_up NOT IN ('latest', 'all', 'none') THEN
        PERFORM pgsched._bad_arg('catch_up', coalesce(quote_literal(catch_up), 'NULL'),
                                 'one of ''latest'', ''all'', ''none''');
    END IF;
    IF max_plans_per_tick IS NULL THEN
        PERFORM pgsched._bad_arg('max_plans_per_tick', 'NULL', 'a whole number of at least 1', '22004');
    ELSIF max_plans_per_tick < 1 THEN
        PERFORM pgsched._bad_arg('max_plans_per_tick', format('%s is less than 1', max_plans_per_tick),
                                 'a whole number of at least 1');
    END IF;
    IF allow_stale_reentry IS NULL THEN
        PERFORM pgsched._bad_arg('allow_stale_reentry', 'NULL', 'true or false', '22004');
    END IF;
    -- The bound is a sanity limit: a plan that waits longer than a year is a mistake
    -- (a unit typed wrongly) more likely than a design, and next_start stays far from
    -- the end of the timestamp range.
    IF schedule_delay IS NULL THEN
        PERFORM pgsched._bad_arg('schedule_delay', 'NULL', delay_form, '22004');
    ELSIF schedule_delay < interval '0' THEN
        PERFORM pgsched._bad_arg('schedule_delay', format('%s is negative', schedule_delay), delay_form);
    ELSIF (pgsched._interval_parts(schedule_delay)).months <> 0 THEN
        -- The scheduler takes a plan's time as next_start minus the delay: that must be exact.
        PERFORM pgsched._bad_arg('schedule_delay', format('%s has months or years, whose length varies',
                                                          schedule_delay), delay_form);
    ELSIF schedule_delay > interval '365 days' THEN
        PERFORM pgsched._bad_arg('schedule_delay', format('%s is longer than 365 days', schedule_delay),
                                 delay_form);
    END IF;
    IF catch_up_window IS NOT NULL AND catch_up_window <= interval '0' THEN
        PERFORM pgsched._bad_arg('catch_up_window', format('%s is not positive', catch_up_window),
                                 'a positive interval such as ''1 hour'', or NULL for no limit');
    END IF;
    IF job_name IS NOT NULL AND btrim(job_name) = '' THEN
        PERFORM pgsched._bad_arg('job_name', 'empty', 'a non-empty name, or NULL for a generated one');
    END IF;
    -- (owner, job_name) is a unique index, whose entries must fit in a page.
    IF length(job_name) > 500 THEN
        PERFORM pgsched._bad_arg('job_name', format('%s characters long', length(job_name)),
                                 'a name of at most 500 characters');
    END IF;
    IF scope_query IS NOT NULL THEN
        IF scope_query !~ '\S' THEN
            PERFORM pgsched._bad_arg('scope_query', 'blank', scope_form);
        ELSIF length(scope_query) > 10000 THEN
            PERFORM pgsched._bad_arg('scope_query', format('%s characters long', length(scope_query)), scope_form);
        END IF;
        BEGIN
            -- Plain EXPLAIN (no ANALYZE) parses, resolves names and types, checks privileges and
            -- plans, and runs nothing. FOR ... IN EXECUTE opens a cursor, which takes exactly one
            -- statement: a query that closes the parenthesis to append statements of its own
            -- ('SELECT 1) AS s; DROP TABLE t; SELECT (1') is refused before any of it runs, where a
            -- plain EXECUTE would run them all. Planning may still evaluate immutable functions;
            -- so, like the scheduler's run, it is read-only, and whatever happened is rolled back
            -- with this block's subtransaction (the raise of 'PSQ00' below), settings included.
            -- The scheduler runs the query in a new session of the owner's: names resolve through
            -- the session's default search_path (not this function's), and the run's settings
            -- are there (pgsched/worker.py).
            PERFORM pg_catalog.set_config('search_path', st.reset_val, true)
               FROM pg_catalog.pg_settings st WHERE st.name = 'search_path';
            PERFORM pg_catalog.set_config('pgsched.run_id', '0', true),
                    pg_catalog.set_config('pgsched.plan_time', pg_catalog.now()::text, true),
                    pg_catalog.set_config('pgsched.scope', '', true),
                    pg_catalog.set_config('transaction_read_only', 'on', true);
            FOR plan_line IN EXECUTE 'EXPLAIN SELECT s.* FROM (' || scope_query || ') AS s' LOOP
            END LOOP;
            RAISE EXCEPTION USING ERRCODE = 'PSQ00';
        EXCEPTION
            WHEN SQLSTATE 'PSQ00' THEN
                NULL;  -- it plans
            WHEN invalid_cursor_definition THEN
                PERFORM pgsched._bad_arg('scope_query', 'more than one statement', scope_form);
            WHEN syntax_error_or_access_rule_violation OR data_exception OR feature_not_supported
                 OR invalid_schema_name OR read_only_sql_transaction OR cardinality_violation THEN
                PERFORM pgsched._bad_arg('scope_query', format('it does not plan as SELECT s.* FROM (<query>) '
                                                               || 'AS s: %s', SQLERRM), scope_form);
        END;
    END IF;
    RETURN iv;
END
$$;

CREATE OR REPLACE FUNCTION pgsched._insert_job(
    kind text, proc regproc, command text, schedule text, config jsonb, initial_start timestamptz,
    scheduled boolean, check_config regproc, fixed_schedule boolean, timezone text, job_name text,
    max_runtime interval, max_retries integer, retry_period interval, catch_up text, if_not_exists boolean,
    catch_up_window interval, max_plans_per_tick integer, schedule_delay interval, allow_stale_reentry boolean,
    scope_query text)
RETURNS integer LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    iv interval;
    t_schema name;
    t_name name;
    c_schema name;
    c_name name;
    id integer;
BEGIN
    PERFORM pgsched._check_owner_can_login();
    iv := pgsched._check_settings(schedule, fixed_schedule, timezone, max_runtime, max_retries, retry_period,
                                  catch_up, job_name, catch_up_window, max_plans_per_tick, schedule_delay,
                                  allow_stale_reentry, scope_query);
    IF scheduled IS NULL THEN
        PERFORM pgsched._bad_arg('scheduled', 'NULL', 'true or false', '22004');
    END IF;
    IF kind = 'proc' THEN
        SELECT c.proc_schema, c.proc_name INTO t_schema, t_name FROM pgsched._check_proc(proc, 'proc') c;
    ELSIF command IS NULL OR btrim(command) = '' THEN
        PERFORM pgsched._bad_arg('command', coalesce(quote_literal(command), 'NULL'), 'non-empty SQL text',
                                 CASE WHEN command IS NULL THEN '22004' ELSE '22023' END);
    END IF;
    IF check_config IS NOT NULL THEN
        PERFORM pgsched._check_config(check_config, config);
        SELECT n.nspname, p.proname INTO c_schema, c_name FROM pg_catalog.pg_proc p
          JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace WHERE p.oid = check_config;
    END IF;
    IF job_name IS NOT NULL THEN
        SELECT j.job_id INTO id FROM pgsched.job j
         WHERE j.owner = current_user::regrole AND j.job_name = _insert_job.job_name;
        IF id IS NOT NULL THEN
            IF if_not_exists THEN
                RAISE NOTICE 'job % named % already exists, skipping', id, quote_literal(job_name);
                RETURN id;
            END IF;
            RAISE EXCEPTION USING ERRCODE = '42710',
                MESSAGE = format('invalid job_name: job %s of role %I is already named %L', id, current_user,
                                 job_name),
                HINT = 'job_name must be unique per owner; pass if_not_exists => true to reuse the existing job';
        END IF;
    END IF;
    id := nextval(pg_catalog.pg_get_serial_sequence('pgsched.job', 'job_id'));
    INSERT INTO pgsched.job (job_id, job_name, kind, proc_schema, proc_name, command, schedule, schedule_interval,
                             fixed_schedule, initial_start, timezone, config, check_schema, check_name, scheduled,
                             max_runtime, max_retries, retry_period, catch_up, catch_up_window,
                             max_plans_per_tick, schedule_delay, allow_stale_reentry, scope_query)
    VALUES (id, coalesce(job_name, format('%s [%s]', coalesce(t_name::text, 'command'), id)), kind,
            t_schema, t_name, command, btrim(schedule), iv, fixed_schedule, initial_start,
            timezone, config, c_schema, c_name, scheduled, max_runtime, max_retries, retry_period,
            catch_up, catch_up_window, max_plans_per_tick, schedule_delay, allow_stale_reentry,
            _insert_job.scope_query);
    -- next_start is when the first plan becomes eligible (see the top of this file).
    UPDATE pgsched.job_stat s
       SET next_start = pgsched._first_start(btrim(schedule), iv, fixed_schedule, initial_start, timezone)
                        + pgsched._as_elapsed(_insert_job.schedule_delay)
     WHERE s.job_id = id;
    RETURN id;
END
$$;

CREATE OR REPLACE FUNCTION pgsched.add_job(
    proc regproc,
    schedule text,
    config jsonb DEFAULT NULL,
    initial_start timestamptz DEFAULT NULL,
    scheduled boolean DEFAULT true,
    check_config regproc DEFAULT NULL,
    fixed_schedule boolean DEFAULT true,
    timezone text DEFAULT NULL,
    job_name text DEFAULT NULL,
    max_runtime interval DEFAULT NULL,
    max_retries integer DEFAULT -1,
    retry_period interval DEFAULT interval '5 minutes',
    catch_up text DEFAULT 'latest',
    if_not_exists boolean DEFAULT false,
    catch_up_window interval DEFAULT NULL,
    max_plans_per_tick integer DEFAULT 100,
    schedule_delay interval DEFAULT interval '0',
    allow_stale_reentry boolean DEFAULT false,
    scope_query text DEFAULT NULL)
RETURNS integer LANGUAGE sql
SET search_path = pg_catalog, pg_temp AS $$
    SELECT pgsched._insert_job('proc', proc, NULL, schedule, config, initial_start, scheduled, check_config,
                               fixed_schedule, timezone, job_name, max_runtime, max_retries, retry_period,
                               catch_up, if_not_exists, catch_up_window, max_plans_per_tick, schedule_delay,
                               allow_stale_reentry, scope_query)
$$;

-- TimescaleDB's signature, so its calls keep working: add_job('p', interval '1h')
-- and add_job('p', schedule_interval => '1 hour').
CREATE OR REPLACE FUNCTION pgsched.add_job(
    proc regproc,
    schedule_interval interval,
    config jsonb DEFAULT NULL,
    initial_start timestamptz DEFAULT NULL,
    scheduled boolean DEFAULT true,
    check_config regproc DEFAULT NULL,
    fixed_schedule boolean DEFAULT true,
    timezone text DEFAULT NULL,
    job_name text DEFAULT NULL,
    max_runtime interval DEFAULT NULL,
    max_retries integer DEFAULT -1,
    retry_period interval DEFAULT interval '5 minutes',
    catch_up text DEFAULT 'latest',
    if_not_exists boolean DEFAULT false,
    catch_up_window interval DEFAULT NULL,
    max_plans_per_tick integer DEFAULT 100,
    schedule_delay interval DEFAULT interval '0',
    allow_stale_reentry boolean DEFAULT false,
    scope_query text DEFAULT NULL)
RETURNS integer LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM pgsched._check_interval(schedule_interval, fixed_schedule, 'schedule_interval');
    RETURN pgsched._insert_job('proc', proc, NULL, pgsched._interval_text(schedule_interval), config,
                               initial_start, scheduled, check_config, fixed_schedule, timezone, job_name,
                               max_runtime, max_retries, retry_period, catch_up, if_not_exists,
                               catch_up_window, max_plans_per_tick, schedule_delay, allow_stale_reentry,
                               scope_query);
END
$$;

-- Interval text in one fixed style, whatever the session's IntervalStyle is.
CREATE OR REPLACE FUNCTION pgsched._interval_text(iv interval)
RETURNS text LANGUAGE sql STABLE STRICT
SET search_path = pg_catalog, pg_temp
SET intervalstyle = 'postgres' AS $$
    SELECT iv::text
$$;

CREATE OR REPLACE FUNCTION pgsched._alter_job(
    job_id integer,
    schedule_interval interval DEFAULT NULL,
    max_runtime interval DEFAULT NULL,
    max_retries integer DEFAULT NULL,
    retry_period interval DEFAULT NULL,
    scheduled boolean DEFAULT NULL,
    config jsonb DEFAULT NULL,
    next_start timestamptz DEFAULT NULL,
    if_exists boolean DEFAULT false,
    check_config regproc DEFAULT NULL,
    fixed_schedule boolean DEFAULT NULL,
    initial_start timestamptz DEFAULT NULL,
    timezone text DEFAULT NULL,
    job_name text DEFAULT NULL,
    schedule text DEFAULT NULL,
    catch_up text DEFAULT NULL,
    config_merge jsonb DEFAULT NULL,
    catch_up_window interval DEFAULT NULL,
    max_plans_per_tick integer DEFAULT NULL,
    schedule_delay interval DEFAULT NULL,
    allow_stale_reentry boolean DEFAULT NULL,
    scope_query text DEFAULT NULL)
RETURNS TABLE (r_job_id integer, r_schedule text, r_schedule_interval interval, r_max_runtime interval,
               r_max_retries integer, r_retry_period interval, r_scheduled boolean, r_config jsonb,
               r_next_start timestamptz, r_check_config text, r_fixed_schedule boolean,
               r_initial_start timestamptz, r_timezone text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    j pgsched.job;
    new_schedule text;
    iv interval;
    reschedule boolean;
    old_delay interval;
BEGIN
    IF _alter_job.job_id IS NULL THEN
        PERFORM pgsched._bad_arg('job_id', 'NULL', 'the id of an existing job', '22004');
    END IF;
    SELECT * INTO j FROM pgsched.job WHERE job.job_id = _alter_job.job_id FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM pgsched._check_job_writable(_alter_job.job_id);
        IF if_exists THEN
            RAISE NOTICE 'job % not found, skipping', _alter_job.job_id;
            RETURN;
        END IF;
        PERFORM pgsched._job_not_found(_alter_job.job_id);
    END IF;
    IF _alter_job.schedule IS NOT NULL AND _alter_job.schedule_interval IS NOT NULL THEN
        PERFORM pgsched._bad_arg('schedule', 'given together with schedule_interval',
                                 'one of schedule (text) or schedule_interval (interval)');
    END IF;
    new_schedule := coalesce(_alter_job.schedule, pgsched._interval_text(_alter_job.schedule_interval), j.schedule);
    reschedule := new_schedule IS DISTINCT FROM j.schedule
        OR (_alter_job.fixed_schedule IS NOT NULL AND _alter_job.fixed_schedule <> j.fixed_schedule)
        OR (_alter_job.initial_start IS NOT NULL AND _alter_job.initial_start IS DISTINCT FROM j.initial_start)
        OR (_alter_job.timezone IS NOT NULL AND _alter_job.timezone IS DISTINCT FROM j.timezone);
    j.schedule := btrim(new_schedule);
    j.fixed_schedule := coalesce(_alter_job.fixed_schedule, j.fixed_schedule);
    j.initial_start := coalesce(_alter_job.initial_start, j.initial_start);
    j.timezone := coalesce(_alter_job.timezone, j.timezone);
    j.max_runtime := coalesce(_alter_job.max_runtime, j.max_runtime);
    j.max_retries := coalesce(_alter_job.max_retries, j.max_retries);
    j.retry_period := coalesce(_alter_job.retry_period, j.retry_period);
    j.catch_up := coalesce(_alter_job.catch_up, j.catch_up);
    j.catch_up_window := coalesce(_alter_job.catch_up_window, j.catch_up_window);
    j.max_plans_per_tick := coalesce(_alter_job.max_plans_per_tick, j.max_plans_per_tick);
    old_delay := j.schedule_delay;
    j.schedule_delay := coalesce(_alter_job.schedule_delay, j.schedule_delay);
    j.allow_stale_reentry := coalesce(_alter_job.allow_stale_reentry, j.allow_stale_reentry);
    -- '' removes the scoping; NULL leaves the stored query as it is (and unchecked: only a
    -- query given here is planned, so a job whose query broke can still be altered).
    IF _alter_job.scope_query = '' THEN
        j.scope_query := NULL;
    ELSIF _alter_job.scope_query IS NOT NULL THEN
        j.scope_query := _alter_job.scope_query;
    END IF;
    j.job_name := coalesce(_alter_job.job_name, j.job_name);
    j.scheduled := coalesce(_alter_job.scheduled, j.scheduled);
    j.config := coalesce(_alter_job.config, j.config);
    IF _alter_job.config_merge IS NOT NULL THEN
        IF jsonb_typeof(_alter_job.config_merge) <> 'object' THEN
            PERFORM pgsched._bad_arg('config_merge', format('%s is not an object', _alter_job.config_merge),
                                     'a jsonb object whose keys replace those of config');
        END IF;
        j.config := coalesce(j.config, '{}'::jsonb) || _alter_job.config_merge;
    END IF;
    iv := pgsched._check_settings(j.schedule, j.fixed_schedule, j.timezone, j.max_runtime, j.max_retries,
                                  j.retry_period, j.catch_up, j.job_name, j.catch_up_window, j.max_plans_per_tick,
                                  j.schedule_delay, j.allow_stale_reentry, nullif(_alter_job.scope_query, ''));
    j.schedule_interval := iv;
    IF _alter_job.check_config IS NOT NULL THEN
        SELECT n.nspname, p.proname INTO j.check_schema, j.check_name FROM pg_catalog.pg_proc p
          JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace WHERE p.oid = _alter_job.check_config;
    END IF;
    IF j.check_name IS NOT NULL AND (_alter_job.check_config IS NOT NULL OR _alter_job.config IS NOT NULL
                                     OR _alter_job.config_merge IS NOT NULL) THEN
        PERFORM pgsched._check_config(format('%I.%I', j.check_schema, j.check_name)::regproc, j.config);
    END IF;
    IF j.job_name IS DISTINCT FROM (SELECT cur.job_name FROM pgsched.job cur WHERE cur.job_id = j.job_id)
       AND EXISTS (SELECT 1 FROM pgsched.job o WHERE o.owner = j.owner AND o.job_name = j.job_name) THEN
        RAISE EXCEPTION USING ERRCODE = '42710',
            MESSAGE = format('invalid job_name: role %s already has a job named %L', j.owner, j.job_name),
            HINT = 'job_name must be unique per owner';
    END IF;

    UPDATE pgsched.job SET
        job_name = j.job_name, schedule = j.schedule, schedule_interval = j.schedule_interval,
        fixed_schedule = j.fixed_schedule, initial_start = j.initial_start, timezone = j.timezone,
        config = j.config, check_schema = j.check_schema, check_name = j.check_name, scheduled = j.scheduled,
        max_runtime = j.max_runtime, max_retries = j.max_retries, retry_period = j.retry_period,
        catch_up = j.catch_up, catch_up_window = j.catch_up_window, max_plans_per_tick = j.max_plans_per_tick,
        schedule_delay = j.schedule_delay, allow_stale_reentry = j.allow_stale_reentry,
        scope_query = j.scope_query
     WHERE job.job_id = j.job_id;

    -- next_start is when the next plan becomes eligible (see the top of this file); a
    -- next_start given here is taken as that, as it is.
    IF _alter_job.next_start IS NOT NULL THEN
        UPDATE pgsched.job_stat s SET next_start = _alter_job.next_start WHERE s.job_id = j.job_id;
    ELSIF reschedule THEN
        UPDATE pgsched.job_stat s
           SET next_start = pgsched._first_start(j.schedule, iv, j.fixed_schedule, j.initial_start, j.timezone)
                            + pgsched._as_elapsed(j.schedule_delay)
         WHERE s.job_id = j.job_id;
    ELSIF j.schedule_delay <> old_delay THEN
        -- Same plan, another delay: it becomes eligible (new - old) later (or earlier).
        UPDATE pgsched.job_stat s
           SET next_start = s.next_start + pgsched._as_elapsed(j.schedule_delay)
                            - pgsched._as_elapsed(old_delay)
         WHERE s.job_id = j.job_id AND s.next_start IS NOT NULL;
    END IF;

    RETURN QUERY
    SELECT j.job_id, j.schedule, j.schedule_interval, j.max_runtime, j.max_retries, j.retry_period, j.scheduled,
           j.config, s.next_start,
           CASE WHEN j.check_name IS NULL THEN NULL ELSE format('%I.%I', j.check_schema, j.check_name) END,
           j.fixed_schedule, j.initial_start, j.timezone
      FROM pgsched.job_stat s WHERE s.job_id = j.job_id;
END
$$;

-- TimescaleDB's alter_job returns columns named like its arguments, which
-- PL/pgSQL cannot declare; a SQL shell keeps that signature.
-- A setting passed as NULL (or left out) stays as it is. scope_query: a query makes the
-- job scoped (or changes its query), checked like add_job's; '' (the empty string)
-- removes the scoping, so that the job runs once per plan again.
CREATE OR REPLACE FUNCTION pgsched.alter_job(
    job_id integer,
    schedule_interval interval DEFAULT NULL,
    max_runtime interval DEFAULT NULL,
    max_retries integer DEFAULT NULL,
    retry_period interval DEFAULT NULL,
    scheduled boolean DEFAULT NULL,
    config jsonb DEFAULT NULL,
    next_start timestamptz DEFAULT NULL,
    if_exists boolean DEFAULT false,
    check_config regproc DEFAULT NULL,
    fixed_schedule boolean DEFAULT NULL,
    initial_start timestamptz DEFAULT NULL,
    timezone text DEFAULT NULL,
    job_name text DEFAULT NULL,
    schedule text DEFAULT NULL,
    catch_up text DEFAULT NULL,
    config_merge jsonb DEFAULT NULL,
    catch_up_window interval DEFAULT NULL,
    max_plans_per_tick integer DEFAULT NULL,
    schedule_delay interval DEFAULT NULL,
    allow_stale_reentry boolean DEFAULT NULL,
    scope_query text DEFAULT NULL)
RETURNS TABLE (job_id integer, schedule text, schedule_interval interval, max_runtime interval,
               max_retries integer, retry_period interval, scheduled boolean, config jsonb,
               next_start timestamptz, check_config text, fixed_schedule boolean, initial_start timestamptz,
               timezone text)
LANGUAGE sql
SET search_path = pg_catalog, pg_temp AS $$
    SELECT * FROM pgsched._alter_job($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17,
                                     $18, $19, $20, $21, $22)
$$;

CREATE OR REPLACE FUNCTION pgsched.delete_job(job_id integer)
RETURNS void LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF job_id IS NULL THEN
        PERFORM pgsched._bad_arg('job_id', 'NULL', 'the id of an existing job', '22004');
    END IF;
    DELETE FROM pgsched.job j WHERE j.job_id = delete_job.job_id;
    IF NOT FOUND THEN
        PERFORM pgsched._check_job_writable(delete_job.job_id);
        PERFORM pgsched._job_not_found(delete_job.job_id);
    END IF;
END
$$;

-- pg_cron style: a named SQL command on a schedule; the same name again
-- (for the same owner) updates that job in place.
CREATE OR REPLACE FUNCTION pgsched.schedule(job_name text, schedule text, command text)
RETURNS bigint LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    id integer;
    iv interval;
    cur pgsched.job;
BEGIN
    IF job_name IS NULL THEN
        PERFORM pgsched._bad_arg('job_name', 'NULL', 'a non-empty name', '22004');
    END IF;
    PERFORM pgsched._check_owner_can_login();
    SELECT * INTO cur FROM pgsched.job j
     WHERE j.owner = current_user::regrole AND j.job_name = schedule.job_name FOR UPDATE;
    id := cur.job_id;
    IF id IS NULL THEN
        RETURN pgsched._insert_job('command', NULL, command, schedule, NULL, NULL, true, NULL, true, NULL,
                                   job_name, NULL, -1, interval '5 minutes', 'latest', false,
                                   NULL, 100, interval '0', false, NULL);
    END IF;
    IF command IS NULL OR btrim(command) = '' THEN
        PERFORM pgsched._bad_arg('command', coalesce(quote_literal(command), 'NULL'), 'non-empty SQL text',
                                 CASE WHEN command IS NULL THEN '22004' ELSE '22023' END);
    END IF;
    -- The schedule becomes pg_cron's (fixed, no origin, UTC); the job's other settings,
    -- which pg_cron does not have, stay as they are (scope_query too: stored, not re-checked).
    iv := pgsched._check_settings(schedule, true, NULL, NULL, -1, interval '5 minutes', 'latest', job_name,
                                  cur.catch_up_window, cur.max_plans_per_tick, cur.schedule_delay,
                                  cur.allow_stale_reentry, NULL);
    UPDATE pgsched.job j
       SET kind = 'command', command = schedule.command, proc_schema = NULL, proc_name = NULL,
           schedule = btrim(schedule.schedule), schedule_interval = iv, fixed_schedule = true,
           initial_start = NULL, timezone = NULL
     WHERE j.job_id = id;
    UPDATE pgsched.job_stat s
       SET next_start = pgsched._first_start(btrim(schedule.schedule), iv, true, NULL, NULL)
                        + pgsched._as_elapsed(cur.schedule_delay)
     WHERE s.job_id = id AND s.state <> 'disabled';
    RETURN id;
END
$$;

CREATE OR REPLACE FUNCTION pgsched.schedule(schedule text, command text)
RETURNS bigint LANGUAGE sql
SET search_path = pg_catalog, pg_temp AS $$
    SELECT pgsched._insert_job('command', NULL, command, schedule, NULL, NULL, true, NULL, true, NULL, NULL,
                               NULL, -1, interval '5 minutes', 'latest', false, NULL, 100, interval '0',
                               false, NULL)::bigint
$$;

CREATE OR REPLACE FUNCTION pgsched.unschedule(job_name text)
RETURNS boolean LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    id integer;
BEGIN
    DELETE FROM pgsched.job j WHERE j.owner = current_user::regrole AND j.job_name = unschedule.job_name
    RETURNING j.job_id INTO id;
    IF id IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '42704',
            MESSAGE = format('job named %L not found for role %I', job_name, current_user),
            HINT = 'job_name must name one of your jobs (see pgsched.jobs), or pass the job id';
    END IF;
    RETURN true;
END
$$;

CREATE OR REPLACE FUNCTION pgsched.unschedule(job_id bigint)
RETURNS boolean LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF job_id IS NULL THEN
        PERFORM pgsched._bad_arg('job_id', 'NULL', 'the id of an existing job', '22004');
    ELSIF job_id NOT BETWEEN -2147483648 AND 2147483647 THEN
        RAISE EXCEPTION USING ERRCODE = '42704',
            MESSAGE = format('job %s not found', job_id),
            HINT = 'job_id must be the id of an existing job (see pgsched.jobs)';
    END IF;
    PERFORM pgsched.delete_job(job_id::integer);
    RETURN true;
END
$$;
