"""Python jobs at the edges of the run contract (real PostgreSQL): what a handler returns, catches,
raises or leaves on its connection, and how `pgsched run` records the end (tests/apps/edge_jobs.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from pgsched import app, protocol, pyjob, worker
from tests.apps import edge_jobs
from tests.integration.test_code_jobs import one

Conn = psycopg.Connection[tuple[Any, ...]]
EDGE = edge_jobs.MODULE


@pytest.fixture
def py(conn: Conn) -> Conn:
    conn.execute("CREATE TABLE py_hits (job text, plan_time timestamptz, attempt int, config jsonb)")
    return conn


@pytest.fixture
def session(db: str, py: Conn) -> Iterator[worker.Session]:
    """A worker's session, as `python -m pgsched.worker` keeps it between runs."""
    s = worker.Session(db)
    try:
        yield s
    finally:
        s.close()


def python_run(session: worker.Session, name: str, run_id: int = 1, config: Any = None) -> protocol.Done:
    """Run the handler of job `name` as a worker runs one (run_one, then the session's reset)."""
    spec = app.REGISTRY[name]
    msg = {"run_id": run_id, "job_id": 1, "kind": "python", "owner": session.role, "job_name": name,
           "code_module": spec.module, "code_function": spec.function,
           "config": spec.config if config is None else config, "app": f"pgsched job 1 run {run_id} lease 1",
           "plan_time": "2026-01-01T00:00:00+00:00", "lease_token": 1, "scope": "", "scope_query": None,
           "start_at": 0}
    heartbeat = pyjob.Heartbeat(session.dsn)
    try:
        done, reset = worker.run_one(session.conn, msg, heartbeat)
    finally:
        heartbeat.close()
    assert not reset and worker.reset_session(session.conn)
    return done


def hits(conn: Conn, name: str) -> int:
    return int(one(conn, "SELECT count(*) FROM py_hits WHERE job = %s", name))


# -- an exception whose __str__ raises -----------------------------------------------------------------

def test_an_exception_whose_str_raises_is_a_clean_failure(session: worker.Session, py: Conn) -> None:
    done = python_run(session, "edge.unspeakable")
    assert done.ok is False and done.message is not None
    assert done.message.startswith("Unspeakable: <exception str() failed>\nTraceback (most recent call last):"), \
        done.message
    assert "raise Unspeakable()" in done.message
    assert hits(py, "edge.unspeakable") == 0
