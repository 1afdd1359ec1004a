"""Python jobs: deploy to the catalog, and handlers run by the scheduler's workers (real PostgreSQL)."""

from __future__ import annotations

import importlib
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

import tests.apps.demo_jobs  # noqa: F401  (registers the demo handlers)
from pgsched import app
from pgsched.clock import DbClock
from pgsched.scheduler import Scheduler, Settings
from pgsched.store import Store
from tests.conftest import PgServer

Conn = psycopg.Connection[tuple[Any, ...]]
DEMO = "tests.apps.demo_jobs"


def one(conn: Conn, query: str, *args: Any) -> Any:
    row = conn.execute(query, args).fetchone()
    assert row is not None
    return row[0]


def deploy(dsn: str, modules: list[str]) -> list[tuple[int, str, str]]:
    store = Store(dsn, DbClock())
    try:
        return store.deploy(modules, [s.catalog_row() for s in app.registered(modules)])
    finally:
        store.close()


@pytest.fixture
def py(conn: Conn) -> Conn:
    conn.execute("CREATE TABLE py_hits (job text, plan_time timestamptz, attempt int, config jsonb)")
    return conn


def job_id(conn: Conn, name: str) -> int:
    return int(one(conn, "SELECT job_id FROM pgsched.jobs WHERE job_name = %s", name))


def run_now_and_wait(db: str, conn: Conn, names: list[str], timeout: float = 20.0, **settings: Any) -> None:
    """Serve with the demo app until every named job has ended one run."""
    def ended() -> bool:
        return all(one(conn, "SELECT count(*) FROM pgsched.job_run r JOIN pgsched.job j USING (job_id) "
                             "WHERE j.job_name = %s AND r.outcome <> 'running'", n) >= 1 for n in names)

    triggered: list[bool] = []

    def until() -> bool:
        if not triggered and one(conn, "SELECT count(*) FROM pgsched.jobs WHERE kind = 'python'") > 0:
            for n in names:
                conn.execute("SELECT alter_job(%s, next_start => now())", (job_id(conn, n),))
            triggered.append(True)
        return bool(triggered) and ended()

    deadline = time.monotonic() + timeout
    opts: dict[str, Any] = {"max_workers": 4, "crash_wait": 1.0, "safety_interval": 0.2, "apps": (DEMO,),
                            **settings}
    Scheduler(Settings(dsn=db, **opts)).run(until=lambda: until() or time.monotonic() > deadline)
    assert triggered and ended(), "the runs did not end in time"


def last_run(conn: Conn, name: str) -> dict[str, Any]:
    cur = conn.cursor(row_factory=psycopg.rows.dict_row)
    row = cur.execute("SELECT * FROM job_history WHERE job_name = %s ORDER BY run_id DESC LIMIT 1", (name,)).fetchone()
    assert row is not None
    return row


# -- deploy ---------------------------------------------------------------------------------------

@pytest.fixture
def versioned_app(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A module we can rewrite and re-import, as a new release of an app would be."""
    name = f"pgsched_test_app_{time.monotonic_ns()}"
    path = tmp_path / f"{name}.py"
    sys.path.insert(0, str(tmp_path))
    try:
        yield name, path
    finally:
        sys.path.remove(str(tmp_path))
        app.forget(name)
        sys.modules.pop(name, None)


def load(name: str, path: Path, body: str) -> None:
    path.write_text("import pgsched\n\n" + body)
    app.forget(name)
    if name in sys.modules:
        importlib.reload(sys.modules[name])
    else:
        importlib.import_module(name)


def test_deploy_inserts_updates_and_disables_without_deleting(db: str, conn: Conn,
                                                               versioned_app: tuple[str, Path]) -> None:
    name, path = versioned_app
    load(name, path, "@pgsched.job(every='5 minutes', name='a')\ndef a(run): pass\n\n"
                     "@pgsched.job(cron='0 3 * * *', timezone='Europe/Berlin', name='b')\ndef b(run): pass\n")
    assert sorted(a for _, _, a in deploy(db, [name])) == ["inserted", "inserted"]
    rows = conn.execute("SELECT job_name, kind, code_module, code_function, owner::text, schedule, timezone, "
                        "scheduled FROM pgsched.jobs ORDER BY job_name").fetchall()
    assert rows == [("a", "python", name, "a", "postgres", "00:05:00", None, True),
                    ("b", "python", name, "b", "postgres", "0 3 * * *", "Europe/Berlin", True)]
    a_id = job_id(conn, "a")
    assert one(conn, "SELECT next_start IS NOT NULL FROM job_stats WHERE job_id = %s", a_id)
    conn.execute("INSERT INTO pgsched.job_run (job_id, plan_time, outcome) SELECT job_id, now(), 'success' "
                 "FROM pgsched.job WHERE job_name = 'b'")

    # Unchanged code: nothing written.
    assert sorted(a for _, _, a in deploy(db, [name])) == ["unchanged", "unchanged"]

    # Release 2: a's schedule changes, b is gone from the code.
    load(name, path, "@pgsched.job(every='10 minutes', max_retries=3, name='a')\ndef a(run): pass\n")
    assert sorted((n, a) for _, n, a in deploy(db, [name])) == [("a", "updated"), ("b", "disabled")]
    assert job_id(conn, "a") == a_id
    assert conn.execute("SELECT schedule, max_retries FROM pgsched.jobs WHERE job_name = 'a'").fetchone() == (
        "00:10:00", 3)
    st = conn.execute("SELECT s.state, s.disabled_reason FROM job_stats s WHERE job_name = 'b'").fetchone()
    assert st is not None and st[0] == "disabled" and f"{name}.b is no longer in the code" in st[1]
    assert one(conn, "SELECT count(*) FROM job_history WHERE job_name = 'b'") == 1  # history kept

    # b comes back in release 3: enabled again, reason cleared.
    load(name, path, "@pgsched.job(every='10 minutes', max_retries=3, name='a')\ndef a(run): pass\n\n"
                     "@pgsched.job(cron='0 3 * * *', timezone='Europe/Berlin', name='b')\ndef b(run): pass\n")
    deploy(db, [name])
    assert conn.execute("SELECT state, disabled_reason FROM job_stats WHERE job_name = 'b'").fetchone() == (
        "scheduled", None)


def test_a_paused_job_no_longer_in_the_code_is_given_the_reason_and_stays_paused(
        db: str, conn: Conn, versioned_app: tuple[str, Path]) -> None:
    """It was left without one: job_stats.disabled_reason did not say that it will not come back."""
    name, path = versioned_app
    load(name, path, "@pgsched.job(every='5 minutes', name='a')\ndef a(run): pass\n\n"
                     "@pgsched.job(every='5 minutes', name='b')\ndef b(run): pass\n")
    deploy(db, [name])
    b = job_id(conn, "b")
    conn.execute("SELECT alter_job(%s, scheduled => false)", (b,))
    load(name, path, "@pgsched.job(every='5 minutes', name='a')\ndef a(run): pass\n")
    assert sorted((n, a) for _, n, a in deploy(db, [name])) == [("a", "unchanged"), ("b", "disabled")]
    state, reason = conn.execute("SELECT state, disabled_reason FROM job_stats WHERE job_id = %s", (b,)).fetchone() \
        or (None, None)
    assert state == "disabled" and reason.startswith(f"{name}.b is no longer in the code of module {name} (deployed ")
    assert reason.endswith("; it was paused before: paused")
    assert one(conn, "SELECT scheduled FROM pgsched.job WHERE job_id = %s", b) is False
    # Said once: the next deploys leave it as it is.
    assert sorted((n, a) for _, n, a in deploy(db, [name])) == [("a", "unchanged")]
    assert one(conn, "SELECT disabled_reason FROM job_stats WHERE job_id = %s", b) == reason


def test_the_same_jobs_deployed_before_by_another_role_are_paused_with_the_reason(
        db: str, conn: Conn, versioned_app: tuple[str, Path]) -> None:
    """`serve` once run as another role deployed the module's jobs as that role's: keyed by owner,
    the next deploy made new ones and every instance with the module ran both, each plan twice
    (review of 2026-11-29). The last deploy pauses the other role's, saying why."""
    from psycopg import sql

    from tests.integration.test_security import dsn_as

    name, path = versioned_app
    load(name, path, "@pgsched.job(every='5 minutes', name='a')\ndef a(run): pass\n")
    other = f"deployer_{uuid.uuid4().hex[:8]}"
    # A catalog administrator (it may become the tables' owner and has its rights), as a
    # scheduler's role set up by a superuser's init would be.
    conn.execute(sql.SQL("CREATE ROLE {} LOGIN IN ROLE postgres").format(sql.Identifier(other)))
    try:
        assert [a for _, _, a in deploy(dsn_as(db, other), [name])] == ["inserted"]
        theirs = one(conn, "SELECT job_id FROM pgsched.job WHERE job_name = 'a' AND owner = %s::regrole", other)
        assert sorted((n, a) for _, n, a in deploy(db, [name])) == [("a", "disabled"), ("a", "inserted")]
        ours = one(conn, "SELECT job_id FROM pgsched.job WHERE job_name = 'a' AND owner = 'postgres'::regrole")
        rows = conn.execute("SELECT job_id, state, disabled_reason FROM job_stats WHERE job_name = 'a' "
                            "ORDER BY job_id").fetchall()
        assert [(r[0], r[1]) for r in rows] == [(theirs, "disabled"), (ours, "scheduled")]
        assert rows[0][2].startswith(f"superseded by the job {ours} of the same name that role postgres deployed (")
        assert sorted(a for _, _, a in deploy(db, [name])) == ["unchanged"]  # said once
    finally:
        conn.execute("DELETE FROM pgsched.job")
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(other)))


def test_a_pause_with_alter_job_lasts_until_the_next_deploy(db: str, conn: Conn) -> None:
    deploy(db, [DEMO])
    ok = job_id(conn, "demo.ok")
    conn.execute("SELECT alter_job(%s, scheduled => false)", (ok,))
    assert one(conn, "SELECT state FROM job_stats WHERE job_id = %s", ok) == "disabled"
    deploy(db, [DEMO])
    assert one(conn, "SELECT state FROM job_stats WHERE job_id = %s", ok) == "scheduled"


def test_concurrent_deploys_of_two_versions_leave_one_consistent_catalog(db: str, conn: Conn) -> None:
    def spec(version: int) -> dict[str, Any]:
        row = app.REGISTRY["demo.ok"].catalog_row()
        return {**row, "job_name": "shared", "schedule": f"00:0{version}:00", "config": {"v": version}}

    errors: list[BaseException] = []

    def deploy_version(version: int) -> None:
        try:
            for _ in range(10):
                store = Store(db, DbClock())
                try:
                    store.deploy([DEMO], [spec(version)])
                finally:
                    store.close()
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=deploy_version, args=(v,)) for v in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    rows = conn.execute("SELECT schedule, config FROM pgsched.jobs WHERE job_name = 'shared'").fetchall()
    assert len(rows) == 1
    version = rows[0][1]["v"]
    assert rows[0][0] == f"00:0{version}:00"  # one version, whole
    assert one(conn, "SELECT count(*) FROM pgsched.job_stat") == one(conn, "SELECT count(*) FROM pgsched.job")


def test_a_python_name_already_used_by_a_sql_job_is_refused(db: str, conn: Conn) -> None:
    conn.execute("SELECT schedule('demo.ok', '1 hour', 'SELECT 1')")
    with pytest.raises(psycopg.errors.DuplicateObject, match="already the name of command job"):
        deploy(db, [DEMO])


SETTINGS = "SELECT catch_up_window, max_plans_per_tick, schedule_delay, allow_stale_reentry FROM pgsched.jobs " \
    "WHERE job_name = %s"


def test_deploy_writes_the_lease_and_catch_up_settings(db: str, conn: Conn, versioned_app: tuple[str, Path]) -> None:
    name, path = versioned_app
    origin = datetime(2100, 1, 1, tzinfo=UTC)

    def release(settings: str) -> list[str]:
        load(name, path, f"import datetime\n\n@pgsched.job(every='1 hour', name='s', initial_start="
                         f"datetime.datetime(2100, 1, 1, tzinfo=datetime.timezone.utc){settings})\ndef s(run): pass\n")
        return [a for _, _, a in deploy(db, [name])]

    def next_start() -> Any:
        return one(conn, "SELECT next_start FROM job_stats WHERE job_name = 's'")

    assert release(", catch_up_window='2 hours', max_plans_per_tick=7, schedule_delay='5 minutes', "
                   "allow_stale_reentry=True") == ["inserted"]
    assert conn.execute(SETTINGS, ("s",)).fetchone() == (timedelta(hours=2), 7, timedelta(minutes=5), True)
    assert next_start() == origin + timedelta(minutes=5)  # eligible: plan time + schedule_delay
    assert release(", catch_up_window='2 hours', max_plans_per_tick=7, schedule_delay='5 minutes', "
                   "allow_stale_reentry=True") == ["unchanged"]
    # each setting alone is a change; a new delay moves next_start, the others do not
    assert release(", catch_up_window='2 hours', max_plans_per_tick=7, schedule_delay='20 minutes', "
                   "allow_stale_reentry=True") == ["updated"]
    assert next_start() == origin + timedelta(minutes=20)
    assert release(", catch_up_window='3 hours', max_plans_per_tick=7, schedule_delay='20 minutes', "
                   "allow_stale_reentry=True") == ["updated"]
    assert release(", catch_up_window='3 hours', max_plans_per_tick=8, schedule_delay='20 minutes', "
                   "allow_stale_reentry=True") == ["updated"]
    assert release(", catch_up_window='3 hours', max_plans_per_tick=8, schedule_delay='20 minutes'") == ["updated"]
    assert conn.execute(SETTINGS, ("s",)).fetchone() == (timedelta(hours=3), 8, timedelta(minutes=20), False)
    assert next_start() == origin + timedelta(minutes=20)
    # back to the defaults: written as such, and the plan is eligible at its time again
    assert release("") == ["updated"]
    assert conn.execute(SETTINGS, ("s",)).fetchone() == (None, 100, timedelta(0), False)
    assert next_start() == origin
    # a new schedule and a new delay together: the new first start plus the new delay
    load(name, path, "import datetime\n\n@pgsched.job(every='1 hour', name='s', schedule_delay='1 minute', "
                     "initial_start=datetime.datetime(2100, 2, 1, tzinfo=datetime.timezone.utc))\ndef s(run): pass\n")
    assert [a for _, _, a in deploy(db, [name])] == ["updated"]
    assert next_start() == datetime(2100, 2, 1, 0, 1, tzinfo=UTC)


def test_a_spec_without_the_new_settings_gets_the_defaults(db: str, conn: Conn) -> None:
    row = app.REGISTRY["demo.ok"].catalog_row()
    for key in ("catch_up_window", "max_plans_per_tick", "schedule_delay", "allow_stale_reentry", "scope_query"):
        row.pop(key)
    store = Store(db, DbClock())
    try:
        assert [a for _, _, a in store.deploy([DEMO], [row])] == ["inserted"]
    finally:
        store.close()
    assert conn.execute(SETTINGS, ("demo.ok",)).fetchone() == (None, 100, timedelta(0), False)
    assert one(conn, "SELECT scope_query FROM pgsched.jobs WHERE job_name = 'demo.ok'") is None


def test_deploy_writes_the_scope_query(db: str, conn: Conn, versioned_app: tuple[str, Path]) -> None:
    name, path = versioned_app
    conn.execute("CREATE TABLE regions (name text)")

    def release(settings: str) -> list[str]:
        load(name, path, f"@pgsched.job(every='1 hour', name='s'{settings})\ndef s(run): pass\n")
        return [a for _, _, a in deploy(db, [name])]

    def stored() -> Any:
        return one(conn, "SELECT scope_query FROM pgsched.jobs WHERE job_name = 's'")

    assert release(", scope_query='SELECT name FROM regions'") == ["inserted"]
    assert stored() == "SELECT name FROM regions"
    next_start = one(conn, "SELECT next_start FROM job_stats WHERE job_name = 's'")
    assert release(", scope_query='SELECT name FROM regions'") == ["unchanged"]
    assert release(", scope_query=\"SELECT name FROM regions WHERE name <> 'x'\"") == ["updated"]
    assert stored() == "SELECT name FROM regions WHERE name <> 'x'"
    assert one(conn, "SELECT next_start FROM job_stats WHERE job_name = 's'") == next_start  # same schedule
    # an unchanged query is not planned again: a deploy does not fail on what broke since
    conn.execute("DROP TABLE regions")
    assert release(", scope_query=\"SELECT name FROM regions WHERE name <> 'x'\"") == ["unchanged"]
    # a new query is, and a deploy that fails writes nothing
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=r"invalid scope_query: .*regions"):
        release(", scope_query='SELECT name FROM regions'")
    assert stored() == "SELECT name FROM regions WHERE name <> 'x'"
    # left out of the code: not scoped any more (a deploy writes every setting)
    assert release("") == ["updated"]
    assert stored() is None
    assert release("") == ["unchanged"]


@pytest.mark.parametrize(("query", "sqlstate"), [
    ("", "22023"), ("  ", "22023"), ("SELECT 1 FROM", "22023"), ("SELECT k FROM no_such_table", "22023"),
    ("SELECT 1; SELECT 2", "22023"), ("x" * 10_001, "22023"),
])
def test_a_deploy_with_a_bad_scope_query_writes_nothing(db: str, conn: Conn, query: str, sqlstate: str) -> None:
    good = app.REGISTRY["demo.boom"].catalog_row()
    bad = {**app.REGISTRY["demo.ok"].catalog_row(), "scope_query": query}
    store = Store(db, DbClock())
    try:
        with pytest.raises(psycopg.Error) as e:
            store.deploy([DEMO], [good, bad])
    finally:
        store.close()
    assert e.value.sqlstate == sqlstate and "scope_query" in (e.value.diag.message_primary or "")
    assert one(conn, "SELECT count(*) FROM pgsched.job") == 0


@pytest.mark.parametrize(("setting", "value", "sqlstate"), [
    ("max_plans_per_tick", 0, "22023"), ("max_plans_per_tick", None, "22004"),
    ("schedule_delay", "-1 minute", "22023"), ("schedule_delay", "1 month", "22023"),
    ("schedule_delay", None, "22004"), ("catch_up_window", "0", "22023"), ("allow_stale_reentry", None, "22004"),
])
def test_a_deploy_with_a_bad_setting_writes_nothing(db: str, conn: Conn, setting: str, value: Any,
                                                    sqlstate: str) -> None:
    good = app.REGISTRY["demo.boom"].catalog_row()
    bad = {**app.REGISTRY["demo.ok"].catalog_row(), setting: value}
    store = Store(db, DbClock())
    try:
        with pytest.raises(psycopg.Error) as e:
            store.deploy([DEMO], [good, bad])
    finally:
        store.close()
    assert e.value.sqlstate == sqlstate and setting in (e.value.diag.message_primary or "")
    assert one(conn, "SELECT count(*) FROM pgsched.job") == 0


# -- running handlers -----------------------------------------------------------------------------------

def test_a_handler_that_succeeds_commits_and_stores_its_result(db: str, py: Conn) -> None:
    run_now_and_wait(db, py, ["demo.ok"])
    h = last_run(py, "demo.ok")
    assert h["outcome"] == "success" and h["rows_affected"] == 1
    assert h["result"] == {"plan": h["plan_time"].isoformat(), "hello": "hi"}
    hit = py.execute("SELECT plan_time, attempt, config FROM py_hits WHERE job = 'demo.ok'").fetchone()
    assert hit == (h["plan_time"], 1, {"greeting": "hi"})
    assert h["worker_pid"] is not None and h["backend_pid"] is not None


def test_a_handler_that_raises_is_a_failure_with_type_message_and_traceback(db: str, py: Conn) -> None:
    run_now_and_wait(db, py, ["demo.boom"])
    h = last_run(py, "demo.boom")
    assert h["outcome"] == "failure" and h["sqlstate"] is None
    assert h["message"].startswith("ValueError: nope\nTraceback (most recent call last):")
    assert 'raise ValueError("nope")' in h["message"] and len(h["message"]) <= 4000
    assert one(py, "SELECT count(*) FROM py_hits WHERE job = 'demo.boom'") == 0  # rolled back
    st = py.execute("SELECT total_failures, total_crashes FROM job_stats WHERE job_name = 'demo.boom'").fetchone()
    assert st == (1, 0)


def test_a_handler_past_max_runtime_is_killed(db: str, py: Conn) -> None:
    t0 = time.monotonic()
    run_now_and_wait(db, py, ["demo.slow"], terminate_grace=0.5)
    assert time.monotonic() - t0 < 10
    h = last_run(py, "demo.slow")
    assert h["outcome"] == "timeout" and "exceeded max_runtime" in h["message"]
    with pytest.raises(ProcessLookupError):
        import os
        os.kill(h["worker_pid"], 0)


def test_heartbeat_renews_the_lease_through_a_long_run(db: str, py: Conn) -> None:
    run_now_and_wait(db, py, ["demo.beat"])
    row = py.execute("SELECT outcome, heartbeat_at - started_at FROM pgsched.job_run r JOIN pgsched.job j "
                     "USING (job_id) WHERE j.job_name = 'demo.beat'").fetchone()
    assert row is not None and row[0] == "success" and row[1].total_seconds() >= 0.8


def test_a_lost_lease_raises_in_the_handler(db: str, py: Conn) -> None:
    run_now_and_wait(db, py, ["demo.lease"])
    assert one(py, "SELECT count(*) FROM py_hits WHERE job = 'demo.lease lost'") == 1
    h = last_run(py, "demo.lease")
    # The run was closed by "another scheduler"; our failure report did not overwrite it.
    assert (h["outcome"], h["message"]) == ("crash", "closed by another scheduler")


@pytest.mark.parametrize("name", ["demo.exits", "demo.killed"])
def test_a_handler_that_kills_its_process_is_a_crash(db: str, py: Conn, name: str) -> None:
    run_now_and_wait(db, py, [name])
    h = last_run(py, name)
    assert h["outcome"] == "crash" and "during the run" in h["message"]
    st = py.execute("SELECT total_runs, total_crashes, consecutive_crashes, state FROM job_stats "
                    "WHERE job_name = %s", (name,)).fetchone()
    assert st == (1, 1, 1, "scheduled")


def test_sql_and_python_jobs_mix_in_one_serve(db: str, py: Conn) -> None:
    sql_job = one(py, "SELECT schedule('sql-side', '1 hour', 'INSERT INTO py_hits VALUES (''sql'', now(), 1, NULL)')")
    run_now_and_wait(db, py, ["demo.ok", "sql-side"])
    assert one(py, "SELECT outcome FROM job_history WHERE job_id = %s", sql_job) == "success"
    assert last_run(py, "demo.ok")["outcome"] == "success"


def test_run_job_in_sql_points_to_the_cli_for_python_jobs(db: str, conn: Conn) -> None:
    deploy(db, [DEMO])
    with pytest.raises(psycopg.errors.FeatureNotSupported, match="pgsched run"):
        conn.execute("CALL run_job(%s)", (job_id(conn, "demo.ok"),))


def test_pgsched_run_of_a_python_job_runs_as_its_owner_in_its_database(db: str, conn: Conn,
                                                                       pg_server: PgServer) -> None:
    """`pgsched run` (pyjob.run_now) hands the handler a session of the job's owner in the job's
    database, as a worker would, not the caller's session: the caller only marks the run."""
    from pgsched import pyjob

    other = pg_server.create_db(template=None)
    role = f"Py Owner-{uuid.uuid4().hex[:8]}"  # a name regrole's text would quote
    hits = ("CREATE TABLE py_hits (job text, plan_time timestamptz, attempt int, config jsonb, "
            "who name DEFAULT session_user, acting name DEFAULT current_user, db name DEFAULT current_database())")
    conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    try:
        with psycopg.connect(pg_server.dsn(other), autocommit=True) as there:
            there.execute(hits)
            there.execute(sql.SQL("GRANT INSERT ON py_hits TO {}").format(sql.Identifier(role)))
        deploy(db, [DEMO])
        j = job_id(conn, "demo.ok")
        conn.execute("UPDATE pgsched.job SET owner = (SELECT oid FROM pg_roles WHERE rolname = %s), database = %s "
                     "WHERE job_id = %s", (role, other, j))
        # An operator in public that matches oid = regrole better than pg_catalog's: never called.
        conn.execute("CREATE TABLE public.hijacked (n int)")
        conn.execute("CREATE FUNCTION public.eq_hijack(oid, regrole) RETURNS boolean LANGUAGE sql "
                     "AS $$ INSERT INTO public.hijacked VALUES (1) RETURNING $1 = $2::oid $$")
        conn.execute("CREATE OPERATOR public.= (LEFTARG = oid, RIGHTARG = regrole, FUNCTION = public.eq_hijack)")
        result = pyjob.run_now(db, j)
        assert one(conn, "SELECT count(*) FROM public.hijacked") == 0
        conn.execute("DROP OPERATOR public.= (oid, regrole)")
        conn.execute("DROP FUNCTION public.eq_hijack(oid, regrole)")
        conn.execute("DROP TABLE public.hijacked")
        assert result.ok, result.message
        with psycopg.connect(pg_server.dsn(other), autocommit=True) as there:
            rows = there.execute("SELECT job, plan_time, who, acting, db FROM py_hits").fetchall()
        plan = one(conn, "SELECT plan_time FROM job_history WHERE job_id = %s AND trigger = 'manual' "
                         "AND outcome = 'success'", j)
        assert rows == [("demo.ok", plan, role, role, other)]
        # A role the owner's session cannot be opened as records no run and says why.
        conn.execute(sql.SQL("ALTER ROLE {} NOLOGIN").format(sql.Identifier(role)))
        with pytest.raises(app.JobDeclarationError, match=f"cannot open a session as the job's owner {role} "
                                                          f"in database {other}"):
            pyjob.run_now(db, j)
        assert one(conn, "SELECT count(*) FROM job_history WHERE job_id = %s", j) == 1
    finally:
        conn.execute("DELETE FROM pgsched.job WHERE code_module = %s", (DEMO,))
        pg_server.drop_db(other)
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
