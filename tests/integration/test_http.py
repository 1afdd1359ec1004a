"""serve --http (pgsched/httpd.py): /metrics scraped over HTTP and parsed with
prometheus_client.parser, checked against the catalog; promtool's own check where it is
installed; /healthz and /readyz."""

from __future__ import annotations

import contextlib
import select
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest

pytest.importorskip("prometheus_client", reason="pgsched[http] is not installed")
from prometheus_client.parser import text_string_to_metric_families

from pgsched import httpd
from pgsched.errors import ConfigError
from pgsched.httpd import HttpServer, parse_address, start_http
from pgsched.scheduler import Scheduler, Settings
from tests.conftest import PgServer
from tests.integration.test_scheduler import Conn, one, runs_of
from tests.integration.test_security import cluster_roles, dsn_as


@dataclass
class Served:
    sched: Scheduler
    server: HttpServer
    stop: threading.Event

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.server.port}{path}", timeout=5) as r:
                return int(r.status), r.read().decode()
        except urllib.error.HTTPError as e:
            return int(e.code), e.read().decode()

    def catalog_samples(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """A scrape that has the catalog's series: they are left out when their read waits past its
        lock_timeout (a partition the first purge attaches, on a loaded machine)."""
        found: list[dict[tuple[str, tuple[tuple[str, str], ...]], float]] = []

        def has_them() -> bool:
            found.append(self.samples())
            return ("pgsched_job_series_exported", ()) in found[-1]

        wait(has_them)
        return found[-1]

    def samples(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        code, text = self.get("/metrics")
        assert code == 200
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for fam in text_string_to_metric_families(text) for s in fam.samples}


class Hold:
    """Hangs the scheduler loop at the start of its next round while held, as a loop stuck in
    some call would hang: it stops ticking, and stays connected."""

    def __init__(self) -> None:
        self.released = threading.Event()
        self.released.set()
        self.hung = threading.Event()  # the loop is waiting

    def hold(self) -> None:
        self.hung.clear()
        self.released.clear()

    def release(self) -> None:
        self.released.set()

    def __call__(self) -> bool:
        if not self.released.is_set():
            self.hung.set()
            self.released.wait()
        return False


def serving(db: str, catalog_dsn: str | None = None, hold: Hold | None = None, **settings: Any) -> Iterator[Served]:
    opts: dict[str, Any] = {"max_workers": 3, "crash_wait": 1.0, "safety_interval": 0.2, **settings}
    sched = Scheduler(Settings(dsn=db, **opts))
    server = start_http("127.0.0.1:0", sched, catalog_dsn)
    stop = threading.Event()
    until = stop.is_set if hold is None else lambda: hold() or stop.is_set()
    t = threading.Thread(target=sched.run, kwargs={"until": until})
    t.start()
    try:
        yield Served(sched, server, stop)
    finally:
        stop.set()
        if hold is not None:
            hold.release()
        t.join(20)
        server.stop()


@pytest.fixture
def served(db: str) -> Iterator[Served]:
    yield from serving(db)


def wait(probe: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not probe():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_metrics_agree_with_the_catalog(jobs: Conn, served: Served) -> None:
    good = one(jobs, "SELECT add_job('hit', '200 milliseconds', job_name => 'good')")
    bad = one(jobs, "SELECT add_job('fail', '1 hour', max_retries => 0, job_name => 'bad')")
    one(jobs, "SELECT add_job('hit', '1 hour', scheduled => false)")
    wait(lambda: runs_of(jobs, good, "success") >= 3 and one(jobs, "SELECT state FROM job_stats WHERE job_id = %s",
                                                              bad) == "disabled")
    jobs.execute("SELECT alter_job(%s, scheduled => false)", (good,))
    wait(lambda: one(jobs, "SELECT count(*) FROM job_history WHERE outcome = 'running'") == 0
         and not served.sched.pending and not served.sched.runs)
    s = served.catalog_samples()
    assert s[("pgsched_up", ())] == 1
    ended: dict[str, int] = dict(jobs.execute("SELECT outcome, count(*) FROM job_history "
                              "WHERE outcome NOT IN ('running', 'queued', 'skipped', 'missed') "
                              "GROUP BY outcome").fetchall())
    assert s[("pgsched_runs_total", (("outcome", "success"),))] == ended["success"]
    assert s[("pgsched_runs_total", (("outcome", "failure"),))] == ended["failure"] == 1
    assert s[("pgsched_runs_total", (("outcome", "crash"),))] == 0
    total = sum(ended.values())
    assert s[("pgsched_run_duration_seconds_count", ())] == total
    assert s[("pgsched_run_duration_seconds_bucket", (("le", "+Inf"),))] == total
    assert s[("pgsched_start_lag_seconds_count", ())] == total
    assert s[("pgsched_loop_seconds_count", ())] >= total
    assert s[("pgsched_workers", (("state", "busy"),))] + s[("pgsched_workers", (("state", "idle"),))] == 3
    assert s[("pgsched_jobs", (("state", "disabled"),))] == 3
    assert s[("pgsched_jobs", (("state", "scheduled"),))] == 0
    last = one(jobs, "SELECT extract(epoch FROM last_successful_finish)::float8 FROM job_stats WHERE job_id = %s",
               good)
    assert s[("pgsched_job_last_success_timestamp_seconds", (("job_id", str(good)), ("job_name", "good")))] == \
        pytest.approx(last)
    assert not any(k[0] == "pgsched_job_last_success_timestamp_seconds" and ("job_id", str(bad)) in k[1] for k in s)
    assert served.get("/healthz")[0] == 200 and served.get("/readyz") == (200, "ready\n")
    assert served.get("/nope")[0] == 404


def test_per_job_series_stop_above_the_cap(db: str, jobs: Conn) -> None:
    for _ in range(3):
        one(jobs, "SELECT add_job('hit', '100 milliseconds')")
    for served in serving(db, metrics_max_jobs=2):
        wait(lambda: one(jobs, "SELECT count(*) FROM job_stats WHERE last_successful_finish IS NOT NULL") == 3)
        s = served.catalog_samples()
        assert s[("pgsched_job_series_exported", ())] == 0
        assert not any(k[0] == "pgsched_job_last_success_timestamp_seconds" for k in s)
        assert s[("pgsched_jobs", (("state", "scheduled"),))] + s[("pgsched_jobs", (("state", "starting"),))] == 3


def test_the_catalog_series_are_read_under_row_level_security(db: str, jobs: Conn, pg_server: PgServer) -> None:
    """serve --metrics-dsn: the jobs by state and the per-job series are those its role sees, as in
    every view; the scheduler's own counters are this instance's, whoever reads."""
    job = one(jobs, "SELECT add_job('hit', '100 milliseconds', job_name => 'not_yours')")
    with cluster_roles(pg_server, ("reader",)) as names:
        for served in serving(db, catalog_dsn=dsn_as(db, names["reader"])):
            wait(lambda: runs_of(jobs, job, "success") >= 2)
            wait(lambda w=served: w.samples()[("pgsched_runs_total", (("outcome", "success"),))] >= 2)
            s = served.catalog_samples()
            assert not any(k[0] == "pgsched_job_last_success_timestamp_seconds" for k in s)
            assert sum(v for k, v in s.items() if k[0] == "pgsched_jobs") == 0
            assert s[("pgsched_job_series_exported", ())] == 1
    for served in serving(db):  # the scheduler's role sees it
        wait(lambda w=served: any(k[0] == "pgsched_job_last_success_timestamp_seconds"
                                  and ("job_name", "not_yours") in k[1] for k in w.samples()))


def test_health_and_readiness_follow_the_loop(served: Served) -> None:
    wait(lambda: served.get("/readyz")[0] == 200)
    assert served.get("/healthz")[0] == 200
    served.stop.set()  # the loop stops (and stops ticking); the HTTP server stays up
    wait(lambda: served.sched.store is None)
    assert served.get("/readyz")[0] == 503
    assert served.sched.metrics is not None
    served.sched.metrics.last_tick -= served.sched.settings.dead_after + 1
    code, text = served.get("/healthz")
    assert code == 503 and "has not ticked" in text


def closed_by_the_server(conns: list[socket.socket]) -> list[socket.socket]:
    """Those of `conns` the server has closed (the end of the stream is readable; nothing was asked)."""
    return [c for c in select.select(conns, [], [], 0)[0] if not c.recv(1)]


def test_idle_connections_are_bounded_and_time_out(served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each open connection holds a thread and a file descriptor of the scheduler's process: ~1,000
    idle ones once made it die of EMFILE. At most MAX_CONNECTIONS are served; beyond, the oldest
    still waiting for its request is closed, so /metrics still answers; one that sends nothing is
    closed after CONNECTION_TIMEOUT_S."""
    wait(lambda: served.get("/readyz")[0] == 200)
    threads = threading.active_count()
    idle = [socket.create_connection(("127.0.0.1", served.server.port), timeout=5)
            for _ in range(2 * httpd.MAX_CONNECTIONS + 8)]
    try:
        began = time.monotonic()
        assert served.get("/metrics")[0] == 200
        assert time.monotonic() - began < 5  # not held up by the idle ones (a loaded CI machine: slack)
        # The evicted connections' threads end as they see their socket closed: poll, not one look.
        wait(lambda: threading.active_count() <= threads + httpd.MAX_CONNECTIONS + 2)
        closed: set[socket.socket] = set()

        def evicted() -> bool:
            closed.update(closed_by_the_server([c for c in idle if c not in closed]))
            return len(closed) >= len(idle) + 1 - httpd.MAX_CONNECTIONS  # + 1: the scrape's own

        wait(evicted)
        assert not closed & set(idle[1 - httpd.MAX_CONNECTIONS:])  # the oldest went, the newest stay
    finally:
        for c in idle:
            c.close()
    monkeypatch.setattr(httpd, "CONNECTION_TIMEOUT_S", 0.3)
    with socket.create_connection(("127.0.0.1", served.server.port), timeout=5) as silent:
        began = time.monotonic()
        assert silent.recv(1) == b""
        assert 0.25 <= time.monotonic() - began < 5


def test_a_client_that_leaves_early_prints_nothing(served: Served, capfd: pytest.CaptureFixture[str],
                                                   caplog: pytest.LogCaptureFixture) -> None:
    """socketserver prints the traceback of a connection's error to stderr, which breaks
    --log-format json's one object per line: a client's departure is logged (debug) through
    pgsched.http instead, and any other error as an error record."""
    caplog.set_level("DEBUG", logger="pgsched.http")
    capfd.readouterr()
    for _ in range(3):
        with socket.create_connection(("127.0.0.1", served.server.port), timeout=5) as c:
            c.sendall(b"GET /metrics HTTP/1.1\r\nHost: loc")
            # Closed with a reset (linger 0), as a client that gives up does.
            c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    wait(lambda: not served.server.server.connections.open)
    assert served.get("/healthz")[0] == 200
    out, err = capfd.readouterr()
    assert err == "" and out == ""
    assert any("the client left" in r.getMessage() for r in caplog.records if r.name == "pgsched.http")


@contextlib.contextmanager
def catalog_locked(pg_server: PgServer, db: str) -> Iterator[None]:
    """pgsched.job locked ACCESS EXCLUSIVE for the block by a role of no standing: any role may
    (PUBLIC has UPDATE on it, row-level security deciding which rows), for as long as it likes."""
    with cluster_roles(pg_server, ("mallory",)) as names, psycopg.connect(dsn_as(db, names["mallory"])) as conn:
        conn.execute("LOCK TABLE pgsched.job IN ACCESS EXCLUSIVE MODE")
        yield
        conn.rollback()


def scrape_waits_on_a_lock(db: str) -> bool:
    with psycopg.connect(db, autocommit=True) as conn:
        return bool(one(conn, "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgsched metrics' "
                              "AND wait_event_type = 'Lock'"))


def test_a_locked_catalog_does_not_hang_a_scrape(pg_server: PgServer, db: str, served: Served) -> None:
    """The catalog's series are read under lock_timeout and statement_timeout: when they cannot be
    read in time, /metrics answers with the loop's own series, as when the database is down."""
    wait(lambda: served.get("/readyz")[0] == 200)
    with catalog_locked(pg_server, db):
        began = time.monotonic()
        s = served.samples()
        assert time.monotonic() - began < 5
        assert s[("pgsched_up", ())] == 1 and ("pgsched_runs_total", (("outcome", "success"),)) in s
        assert not any(k[0] == "pgsched_jobs" for k in s)
        conn = served.server.catalog.conn
    assert any(k[0] == "pgsched_jobs" for k in served.samples())  # once the lock is gone,
    assert conn is not None and served.server.catalog.conn is conn  # on the same connection


def test_stop_cancels_a_blocked_scrape(pg_server: PgServer, db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A SIGTERM during a scrape blocked on the catalog took 24 s to exit: closing waited on the read.
    It cancels the read now (the timeouts raised here so that only the cancel can end it)."""
    monkeypatch.setattr(httpd, "LOCK_TIMEOUT_S", 60.0)
    monkeypatch.setattr(httpd, "STATEMENT_TIMEOUT_S", 60.0)
    for served in serving(db):
        wait(lambda w=served: w.get("/readyz")[0] == 200)
        with catalog_locked(pg_server, db), ThreadPoolExecutor(1) as pool:
            scrape = pool.submit(served.get, "/metrics")
            wait(lambda: scrape_waits_on_a_lock(db))
            began = time.monotonic()
            served.server.stop()
            assert time.monotonic() - began < 5
            code, text = scrape.result(timeout=5)
            assert code == 200 and "pgsched_up" in text and "pgsched_jobs" not in text


def test_readiness_fails_while_the_loop_is_hung(db: str) -> None:
    """A loop that stopped ticking is still connected: /readyz said 200 while /healthz said 503.
    Ready now also means healthy."""
    hold = Hold()
    for served in serving(db, hold=hold):
        wait(lambda w=served: w.get("/readyz")[0] == 200)
        hold.hold()
        assert hold.hung.wait(5)
        assert served.sched.metrics is not None and served.sched.store is not None
        served.sched.metrics.last_tick -= served.sched.settings.dead_after + 1
        assert served.get("/healthz")[0] == 503
        code, text = served.get("/readyz")
        assert code == 503 and "has not ticked" in text
        hold.release()
        wait(lambda w=served: w.get("/readyz") == (200, "ready\n"))


def has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


def status_of(url: str) -> int:
    with urllib.request.urlopen(url, timeout=5) as r:
        return int(r.status)


@pytest.mark.skipif(not has_ipv6_loopback(), reason="this machine has no IPv6 loopback (::1)")
def test_ipv6_addresses_are_served(served: Served) -> None:
    """`--http [::1]:PORT` failed (the server was AF_INET only): the family is the address's now;
    `:PORT` listens on IPv6 and IPv4 alike where the system has dual-stack sockets."""
    server = start_http("[::1]:0", served.sched)
    try:
        assert status_of(f"http://[::1]:{server.port}/healthz") == 200
    finally:
        server.stop()
    if not socket.has_dualstack_ipv6():
        return
    server = start_http(":0", served.sched)
    try:
        assert status_of(f"http://[::1]:{server.port}/healthz") == 200
        assert status_of(f"http://127.0.0.1:{server.port}/healthz") == 200
    finally:
        server.stop()


@pytest.mark.skipif(shutil.which("promtool") is None,
                    reason="promtool not installed (Debian package prometheus; ./dev installs it where it can)")
def test_promtool_accepts_the_metrics(jobs: Conn, served: Served) -> None:
    good = one(jobs, "SELECT add_job('hit', '200 milliseconds', job_name => 'a \"quoted\" name')")
    wait(lambda: runs_of(jobs, good, "success") >= 2)
    code, text = served.get("/metrics")
    assert code == 200
    r = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stdout + r.stderr


def test_bad_address_is_refused() -> None:
    for bad in ("nowhere", "host:port", "1.2.3.4:70000"):
        with pytest.raises(ConfigError, match="HOST:PORT"):
            parse_address(bad)
    assert parse_address("[::1]:9187") == ("::1", 9187) and parse_address(":9") == ("", 9)


STRAYS_OUT_OF_FDS = """
import os, resource
from pgsched import forkserver
resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
fds = []
try:
    while True:
        fds.append(os.open(os.devnull, os.O_RDONLY))
except OSError:
    pass
print(forkserver.reap_strays(set()), forkserver.reap_strays(set()))
"""


def test_reaping_strays_survives_running_out_of_file_descriptors() -> None:
    """What killed the scheduler under a flood of idle HTTP connections: the loop's scan of
    /proc/self/task raised EMFILE. Now it is skipped for the round, with one warning."""
    r = subprocess.run([sys.executable, "-c", STRAYS_OUT_OF_FDS], capture_output=True, text=True, timeout=30,
                       check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["0", "0"]
    assert r.stderr.count("cannot look for stray children") == 1, r.stderr


def test_a_loop_waiting_to_reconnect_stays_healthy() -> None:
    """Cut off from its database, the loop sleeps between reconnects (it used to spin); the backoff
    reaches reconnect_max * 1.2, past dead_after, so it also wakes every half dead_after: /healthz
    says "the loop ticked" all along (review of 2026-11-29)."""
    from pgsched.embedded import free_port
    from pgsched.httpd import health
    from pgsched.metrics import LoopMetrics

    sched = Scheduler(Settings(dsn=f"host=127.0.0.1 port={free_port()} dbname=x user=nobody connect_timeout=1",
                               max_workers=1, dead_after=1.5, heartbeat_interval=0.5, reconnect_max=3.0))
    sched.metrics = LoopMetrics()
    stop = threading.Event()
    t = threading.Thread(target=sched.run, kwargs={"until": stop.is_set})
    t.start()
    try:
        deadline = time.monotonic() + 8.0
        verdicts = []
        while time.monotonic() < deadline:
            verdicts.append(health(sched)[0])
            time.sleep(0.1)
    finally:
        stop.set()
        t.join(10)
    assert set(verdicts) == {200}, verdicts
