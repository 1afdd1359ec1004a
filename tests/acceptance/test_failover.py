"""PostgreSQL failover to a standby (issue 16): `pgsched serve` follows the primary.

A primary and its streaming-replication standby (pg_basebackup) in a cluster pair of their own;
`serve` gets a multi-host DSN (`host=a,b ... target_session_attrs=read-write`), so libpq
connects to whichever of the two accepts writes. Jobs every second write an effect row naming
their plan. The primary's postmaster and all its processes are killed with SIGKILL, as a failed
machine leaves them, and the standby is promoted. What must hold:

* the same `serve` process runs the jobs again on the promoted standby, within seconds;
* no plan runs twice: each (job, plan) has at most one effect row. The standby is asynchronous,
  so the last transactions of the old primary may be lost; a plan whose start mark did not
  reach the standby may run again, but then its effect did not reach it either: the job's own
  commit comes after its start mark in the WAL, which the standby replays in order;
* no run stays 'running' once the instance is back: the runs in flight at the kill end as
  crashes (counted before they ran, see 20_runs.sql), taken over or closed by the scheduler.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from pgsched import migrate
from pgsched.embedded import Cluster
from tests.acceptance.conftest import ServeFactory, query, wait_for

JOBS = 4
FAST = {"fsync": "off", "full_page_writes": "off", "max_connections": "100", "shared_buffers": "64MB"}


@pytest.fixture
def pair() -> Iterator[tuple[Cluster, Cluster]]:
    """A running primary with database `app` (pgsched installed, JOBS jobs every second), and its
    running standby."""
    if os.environ.get("PGSCHED_TEST_DSN"):
        pytest.skip("PGSCHED_TEST_DSN names an external server: the test needs clusters of its own")
    tmp = Path(tempfile.mkdtemp(prefix="pgsched-failover-"))
    os.chmod(tmp, 0o755)
    primary = Cluster(datadir=tmp / "a" / "data", settings=FAST)
    standby: Cluster | None = None
    try:
        primary.initdb()
        primary.start()
        primary.wait_ready()
        with psycopg.connect(primary.dsn(), autocommit=True) as c:
            c.execute("CREATE DATABASE app")
        with psycopg.connect(primary.dsn("app"), autocommit=True) as c:
            migrate.init(c)
            c.execute("CREATE TABLE effect (job_id int NOT NULL, plan_time timestamptz NOT NULL, "
                      "run_id bigint NOT NULL)")
            for i in range(JOBS):
                row = c.execute("SELECT pgsched.schedule(%s, '1 second', 'SELECT 1')", (f"f{i}",)).fetchone()
                assert row is not None
                command = sql.SQL(
                    "INSERT INTO effect SELECT {}, current_setting('pgsched.plan_time')::timestamptz, "
                    "current_setting('pgsched.run_id')::bigint").format(sql.Literal(int(row[0])))
                c.execute("SELECT pgsched.schedule(%s, '1 second', %s)", (f"f{i}", command.as_string(c)))
        standby = primary.standby(tmp / "b" / "data")
        standby.start()
        standby.wait_ready()
        yield primary, standby
    finally:
        primary.destroy()
        if standby is not None:
            standby.destroy()


def effects(dsn: str) -> int:
    return int(query(dsn, "SELECT count(*) AS n FROM effect")[0]["n"])


def test_serve_follows_the_primary_to_a_promoted_standby(pair: tuple[Cluster, Cluster],
                                                          serve: ServeFactory) -> None:
    primary, standby = pair
    both = psycopg.conninfo.make_conninfo(
        host=f"{primary.socket_dir},{standby.socket_dir}", port=f"{primary.port},{standby.port}",
        dbname="app", user="postgres", target_session_attrs="read-write", connect_timeout="2")
    s = serve(both, "--max-workers", "4")
    wait_for(lambda: effects(primary.dsn("app")) >= 3 * JOBS, 30, "the jobs to run on the primary")
    # The standby has caught up with a run or more (asynchronous: not necessarily with the last).
    wait_for(lambda: effects(standby.dsn("app")) >= 2 * JOBS, 30, "the standby to replay some runs")

    primary.kill()
    killed = time.monotonic()
    standby.promote()
    promoted = effects(standby.dsn("app"))
    wait_for(lambda: effects(standby.dsn("app")) >= promoted + 2 * JOBS, 60,
             "the jobs to run again on the promoted standby")
    back_after = time.monotonic() - killed
    assert s.proc.poll() is None, s.log()[-3000:]  # the same process followed the primary

    new = standby.dsn("app")
    assert query(new, "SELECT job_id, plan_time FROM effect GROUP BY 1, 2 HAVING count(*) > 1") == []
    # Every run that was in flight at the kill is closed soon after the instance is back.
    wait_for(lambda: not query(new, "SELECT 1 FROM pgsched.job_run WHERE outcome = 'running' "
                                    "AND started_at < now() - interval '5 seconds'"),
             30, "no run left 'running' from before the failover")
    # A successful run has its effect, on the new primary too.
    assert query(new, "SELECT r.run_id FROM pgsched.job_run r WHERE r.outcome = 'success' "
                      "AND NOT EXISTS (SELECT 1 FROM effect e WHERE e.run_id = r.run_id)") == []
    assert back_after < 30, f"jobs ran again {back_after:.1f}s after the primary died"
    print(f"jobs ran again {back_after:.1f}s after the kill")
