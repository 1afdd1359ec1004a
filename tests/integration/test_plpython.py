"""The PL/Python schedule functions (plpython/schedule.sql) against a real PostgreSQL.

They run pgsched.schedule inside the server, so these tests check the boundary: that add_job
validates and fills next_start exactly as the Python code does, that next_runs previews it,
that time survives the SQL/Python crossing to the microsecond, and (the differential test)
that the SQL path agrees with the Python path on generated schedules and instants.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, cast
from zoneinfo import ZoneInfo

import psycopg
import pytest

from pgsched import schedule as S
from tests.conftest import PgServer
from tests.integration.helpers import Conn, add_job, notices, scalar, snapshot

pytestmark = pytest.mark.plpython

ZONES = ["UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata"]
BERLIN = ZoneInfo("Europe/Berlin")


@pytest.fixture(autouse=True)
def _needs_plpython(pg_server: PgServer) -> None:
    if not pg_server.plpython:
        pytest.skip("the test cluster has no usable PL/Python (postgresql-plpython3 package missing, "
                    "or the server's Python cannot import pgsched.schedule); see pgsched init's output")


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).astimezone(UTC)


def next_runs(conn: Conn, query: str, params: tuple[Any, ...] | dict[str, Any]) -> list[datetime]:
    # binary results: psycopg cannot parse every DateStyle a test may set
    with conn.cursor(binary=True) as cur:
        got = [r[0] for r in cur.execute(f"SELECT * FROM pgsched.next_runs({query})", params)]
    assert all(isinstance(t, datetime) for t in got)
    return cast(list[datetime], got)


def next_start(conn: Conn, job_id: int) -> Any:
    return scalar(conn, "SELECT next_start FROM pgsched.job_stats WHERE job_id = %s", (job_id,))


# --- add_job: exact check and next_start at insert time ---------------------------------------------

@pytest.mark.parametrize("expr", ["*/5 * * * *", "30 */5 * * * *", "0 0 12 L * * 2099", "@daily", "0 9 * * MON-FRI"])
def test_add_job_cron_fills_next_start(api: Conn, expr: str) -> None:
    with api.transaction():
        job_id = add_job(api, "'ok_fn', %s", (expr,))
        now = scalar(api, "SELECT now()")
        got = next_start(api, job_id)
    assert got is not None
    assert got == S.cron_next(S.parse_cron(expr), S.zone(None), now)
    assert got > now


def test_add_job_fixed_interval_past_origin_takes_the_aligned_slot(api: Conn) -> None:
    with api.transaction():
        now = scalar(api, "SELECT now()")
        origin = now - timedelta(minutes=150, microseconds=7)
        job_id = add_job(api, "'ok_fn', '1 hour', initial_start => %s", (origin,))
        assert next_start(api, job_id) == origin + timedelta(hours=3)
        drifting = add_job(api, "'ok_fn', '1 hour', initial_start => %s, fixed_schedule => false", (origin,))
        assert next_start(api, drifting) == now


def test_add_job_month_interval_in_a_time_zone(api: Conn) -> None:
    # The plain-SQL fallback leaves this one NULL; the shared Python code computes it.
    origin = datetime(2020, 1, 31, 9, 0, tzinfo=BERLIN)
    with api.transaction():
        job_id = add_job(api, "'ok_fn', '1 month', initial_start => %s, timezone => 'Europe/Berlin'", (origin,))
        now = scalar(api, "SELECT now()")
        got = next_start(api, job_id)
    want = S.first_start(S.Schedule(S.Interval(1, 0, 0), None, True, origin, BERLIN), now)
    assert got == want
    assert got.astimezone(BERLIN).time().isoformat() == "09:00:00"


@pytest.mark.parametrize(("origin", "want"), [("2030-01-10 00:00:00+00", "2030-01-10 08:00:00+00"),
                                              ("2030-07-10 00:00:00+00", "2030-07-10 07:00:00+00")])
def test_add_job_cron_honours_the_time_zone(api: Conn, origin: str, want: str) -> None:
    job_id = add_job(api, "'ok_fn', '0 9 * * *', initial_start => %s, timezone => 'Europe/Berlin'", (origin,))
    assert next_start(api, job_id) == utc(want)


def test_schedule_and_alter_job_fill_next_start(api: Conn) -> None:
    with api.transaction():
        job_id = scalar(api, "SELECT pgsched.schedule('nightly', '0 3 * * *', 'SELECT 1')")
        now = scalar(api, "SELECT now()")
        assert next_start(api, job_id) == S.cron_next(S.parse_cron("0 3 * * *"), S.zone(None), now)
        api.execute("SELECT pgsched.alter_job(%s, schedule => '0 4 * * *', timezone => 'Asia/Kolkata')", (job_id,))
        got = next_start(api, job_id)
    assert got == S.cron_next(S.parse_cron("0 4 * * *"), ZoneInfo("Asia/Kolkata"), now)


@pytest.mark.parametrize("expr", ["0 0 31 2 *", "0 0 0 1 1 * 2020", "0 0 0 30 2 * 2026-2030", "0 0 12 31 4,6,9 *"])
def test_impossible_or_past_cron_is_rejected(api: Conn, expr: str) -> None:
    before = snapshot(api)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=r"^invalid schedule: ") as info:
        api.execute("SELECT pgsched.add_job('ok_fn', %s)", (expr,))
    assert (info.value.diag.message_hint or "").startswith("schedule must be ")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="schedule"):
        api.execute("SELECT pgsched.schedule('j', %s, 'SELECT 1')", (expr,))
    assert snapshot(api) == before
    job_id = add_job(api, "'ok_fn', '1 hour'")
    before = snapshot(api)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="schedule"):
        api.execute("SELECT pgsched.alter_job(%s, schedule => %s)", (job_id, expr))
    assert snapshot(api) == before


def test_past_year_message_says_why(api: Conn) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="never fires after"):
        api.execute("SELECT pgsched.add_job('ok_fn', '0 0 0 1 1 * 2020')")


# --- next_runs ------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("expr", "after", "want"),
    [
        ("*/15 * * * *", "2026-01-01 00:07:00+00", ["00:15:00", "00:30:00", "00:45:00"]),
        ("30 * * * * *", "2026-01-01 00:00:00+00", ["00:00:30", "00:01:30", "00:02:30"]),
        ("30 * * * * *", "2026-01-01 00:00:30+00", ["00:01:30", "00:02:30", "00:03:30"]),
        ("0 15 10 * * * 2026", "2026-01-01 00:00:00+00", ["10:15:00", "2026-01-02 10:15:00", "2026-01-03 10:15:00"]),
    ],
)
def test_next_runs_cron_fields(api: Conn, expr: str, after: str, want: list[str]) -> None:
    got = next_runs(api, "%s, 3, after => %s", (expr, after))
    full = [w if " " in w else f"2026-01-01 {w}" for w in want]
    assert got == [utc(f"{w}+00:00") for w in full]


def test_next_runs_stops_when_the_year_field_runs_out(api: Conn) -> None:
    got = next_runs(api, "'0 0 12 1 1 * 2027-2028', 5, after => '2026-06-01 00:00:00+00'", ())
    assert got == [utc("2027-01-01 12:00:00+00:00"), utc("2028-01-01 12:00:00+00:00")]


def test_next_runs_interval_keeps_wall_clock_across_dst(api: Conn) -> None:
    after = "2026-03-27 09:00:00+01"
    day = next_runs(api, "'1 day', 4, 'Europe/Berlin', %s", (after,))
    assert [t.astimezone(BERLIN).strftime("%m-%d %H:%M %z") for t in day] == [
        "03-28 09:00 +0100", "03-29 09:00 +0200", "03-30 09:00 +0200", "03-31 09:00 +0200"]
    hours = next_runs(api, "'24 hours', 2, 'Europe/Berlin', %s", (after,))
    assert [t.astimezone(BERLIN).strftime("%H:%M") for t in hours] == ["09:00", "10:00"]


def test_next_runs_cron_in_a_time_zone_across_dst(api: Conn) -> None:
    # 02:30 does not exist in Berlin on 2026-03-29: that day's run is at 03:00 CEST (01:00 UTC).
    got = next_runs(api, "'30 2 * * *', 3, 'Europe/Berlin', '2026-03-28 00:00:00+00'", ())
    assert got == [utc("2026-03-28 01:30:00+00:00"), utc("2026-03-29 01:00:00+00:00"),
                   utc("2026-03-30 00:30:00+00:00")]


def test_next_runs_keeps_microseconds_and_ignores_session_settings(api: Conn) -> None:
    api.execute("SET DateStyle = 'SQL, DMY'")
    api.execute("SET TimeZone = 'Asia/Kolkata'")
    after = datetime(2026, 5, 1, 12, 0, 0, 999_999, tzinfo=UTC)
    got = next_runs(api, "'0.000001 seconds', 2, after => %s", (after,))
    assert got == [datetime(2026, 5, 1, 12, 0, 1, tzinfo=UTC), datetime(2026, 5, 1, 12, 0, 1, 1, tzinfo=UTC)]
    # before 1970: negative microseconds since the epoch
    old = datetime(1960, 2, 29, 23, 59, 59, 500_001, tzinfo=UTC)
    assert next_runs(api, "'1.5 seconds', 1, after => %s", (old,)) == [
        datetime(1960, 3, 1, 0, 0, 1, 1, tzinfo=UTC)]
    origin = datetime(2031, 1, 1, 0, 0, 0, 123_457, tzinfo=UTC)
    with api.cursor(binary=True) as cur:
        cur.execute("SELECT pgsched._first_start('1 hour', '1 hour', true, %s, NULL)", (origin,))
        assert cur.fetchone() == (origin,)


def test_next_runs_defaults(api: Conn) -> None:
    with api.transaction():
        got = next_runs(api, "'1 hour'", ())
        now = scalar(api, "SELECT now()")
    assert got == [now + timedelta(hours=k) for k in range(1, 11)]


def test_next_runs_n_bounds(api: Conn) -> None:
    assert len(next_runs(api, "'1 second', 10000, after => '2026-01-01 00:00:00+00'", ())) == 10000
    assert len(next_runs(api, "'* * * * * *', 1", ())) == 1
    for n in (0, -1, 10001):
        with pytest.raises(psycopg.errors.InvalidParameterValue, match=r"^invalid n: "):
            next_runs(api, "'1 hour', %s", (n,))
    with pytest.raises(psycopg.errors.NullValueNotAllowed, match=r"^invalid n: "):
        next_runs(api, "'1 hour', NULL", ())


@pytest.mark.parametrize(
    ("args", "error", "argument"),
    [
        ("'bogus'", psycopg.errors.InvalidParameterValue, "schedule"),
        ("'61 * * * *'", psycopg.errors.InvalidParameterValue, "schedule"),
        ("'0 0 31 2 *'", psycopg.errors.InvalidParameterValue, "schedule"),
        ("'0 0 0 1 1 * 2020'", psycopg.errors.InvalidParameterValue, "schedule"),
        ("'* * * * * * * *'", psycopg.errors.InvalidParameterValue, "schedule"),
        ("'0 seconds'", psycopg.errors.InvalidParameterValue, "schedule"),
        ("'-1 day'", psycopg.errors.InvalidParameterValue, "schedule"),
        ("NULL", psycopg.errors.NullValueNotAllowed, "schedule"),
        ("'@hourly', 3, 'Mars/Olympus'", psycopg.errors.InvalidParameterValue, "timezone"),
        ("'1 day', 3, ''", psycopg.errors.InvalidParameterValue, "timezone"),
        ("'1 day', 3, '../etc/passwd'", psycopg.errors.InvalidParameterValue, "timezone"),
        ("'1 hour', 3, NULL, 'infinity'", psycopg.errors.InvalidParameterValue, "after"),
        ("'1 hour', 3, NULL, NULL", psycopg.errors.NullValueNotAllowed, "after"),
    ],
)
def test_next_runs_bad_input(api: Conn, args: str, error: type[psycopg.Error], argument: str) -> None:
    with pytest.raises(error, match=rf"^invalid {argument}: "):
        next_runs(api, args, ())


def test_next_runs_is_public_in_a_new_session(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as c:
        got = [r[0] for r in c.execute(
            "SELECT * FROM next_runs('0 9 * * *', 2, 'Europe/Berlin', '2026-03-28 12:00:00+00')")]
        assert got == [utc("2026-03-29 07:00:00+00:00"), utc("2026-03-30 07:00:00+00:00")]
        assert scalar(c, "SELECT count(*) FROM next_runs('@hourly')") == 10
        assert scalar(c, "SELECT pgsched.plpython_available()") is True


# --- differential: SQL/PL/Python path == Python path ----------------------------------------------

SECONDS = ["0", "30", "*/15", "0,30", "5-10", "*", "59"]
MINUTES = ["0", "30", "*/5", "15,45", "0-10/3", "*", "59"]
HOURS = ["*", "0", "2", "9", "1-3", "*/6", "0,12", "2,3", "23"]
DOMS = ["*", "*", "1", "15", "L", "1-7", "29", "31", "?", "10-20/5"]
MONTHS = ["*", "*", "1", "MAR", "3,10", "*/2", "nov", "2", "4-6"]
DOWS = ["*", "*", "MON-FRI", "0", "7", "SUN", "5#2", "6L", "1,3,5", "?"]
YEARS = ["2026", "2026-2028", "*", "2027", "2026-2099/2"]
MACROS = ["@hourly", "@daily", "@weekly", "@monthly", "@yearly"]


def _transitions(tz: ZoneInfo) -> list[datetime]:
    """UTC instants (to the hour) where the zone's offset changes in 2026-2027."""
    out = []
    t = datetime(2026, 1, 1, tzinfo=UTC)
    prev = t.astimezone(tz).utcoffset()
    while t.year < 2028:
        t += timedelta(minutes=30)
        off = t.astimezone(tz).utcoffset()
        if off != prev:
            out.append(t)
        prev = off
    return out


TRANSITIONS = {name: _transitions(ZoneInfo(name)) for name in ZONES}


def _instant(rng: random.Random, tz: str | None) -> datetime:
    near = TRANSITIONS.get(tz or "UTC", [])
    if near and rng.random() < 0.5:
        base = rng.choice(near)
        return base + timedelta(microseconds=rng.randint(-3 * 3600 * 10**6, 3 * 3600 * 10**6))
    start = datetime(2026, 1, 1, tzinfo=UTC)
    t = start + timedelta(seconds=rng.randrange(2 * 365 * 86400))
    # whole hours, whole seconds or arbitrary microseconds
    return rng.choice([t.replace(minute=0, second=0), t, t + timedelta(microseconds=rng.randrange(10**6))])


def _cron(rng: random.Random) -> str:
    if rng.random() < 0.1:
        return rng.choice(MACROS)
    five = [rng.choice(MINUTES), rng.choice(HOURS), rng.choice(DOMS), rng.choice(MONTHS), rng.choice(DOWS)]
    width = rng.choice([5, 6, 7])
    if width == 5:
        return " ".join(five)
    six = [rng.choice(SECONDS), *five]
    return " ".join(six if width == 6 else [*six, rng.choice(YEARS)])


def _interval(rng: random.Random, fixed: bool) -> S.Interval:
    kind = rng.choice(["micros", "days", "months", "mixed"] if not fixed else ["micros", "days", "months"])
    micros = rng.choice([1, 10**6, 90 * 10**6, 3600 * 10**6, 25 * 3600 * 10**6 + 7, rng.randrange(1, 10**11)])
    days, months = rng.randint(1, 40), rng.randint(1, 14)
    if kind == "micros":
        return S.Interval(0, 0, micros)
    if kind == "days":
        return S.Interval(0, days, rng.choice([0, 0, micros]))
    if kind == "months":
        return S.Interval(months, 0, 0)
    return S.Interval(months, rng.choice([0, days]), rng.choice([0, micros]))


Outcome = tuple[str, Any]


def _python(fn: Any) -> Outcome:
    try:
        return "ok", fn()
    except S.ScheduleError:
        return "error", "22023"


TRY_SQL = """
CREATE FUNCTION pg_temp.try_next_runs(schedule text, n integer, tz text, after timestamptz,
                                      OUT ts timestamptz[], OUT err text) LANGUAGE plpgsql AS $$
BEGIN
    ts := ARRAY(SELECT pgsched.next_runs(schedule, n, tz, after));
EXCEPTION WHEN OTHERS THEN
    err := SQLSTATE || ' ' || SQLERRM;
END $$;
CREATE FUNCTION pg_temp.try_first_start(schedule text, iv interval, fixed boolean, origin timestamptz, tz text,
                                        at timestamptz, OUT ts timestamptz, OUT err text) LANGUAGE plpgsql AS $$
BEGIN
    ts := pgsched._first_start(schedule, iv, fixed, origin, tz, at);
EXCEPTION WHEN OTHERS THEN
    err := SQLSTATE || ' ' || SQLERRM;
END $$;
"""


def _sql_outcomes(conn: Conn, query: str, columns: list[list[Any]], types: list[str]) -> list[Outcome]:
    arrays = ", ".join(f"%s::{t}[]" for t in types)
    names = ", ".join(f"c{i}" for i in range(len(types)))
    got = conn.execute(
        f"SELECT r.ts, r.err FROM unnest({arrays}) WITH ORDINALITY AS a({names}, i) "
        f"CROSS JOIN LATERAL {query} AS r ORDER BY a.i",
        columns,
    ).fetchall()
    return [("error", str(err)[:5]) if err is not None else ("ok", ts) for ts, err in got]


@pytest.fixture
def diff_conn(conn: Conn) -> Iterator[Conn]:
    conn.execute(TRY_SQL)
    yield conn


def _compare(cases: list[Any], want: list[Outcome], got: list[Outcome]) -> None:
    bad = [(case, w, g) for case, w, g in zip(cases, want, got, strict=True) if w != g]
    assert not bad, f"{len(bad)} of {len(cases)} differ, e.g.:\n" + "\n".join(map(repr, bad[:5]))


def test_differential_next_runs(diff_conn: Conn) -> None:
    rng = random.Random(20260329)
    cases: list[tuple[str, int, str | None, datetime]] = []
    want: list[Outcome] = []
    for i in range(400):
        tz = rng.choice([*ZONES, None])
        after = _instant(rng, tz)
        n = rng.randint(1, 8)
        if i % 3:
            expr = _cron(rng)
            cron_tz = S.zone(tz)

            def run_cron(expr: str = expr, tz: ZoneInfo = cron_tz, after: datetime = after, n: int = n) -> Any:
                cron = S.parse_cron(expr)
                out: list[datetime] = []
                t = after
                while len(out) < n:
                    try:
                        t = S.cron_next(cron, tz, t)
                    except S.ScheduleError:
                        if not out:
                            raise
                        break
                    out.append(t)
                return out

            cases.append((expr, n, tz, after))
            want.append(_python(run_cron))
        else:
            iv = _interval(rng, fixed=False)
            cases.append((str(iv), n, tz, after))
            want.append(_python(lambda iv=iv, tz=tz, after=after, n=n: [
                S.add_interval(after, iv, S.zone(tz), k) for k in range(1, n + 1)]))
    got = _sql_outcomes(diff_conn, "pg_temp.try_next_runs(c0, c1, c2, c3)",
                        [list(col) for col in zip(*cases, strict=True)], ["text", "int", "text", "timestamptz"])
    _compare(cases, want, got)
    assert sum(w[0] == "ok" for w in want) > 300  # the generator mostly makes usable schedules


def test_differential_first_start(diff_conn: Conn) -> None:
    rng = random.Random(42)
    cases: list[tuple[str, str | None, bool, datetime | None, str | None, datetime]] = []
    want: list[Outcome] = []
    for i in range(300):
        tz = rng.choice([*ZONES, None])
        at = _instant(rng, tz)
        fixed = rng.random() < 0.7
        origin = rng.choice([None, _instant(rng, tz), at - timedelta(days=rng.randint(0, 800),
                                                                     microseconds=rng.randrange(10**11))])
        if i % 2:
            expr = _cron(rng)
            cases.append((expr, None, fixed, origin, tz, at))
            want.append(_python(lambda expr=expr, fixed=fixed, origin=origin, tz=tz, at=at: S.first_start(
                S.Schedule(None, S.parse_cron(expr), fixed, origin, S.zone(tz)), at)))
        else:
            iv = _interval(rng, fixed)
            cases.append((str(iv), str(iv), fixed, origin, tz, at))
            want.append(_python(lambda iv=iv, fixed=fixed, origin=origin, tz=tz, at=at: S.first_start(
                S.Schedule(iv, None, fixed, origin, S.zone(tz)), at)))
    got = _sql_outcomes(diff_conn, "pg_temp.try_first_start(c0, c1, c2, c3, c4, c5)",
                        [list(col) for col in zip(*cases, strict=True)],
                        ["text", "interval", "boolean", "timestamptz", "text", "timestamptz"])
    _compare(cases, want, got)
    assert sum(w[0] == "ok" for w in want) > 250


# --- import failure: add_job degrades, next_runs says how to fix it --------------------------------

BLOCK_IMPORT = """DO LANGUAGE plpython3u $$
import sys
sys.modules['pgsched.schedule'] = None
GD.pop('pgsched_schedule', None)
$$"""
UNBLOCK_IMPORT = """DO LANGUAGE plpython3u $$
import sys
del sys.modules['pgsched.schedule']
$$"""


def test_import_failure_falls_back(api: Conn) -> None:
    api.execute(BLOCK_IMPORT)
    with notices(api) as seen:
        assert scalar(api, "SELECT pgsched._first_start('@hourly', NULL, true, NULL, NULL)") is None
    assert any("cannot import pgsched.schedule" in m for m in seen), seen

    with notices(api) as seen:
        job_id = add_job(api, "'ok_fn', '*/5 * * * *'")
    assert next_start(api, job_id) is None  # the scheduler fills it in
    assert sum("cannot import pgsched.schedule" in m for m in seen) == 2, seen
    assert any("syntax only" in m for m in seen), seen
    # the plain-SQL syntax check still applies
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="schedule"):
        api.execute("SELECT pgsched.add_job('ok_fn', '61 * * * *')")
    interval_job = add_job(api, "'ok_fn', '1 hour'")
    assert next_start(api, interval_job) is None

    with pytest.raises(psycopg.errors.SystemError, match=r"cannot import pgsched\.schedule") as info:
        next_runs(api, "'@hourly', 3", ())
    assert "PYTHONPATH" in (info.value.diag.message_hint or "")

    # importable again: the same session recovers without reconnecting
    api.execute(UNBLOCK_IMPORT)
    with notices(api) as seen:
        job_id = add_job(api, "'ok_fn', '*/5 * * * *'")
    assert next_start(api, job_id) is not None
    assert not seen
    assert len(next_runs(api, "'@hourly', 3", ())) == 3
