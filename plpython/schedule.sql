-- PL/Python schedule functions: the database computes schedules with the same Python
-- code as the scheduler (pgsched.schedule, stdlib only), so add_job validates a cron
-- expression exactly as the scheduler will and fills next_start at insert time.
--
-- Applied by `pgsched init` only when the server has PL/Python (plpython3u) AND its
-- Python can `import pgsched.schedule` (the postmaster's PYTHONPATH, or pgsched
-- installed for the server's Python); after sql/api/0*-4*, before 90_public.sql.
-- It replaces two plain-SQL fallbacks of sql/api/00_internal.sql (same signatures):
--   pgsched._check_schedule_exact(schedule, timezone)
--   pgsched._first_start(schedule, iv, fixed_schedule, initial_start, timezone, at)
-- and adds pgsched.next_runs(schedule, n, timezone, after), which therefore EXISTS
-- ONLY WITH PL/Python (90_public.sql gives it an unqualified public wrapper).
--
-- Time crosses the SQL/Python boundary as bigint microseconds since the Unix epoch
-- and intervals as their three stored parts (months, days, micros), never as text:
-- PL/Python would receive timestamptz as text in the session's DateStyle/TimeZone.
-- The plpgsql wrappers convert; the plpython3u functions (pgsched._py_*) see numbers.
--
-- If the server's Python cannot import pgsched.schedule at call time (e.g. the server
-- was restarted without that PYTHONPATH), add_job keeps working: the cron check falls
-- back to the plain-SQL syntax check and next_start stays NULL until a scheduler fills
-- it in, each with a WARNING. next_runs has no fallback and raises SQLSTATE 58000.
-- The imported module is cached per session in GD['pgsched_schedule'].

CREATE OR REPLACE FUNCTION pgsched._ts_micros(ts timestamptz)
RETURNS bigint LANGUAGE sql IMMUTABLE STRICT
SET search_path = pg_catalog, pg_temp AS $$
    -- extract(epoch) is numeric (exact) since PostgreSQL 14
    SELECT (extract(epoch FROM ts) * 1000000)::bigint
$$;

CREATE OR REPLACE FUNCTION pgsched._micros_ts(micros bigint)
RETURNS timestamptz LANGUAGE sql IMMUTABLE STRICT
SET search_path = pg_catalog, pg_temp AS $$
    -- whole seconds and the rest separately, so no float rounding can touch a microsecond
    SELECT pg_catalog.to_timestamp((micros / 1000000)::float8) + (micros % 1000000) * interval '1 microsecond'
$$;

-- The plpython3u functions never raise for bad input: a Python exception would reach the
-- client as "plpy.Error: ..." with a traceback. They return (errcode, message, hint)
-- instead, and the plpgsql wrapper raises it in the same shape as pgsched._bad_arg
-- ("invalid <argument>: <problem>", HINT "<argument> must be <expected>"), SQLSTATE 22023.

-- Exact cron check: parse with the scheduler's parser and require a firing after now
-- (rejects 31 February, a year in the past, ...).
CREATE OR REPLACE FUNCTION pgsched._py_check_cron(schedule text, timezone text, now_micros bigint,
                                                  OUT errcode text, OUT message text, OUT hint text)
LANGUAGE plpython3u STABLE
SET search_path = pg_catalog, pg_temp AS $$
s = GD.get('pgsched_schedule')
if s is None:
    try:
        import pgsched.schedule as s
    except Exception as e:
        plpy.warning('pgsched: PL/Python cannot import pgsched.schedule (%s: %s): cron checked for syntax only'
                     % (type(e).__name__, e),
                     hint="make pgsched importable by the server's Python (PYTHONPATH of the postmaster, "
                          "or install pgsched for that Python)")
        return None, None, None
    GD['pgsched_schedule'] = s
import re
from datetime import datetime, timedelta, timezone as _tz
try:
    now = datetime(1970, 1, 1, tzinfo=_tz.utc) + timedelta(microseconds=now_micros)
    s.validate_cron_at(s.parse_cron(schedule), s.zone(timezone), now)
except s.ScheduleError as e:
    m = re.fullmatch(r'(.*)[;:] expected (.*)', e.message, re.S)
    problem, expected = m.groups() if m else (e.message, 'valid')
    return '22023', 'invalid %s: %s' % (e.argument, problem), '%s must be %s' % (e.argument, expected)
return None, None, None
$$;

CREATE OR REPLACE FUNCTION pgsched._check_schedule_exact(schedule text, timezone text)
RETURNS void LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r record;
BEGIN
    r := pgsched._py_check_cron(schedule, timezone, pgsched._ts_micros(pg_catalog.now()));
    IF r.errcode IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = r.errcode, MESSAGE = r.message, HINT = r.hint;
    END IF;
END
$$;

-- pgsched.schedule.first_start on numbers: NULL months means a cron schedule.
CREATE OR REPLACE FUNCTION pgsched._py_first_start(schedule text, months integer, days integer, micros bigint,
                                                   fixed_schedule boolean, origin_micros bigint, timezone text,
                                                   at_micros bigint,
                                                   OUT start_micros bigint, OUT errcode text, OUT message text,
                                                   OUT hint text)
LANGUAGE plpython3u STABLE
SET search_path = pg_catalog, pg_temp AS $$
s = GD.get('pgsched_schedule')
if s is None:
    try:
        import pgsched.schedule as s
    except Exception as e:
        plpy.warning('pgsched: PL/Python cannot import pgsched.schedule (%s: %s): next_start is left for the '
                     'scheduler to fill in' % (type(e).__name__, e),
                     hint="make pgsched importable by the server's Python (PYTHONPATH of the postmaster, "
                          "or install pgsched for that Python)")
        return None, None, None, None
    GD['pgsched_schedule'] = s
import re
from datetime import datetime, timedelta, timezone as _tz
epoch = datetime(1970, 1, 1, tzinfo=_tz.utc)
us = timedelta(microseconds=1)
try:
    origin = None if origin_micros is None else epoch + us * origin_micros
    if months is None:
        sched = s.Schedule(None, s.parse_cron(schedule), True, origin, s.zone(timezone))
    else:
        sched = s.Schedule(s.Interval(months, days, micros), None, fixed_schedule, origin, s.zone(timezone))
    return (s.first_start(sched, epoch + us * at_micros) - epoch) // us, None, None, None
except s.ScheduleError as e:
    m = re.fullmatch(r'(.*)[;:] expected (.*)', e.message, re.S)
    problem, expected = m.groups() if m else (e.message, 'valid')
    return None, '22023', 'invalid %s: %s' % (e.argument, problem), '%s must be %s' % (e.argument, expected)
except (OverflowError, ValueError) as e:
    return (None, '22008', 'invalid initial_start: first start out of range (%s)' % e,
            'initial_start must be a time before the year 9999')
$$;

CREATE OR REPLACE FUNCTION pgsched._first_start(schedule text, iv interval, fixed_schedule boolean,
                                                initial_start timestamptz, timezone text,
                                                at timestamptz DEFAULT now())
RETURNS timestamptz LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    months integer;
    days integer;
    micros bigint;
    r record;
BEGIN
    IF at IS NULL OR NOT pg_catalog.isfinite(at)
       OR (initial_start IS NOT NULL AND NOT pg_catalog.isfinite(initial_start)) THEN
        RETURN NULL;  -- nothing sensible to compute; the scheduler decides
    END IF;
    IF iv IS NOT NULL THEN
        SELECT p.months, p.days, p.micros INTO months, days, micros FROM pgsched._interval_parts(iv) p;
    END IF;
    r := pgsched._py_first_start(schedule, months, days, micros, coalesce(fixed_schedule, true),
                                 pgsched._ts_micros(initial_start), timezone, pgsched._ts_micros(at));
    IF r.errcode IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = r.errcode, MESSAGE = r.message, HINT = r.hint;
    END IF;
    RETURN pgsched._micros_ts(r.start_micros);
END
$$;

-- The next n start times: cron firings strictly after `after`, or after + k*interval
-- (k = 1..n) by pgsched.schedule.add_interval; fewer than n if a cron's year field runs out.
CREATE OR REPLACE FUNCTION pgsched._py_next_runs(schedule text, months integer, days integer, micros bigint,
                                                 timezone text, n integer, after_micros bigint,
                                                 OUT runs bigint[], OUT errcode text, OUT message text,
                                                 OUT hint text)
LANGUAGE plpython3u STABLE
SET search_path = pg_catalog, pg_temp AS $$
s = GD.get('pgsched_schedule')
if s is None:
    try:
        import pgsched.schedule as s
    except Exception as e:
        return (None, '58000',
                "pgsched: the server's Python cannot import pgsched.schedule (%s: %s)" % (type(e).__name__, e),
                'next_runs needs pgsched importable by the PostgreSQL server: put it on the PYTHONPATH of the '
                "postmaster, or install pgsched for the server's Python, then reconnect")
    GD['pgsched_schedule'] = s
import re
from datetime import datetime, timedelta, timezone as _tz
epoch = datetime(1970, 1, 1, tzinfo=_tz.utc)
us = timedelta(microseconds=1)
try:
    after = epoch + us * after_micros
    tz = s.zone(timezone)
    if months is None:
        cron = s.parse_cron(schedule)
        out = []
        t = after
        while len(out) < n:
            try:
                t = s.cron_next(cron, tz, t)
            except s.ScheduleError:
                if not out:
                    raise
                break
            out.append(t)
    else:
        iv = s.Interval(months, days, micros)
        out = [s.add_interval(after, iv, tz, k) for k in range(1, n + 1)]
    return [(t - epoch) // us for t in out], None, None, None
except s.ScheduleError as e:
    m = re.fullmatch(r'(.*)[;:] expected (.*)', e.message, re.S)
    problem, expected = m.groups() if m else (e.message, 'valid')
    return None, '22023', 'invalid %s: %s' % (e.argument, problem), '%s must be %s' % (e.argument, expected)
except (OverflowError, ValueError) as e:
    return (None, '22008', 'invalid n: start times beyond the supported range (%s)' % e,
            'n must be small enough that every start time is before the year 9999')
$$;

-- Preview of a schedule as add_job reads it. Only installed with PL/Python: on a server
-- without it (managed PostgreSQL) pgsched.next_runs does not exist.
CREATE OR REPLACE FUNCTION pgsched.next_runs(schedule text, n integer DEFAULT 10, timezone text DEFAULT NULL,
                                             after timestamptz DEFAULT now())
RETURNS SETOF timestamptz LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    iv interval;
    months integer;
    days integer;
    micros bigint;
    r record;
BEGIN
    IF n IS NULL OR n NOT BETWEEN 1 AND 10000 THEN
        PERFORM pgsched._bad_arg('n', coalesce(n::text, 'NULL'), 'between 1 and 10000',
                                 CASE WHEN n IS NULL THEN '22004' ELSE '22023' END);
    END IF;
    IF next_runs.after IS NULL OR NOT pg_catalog.isfinite(next_runs.after) THEN
        PERFORM pgsched._bad_arg('after', coalesce(next_runs.after::text, 'NULL'), 'a finite timestamptz',
                                 CASE WHEN next_runs.after IS NULL THEN '22004' ELSE '22023' END);
    END IF;
    -- The schedule code's datetimes span the years 1 to 9999.
    IF next_runs.after < '0001-01-02 00:00:00+00' OR next_runs.after >= '9999-12-30 00:00:00+00' THEN
        PERFORM pgsched._bad_arg('after', format('%s is out of range', next_runs.after),
                                 'a time between the years 1 and 9999');
    END IF;
    -- The same recognition and checks as add_job; any positive interval can be previewed.
    iv := pgsched._parse_schedule(next_runs.schedule, false);
    IF iv IS NULL AND pg_catalog.btrim(next_runs.schedule) IN ('@restart', '@after') THEN
        PERFORM pgsched._bad_arg('schedule', format('%L has no start times to preview', btrim(next_runs.schedule)),
                                 'an interval or a cron expression');
    END IF;
    -- The time zone is checked by pgsched.schedule.zone (same error shape as add_job's):
    -- pgsched._check_timezone scans pg_timezone_names, ~25 ms a call. Only '' differs
    -- (zone() reads it as UTC, add_job refuses it), so that one goes to the SQL check.
    IF next_runs.timezone = '' THEN
        PERFORM pgsched._check_timezone(next_runs.timezone);
    END IF;
    IF iv IS NOT NULL THEN
        SELECT p.months, p.days, p.micros INTO months, days, micros FROM pgsched._interval_parts(iv) p;
    END IF;
    r := pgsched._py_next_runs(pg_catalog.btrim(next_runs.schedule), months, days, micros, next_runs.timezone, n,
                               pgsched._ts_micros(next_runs.after));
    IF r.errcode IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = r.errcode, MESSAGE = r.message, HINT = r.hint;
    END IF;
    RETURN QUERY SELECT pgsched._micros_ts(u.t) FROM unnest(r.runs) WITH ORDINALITY AS u(t, i) ORDER BY u.i;
END
$$;

COMMENT ON FUNCTION pgsched.next_runs(text, integer, text, timestamptz) IS
    'The next n start times of a schedule (cron or interval) after `after`, computed by pgsched.schedule; '
    'installed only when the server has PL/Python and can import pgsched';
