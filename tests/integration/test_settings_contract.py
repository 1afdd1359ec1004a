"""The one definition of a job's settings (pgsched.job_settings, sql/api/10_jobs.sql) against
everything that must agree with it: the catalog's columns and their defaults, the public
signatures (PostgreSQL needs each argument spelled out), the paths that write a job (add_job,
alter_job, schedule, the deploy of Python jobs), the claim's launch row, and the Python side
(pgsched.model.JobSettings, @pgsched.job and JobSpec). A new setting that is missing anywhere
makes one of these fail.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from pgsched import app, model, schedule
from tests.integration.helpers import Conn, rows, scalar

# One value per setting that is not its default and is valid with all the others: the paths
# that write a job are checked to carry each of them to the catalog.
SAMPLE: dict[str, Any] = {
    "schedule": "7 minutes", "fixed_schedule": False, "initial_start": "2030-01-02T03:04:05+00:00",
    "timezone": "Europe/Berlin", "config": {"k": [1, None]}, "scheduled": False, "job_name": "sample",
    "max_runtime": "01:00:00", "max_retries": 3, "retry_period": "00:01:00", "catch_up": "all",
    "catch_up_window": "02:00:00", "max_plans_per_tick": 7, "schedule_delay": "00:00:30",
    "allow_stale_reentry": True, "scope_query": "SELECT 1", "database": "postgres", "priority": 42,
    "exclude": "* 2 * * *", "jitter": "00:00:20", "concurrency_key": "sample-key", "depends_on": ["sample_up"],
    "history": "failures", "success_retention": "2 days", "failure_retention": "60 days",
}
PY_TYPES = {"text": str, "boolean": bool, "integer": int, "interval": timedelta,
            "timestamp with time zone": datetime, "jsonb": Any, "integer[]": list[int]}
# The public signatures take depends_on as job ids or names, stored as ids (pgsched._resolve_upstreams).
API_TYPES = {"depends_on": "text[]"}


def with_upstream(conn: Conn) -> int:
    """The job SAMPLE's depends_on names, created first."""
    return int(scalar(conn, "SELECT pgsched.add_job('ok_fn', '1 hour', job_name => 'sample_up')"))


def definition(conn: Conn) -> list[tuple[str, str]]:
    """(name, type) of each setting, in order."""
    return [(r["name"], r["type"]) for r in rows(
        conn, """SELECT a.attname AS name, format_type(a.atttypid, a.atttypmod) AS type
                   FROM pg_attribute a
                  WHERE a.attrelid = 'pgsched.job_settings'::regclass AND a.attnum > 0 AND NOT a.attisdropped
                  ORDER BY a.attnum""")]


def defaults(conn: Conn) -> dict[str, Any]:
    return dict(scalar(conn, "SELECT to_jsonb(pgsched._settings_defaults())"))


def stored(conn: Conn, name: str) -> dict[str, Any]:
    return dict(scalar(conn, "SELECT to_jsonb(pgsched._job_settings(j)) FROM pgsched.job j WHERE j.job_name = %s",
                       (name,)))


def expected(conn: Conn, values: dict[str, Any]) -> dict[str, Any]:
    """`values` over the defaults, as the database reads them (depends_on's names as the ids they name)."""
    if values.get("depends_on"):
        values = {**values, "depends_on": [int(scalar(conn, "SELECT job_id FROM pgsched.job WHERE job_name = %s",
                                                      (n,))) for n in values["depends_on"]]}
    return dict(scalar(conn, "SELECT to_jsonb(pgsched._settings(pgsched._settings_defaults(), %s))",
                       (Jsonb(values),)))


def sample_args() -> sql.Composable:
    """SAMPLE as named arguments."""
    return sql.SQL(", ").join(
        sql.SQL("{} => {}").format(sql.Identifier(k), sql.Literal(Jsonb(v) if k == "config" else v))
        for k, v in SAMPLE.items())


def evaluate(conn: Conn, expr: str | None, typ: str) -> Any:
    """A default expression read from the catalog, evaluated as jsonb."""
    row = conn.execute(sql.SQL("SELECT to_jsonb(({})::{})").format(sql.SQL(expr or "NULL"), sql.SQL(typ))).fetchone()
    assert row is not None
    return row[0]


def test_the_sample_covers_every_setting(conn: Conn) -> None:
    assert list(SAMPLE) == [name for name, _ in definition(conn)]


def test_each_setting_is_a_catalog_column_of_its_type_and_default(conn: Conn) -> None:
    cols = {r["name"]: r for r in rows(
        conn, """SELECT a.attname AS name, format_type(a.atttypid, a.atttypmod) AS type,
                        pg_get_expr(d.adbin, d.adrelid) AS default_expr
                   FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
                  WHERE a.attrelid = 'pgsched.job'::regclass AND a.attnum > 0 AND NOT a.attisdropped""")}
    dflt = defaults(conn)
    for name, typ in definition(conn):
        assert name in cols, f"setting {name} has no column in pgsched.job"
        assert cols[name]["type"] == typ, name
        column_default = evaluate(conn, cols[name]["default_expr"], typ)
        assert column_default == dflt[name], f"pgsched.job.{name} defaults to {column_default}, the API to {dflt[name]}"


def _arguments(conn: Conn, signature: str) -> dict[str, tuple[str, Any]]:
    """name -> (type, default as jsonb, or the marker 'required') of a function's arguments."""
    out: dict[str, tuple[str, Any]] = {}
    oid = scalar(conn, "SELECT %s::regprocedure::oid", (signature,))
    for r in rows(conn, """SELECT n, p.proargnames[n] AS name, format_type(p.proargtypes[n - 1], NULL) AS type,
                                  pg_get_function_arg_default(p.oid, n) AS default_expr
                             FROM pg_proc p, generate_series(1, p.pronargs) AS n WHERE p.oid = %s""", (oid,)):
        value: Any = "required"
        if r["default_expr"] is not None:
            value = evaluate(conn, r["default_expr"], r["type"])
        out[r["name"]] = (r["type"], value)
    return out


@pytest.mark.parametrize("schedule_arg", ["schedule text", "schedule_interval interval"])
def test_add_job_takes_every_setting_with_its_type_and_default(conn: Conn, schedule_arg: str) -> None:
    name, typ = schedule_arg.split()
    args = _arguments(conn, f"pgsched.add_job(regproc, {typ}, jsonb, timestamptz, boolean, regproc, boolean, text, "
                            "text, interval, integer, interval, text, boolean, interval, integer, interval, boolean, "
                            "text, text, integer, text, interval, text, text[], text, interval, interval)")
    dflt = defaults(conn)
    for setting, setting_type in definition(conn):
        if setting == "schedule":
            assert args[name] == (typ, "required")
            continue
        assert args.get(setting) == (API_TYPES.get(setting, setting_type), dflt[setting]), setting
    assert set(args) - {s for s, _ in definition(conn)} == {"proc", name, "check_config", "if_not_exists"} - {
        "schedule"}


def test_alter_job_takes_every_setting_defaulting_to_unchanged(conn: Conn) -> None:
    oid = scalar(conn, "SELECT 'pgsched.alter_job'::regproc::oid")
    args = _arguments(conn, scalar(conn, "SELECT %s::regprocedure::text", (oid,)))
    for setting, setting_type in definition(conn):
        assert args.get(setting) == (API_TYPES.get(setting, setting_type), None), setting


def test_public_wrappers_have_the_pgsched_signatures(conn: Conn) -> None:
    for fn in ("add_job", "alter_job"):
        assert sorted(scalar(conn, """SELECT array_agg(pg_get_function_arguments(oid)) FROM pg_proc
                                       WHERE proname = %s AND pronamespace = 'public'::regnamespace""", (fn,))) == \
            sorted(scalar(conn, """SELECT array_agg(pg_get_function_arguments(oid)) FROM pg_proc
                                    WHERE proname = %s AND pronamespace = 'pgsched'::regnamespace""", (fn,)))


def test_add_job_carries_every_setting_to_the_catalog(api: Conn) -> None:
    with_upstream(api)
    api.execute(sql.SQL("SELECT pgsched.add_job('ok_fn', {})").format(
        sample_args()))
    assert stored(api, "sample") == expected(api, SAMPLE)


def test_alter_job_carries_every_setting_to_the_catalog(api: Conn) -> None:
    with_upstream(api)
    job_id = scalar(api, "SELECT pgsched.add_job('ok_fn', '1 hour', job_name => 'before')")
    api.execute(sql.SQL("SELECT pgsched.alter_job({}, {})").format(
        sql.Literal(job_id),
        sample_args()))
    assert stored(api, "sample") == expected(api, SAMPLE)


def test_a_deploy_carries_every_setting_to_the_catalog(conn: Conn) -> None:
    conn.execute("SELECT * FROM pgsched._deploy_code_jobs(%s, %s)",
                 (["m0"], Jsonb([{"job_name": "sample_up", "schedule": "1 hour", "code_module": "m0",
                                 "code_function": "f"}])))
    conn.execute("SELECT * FROM pgsched._deploy_code_jobs(%s, %s)",
                 (["m"], Jsonb([{**SAMPLE, "code_module": "m", "code_function": "f"}])))
    assert stored(conn, "sample") == expected(conn, SAMPLE)


def test_a_setting_name_that_is_not_one_is_refused(conn: Conn) -> None:
    with pytest.raises(psycopg.errors.UndefinedColumn, match="unknown job setting"):
        conn.execute("SELECT * FROM pgsched._deploy_code_jobs(%s, %s)",
                     (["m"], Jsonb([{"job_name": "x", "schedule": "1 minute", "max_plan_per_tick": 5,
                                     "code_module": "m", "code_function": "f"}])))


def launch_columns(conn: Conn, settings: str) -> sql.Composable:
    """`settings` (an expression of type pgsched.job_settings) as the launch row carries them:
    each by its name, an interval as <name>_s seconds. Built from the SQL definition."""
    return sql.SQL(", ").join(
        sql.SQL("extract(epoch FROM ({s}).{n})::float8 AS {c}").format(
            s=sql.SQL(settings), n=sql.Identifier(name), c=sql.Identifier(f"{name}_s"))
        if typ == "interval" else
        sql.SQL("({s}).{n}").format(s=sql.SQL(settings), n=sql.Identifier(name))
        for name, typ in definition(conn))


def test_the_claims_launch_row_has_every_setting(conn: Conn) -> None:
    columns = {r["name"]: r["type"] for r in rows(
        conn, """SELECT a.attname AS name, format_type(a.atttypid, a.atttypmod) AS type
                   FROM pg_attribute a
                  WHERE a.attrelid = 'pgsched._launch_row_v2'::regclass AND a.attnum > 0 AND NOT a.attisdropped""")}
    for name, typ in definition(conn):
        if typ == "interval":
            assert columns.get(f"{name}_s") == "double precision", name
        else:
            assert columns.get(name) == typ, name


def test_the_launch_row_gives_python_every_setting(api: Conn) -> None:
    up = with_upstream(api)
    api.execute(sql.SQL("SELECT pgsched.add_job('ok_fn', {})").format(
        sample_args()))
    launch = dict(rows(api, "SELECT * FROM pgsched._job_launch WHERE job_name = 'sample'")[0])
    got = model.JobSettings.from_launch_row(launch)
    assert got == model.JobSettings(
        schedule="7 minutes", fixed_schedule=False, initial_start=datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC),
        timezone="Europe/Berlin", config={"k": [1, None]}, scheduled=False, job_name="sample",
        max_runtime=timedelta(hours=1), max_retries=3, retry_period=timedelta(minutes=1), catch_up="all",
        catch_up_window=timedelta(hours=2), max_plans_per_tick=7, schedule_delay=timedelta(seconds=30),
        allow_stale_reentry=True, scope_query="SELECT 1", database="postgres", priority=42,
        exclude="* 2 * * *", jitter=timedelta(seconds=20), concurrency_key="sample-key", depends_on=[up],
        history="failures", success_retention=timedelta(days=2), failure_retention=timedelta(days=60))


@pytest.mark.parametrize(("text", "seconds"), [
    ("00:05:00", 300), ("1 day", 86400), ("1 day -02:00:00", 79200), ("1 mon", 30 * 86400),
    ("1 year 2 mons 3 days 04:05:06.5", 365.25 * 86400 + 60 * 86400 + 3 * 86400 + 4 * 3600 + 5 * 60 + 6.5),
    ("00:00:01.25", 1.25),
])
def test_python_reads_intervals_as_extract_epoch_does(api: Conn, text: str, seconds: float) -> None:
    with_upstream(api)
    api.execute(sql.SQL("SELECT pgsched.add_job('ok_fn', {})").format(sample_args()))
    api.execute("UPDATE pgsched.job SET max_runtime = %s::interval WHERE job_name = 'sample'", (text,))
    launch = dict(rows(api, "SELECT * FROM pgsched._job_launch WHERE job_name = 'sample'")[0])
    assert model.JobSettings.from_launch_row(launch).max_runtime == timedelta(seconds=seconds)


def test_python_job_settings_match_the_sql_definition(conn: Conn) -> None:
    fields = dataclasses.fields(model.JobSettings)
    hints = typing.get_type_hints(model.JobSettings)
    assert [f.name for f in fields] == [name for name, _ in definition(conn)]
    for name, typ in definition(conn):
        assert PY_TYPES[typ] in (hints[name], *typing.get_args(hints[name])), name
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(sql.SQL("SELECT {} FROM (SELECT pgsched._settings_defaults() AS d) x").format(
            launch_columns(conn, "x.d")))
        dflt = cur.fetchone()
    assert dflt is not None
    from_sql = model.JobSettings.from_launch_row({**dflt, "schedule": "x"})
    assert from_sql == model.JobSettings(schedule="x"), "JobSettings' defaults differ from _settings_defaults()"


def test_python_job_declarations_take_every_setting_with_the_sql_defaults(conn: Conn) -> None:
    params = inspect.signature(app.job).parameters
    # @pgsched.job spells two settings its own way: every=/cron= give the schedule, name= the job_name.
    spelled: dict[str, str | None] = {"schedule": None, "job_name": "name", "depends_on": "after"}
    py_defaults = model.JobSettings(schedule="x")
    for name, _ in definition(conn):
        if name in spelled:
            own = spelled[name]
            assert own is None or params[own].default is None
            continue
        default = params[name].default
        if isinstance(py_defaults.__dict__[name], timedelta) and isinstance(default, str):
            default = schedule.parse_interval(default).approx_timedelta()
        assert default == py_defaults.__dict__[name], name

    @app.job(every="1 minute", name="contract")
    def handler(run: app.Run) -> None: ...
    try:
        row = app.REGISTRY["contract"].catalog_row()
    finally:
        app.forget(handler.__module__)
    assert set(row) == {name for name, _ in definition(conn)} | {"code_module", "code_function"}


# Where the rules change (SQL's 1 ms, whole days), and zero, which the months and days take often.
_MICROS_EDGES = [-1, 0, 1, 999, 1000, 1001, 86_400_000_000]


@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(months=st.one_of(st.just(0), st.integers(-2, 14)), days=st.one_of(st.just(0), st.integers(-2, 40)),
       micros=st.one_of(st.sampled_from(_MICROS_EDGES), st.integers(-10**9, 10**11)), fixed=st.booleans())
def test_python_refuses_the_new_intervals_sql_refuses(conn: Conn, months: int, days: int, micros: int,
                                                      fixed: bool) -> None:
    """The rules a schedule's interval is held to, twice: pgsched._check_interval and
    _check_min_period in SQL, schedule.check_new_interval in Python (the decorator's `every`). The
    same interval is refused by both or by neither."""
    iv = schedule.Interval(months, days, micros)
    try:
        schedule.check_new_interval(iv, fixed=fixed)
        python_refuses = False
    except schedule.ScheduleError:
        python_refuses = True
    try:
        conn.execute("SELECT pgsched._check_interval(i, %(fixed)s, 'schedule'), "
                     "pgsched._check_min_period(i, 'schedule') "
                     "FROM (SELECT format('%%s months %%s days %%s microseconds', "
                     "%(months)s::int, %(days)s::int, %(micros)s::bigint)::interval AS i) x",
                     {"fixed": fixed, "months": months, "days": days, "micros": micros})
        sql_refuses = False
    except psycopg.errors.InvalidParameterValue:
        sql_refuses = True
    assert python_refuses == sql_refuses, (iv, fixed)
