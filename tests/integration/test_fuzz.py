"""Fuzzing every SQL API function's arguments (issue 5).

Each call, made by an ordinary role (alice) in a database installed the usual way
(by a superuser, with PL/Python where the server has it), either succeeds or fails
with a SQLSTATE from the function's allowed set, never an internal error (XX000)
nor one that would mean SQL was built from the input (42601 syntax error, 42703
undefined column, 42P01 undefined table, ...). After an error the catalog (job,
job_stat, job_run) is exactly as before; after a success it is put back, so every
example starts from the same catalog.

A small sample per function runs in the default suite; PGSCHED_FUZZ=1 runs
thousands per function (docs/security.md):

    PGSCHED_FUZZ=1 .venv/bin/python -m pytest -q tests/integration/test_fuzz.py
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql
from psycopg.types.json import Jsonb

from tests.conftest import PgServer
from tests.integration.helpers import SETUP_SQL, Conn, scalar, snapshot
from tests.integration.test_security import cluster_roles, dsn_as

FUZZ = os.environ.get("PGSCHED_FUZZ") == "1"
fuzz_settings = settings(
    max_examples=3000 if FUZZ else 60,
    deadline=None,
    derandomize=not FUZZ,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
)

# What a call may fail with. Class 22 (data exception) is allowed everywhere: bad values
# of the right type (PostgreSQL's own input checks included). The rest are the API's
# documented errors (README): unknown proc / wrong signature 42883, unknown job 42704,
# duplicate name 42710, missing privilege or LOGIN 42501, job running 55006, Python job
# 0A000, and what a failing check_config raises (PC001, PC002 in SETUP_SQL).
API_ERRORS = {"42883", "42704", "42710", "42501"}
ALLOWED: dict[str, set[str]] = {
    "add_job": API_ERRORS | {"PC001", "PC002"},
    "alter_job": API_ERRORS | {"PC001", "PC002", "55006"},
    "delete_job": {"42704", "42501"},
    "schedule": API_ERRORS,
    "unschedule": {"42704", "42501"},
    "run_job": {"42704", "42501", "55006", "0A000"},
    "next_runs": set(),
}

# -- strategies ------------------------------------------------------------------------------
# Each argument is mostly a valid value (so calls get past the first check and reach the
# deeper ones, and some succeed) and otherwise anything of its type.


def mostly(valid: st.SearchStrategy[Any], anything: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(valid, valid, anything)


NASTY = ["'", "''", "\"", ";", "$$", "$x$", "--", "/*", "*/", "\\", "'); DROP TABLE public.canary; --",
         "\"; DROP TABLE public.canary; --", "$$; DROP TABLE public.canary; $$", "%s", "%I", "%L", "\t", "\n",
         "\r", "\x1b[31m", "\x7f", "\u00a0", "\u200b", "\u202e", "\ufeff", "é", "日本", "🙂", "NULL", "null",
         "true", "*", " ", ""]

any_char = st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00")
nasty_text = st.lists(st.one_of(st.sampled_from(NASTY), st.text(any_char, max_size=8)), max_size=6).map("".join)
long_text = st.sampled_from([100_000, 3000, 501, 500]).flatmap(
    lambda n: st.sampled_from(["x", "'", ";", "é", "🙂", "a b"]).map(lambda c: (c * n)[:n]))
texts = st.one_of(st.none(), nasty_text, st.text(any_char, max_size=40), long_text)

INT4 = (-2**31, 2**31 - 1)
ints = st.one_of(st.none(), st.sampled_from([INT4[0], INT4[0] + 1, -2, -1, 0, 1, 2, 999, 1000, INT4[1]]),
                 st.integers(*INT4))
bigints = st.one_of(ints, st.sampled_from([-2**63, 2**63 - 1, 2**31, -2**31 - 1]))

# Intervals as text, so months and signs of each part are free; the cast is PostgreSQL's.
interval_parts = st.tuples(st.integers(-2**31 + 1, 2**31 - 1), st.integers(-2**31 + 1, 2**31 - 1),
                           st.integers(-(2**62), 2**62))
small_parts = st.tuples(st.integers(-25, 25), st.integers(-40, 40), st.integers(-10**11, 10**11))
intervals = st.one_of(
    st.none(),
    st.sampled_from(["0", "1 microsecond", "-1 second", "1 month", "1 month 1 day", "1 year", "5 minutes",
                     "-5 minutes", "178000000 years", "-178000000 years", "1 day -1 second", "23:59:59.999999"]),
    st.one_of(small_parts, interval_parts).map(lambda p: f"{p[0]} months {p[1]} days {p[2]} microseconds"),
    st.timedeltas(min_value=timedelta(days=-10**8), max_value=timedelta(days=10**8)),
)
CRON_FIELD = st.one_of(st.sampled_from(["*", "*/5", "0", "59", "60", "1-5", "5-1", "1,2", ",", "L", "W", "?",
                                        "#", "1#5", "5L", "JAN", "MON-FRI", "*/0", "99999999999", "-1", "$",
                                        "1-2/3", "*-1"]),
                       st.text("0123456789*/,-LW#?$", max_size=6))
crons = st.one_of(st.lists(CRON_FIELD, min_size=4, max_size=8).map(" ".join),
                  st.sampled_from(["@hourly", "@daily", "@weekly", "@monthly", "@yearly", "@reboot", "@ daily",
                                   "0 0 31 2 *", "0 0 30 2 *", "0 0 0 1 1 * 2000", "0 0 0 1 1 * 2199",
                                   "* * * * * * * *", "*/5 * * * *", "0 9 * * MON-FRI", "0 0 L * *"]))
schedules = mostly(st.sampled_from(["1 hour", "5 minutes", "1 month", "*/5 * * * *", "0 9 * * MON-FRI", "@daily",
                                     "0 */10 * * * *", " 2 days "]),
                   st.one_of(st.none(), crons, intervals.map(lambda v: None if v is None else str(v)), texts))
timestamps = st.one_of(
    st.none(), st.sampled_from(["infinity", "-infinity", "epoch", "4713-01-01 00:00:00+00 BC",
                                "294276-12-31 23:59:59+00", "2026-03-29 02:30:00 Europe/Berlin"]),
    st.datetimes(timezones=st.just(UTC)),
    st.datetimes(min_value=datetime(1900, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.just(UTC)))
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False),
              st.text(any_char, max_size=20), nasty_text),
    lambda children: st.one_of(st.lists(children, max_size=4),
                               st.dictionaries(st.one_of(st.text(any_char, max_size=8), nasty_text), children,
                                               max_size=4)),
    max_leaves=12)
jsonbs = st.one_of(st.none(), json_values.map(Jsonb), st.just(Jsonb({"bad": 1})))
valid_intervals = st.sampled_from(["1 hour", "5 minutes", "1 month", "2 days", "00:00:01"])
timezones = mostly(st.sampled_from(["UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Etc/GMT+12"]),
                   st.one_of(st.none(), st.sampled_from(["EST5EDT", "utc", "Mars/Olympus", "+05:30", "localtime",
                                                         "posixrules", ""]), texts))
booleans = st.one_of(st.none(), st.booleans())
catch_ups = mostly(st.sampled_from(["latest", "all", "none"]), st.one_of(st.none(), st.sampled_from(["LATEST", "some"]),
                                                                         texts))
PROCS = ["ok_fn", "ok_proc", "bad_fn", "bad_proc", "wrong_sig", "wrong_types", "check_ok", "check_proc",
         "check_wrong", "public.secret_fn", "pg_catalog.now", "pg_sleep", "no_such_fn", "nosuchschema.fn",
         "a.b.c.d", "\"odd name\"", "ok_fn(", "0", "-"]
procs = mostly(st.sampled_from(["ok_fn", "ok_proc", "bad_proc"]), st.one_of(st.none(), st.sampled_from(PROCS),
                                                                               nasty_text))

# -- the harness ---------------------------------------------------------------------------------


@dataclass
class Fuzz:
    alice: Conn
    admin: Conn
    baseline: tuple[list[Any], list[Any], list[Any]]
    job_ids: list[int]
    counts: dict[str, dict[str, int]] = field(default_factory=dict)

    def restore(self) -> None:
        jobs, stats, runs = self.baseline
        with self.admin.transaction():
            self.admin.execute("DELETE FROM pgsched.job")
            self.admin.execute("INSERT INTO pgsched.job SELECT * FROM jsonb_populate_recordset(NULL::pgsched.job, %s)",
                               (Jsonb(jobs),))
            self.admin.execute("DELETE FROM pgsched.job_stat")
            self.admin.execute("INSERT INTO pgsched.job_stat "
                               "SELECT * FROM jsonb_populate_recordset(NULL::pgsched.job_stat, %s)", (Jsonb(stats),))
            self.admin.execute("INSERT INTO pgsched.job_run OVERRIDING SYSTEM VALUE "
                               "SELECT * FROM jsonb_populate_recordset(NULL::pgsched.job_run, %s)", (Jsonb(runs),))

    def call(self, api: str, query: str, params: list[Any]) -> None:
        """Run one API call as alice and check the outcome against the rules above."""
        tally = self.counts.setdefault(api, {})
        try:
            self.alice.execute(query, params)
        except psycopg.Error as e:
            state = e.sqlstate or "?"
            tally[state] = tally.get(state, 0) + 1
            assert state.startswith("22") or state in ALLOWED[api], \
                f"{api}: {state} {e.diag.message_primary!r} (context {e.diag.context!r}) for {query} {params!r}"
            assert self.alice.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
            after = snapshot(self.admin)
            if after != self.baseline:
                self.restore()
            assert after == self.baseline, f"{api} failed with {state} but changed the catalog: {query} {params!r}"
            assert scalar(self.admin, "SELECT to_regclass('public.canary') IS NOT NULL") is True
            return
        tally["ok"] = tally.get("ok", 0) + 1
        self.restore()
        assert scalar(self.admin, "SELECT to_regclass('public.canary') IS NOT NULL") is True

    def regproc(self, name: str | None) -> bool:
        """Whether PostgreSQL's own regproc input accepts `name`: if not, no API function is
        ever called with it (the cast fails first, with PostgreSQL's error), so the example is moot."""
        if name is None:
            return True
        try:
            self.admin.execute("SELECT %s::text::regproc", (name,))
        except psycopg.Error:
            return False
        return True


@pytest.fixture(scope="module")
def fuzz(pg_server: PgServer) -> Iterator[Fuzz]:
    with cluster_roles(pg_server, ("alice", "bob")) as names:
        dbname = pg_server.create_db()
        try:
            dsn = pg_server.dsn(dbname)
            with psycopg.connect(dsn, autocommit=True) as admin:
                admin.execute(SETUP_SQL)
                admin.execute("GRANT INSERT ON public.ran TO PUBLIC")
                admin.execute("CREATE TABLE public.canary (x int)")
                admin.execute("CREATE FUNCTION public.secret_fn(job_id integer, config jsonb) RETURNS void "
                              "LANGUAGE sql AS 'SELECT'")
                admin.execute("REVOKE EXECUTE ON FUNCTION public.secret_fn(integer, jsonb) FROM PUBLIC")
                with psycopg.connect(dsn_as(dsn, names["alice"]), autocommit=True) as alice, \
                        psycopg.connect(dsn_as(dsn, names["bob"]), autocommit=True) as bob:
                    ids = [
                        scalar(alice, "SELECT pgsched.add_job('ok_fn', '1 hour', job_name => 'base')"),
                        scalar(alice, "SELECT pgsched.add_job('ok_proc', '*/5 * * * *', config => '{\"a\": 1}', "
                                      "check_config => 'check_ok', timezone => 'Europe/Berlin')"),
                        scalar(alice, "SELECT pgsched.schedule('cmd', '1 day', 'SELECT 1')"),
                        scalar(bob, "SELECT pgsched.add_job('ok_fn', '1 hour', job_name => 'base')"),
                    ]
                    fz = Fuzz(alice, admin, snapshot(admin), [int(i) for i in ids])
                    yield fz
                    print("\nfuzz outcomes per function:", fz.counts)
        finally:
            pg_server.drop_db(dbname)


def job_ids(fz: Fuzz) -> st.SearchStrategy[int | None]:
    return mostly(st.sampled_from(fz.job_ids), ints)


def settings_args(data: st.DataObject, names: list[str]) -> tuple[list[str], list[Any]]:
    """A random subset of the named settings, each with a random value: SQL and params."""
    values: dict[str, tuple[str, st.SearchStrategy[Any]]] = {
        "config": ("jsonb", jsonbs), "initial_start": ("timestamptz", timestamps),
        "scheduled": ("boolean", booleans), "fixed_schedule": ("boolean", booleans),
        "timezone": ("text", timezones), "job_name": ("text", mostly(nasty_text, texts)),
        "max_runtime": ("interval", mostly(valid_intervals, intervals)),
        "max_retries": ("integer", mostly(st.integers(-1, 10), ints)),
        "retry_period": ("interval", mostly(valid_intervals, intervals)), "catch_up": ("text", catch_ups),
        "if_not_exists": ("boolean", booleans), "if_exists": ("boolean", booleans),
        "next_start": ("timestamptz", timestamps), "config_merge": ("jsonb", jsonbs),
        "schedule": ("text", schedules), "schedule_interval": ("interval", mostly(valid_intervals, intervals)),
    }
    chosen = data.draw(st.lists(st.sampled_from(names), unique=True, max_size=5))
    parts, params = [], []
    for name in chosen:
        typ, strategy = values[name]
        parts.append(f"{name} => %s::{typ}")
        params.append(data.draw(strategy))
    return parts, params


ADD_SETTINGS = ["config", "initial_start", "scheduled", "fixed_schedule", "timezone", "job_name", "max_runtime",
                "max_retries", "retry_period", "catch_up", "if_not_exists"]


@fuzz_settings
@given(data=st.data())
def test_fuzz_add_job(fuzz: Fuzz, data: st.DataObject) -> None:
    proc = data.draw(procs)
    check = data.draw(st.one_of(st.none(), st.sampled_from(["check_ok", "check_proc", "check_wrong", "ok_fn"])))
    if not (fuzz.regproc(proc) and fuzz.regproc(check)):
        return
    by_interval = data.draw(st.booleans())
    first = data.draw(mostly(valid_intervals, intervals) if by_interval else schedules)
    parts, params = settings_args(data, ADD_SETTINGS)
    if check is not None:
        parts.append("check_config => %s::text::regproc")
        params.append(check)
    query = "SELECT pgsched.add_job(%s::text::regproc, " + ("%s::interval" if by_interval else "%s::text") + \
        "".join(", " + p for p in parts) + ")"
    fuzz.call("add_job", query, [proc, first, *params])


ALTER_SETTINGS = ["schedule_interval", "max_runtime", "max_retries", "retry_period", "scheduled", "config",
                  "next_start", "if_exists", "fixed_schedule", "initial_start", "timezone", "job_name", "schedule",
                  "catch_up", "config_merge"]


@fuzz_settings
@given(data=st.data())
def test_fuzz_alter_job(fuzz: Fuzz, data: st.DataObject) -> None:
    job_id = data.draw(job_ids(fuzz))
    parts, params = settings_args(data, ALTER_SETTINGS)
    check = data.draw(st.one_of(st.none(), st.sampled_from(["check_ok", "check_proc", "check_wrong", "ok_fn"])))
    if check is not None:
        parts.append("check_config => %s::text::regproc")
        params.append(check)
    query = "SELECT * FROM pgsched.alter_job(%s::integer" + "".join(", " + p for p in parts) + ")"
    fuzz.call("alter_job", query, [job_id, *params])


@fuzz_settings
@given(data=st.data())
def test_fuzz_delete_run_unschedule(fuzz: Fuzz, data: st.DataObject) -> None:
    job_id = data.draw(job_ids(fuzz))
    fuzz.call("delete_job", "SELECT pgsched.delete_job(%s::integer)", [job_id])
    fuzz.call("run_job", "CALL pgsched.run_job(%s::integer)", [job_id])
    fuzz.call("unschedule", "SELECT pgsched.unschedule(%s::bigint)",
              [data.draw(st.one_of(st.sampled_from(fuzz.job_ids), bigints))])
    fuzz.call("unschedule", "SELECT pgsched.unschedule(%s::text)",
              [data.draw(st.one_of(st.sampled_from(["base", "cmd"]), texts))])


@fuzz_settings
@given(name=st.one_of(st.sampled_from(["base", "cmd", "new"]), texts), schedule=schedules, command=texts,
       named=st.booleans())
def test_fuzz_schedule(fuzz: Fuzz, name: str | None, schedule: str | None, command: str | None,
                       named: bool) -> None:
    if named:
        fuzz.call("schedule", "SELECT pgsched.schedule(%s::text, %s::text, %s::text)", [name, schedule, command])
    else:
        fuzz.call("schedule", "SELECT pgsched.schedule(%s::text, %s::text)", [schedule, command])


@fuzz_settings
@given(schedule=schedules, n=ints, tz=timezones, after=timestamps)
def test_fuzz_next_runs(pg_server: PgServer, fuzz: Fuzz, schedule: str | None, n: int | None, tz: str | None,
                        after: Any) -> None:
    if not pg_server.plpython:
        pytest.skip("next_runs needs PL/Python")
    if n is not None and n > 1000:
        n = n % 1000  # the answer has n rows: a huge n is a legitimate (slow) request
    fuzz.call("next_runs", "SELECT * FROM pgsched.next_runs(%s::text, %s::integer, %s::text, %s::timestamptz)",
              [schedule, n, tz, after])


def test_the_fuzz_harness_can_fail(fuzz: Fuzz) -> None:
    """A forbidden SQLSTATE and a changed catalog are both caught."""
    with pytest.raises(AssertionError, match="42601"):
        fuzz.call("delete_job", "SELECT pgsched.delete_job(", [])
    fuzz.admin.execute(sql.SQL("INSERT INTO pgsched.job_run (job_id, plan_time) VALUES ({}, now())").format(
        sql.Literal(fuzz.job_ids[0])))
    with pytest.raises(AssertionError, match="changed the catalog"):
        fuzz.call("delete_job", "SELECT pgsched.delete_job(NULL)", [])
    assert snapshot(fuzz.admin) == fuzz.baseline
