"""Workers forked by the fork server (pgsched/forkserver.py), against a real database.

The probe runs in a process of its own: forking through the fork server makes the launching
process a child subreaper, which the test runner (whose PostgreSQL is daemonized) must not be.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parents[2]


def probe(db: str) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("forkserver_probe.py")), db],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def test_forked_workers_are_the_launchers_children_in_their_own_sessions_and_run_jobs(
        db: str, conn: psycopg.Connection[tuple[Any, ...]]) -> None:
    conn.execute("CREATE TABLE ran (x int)")
    conn.execute("GRANT INSERT ON ran TO PUBLIC")
    out = probe(db)
    assert (out["early_subreaper"], out["discarded_exit"], out["discarded_subreaper"]) == (1, -9, 0)
    assert out["took_early"] is True
    assert out["forked"] == [True, True]
    assert out["parent_is_us"] == [True, True]
    assert out["own_session"] == [True, True]
    assert out["batch"] == [True, True]  # pgsched.worker._as_batch_task, in a forked worker too
    assert out["ran"] is True
    assert conn.execute("SELECT count(*) FROM ran").fetchone() == (1,)
    # kill -9 of a forked worker reads as it does for any worker; one let go exits cleanly.
    assert out["killed"] == "killed by SIGKILL"
    assert out["let_go"] == 0
    # A stray re-parented to the launcher is reaped; the live worker beside it is left alone.
    assert out["strays"] == 1
    assert out["kept_alive"] is True
    assert out["bad_failed"] is True
    assert out["bad_exit"] == 3  # pgsched.worker.EXIT_CONNECT
    # A hung fork server is given up on within its reply timeout (1 s) and killed, and the
    # worker starts as a process of its own.
    assert 0.9 <= out["hung_fallback_s"] < 2.5
    assert out["hung_fallback_forked"] is False
    assert out["hung_server_exit"] == -9
    assert out["hung_fallback_ready"] is True
    assert out["hung_server_after"] is True
    assert out["restarted_forked"] is True
    assert out["restarted_ready"] is True
    # With the fork server dead, the next worker starts as a process of its own, and works.
    assert out["fallback_forked"] is False
    assert out["fallback_ready"] is True
    assert out["server_after"] is True
