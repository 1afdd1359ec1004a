-- pgsched's cron engine in PL/pgSQL: the same dialect, checks and next-firing search as
-- pgsched/cron.py (the reference; its docstring states the dialect and the DST rule), so a
-- server without PL/Python (managed PostgreSQL) validates cron exactly (31 February, a year
-- in the past) and has next_runs. tests/integration/test_cron_sql.py checks it against the
-- Python code with hypothesis. Where PL/Python is installed, plpython/schedule.sql replaces
-- _check_schedule_exact, _first_start and next_runs with the Python code and this engine is
-- still what _check_cron_syntax uses (it is a superset of the syntax check).
--
-- A parsed expression travels as the OUT record of _cron_parse; nth weekdays are encoded
-- as weekday*10 + n. Wall times are `timestamp` (local, no zone), instants `timestamptz`.
SELECT pgsched._drop_functions(ARRAY['_cron_fail', '_cron_value', '_cron_expand', '_cron_parse', '_cron_day_list',
                                     '_cron_ge', '_tz_offset', '_tz_transition', '_resolve_local',
                                     '_cron_next_wall', '_cron_next_n', '_add_interval_local']);

CREATE OR REPLACE FUNCTION pgsched._cron_fail(norm text, fname text, what text)
RETURNS void LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM pgsched._bad_arg('schedule', format('cron expression %L: field %L %s', norm, fname, what),
        '5 fields (min hour dom month dow), 6 (sec first) or 7 (sec first, year last)');
END
$$;

-- cron._Field.value
CREATE OR REPLACE FUNCTION pgsched._cron_value(norm text, fname text, lo integer, hi integer, token text,
                                               range_end boolean DEFAULT false)
RETURNS integer LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v numeric;
    i integer;
BEGIN
    IF token ~ '^[0-9]+$' THEN
        v := token::numeric;
    ELSIF fname = 'month' AND token = ANY (ARRAY['JAN','FEB','MAR','APR','MAY','JUN','JUL','AUG','SEP','OCT',
                                                  'NOV','DEC']) THEN
        v := array_position(ARRAY['JAN','FEB','MAR','APR','MAY','JUN','JUL','AUG','SEP','OCT','NOV','DEC'], token);
    ELSIF fname = 'day-of-week' AND token = ANY (ARRAY['SUN','MON','TUE','WED','THU','FRI','SAT']) THEN
        i := array_position(ARRAY['SUN','MON','TUE','WED','THU','FRI','SAT'], token) - 1;
        -- 'FRI-SUN' means Friday through Sunday, not a reversed range
        v := CASE WHEN range_end AND i = 0 THEN 7 ELSE i END;
    ELSE
        PERFORM pgsched._cron_fail(norm, fname, format('has bad value ''%s''', token));
    END IF;
    IF v NOT BETWEEN lo AND hi THEN
        PERFORM pgsched._cron_fail(norm, fname, format('value %s out of range %s-%s', v, lo, hi));
    END IF;
    RETURN v::integer;
END
$$;

-- cron._Field.expand: the sorted set of values of a comma list
CREATE OR REPLACE FUNCTION pgsched._cron_expand(norm text, fname text, lo integer, hi integer, body text)
RETURNS integer[] LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    item text;
    m text[];
    base text;
    ab text[];
    first_ integer;
    last_ integer;
    step integer;
    out_ integer[] := '{}';
    forms constant text := '5 fields (min hour dom month dow), 6 (sec first) or 7 (sec first, year last)';
BEGIN
    FOREACH item IN ARRAY string_to_array(body, ',') LOOP
        m := regexp_match(item, '^(\*|\?|\w+(?:-\w+)?)(?:/(\w+))?$');
        IF m IS NULL THEN
            PERFORM pgsched._cron_fail(norm, fname, CASE WHEN item = '' THEN 'has an empty item'
                                                    ELSE format('has bad item ''%s''', item) END);
        END IF;
        base := m[1];
        IF base = '?' AND (body <> '?' OR fname NOT IN ('day-of-month', 'day-of-week')) THEN
            PERFORM pgsched._cron_fail(norm, fname, 'allows ''?'' only alone, in day-of-month or day-of-week');
        END IF;
        IF base IN ('*', '?') THEN
            first_ := lo; last_ := hi;
        ELSIF strpos(base, '-') > 0 THEN
            ab := string_to_array(base, '-');
            first_ := pgsched._cron_value(norm, fname, lo, hi, ab[1]);
            last_ := pgsched._cron_value(norm, fname, lo, hi, ab[2], true);
            IF first_ > last_ THEN
                PERFORM pgsched._cron_fail(norm, fname, format('has reversed range %s', base));
            END IF;
        ELSE
            first_ := pgsched._cron_value(norm, fname, lo, hi, base);
            last_ := CASE WHEN m[2] IS NOT NULL THEN hi ELSE first_ END;
        END IF;
        step := 1;
        IF m[2] IS NOT NULL THEN
            IF m[2] !~ '^[0-9]+$' OR m[2]::numeric = 0 THEN
                PERFORM pgsched._bad_arg('schedule', format('cron expression %L: step %s in the %s field is not a '
                                         || 'positive integer', norm, m[2], fname), forms);
            END IF;
            -- as pg_cron: a step above the field's largest value ('*/60' minutes) is refused
            IF length(m[2]) > 9 OR m[2]::numeric > hi THEN
                PERFORM pgsched._bad_arg('schedule', format('cron expression %L: step %s in the %s field is larger '
                                         || 'than its largest value %s', norm, m[2], fname, hi), forms);
            END IF;
            step := m[2]::integer;
        END IF;
        out_ := out_ || ARRAY(SELECT generate_series(first_, last_, step));
    END LOOP;
    RETURN ARRAY(SELECT DISTINCT v FROM unnest(out_) v ORDER BY v);
END
$$;

-- The day-of-month values of month m of year y that match (cron._day_list).
CREATE OR REPLACE FUNCTION pgsched._cron_day_list(days integer[], weekdays integer[], last_day boolean,
                                                  nth integer[], lasts integer[], dom_any boolean,
                                                  dow_any boolean, y integer, m integer)
RETURNS integer[] LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp AS $$
    WITH mo AS (
        SELECT extract(day FROM make_date(y, m, 1) + interval '1 month' - interval '1 day')::integer AS n,
               extract(dow FROM make_date(y, m, 1))::integer AS first_wd
    ), d AS (
        SELECT d, n, (first_wd + d - 1) % 7 AS wd FROM mo, generate_series(1, mo.n) d
    ), f AS (
        SELECT d, (d = ANY (days) OR (last_day AND d = n)) AS dom_ok,
               (wd = ANY (weekdays) OR wd * 10 + (d - 1) / 7 + 1 = ANY (nth) OR (wd = ANY (lasts) AND d + 7 > n))
                   AS dow_ok
        FROM d
    )
    SELECT coalesce(array_agg(d ORDER BY d), '{}') FROM f
    WHERE CASE WHEN dom_any OR dow_any THEN dom_ok AND dow_ok ELSE dom_ok OR dow_ok END
$$;

-- cron.parse_cron, including its never-fires check (_check_possible).
CREATE OR REPLACE FUNCTION pgsched._cron_parse(expr text, OUT norm text, OUT seconds integer[],
                                               OUT minutes integer[], OUT hours integer[], OUT days integer[],
                                               OUT months integer[], OUT weekdays integer[], OUT years integer[],
                                               OUT last_day boolean, OUT nth integer[], OUT lasts integer[],
                                               OUT dom_any boolean, OUT dow_any boolean)
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    forms constant text := '5 fields (min hour dom month dow), 6 (sec first) or 7 (sec first, year last)';
    txt text := upper(array_to_string(regexp_split_to_array(regexp_replace(expr, '^\s+|\s+$', '', 'g'), '\s+'), ' '));
    macro text;
    f text[];
    items text[];
    plain text[];
    item text;
    wd text;
    k text;
    mdays constant integer[] := ARRAY[31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
    y integer;
    mm integer;
    ok boolean := false;
BEGIN
    macro := lower(txt);
    IF macro IN ('@yearly', '@annually') THEN f := ARRAY['0', '0', '1', '1', '*'];
    ELSIF macro = '@monthly' THEN f := ARRAY['0', '0', '1', '*', '*'];
    ELSIF macro = '@weekly' THEN f := ARRAY['0', '0', '*', '*', '0'];
    ELSIF macro IN ('@daily', '@midnight') THEN f := ARRAY['0', '0', '*', '*', '*'];
    ELSIF macro = '@hourly' THEN f := ARRAY['0', '*', '*', '*', '*'];
    ELSE
        macro := NULL;
        f := CASE WHEN txt = '' THEN '{}' ELSE string_to_array(txt, ' ') END;
    END IF;
    IF coalesce(array_length(f, 1), 0) NOT IN (5, 6, 7) THEN
        PERFORM pgsched._bad_arg('schedule', format('cron expression %L has %s fields', expr,
                                                    coalesce(array_length(f, 1), 0)), forms);
    END IF;
    IF array_length(f, 1) = 5 THEN
        f := ARRAY['0'] || f;
    END IF;
    norm := coalesce(macro, txt);
    seconds := pgsched._cron_expand(norm, 'second', 0, 59, f[1]);
    minutes := pgsched._cron_expand(norm, 'minute', 0, 59, f[2]);
    hours := pgsched._cron_expand(norm, 'hour', 0, 23, f[3]);
    months := pgsched._cron_expand(norm, 'month', 1, 12, f[5]);
    IF array_length(f, 1) = 7 THEN
        years := pgsched._cron_expand(norm, 'year', 1970, 2099, f[7]);
    END IF;

    items := string_to_array(f[4], ',');
    last_day := 'L' = ANY (items) OR '$' = ANY (items);
    plain := ARRAY(SELECT i FROM unnest(items) i WHERE i NOT IN ('L', '$'));
    IF EXISTS (SELECT 1 FROM unnest(plain) i WHERE i LIKE '%W') THEN
        PERFORM pgsched._cron_fail(norm, 'day-of-month', 'uses ''W'' (nearest weekday), which is not supported');
    END IF;
    days := CASE WHEN cardinality(plain) > 0
                 THEN pgsched._cron_expand(norm, 'day-of-month', 1, 31, array_to_string(plain, ','))
                 ELSE '{}' END;

    nth := '{}'; lasts := '{}'; plain := '{}';
    FOREACH item IN ARRAY string_to_array(f[6], ',') LOOP
        IF strpos(item, '#') > 0 THEN
            wd := split_part(item, '#', 1);
            k := substr(item, strpos(item, '#') + 1);
            IF k NOT IN ('1', '2', '3', '4', '5') THEN
                PERFORM pgsched._cron_fail(norm, 'day-of-week', format('has bad ''%s'' (expected weekday#n with n 1-5)',
                                                                      item));
            END IF;
            nth := nth || (pgsched._cron_value(norm, 'day-of-week', 0, 7, wd) % 7 * 10 + k::integer);
        ELSIF length(item) > 1 AND item LIKE '%L' THEN
            lasts := lasts || pgsched._cron_value(norm, 'day-of-week', 0, 7, left(item, -1)) % 7;
        ELSE
            plain := plain || item;
        END IF;
    END LOOP;
    weekdays := CASE WHEN cardinality(plain) > 0
                     THEN ARRAY(SELECT DISTINCT v % 7 FROM unnest(pgsched._cron_expand(norm, 'day-of-week', 0, 7,
                                                              array_to_string(plain, ','))) v ORDER BY 1)
                     ELSE '{}' END;
    dom_any := f[4] LIKE '*%' OR f[4] = '?';
    dow_any := f[6] LIKE '*%' OR f[6] = '?';

    -- cron._check_possible: '0 0 31 2 *' can never fire, found without a clock
    IF years IS NOT NULL THEN
        <<search>>
        FOREACH y IN ARRAY years LOOP
            FOREACH mm IN ARRAY months LOOP
                IF cardinality(pgsched._cron_day_list(days, weekdays, last_day, nth, lasts, dom_any, dow_any,
                                                      y, mm)) > 0 THEN
                    ok := true;
                    EXIT search;
                END IF;
            END LOOP;
        END LOOP;
    ELSE
        ok := NOT (dom_any OR dow_any) OR last_day
              OR EXISTS (SELECT 1 FROM unnest(months) mo WHERE cardinality(days) > 0 AND days[1] <= mdays[mo]);
    END IF;
    IF NOT ok THEN
        PERFORM pgsched._bad_arg('schedule', format('cron expression %L can never fire (no such day)', norm), forms);
    END IF;
END
$$;

-- The first element >= v of a sorted array, or NULL.
CREATE OR REPLACE FUNCTION pgsched._cron_ge(arr integer[], v integer)
RETURNS integer LANGUAGE sql IMMUTABLE AS $$
    SELECT min(x) FROM pg_catalog.unnest(arr) x WHERE x >= v
$$;

-- The UTC offset of instant t in zone tz.
CREATE OR REPLACE FUNCTION pgsched._tz_offset(t timestamptz, tz text)
RETURNS interval LANGUAGE sql IMMUTABLE AS $$
    SELECT (t AT TIME ZONE tz) - (t AT TIME ZONE 'UTC')
$$;

-- cron._transition: the first instant in (before, after] whose offset is that of `after`
-- (tzdata transitions fall on whole seconds, so a bisection over seconds is exact).
CREATE OR REPLACE FUNCTION pgsched._tz_transition(tz text, before timestamptz, after timestamptz)
RETURNS timestamptz LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    target interval := pgsched._tz_offset(after, tz);
    lo bigint := floor(extract(epoch FROM before));
    hi bigint := ceil(extract(epoch FROM after));
    mid bigint;
BEGIN
    WHILE hi - lo > 1 LOOP
        mid := (lo + hi) / 2 - CASE WHEN (lo + hi) < 0 AND (lo + hi) % 2 <> 0 THEN 1 ELSE 0 END;
        IF pgsched._tz_offset(to_timestamp(mid), tz) = target THEN
            hi := mid;
        ELSE
            lo := mid;
        END IF;
    END LOOP;
    RETURN to_timestamp(hi);
END
$$;

-- cron.resolve_local: the instant of local wall time `wall` in tz under pgsched's DST rule
-- (an overlap's FIRST occurrence, a gap's end). PostgreSQL's own `wall AT TIME ZONE tz`
-- takes the later reading in both cases, so it is only the starting point.
CREATE OR REPLACE FUNCTION pgsched._resolve_local(wall timestamp, tz text)
RETURNS timestamptz LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    p timestamptz := wall AT TIME ZONE tz;
    e timestamptz;
BEGIN
    -- an earlier reading with the offset in force a few hours before
    e := (wall - pgsched._tz_offset(p - interval '6 hours', tz)) AT TIME ZONE 'UTC';
    IF e < p AND (e AT TIME ZONE tz) = wall THEN
        RETURN e;
    END IF;
    IF (p AT TIME ZONE tz) = wall THEN
        RETURN p;
    END IF;
    -- a gap: p is after it; the first instant after the gap lies between the reading with the
    -- post-gap offset (before the gap) and p
    RETURN pgsched._tz_transition(tz, (wall - pgsched._tz_offset(p, tz)) AT TIME ZONE 'UTC', p);
END
$$;

-- cron._next_wall: the first local wall time >= lb (whole seconds) that matches, or NULL
-- up to the end of year ylimit.
CREATE OR REPLACE FUNCTION pgsched._cron_next_wall(c record, lb timestamp, ylimit integer)
RETURNS timestamp LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    y integer := extract(year FROM lb);
    mo integer := extract(month FROM lb);
    d integer := extract(day FROM lb);
    h integer := extract(hour FROM lb);
    mi integer := extract(minute FROM lb);
    s integer := floor(extract(second FROM lb));
    v integer;
    dl integer[];
BEGIN
    WHILE y <= ylimit LOOP
        IF c.years IS NOT NULL THEN
            v := pgsched._cron_ge(c.years, y);
            IF v IS NULL THEN RETURN NULL; END IF;
            IF v <> y THEN y := v; mo := 1; d := 1; h := 0; mi := 0; s := 0; CONTINUE; END IF;
        END IF;
        v := pgsched._cron_ge(c.months, mo);
        IF v IS NULL THEN y := y + 1; mo := 1; d := 1; h := 0; mi := 0; s := 0; CONTINUE; END IF;
        IF v <> mo THEN mo := v; d := 1; h := 0; mi := 0; s := 0; END IF;
        dl := pgsched._cron_day_list(c.days, c.weekdays, c.last_day, c.nth, c.lasts, c.dom_any, c.dow_any, y, mo);
        v := pgsched._cron_ge(dl, d);
        IF v IS NULL THEN mo := mo + 1; d := 1; h := 0; mi := 0; s := 0; CONTINUE; END IF;
        IF v <> d THEN d := v; h := 0; mi := 0; s := 0; END IF;
        v := pgsched._cron_ge(c.hours, h);
        IF v IS NULL THEN d := d + 1; h := 0; mi := 0; s := 0; CONTINUE; END IF;
        IF v <> h THEN h := v; mi := 0; s := 0; END IF;
        v := pgsched._cron_ge(c.minutes, mi);
        IF v IS NULL THEN h := h + 1; mi := 0; s := 0; CONTINUE; END IF;
        IF v <> mi THEN mi := v; s := 0; END IF;
        v := pgsched._cron_ge(c.seconds, s);
        IF v IS NULL THEN mi := mi + 1; s := 0; CONTINUE; END IF;
        RETURN make_timestamp(y, mo, d, h, mi, v);
    END LOOP;
    RETURN NULL;
END
$$;

-- The next n firings strictly after `after` (cron.cron_next applied n times); fewer when the
-- year field runs out after at least one. Raises (22023, argument schedule) when there is none.
CREATE OR REPLACE FUNCTION pgsched._cron_next_n(expr text, tz text, after timestamptz, n integer)
RETURNS timestamptz[] LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    c record := pgsched._cron_parse(expr);
    zone_ text := coalesce(nullif(tz, ''), 'UTC');
    out_ timestamptz[] := '{}';
    t timestamptz := after;
    loc timestamp;
    f0 timestamptz;
    early interval;
    lb timestamp;
    ylimit integer;
    wall timestamp;
    found timestamptz;
BEGIN
    WHILE cardinality(out_) < n LOOP
        loc := t AT TIME ZONE zone_;
        f0 := pgsched._resolve_local(loc, zone_);
        IF f0 < t THEN
            -- t is in the repeated hour's second pass: every wall time up to the overlap's end
            -- has fired on the first pass, so resume at that end
            early := pgsched._tz_offset(f0, zone_);
            lb := (pgsched._tz_transition(zone_, t - (early - pgsched._tz_offset(t, zone_)), t) AT TIME ZONE 'UTC')
                  + early;
        ELSE
            lb := date_trunc('second', loc) + interval '1 second';
        END IF;
        ylimit := least(coalesce(c.years[cardinality(c.years)], extract(year FROM lb)::integer + 100), 9998);
        LOOP
            wall := pgsched._cron_next_wall(c, lb, ylimit);
            IF wall IS NULL THEN
                IF cardinality(out_) > 0 THEN
                    RETURN out_;
                END IF;
                PERFORM pgsched._bad_arg('schedule', format('cron expression %L never fires after %s (searched to '
                                         || 'the end of %s)', c.norm, t, ylimit), 'an expression with a future firing');
            END IF;
            found := pgsched._resolve_local(wall, zone_);
            EXIT WHEN found > t;
            -- wall was in a gap whose single firing is not after t: continue past the gap
            lb := greatest(wall + interval '1 second', found AT TIME ZONE zone_);
        END LOOP;
        out_ := out_ || found;
        t := found;
    END LOOP;
    RETURN out_;
END
$$;

-- schedule.add_interval: t + k*iv in zone tz, months and days on the local calendar under the
-- DST rule above, the time part as elapsed time.
CREATE OR REPLACE FUNCTION pgsched._add_interval_local(t timestamptz, iv interval, tz text, k integer)
RETURNS timestamptz LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT CASE WHEN p.months = 0 AND p.days = 0 THEN t
                ELSE pgsched._resolve_local((t AT TIME ZONE coalesce(nullif(tz, ''), 'UTC'))
                                            + make_interval(months => p.months * k, days => p.days * k),
                                            coalesce(nullif(tz, ''), 'UTC')) END
           + p.micros * k * interval '1 microsecond'
    FROM pgsched._interval_parts(iv) p
$$;

-- Preview of a schedule as add_job reads it, in plain SQL. plpython/schedule.sql replaces it
-- with the same function over pgsched.schedule where PL/Python is installed; both give the
-- same answers (tests/integration/test_cron_sql.py).
CREATE OR REPLACE FUNCTION pgsched.next_runs(schedule text, n integer DEFAULT 10, timezone text DEFAULT NULL,
                                             after timestamptz DEFAULT now())
RETURNS SETOF timestamptz LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    iv interval;
BEGIN
    IF n IS NULL OR n NOT BETWEEN 1 AND 10000 THEN
        PERFORM pgsched._bad_arg('n', coalesce(n::text, 'NULL'), 'between 1 and 10000',
                                 CASE WHEN n IS NULL THEN '22004' ELSE '22023' END);
    END IF;
    IF next_runs.after IS NULL OR NOT pg_catalog.isfinite(next_runs.after) THEN
        PERFORM pgsched._bad_arg('after', coalesce(next_runs.after::text, 'NULL'), 'a finite timestamptz',
                                 CASE WHEN next_runs.after IS NULL THEN '22004' ELSE '22023' END);
    END IF;
    -- the range the Python schedule code has (datetime spans the years 1 to 9999)
    IF next_runs.after < '0001-01-02 00:00:00+00' OR next_runs.after >= '9999-12-30 00:00:00+00' THEN
        PERFORM pgsched._bad_arg('after', format('%s is out of range', next_runs.after),
                                 'a time between the years 1 and 9999');
    END IF;
    iv := pgsched._parse_schedule(next_runs.schedule, false);
    IF next_runs.timezone <> '' THEN
        PERFORM pgsched._check_timezone(next_runs.timezone);
    END IF;
    IF iv IS NULL THEN
        IF btrim(next_runs.schedule) IN ('@restart', '@after') THEN
            PERFORM pgsched._bad_arg('schedule', format('%L has no start times to preview', btrim(next_runs.schedule)),
                                     'an interval or a cron expression');
        END IF;
        RETURN QUERY SELECT u.t FROM unnest(pgsched._cron_next_n(btrim(next_runs.schedule), next_runs.timezone,
                                                                  next_runs.after, n)) WITH ORDINALITY AS u(t, i)
                     ORDER BY u.i;
    ELSE
        BEGIN
            RETURN QUERY SELECT pgsched._add_interval_local(next_runs.after, iv, next_runs.timezone, k)
                         FROM generate_series(1, n) k ORDER BY k;
        EXCEPTION WHEN datetime_field_overflow THEN
            PERFORM pgsched._bad_arg('n', 'start times beyond the supported range',
                                     'small enough that every start time is before the year 9999', '22008');
        END;
    END IF;
END
$$;

COMMENT ON FUNCTION pgsched.next_runs(text, integer, text, timestamptz) IS
    'The next n start times of a schedule (cron or interval) after `after`; pgsched''s schedule semantics, '
    'in PL/Python where installed, in plain SQL otherwise';
