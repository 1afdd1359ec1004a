"""`pgsched serve` as a service manager runs it: sd_notify to a socket the test opens (READY=1
once the workers are connected, WATCHDOG=1 while the loop turns, STOPPING=1 on SIGTERM), and
--http from a settings file, scraped over HTTP from the real process."""

from __future__ import annotations

import json
import signal
import socket
import time
import urllib.request
from pathlib import Path

import pytest
from psycopg.conninfo import make_conninfo

from pgsched.embedded import free_port
from tests.acceptance.conftest import ServeFactory, wait_for
from tests.acceptance.test_serve import FAST, add_job, jobs_db, stats  # noqa: F401 (fixture)


def test_ready_watchdog_stopping_and_http_from_the_config_file(jobs_db: str, serve: ServeFactory,  # noqa: F811
                                                               tmp_path: Path) -> None:
    pytest.importorskip("prometheus_client", reason="pgsched[http] is not installed")
    job = add_job(jobs_db, "'tick', '200 ms'")
    port = free_port()
    conf = tmp_path / "pgsched.toml"
    # metrics_dsn names a database that does not exist: the catalog's series are left out, which
    # shows the file's value is the one /metrics reads with (the scheduler's DSN would give them).
    absent = make_conninfo(jobs_db, dbname="pgsched_test_no_such_database")
    conf.write_text(f'http = "127.0.0.1:{port}"\nlog_format = "json"\nmax_workers = 2\n'
                    f"metrics_dsn = {json.dumps(absent)}\n")  # a TOML string
    path = str(tmp_path / "notify.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(path)
        sock.settimeout(10)
        s = serve(jobs_db, "--config", str(conf), *FAST,
                  env={"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "400000"})
        before: list[str] = []  # the loop turns (and pings) while its workers connect
        while not (msg := sock.recv(1024).decode()).startswith("READY=1"):
            before.append(msg)
        assert msg.startswith("READY=1\nSTATUS=2 workers connected") and set(before) <= {"WATCHDOG=1"}, msg
        assert any('"ready: 2 workers connected' in line for line in s.log_lines())
        pings = 0
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            ping = sock.recv(1024)
            assert ping == b"WATCHDOG=1", ping
            pings += 1
        assert 4 <= pings <= 10, pings  # every 0.2 s (half of WATCHDOG_USEC)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as r:
            assert r.status == 200
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
        assert "pgsched_up 1.0" in text and 'pgsched_runs_total{outcome="success"}' in text
        assert "pgsched_jobs" not in text
        # The metric counts a run's end as the scheduler sees it; its close commits a moment later.
        wait_for(lambda: stats(jobs_db, job)["total_successes"] >= 1 or None, 5, "the run's close")
        s.signal(signal.SIGTERM)
        msgs: list[str] = []
        while not any(m.startswith("STOPPING=1") for m in msgs):
            msgs.append(sock.recv(1024).decode())
        assert s.wait_exit(5) == 0
