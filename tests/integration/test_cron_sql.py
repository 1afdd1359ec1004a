"""The plain-SQL cron engine (sql/api/05_cron.sql) against the reference, pgsched/cron.py.

A differential test: hypothesis draws 5/6/7-field cron expressions (names, ranges, steps,
L, $, dL, d#n, ?, macros, and invalid forms: W, steps larger than the field, values out of
range, junk) and instants in zones with DST (Berlin, New York, Lord Howe's half-hour shift),
many of them close to a transition; the SQL path and the Python path must agree on validity
and on the next 20 start times. PGSCHED_CRON_DIFF_EXAMPLES raises the example count (the
default keeps the suite fast; the note of issue 15 gives the larger run).
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgsched import schedule as s
from tests.integration.helpers import Conn

EXAMPLES = int(os.environ.get("PGSCHED_CRON_DIFF_EXAMPLES", "400"))
ZONES = ("UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata")
# DST transitions (UTC) the instants cluster around: Berlin, New York, Lord Howe, spring and autumn.
TRANSITIONS = [datetime(2026, 3, 29, 1, tzinfo=UTC), datetime(2026, 10, 25, 1, tzinfo=UTC),
               datetime(2026, 3, 8, 7, tzinfo=UTC), datetime(2026, 11, 1, 6, tzinfo=UTC),
               datetime(2026, 4, 4, 15, tzinfo=UTC), datetime(2026, 10, 3, 15, 30, tzinfo=UTC),
               datetime(2031, 3, 30, 1, tzinfo=UTC)]
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def _num(lo: int, hi: int) -> st.SearchStrategy[str]:
    # mostly in range, sometimes just outside it
    return st.integers(lo - 1, hi + 1).map(str)


def _item(lo: int, hi: int, names: tuple[str, ...]) -> st.SearchStrategy[str]:
    val = st.one_of(_num(lo, hi), st.sampled_from(names)) if names else _num(lo, hi)
    step = st.one_of(st.integers(0, hi + 2).map(str), st.sampled_from(["5000000000", "0000000001", "x"]))
    return st.one_of(
        st.just("*"), val,
        st.tuples(val, val).map(lambda t: f"{t[0]}-{t[1]}"),
        st.tuples(st.sampled_from(["*", str(lo)]), step).map(lambda t: f"{t[0]}/{t[1]}"),
        st.tuples(val, val, step).map(lambda t: f"{t[0]}-{t[1]}/{t[2]}"),
    )


def _field(lo: int, hi: int, names: tuple[str, ...] = (), extra: tuple[str, ...] = ()) -> st.SearchStrategy[str]:
    one = st.one_of(_item(lo, hi, names), st.sampled_from(extra)) if extra else _item(lo, hi, names)
    return st.one_of(one, st.lists(one, min_size=1, max_size=3).map(",".join))


MONTHS = ("JAN", "feb", "Mar", "DEC", "JUN")
DAYS = ("SUN", "mon", "FRI", "SAT", "wed")
DOM = _field(1, 31, extra=("L", "$", "?", "15W", "LW", "", "29", "30", "31"))
DOW = _field(0, 7, DAYS, extra=("5L", "FRIL", "1#2", "MON#5", "7#1", "0#6", "?", "L", "#2"))


@st.composite
def cron_text(draw: st.DrawFn) -> str:
    kind = draw(st.sampled_from([5, 5, 6, 7, 0]))
    if kind == 0:
        return draw(st.sampled_from(["@hourly", "@daily", "@weekly", "@monthly", "@yearly", "@annually",
                                     "@midnight", "@HOURLY", "*/60 10 * * *", "*/5000000000 10 * * *",
                                     "0 0 31 2 *", "0 0 30 2 *", "0 0 29 2 *", "0 0 1 1 * 2020",
                                     "0 0 0 29 2 ? 2025-2027", "* * * * * *", "1 2 3 4"]))
    sec = draw(_field(0, 59))
    minute = draw(st.one_of(_field(0, 59), st.sampled_from(["0", "30", "*/15"])))
    hour = draw(st.one_of(_field(0, 23), st.sampled_from(["2", "1-3", "*"])))
    dom = draw(st.one_of(DOM, st.just("*")))
    month = draw(st.one_of(_field(1, 12, MONTHS), st.just("*")))
    dow = draw(st.one_of(DOW, st.just("*")))
    fields = [minute, hour, dom, month, dow]
    if kind >= 6:
        fields = [sec, *fields]
    if kind == 7:
        fields.append(draw(st.one_of(_field(1970, 2099), st.sampled_from(["2026-2030", "*", "2027/2"]))))
    return draw(st.sampled_from([" ", "  ", "\t"])).join(fields)


@st.composite
def instant(draw: st.DrawFn) -> datetime:
    if draw(st.booleans()):
        base = draw(st.sampled_from(TRANSITIONS))
        return base + timedelta(seconds=draw(st.integers(-3 * 86400, 3 * 86400)),
                                microseconds=draw(st.sampled_from([0, 1, 500000])))
    return draw(st.datetimes(datetime(1995, 1, 1), datetime(2060, 1, 1))).replace(tzinfo=UTC)


def _python(expr: str, tz: str, after: datetime, n: int) -> list[datetime] | None:
    """What the reference says, as plpython/schedule.sql's _py_next_runs computes it; None: invalid."""
    try:
        cron = s.parse_cron(expr)
        zone = s.zone(tz)
        out: list[datetime] = []
        t = after
        while len(out) < n:
            try:
                t = s.cron_next(cron, zone, t)
            except s.ScheduleError:
                if not out:
                    raise
                break
            out.append(t)
        return out
    except s.ScheduleError:
        return None


def _sql(conn: Conn, expr: str, tz: str, after: datetime, n: int) -> list[datetime] | None:
    try:
        with conn.transaction():
            row = conn.execute("SELECT pgsched._cron_next_n(%s, %s, %s, %s)", (expr, tz, after, n)).fetchone()
    except psycopg.errors.InvalidParameterValue:
        return None
    assert row is not None
    runs: list[datetime] = row[0]  # type: ignore[assignment]
    return runs


@pytest.fixture(scope="module")
def cconn(module_api: Conn) -> Conn:
    module_api.execute("SET TimeZone = 'UTC'")
    return module_api


@SETTINGS
@given(expr=cron_text(), tz=st.sampled_from(ZONES), after=instant())
def test_sql_cron_agrees_with_python(cconn: Conn, expr: str, tz: str, after: datetime) -> None:
    want = _python(expr, tz, after, 20)
    got = _sql(cconn, expr, tz, after, 20)
    assert got == want, (expr, tz, after)


@SETTINGS
@given(months=st.integers(0, 14), days=st.integers(0, 40), micros=st.integers(0, 3 * 86_400_000_000),
       tz=st.sampled_from(ZONES), after=instant())
def test_sql_interval_agrees_with_python(cconn: Conn, months: int, days: int, micros: int, tz: str,
                                         after: datetime) -> None:
    iv = s.Interval(months, days, micros)
    want = [s.add_interval(after, iv, s.zone(tz), k) for k in range(1, 21)]
    got = [r[0] for r in cconn.execute(
        "SELECT pgsched._add_interval_local(%s, make_interval(months => %s, days => %s) "
        "+ %s * interval '1 microsecond', %s, k) FROM generate_series(1, 20) k ORDER BY k",
        (after, months, days, micros, tz)).fetchall()]
    assert got == want


@pytest.mark.parametrize("schedule", ["*/60 10 * * *", "*/5000000000 10 * * *", "0 */24 * * *",
                                      "50 seconds c", "0 0 31 2 *", "0 0 1 1 * 2020", "0 0 15W * *"])
def test_add_job_refuses_what_python_refuses(api: Conn, schedule: str) -> None:
    """Both paths refuse these (issue 19's step and junk rules included), nothing written."""
    if not s.looks_like_cron(schedule):
        with pytest.raises(s.ScheduleError):
            s.parse_interval(schedule)
    else:
        assert _python(schedule, "UTC", datetime.now(UTC), 1) is None
    with pytest.raises(psycopg.errors.InvalidParameterValue) as err:
        api.execute("SELECT pgsched.add_job('ok_proc', %s)", (schedule,))
    assert "invalid schedule" in str(err.value)
    assert api.execute("SELECT count(*) FROM pgsched.jobs").fetchone() == (0,)


def test_next_runs_without_plpython_exists(api: Conn) -> None:
    """next_runs is there on every server: Berlin's spring gap collapses into its end."""
    rows = api.execute("SELECT pgsched.next_runs('30 2 * * *', 3, 'Europe/Berlin', '2026-03-27 12:00+00')").fetchall()
    assert [r[0] for r in rows] == [datetime(2026, 3, 28, 1, 30, tzinfo=UTC), datetime(2026, 3, 29, 1, tzinfo=UTC),
                                    datetime(2026, 3, 30, 0, 30, tzinfo=UTC)]
