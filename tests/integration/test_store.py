"""pgsched.store against a real database: what it writes when a run's report is not clean."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import psycopg

from pgsched.clock import DbClock
from pgsched.store import Finish, Store
from tests.integration.helpers import SETUP_SQL

Conn = psycopg.Connection[tuple[Any, ...]]


def test_a_result_or_message_jsonb_refuses_is_cleaned_not_left_to_block_the_batch(db: str, conn: Conn) -> None:
    """NaN in a Python handler's result or a NUL in an error message would make PostgreSQL refuse the
    whole batch of closes (and the scheduler would retry it forever): each is cleaned instead."""
    conn.execute(SETUP_SQL)
    ids = []
    for _ in range(3):  # three jobs, one run each in progress
        job = conn.execute("SELECT pgsched.add_job('ok_fn', '1 hour')").fetchone()
        assert job is not None
        run = conn.execute("SELECT pgsched._mark_start(%s, now(), 'manual')", (job[0],)).fetchone()
        assert run is not None
        ids.append(int(run[0]))
    store = Store(db, DbClock())
    try:
        now = datetime.now(UTC)
        closed = [c is not None for c in store.close_runs([
            Finish(run_id=ids[0], outcome="success", sqlstate=None, message=None, next_start=None, finished_at=now,
                   result={"ratio": float("nan"), "ok": 1}),
            Finish(run_id=ids[1], outcome="failure", sqlstate="XX000", message="bad\x00byte", next_start=None,
                   finished_at=now, result=None),
            Finish(run_id=ids[2], outcome="success", sqlstate=None, message=None, next_start=None, finished_at=now,
                   result={"k\x00ey": ["v\x00", 2]}),
        ])]
    finally:
        store.close()
    assert closed == [True, True, True]
    rows = {r[0]: r[1:] for r in conn.execute(
        "SELECT run_id, outcome, message, result FROM pgsched.job_run WHERE run_id = ANY (%s)", (ids,))}
    assert rows[ids[0]][0] == "success" and "not representable as JSON" in rows[ids[0]][2]["invalid_result"]
    assert rows[ids[1]][:2] == ("failure", "bad\\0byte")
    assert rows[ids[2]][2] == {"k\\0ey": ["v\\0", 2]}
