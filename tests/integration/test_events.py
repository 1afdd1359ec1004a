"""Events on pgsched_events (README "Events"), received by a real LISTEN: a run that ends
other than in success and a job that becomes disabled send one; a success sends nothing."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from tests.integration.test_scheduler import Conn, one, runs_of, serve

MARKER = "marker"


def events(listener: Conn, sender: Conn, timeout: float = 5.0) -> list[dict[str, Any]]:
    """The events received so far, up to a marker `sender` sends now (commit order: no sleeping)."""
    sender.execute("SELECT pg_notify('pgsched_events', %s)", (MARKER,))
    out: list[dict[str, Any]] = []
    for n in listener.notifies(timeout=timeout):
        if n.payload == MARKER:
            return out
        out.append(json.loads(n.payload))
    raise AssertionError(f"marker not received within {timeout}s; got {out}")


@pytest.fixture
def listener(db: str) -> Any:
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("LISTEN pgsched_events")
        yield c


def test_failures_and_disable_are_announced_success_is_not(db: str, jobs: Conn, listener: Conn) -> None:
    bad = one(jobs, "SELECT add_job('fail', '1 hour', retry_period => '100 milliseconds', max_retries => 1)")
    good = one(jobs, "SELECT add_job('hit', '200 milliseconds')")
    serve(db, lambda: one(jobs, "SELECT state FROM job_stats WHERE job_id = %s", bad) == "disabled"
          and runs_of(jobs, good, "success") >= 3)
    got = events(listener, jobs)
    runs = jobs.execute("SELECT run_id, attempt, plan_time FROM job_history WHERE job_id = %s ORDER BY run_id",
                        (bad,)).fetchall()
    assert len(runs) == 2
    expected = [{"event": "run_end", "job_id": bad, "run_id": runs[0][0], "outcome": "failure", "attempt": 1},
                {"event": "run_end", "job_id": bad, "run_id": runs[1][0], "outcome": "failure", "attempt": 1},
                {"event": "job_disabled", "job_id": bad, "run_id": runs[1][0], "outcome": "failure", "attempt": 1}]
    assert [{k: v for k, v in e.items() if k != "plan_time"} for e in got] == expected
    # plan_time is the run's, as JSON text that PostgreSQL reads back to the same instant.
    for e, r in zip(got, [runs[0], runs[1], runs[1]], strict=True):
        assert one(jobs, "SELECT %s::timestamptz", e["plan_time"]) == r[2]
    # Ids only: no name, message or config.
    assert all(set(e) == {"event", "job_id", "run_id", "outcome", "attempt", "plan_time"} for e in got)
    assert not any(e["job_id"] == good for e in got)


def test_manual_run_failure_and_timeout_and_disable_without_run(db: str, jobs: Conn, listener: Conn) -> None:
    j = one(jobs, "SELECT add_job('fail', '1 hour', scheduled => false)")
    with pytest.raises(psycopg.errors.DivisionByZero):
        jobs.execute("CALL run_job(%s)", (j,))
    ok = one(jobs, "SELECT add_job('hit', '1 hour', scheduled => false)")
    jobs.execute("CALL run_job(%s)", (ok,))
    slow = one(jobs, "SELECT add_job('nap', '1 hour', config => '{\"s\": 5}', max_runtime => '300 ms', "
                     "max_retries => 0, initial_start => now())")
    serve(db, lambda: runs_of(jobs, slow, "timeout") >= 1)
    jobs.execute("SELECT pgsched._disable_job_v2(%s, 'a reason')", (ok,))
    got = events(listener, jobs)
    assert [(e["event"], e["job_id"], e["outcome"]) for e in got] == [
        ("run_end", j, "failure"), ("run_end", slow, "timeout"), ("job_disabled", slow, "timeout"),
        ("job_disabled", ok, None)]
    assert got[-1]["run_id"] is None and got[-1]["plan_time"] is None
