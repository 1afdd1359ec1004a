"""The parent side of the process contract: launch, talk to, terminate, kill and reap workers.

Each worker is a child process in its own session, so that killing its process
group on overrun takes anything it started with it. Workers are kept between
runs (starting a Python process and a database connection per run would cap
throughput far below the target); a worker whose run crashed, timed out or lost
its connection is not reused. The protocol itself is described in worker.py.
Under `pgsched serve`, workers are forked from the fork server (pgsched/forkserver.py);
elsewhere, and if it fails, each is `python -m pgsched.worker`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pgsched import forkserver, protocol
from pgsched.forkserver import ForkServer
from pgsched.model import Run

log = logging.getLogger("pgsched.launcher")


class Forked:
    """A worker the fork server forked, with what the launcher uses of a subprocess.Popen. It is
    the scheduler's child (re-parented to it), so its exit status is read as any child's."""

    def __init__(self, pid: int, stdin_fd: int, stdout_fd: int) -> None:
        self.pid = pid
        self.args = ["pgsched.worker", "(forked)"]
        self.stdin = open(stdin_fd, "wb")  # noqa: SIM115 - closed by close_stdin, as Popen's is
        self.stdout = open(stdout_fd, "rb")  # noqa: SIM115 - closed by reap
        self.returncode: int | None = None

    def poll(self) -> int | None:
        """Its exit status (Popen's form: minus the signal that killed it), or None while it runs."""
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                log.warning("worker %s: its exit status was taken by another wait", self.pid)
                self.returncode = 255
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for its exit, as Popen.wait (subprocess.TimeoutExpired after `timeout`)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            time.sleep(0.005)
        return code


_fork_server: ForkServer | None = None
# Once a fork server started, this process is a subreaper for good (workers forked before a
# fallback are still its children): strays are looked for every so often (monotonic seconds).
_strays_at: float | None = None
STRAYS_EVERY_S = 1.0


def start_fork_server() -> None:
    """Fork new workers from now on (pgsched serve); stays as it was where that is unavailable."""
    global _fork_server, _strays_at
    if _fork_server is None:
        tried, early = forkserver.take_early()
        _fork_server = early if tried else ForkServer.start()
        if _fork_server is not None and _strays_at is None:
            _strays_at = time.monotonic()


def stop_fork_server(*, kill: bool = False) -> None:
    """Start workers as processes from now on; kill: the fork server failed to answer."""
    global _fork_server
    if _fork_server is not None:
        server, _fork_server = _fork_server, None
        server.stop(kill=kill)


def reap_strays(workers: Iterable[int]) -> None:
    """As a subreaper, reap what dead workers left behind (every STRAYS_EVERY_S), and notice a fork
    server that died (workers then start as processes)."""
    global _strays_at
    if _strays_at is None or time.monotonic() < _strays_at:
        return
    _strays_at = time.monotonic() + STRAYS_EVERY_S
    if _fork_server is not None and _fork_server.proc.poll() is not None:
        log.warning("the fork server %s: workers start as processes of their own from now on",
                    describe_exit(_fork_server.proc.returncode))
        stop_fork_server()
    known = set(workers) | ({_fork_server.proc.pid} if _fork_server is not None else set())
    forkserver.reap_strays(known)


@dataclass
class Worker:
    proc: subprocess.Popen[bytes] | Forked
    pid: int
    backend_pid: int | None = None
    role: str | None = None  # the role its session runs as (a job's owner)
    database: str | None = None  # the database its session is in (a job's); None: the scheduler's
    # The (role, database) of the idle sessions it keeps besides that one, as it last said.
    parked: frozenset[tuple[str | None, str | None]] = frozenset()
    ready: bool = False
    run: Run | None = None
    retiring: bool = False  # do not give it another run
    _buf: bytes = b""
    events: list[protocol.Event] = field(default_factory=list)

    def fileno(self) -> int:
        assert self.proc.stdout is not None
        return self.proc.stdout.fileno()

    @property
    def idle(self) -> bool:
        return self.ready and self.run is None and not self.retiring

    def send(self, msg: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(msg).encode() + b"\n")
        self.proc.stdin.flush()

    def read(self) -> bool:
        """Read what the worker wrote; False at end of file (the worker exited or closed stdout)."""
        try:
            chunk = os.read(self.fileno(), 65536)
        except BlockingIOError:
            return True
        if not chunk:
            return False
        self._buf += chunk
        *lines, self._buf = self._buf.split(b"\n")
        for line in lines:
            if line.strip():
                try:
                    self.events.append(protocol.decode(line))
                except protocol.ProtocolError as e:
                    log.warning("worker %s broke the protocol: %s", self.pid, e)
        return True

    def signal_group(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)

    def close_stdin(self) -> None:
        if self.proc.stdin and not self.proc.stdin.closed:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()


def describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by {name}"
    return f"exited with code {code}"


def launch(dsn: str, apps: tuple[str, ...] = (), sessions: int = 1) -> Worker:
    """Start one worker process; it reports 'ready' once connected (and its app modules imported).
    It keeps up to `sessions` sessions, one per owner and database (pgsched.worker.Session)."""
    given = {"PGSCHED_WORKER_DSN": dsn, "PGSCHED_PARENT_PID": str(os.getpid()),
             "PGSCHED_APP_MODULES": ",".join(apps), "PGSCHED_WORKER_SESSIONS": str(sessions)}
    env = {**forkserver.worker_environ(os.environ), **given}
    if _fork_server is not None:
        try:
            pid, stdin_fd, stdout_fd = _fork_server.fork(env)
        except OSError as e:
            log.warning("%s: workers start as processes of their own from now on", e)
            stop_fork_server(kill=True)
        else:
            forked = Forked(pid, stdin_fd, stdout_fd)
            os.set_blocking(stdout_fd, False)
            return Worker(proc=forked, pid=pid)
    proc = subprocess.Popen(
        [sys.executable, "-m", "pgsched.worker"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, start_new_session=True, close_fds=True,
    )
    assert proc.stdout is not None
    os.set_blocking(proc.stdout.fileno(), False)
    return Worker(proc=proc, pid=proc.pid)


def reap(worker: Worker, timeout: float = 5.0) -> int | None:
    """Collect the worker's exit status (killing its group if it does not exit in time)."""
    worker.close_stdin()
    try:
        code = worker.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        worker.signal_group(signal.SIGKILL)
        code = worker.proc.wait()
    if worker.proc.stdout:
        with contextlib.suppress(OSError):
            worker.proc.stdout.close()
    return code
