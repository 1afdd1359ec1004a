"""pg_cron's @restart across real PostgreSQL restarts with two schedulers: each job runs once
per server start (its plan time is pg_postmaster_start_time()), not when it is created, and
never twice however many instances arm it (pgsched._arm_restart_jobs)."""

from __future__ import annotations

import time
from datetime import datetime

import psycopg
import pytest

from tests.acceptance.conftest import ServeFactory, query, wait_for
from tests.conftest import PgServer

FAST = ("--shutdown-timeout", "1", "--crash-wait", "1")
LOG_SQL = """CREATE TABLE public.restart_log (job text, postmaster_start timestamptz DEFAULT pg_postmaster_start_time(),
                                              at timestamptz DEFAULT clock_timestamp())"""


def logged(dsn: str) -> list[tuple[str, datetime]]:
    return [(r["job"], r["postmaster_start"]) for r in
            query(dsn, "SELECT job, postmaster_start FROM public.restart_log ORDER BY at")]


def start_time(dsn: str) -> datetime:
    return datetime.fromisoformat(str(query(dsn, "SELECT pg_postmaster_start_time()::text AS t")[0]["t"]))


def restart(pg_server: PgServer) -> None:
    assert pg_server.cluster is not None
    pg_server.cluster.restart()
    pg_server.cluster.wait_ready()


def test_restart_job_runs_once_per_server_start_across_two_instances(
        pg_server: PgServer, db: str, serve: ServeFactory) -> None:
    if pg_server.cluster is None:
        pytest.skip("PGSCHED_TEST_DSN names an external server: the test cannot restart it")
    with psycopg.connect(db, autocommit=True) as c:
        c.execute(LOG_SQL)
        unnamed = c.execute("SELECT pgsched.schedule('@restart', "
                            "'INSERT INTO public.restart_log (job) VALUES (''unnamed'')')").fetchone()
        named = c.execute("SELECT pgsched.schedule('on start', ' @restart ', "
                          "'INSERT INTO public.restart_log (job) VALUES (''named'')')").fetchone()
    assert unnamed and named
    jobs = (unnamed[0], named[0])
    assert [r["next_start"] for r in query(db, "SELECT next_start FROM pgsched.jobs ORDER BY job_id")] == [None, None]
    a = serve(db, *FAST)
    b = serve(db, *FAST)
    # Created after the server started: nothing until it starts again.
    time.sleep(2)
    assert logged(db) == []

    for n in (1, 2):
        restart(pg_server)
        started = start_time(db)
        want = 2 * n
        wait_for(lambda: len(logged(db)) >= want or None, 20, f"the @restart runs after restart {n}")  # noqa: B023
        # Both instances reconnected, and so armed the jobs (right after saying so). Not a fixed
        # wait: under load one instance's reconnect back-off can outlast the restart by seconds
        # (a CI run on PostgreSQL 18 found one that had not reconnected 2 s after the runs).
        for s in (a, b):
            wait_for(lambda: s.log().count("reconnected to the database") >= n or None,  # noqa: B023
                     30, f"instance {s.instance_id} reconnected after restart {n}")
        time.sleep(2)  # a second run of either armed job would show by now
        log = logged(db)
        assert sorted(job for job, at in log if at == started) == ["named", "unnamed"], log
        assert len(log) == 2 * n, log
        runs = query(db, "SELECT job_id, plan_time, outcome, instance_id FROM pgsched.job_run "
                         "WHERE job_id = ANY (%s) AND plan_time = pg_postmaster_start_time() ORDER BY job_id",
                     (list(jobs),))
        assert [(r["job_id"], r["outcome"]) for r in runs] == [(jobs[0], "success"), (jobs[1], "success")], runs
        # Waiting for the next start again, on both instances.
        assert [r["next_start"] for r in query(db, "SELECT next_start FROM pgsched.jobs ORDER BY job_id")] == \
            [None, None]
    for s in (a, b):
        assert s.proc.poll() is None, s.log()
        assert "reconnected" in s.log()
