-- Internal helpers shared by the API: argument checks, schedule recognition,
-- the NOTIFY and bookkeeping triggers. Re-applied on every upgrade.
-- Every function pins search_path and qualifies names.

-- Drop every version of the named pgsched functions that an earlier release left. For
-- internal functions only (called by the scheduler, or by other functions, calls that
-- PostgreSQL does not record as dependencies): the file that defines them calls this
-- first, so a changed argument list or result neither fails CREATE OR REPLACE nor leaves
-- an old overload behind that makes calls ambiguous.
-- Except under `pgsched init`, which sets pgsched.replace_in_place: a function dropped and
-- created again gets a new oid, and a statement of a running scheduler that looked up the
-- old one just before init's commit fails ("cache lookup failed for function"). So init
-- has the files replace functions in place, drops only those PostgreSQL refuses to replace
-- (a changed result or argument name), and after the files the old overloads they did not
-- create again (pgsched/migrate.py).
CREATE OR REPLACE FUNCTION pgsched._drop_functions(names text[])
RETURNS void LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    f regprocedure;
BEGIN
    IF pg_catalog.current_setting('pgsched.replace_in_place', true) = 'on' THEN
        RETURN;
    END IF;
    FOR f IN SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p
              WHERE p.pronamespace = 'pgsched'::regnamespace AND p.proname = ANY (names) LOOP
        EXECUTE format('DROP FUNCTION %s', f);
    END LOOP;
END
$$;

-- Run one CREATE OR REPLACE VIEW or TRIGGER of these files (`ddl`, on `relation`, the view
-- itself or the trigger's table) only when its text changed since it last ran, the object is
-- missing, or init applies a migration too (pgsched.replace_all = on: a migration may change
-- what the same text gives). A replacement locks until init commits: a view ACCESS EXCLUSIVE, so
-- that reading it waits, and a trigger's table SHARE ROW EXCLUSIVE, so that every write to it
-- waits; a reapply that left them as they were made running schedulers' claims and closes wait
-- for the rest of it (README "`init` gives way"). The text's sha256 is kept in the object's comment,
-- which goes with the object when it is dropped.
CREATE OR REPLACE FUNCTION pgsched._replace_if_changed(relation text, trigger_name text, ddl text)
RETURNS void LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    -- sha256, not md5: a server in FIPS mode refuses md5.
    mark constant text := 'pgsched: defined by sql/api, definition sha256 '
                          || pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(ddl, 'UTF8')), 'hex');
    was text;
BEGIN
    -- (A name lookup and pg_description: no lock on the relation.)
    IF trigger_name IS NULL THEN
        was := pg_catalog.obj_description(pg_catalog.to_regclass(relation), 'pg_class');
    ELSE
        SELECT pg_catalog.obj_description(t.oid, 'pg_trigger') INTO was
          FROM pg_catalog.pg_trigger t
         WHERE t.tgrelid = pg_catalog.to_regclass(relation) AND t.tgname = trigger_name;
    END IF;
    IF was IS NOT DISTINCT FROM mark
       AND pg_catalog.current_setting('pgsched.replace_all', true) IS DISTINCT FROM 'on' THEN
        RETURN;
    END IF;
    EXECUTE ddl;
    IF trigger_name IS NULL THEN
        EXECUTE format('COMMENT ON VIEW %s IS %L', pg_catalog.to_regclass(relation), mark);
    ELSE
        EXECUTE format('COMMENT ON TRIGGER %I ON %s IS %L', trigger_name, pg_catalog.to_regclass(relation), mark);
    END IF;
END
$$;

-- Create the composite type pgsched.<type_name> (<attributes>), or leave it as it is when it
-- has these attributes already: dropping it would take the functions that return it along
-- (new oids: see _drop_functions). A type whose attributes changed is dropped with them
-- (CASCADE): its file creates them again after it.
CREATE OR REPLACE FUNCTION pgsched._define_type(type_name text, attributes text)
RETURNS void LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    scratch constant text := type_name || '__new';
    old_attributes text;
    new_attributes text;
BEGIN
    IF pg_catalog.to_regtype(format('pgsched.%I', type_name)) IS NULL THEN
        EXECUTE format('CREATE TYPE pgsched.%I AS (%s)', type_name, attributes);
        RETURN;
    END IF;
    -- Compared as PostgreSQL reads them, so that spelling (int, integer) does not matter.
    EXECUTE format('CREATE TYPE pgsched.%I AS (%s)', scratch, attributes);
    SELECT pg_catalog.string_agg(format('%I %s', a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod)),
                                 ', ' ORDER BY a.attnum) FILTER (WHERE t.typname = type_name),
           pg_catalog.string_agg(format('%I %s', a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod)),
                                 ', ' ORDER BY a.attnum) FILTER (WHERE t.typname = scratch)
      INTO old_attributes, new_attributes
      FROM pg_catalog.pg_type t JOIN pg_catalog.pg_attribute a ON a.attrelid = t.typrelid
     WHERE t.typnamespace = 'pgsched'::regnamespace AND t.typname IN (type_name, scratch)
       AND a.attnum > 0 AND NOT a.attisdropped;
    EXECUTE format('DROP TYPE pgsched.%I', scratch);
    IF old_attributes IS DISTINCT FROM new_attributes THEN
        EXECUTE format('DROP TYPE pgsched.%I CASCADE', type_name);
        EXECUTE format('CREATE TYPE pgsched.%I AS (%s)', type_name, attributes);
    END IF;
END
$$;

-- The rule of schedule_delay, once: a plan becomes eligible (job_stat.next_start) at its plan
-- time + schedule_delay, the delay added as elapsed time ('1 day' = 24 hours whatever the
-- session's time zone), so that _delayed(t, -delay) undoes it exactly (the claim takes
-- plan_time = _delayed(next_start, -delay)). The scheduler adds it the same way in
-- pgsched/state.py (_delayed). No SET clause, unlike the other functions here, so that PostgreSQL
-- inlines it into the claim's query (a pinned search_path would make it a call per row);
-- every name in it is qualified. STABLE, not IMMUTABLE: timestamptz + interval is STABLE, and
-- PostgreSQL does not inline a function declared stricter than its body; each call then ran
-- the SQL-function executor (1 us in a query, 12 us in PL/pgSQL: 8 % of the claim and close).
SELECT pgsched._drop_functions(ARRAY['_as_elapsed']);  -- _delayed's forerunner
CREATE OR REPLACE FUNCTION pgsched._delayed(t timestamptz, delay interval)
RETURNS timestamptz LANGUAGE sql STABLE AS $$
    SELECT t + pg_catalog.make_interval(secs => extract(epoch FROM delay))
$$;

-- Raised for bad API input: one place decides the SQLSTATE and the message shape
-- ("<argument>: <what is wrong>; expected <accepted form>").
CREATE OR REPLACE FUNCTION pgsched._bad_arg(argument text, problem text, expected text,
                                            errcode text DEFAULT '22023')
RETURNS void LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = errcode,
        MESSAGE = format('invalid %s: %s', argument, problem),
        HINT = format('%s must be %s', argument, expected);
END
$$;

-- Whether a plan at `t` can be computed with: finite, from the year 1 to 9998 (a plan after it
-- could not be followed by the next one in Python's datetime, which ends in 9999).
CREATE OR REPLACE FUNCTION pgsched._plannable(t timestamptz)
RETURNS boolean LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
RETURN t IS NOT NULL AND t >= timestamptz '0001-01-02 00:00:00+00' AND t < timestamptz '9999-01-01 00:00:00+00';

CREATE OR REPLACE FUNCTION pgsched._plannable_form()
RETURNS text LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
RETURN 'a finite time from the year 1 to 9998, such as ''2026-12-01 03:00+00''';

-- t + iv, or 'infinity' where that is beyond what timestamptz holds (an error otherwise). STABLE
-- as timestamptz + interval is: a day or a month is added in the session's time zone.
CREATE OR REPLACE FUNCTION pgsched._plus(t timestamptz, iv interval)
RETURNS timestamptz LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN t + iv;
EXCEPTION WHEN datetime_field_overflow OR numeric_value_out_of_range OR interval_field_overflow THEN
    RETURN 'infinity';
END
$$;

-- Does the text have the shape of a cron expression (as opposed to an interval
-- literal)? Mirrors pgsched.schedule.looks_like_cron.
CREATE OR REPLACE FUNCTION pgsched._is_cron(expr text)
RETURNS boolean LANGUAGE sql IMMUTABLE STRICT
SET search_path = pg_catalog, pg_temp AS $$
    SELECT btrim(expr) ~* '^@(yearly|annually|monthly|weekly|daily|midnight|hourly)$'
        OR (array_length(regexp_split_to_array(btrim(expr), '\s+'), 1) BETWEEN 5 AND 7
            AND NOT EXISTS (
                SELECT 1 FROM regexp_split_to_table(btrim(expr), '\s+') AS f
                WHERE f !~* '^([0-9*/,?LW#$-]|JAN|FEB|MAR|APR|MAY|JUN|JUL|AUG|SEP|OCT|NOV|DEC|SUN|MON|TUE|WED|THU|FRI|SAT)+$'))
$$;

-- The cron check of add_job's syntax pass: pgsched's full parser in PL/pgSQL
-- (sql/api/05_cron.sql, the same as pgsched/cron.py parse_cron), so every server refuses the
-- same expressions.
CREATE OR REPLACE FUNCTION pgsched._check_cron_syntax(expr text)
RETURNS void LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM pgsched._cron_parse(expr);
END
$$;

CREATE OR REPLACE FUNCTION pgsched._check_timezone(tz text)
RETURNS void LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF tz IS NOT NULL AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_timezone_names WHERE name = tz) THEN
        PERFORM pgsched._bad_arg('timezone', format('unknown time zone %L', tz),
                                 'an IANA time zone name such as ''Europe/Berlin'' or ''UTC''');
    END IF;
END
$$;

-- Recognise and check a schedule; returns the interval for interval schedules
-- and NULL for cron expressions.
CREATE OR REPLACE FUNCTION pgsched._parse_schedule(schedule text, fixed_schedule boolean)
RETURNS interval LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    iv interval;
    -- One token of an interval, as pgsched.schedule._INTERVAL_TOKEN (the units of its _UNITS).
    token constant text := '\s*(?:[0-9]+(?:\.[0-9]+)?\s*(?:microseconds?|us|usecs?|milliseconds?|ms|msecs?'
        || '|seconds?|s|secs?|minutes?|m|mins?|hours?|h|hrs?|days?|d|weeks?|w|months?|mons?|years?|y|yrs?)'
        || '|[0-9]+:[0-9]{2}(?::[0-9]{2}(?:\.[0-9]{1,6})?)?)\s*,?';
    rest text;
    expected constant text := 'an interval such as ''5 minutes'' or ''1 month'', a cron expression such as '
        || '''*/5 * * * *'' (5 fields; 6 or 7 with seconds first), ''@restart'', or ''@after'' (with depends_on)';
BEGIN
    IF schedule IS NULL THEN
        PERFORM pgsched._bad_arg('schedule', 'NULL', expected, '22004');
    END IF;
    -- pg_cron's @restart: once each time the server starts (pgsched._arm_restart_jobs); @after:
    -- after the job's upstreams (07_dependencies.sql). Like a cron expression, neither has an interval.
    IF btrim(schedule) IN ('@restart', '@after') THEN
        RETURN NULL;
    END IF;
    IF pgsched._is_cron(schedule) THEN
        PERFORM pgsched._check_cron_syntax(schedule);
        RETURN NULL;
    END IF;
    -- PostgreSQL's interval input skips some punctuation ('''; 1 hour' reads as 1 hour) and
    -- words it knows ('50 seconds c' reads as 50 seconds; pg_cron refuses it). Accept only the
    -- grammar the scheduler's Python reads (pgsched.schedule.parse_interval: numbers with a
    -- unit, hh:mm[:ss], an optional leading '@'), so both sides take the same texts and junk
    -- is refused, not stored.
    IF schedule !~* ('^\s*@?(?:' || token || ')+$') THEN
        -- Five to seven fields that begin like a cron expression's are one with a word cron does
        -- not know ('0 0 1 JANUARY *'): the cron parser's message names the field.
        IF array_length(regexp_split_to_array(btrim(schedule), '\s+'), 1) BETWEEN 5 AND 7
           AND (regexp_split_to_array(btrim(schedule), '\s+'))[1] ~ '^[0-9*/,?-]+$'
           AND (regexp_split_to_array(btrim(schedule), '\s+'))[2] ~ '^[0-9*/,?-]+$' THEN
            PERFORM pgsched._cron_parse(schedule);
        END IF;
        rest := btrim(regexp_replace(schedule, '^\s*@?(?:' || token || ')*', '', 'i'));
        PERFORM pgsched._bad_arg('schedule',
            CASE WHEN rest = btrim(schedule) OR btrim(left(btrim(schedule), length(btrim(schedule)) - length(rest)))
                                                   !~ '[0-9]'
                 THEN format('%L is neither an interval nor a cron expression', schedule)
                 ELSE format('%L is not an interval: %L after %L is not a number with a unit (such as '
                             || '''30 seconds'') nor hh:mm[:ss]', schedule, rest,
                             btrim(left(btrim(schedule), length(btrim(schedule)) - length(rest)))) END,
            expected);
    END IF;
    BEGIN
        iv := schedule::interval;
    EXCEPTION WHEN invalid_datetime_format OR datetime_field_overflow OR interval_field_overflow
                   OR invalid_parameter_value THEN
        PERFORM pgsched._bad_arg('schedule', format('%L is neither an interval nor a cron expression', schedule),
                                 expected);
    END;
    PERFORM pgsched._check_interval(iv, fixed_schedule, 'schedule');
    RETURN iv;
END
$$;

CREATE OR REPLACE FUNCTION pgsched._check_interval(iv interval, fixed_schedule boolean, argument text)
RETURNS void LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    parts record;
BEGIN
    IF iv IS NULL THEN
        PERFORM pgsched._bad_arg(argument, 'NULL', 'a positive interval such as ''5 minutes''', '22004');
    END IF;
    parts := pgsched._interval_parts(iv);
    IF parts.months < 0 OR parts.days < 0 OR parts.micros < 0
       OR (parts.months = 0 AND parts.days = 0 AND parts.micros = 0) THEN
        PERFORM pgsched._bad_arg(argument, format('%s is not positive', iv), 'a positive interval such as ''5 minutes''');
    END IF;
    IF fixed_schedule AND parts.months <> 0 AND (parts.days <> 0 OR parts.micros <> 0) THEN
        PERFORM pgsched._bad_arg(argument, format('%s mixes months with days or time on a fixed schedule', iv),
            'either whole months (''1 month'') or days/time (''7 days''); use fixed_schedule => false to mix them');
    END IF;
END
$$;

-- The shortest period a job may be given (pgsched.schedule.MIN_INTERVAL_MICROS): the scheduler's
-- own resolution, below which each plan would be late before it is made. A schedule given to a
-- job is held to it (_check_settings when the schedule is given anew, and the typed
-- schedule_interval of add_job and alter_job), not schedule previews (next_runs); a job stored
-- with a shorter period before the rule still runs, and may be paused or altered otherwise.
CREATE OR REPLACE FUNCTION pgsched._check_min_period(iv interval, argument text)
RETURNS void LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    parts record;
BEGIN
    IF iv IS NULL THEN
        RETURN;
    END IF;
    parts := pgsched._interval_parts(iv);
    IF parts.months = 0 AND parts.days = 0 AND parts.micros < 1000 THEN
        PERFORM pgsched._bad_arg(argument, format('%s is shorter than 1 millisecond', iv),
                                 'an interval of at least 1 millisecond such as ''5 minutes''');
    END IF;
END
$$;

-- The three stored components of an interval, the form the Python schedule code takes.
-- Each component is its own function, without a SET clause (names qualified instead), so that
-- PostgreSQL inlines it where it is used per row (the claim's view pgsched._job_launch).
CREATE OR REPLACE FUNCTION pgsched._iv_months(iv interval)
RETURNS integer LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT (extract(year FROM iv) * 12 + extract(month FROM iv))::integer
$$;

CREATE OR REPLACE FUNCTION pgsched._iv_days(iv interval)
RETURNS integer LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT extract(day FROM iv)::integer
$$;

CREATE OR REPLACE FUNCTION pgsched._iv_micros(iv interval)
RETURNS bigint LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT ((extract(hour FROM iv) * 3600 + extract(minute FROM iv) * 60) * 1000000
            + extract(microseconds FROM iv))::bigint
$$;

CREATE OR REPLACE FUNCTION pgsched._interval_parts(iv interval, OUT months integer, OUT days integer,
                                                   OUT micros bigint)
LANGUAGE sql IMMUTABLE STRICT
SET search_path = pg_catalog, pg_temp AS $$
    SELECT pgsched._iv_months(iv), pgsched._iv_days(iv), pgsched._iv_micros(iv)
$$;

-- Exact schedule check and first start in plain SQL (the cron engine of 05_cron.sql), for
-- servers without PL/Python; plpython/schedule.sql replaces both with the Python code. The
-- exact check requires a firing after now (refuses 31 February, a year in the past).
CREATE OR REPLACE FUNCTION pgsched._check_schedule_exact(schedule text, timezone text)
RETURNS void LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM pgsched._cron_next_n(schedule, timezone, pg_catalog.now(), 1);
END
$$;

CREATE OR REPLACE FUNCTION pgsched._first_start(schedule text, iv interval, fixed_schedule boolean,
                                                initial_start timestamptz, timezone text,
                                                at timestamptz DEFAULT now())
RETURNS timestamptz LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    parts record;
    step numeric;
    k numeric;
BEGIN
    IF iv IS NULL THEN
        -- cron: the first firing after `at`, or at/after a future origin (schedule.first_start)
        IF at IS NULL OR NOT pg_catalog.isfinite(at)
           OR (initial_start IS NOT NULL AND NOT pg_catalog.isfinite(initial_start)) THEN
            RETURN NULL;
        END IF;
        RETURN (pgsched._cron_next_n(schedule, timezone,
                                     CASE WHEN initial_start > at THEN initial_start - interval '1 microsecond'
                                          ELSE at END, 1))[1];
    ELSIF initial_start IS NULL THEN
        RETURN at;
    ELSIF initial_start >= at OR NOT fixed_schedule THEN
        RETURN greatest(initial_start, at);
    END IF;
    -- Fixed schedule, origin in the past: the first slot origin + k*iv at or after `at`.
    -- Plain SQL gets it exactly where a slot is elapsed time: no months, and days only
    -- in UTC (no DST); the rest is left to the shared Python code (PL/Python or scheduler).
    parts := pgsched._interval_parts(iv);
    IF parts.months <> 0 OR (parts.days <> 0 AND coalesce(timezone, 'UTC') NOT IN ('UTC', 'Etc/UTC')) THEN
        RETURN NULL;
    END IF;
    step := parts.days::numeric * 86400000000 + parts.micros;
    k := ceil(extract(epoch FROM at - initial_start) * 1000000 / step);
    RETURN initial_start + (k * step)::float8 * interval '1 microsecond';
END
$$;

CREATE OR REPLACE FUNCTION pgsched.plpython_available()
RETURNS boolean LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_language l ON l.oid = p.prolang
                   WHERE p.pronamespace = 'pgsched'::regnamespace AND l.lanname = 'plpython3u')
$$;

-- Resolve and check a job proc: a function or procedure taking (integer, jsonb)
-- that the calling role may execute.
CREATE OR REPLACE FUNCTION pgsched._check_proc(proc regproc, argument text,
                                               OUT proc_schema name, OUT proc_name name)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    p record;
BEGIN
    IF proc IS NULL THEN
        PERFORM pgsched._bad_arg(argument, 'NULL', 'a function or procedure taking (job_id integer, config jsonb)',
                                 '22004');
    END IF;
    SELECT n.nspname, pp.proname, pp.prokind, pp.proargtypes[0] AS arg0, pp.proargtypes[1] AS arg1, pp.pronargs
      INTO p
      FROM pg_catalog.pg_proc pp JOIN pg_catalog.pg_namespace n ON n.oid = pp.pronamespace
     WHERE pp.oid = proc;
    IF NOT FOUND THEN  -- a bare OID ('0', '-', or a dropped function's) passes the regproc cast
        RAISE EXCEPTION USING ERRCODE = '42883',
            MESSAGE = format('invalid %s: no function or procedure has OID %s', argument, proc::oid),
            HINT = format('%s must be declared as (job_id integer, config jsonb)', argument);
    END IF;
    IF p.prokind NOT IN ('f', 'p') OR p.pronargs <> 2
       OR p.arg0 <> 'integer'::regtype OR p.arg1 <> 'jsonb'::regtype THEN
        RAISE EXCEPTION USING ERRCODE = '42883',
            MESSAGE = format('invalid %s: %s is not a function or procedure taking (integer, jsonb)', argument,
                             proc::regprocedure),
            HINT = format('%s must be declared as (job_id integer, config jsonb)', argument);
    END IF;
    IF NOT pg_catalog.has_function_privilege(proc, 'EXECUTE') THEN
        RAISE EXCEPTION USING ERRCODE = '42501',
            MESSAGE = format('invalid %s: role %I may not execute %s', argument, current_user, proc::regprocedure),
            DETAIL = 'a job runs as its owner (the role that adds it), so its owner must be allowed to execute it',
            HINT = format('GRANT EXECUTE ON %s %s TO %I', CASE WHEN p.prokind = 'p' THEN 'PROCEDURE' ELSE 'FUNCTION' END,
                          proc::regprocedure, current_user);
    END IF;
    proc_schema := p.nspname;
    proc_name := p.proname;
END
$$;

CREATE OR REPLACE FUNCTION pgsched._check_config(check_config regproc, config jsonb)
RETURNS void LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    kind "char";
BEGIN
    IF check_config IS NULL THEN
        RETURN;
    END IF;
    SELECT prokind INTO kind FROM pg_catalog.pg_proc
     WHERE oid = check_config AND pronargs = 1 AND proargtypes[0] = 'jsonb'::regtype;
    IF kind IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '42883',
            MESSAGE = format('invalid check_config: %s does not take (config jsonb)', check_config::regprocedure),
            HINT = 'check_config must be a function or procedure declared as (config jsonb)';
    END IF;
    IF kind = 'p' THEN
        EXECUTE format('CALL %s($1)', check_config::oid::regproc) USING config;
    ELSE
        EXECUTE format('SELECT %s($1)', check_config::oid::regproc) USING config;
    END IF;
END
$$;

-- A job runs in a database session opened as its owner (docs/security.md), so
-- the owner, the role that adds the job, must be able to log in.
CREATE OR REPLACE FUNCTION pgsched._check_owner_can_login()
RETURNS void LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NOT coalesce((SELECT r.rolcanlogin FROM pg_catalog.pg_roles r WHERE r.rolname = current_user), false) THEN
        RAISE EXCEPTION USING ERRCODE = '42501',
            MESSAGE = format('role %I cannot own a job: it has no LOGIN', current_user),
            DETAIL = 'pgsched runs every job in a database session opened as the job''s owner, '
                     || 'so the owner must be allowed to log in',
            HINT = format('ALTER ROLE %I LOGIN (and let the scheduler''s host authenticate as it), '
                          || 'or add the job as a role that can log in', current_user);
    END IF;
END
$$;

-- A job's database (pg_cron's schedule_in_database), checked when it is given, for the role
-- the job runs as: it exists, accepts connections, and the role may connect to it (the
-- messages are pg_cron's). The scheduler connects there as the owner (pgsched/worker.py); a
-- database that goes away later disables the job with the connection's error as the reason.
CREATE OR REPLACE FUNCTION pgsched._check_database(database text, owner regrole)
RETURNS void LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    d record;
BEGIN
    IF database IS NULL OR database = '' THEN
        RETURN;
    END IF;
    SELECT x.datallowconn, x.datistemplate INTO d FROM pg_catalog.pg_database x WHERE x.datname = database;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = '3D000', MESSAGE = format('database "%s" does not exist', database),
            HINT = 'database must name a database of this server that the job''s owner may connect to, '
                   || 'or be NULL for the scheduler''s own';
    END IF;
    IF NOT d.datallowconn OR NOT pg_catalog.has_database_privilege(owner, database, 'CONNECT') THEN
        RAISE EXCEPTION USING ERRCODE = '42501',
            MESSAGE = format('User %s does not have CONNECT privilege on %s', pg_catalog.pg_get_userbyid(owner),
                             database),
            DETAIL = CASE WHEN NOT d.datallowconn THEN format('database %s does not accept connections', database)
                          ELSE 'the job''s runs open their session there as its owner' END,
            HINT = format('GRANT CONNECT ON DATABASE %I TO %I, or schedule the job in another database', database,
                          pg_catalog.pg_get_userbyid(owner));
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION pgsched._job_not_found(job_id integer)
RETURNS void LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = '42704',
        MESSAGE = format('job %s not found', job_id),
        HINT = 'job_id must be the id of an existing job (see pgsched.jobs)';
END
$$;

-- Called when a job was not found for writing: if the caller can still see it
-- (a member of the database owner sees every job, 0002_security.sql), say that
-- it is not theirs to change instead of pretending it does not exist. A job the
-- caller cannot see stays "not found", so its existence does not leak.
CREATE OR REPLACE FUNCTION pgsched._check_job_writable(job_id integer)
RETURNS void LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    job_owner regrole;
BEGIN
    SELECT j.owner INTO job_owner FROM pgsched.job j WHERE j.job_id = _check_job_writable.job_id;
    IF FOUND THEN
        RAISE EXCEPTION USING ERRCODE = '42501',
            MESSAGE = format('job %s belongs to role %s: role %I may see it but not change or run it',
                             _check_job_writable.job_id, job_owner, current_user),
            HINT = 'only its owner, or a role that may SET ROLE to the owner, may alter, delete or run a job';
    END IF;
END
$$;

-- Catalog change notification: every change to job, and to job_stat when it does
-- not come from a scheduler (which knows its own writes), wakes the schedulers.
CREATE OR REPLACE FUNCTION pgsched._notify_change()
RETURNS trigger LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF TG_TABLE_NAME = 'job_stat' AND current_setting('pgsched.internal', true) = 'on' THEN
        RETURN NULL;
    END IF;
    PERFORM pg_catalog.pg_notify('pgsched_catalog', TG_TABLE_NAME || ':' || lower(TG_OP));
    RETURN NULL;
END
$$;

SELECT pgsched._replace_if_changed('pgsched.job', 'job_notify', $ddl$
CREATE OR REPLACE TRIGGER job_notify AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON pgsched.job
    FOR EACH STATEMENT EXECUTE FUNCTION pgsched._notify_change()
$ddl$);
SELECT pgsched._replace_if_changed('pgsched.job_stat', 'job_stat_notify', $ddl$
CREATE OR REPLACE TRIGGER job_stat_notify AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON pgsched.job_stat
    FOR EACH STATEMENT EXECUTE FUNCTION pgsched._notify_change()
$ddl$);

-- A job's state machine (TimescaleDB's), the one definition of it:
--     scheduled -> starting -> scheduled                 a run started and ended
--                  starting -> terminating -> scheduled  a run was cancelled (timeout, shutdown)
--     scheduled | starting | terminating -> disabled     paused, max_retries, a job that cannot run
--     disabled -> scheduled                              resumed
-- A new job_stat row (from_state NULL) begins scheduled or disabled; writing the
-- state a row already has is no transition. pgsched/state.py's ALLOWED mirrors this
-- table for reading, and a test checks that the two agree.
-- A SQL-standard body without SET, so that it is inlined where it is called.
CREATE OR REPLACE FUNCTION pgsched._state_allowed(from_state text, to_state text)
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN coalesce(from_state = to_state
                OR (coalesce(from_state, 'new'), to_state) IN (
                    ('new', 'scheduled'), ('new', 'disabled'),
                    ('scheduled', 'starting'), ('scheduled', 'disabled'),
                    ('starting', 'scheduled'), ('starting', 'terminating'), ('starting', 'disabled'),
                    ('terminating', 'scheduled'), ('terminating', 'disabled'),
                    ('disabled', 'scheduled')),
                false);

-- Every write of job_stat.state, by this API or by hand, passes the table above; this
-- refuses the rest, naming the job, both states and where the job may go instead.
-- No SET clause, unlike the other functions here: it runs twice per run (start, end), and a
-- function's own search_path costs a save and restore of the setting on every call (15 % of
-- the per-run SQL's throughput). Every name is qualified instead; it runs as the invoker
-- (not SECURITY DEFINER), so the caller's search_path can reach nothing but the caller's own.
CREATE OR REPLACE FUNCTION pgsched._check_state_change()
RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    from_state text;
    allowed text;
BEGIN
    IF TG_OP = 'UPDATE' THEN
        from_state := OLD.state;
    ELSE
        -- pg_restore of an extension's catalog (pgsched/extension.py): the extension's triggers
        -- exist while its rows are loaded, so each restored job came with a fresh job_stat row
        -- (_job_row_change) before job_stat's own rows arrive. A dumped row replaces it, in the
        -- state it was dumped in. Nothing else inserts a job_stat row for a job that has one.
        DELETE FROM pgsched.job_stat s WHERE s.job_id = NEW.job_id;
        IF FOUND THEN
            RETURN NEW;
        END IF;
    END IF;
    -- NULL is the NOT NULL constraint's to refuse, with its own error.
    IF NEW.state IS NULL OR pgsched._state_allowed(from_state, NEW.state) THEN
        RETURN NEW;
    END IF;
    -- The states: job_stat's CHECK constraint (0001_catalog.sql).
    SELECT pg_catalog.string_agg(t.s, ', ' ORDER BY t.n) INTO allowed
      FROM pg_catalog.unnest(ARRAY['scheduled', 'starting', 'terminating', 'disabled']) WITH ORDINALITY AS t(s, n)
     WHERE t.s IS DISTINCT FROM from_state AND pgsched._state_allowed(from_state, t.s);
    RAISE EXCEPTION USING ERRCODE = '55000',
        MESSAGE = CASE WHEN from_state IS NULL
                       THEN pg_catalog.format('job %s cannot begin in state %s', NEW.job_id, NEW.state)
                       ELSE pg_catalog.format('job %s cannot go from state %s to %s', NEW.job_id, from_state,
                                              NEW.state) END,
        DETAIL = CASE WHEN from_state IS NULL THEN pg_catalog.format('a job begins %s', allowed)
                      ELSE pg_catalog.format('from %s a job goes to %s', from_state, allowed) END,
        HINT = 'a job''s state follows its runs and its scheduled flag: pause or resume it with '
               || 'alter_job(job_id, scheduled => ...)';
END
$$;

-- An update that leaves the state as it is (most writes of job_stat) does not call it, and
-- neither do the two moves of every run, scheduled -> starting -> scheduled: firing the
-- trigger for them cost 13 % of the per-run SQL's throughput. Both are allowed by
-- _state_allowed, the one definition of the table (tests/integration/test_job_state.py checks
-- that every pair this WHEN lets through is). Plain comparisons only: a trigger's WHEN is
-- prepared for every statement.
SELECT pgsched._replace_if_changed('pgsched.job_stat', 'job_stat_state_insert', $ddl$
CREATE OR REPLACE TRIGGER job_stat_state_insert BEFORE INSERT ON pgsched.job_stat
    FOR EACH ROW EXECUTE FUNCTION pgsched._check_state_change()
$ddl$);
SELECT pgsched._replace_if_changed('pgsched.job_stat', 'job_stat_state_update', $ddl$
CREATE OR REPLACE TRIGGER job_stat_state_update BEFORE UPDATE OF state ON pgsched.job_stat
    FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state
                       AND NOT (OLD.state = 'scheduled' AND NEW.state = 'starting')
                       AND NOT (OLD.state = 'starting' AND NEW.state = 'scheduled'))
    EXECUTE FUNCTION pgsched._check_state_change()
$ddl$);

-- A job row always has its job_stat row, whether it came through add_job or
-- direct DML; pausing and resuming are reflected in the state, and its priority, jitter and
-- concurrency key are copied beside next_start, where the claim reads them (migrations 0008, 0010
-- and 0011); its depends_on is kept in job_dependency, and pausing it disables its dependents
-- (0012, 07_dependencies.sql).
-- SECURITY DEFINER: other roles may not write job_stat (0002_security.sql), but
-- their job's own row follows what they did to the job, which row-level
-- security has already allowed. A trigger function cannot be called directly.
CREATE OR REPLACE FUNCTION pgsched._job_row_change()
RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO pgsched.job_stat (job_id, state, priority, jitter_us, concurrency_key)
        VALUES (NEW.job_id, CASE WHEN NEW.scheduled THEN 'scheduled' ELSE 'disabled' END, NEW.priority,
                (extract(epoch FROM NEW.jitter) * 1000000)::bigint, NEW.concurrency_key)
        ON CONFLICT (job_id) DO NOTHING;
        PERFORM pgsched._sync_dependencies(NEW.job_id, NEW.owner, NEW.depends_on, true);
        RETURN NULL;
    END IF;
    IF NEW.depends_on IS DISTINCT FROM OLD.depends_on THEN
        -- The job's row before its edges, in the order of an upstream's close (20_runs.sql), which
        -- would otherwise hold the row and wait for an edge this holds.
        PERFORM 1 FROM pgsched.job_stat st WHERE st.job_id = NEW.job_id FOR UPDATE;
        PERFORM pgsched._sync_dependencies(NEW.job_id, NEW.owner, NEW.depends_on, false, OLD.depends_on);
    END IF;
    IF (NEW.priority, NEW.jitter, NEW.concurrency_key) IS DISTINCT FROM (OLD.priority, OLD.jitter, OLD.concurrency_key)
    THEN
        UPDATE pgsched.job_stat SET priority = NEW.priority, jitter_us = (extract(epoch FROM NEW.jitter) * 1000000)::bigint,
                                    concurrency_key = NEW.concurrency_key
         WHERE job_stat.job_id = NEW.job_id;
    END IF;
    IF NEW.scheduled IS DISTINCT FROM OLD.scheduled THEN
        IF NEW.scheduled THEN
            -- Re-enabling forgives past failures (TimescaleDB does the same). A paused job
            -- being run by hand stays disabled until that run ends (its close then moves it
            -- to scheduled): scheduled now would let a scheduler start it a second time.
            UPDATE pgsched.job_stat
               SET state = CASE WHEN state = 'disabled'
                                     AND NOT EXISTS (SELECT 1 FROM pgsched.job_run_live r
                                                      WHERE r.run_id = job_stat.current_run_id
                                                        AND r.outcome = 'running')
                                THEN 'scheduled' ELSE state END,
                   consecutive_failures = 0, disabled_reason = NULL
             WHERE job_stat.job_id = NEW.job_id;
        ELSE
            UPDATE pgsched.job_stat SET state = 'disabled'
             WHERE job_stat.job_id = NEW.job_id AND state = 'scheduled';
            -- Its dependents cannot run without it (07_dependencies.sql).
            IF EXISTS (SELECT 1 FROM pgsched.job_dependency e WHERE e.upstream_id = NEW.job_id) THEN
                PERFORM pgsched._upstream_disabled(NEW.job_id, format(
                    'upstream job %s (%s) is disabled%s: resume it, then this job', NEW.job_id, NEW.job_name,
                    coalesce(' (' || (SELECT s.disabled_reason FROM pgsched.job_stat s WHERE s.job_id = NEW.job_id)
                             || ')', ' (paused)')));
            END IF;
        END IF;
    END IF;
    RETURN NULL;
END
$$;

SELECT pgsched._replace_if_changed('pgsched.job', 'job_row_change', $ddl$
CREATE OR REPLACE TRIGGER job_row_change
    AFTER INSERT OR UPDATE OF scheduled, priority, jitter, concurrency_key, depends_on ON pgsched.job
    FOR EACH ROW EXECUTE FUNCTION pgsched._job_row_change()
$ddl$);

CREATE OR REPLACE FUNCTION pgsched._touch_updated_at()
RETURNS trigger LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    NEW.updated_at := now();
    RETURN NEW;
END
$$;

SELECT pgsched._replace_if_changed('pgsched.job', 'job_touch', $ddl$
CREATE OR REPLACE TRIGGER job_touch BEFORE UPDATE ON pgsched.job
    FOR EACH ROW EXECUTE FUNCTION pgsched._touch_updated_at()
$ddl$);

-- schedule_interval is derived from schedule, so a row written by direct DML
-- (or edited by hand) is consistent. Text that is neither an interval nor a
-- cron expression is still stored (a superuser may write anything); the
-- scheduler then disables that one job with the reason shown.
CREATE OR REPLACE FUNCTION pgsched._derive_schedule_interval()
RETURNS trigger LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    NEW.schedule_interval := NULL;
    IF NEW.schedule IS NOT NULL AND NOT pgsched._is_cron(NEW.schedule) THEN
        BEGIN
            NEW.schedule_interval := NEW.schedule::interval;
        EXCEPTION WHEN OTHERS THEN
            NULL;
        END;
    END IF;
    RETURN NEW;
END
$$;

SELECT pgsched._replace_if_changed('pgsched.job', 'job_derive_interval', $ddl$
CREATE OR REPLACE TRIGGER job_derive_interval BEFORE INSERT OR UPDATE OF schedule, schedule_interval
    ON pgsched.job FOR EACH ROW EXECUTE FUNCTION pgsched._derive_schedule_interval()
$ddl$);

-- History levels and retention (45_history.sql, README "History and retention"): here, before
-- the files whose SQL functions use them.
-- The outcomes that went as planned or were passed over on purpose (success_retention, and
-- dropped under history 'failures'); the others went wrong or were stopped.
CREATE OR REPLACE FUNCTION pgsched._routine_outcome(outcome text)
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN outcome IN ('success', 'skipped', 'missed');

-- How long a run with this outcome keeps its row: the job's retention, else the database's.
-- Inlined (plain SQL, no SET clause): the purge evaluates it for each row it looks at.
CREATE OR REPLACE FUNCTION pgsched._retention(outcome text, job_success interval, job_failure interval,
                                              db_success interval, db_failure interval)
RETURNS interval LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN pgsched._routine_outcome(outcome) THEN coalesce(job_success, db_success)
            ELSE coalesce(job_failure, db_failure) END;

-- Whether a run that ended with this outcome keeps its row under the job's history level.
CREATE OR REPLACE FUNCTION pgsched._kept(history text, outcome text)
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN history = 'all' OR (history = 'failures' AND NOT pgsched._routine_outcome(outcome));

-- The rows that keep a run from happening twice, while they do (pgsched._forget_runs): a run
-- trigger_job started on a scheduler, an '@restart' job's plan run. They stay in job_run_live
-- whatever their job's level, and the purge removes them by its own rules.
CREATE OR REPLACE FUNCTION pgsched._kept_in_place(trigger text, instance_id bigint, schedule text, scope text)
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN (trigger = 'manual' AND instance_id IS NOT NULL) OR (schedule = '@restart' AND scope = '');

-- The end of retention a close gives a run's row, which decides the partition of job_run it moves
-- to (migration 0015); NULL leaves it in job_run_live, for the purge's batches: an end outside the
-- partitions made so far, [partitions_from, partitions_until) (pgsched._history_steps makes them
-- ahead, as far as the longer of the database's retentions). Stable: a timestamptz plus days
-- depends on the time zone.
CREATE OR REPLACE FUNCTION pgsched._keep_until(finished_at timestamptz, retention interval,
                                               partitions_from timestamptz, partitions_until timestamptz)
RETURNS timestamptz LANGUAGE sql STABLE PARALLEL SAFE
RETURN CASE WHEN finished_at + retention >= partitions_from AND finished_at + retention < partitions_until
            THEN finished_at + retention END;
