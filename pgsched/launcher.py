"""The parent side of the process contract: launch, talk to, terminate, kill and reap workers.

Each worker is a child process in its own session, so that killing its process
group on overrun takes anything it started with it. Workers are kept between
runs (starting a Python process and a database connection per run would cap
throughput far below the target); a worker whose run crashed, timed out or lost
its connection is not reused. The protocol itself is described in worker.py.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

from pgsched import protocol
from pgsched.model import Run

log = logging.getLogger("pgsched.launcher")


@dataclass
class Worker:
    proc: subprocess.Popen[bytes]
    pid: int
    backend_pid: int | None = None
    role: str | None = None  # the role its session runs as (a job's owner)
    database: str | None = None  # the database its session is in (a job's); None: the scheduler's
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


def launch(dsn: str, apps: tuple[str, ...] = ()) -> Worker:
    """Start one worker process; it reports 'ready' once connected (and its app modules imported)."""
    env = dict(os.environ)
    env["PGSCHED_WORKER_DSN"] = dsn
    env["PGSCHED_PARENT_PID"] = str(os.getpid())
    env["PGSCHED_APP_MODULES"] = ",".join(apps)
    env.pop("PGSCHED_CRASHPOINT", None)
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
