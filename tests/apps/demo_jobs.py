"""Python jobs for the tests. Their first start is far away: tests trigger runs with alter_job(next_start => now())."""

from __future__ import annotations

import os
import signal
import time
from datetime import UTC, datetime

import psycopg
from psycopg.types.json import Jsonb

import pgsched

FAR = datetime(2100, 1, 1, tzinfo=UTC)


@pgsched.job(every="1 hour", initial_start=FAR, config={"greeting": "hi"}, name="demo.ok")
def ok(run: pgsched.Run) -> pgsched.Result:
    run.connection.execute("INSERT INTO py_hits VALUES (%s, %s, %s, %s)",
                           (run.job_name, run.plan_time, run.attempt, Jsonb(run.config)))
    return pgsched.Result(rows_affected=1, data={"plan": run.plan_time.isoformat(), "hello": run.config["greeting"]})


@pgsched.job(every="1 hour", initial_start=FAR, name="demo.boom")
def boom(run: pgsched.Run) -> None:
    run.connection.execute("INSERT INTO py_hits VALUES ('demo.boom', now(), 1, NULL)")  # rolled back
    raise ValueError("nope")


@pgsched.job(every="1 hour", initial_start=FAR, max_runtime="1 second", name="demo.slow")
def slow(run: pgsched.Run) -> None:
    time.sleep(30)


@pgsched.job(every="1 hour", initial_start=FAR, name="demo.beat")
def beat(run: pgsched.Run) -> None:
    for _ in range(4):
        run.heartbeat()
        time.sleep(0.3)
    run.connection.execute("INSERT INTO py_hits VALUES (%s, %s, %s, NULL)", (run.job_name, run.plan_time, run.attempt))


@pgsched.job(every="1 hour", initial_start=FAR, name="demo.lease")
def lease(run: pgsched.Run) -> None:
    # Close our own run from outside, as a scheduler that found it abandoned would; then heartbeat.
    with psycopg.connect(run.connection.info.dsn, autocommit=True) as other:
        other.execute("UPDATE pgsched.job_run SET outcome = 'crash', finished_at = now(), "
                      "message = 'closed by another scheduler' WHERE run_id = %s", (run.run_id,))
        try:
            run.heartbeat()
        except pgsched.LeaseLost:
            other.execute("INSERT INTO py_hits VALUES ('demo.lease lost', now(), 1, NULL)")
            raise


@pgsched.job(every="1 hour", initial_start=FAR, name="demo.exits")
def exits(run: pgsched.Run) -> None:
    os._exit(7)


@pgsched.job(every="1 hour", initial_start=FAR, name="demo.killed")
def killed(run: pgsched.Run) -> None:
    os.kill(os.getpid(), signal.SIGKILL)
