"""serve's default worker count (issue 13): the machine's (settings.default_max_workers), within a
quarter of the server's connections; a count set on the command line or in the settings file is
taken as it is.

A cluster of its own with max_connections = 40 (37 for ordinary sessions: 3 are the superusers'),
so the server's share, 9, is below any machine's default (16 a core).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest

from pgsched import migrate
from pgsched.embedded import Cluster
from tests.acceptance.conftest import ServeFactory, own_cluster, query, wait_for

SHARE = 9  # (40 - 3) // 4


@pytest.fixture
def small() -> Iterator[Cluster]:
    with own_cluster("pgsched-workers-", {"fsync": "off", "max_connections": "40"}) as c:
        with psycopg.connect(c.dsn(), autocommit=True) as conn:
            migrate.init(conn)
        yield c


def max_workers(dsn: str, instance_id: int) -> int:
    return int(query(dsn, "SELECT max_workers FROM pgsched.instance WHERE instance_id = %s", (instance_id,))[0]
               ["max_workers"])


def worker_sessions(dsn: str) -> int:
    return int(query(dsn, "SELECT count(*) AS n FROM pg_catalog.pg_stat_activity "
                          "WHERE application_name = 'pgsched worker idle'")[0]["n"])


def test_the_default_takes_a_quarter_of_the_servers_connections_and_a_set_count_is_kept(
        small: Cluster, serve: ServeFactory, tmp_path: Path) -> None:
    dsn = small.dsn()
    s = serve(dsn)
    assert max_workers(dsn, s.wait_instance()) == SHARE
    # As many workers connect, no more: the server keeps the rest of its connections.
    wait_for(lambda: worker_sessions(dsn) == SHARE or None, 15, f"{SHARE} workers connected")
    assert worker_sessions(dsn) == SHARE
    s.wait_log(f"(max_workers={SHARE}, the default for this machine and a server of 37 connections)", 10)
    s.signal(signal.SIGTERM)
    assert s.wait_exit(30) == 0

    explicit = serve(dsn, "--max-workers", "12")
    assert max_workers(dsn, explicit.wait_instance()) == 12
    explicit.wait_log("(max_workers=12)", 10)
    explicit.signal(signal.SIGTERM)
    assert explicit.wait_exit(30) == 0

    # A settings file's max_workers is a count set too; taken out again at a reload, the default
    # within the server's share comes back.
    config = tmp_path / "pgsched.toml"
    config.write_text("max_workers = 3\n")
    filed = serve(dsn, "--config", str(config))
    instance = filed.wait_instance()
    assert max_workers(dsn, instance) == 3
    config.write_text("crash_wait = 1.0\n")
    filed.signal(signal.SIGHUP)
    filed.wait_log(f"SIGHUP: settings reloaded (max_workers={SHARE})", 10)
    wait_for(lambda: max_workers(dsn, instance) == SHARE or None, 15, "the heartbeat to record the new count")
    wait_for(lambda: worker_sessions(dsn) == SHARE or None, 15, f"{SHARE} workers connected")

    # The server restarted with fewer connections: the default shrinks with them at the reconnect,
    # and the workers beyond it end.
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET max_connections = 20")
    small.restart()
    filed.wait_log("max_workers=4, the default for this machine and a server of 17 connections (was 9)", 30)
    wait_for(lambda: max_workers(dsn, instance) == 4 or None, 15, "the heartbeat to record the smaller count")
    wait_for(lambda: worker_sessions(dsn) == 4 or None, 15, "4 workers connected")
    filed.signal(signal.SIGTERM)
    assert filed.wait_exit(30) == 0


@contextmanager
def launcher(dsn: str, log: Path, *args: str) -> Iterator[subprocess.Popen[bytes]]:
    """`serve --all-databases` (the launcher) with its log in `log`; stopped by SIGTERM, exit 0."""
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "pgsched", "serve", "--all-databases", "--dsn", dsn, *args],
                                stdout=out, stderr=out, start_new_session=True)
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the launcher's session: its schedulers too
            raise
    assert code == 0, log.read_text()[-3000:]


def live_instances(dsn: str) -> list[int]:
    return [r["max_workers"] for r in query(dsn, "SELECT max_workers FROM pgsched.instance WHERE stopped_at IS NULL")]


@pytest.mark.parametrize(("file", "workers"), [(None, SHARE), ("max_workers = 4\n", 4)])
def test_all_databases_shares_the_default_within_the_servers_connections_or_the_files_count(
        small: Cluster, tmp_path: Path, file: str | None, workers: int) -> None:
    log = tmp_path / "launcher.log"
    config = tmp_path / "pgsched.toml"
    if file is not None:
        config.write_text(file)
    with launcher(small.dsn(), log, *(["--config", str(config)] if file is not None else [])):
        wait_for(lambda: live_instances(small.dsn()) or None, 30, "the database's scheduler")
        assert live_instances(small.dsn()) == [workers]
        assert f"{workers} workers in all" in log.read_text()


def test_a_launcher_started_before_its_cluster_waits_for_the_servers_connections(
        small: Cluster, tmp_path: Path) -> None:
    """Unreachable at the launcher's start, the cluster's budget is read once it is up: no
    scheduler starts with the machine's count meanwhile (it could take more than the share)."""
    log = tmp_path / "launcher.log"
    small.stop()
    with launcher(small.dsn(), log):
        wait_for(lambda: "cannot read the cluster's max_connections" in log.read_text() or None, 30,
                 "the launcher to find the cluster down")
        assert "workers in all" not in log.read_text()
        small.start()
        small.wait_ready()
        wait_for(lambda: live_instances(small.dsn()) or None, 30, "the database's scheduler")
        assert live_instances(small.dsn()) == [SHARE]
        assert f"{SHARE} workers in all" in log.read_text()
