"""Owner isolation through jobs the scheduler runs (issue 5): each job in a session of its owner.

The scheduler here runs as a non-superuser role that owns the catalog and has only
pg_signal_backend and pg_read_all_stats besides (docs/security.md). Every escape
attempt of tests/integration/test_security.py is rerun as the command of a job of
alice's, run by that scheduler.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgsched.scheduler import Scheduler, Settings
from tests.conftest import PgServer
from tests.integration.helpers import Conn, rows, scalar
from tests.integration.test_security import PASSWORD, OwnerDb, escape_attempts, owner_database


@pytest.fixture(scope="module")
def odb(pg_server: PgServer) -> Iterator[OwnerDb]:
    with owner_database(pg_server) as found, psycopg.connect(pg_server.admin_dsn, autocommit=True) as admin:
        # What the scheduler's role needs besides owning the catalog (docs/security.md).
        admin.execute(sql.SQL("GRANT pg_signal_backend, pg_read_all_stats TO {}").format(
            sql.Identifier(found.scheduler)))
        yield found


@pytest.fixture
def admin(odb: OwnerDb) -> Iterator[Conn]:
    with odb.connect() as conn:
        yield conn
        conn.execute("DELETE FROM pgsched.job")
        conn.execute("DELETE FROM public.ran")


def serve_as_scheduler(odb: OwnerDb, until: Callable[[], bool], timeout: float = 30.0, **settings: Any) -> None:
    deadline = time.monotonic() + timeout
    opts: dict[str, Any] = {"max_workers": 2, "crash_wait": 1.0, "safety_interval": 0.2, **settings}
    Scheduler(Settings(dsn=odb.dsn(odb.scheduler), **opts)).run(
        until=lambda: until() or time.monotonic() > deadline)


def ended(conn: Conn, job_ids: list[int]) -> bool:
    n = scalar(conn, "SELECT count(DISTINCT job_id) FROM pgsched.job_run WHERE job_id = ANY(%s) "
                     "AND outcome <> 'running'", (job_ids,))
    return int(str(n)) == len(job_ids)


def test_scheduled_jobs_run_as_their_owner_and_cannot_become_anyone_else(odb: OwnerDb, admin: Conn) -> None:
    with odb.connect(odb.alice) as alice:
        jobs: dict[int, tuple[str, str | None]] = {}
        for stmt, expected in escape_attempts(odb):
            if stmt.startswith(("DISCARD", "SET LOCAL", "SET row_security", "SET SESSION AUTHORIZATION DEFAULT",
                                "RESET SESSION")):
                continue  # not allowed in a multi-statement command, or nothing to check there
            command = f"{stmt}; INSERT INTO public.ran VALUES (0, current_user || '/' || session_user, 'escape')"
            j = int(str(scalar(alice, "SELECT pgsched.schedule(%s, '1 hour', %s)", (stmt[:60], command))))
            jobs[j] = (stmt, expected)
        who = int(str(scalar(alice, "SELECT pgsched.schedule('who', '1 hour', %s)",
                             ("INSERT INTO public.ran SELECT 0, current_user || '/' || session_user, 'who'",))))
        secret = int(str(scalar(alice, "SELECT pgsched.schedule('secret', '1 hour', "
                                       "'SELECT public.job_secret(1, NULL)')")))
    serve_as_scheduler(odb, lambda: ended(admin, [*jobs, who, secret]))
    for j, (stmt, expected) in jobs.items():
        h = rows(admin, "SELECT outcome, sqlstate FROM pgsched.job_history WHERE job_id = %s", (j,))
        want = {"outcome": "success", "sqlstate": None} if expected is None else \
            {"outcome": "failure", "sqlstate": expected}
        assert h == [want], stmt
    assert rows(admin, "SELECT outcome, sqlstate FROM pgsched.job_history WHERE job_id = %s", (secret,)) == [
        {"outcome": "failure", "sqlstate": "42501"}]
    # Everything that ran, ran with alice as session and current user: never the scheduler's role.
    ran = {r["who"] for r in rows(admin, "SELECT who FROM public.ran")}
    assert ran == {f"{odb.alice}/{odb.alice}"}
    assert rows(admin, "SELECT count(*) AS n FROM public.ran WHERE via = 'who'") == [{"n": 1}]


def test_the_least_privileged_scheduler_cancels_an_owners_run(odb: OwnerDb, admin: Conn) -> None:
    with odb.connect(odb.alice) as alice:
        j = int(str(scalar(alice, "SELECT pgsched.add_job('public.job_ok', '1 hour', max_runtime => '1 second')")))
        alice.execute("SELECT pgsched.alter_job(%s, next_start => now())", (j,))
        slow = int(str(scalar(alice, "SELECT pgsched.schedule('slow', '1 hour', 'SELECT pg_sleep(30)')")))
        alice.execute("UPDATE pgsched.job SET max_runtime = '1 second' WHERE job_id = %s", (slow,))
    t0 = time.monotonic()
    serve_as_scheduler(odb, lambda: ended(admin, [slow]), terminate_grace=0.5)
    assert time.monotonic() - t0 < 10
    h = rows(admin, "SELECT outcome, backend_pid FROM pgsched.job_history WHERE job_id = %s", (slow,))
    assert h[0]["outcome"] == "timeout"
    assert rows(admin, "SELECT count(*) AS n FROM pg_stat_activity WHERE query LIKE '%%pg_sleep(30)%%' "
                       "AND pid <> pg_backend_pid()") == [{"n": 0}]


def test_an_owner_that_was_dropped_or_lost_login_disables_only_its_job(odb: OwnerDb, admin: Conn,
                                                                      pg_server: PgServer) -> None:
    carol, dave = f"carol_{uuid.uuid4().hex[:8]}", f"dave_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_server.admin_dsn, autocommit=True) as su:
        for role in (carol, dave):
            su.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(role),
                                                                         sql.Literal(PASSWORD)))
    try:
        job_of: dict[str, int] = {}
        for role in (carol, dave):
            with odb.connect(role) as c:
                job_of[role] = int(str(scalar(c, "SELECT pgsched.schedule('mine', '1 hour', 'SELECT 1')")))
        with odb.connect(odb.alice) as alice:
            ok = int(str(scalar(alice, "SELECT pgsched.schedule('fine', '1 second', "
                                       "'INSERT INTO public.ran VALUES (1, current_user, ''fine'')')")))
        with psycopg.connect(pg_server.admin_dsn, autocommit=True) as su:
            su.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(carol)))
            su.execute(sql.SQL("ALTER ROLE {} NOLOGIN").format(sql.Identifier(dave)))

        def done() -> bool:
            states = {r["job_id"]: r["state"] for r in rows(admin, "SELECT job_id, state FROM pgsched.job_stats")}
            fine_runs = scalar(admin, "SELECT count(*) FROM pgsched.job_run WHERE job_id = %s "
                                      "AND outcome = 'success'", (ok,))
            return states.get(job_of[carol]) == "disabled" and states.get(job_of[dave]) == "disabled" \
                and int(str(fine_runs)) >= 2

        serve_as_scheduler(odb, done)
        reasons = {r["job_id"]: r["disabled_reason"] for r in rows(
            admin, "SELECT job_id, disabled_reason FROM pgsched.job_stats WHERE state = 'disabled'")}
        assert "owner role no longer exists" in reasons[job_of[carol]]
        assert "cannot open a session as the job's owner" in reasons[job_of[dave]]
        assert rows(admin, "SELECT outcome FROM pgsched.job_history WHERE job_id = %s", (job_of[dave],)) == [
            {"outcome": "failure"}]
        assert int(str(scalar(admin, "SELECT total_crashes + total_failures FROM pgsched.job_stats "
                                     "WHERE job_id = %s", (ok,)))) == 0
    finally:
        with psycopg.connect(pg_server.admin_dsn, autocommit=True) as su:
            su.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(carol)))
            admin.execute("DELETE FROM pgsched.job WHERE job_id = %s", (job_of.get(dave, 0),))
            su.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(dave)))


def test_the_scheduler_password_is_never_logged_or_stored(odb: OwnerDb, admin: Conn,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    with odb.connect(odb.alice) as alice:
        bad = int(str(scalar(alice, "SELECT pgsched.schedule('bad', '1 hour', 'SELECT 1/0')")))
    with caplog.at_level(logging.DEBUG):
        serve_as_scheduler(odb, lambda: ended(admin, [bad]))
        # The path that does print a DSN: a server the scheduler cannot reach.
        params = psycopg.conninfo.conninfo_to_dict(odb.dsn(odb.scheduler))
        unreachable = psycopg.conninfo.make_conninfo(**{**{k: str(v) for k, v in params.items()}, "port": "1"})
        t0 = time.monotonic()
        Scheduler(Settings(dsn=unreachable, max_workers=1)).run(until=lambda: time.monotonic() - t0 > 1)
    assert PASSWORD in odb.dsn(odb.scheduler)
    assert "cannot connect to" in caplog.text and "password=***" in caplog.text
    assert PASSWORD not in caplog.text
    stored = rows(admin, "SELECT coalesce(string_agg(coalesce(message, ''), ' '), '') AS m FROM pgsched.job_run")
    assert PASSWORD not in stored[0]["m"]
    assert PASSWORD not in str(rows(admin, "SELECT * FROM pgsched.instance"))


def test_the_least_privileged_scheduler_reads_requests_as_their_owner_and_ignores_forged_ones(
        odb: OwnerDb, admin: Conn) -> None:
    """trigger_job and cancel_job write rows (pgsched.request) that this scheduler's role reads as
    the owner of the catalog, with no grant; bob, who may notify on the channel like anyone, starts
    and cancels nothing of alice's (sql/api/50_requests.sql)."""
    tag = uuid.uuid4().hex[:8]
    with odb.connect(odb.alice) as alice, odb.connect(odb.bob) as bob:
        asked = int(str(scalar(alice, "SELECT pgsched.add_job('public.job_ok', '1 hour', scheduled => false)")))
        other = int(str(scalar(alice, "SELECT pgsched.add_job('public.job_ok', '1 hour', scheduled => false)")))
        slow = int(str(scalar(alice, "SELECT pgsched.schedule(%s, '1 hour', 'SELECT pg_sleep(30)')",
                              (f"slow-{tag}",))))
        forged: list[float] = []
        before_cancel: list[str] = []

        def until() -> bool:
            run = scalar(admin, "SELECT max(run_id) FROM pgsched.job_run WHERE job_id = %s AND outcome = 'running'",
                         (slow,))
            if not forged and run is not None:
                at = scalar(admin, "SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint")
                for payload in (f"trigger:{other}:{at}", f"cancel:{run}:{odb.bob}",
                                *(f"request:{k}" for k in range(1, 50))):
                    bob.execute("SELECT pg_notify('pgsched_catalog', %s)", (payload,))
                scalar(alice, "SELECT pgsched.trigger_job(%s)", (asked,))
                forged.append(time.monotonic())
            if forged and not before_cancel and time.monotonic() > forged[0] + 1.5:
                before_cancel.append(str(scalar(admin, "SELECT outcome FROM pgsched.job_run WHERE job_id = %s",
                                                (slow,))))
                alice.execute("SELECT * FROM pgsched.cancel_job(%s)", (slow,)).fetchall()
            return bool(before_cancel) and ended(admin, [slow, asked])

        serve_as_scheduler(odb, until)
    assert before_cancel == ["running"]
    assert rows(admin, "SELECT trigger, outcome FROM pgsched.job_run WHERE job_id = %s", (asked,)) == [
        {"trigger": "manual", "outcome": "success"}]
    assert rows(admin, "SELECT count(*) AS n FROM pgsched.job_run WHERE job_id = %s", (other,)) == [{"n": 0}]
    [h] = rows(admin, "SELECT outcome, message FROM pgsched.job_history WHERE job_id = %s", (slow,))
    assert h["outcome"] == "cancelled" and f"cancelled by {odb.alice} (cancel_job)" in h["message"], h
