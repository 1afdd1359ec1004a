"""The fork server: new workers forked from a process that has already imported the worker.

A worker started as `python -m pgsched.worker` spends most of its start on the interpreter and
its imports (psycopg, pgsched), before it connects: every new worker paid it, after a start, a
crash or a timeout. `pgsched serve` starts one fork server at once, in parallel with its own
start; each worker is then a fork of it, and pays only for its connection.

Each worker stays a child of the scheduler, as one it launched itself would be: the scheduler
becomes a child subreaper (Linux's PR_SET_CHILD_SUBREAPER), and the fork server forks twice, so
that the worker's first parent exits at once and the worker is re-parented to the scheduler. The
scheduler then waits for it, reads its exit status and signals its process group as any child's
(pgsched/launcher.py). Its own stdin and stdout are pipes the scheduler made and passed over a
Unix socket (SCM_RIGHTS). The fork server dies with the scheduler (PR_SET_PDEATHSIG) and when
its socket closes. Where any of this is unavailable (not Linux, the server died), the launcher
starts workers as processes of their own, as before.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import NoReturn

log = logging.getLogger("pgsched.forkserver")

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
# How long the scheduler waits for a fork: far above a fork's milliseconds, and short, as the
# scheduler's loop waits meanwhile; past it the fork server is taken for dead (and killed) and
# workers start as processes.
REPLY_TIMEOUT_S = 1.0


def prctl(option: int, value: int) -> bool:
    """Linux's prctl(2); False where it is unavailable or refused."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        return int(libc.prctl(option, value, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def environ_changes(base: Mapping[str, str], wanted: Mapping[str, str]) -> dict[str, str | None]:
    """What turns environment `base` into `wanted`: the variables to set, and None for those to
    remove. A fork is sent only this: the fork server may have started before `serve` read its
    options (pgsched/cli.py starts it first), and the environment may have changed since."""
    changes: dict[str, str | None] = {k: v for k, v in wanted.items() if base.get(k) != v}
    changes.update({k: None for k in base if k not in wanted})
    return changes


def worker_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment a worker starts with: the scheduler's, less its crash point (a test's
    PGSCHED_CRASHPOINT is the scheduler's to hit, never a worker's)."""
    return {k: v for k, v in environ.items() if k != "PGSCHED_CRASHPOINT"}


class ForkServer:
    """The scheduler's side: start the server, ask it for workers, stop it."""

    def __init__(self, proc: subprocess.Popen[bytes], sock: socket.socket, environ: dict[str, str]) -> None:
        self.proc = proc
        self.environ = environ  # the fork server's own, which each worker starts from
        self.sock = sock
        self.sock.settimeout(REPLY_TIMEOUT_S)

    @classmethod
    def start(cls) -> ForkServer | None:
        """Start one; None where workers cannot be forked and re-parented (the launcher then
        starts them as processes)."""
        if not sys.platform.startswith("linux") or not prctl(PR_SET_CHILD_SUBREAPER, 1):
            return None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        env = worker_environ(os.environ)
        try:
            # Its own session: a hangup or signal to the scheduler's process group (a terminal's) is the
            # scheduler's to act on; the fork server goes when the scheduler does (PR_SET_PDEATHSIG).
            proc = subprocess.Popen(
                [sys.executable, "-m", "pgsched.forkserver", str(theirs.fileno()), str(os.getpid())],
                pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env=env,
                start_new_session=True,
            )
        except OSError as e:
            log.warning("cannot start the fork server (workers start as processes of their own): %s", e)
            ours.close()
            prctl(PR_SET_CHILD_SUBREAPER, 0)
            return None
        finally:
            theirs.close()
        return cls(proc, ours, env)

    def fork(self, env: Mapping[str, str]) -> tuple[int, int, int]:
        """A new worker with this environment (as a worker process would be given): its pid, and
        the write end of its stdin and the read end of its stdout. OSError when the fork server
        cannot give one."""
        changes = environ_changes(self.environ, env)
        stdin_r, stdin_w = os.pipe()
        stdout_r, stdout_w = os.pipe()
        try:
            socket.send_fds(self.sock, [json.dumps(changes).encode() + b"\n"], [stdin_r, stdout_w])
            reply = b""
            while not reply.endswith(b"\n"):
                chunk = self.sock.recv(64)
                if not chunk:
                    raise OSError("the fork server closed its socket")
                reply += chunk
            pid = int(reply)
        except (OSError, ValueError) as e:
            os.close(stdin_w)
            os.close(stdout_r)
            raise OSError(f"the fork server gave no worker: {e}") from e
        finally:
            os.close(stdin_r)
            os.close(stdout_w)
        if pid <= 0:
            os.close(stdin_w)
            os.close(stdout_r)
            raise OSError("the fork server could not fork")
        return pid, stdin_w, stdout_r

    def stop(self, *, kill: bool = False) -> None:
        """Close its socket (it exits) and wait for it; kill: one that failed to answer, at once."""
        self.sock.close()
        if kill:
            self.proc.kill()
        try:
            self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# One started by pgsched/cli.py before the command line was parsed, until `serve` takes or
# discards it; tried: whether that start was tried (where it failed, `serve` does not try again).
_early: ForkServer | None = None
_early_tried = False


def start_early() -> None:
    """Start a fork server now, for `serve` to take (take_early) or discard (discard_early)."""
    global _early, _early_tried
    if not _early_tried:
        _early_tried = True
        _early = ForkServer.start()


def take_early() -> tuple[bool, ForkServer | None]:
    """Whether a start was tried early, and the fork server it gave (None: none could start);
    from now on the caller's."""
    global _early, _early_tried
    tried, server = _early_tried, _early
    _early, _early_tried = None, False
    return tried, server


def discard_early() -> None:
    """Kill the fork server started early, if any (it has forked nothing yet), and no longer be a
    subreaper."""
    _, server = take_early()
    if server is not None:
        server.stop(kill=True)
        prctl(PR_SET_CHILD_SUBREAPER, 0)


_strays_unlisted = False  # reap_strays could not list this process' children (warned once)


def reap_strays(known: set[int]) -> int:
    """Reap the children this process did not start: as a subreaper, it inherits whatever a worker
    left running when it died. Its children are read from /proc (a wait for any child would take a
    worker's exit status, which its launcher reads); those in `known` are left alone. How many."""
    global _strays_unlisted
    reaped = 0
    try:
        tasks = list(Path("/proc/self/task").glob("*/children"))
    except OSError as e:
        # Out of file descriptors (EMFILE), say: strays wait for a later round, and the loop that
        # called this goes on (it died here once). Warned once: this may repeat every round.
        (log.debug if _strays_unlisted else log.warning)("cannot look for stray children: %s", e)
        _strays_unlisted = True
        return 0
    for children in tasks:
        try:
            pids = [int(p) for p in children.read_text().split()]
        except OSError:
            continue  # a thread that ended meanwhile
        for pid in pids:
            if pid in known:
                continue
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(pid, os.WNOHANG)[0]:
                    reaped += 1
    return reaped


# -- the fork server's own side ----------------------------------------------------------------
def _serve(sock: socket.socket, scheduler_pid: int) -> None:
    """Fork a worker for each request, until the scheduler closes the socket."""
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(sock, 1 << 16, 2)
        except OSError:
            return
        if not msg:
            return  # the scheduler closed its end, or died
        env = json.loads(msg)
        first = os.fork()
        if first == 0:
            # The first child: forks the worker and exits, so that the worker is re-parented
            # to the scheduler (a subreaper) and is its child from then on.
            try:
                pid = os.fork()
            except OSError:
                pid = -1  # the scheduler starts this worker as a process instead
            if pid == 0:
                _become_worker(env, fds, sock, scheduler_pid)
            with contextlib.suppress(OSError):
                sock.sendall(f"{pid}\n".encode())
            os._exit(0)
        os.waitpid(first, 0)
        for fd in fds:
            os.close(fd)


def _become_worker(env: dict[str, str | None], fds: list[int], sock: socket.socket, scheduler_pid: int) -> NoReturn:
    """In the forked worker: what `python -m pgsched.worker` would have been given, then its main,
    and its exit as that process's (SystemExit, atexit, the interpreter's flushes)."""
    os.setsid()  # its own process group, which the scheduler kills on overrun
    # sys.stdin and sys.stdout are the fork server's, on descriptors 0 and 1, and never used
    # there: they now read and write the worker's pipes, as a new process's would.
    os.dup2(fds[0], 0)
    os.dup2(fds[1], 1)
    sock.detach()  # closed below with the rest, without the object closing a reused number later
    os.closerange(3, max(os.sysconf("SC_OPEN_MAX"), 1024))
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    for name, value in env.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    # The fork server may have started before `serve` put the app modules' directory on
    # PYTHONPATH (pgsched/commands.py), so its sys.path, which this process inherits, can lack it.
    for path in reversed((env.get("PYTHONPATH") or "").split(os.pathsep)):
        if path and path not in sys.path:
            sys.path.insert(0, path)
    from pgsched import worker

    sys.argv = [worker.__file__]
    # Re-parenting happens when the first child exits, a moment from now: the worker's own
    # check of its parent (pgsched.worker._die_with_parent) must see the scheduler.
    deadline = time.monotonic() + REPLY_TIMEOUT_S
    while os.getppid() != scheduler_pid and time.monotonic() < deadline:
        time.sleep(0.001)
    sys.exit(worker.main())


def main(argv: list[str]) -> int:
    """The fork server: its socket's descriptor and the scheduler's pid are its arguments."""
    sock = socket.socket(fileno=int(argv[0]))
    scheduler_pid = int(argv[1])
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != scheduler_pid:
        return 0  # the scheduler died before the call above
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the scheduler decides when it goes
    # What every worker needs, imported once here.
    import psycopg  # noqa: F401

    from pgsched import worker  # noqa: F401

    _serve(sock, scheduler_pid)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
