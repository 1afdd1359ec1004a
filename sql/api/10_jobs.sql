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
            || 'regproc, boolean, timestamptz, text, text, text, text, jsonb, interval, integer, interval, boolean)',
        -- with scope_query, before database (migration 0006)
        'pgsched.add_job(regproc, text, jsonb, timestamptz, boolean, regproc, boolean, text, text, interval, '
            || 'integer, interval, text, boolean, interval, integer, interval, boolean, text)',
        'pgsched.add_job(regproc, interval, jsonb, timestamptz, boolean, regproc, boolean, text, text, interval, '
            || 'integer, interval, text, boolean, interval, integer, interval, boolean, text)',
        'pgsched.alter_job(integer, interval, interval, integer, interval, boolean, jsonb, timestamptz, boolean, '
            || 'regproc, boolean, timestamptz, text, text, text, text, jsonb, interval, integer, interval, boolean, '
            || 'text)',
        -- with database, before priority (migration 0008)
        'pgsched.add_job(regproc, text, jsonb, timestamptz, boolean, regproc, boolean, text, text, interval, '
            || 'integer, interval, text, boolean, interval, integer, interval, boolean, text, text)',
        'pgsched.add_job(regproc, interval, jsonb, timestamptz, boolean, regproc, boolean, text, text, interval, '
            || 'integer, interval, text, boolean, interval, integer, interval, boolean, text, text)',
        'pgsched.alter_job(integer, interval, interval, integer, interval, boolean, jsonb, timestamptz, boolean, '
            || 'regproc, boolean, timestamptz, text, text, text, text, jsonb, interval, integer, interval, boolean, '
            || 'text, text)',
        -- with priority, before exclude (migration 0009)
        'pgsched.add_job(regproc, text, jsonb, timestamptz, boolean, regproc, boolean, text, text, interval, '
            || 'integer, interval, text, boolean, interval, integer, interval, boolean, text, text, integer)',
        'pgsched.add_job(regproc, interval, jsonb, timestamptz, boolean, regproc, boolean, text, text, interval, '
            || 'integer, interval, text, boolean, interval, integer, interval, boolean, text, text, integer)',
        'pgsched.alter_job(integer, interval, interval, integer, interval, boolean, jsonb, timestamptz, boolean, '
            || 'regproc, boolean, timestamptz, text, text, text, text, jsonb, interval, integer, interval, boolean, '
            || 'text, text, integer)',
        -- with exclude, before jitter (migration 0010)
        'pgsched.add_job(regproc, text, jsonb, timestamptz, boolean, regproc, boolean, text, text, interval, '
            || 'integer, interval, text, boolean, interval, integer, interval, boolean, text, text, integer, text)',
        'pgsched.add_job(regproc, interval, jsonb, timestamptz, boolean, regproc, boolean, text, text, interval, '
            || 'integer, interval, text, boolean, interval, integer, interval, boolean, text, text, integer, text)',
        'pgsched.alter_job(integer, interval, interval, integer, interval, boolean, jsonb, timestamptz, boolean, '
            || 'regproc, boolean, timestamptz, text, text, text, text, jsonb, interval, integer, interval, boolean, '
            || 'text, text, integer, text)',
        -- with jitter, before concurrency_key (migration 0011)
        'pgsched.add_job(regproc, text, jsonb, timestamptz, boolean, regproc, boolean, text, text, interval, '
            || 'integer, interval, text, boolean, interval, integer, interval, boolean, text, text, integer, text, '
            || 'interval)',
        'pgsched.add_job(regproc, interval, jsonb, timestamptz, boolean, regproc, boolean, text, text, interval, '
            || 'integer, interval, text, boolean, interval, integer, interval, boolean, text, text, integer, text, '
            || 'interval)',
        'pgsched.alter_job(integer, interval, interval, integer, interval, boolean, jsonb, timestamptz, boolean, '
            || 'regproc, boolean, timestamptz, text, text, text, text, jsonb, interval, integer, interval, boolean, '
            || 'text, text, integer, text, interval)',
        -- with concurrency_key, before depends_on (migration 0012)
        'pgsched.add_job(regproc, text, jsonb, timestamptz, boolean, regproc, boolean, text, text, interval, '
            || 'integer, interval, text, boolean, interval, integer, interval, boolean, text, text, integer, text, '
            || 'interval, text)',
        'pgsched.add_job(regproc, interval, jsonb, timestamptz, boolean, regproc, boolean, text, text, interval, '
            || 'integer, interval, text, boolean, interval, integer, interval, boolean, text, text, integer, text, '
            || 'interval, text)',
        'pgsched.alter_job(integer, interval, interval, integer, interval, boolean, jsonb, timestamptz, boolean, '
            || 'regproc, boolean, timestamptz, text, text, text, text, jsonb, interval, integer, interval, boolean, '
            || 'text, text, integer, text, interval, text)',
        -- with depends_on, before history and the retentions (migration 0014)
        'pgsched.add_job(regproc, text, jsonb, timestamptz, boolean, regproc, boolean, text, text, interval, '
            || 'integer, interval, text, boolean, interval, integer, interval, boolean, text, text, integer, text, '
            || 'interval, text, text[])',
        'pgsched.add_job(regproc, interval, jsonb, timestamptz, boolean, regproc, boolean, text, text, interval, '
            || 'integer, interval, text, boolean, interval, integer, interval, boolean, text, text, integer, text, '
            || 'interval, text, text[])',
        'pgsched.alter_job(integer, interval, interval, integer, interval, boolean, jsonb, timestamptz, boolean, '
            || 'regproc, boolean, timestamptz, text, text, text, text, jsonb, interval, integer, interval, boolean, '
            || 'text, text, integer, text, interval, text, text[])']
    LOOP
        -- to_regprocedure first: DROP ... IF EXISTS would send a NOTICE on every install.
        IF pg_catalog.to_regprocedure(old_signature) IS NOT NULL THEN
            EXECUTE 'DROP FUNCTION ' || old_signature;
        END IF;
    END LOOP;
END
$drop_old$;

-- The internal functions whose arguments changed with pgsched.job_settings (they took every
-- setting as an argument before): all their versions go, the new ones are created below.
SELECT pgsched._drop_functions(ARRAY['_check_settings', '_insert_job', '_alter_job']);

-- A job's settings: ONE definition. The type names each setting and its type, in the order of
-- pgsched.job's columns of the same names (each is stored in that column); _settings_defaults
-- gives each default; _check_settings checks a whole set. add_job, alter_job, schedule and the
-- deploy of Python jobs (60_code_jobs.sql) build a pgsched.job_settings by name (jsonb keys,
-- checked by _settings) and hand it on whole; the job row is written from it by
-- _store_settings and _store_new_job, whose column lists are read from this type. The
-- scheduler's launch row carries the job row as jsonb, from which Python reads these settings
-- by name (pgsched/model.py, JobSettings). Only the public signatures spell the settings out
-- (PostgreSQL needs each argument written): tests/integration/test_settings_contract.py fails
-- when they, the table, or the Python side disagree with this definition.
--
-- Created again only when its attributes change (_define_type): a function taking it would
-- otherwise get a new oid at every install, under running schedulers. Nothing stored (no table
-- column) has this type.
SELECT pgsched._define_type('job_settings', $$
    schedule            text,        -- an interval literal or a cron expression
    fixed_schedule      boolean,
    initial_start       timestamptz,
    timezone            text,
    config              jsonb,
    scheduled           boolean,
    job_name            text,        -- NULL: generated at insert
    max_runtime         interval,
    max_retries         integer,
    retry_period        interval,
    catch_up            text,
    catch_up_window     interval,
    max_plans_per_tick  integer,
    schedule_delay      interval,
    allow_stale_reentry boolean,
    scope_query         text,
    database            text,        -- NULL: the scheduler's own database
    priority            integer,     -- seconds of precedence among due jobs (README "Priority")
    exclude             text,        -- NULL, or a 5-field cron of minutes not to run in (README "Exclusion windows")
    jitter              interval,    -- each planned start is delayed by a pseudo-random part of it (README "Jitter")
    concurrency_key     text,        -- NULL, or a key whose runs are limited across instances (README "Concurrency limits")
    depends_on          integer[],   -- NULL, or the ids of the jobs it runs after (README "Dependencies"); the
                                     -- API takes ids or names (pgsched._resolve_upstreams)
    history             text,        -- which ended runs keep a row: all, failures, none (README "History and retention")
    success_retention   interval,    -- NULL: the database's (pgsched.set_retention), for successful, skipped, missed runs
    failure_retention   interval     -- NULL: the database's, for failed, timed-out, crashed, cancelled runs
$$);

-- The defaults of add_job (and of a Python job's @pgsched.job): a setting not named here is NULL.
CREATE OR REPLACE FUNCTION pgsched._settings_defaults()
RETURNS pgsched.job_settings LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT pg_catalog.jsonb_populate_record(NULL::pgsched.job_settings, pg_catalog.jsonb_build_object(
        'fixed_schedule', true, 'scheduled', true, 'max_retries', -1, 'retry_period', '5 minutes',
        'catch_up', 'latest', 'max_plans_per_tick', 100, 'schedule_delay', '0', 'allow_stale_reentry', false,
        'priority', 0, 'jitter', '0', 'history', 'all'))
$$;

-- `base` with the settings named in `changes` (a jsonb object: setting => value, JSON null for
-- NULL) replaced. A key that names no setting is refused, so a misspelled name in a caller
-- fails instead of being ignored. Values are read by their setting's type (an interval from
-- its text, ...), so callers pin IntervalStyle when they turn intervals into jsonb.
CREATE OR REPLACE FUNCTION pgsched._settings(base pgsched.job_settings, changes jsonb)
RETURNS pgsched.job_settings LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    unknown text;
BEGIN
    SELECT string_agg(quote_literal(k), ', ') INTO unknown
      FROM jsonb_object_keys(changes) AS k
     WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute a
                        WHERE a.attrelid = 'pgsched.job_settings'::regclass AND a.attname = k
                          AND a.attnum > 0 AND NOT a.attisdropped);
    IF unknown IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = '42703', MESSAGE = format('unknown job setting(s): %s', unknown),
            HINT = 'the settings are the attributes of the type pgsched.job_settings';
    END IF;
    RETURN jsonb_populate_record(base, changes);
END
$$;

-- A job's stored settings, read by name from its row.
CREATE OR REPLACE FUNCTION pgsched._job_settings(j pgsched.job)
RETURNS pgsched.job_settings LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
SET intervalstyle = 'postgres' AS $$
    SELECT pg_catalog.jsonb_populate_record(NULL::pgsched.job_settings, pg_catalog.to_jsonb(j))
$$;

-- The columns of pgsched.job that hold the settings, in the type's order: the one column list
-- of the statements below, read from the definition (identifiers from the catalog, quoted).
CREATE OR REPLACE FUNCTION pgsched._settings_columns()
RETURNS text LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT string_agg(quote_ident(a.attname), ', ' ORDER BY a.attnum)
      FROM pg_catalog.pg_attribute a
     WHERE a.attrelid = 'pgsched.job_settings'::regclass AND a.attnum > 0 AND NOT a.attisdropped
$$;

-- Write a job's settings (schedule_interval follows schedule: trigger job_derive_interval).
CREATE OR REPLACE FUNCTION pgsched._store_settings(job_id integer, s pgsched.job_settings)
RETURNS void LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    EXECUTE format('UPDATE pgsched.job SET (%s) = (SELECT ($1).*) WHERE job_id = $2', pgsched._settings_columns())
      USING s, job_id;
END
$$;

-- The first time a job's plan becomes eligible: its first plan time (pgsched._first_start)
-- + schedule_delay (pgsched._delayed). Every way of creating or rescheduling a job uses this.
-- An @restart job has none until the server next starts (pgsched._arm_restart_jobs), an @after
-- job none of its own: its upstreams' success gives it its plans (07_dependencies.sql).
CREATE OR REPLACE FUNCTION pgsched._first_next_start(s pgsched.job_settings, iv interval)
RETURNS timestamptz LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT CASE WHEN btrim(s.schedule) NOT IN ('@restart', '@after') THEN
        pgsched._delayed(pgsched._first_start(s.schedule, iv, s.fixed_schedule, s.initial_start, s.timezone),
                         s.schedule_delay) END
$$;

-- Insert a job whose settings are checked (iv: their schedule's interval, NULL for cron) and
-- give it its first next_start. The settings' job_name NULL becomes '<proc> [<id>]'.
CREATE OR REPLACE FUNCTION pgsched._store_new_job(kind text, proc_schema name, proc_name name, command text,
                                                  code_module text, code_function text, check_schema name,
                                                  check_name name, s pgsched.job_settings, iv interval)
RETURNS integer LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    id integer := nextval(pg_catalog.pg_get_serial_sequence('pgsched.job', 'job_id'));
BEGIN
    s.job_name := coalesce(s.job_name, format('%s [%s]', coalesce(proc_name::text, 'command'), id));
    EXECUTE format('INSERT INTO pgsched.job (job_id, kind, proc_schema, proc_name, command, code_module, '
                   || 'code_function, check_schema, check_name, %s) '
                   || 'SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, ($10).*', pgsched._settings_columns())
      USING id, kind, proc_schema, proc_name, command, code_module, code_function, check_schema, check_name, s;
    UPDATE pgsched.job_stat st SET next_start = pgsched._first_next_start(s, iv) WHERE st.job_id = id;
    PERFORM pgsched._check_edges_made(id, s.depends_on);
    RETURN id;
END
$$;

-- A stored job's settings changed from `old` to `new` (iv: new's interval): a new schedule (its
-- text, fixed_schedule, origin or time zone) starts over from its first start; the same plan
-- with another schedule_delay becomes eligible (new - old) later (or earlier).
CREATE OR REPLACE FUNCTION pgsched._replan(job_id integer, old pgsched.job_settings, new pgsched.job_settings,
                                           iv interval)
RETURNS void LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    -- A changed exclusion window too: the stored next start may lie past the old window.
    -- No longer run after its upstreams: the plans they gave it would run beside its schedule's
    -- (its next start, set below from the schedule, replaces the pending one).
    IF old.schedule = '@after' AND new.schedule <> '@after' THEN
        UPDATE pgsched.job_stat st SET upstream_backlog = NULL
         WHERE st.job_id = _replan.job_id AND st.upstream_backlog IS NOT NULL;
    END IF;
    IF (new.schedule, new.fixed_schedule, new.initial_start, new.timezone, new.exclude)
       IS DISTINCT FROM (old.schedule, old.fixed_schedule, old.initial_start, old.timezone, old.exclude) THEN
        UPDATE pgsched.job_stat st SET next_start = pgsched._first_next_start(new, iv)
         WHERE st.job_id = _replan.job_id;
    ELSIF new.schedule_delay <> old.schedule_delay THEN
        UPDATE pgsched.job_stat st
           SET next_start = pgsched._delayed(pgsched._delayed(st.next_start, -old.schedule_delay),
                                             new.schedule_delay)
         WHERE st.job_id = _replan.job_id AND st.next_start IS NOT NULL;
    END IF;
END
$$;

-- pgsched.exclusion.leaves_no_start (the reference; its docstring says why this is exact):
-- whether every wall-clock minute in which the cron schedule fires is in the exclusion window.
-- Some minute or hour of the schedule's outside the window's is a way out on every day it
-- fires; otherwise only a day it fires on that the window does not name is. Days are compared
-- over the schedule's own years, or, without a year field, over one year for each (month,
-- weekday of the 1st, length) of 2000-2027: the month shapes that decide which days match.
CREATE OR REPLACE FUNCTION pgsched._exclude_leaves_no_start(schedule text, exclude text)
RETURNS boolean LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    c record;
    w record;
    ym record;
BEGIN
    SELECT * INTO c FROM pgsched._cron_parse(schedule);
    SELECT * INTO w FROM pgsched._cron_parse(exclude);
    IF NOT (c.minutes <@ w.minutes AND c.hours <@ w.hours) THEN
        RETURN false;
    END IF;
    FOR ym IN
        SELECT y, m FROM unnest(c.years) y, unnest(c.months) m
        UNION ALL
        -- one year per shape of month: its first weekday and its length
        (SELECT DISTINCT ON (m, extract(dow FROM make_date(y, m, 1)),
                             extract(day FROM make_date(y, m, 1) + interval '1 month' - interval '1 day')) y, m
           FROM generate_series(2000, 2027) y, unnest(c.months) m WHERE c.years IS NULL
          ORDER BY m, extract(dow FROM make_date(y, m, 1)),
                   extract(day FROM make_date(y, m, 1) + interval '1 month' - interval '1 day'), y)
    LOOP
        IF EXISTS (SELECT 1 FROM unnest(pgsched._cron_day_list(c.days, c.weekdays, c.last_day, c.nth, c.lasts,
                                                               c.dom_any, c.dow_any, ym.y, ym.m)) d
                   WHERE NOT (ym.m = ANY (w.months)
                              AND d = ANY (pgsched._cron_day_list(w.days, w.weekdays, w.last_day, w.nth, w.lasts,
                                                                  w.dom_any, w.dow_any, ym.y, ym.m)))) THEN
            RETURN false;
        END IF;
    END LOOP;
    RETURN true;
END
$$;

-- Check a whole set of settings; returns the schedule's interval (NULL for a cron expression).
-- Every entry point checks here, so the checks cannot drift apart.
--
-- check_scope false means the scope_query is not checked: it is the stored one, unchanged
-- (alter_job, schedule, a deploy). A given query is planned here, as the caller, exactly as
-- the scheduler will run it (pgsched/worker.py): SELECT s.* FROM (<query>) AS s. VOLATILE
-- because EXPLAIN is a utility statement, which PostgreSQL refuses in a STABLE function. Not SECURITY DEFINER (nor is anything that
-- calls it): the query is planned with the caller's rights, never the schema owner's.
--
-- check_database false likewise leaves the stored database unchecked (a job whose database was
-- dropped can still be altered or disabled); a given one is checked for `owner` (NULL: the
-- caller, who becomes the owner of a new job), as the scheduler will connect (pgsched/worker.py).
--
-- check_period false leaves the schedule's period unchecked against the shortest a job may be
-- given (_check_min_period): the callers pass whether the schedule is given anew, so that a job
-- stored with a shorter one before the rule can still be paused or altered otherwise.
CREATE OR REPLACE FUNCTION pgsched._check_settings(s pgsched.job_settings, check_scope boolean DEFAULT true,
                                                   check_database boolean DEFAULT true,
                                                   owner regrole DEFAULT NULL,
                                                   check_period boolean DEFAULT true)
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
    priority_form constant text := 'a whole number from -3600 to 3600 (seconds of precedence among due jobs; '
        || 'default 0)';
    exclude_form constant text := 'a cron expression of 5 fields (min hour dom month dow) naming the minutes in '
        || 'which the job does not run, such as ''* 2 * * *'' (02:00-02:59) or ''* * 25 12 *'' (Christmas Day), '
        || 'in the job''s time zone; or NULL for none (in alter_job: NULL keeps it, '''' removes it)';
    plan_line record;
    no_column boolean := false;
    jitter_form constant text := 'a duration from 0 up to 1 day such as ''30 seconds'' (each planned start is '
        || 'delayed by a pseudo-random amount below it, the same on every instance; default 0: none)';
    excl record;
    key_form constant text := 'a name of 1 to 200 characters such as ''heavy'': jobs that share it run at most '
        || 'pgsched.set_concurrency_limit(key, n) at once (default 1); or NULL for none (in alter_job: NULL keeps '
        || 'it, '''' removes it)';
BEGIN
    IF s.fixed_schedule IS NULL THEN
        PERFORM pgsched._bad_arg('fixed_schedule', 'NULL', 'true or false', '22004');
    END IF;
    iv := pgsched._parse_schedule(s.schedule, s.fixed_schedule);
    IF check_period THEN
        PERFORM pgsched._check_min_period(iv, 'schedule');
    END IF;
    PERFORM pgsched._check_timezone(s.timezone);
    -- Plans are instants the scheduler and the cron code compute with: finite, within the years
    -- Python's datetime has (a later one would disable the job at its first plan).
    IF s.initial_start IS NOT NULL AND NOT pgsched._plannable(s.initial_start) THEN
        PERFORM pgsched._bad_arg('initial_start', format('%s', s.initial_start), pgsched._plannable_form());
    END IF;
    IF iv IS NOT NULL AND NOT pgsched._plannable(pgsched._plus(coalesce(s.initial_start, pg_catalog.now()), iv)) THEN
        PERFORM pgsched._bad_arg('schedule', format('%L: its next plan would fall after the year 9998', s.schedule),
                                 'an interval such as ''5 minutes'' or ''1 year'' whose plans fall before the year 9999');
    END IF;
    IF iv IS NULL AND btrim(s.schedule) NOT IN ('@restart', '@after') THEN
        PERFORM pgsched._check_schedule_exact(s.schedule, s.timezone);
    END IF;
    IF btrim(s.schedule) = '@after' AND s.depends_on IS NULL THEN
        PERFORM pgsched._bad_arg('schedule', '''@after'' without depends_on',
                                 'an interval or a cron expression, or ''@after'' (or NULL in add_job) for a job that '
                                 || 'runs after the jobs its depends_on names');
    END IF;
    IF btrim(s.schedule) = '@restart' AND s.depends_on IS NOT NULL THEN
        PERFORM pgsched._bad_arg('depends_on', 'given with schedule ''@restart''',
                                 'NULL for an @restart job (it runs when the server starts), or, with another '
                                 || 'schedule, ' || pgsched._depends_form());
    END IF;
    IF s.depends_on IS NOT NULL AND (cardinality(s.depends_on) NOT BETWEEN 1 AND 100
                                     OR array_position(s.depends_on, NULL) IS NOT NULL) THEN
        PERFORM pgsched._bad_arg('depends_on', format('%s', s.depends_on), pgsched._depends_form());
    END IF;
    IF s.max_runtime IS NOT NULL AND s.max_runtime <= interval '0' THEN
        PERFORM pgsched._bad_arg('max_runtime', format('%s is not positive', s.max_runtime),
                                 'a positive interval, or NULL for no limit');
    END IF;
    -- NULL is 22004 (a value is required), as for every other setting
    IF s.max_retries IS NULL OR s.max_retries < -1 THEN
        PERFORM pgsched._bad_arg('max_retries', coalesce(s.max_retries::text, 'NULL'),
                                 '-1 (unlimited), 0 or a positive number',
                                 CASE WHEN s.max_retries IS NULL THEN '22004' ELSE '22023' END);
    END IF;
    IF s.retry_period IS NULL OR s.retry_period <= interval '0' THEN
        PERFORM pgsched._bad_arg('retry_period', coalesce(s.retry_period::text, 'NULL'), 'a positive interval',
                                 CASE WHEN s.retry_period IS NULL THEN '22004' ELSE '22023' END);
    END IF;
    IF s.catch_up IS NULL OR s.catch_up NOT IN ('latest', 'all', 'none') THEN
        PERFORM pgsched._bad_arg('catch_up', coalesce(quote_literal(s.catch_up), 'NULL'),
                                 'one of ''latest'', ''all'', ''none''',
                                 CASE WHEN s.catch_up IS NULL THEN '22004' ELSE '22023' END);
    END IF;
    IF s.max_plans_per_tick IS NULL THEN
        PERFORM pgsched._bad_arg('max_plans_per_tick', 'NULL', 'a whole number of at least 1', '22004');
    ELSIF s.max_plans_per_tick < 1 THEN
        PERFORM pgsched._bad_arg('max_plans_per_tick', format('%s is less than 1', s.max_plans_per_tick),
                                 'a whole number of at least 1');
    END IF;
    IF s.allow_stale_reentry IS NULL THEN
        PERFORM pgsched._bad_arg('allow_stale_reentry', 'NULL', 'true or false', '22004');
    END IF;
    -- The bound is a sanity limit: a plan that waits longer than a year is a mistake
    -- (a unit typed wrongly) more likely than a design, and next_start stays far from
    -- the end of the timestamp range.
    IF s.schedule_delay IS NULL THEN
        PERFORM pgsched._bad_arg('schedule_delay', 'NULL', delay_form, '22004');
    ELSIF s.schedule_delay < interval '0' THEN
        PERFORM pgsched._bad_arg('schedule_delay', format('%s is negative', s.schedule_delay), delay_form);
    ELSIF (pgsched._interval_parts(s.schedule_delay)).months <> 0 THEN
        -- The scheduler takes a plan's time as next_start minus the delay: that must be exact.
        PERFORM pgsched._bad_arg('schedule_delay', format('%s has months or years, whose length varies',
                                                          s.schedule_delay), delay_form);
    ELSIF s.schedule_delay > interval '365 days' THEN
        PERFORM pgsched._bad_arg('schedule_delay', format('%s is longer than 365 days', s.schedule_delay),
                                 delay_form);
    END IF;
    IF s.catch_up_window IS NOT NULL AND s.catch_up_window <= interval '0' THEN
        PERFORM pgsched._bad_arg('catch_up_window', format('%s is not positive', s.catch_up_window),
                                 'a positive interval such as ''1 hour'', or NULL for no limit (in alter_job: '
                                 || 'NULL keeps it, ''0'' removes it)');
    END IF;
    IF s.job_name IS NOT NULL AND btrim(s.job_name) = '' THEN
        PERFORM pgsched._bad_arg('job_name', 'empty', 'a non-empty name, or NULL for a generated one');
    END IF;
    -- (owner, job_name) is a unique index, whose entries must fit in a page.
    IF length(s.job_name) > 500 THEN
        PERFORM pgsched._bad_arg('job_name', format('%s characters long', length(s.job_name)),
                                 'a name of at most 500 characters');
    END IF;
    IF s.jitter IS NULL THEN
        PERFORM pgsched._bad_arg('jitter', 'NULL', jitter_form, '22004');
    ELSIF s.jitter < interval '0' THEN
        PERFORM pgsched._bad_arg('jitter', format('%s is negative', s.jitter), jitter_form);
    ELSIF (pgsched._interval_parts(s.jitter)).months <> 0 THEN
        PERFORM pgsched._bad_arg('jitter', format('%s has months or years, whose length varies', s.jitter),
                                 jitter_form);
    ELSIF s.jitter > interval '1 day' THEN
        PERFORM pgsched._bad_arg('jitter', format('%s is longer than 1 day', s.jitter), jitter_form);
    END IF;
    IF s.concurrency_key IS NOT NULL AND (btrim(s.concurrency_key) = '' OR length(s.concurrency_key) > 200) THEN
        PERFORM pgsched._bad_arg('concurrency_key',
                                 CASE WHEN btrim(s.concurrency_key) = '' THEN format('%L is empty', s.concurrency_key)
                                      ELSE format('%s characters long', length(s.concurrency_key)) END, key_form);
    END IF;
    IF s.history IS NULL THEN
        PERFORM pgsched._bad_arg('history', 'NULL', pgsched._history_form(), '22004');
    ELSIF s.history NOT IN ('all', 'failures', 'none') THEN
        PERFORM pgsched._bad_arg('history', quote_literal(s.history), pgsched._history_form());
    END IF;
    PERFORM pgsched._check_retention(s.success_retention, 'success_retention', job_setting => true),
            pgsched._check_retention(s.failure_retention, 'failure_retention', job_setting => true);
    IF s.priority IS NULL THEN
        PERFORM pgsched._bad_arg('priority', 'NULL', priority_form, '22004');
    ELSIF s.priority NOT BETWEEN -3600 AND 3600 THEN
        PERFORM pgsched._bad_arg('priority', format('%s is out of range', s.priority), priority_form);
    END IF;
    IF s.exclude IS NOT NULL THEN
        IF s.exclude ~ '^\s*@' OR coalesce(array_length(regexp_split_to_array(btrim(s.exclude), '\s+'), 1), 0) <> 5
           OR s.exclude !~ '\S' THEN
            PERFORM pgsched._bad_arg('exclude', format('%L is not a cron expression of 5 fields', s.exclude),
                                     exclude_form);
        END IF;
        BEGIN
            excl := pgsched._cron_parse(s.exclude);
        EXCEPTION WHEN invalid_parameter_value THEN
            -- The parser names the argument 'schedule'; this one is exclude.
            PERFORM pgsched._bad_arg('exclude', regexp_replace(SQLERRM, '^invalid schedule: ', ''), exclude_form);
        END;
        -- pgsched.exclusion.covers_every_minute and check_pair: a window that leaves the job no
        -- start would only have the scheduler search for one. A window of every minute leaves
        -- any schedule none; one that takes every minute a cron schedule fires in, that one.
        -- (An interval schedule's plans depend on its origin and runs; the scheduler disables
        -- such a job at its first excluded plan, pgsched.exclusion.next_allowed.)
        IF pgsched._exclude_leaves_no_start('* * * * *', s.exclude) THEN
            PERFORM pgsched._bad_arg('exclude', format('%L excludes every minute: the job would never run',
                                                       s.exclude), exclude_form);
        ELSIF iv IS NULL AND btrim(s.schedule) NOT IN ('@restart', '@after')
              AND pgsched._exclude_leaves_no_start(s.schedule, s.exclude) THEN
            PERFORM pgsched._bad_arg('exclude', format('%L leaves schedule %L no start: every minute in which it '
                                                       || 'fires is excluded', s.exclude, s.schedule), exclude_form);
        END IF;
    END IF;
    IF s.database IS NOT NULL AND check_database THEN
        PERFORM pgsched._check_database(s.database, coalesce(owner, current_user::regrole));
    END IF;
    IF s.scope_query IS NOT NULL AND check_scope THEN
        IF s.scope_query !~ '\S' THEN
            PERFORM pgsched._bad_arg('scope_query', 'blank', scope_form);
        ELSIF length(s.scope_query) > 10000 THEN
            PERFORM pgsched._bad_arg('scope_query', format('%s characters long', length(s.scope_query)), scope_form);
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
            FOR plan_line IN EXECUTE 'EXPLAIN SELECT s.* FROM (' || s.scope_query || ') AS s' LOOP
            END LOOP;
            -- The key is the first column: a query of none ('SELECT') plans, and would queue no
            -- scope run at any plan. Naming one column fails for such a query only.
            BEGIN
                FOR plan_line IN EXECUTE 'EXPLAIN SELECT s.* FROM (' || s.scope_query || ') AS s(key)' LOOP
                END LOOP;
            EXCEPTION WHEN invalid_column_reference THEN
                no_column := true;
            END;
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
        IF no_column THEN
            PERFORM pgsched._bad_arg('scope_query', 'it returns no column', scope_form);
        END IF;
    END IF;
    RETURN iv;
END
$$;

-- add_job and schedule end here: the checks of everything given, then the insert.
CREATE OR REPLACE FUNCTION pgsched._insert_job(kind text, proc regproc, command text, s pgsched.job_settings,
                                               check_config regproc, if_not_exists boolean)
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
    IF if_not_exists IS NULL THEN
        PERFORM pgsched._bad_arg('if_not_exists', 'NULL', 'true or false', '22004');
    END IF;
    -- alter_job takes '' for the scheduler's own database; a new job is given NULL for that.
    IF s.database = '' THEN
        PERFORM pgsched._bad_arg('database', 'empty',
                                 'the name of a database of this server, or NULL for the scheduler''s own');
    END IF;
    -- A job with upstreams and no schedule runs after them.
    IF s.schedule IS NULL AND s.depends_on IS NOT NULL THEN
        s.schedule := '@after';
    END IF;
    iv := pgsched._check_settings(s);
    IF s.scheduled IS NULL THEN
        PERFORM pgsched._bad_arg('scheduled', 'NULL', 'true or false', '22004');
    END IF;
    IF kind = 'proc' THEN
        SELECT c.proc_schema, c.proc_name INTO t_schema, t_name FROM pgsched._check_proc(proc, 'proc') c;
    ELSIF command IS NULL OR btrim(command) = '' THEN
        PERFORM pgsched._bad_arg('command', coalesce(quote_literal(command), 'NULL'), 'non-empty SQL text',
                                 CASE WHEN command IS NULL THEN '22004' ELSE '22023' END);
    END IF;
    IF check_config IS NOT NULL THEN
        PERFORM pgsched._check_config(check_config, s.config);
        SELECT n.nspname, p.proname INTO c_schema, c_name FROM pg_catalog.pg_proc p
          JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace WHERE p.oid = check_config;
    END IF;
    IF s.job_name IS NOT NULL THEN
        SELECT j.job_id INTO id FROM pgsched.job j
         WHERE j.owner = current_user::regrole AND j.job_name = s.job_name;
        IF id IS NOT NULL THEN
            IF if_not_exists THEN
                RAISE NOTICE 'job % named % already exists, skipping', id, quote_literal(s.job_name);
                RETURN id;
            END IF;
            RAISE EXCEPTION USING ERRCODE = '42710',
                MESSAGE = format('invalid job_name: job %s of role %I is already named %L', id, current_user,
                                 s.job_name),
                HINT = 'job_name must be unique per owner; pass if_not_exists => true to reuse the existing job';
        END IF;
    END IF;
    s.schedule := btrim(s.schedule);
    RETURN pgsched._store_new_job(kind => kind, proc_schema => t_schema, proc_name => t_name, command => command,
                                  code_module => NULL, code_function => NULL, check_schema => c_schema,
                                  check_name => c_name, s => s, iv => iv);
END
$$;

-- The settings arrive as named arguments (TimescaleDB's signature) and are passed on by name;
-- IntervalStyle is pinned so that an interval reads back from its jsonb text as itself.
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
    scope_query text DEFAULT NULL,
    database text DEFAULT NULL,
    priority integer DEFAULT 0,
    exclude text DEFAULT NULL,
    jitter interval DEFAULT interval '0',
    concurrency_key text DEFAULT NULL,
    depends_on text[] DEFAULT NULL,
    history text DEFAULT 'all',
    success_retention interval DEFAULT NULL,
    failure_retention interval DEFAULT NULL)
RETURNS integer LANGUAGE sql
SET search_path = pg_catalog, pg_temp
SET intervalstyle = 'postgres' AS $$
    SELECT pgsched._insert_job(kind => 'proc', proc => proc, command => NULL, check_config => check_config,
                               if_not_exists => if_not_exists,
                               s => pgsched._settings(pgsched._settings_defaults(), jsonb_build_object(
                                   'schedule', schedule, 'config', config, 'initial_start', initial_start,
                                   'scheduled', scheduled, 'fixed_schedule', fixed_schedule, 'timezone', timezone,
                                   'job_name', job_name, 'max_runtime', max_runtime, 'max_retries', max_retries,
                                   'retry_period', retry_period, 'catch_up', catch_up,
                                   'catch_up_window', catch_up_window, 'max_plans_per_tick', max_plans_per_tick,
                                   'schedule_delay', schedule_delay, 'allow_stale_reentry', allow_stale_reentry,
                                   'scope_query', scope_query, 'database', database,
                                   'priority', priority, 'exclude', exclude, 'jitter', jitter,
                                   'concurrency_key', concurrency_key,
                                   'depends_on', pgsched._resolve_upstreams(depends_on, current_user::regrole),
                                   'history', history, 'success_retention', success_retention,
                                   'failure_retention', failure_retention)))
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
    scope_query text DEFAULT NULL,
    database text DEFAULT NULL,
    priority integer DEFAULT 0,
    exclude text DEFAULT NULL,
    jitter interval DEFAULT interval '0',
    concurrency_key text DEFAULT NULL,
    depends_on text[] DEFAULT NULL,
    history text DEFAULT 'all',
    success_retention interval DEFAULT NULL,
    failure_retention interval DEFAULT NULL)
RETURNS integer LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM pgsched._check_interval(schedule_interval, fixed_schedule, 'schedule_interval'),
            pgsched._check_min_period(schedule_interval, 'schedule_interval');
    RETURN pgsched.add_job(proc => proc, schedule => pgsched._interval_text(schedule_interval), config => config,
                           initial_start => initial_start, scheduled => scheduled, check_config => check_config,
                           fixed_schedule => fixed_schedule, timezone => timezone, job_name => job_name,
                           max_runtime => max_runtime, max_retries => max_retries, retry_period => retry_period,
                           catch_up => catch_up, if_not_exists => if_not_exists, catch_up_window => catch_up_window,
                           max_plans_per_tick => max_plans_per_tick, schedule_delay => schedule_delay,
                           allow_stale_reentry => allow_stale_reentry, scope_query => scope_query,
                           database => database, priority => priority, exclude => exclude, jitter => jitter,
                           concurrency_key => concurrency_key, depends_on => depends_on, history => history,
                           success_retention => success_retention, failure_retention => failure_retention);
END
$$;

-- Interval text in one fixed style, whatever the session's IntervalStyle is.
CREATE OR REPLACE FUNCTION pgsched._interval_text(iv interval)
RETURNS text LANGUAGE sql STABLE STRICT
SET search_path = pg_catalog, pg_temp
SET intervalstyle = 'postgres' AS $$
    SELECT iv::text
$$;

-- alter_job's work. `changes`: the settings alter_job was given by name (a jsonb object);
-- those given as NULL (left out) stay as they are, the others replace the stored ones.
-- schedule_interval, config_merge and scope_query '' are alter_job's own ways of giving
-- a setting.
CREATE OR REPLACE FUNCTION pgsched._alter_job(job_id integer, changes jsonb, schedule_interval interval,
                                              next_start timestamptz, if_exists boolean, check_config regproc,
                                              config_merge jsonb, depends_on text[])
RETURNS TABLE (r_job_id integer, r_schedule text, r_schedule_interval interval, r_max_runtime interval,
               r_max_retries integer, r_retry_period interval, r_scheduled boolean, r_config jsonb,
               r_next_start timestamptz, r_check_config text, r_fixed_schedule boolean,
               r_initial_start timestamptz, r_timezone text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET intervalstyle = 'postgres' AS $$
DECLARE
    j pgsched.job;
    old pgsched.job_settings;
    s pgsched.job_settings;
    given jsonb;
    iv interval;
BEGIN
    IF _alter_job.job_id IS NULL THEN
        PERFORM pgsched._bad_arg('job_id', 'NULL', 'the id of an existing job', '22004');
    END IF;
    -- NO KEY: a close that inserts a run of this job checks its key meanwhile (FOR KEY SHARE).
    SELECT * INTO j FROM pgsched.job WHERE job.job_id = _alter_job.job_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        PERFORM pgsched._check_job_writable(_alter_job.job_id);
        IF if_exists THEN
            RAISE NOTICE 'job % not found, skipping', _alter_job.job_id;
            RETURN;
        END IF;
        PERFORM pgsched._job_not_found(_alter_job.job_id);
    END IF;
    -- Only the top level: a config's own nulls are part of it.
    SELECT coalesce(jsonb_object_agg(c.key, c.value), '{}') INTO given
      FROM jsonb_each(changes) c WHERE c.value <> 'null';
    IF given ? 'schedule' AND _alter_job.schedule_interval IS NOT NULL THEN
        PERFORM pgsched._bad_arg('schedule', 'given together with schedule_interval',
                                 'one of schedule (text) or schedule_interval (interval)');
    END IF;
    IF _alter_job.schedule_interval IS NOT NULL THEN
        -- Checked here, so that the error names the argument given (not the schedule it becomes).
        PERFORM pgsched._check_interval(_alter_job.schedule_interval,
                                        coalesce((given->>'fixed_schedule')::boolean, j.fixed_schedule),
                                        'schedule_interval'),
                pgsched._check_min_period(_alter_job.schedule_interval, 'schedule_interval');
        given := given || jsonb_build_object('schedule', pgsched._interval_text(_alter_job.schedule_interval));
    END IF;
    -- Names resolve for the job's owner; '{}' removes the dependencies.
    IF _alter_job.depends_on IS NOT NULL THEN
        given := given || jsonb_build_object('depends_on', nullif(pgsched._resolve_upstreams(_alter_job.depends_on,
                                                                                              j.owner), '{}'));
    END IF;
    old := pgsched._job_settings(j);
    s := pgsched._settings(old, given);
    s.schedule := btrim(s.schedule);
    -- '' removes the scoping; NULL leaves the stored query as it is (and unchecked: only a
    -- query given here is planned, so a job whose query broke can still be altered).
    IF s.scope_query = '' THEN
        s.scope_query := NULL;
    END IF;
    IF _alter_job.next_start IS NOT NULL AND NOT pgsched._plannable(_alter_job.next_start) THEN
        PERFORM pgsched._bad_arg('next_start', format('%s', _alter_job.next_start),
                                 pgsched._plannable_form() || ' (to stop a job from running, alter_job(job_id, '
                                 || 'scheduled => false))');
    END IF;
    IF _alter_job.config_merge IS NOT NULL THEN
        IF jsonb_typeof(_alter_job.config_merge) <> 'object' THEN
            PERFORM pgsched._bad_arg('config_merge', format('%s is not an object', _alter_job.config_merge),
                                     'a jsonb object whose keys replace those of config');
        END IF;
        IF jsonb_typeof(coalesce(s.config, '{}'::jsonb)) <> 'object' THEN
            PERFORM pgsched._bad_arg('config_merge', format('the job''s config %s is not an object to merge into',
                                                            s.config),
                                     'given only for a job whose config is an object (or NULL); replace a config '
                                     || 'of another kind with config');
        END IF;
        s.config := coalesce(s.config, '{}'::jsonb) || _alter_job.config_merge;
    END IF;
    -- '' is the scheduler's own database again.
    IF s.database = '' THEN
        s.database := NULL;
    END IF;
    -- '' removes the exclusion window, and the concurrency key.
    IF s.exclude = '' THEN
        s.exclude := NULL;
    END IF;
    IF s.concurrency_key = '' THEN
        s.concurrency_key := NULL;
    END IF;
    -- '0' removes the catch-up window (NULL keeps it), as '' removes a text setting; only zero
    -- itself, not an interval that compares equal to it ('1 day -24 hours' is refused as ever).
    IF given ? 'catch_up_window' AND (SELECT p.months = 0 AND p.days = 0 AND p.micros = 0
                                        FROM pgsched._interval_parts(s.catch_up_window) p) THEN
        s.catch_up_window := NULL;
    END IF;
    -- '0' returns a retention to the database's.
    IF s.success_retention = interval '0' THEN
        s.success_retention := NULL;
    END IF;
    IF s.failure_retention = interval '0' THEN
        s.failure_retention := NULL;
    END IF;
    iv := pgsched._check_settings(s, check_scope => s.scope_query IS NOT NULL AND given ? 'scope_query',
                                  check_database => given ? 'database', owner => j.owner,
                                  check_period => s.schedule IS DISTINCT FROM old.schedule);
    IF _alter_job.check_config IS NOT NULL THEN
        SELECT n.nspname, p.proname INTO j.check_schema, j.check_name FROM pg_catalog.pg_proc p
          JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace WHERE p.oid = _alter_job.check_config;
    END IF;
    -- A check runs with the caller's rights: the one this call names, the caller chose; the one
    -- stored, its owner chose, so it runs only in the owner's own session. Run by anyone else (an
    -- administrator, even after SET ROLE to the owner: the check could RESET ROLE), it would be
    -- the owner's code with that role's rights.
    IF j.check_name IS NOT NULL AND _alter_job.check_config IS NULL
       AND (given ? 'config' OR _alter_job.config_merge IS NOT NULL)
       AND NOT (session_user = current_user
                AND j.owner::oid = (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = current_user)) THEN
        RAISE NOTICE USING MESSAGE = format('check_config %I.%I not run: it runs only in a session of the '
                                            'job''s owner, %s', j.check_schema, j.check_name, j.owner),
            HINT = 'to check the new config, change it as the owner, or pass check_config in this call';
    ELSIF j.check_name IS NOT NULL AND (_alter_job.check_config IS NOT NULL OR given ? 'config'
                                        OR _alter_job.config_merge IS NOT NULL) THEN
        PERFORM pgsched._check_config(format('%I.%I', j.check_schema, j.check_name)::regproc, s.config);
    END IF;
    IF s.job_name IS DISTINCT FROM old.job_name
       AND EXISTS (SELECT 1 FROM pgsched.job o WHERE o.owner = j.owner AND o.job_name = s.job_name) THEN
        RAISE EXCEPTION USING ERRCODE = '42710',
            MESSAGE = format('invalid job_name: role %s already has a job named %L', j.owner, s.job_name),
            HINT = 'job_name must be unique per owner';
    END IF;

    PERFORM pgsched._store_settings(j.job_id, s);
    IF _alter_job.check_config IS NOT NULL THEN
        UPDATE pgsched.job SET check_schema = j.check_schema, check_name = j.check_name
         WHERE job.job_id = j.job_id;
    END IF;
    -- next_start is when the next plan becomes eligible (see the top of this file); a
    -- next_start given here is taken as that, as it is.
    IF _alter_job.next_start IS NOT NULL THEN
        UPDATE pgsched.job_stat st SET next_start = _alter_job.next_start WHERE st.job_id = j.job_id;
    ELSE
        PERFORM pgsched._replan(j.job_id, old, s, iv);
    END IF;

    RETURN QUERY
    SELECT j.job_id, s.schedule, iv, s.max_runtime, s.max_retries, s.retry_period, s.scheduled,
           s.config, st.next_start,
           CASE WHEN j.check_name IS NULL THEN NULL ELSE format('%I.%I', j.check_schema, j.check_name) END,
           s.fixed_schedule, s.initial_start, s.timezone
      FROM pgsched.job_stat st WHERE st.job_id = j.job_id;
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
    scope_query text DEFAULT NULL,
    database text DEFAULT NULL,
    priority integer DEFAULT NULL,
    exclude text DEFAULT NULL,
    jitter interval DEFAULT NULL,
    concurrency_key text DEFAULT NULL,
    depends_on text[] DEFAULT NULL,
    history text DEFAULT NULL,
    success_retention interval DEFAULT NULL,
    failure_retention interval DEFAULT NULL)
RETURNS TABLE (job_id integer, schedule text, schedule_interval interval, max_runtime interval,
               max_retries integer, retry_period interval, scheduled boolean, config jsonb,
               next_start timestamptz, check_config text, fixed_schedule boolean, initial_start timestamptz,
               timezone text)
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
SET intervalstyle = 'postgres' AS $$
    SELECT * FROM pgsched._alter_job(
        job_id => $1, schedule_interval => $2, next_start => $8, if_exists => $9, check_config => $10,
        config_merge => $17, depends_on => $28,
        changes => jsonb_build_object(
            'max_runtime', $3, 'max_retries', $4, 'retry_period', $5, 'scheduled', $6, 'config', $7,
            'fixed_schedule', $11, 'initial_start', $12, 'timezone', $13, 'job_name', $14, 'schedule', $15,
            'catch_up', $16, 'catch_up_window', $18, 'max_plans_per_tick', $19, 'schedule_delay', $20,
            'allow_stale_reentry', $21, 'scope_query', $22, 'database', $23, 'priority', $24,
            'exclude', $25, 'jitter', $26, 'concurrency_key', $27, 'history', $29, 'success_retention', $30,
            'failure_retention', $31))
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
SET search_path = pg_catalog, pg_temp
SET intervalstyle = 'postgres' AS $$
DECLARE
    cur pgsched.job;
    old pgsched.job_settings;
    s pgsched.job_settings;
    iv interval;
BEGIN
    IF job_name IS NULL THEN
        PERFORM pgsched._bad_arg('job_name', 'NULL', 'a non-empty name', '22004');
    END IF;
    PERFORM pgsched._check_owner_can_login();
    SELECT * INTO cur FROM pgsched.job j
     WHERE j.owner = current_user::regrole AND j.job_name = schedule.job_name FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN pgsched._insert_job(kind => 'command', proc => NULL, command => command, check_config => NULL,
                                   if_not_exists => false,
                                   s => pgsched._settings(pgsched._settings_defaults(), jsonb_build_object(
                                       'schedule', schedule, 'job_name', job_name)));
    END IF;
    IF command IS NULL OR btrim(command) = '' THEN
        PERFORM pgsched._bad_arg('command', coalesce(quote_literal(command), 'NULL'), 'non-empty SQL text',
                                 CASE WHEN command IS NULL THEN '22004' ELSE '22023' END);
    END IF;
    -- The schedule becomes pg_cron's (fixed, no origin, UTC); the job's other settings,
    -- which pg_cron does not have, stay as they are (scope_query too: stored, not re-checked).
    old := pgsched._job_settings(cur);
    s := pgsched._settings(old, jsonb_build_object('schedule', schedule, 'fixed_schedule', true,
                                                   'initial_start', NULL, 'timezone', NULL));
    iv := pgsched._check_settings(s, check_scope => false, check_database => false,
                                  check_period => btrim(s.schedule) IS DISTINCT FROM old.schedule);
    s.schedule := btrim(s.schedule);
    UPDATE pgsched.job j
       SET kind = 'command', command = schedule.command, proc_schema = NULL, proc_name = NULL
     WHERE j.job_id = cur.job_id;
    PERFORM pgsched._store_settings(cur.job_id, s);
    -- An @after job keeps the plans its upstreams gave it while it stays one, and drops them when
    -- it gets a schedule (as _replan does).
    UPDATE pgsched.job_stat st
       SET next_start = CASE WHEN s.schedule = '@after' AND old.schedule = '@after' THEN st.next_start
                             WHEN st.state = 'disabled' THEN st.next_start
                             ELSE pgsched._first_next_start(s, iv) END,
           upstream_backlog = CASE WHEN s.schedule = '@after' THEN st.upstream_backlog END
     WHERE st.job_id = cur.job_id;
    RETURN cur.job_id;
END
$$;

CREATE OR REPLACE FUNCTION pgsched.schedule(schedule text, command text)
RETURNS bigint LANGUAGE sql
SET search_path = pg_catalog, pg_temp AS $$
    SELECT pgsched._insert_job(kind => 'command', proc => NULL, command => command, check_config => NULL,
                               if_not_exists => false,
                               s => pgsched._settings(pgsched._settings_defaults(),
                                                      jsonb_build_object('schedule', schedule)))::bigint
$$;

CREATE OR REPLACE FUNCTION pgsched.unschedule(job_name text)
RETURNS boolean LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    id integer;
BEGIN
    IF unschedule.job_name IS NULL THEN
        PERFORM pgsched._bad_arg('job_name', 'NULL', 'the name of one of your jobs, or a job id', '22004');
    END IF;
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
