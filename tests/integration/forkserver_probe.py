"""Run by test_forkserver.py in a process of its own (it becomes a child subreaper, which the test
runner must not): forks workers through the fork server as `pgsched serve` does, and prints what
it saw as one JSON object."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, TypeVar

from pgsched import forkserver, launcher, protocol
from pgsched.launcher import Worker

E = TypeVar("E")


def wait_for(w: Worker, want: type[E], timeout: float = 10.0) -> E:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = w.read()
        for e in w.events:
            if isinstance(e, want):
                w.events.clear()
                return e
        w.events.clear()
        if not alive:
            raise AssertionError(f"the worker exited ({launcher.reap(w, timeout=1)}) before {want}")
        time.sleep(0.005)
    raise AssertionError(f"no {want} within {timeout}s")


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def run_message(role: str, run_id: int) -> dict[str, Any]:
    return {"run_id": run_id, "job_id": 1, "kind": "command", "owner": role, "command": "INSERT INTO ran VALUES (1)",
            "config": None, "app": f"pgsched job 1 run {run_id} lease 1", "job_name": "t",
            "plan_time": "2026-01-01T00:00Z", "lease_token": 1, "scope": "", "scope_query": None, "start_at": 0}


def subreaper() -> int:
    """PR_GET_CHILD_SUBREAPER: whether this process is a child subreaper."""
    flag = ctypes.c_int(-1)
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(37, ctypes.byref(flag), 0, 0, 0)
    return flag.value


def main(dsn: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    # One started early (pgsched/cli.py, before `serve` parsed its options) and discarded (the
    # command turned out not to want it) exits, and this process is no longer a subreaper.
    forkserver.start_early()
    early = forkserver._early
    assert early is not None, "no fork server on this machine"
    out["early_subreaper"] = subreaper()
    forkserver.discard_early()
    out["discarded_exit"] = early.proc.poll()
    out["discarded_subreaper"] = subreaper()
    # One started early is the one `serve` takes.
    forkserver.start_early()
    early = forkserver._early
    launcher.start_fork_server()
    out["took_early"] = launcher._fork_server is early and forkserver._early is None
    assert launcher._fork_server is not None
    # Two workers, forked: each is this process's child, in a session of its own, and runs a job.
    workers = [launcher.launch(dsn) for _ in range(2)]
    out["forked"] = [isinstance(w.proc, launcher.Forked) for w in workers]
    ready = [wait_for(w, protocol.Ready) for w in workers]
    out["parent_is_us"] = [parent_of(w.pid) == os.getpid() for w in workers]
    out["own_session"] = [os.getsid(w.pid) == w.pid for w in workers]
    out["batch"] = [os.sched_getscheduler(w.pid) == os.SCHED_BATCH for w in workers]
    role = str(ready[0].role)
    workers[0].send(run_message(role, 1))
    done = wait_for(workers[0], protocol.Done)
    out["ran"] = done.ok
    # A killed worker's status is ours to read; one let go exits 0.
    os.kill(workers[0].pid, signal.SIGKILL)
    out["killed"] = launcher.describe_exit(launcher.reap(workers[0], timeout=5))
    out["let_go"] = launcher.reap(workers[1], timeout=5)
    # What a dead worker leaves running is re-parented to us and reaped, and a worker is not.
    keep = launcher.launch(dsn)
    wait_for(keep, protocol.Ready)
    middle = os.fork()
    if middle == 0:
        if os.fork() == 0:
            time.sleep(0.2)
            os._exit(0)
        os._exit(0)
    os.waitpid(middle, 0)
    assert launcher._fork_server is not None
    known = {keep.pid, launcher._fork_server.proc.pid}
    strays = 0
    deadline = time.monotonic() + 10
    while strays == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
        strays += forkserver.reap_strays(known)
    out["strays"] = strays
    out["kept_alive"] = keep.proc.poll() is None
    # A forked worker that cannot connect says so and exits with its own code, as a process would.
    bad = launcher.launch("host=/nonexistent-socket-dir dbname=x connect_timeout=2")
    out["bad_failed"] = isinstance(wait_for(bad, protocol.Failed), protocol.Failed)
    out["bad_exit"] = launcher.reap(bad, timeout=5)
    # A fork server that hangs (stopped) is given up on after its reply timeout and killed;
    # that worker, and the next, start as processes of their own.
    hung = launcher._fork_server.proc
    os.kill(hung.pid, signal.SIGSTOP)
    started = time.monotonic()
    after_hang = launcher.launch(dsn)
    out["hung_fallback_s"] = time.monotonic() - started
    out["hung_fallback_forked"] = isinstance(after_hang.proc, launcher.Forked)
    out["hung_server_exit"] = hung.poll()
    out["hung_fallback_ready"] = wait_for(after_hang, protocol.Ready).pid == after_hang.pid
    out["hung_server_after"] = launcher._fork_server is None
    after_hang.close_stdin()
    launcher.reap(after_hang, timeout=5)
    # A new fork server forks again; with it gone (killed), workers start as processes of their own.
    launcher.start_fork_server()
    assert launcher._fork_server is not None
    restarted = launcher.launch(dsn)
    out["restarted_forked"] = isinstance(restarted.proc, launcher.Forked)
    out["restarted_ready"] = wait_for(restarted, protocol.Ready).pid == restarted.pid
    restarted.close_stdin()
    launcher.reap(restarted, timeout=5)
    launcher._fork_server.proc.kill()
    launcher._fork_server.proc.wait()
    fallback = launcher.launch(dsn)
    out["fallback_forked"] = isinstance(fallback.proc, launcher.Forked)
    out["fallback_ready"] = wait_for(fallback, protocol.Ready).pid == fallback.pid
    for w in (keep, fallback):
        w.close_stdin()
        launcher.reap(w, timeout=5)
    out["server_after"] = launcher._fork_server is None
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
