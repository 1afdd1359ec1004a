"""trigger_job and cancel_job (sql/api/50_requests.sql, pgsched/requests.py): a scheduler starts
the manual run a trigger asks for (once, however many schedulers hear it) and cancels the run
a cancel names; a role that may not act for the job is told the job does not exist, and a
notification it sends on pgsched_catalog itself (pg_notify is open to every role) starts,
cancels and names nothing: the request is the row trigger_job or cancel_job wrote."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

import tests.apps.demo_jobs  # noqa: F401  (registers the demo handlers)
from pgsched.scheduler import Scheduler, Settings
from tests.integration.test_code_jobs import DEMO, deploy
from tests.integration.test_scheduler import Conn, one, runs_of


def serve_with(db: str, until: Any, timeout: float = 20.0, **settings: Any) -> None:
    deadline = time.monotonic() + timeout
    opts: dict[str, Any] = {"max_workers": 2, "crash_wait": 1.0, "safety_interval": 0.2, **settings}
    Scheduler(Settings(dsn=db, **opts)).run(until=lambda: until() or time.monotonic() > deadline)


def alive(conn: Conn, n: int = 1) -> bool:
    return bool(one(conn, "SELECT count(*) >= %s FROM pgsched.instances WHERE alive", n))


def test_trigger_runs_the_job_once_as_manual_and_keeps_its_schedule(db: str, jobs: Conn) -> None:
    j = one(jobs, "SELECT add_job('hit', '1 hour', initial_start => now() + interval '1 day')")
    paused = one(jobs, "SELECT add_job('hit', '1 hour', scheduled => false)")
    before = one(jobs, "SELECT next_start FROM job_stats WHERE job_id = %s", j)
    asked: list[Any] = []

    def until() -> bool:
        if not asked and alive(jobs, 2):
            asked.extend(one(jobs, "SELECT trigger_job(%s)", k) for k in (j, paused))
        return bool(asked) and runs_of(jobs, j, "success") + runs_of(jobs, paused, "success") >= 2

    # Two schedulers hear each request: each job still runs once.
    other = threading.Thread(target=serve_with, args=(db, lambda: runs_of(jobs, paused, "success") >= 1))
    other.start()
    try:
        serve_with(db, until)
    finally:
        other.join()
    time.sleep(0.5)  # a second start, were there one, would have happened by now
    for k, plan in zip((j, paused), asked, strict=True):
        rows = jobs.execute("SELECT trigger, plan_time, outcome FROM job_history WHERE job_id = %s", (k,)).fetchall()
        assert rows == [("manual", plan, "success")]
    assert one(jobs, "SELECT count(*) FROM hits") == 2
    st = jobs.execute("SELECT next_start, state, total_runs FROM job_stats WHERE job_id = %s", (j,)).fetchone()
    assert st == (before, "scheduled", 1)
    assert one(jobs, "SELECT state FROM job_stats WHERE job_id = %s", paused) == "disabled"


def test_trigger_of_a_python_job_runs_on_the_instance_with_its_module(db: str, conn: Conn) -> None:
    conn.execute("CREATE TABLE py_hits (job text, plan_time timestamptz, attempt int, config jsonb)")
    deploy(db, [DEMO])
    j = one(conn, "SELECT job_id FROM pgsched.jobs WHERE job_name = 'demo.ok'")
    asked: list[Any] = []

    def until() -> bool:
        if not asked and alive(conn):
            asked.append(one(conn, "SELECT trigger_job(%s)", j))
        return bool(asked) and runs_of(conn, j, "success") >= 1

    serve_with(db, until, apps=(DEMO,))
    assert conn.execute("SELECT trigger, plan_time FROM job_history WHERE job_id = %s", (j,)).fetchall() == [
        ("manual", asked[0])]
    assert one(conn, "SELECT count(*) FROM py_hits WHERE job = 'demo.ok'") == 1


def test_trigger_while_running_starts_after_the_run(db: str, jobs: Conn) -> None:
    j = one(jobs, "SELECT add_job('nap', '1 hour', config => '{\"s\": 0.5}', initial_start => now())")
    asked: list[Any] = []

    def until() -> bool:
        if not asked and one(jobs, "SELECT state FROM job_stats WHERE job_id = %s", j) == "starting":
            asked.append(one(jobs, "SELECT trigger_job(%s)", j))
        return bool(asked) and runs_of(jobs, j, "success") >= 2

    serve_with(db, until)
    rows = jobs.execute("SELECT trigger, outcome FROM job_history WHERE job_id = %s ORDER BY run_id",
                        (j,)).fetchall()
    assert rows == [("schedule", "success"), ("manual", "success")]


def test_cancel_ends_the_run_in_progress_as_cancelled(db: str, jobs: Conn) -> None:
    j = one(jobs, "SELECT add_job('nap', '1 hour', config => '{\"s\": 30}', initial_start => now())")
    idle = one(jobs, "SELECT add_job('hit', '1 hour', initial_start => now() + interval '1 day')")
    assert jobs.execute("SELECT * FROM cancel_job(%s)", (idle,)).fetchall() == []
    asked: list[int] = []

    def until() -> bool:
        if not asked and one(jobs, "SELECT state FROM job_stats WHERE job_id = %s", j) == "starting":
            asked.extend(r[0] for r in jobs.execute("SELECT * FROM cancel_job(%s)", (j,)))
        return bool(asked) and runs_of(jobs, j, "cancelled") >= 1

    started = time.monotonic()
    serve_with(db, until)
    assert time.monotonic() - started < 10
    row = jobs.execute("SELECT run_id, outcome, message FROM job_history WHERE job_id = %s", (j,)).fetchone()
    assert row is not None and [row[0]] == asked and row[1] == "cancelled"
    assert "cancelled by" in row[2] and "cancel_job" in row[2]
    assert one(jobs, "SELECT state FROM job_stats WHERE job_id = %s", j) == "scheduled"
    assert one(jobs, "SELECT count(*) FROM hits") == 0


@pytest.fixture
def stranger(db: str, conn: Conn) -> Iterator[Conn]:
    """A login role that owns no job and is no member of anyone's."""
    name = f"stranger_{uuid.uuid4().hex[:8]}"
    conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)))
    params = psycopg.conninfo.conninfo_to_dict(db)
    params["user"] = name
    try:
        with psycopg.connect(psycopg.conninfo.make_conninfo(**params), autocommit=True) as c:  # type: ignore[arg-type]
            yield c
    finally:
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def test_a_role_that_may_not_act_for_the_job_is_told_it_does_not_exist(jobs: Conn, stranger: Conn) -> None:
    j = one(jobs, "SELECT add_job('hit', '1 hour')")
    for call in ("SELECT pgsched.trigger_job(%s)", "SELECT * FROM pgsched.cancel_job(%s)"):
        with pytest.raises(psycopg.errors.UndefinedObject, match=f"job {j} not found"):
            stranger.execute(call, (j,))
    with pytest.raises(psycopg.errors.NullValueNotAllowed):
        jobs.execute("SELECT trigger_job(NULL)")
    with pytest.raises(psycopg.errors.UndefinedObject):
        jobs.execute("SELECT trigger_job(999999)")


def forge(role: Conn, *payloads: str) -> None:
    """Notifications on the schedulers' channel, as any role that can connect may send them."""
    for payload in payloads:
        role.execute("SELECT pg_notify('pgsched_catalog', %s)", (payload,))


def micros(t: datetime) -> int:
    """An instant as the old trigger payload named it: microseconds since the epoch."""
    return (t - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)


def test_a_forged_trigger_starts_nothing_and_a_real_one_still_runs(db: str, jobs: Conn, stranger: Conn) -> None:
    paused = one(jobs, "SELECT add_job('hit', '1 hour', scheduled => false)")
    later = one(jobs, "SELECT add_job('hit', '1 hour', initial_start => now() + interval '1 day')")
    real = one(jobs, "SELECT add_job('hit', '1 hour', initial_start => now() + interval '1 day')")
    slot = one(jobs, "SELECT next_start FROM job_stats WHERE job_id = %s", later)
    asked: list[Any] = []
    replayed: list[float] = []

    def until() -> bool:
        if not asked and alive(jobs):
            # The payloads trigger_job used to send (the paused job now; the other at its next
            # slot, which would then never run as scheduled), and ids of requests that may exist.
            forge(stranger, f"trigger:{paused}:{micros(one(jobs, 'SELECT clock_timestamp()'))}",
                  f"trigger:{later}:{micros(slot)}",
                  # ids no request has, which must not reach the database either ('²'.isdigit(),
                  # and a number psycopg would send as numeric[]): the scheduler carries on
                  "request:\u00b2", "request:99999999999999999999", "request:-1", "request:0", "request:",
                  *(f"request:{k}" for k in range(1, 20)))
            asked.append(one(jobs, "SELECT trigger_job(%s)", real))
        if asked and not replayed and runs_of(jobs, real, "success") >= 1:
            # the real request's id, heard again: it was started, so its row is gone
            forge(stranger, *(f"request:{k}" for k in range(1, 20)))
            replayed.append(time.monotonic())
        return bool(replayed) and time.monotonic() > replayed[0] + 1.0

    serve_with(db, until)
    assert replayed, "the real trigger did not run"
    assert jobs.execute("SELECT trigger, plan_time, outcome FROM job_history WHERE job_id = %s",
                        (real,)).fetchall() == [("manual", asked[0], "success")]
    assert runs_of(jobs, paused) == runs_of(jobs, later) == 0
    assert one(jobs, "SELECT count(*) FROM hits") == 1
    assert jobs.execute("SELECT next_start, total_runs FROM job_stats WHERE job_id = %s", (later,)).fetchone() == (
        slot, 0)
    assert one(jobs, "SELECT count(*) FROM pgsched.request") == 0


def test_a_forged_cancel_cancels_nothing_and_names_nobody(db: str, jobs: Conn, stranger: Conn) -> None:
    j = one(jobs, "SELECT add_job('nap', '1 hour', config => '{\"s\": 30}', initial_start => now())")
    me = one(jobs, "SELECT session_user")
    forged: list[float] = []
    before_real: list[str] = []

    def until() -> bool:
        run = jobs.execute("SELECT run_id FROM job_history WHERE job_id = %s AND outcome = 'running'",
                           (j,)).fetchone()
        if not forged and run is not None:
            forge(stranger, f"cancel:{run[0]}:mallory", *(f"request:{k}" for k in range(1, 20)))
            forged.append(time.monotonic())
        if forged and not before_real and time.monotonic() > forged[0] + 1.5:
            before_real.append(one(jobs, "SELECT outcome FROM job_history WHERE job_id = %s", j))
            jobs.execute("SELECT * FROM cancel_job(%s)", (j,)).fetchall()
        return bool(before_real) and runs_of(jobs, j, "cancelled") >= 1

    serve_with(db, until)
    assert before_real == ["running"], "the forged cancel stopped the run"
    [(outcome, message)] = jobs.execute("SELECT outcome, message FROM job_history WHERE job_id = %s", (j,)).fetchall()
    assert outcome == "cancelled" and f"cancelled by {me} (cancel_job)" in message and "mallory" not in message


def test_requests_are_written_only_by_the_request_functions(jobs: Conn, stranger: Conn) -> None:
    j = one(jobs, "SELECT add_job('hit', '1 hour')")
    for statement in ("SELECT * FROM pgsched.request",
                      f"INSERT INTO pgsched.request (kind, job_id, plan_time, requested_by) "
                      f"VALUES ('trigger', {j}, now(), 'mallory')",
                      "DELETE FROM pgsched.request"):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            stranger.execute(statement)
    plan = one(jobs, "SELECT trigger_job(%s)", j)
    me = one(jobs, "SELECT session_user")
    assert jobs.execute("SELECT kind, job_id, plan_time, run_id, requested_by FROM pgsched.request").fetchall() == [
        ("trigger", j, plan, None, me)]


def test_a_request_past_its_ttl_is_not_acted_on_and_the_purge_deletes_it(jobs: Conn) -> None:
    j = one(jobs, "SELECT add_job('hit', '1 hour')")
    me = one(jobs, "SELECT instance_id FROM pgsched._register_instance_v2('h', 1, 'test', 4)")
    one(jobs, "SELECT trigger_job(%s)", j)
    request = one(jobs, "SELECT request_id FROM pgsched.request")
    assert [r[0] for r in jobs.execute("SELECT * FROM pgsched._requests(%s, %s)", ([request], me))] == [request]
    jobs.execute("UPDATE pgsched.request SET requested_at = requested_at - pgsched._request_ttl() - interval '1 s'")
    assert jobs.execute("SELECT * FROM pgsched._requests(%s, %s)", ([request], me)).fetchall() == []
    assert jobs.execute("SELECT * FROM pgsched._start_request(%s, %s, 100, 0)", (me, request)).fetchall() == []
    assert runs_of(jobs, j) == 0
    jobs.execute("SELECT * FROM pgsched.purge_history()")
    assert one(jobs, "SELECT count(*) FROM pgsched.request") == 0


def test_a_request_made_while_no_scheduler_listened_is_acted_on_when_one_starts(db: str, jobs: Conn) -> None:
    """Its notification went to nobody; a scheduler that starts within the request's TTL reads the row."""
    j = one(jobs, "SELECT add_job('hit', '1 hour', initial_start => now() + interval '1 day')")
    plan = one(jobs, "SELECT trigger_job(%s)", j)
    # Another job's trigger past its TTL, still in the table (the purge has not run): not started.
    stale = one(jobs, "SELECT add_job('hit', '1 hour', initial_start => now() + interval '1 day')")
    one(jobs, "SELECT trigger_job(%s)", stale)
    jobs.execute("UPDATE pgsched.request SET requested_at = requested_at - pgsched._request_ttl() "
                 "WHERE job_id = %s", (stale,))
    serve_with(db, lambda: runs_of(jobs, j, "success") >= 1, timeout=15)
    assert jobs.execute("SELECT trigger, plan_time, outcome FROM job_history WHERE job_id = %s",
                        (j,)).fetchall() == [("manual", plan, "success")]
    assert runs_of(jobs, stale, "success") == 0
    assert one(jobs, "SELECT count(*) FROM pgsched.request WHERE job_id = %s", j) == 0


def test_a_request_made_while_the_scheduler_was_cut_off_is_acted_on_when_it_reconnects(db: str, jobs: Conn) -> None:
    j = one(jobs, "SELECT add_job('hit', '1 hour', initial_start => now() + interval '1 day')")
    asked: list[Any] = []

    def until() -> bool:
        if not asked and alive(jobs):
            # The scheduler's own connection is gone (waited for) before the request is made.
            assert one(jobs, "SELECT bool_and(pg_terminate_backend(pid, 5000)) FROM pg_stat_activity "
                             "WHERE application_name = 'pgsched scheduler'")
            asked.append(one(jobs, "SELECT trigger_job(%s)", j))
        return bool(asked) and runs_of(jobs, j, "success") >= 1

    serve_with(db, until, timeout=15)
    assert jobs.execute("SELECT trigger, plan_time, outcome FROM job_history WHERE job_id = %s",
                        (j,)).fetchall() == [("manual", asked[0], "success")]
