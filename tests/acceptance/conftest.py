"""Acceptance harness: `pgsched serve` as a real subprocess, driven with signals.

`serve` is a factory fixture: each call starts the installed console script
(`<venv>/bin/pgsched serve --dsn DSN ...`) in its own process group, with its
stderr in a file, and waits (bounded) until its row in pgsched.instance exists.
Every process it starts carries a unique marker in its environment, which the
scheduler's workers inherit; on teardown the fixture SIGTERMs, then SIGKILLs the
schedulers still alive and fails the test if any process with the marker (a
worker left behind, typically) outlives them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest
from psycopg.rows import dict_row

from pgsched.embedded import Cluster

PGSCHED = Path(sys.executable).parent / "pgsched"
MARKER_VAR = "PGSCHED_ACCEPTANCE_TAG"

Conn = psycopg.Connection[tuple[Any, ...]]
T = TypeVar("T")


@contextlib.contextmanager
def own_cluster(prefix: str, settings: Mapping[str, str]) -> Iterator[Cluster]:
    """A started throwaway cluster of a test's own (the suite's shared one holds every test's
    databases), with `settings`; skipped where PGSCHED_TEST_DSN names an external server."""
    if os.environ.get("PGSCHED_TEST_DSN"):
        pytest.skip("PGSCHED_TEST_DSN names an external server: the test needs a cluster of its own")
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(tmp, 0o755)
    c = Cluster(datadir=tmp / "data", settings=dict(settings))
    try:
        c.initdb()
        c.start()
        c.wait_ready()
        yield c
    finally:
        c.destroy()


def wait_for(probe: Callable[[], T | None], timeout: float, what: str, interval: float = 0.02) -> T:
    """Poll `probe` until it returns something other than None/False; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value is not None and value is not False:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def query(dsn: str, sql: str, params: tuple[Any, ...] | None = None) -> list[dict[str, Any]]:
    """Run one query on a short-lived connection (survives server restarts and terminated sessions)."""
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row, connect_timeout=5) as c:
        return c.execute(sql, params).fetchall()


def pids_with_marker(tag: str) -> list[int]:
    """Live (non-zombie) processes whose environment carries MARKER_VAR=tag."""
    needle = f"{MARKER_VAR}={tag}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            env = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if needle in env.split(b"\0"):
            found.append(int(entry))
    return found


@dataclass
class Serve:
    """One `pgsched serve` process."""

    proc: subprocess.Popen[bytes]
    log_path: Path
    dsn: str
    tag: str  # MARKER_VAR's value in its environment and its workers'
    instance_id: int | None = None
    _log_file: Any = field(default=None, repr=False)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_lines(self) -> list[str]:
        return [line for line in self.log().splitlines() if line.strip()]

    def signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, sig)

    def wait_exit(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"pgsched serve (pid {self.pid}) did not exit within {timeout}s;\n"
                                 f"log:\n{self.log()[-3000:]}") from None

    def wait_log(self, needle: str, timeout: float) -> None:
        wait_for(lambda: needle in self.log(), timeout, f"{needle!r} in the scheduler log")

    def wait_instance(self, timeout: float = 10.0) -> int:
        def probe() -> int | None:
            if self.proc.poll() is not None:
                raise AssertionError(f"pgsched serve exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
            try:
                rows = query(self.dsn, "SELECT instance_id FROM pgsched.instance WHERE pid = %s "
                             "ORDER BY instance_id DESC LIMIT 1", (self.pid,))
            except psycopg.OperationalError:
                return None
            return int(rows[0]["instance_id"]) if rows else None

        self.instance_id = wait_for(probe, timeout, "the scheduler's pgsched.instance row")
        return self.instance_id


ServeFactory = Callable[..., Serve]


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[ServeFactory]:
    """Start `pgsched serve --dsn DSN *args`; stopped (and checked for leftovers) at teardown."""
    tag = uuid.uuid4().hex
    started: list[Serve] = []

    def start(dsn: str, *args: str, wait_instance: bool = True, env: Mapping[str, str | None] | None = None,
              executable: Path = PGSCHED, cwd: Path | None = None) -> Serve:
        """`env` is added to this process's environment (None removes a variable); `executable` is
        another installation's console script (an older release's, for the upgrade tests); `cwd`
        its working directory (this process's by default)."""
        log_path = tmp_path / f"serve-{len(started)}.log"
        log_file = open(log_path, "wb")  # noqa: SIM115 -- closed at teardown
        merged = {**os.environ, **(env or {}), MARKER_VAR: tag}
        full_env = {k: v for k, v in merged.items() if v is not None}
        proc = subprocess.Popen(
            [str(executable), "serve", "--dsn", dsn, *args],
            stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file, env=full_env, start_new_session=True,
            cwd=cwd,
        )
        s = Serve(proc=proc, log_path=log_path, dsn=dsn, tag=tag, _log_file=log_file)
        started.append(s)
        if wait_instance:
            s.wait_instance()
        return s

    yield start

    for s in started:
        if s.proc.poll() is None:
            s.signal(signal.SIGTERM)
    for s in started:
        try:
            s.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(s.proc.pid, signal.SIGKILL)
            s.proc.wait()
        s._log_file.close()
        # Shown by pytest only when the test failed.
        print(f"--- pgsched serve pid {s.pid} exit {s.proc.returncode}, log {s.log_path}:\n{s.log()[-4000:]}")
    # Workers live in their own sessions: they must go when their scheduler does.
    deadline = time.monotonic() + 5
    left = pids_with_marker(tag)
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = pids_with_marker(tag)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert not left, f"processes left behind by pgsched serve: {left}"
