"""The catch-up decision after downtime is taken when a run can start (issue 13): with a job every
2 s and catch_up 'latest', the run that follows an instance's start is the most recent plan due
when it starts, however long the instance's workers took to connect."""

from __future__ import annotations

import signal
from datetime import timedelta

import psycopg

from tests.acceptance.conftest import ServeFactory, query, wait_for

FAST = ("--shutdown-timeout", "1", "--crash-wait", "1")
PERIOD = timedelta(seconds=2)


def test_latest_runs_the_plan_due_when_the_run_starts_after_each_start(db: str, serve: ServeFactory) -> None:
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("CREATE TABLE public.ran (plan timestamptz)")
        row = c.execute("SELECT pgsched.schedule('every 2 s', '2 seconds', "
                        "'INSERT INTO public.ran VALUES (current_setting(''pgsched.plan_time'')::timestamptz)')"
                        ).fetchone()
        assert row is not None
        job = int(row[0])
    for attempt in range(3):
        # Downtime: the next plan is 15 plans back (or more), as if no scheduler had run for 30 s. Each
        # further back than the last: a quick attempt would otherwise move it back onto the plans
        # the last one recorded as missed, and its record would be the same row (the plan key).
        query(db, "UPDATE pgsched.job_stat SET next_start = next_start - make_interval(secs => 30 * %s) "
                  "WHERE job_id = %s RETURNING job_id", (attempt + 1, job))
        top = query(db, "SELECT coalesce(max(run_id), 0) AS r FROM pgsched.job_run")[0]["r"]
        s = serve(db, *FAST)
        first = wait_for(lambda: query(db, "SELECT plan_time, started_at FROM pgsched.job_run WHERE job_id = %s "
                                           "AND run_id > %s AND outcome = 'success' ORDER BY run_id LIMIT 1",
                                       (job, top)) or None, 20, "the first run after the start")[0]  # noqa: B023
        # The latest plan due at its start: the next one was not due yet.
        assert first["started_at"] - first["plan_time"] < PERIOD, (attempt, first, s.log()[-2000:])
        missed = query(db, "SELECT result FROM pgsched.job_run WHERE job_id = %s AND run_id > %s "
                           "AND outcome = 'missed' ORDER BY run_id", (job, top))
        # One decision, taken once a worker could run the plan: the gap is one 'missed' record.
        assert len(missed) == 1 and missed[0]["result"]["count"] >= 14, (attempt, missed, s.log()[-3000:])
        s.signal(signal.SIGTERM)
        assert s.wait_exit(15) == 0
