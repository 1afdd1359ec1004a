"""Helpers shared by the benchmark scripts in bench/: a throwaway cluster, `pgsched serve` subprocesses, /proc readings.

Not a benchmark itself. The scripts are run as `python bench/NAME.py` (`./dev bench NAME`), so this module is
imported as `common` from the script's own directory.
"""

from __future__ import annotations

import compileall
import functools
import inspect
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

import pgsched
from pgsched import migrate
from pgsched.embedded import Cluster

PGSCHED = str(Path(sys.executable).parent / "pgsched")
# The tree whose pgsched this bench imported (PYTHONPATH picks a worktree for a before/after).
# `serve` runs there: its workers are `python -m pgsched.worker`, which imports from the working
# directory first, so from anywhere else they would run that directory's code, not the tree's.
TREE = Path(pgsched.__file__).resolve().parent.parent


# The benches' clusters have PostgreSQL's default max_connections, 3 of them reserved for
# superusers (superuser_reserved_connections' default): what serve's default worker count
# takes its share of.
MAX_CONNECTIONS = 100
RESERVED_CONNECTIONS = 3


@contextmanager
def cluster(*, install: bool = True, settings: dict[str, str] | None = None) -> Iterator[tuple[Cluster, str]]:
    """A throwaway cluster with bench_start, noop and mark, and (install) this checkout's schema;
    `settings`: more server settings."""
    tmp = tempfile.mkdtemp(prefix="pgsched-bench-")
    os.chmod(tmp, 0o755)
    c = Cluster(datadir=Path(tmp) / "data", settings={"max_connections": str(MAX_CONNECTIONS), **(settings or {})})
    c.initdb()
    c.start()
    c.wait_ready()
    try:
        dsn = c.dsn()
        with psycopg.connect(dsn, autocommit=True) as conn:
            if install:
                migrate.init(conn)
            conn.execute("CREATE TABLE bench_start (job_id int, at timestamptz DEFAULT clock_timestamp())")
            conn.execute("CREATE FUNCTION public.noop(job_id int, config jsonb) RETURNS void "
                         "LANGUAGE sql AS 'SELECT NULL'")
            conn.execute("CREATE FUNCTION public.mark(job_id int, config jsonb) RETURNS void LANGUAGE sql "
                         "AS 'INSERT INTO bench_start (job_id) VALUES (job_id)'")
        yield c, dsn
    finally:
        c.destroy()


@contextmanager
def worktree(ref: str) -> Iterator[Path]:
    """A temporary `git worktree` of `ref` (this checkout's repository), removed afterwards."""
    tree = Path(tempfile.mkdtemp(prefix="pgsched-bench-tree-")) / "tree"
    subprocess.run(["git", "-C", str(TREE), "worktree", "add", "--detach", str(tree), ref],
                   check=True, capture_output=True)
    try:
        yield tree
    finally:
        subprocess.run(["git", "-C", str(TREE), "worktree", "remove", "--force", str(tree)], check=False,
                       capture_output=True)


def serve_default_workers() -> int:
    """`serve`'s own default --max-workers in the tree measured on a cluster() (8 before it came
    from the machine; from the server's connections too since 2026-12-03)."""
    try:
        from pgsched.settings import default_max_workers
    except ImportError:
        return 8
    if "connections" not in inspect.signature(default_max_workers).parameters:
        return default_max_workers()
    return default_max_workers(connections=MAX_CONNECTIONS - RESERVED_CONNECTIONS)


@functools.cache
def compile_tree() -> None:
    """Write the bytecode of the tree's modules, as installing a package does (pip compiles what
    it installs). An editable tree run with PYTHONDONTWRITEBYTECODE (as on this machine) would
    otherwise compile pgsched's modules at every start of `serve` and of its fork server: about
    0.1 to 0.3 s that no installed pgsched pays."""
    compileall.compile_dir(TREE / "pgsched", quiet=1)


def spawn_serve(dsn: str, log: Path, *args: str) -> subprocess.Popen[bytes]:
    """Start `pgsched serve` with JSON logs written to `log`; the caller stops it."""
    compile_tree()
    with open(log, "wb") as f:
        return subprocess.Popen([PGSCHED, "serve", "--dsn", dsn, "--log-format", "json", "--log-level", "info",
                                 *args], stderr=f, stdout=subprocess.DEVNULL, cwd=TREE)


def stop_serve(proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    """SIGTERM (runs in progress may end), then SIGKILL if it is still there after `timeout`."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextmanager
def serve(dsn: str, *args: str) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    log = Path(tempfile.mkstemp(prefix="pgsched-bench-", suffix=".log")[1])
    proc = spawn_serve(dsn, log, *args)
    try:
        yield proc, log
    finally:
        stop_serve(proc)


def wait_for_log(log: Path, text: str, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in log.read_text().splitlines():
            if text in line:
                rec: dict[str, Any] = json.loads(line)
                return rec
        time.sleep(0.02)
    raise TimeoutError(f"no log line with {text!r} within {timeout}s")


def cpu_seconds(pid: int, *, reaped: bool = False) -> float:
    """The CPU time (user + system) of `pid`; reaped: and of its children that exited and it waited for.

    The process's own time comes from /proc/PID/schedstat, in nanoseconds. /proc/PID/stat counts in
    clock ticks (10 ms here) and on this machine misses much of a process that runs in short
    bursts and sleeps: a burst's 24 job sessions read 170 ms there against 324 ms here (README,
    "CPU figures"). The reaped children's time is only in stat's ticks."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    try:
        own = int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9
    except (FileNotFoundError, IndexError, ValueError):
        own = (int(fields[11]) + int(fields[12])) / ticks  # utime + stime
    return own + ((int(fields[13]) + int(fields[14])) / ticks if reaped else 0.0)  # + cutime + cstime


def tree_cpu_seconds(*roots: int) -> float:
    """CPU time (user + system) of `roots` and all of their descendants, living or exited: the
    scheduler with its workers, the postmaster with its backends. An exited one is counted in its
    parent's, which waited for it (a worker that reconnected as another owner left a backend that
    exited). On a shared machine, a cost per run that the others' load moves less than it moves
    runs per second."""
    total, todo, seen = 0.0, list(roots), set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            total += cpu_seconds(pid, reaped=True)
        except (FileNotFoundError, ProcessLookupError):
            continue
        todo += children(pid)
    return total


def parent_pid(pid: int) -> int | None:
    """The parent of `pid`, None if it is gone."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
        return None


def children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False).stdout
    return [int(x) for x in out.split()]


# What a run's CPU is split into (cpu_by_part).
PARTS = ("scheduler", "workers", "scheduler_backend", "worker_backends", "postgres_other")


def pgbench_tps(c: Cluster, script_text: str, clients: int, seconds: int, *, protocol: str = "simple",
                options: str | None = None) -> float:
    """Transactions a second of pgbench running `script_text` on `c` with `clients` connections for
    `seconds` (`protocol`: pgbench's -M; `options`: the sessions' PGOPTIONS)."""
    script = Path(tempfile.mkstemp(suffix=".sql")[1])
    try:
        script.write_text(script_text)
        os.chmod(script, 0o644)  # pgbench may run as the cluster's owner
        cmd = [str(c.bindir / "pgbench"), "-n", "-M", protocol, "-c", str(clients), "-j", "2", "-T", str(seconds),
               "-f", str(script), "-h", str(c.socket_dir), "-p", str(c.port), "-U", "postgres", "postgres"]
        env = {**os.environ, **({"PGOPTIONS": options} if options else {})}
        out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout
    finally:
        script.unlink()
    for line in out.splitlines():
        if line.startswith("tps ="):
            return float(line.split()[2])
    raise RuntimeError(out)


def cpu_by_part(conn: psycopg.Connection[Any], scheduler_pid: int, postmaster_pid: int) -> dict[str, float]:
    """The CPU seconds (user + system) so far of each process a run involves, summed by PARTS: the
    scheduler, its workers, the scheduler's backend, the workers' backends (named by
    application_name) and PostgreSQL's other processes."""
    out = dict.fromkeys(PARTS, 0.0)
    out["scheduler"] = cpu_seconds(scheduler_pid)
    for pid in children(scheduler_pid):
        out["workers"] += seconds_or_zero(pid)
    apps = {int(r[0]): str(r[1] or "") for r in conn.execute("SELECT pid, application_name FROM pg_stat_activity")}
    for pid in children(postmaster_pid):
        app = apps.get(pid, "")
        part = ("scheduler_backend" if app == "pgsched scheduler"
                # a worker's backend is named after its run while it runs one (pgsched.protocol.run_app_name)
                else "worker_backends" if app == "pgsched worker idle" or app.startswith("pgsched job ")
                else "postgres_other")
        out[part] += seconds_or_zero(pid)
    return out


def seconds_or_zero(pid: int) -> float:
    try:
        return cpu_seconds(pid)
    except (FileNotFoundError, ProcessLookupError):
        return 0.0  # it ended between the listing and the read


def cpu_spent(before: dict[str, float], after: dict[str, float], runs: int) -> dict[str, Any]:
    """What cpu_by_part read twice says: each part's CPU in between (ms), and all of it a run (µs)."""
    return {"cpu_ms": {k: round(1000 * (after[k] - before[k])) for k in PARTS},
            "cpu_us_per_run": round(1e6 * sum(after[k] - before[k] for k in PARTS) / runs)}


def sleep_until(conn: psycopg.Connection[Any], at: Any, early_s: float = 0.0) -> None:
    """Sleep until `early_s` seconds before the database's clock reaches `at` (a timestamptz)."""
    conn.execute("SELECT pg_sleep(greatest(0, extract(epoch FROM %s - now()) - %s))", (at, early_s))
