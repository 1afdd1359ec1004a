"""Jitter with real `pgsched serve` instances (issue 14): each run starts at its plan time plus the
delay the rule gives that plan, the delay is recorded in the run, every plan runs once (two
instances agree on the delay), and plan_time stays the planned instant."""

from __future__ import annotations

import itertools
from datetime import timedelta
from typing import Any

import psycopg

from tests.acceptance.conftest import ServeFactory, query, wait_for

FAST = ("--shutdown-timeout", "1", "--crash-wait", "1")


def test_runs_start_at_their_jittered_instant_once_each_across_two_instances(db: str, serve: ServeFactory) -> None:
    with psycopg.connect(db, autocommit=True) as c:
        row = c.execute("SELECT pgsched.schedule('spread', '2 seconds', 'SELECT 1')").fetchone()
        assert row is not None
        job = int(row[0])
        c.execute("SELECT pgsched.alter_job(%s, jitter => '1.5 seconds', "
                  "initial_start => now() + interval '3 seconds')", (job,))
    for _ in range(2):
        serve(db, *FAST).wait_log("ready:", 15)
    def five_runs() -> list[dict[str, Any]] | None:
        found = query(db, "SELECT plan_time, started_at, jitter, outcome, "
                          "pgsched._jitter_us(job_id, plan_time, 1500000) AS rule_us "
                          "FROM pgsched.job_history WHERE job_id = %s AND outcome = 'success' "
                          "ORDER BY plan_time", (job,))
        return found if len(found) >= 5 else None

    runs = wait_for(five_runs, 30, "five runs of the jittered job")
    plans = [r["plan_time"] for r in runs]
    # every plan of the 2-second grid, once (the unique key would refuse a second; none skipped)
    assert all(b - a == timedelta(seconds=2) for a, b in itertools.pairwise(plans)), plans
    assert query(db, "SELECT count(*) AS n FROM pgsched.job_run WHERE job_id = %s AND outcome NOT IN "
                     "('success', 'running')", (job,))[0]["n"] == 0
    for r in runs:
        # the recorded delay is the rule's for (job, plan), and the run did not start before it
        assert r["jitter"] == timedelta(microseconds=r["rule_us"]), r
        assert r["plan_time"] + r["jitter"] <= r["started_at"] < r["plan_time"] + r["jitter"] + timedelta(seconds=1), r
    assert len({r["jitter"] for r in runs}) == len(runs), runs  # spread, not one fixed offset
