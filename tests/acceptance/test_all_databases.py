"""`pgsched serve --all-databases` (issue 16): one launcher, one scheduler per database with pgsched.

A cluster of its own (the suite's shared one holds every test's databases) with three databases:
`busy` and `quiet` have pgsched, `later` gets it while the launcher runs. `busy`'s jobs keep
every worker they may use occupied; `quiet` has one short job every second. What must hold:
each database with pgsched gets one instance with its share of the workers, `quiet`'s job runs
on time whatever `busy` does, `later` gets its scheduler within seconds of `pgsched init`, a
database dropped (WITH (FORCE)) loses its scheduler without an error loop, and SIGTERM stops
the launcher and every scheduler it started.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from pgsched import migrate
from pgsched.embedded import Cluster
from tests.acceptance.conftest import own_cluster, query, wait_for


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    with own_cluster("pgsched-alldb-", {"fsync": "off", "max_connections": "100"}) as c:
        yield c


def install(c: Cluster, name: str, command: str, jobs: int) -> None:
    with psycopg.connect(c.dsn(), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    with psycopg.connect(c.dsn(name), autocommit=True) as conn:
        migrate.init(conn)
        conn.execute("CREATE TABLE effect (job_id int, at timestamptz DEFAULT clock_timestamp())")
        for i in range(jobs):
            conn.execute("SELECT pgsched.schedule(%s, '1 second', %s)", (f"j{i}", command))


def count(c: Cluster, name: str, since: str = "-infinity") -> int:
    return int(query(c.dsn(name), "SELECT count(*) AS n FROM effect WHERE at > %s::timestamptz", (since,))[0]["n"])


def instances(c: Cluster, name: str) -> list[dict[str, object]]:
    return query(c.dsn(name), "SELECT instance_id, max_workers FROM pgsched.instance WHERE stopped_at IS NULL")


def test_one_launcher_runs_every_database_fairly_and_follows_the_cluster(cluster: Cluster, tmp_path: Path) -> None:
    install(cluster, "busy", "INSERT INTO effect (job_id) VALUES (1); SELECT pg_sleep(3)", jobs=6)
    install(cluster, "quiet", "INSERT INTO effect (job_id) VALUES (2)", jobs=1)
    with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
        conn.execute("CREATE DATABASE later")
    log = tmp_path / "launcher.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pgsched", "serve", "--all-databases", "--dsn", cluster.dsn("postgres"),
             "--max-workers", "4"], stdout=out, stderr=out, start_new_session=True)
    try:
        wait_for(lambda: count(cluster, "busy") >= 2 and count(cluster, "quiet") >= 2, 30,
                 "both databases' jobs to run")
        # One instance per database, each with its half of the 4 workers.
        assert [i["max_workers"] for i in instances(cluster, "busy")] == [2]
        assert [i["max_workers"] for i in instances(cluster, "quiet")] == [2]
        # Each scheduler has its DSN from the environment, not on the command line that every local
        # user can read (a DSN may hold a password).
        for name in ("busy", "quiet"):
            for row in query(cluster.dsn(name), "SELECT pid FROM pgsched.instance WHERE stopped_at IS NULL"):
                argv = Path(f"/proc/{row['pid']}/cmdline").read_bytes().split(b"\0")
                assert b"--dsn" not in argv and not any(b"dbname=" in a for a in argv), argv
        # busy's six 3-second jobs every second would take every worker there is; quiet still runs each second.
        since = query(cluster.dsn("quiet"), "SELECT now()::text AS t")[0]["t"]
        time.sleep(6)
        assert count(cluster, "quiet", since) >= 5
        assert count(cluster, "busy", since) <= 2 * 6 // 3 + 2  # 2 workers, 3 s per run

        # pgsched init in another database: its scheduler comes within seconds, and the shares follow.
        with psycopg.connect(cluster.dsn("later"), autocommit=True) as conn:
            migrate.init(conn)
            conn.execute("CREATE TABLE effect (job_id int, at timestamptz DEFAULT clock_timestamp())")
            conn.execute("SELECT pgsched.schedule('j', '1 second', 'INSERT INTO effect (job_id) VALUES (3)')")
        wait_for(lambda: count(cluster, "later") >= 2, 30, "the new database's job to run")
        wait_for(lambda: [i["max_workers"] for i in instances(cluster, "quiet")] == [1], 30,
                 "quiet's scheduler to restart with its new share")

        # A dropped database loses its scheduler, and the launcher carries on.
        with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
            conn.execute("DROP DATABASE busy WITH (FORCE)")
        wait_for(lambda: "database busy no longer has pgsched" in log.read_text(), 30, "busy's scheduler to stop")
        since = query(cluster.dsn("quiet"), "SELECT now()::text AS t")[0]["t"]
        wait_for(lambda: count(cluster, "quiet", since) >= 2, 30, "quiet's job to run on")
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
    text = log.read_text()
    assert code == 0, text[-3000:]
    assert "launcher stopped" in text
    assert "Traceback" not in text, text[-3000:]
    # Every scheduler it started stopped with it: no instance of a remaining database is left running.
    for name in ("quiet", "later"):
        assert instances(cluster, name) == [], name


def test_two_launchers_on_one_cluster_run_each_plan_once(cluster: Cluster, tmp_path: Path) -> None:
    install(cluster, "shared", "INSERT INTO effect (job_id, at) "
                               "VALUES (1, current_setting('pgsched.plan_time')::timestamptz)", jobs=3)
    with psycopg.connect(cluster.dsn("shared"), autocommit=True) as conn:
        # The effect names its plan: a plan run by both launchers' schedulers would show twice.
        conn.execute("UPDATE pgsched.job SET command = replace(command, '(1,', format('(%s,', job_id))")
    procs = []
    try:
        for i in range(2):
            with open(tmp_path / f"launcher-{i}.log", "wb") as out:
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "pgsched", "serve", "--all-databases", "--dsn",
                     cluster.dsn("postgres"), "--max-workers", "2"], stdout=out, stderr=out, start_new_session=True))
        wait_for(lambda: len(instances(cluster, "shared")) == 2, 30, "a scheduler of each launcher")
        wait_for(lambda: count(cluster, "shared") >= 18, 60, "six seconds of runs")
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            assert p.wait(timeout=60) == 0
    assert query(cluster.dsn("shared"), "SELECT job_id, at FROM effect GROUP BY 1, 2 HAVING count(*) > 1") == []
    # Every plan that ran has one effect: none lost between the two.
    assert query(cluster.dsn("shared"), "SELECT count(*) AS n FROM pgsched.job_run r WHERE r.outcome = 'success' "
                                        "AND NOT EXISTS (SELECT 1 FROM effect e WHERE e.job_id = r.job_id "
                                        "AND e.at = r.plan_time)")[0]["n"] == 0


def test_all_databases_asked_through_the_environment_starts_schedulers_not_launchers(
        cluster: Cluster, tmp_path: Path) -> None:
    """PGSCHED_ALL_DATABASES (every serve option may come from PGSCHED_<OPTION>) is the launcher's:
    the schedulers it starts do not inherit it, or each would be a launcher in turn."""
    install(cluster, "only", "INSERT INTO effect (job_id) VALUES (1)", jobs=1)
    log = tmp_path / "launcher.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pgsched", "serve", "--dsn", cluster.dsn("postgres"), "--max-workers", "2"],
            stdout=out, stderr=out, start_new_session=True, env={**os.environ, "PGSCHED_ALL_DATABASES": "1"})
    try:
        wait_for(lambda: count(cluster, "only") >= 2, 30, "the database's job to run")
        assert [i["max_workers"] for i in instances(cluster, "only")] == [2]
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
    text = log.read_text()
    assert code == 0, text[-3000:]
    assert text.count("launcher: started the scheduler of database") == 1, text[-3000:]
