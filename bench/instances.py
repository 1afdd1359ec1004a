"""Database load of idle `pgsched serve` instances: how it grows with the number of instances.

    ./dev bench instances [--seconds 60] [--jobs 1000] [--counts 1,3,10]

One throwaway embedded cluster gets --jobs function jobs (add_job, daily, initial_start tomorrow: none comes due).
For each N in --counts (0 gives the baseline without pgsched), N `pgsched serve --max-workers 2` instances are
started; once every one has logged "ready:" and a few seconds have passed, the script measures over --seconds:

* transactions/s in the database: pg_stat_database xact_commit + xact_rollback, the delta over the window minus
  this script's own transaction; it includes autovacuum and anything else in the database, not only pgsched;
* the same per instance;
* CPU % (of one core) of the scheduler processes (each `serve` and its worker processes) and of the PostgreSQL
  backends serving them (application_name 'pgsched ...').

The instances are stopped (SIGTERM) between values of N. Prints a table and one JSON line per N.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from common import children, cluster, cpu_seconds, spawn_serve, stop_serve, wait_for_log

# After the last "ready", before measuring. A backend publishes its statistics at most once a second, and an idle
# one up to 10 s later (PostgreSQL's PGSTAT_IDLE_INTERVAL) or at its next transaction: the start-up transactions of
# the schedulers and their workers would otherwise be counted in the window (13 of them for one instance).
SETTLE_S = 15.0


def add_jobs(dsn: str, n: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        # Spread over a second of tomorrow; nothing is due during the measurement either way.
        conn.execute("SELECT pgsched.add_job('public.noop', '1 day', job_name => 'idle ' || g, "
                     "initial_start => now() + interval '1 day' + g * interval '1 millisecond') "
                     "FROM generate_series(1, %s) g", (n,))
    # Otherwise autovacuum comes during the first measurement, for the new cluster's catalogs and the jobs' tables.
    # In a new session: the one that added the jobs publishes its row counts as it closes, and counts published
    # after a VACUUM would call for another.
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")


def xacts(conn: psycopg.Connection[tuple[Any, ...]]) -> int:
    row = conn.execute("SELECT xact_commit + xact_rollback FROM pg_stat_database "
                       "WHERE datname = current_database()").fetchone()
    return int(row[0]) if row else 0


def backend_pids(conn: psycopg.Connection[tuple[Any, ...]]) -> list[int]:
    rows = conn.execute("SELECT pid FROM pg_stat_activity WHERE application_name LIKE 'pgsched %'").fetchall()
    return [int(r[0]) for r in rows]


def total_cpu(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            total += cpu_seconds(pid)
        except FileNotFoundError:  # a process that ended: its share is lost, reported as a warning
            print(f"warning: process {pid} is gone")
    return total


@dataclass
class Measurement:
    instances: int
    seconds: float
    xacts_per_s: float
    scheduler_cpu_percent: float
    backend_cpu_percent: float
    scheduler_processes: int
    backends: int

    def as_dict(self) -> dict[str, float | int]:
        per = self.xacts_per_s / self.instances if self.instances else 0.0
        return {"instances": self.instances, "seconds": round(self.seconds, 1),
                "transactions_per_s": round(self.xacts_per_s, 3), "transactions_per_s_per_instance": round(per, 3),
                "scheduler_cpu_percent": round(self.scheduler_cpu_percent, 3),
                "backend_cpu_percent": round(self.backend_cpu_percent, 3),
                "scheduler_processes": self.scheduler_processes, "backends": self.backends}


def measure(dsn: str, n: int, seconds: float, logdir: Path) -> Measurement:
    procs: list[subprocess.Popen[bytes]] = []
    try:
        logs = []
        for i in range(n):
            log = logdir / f"n{n}-i{i + 1}.log"
            procs.append(spawn_serve(dsn, log, "--max-workers", "2"))
            logs.append(log)
        for log in logs:
            wait_for_log(log, "ready:", 60)
        time.sleep(SETTLE_S)
        sched = [p for proc in procs for p in (proc.pid, *children(proc.pid))]
        with psycopg.connect(dsn, autocommit=True) as conn:
            backends = backend_pids(conn)
            x0, c0, b0, t0 = xacts(conn), total_cpu(sched), total_cpu(backends), time.monotonic()
            time.sleep(seconds)
            x1, c1, b1, t1 = xacts(conn), total_cpu(sched), total_cpu(backends), time.monotonic()
        wall = t1 - t0
        # The first xacts() is our one transaction inside the window (the second one is still open as it reads).
        own = 1
        return Measurement(n, wall, max(0, x1 - x0 - own) / wall, 100 * (c1 - c0) / wall, 100 * (b1 - b0) / wall,
                           len(sched), len(backends))
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            stop_serve(proc)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60.0, help="measurement window per N (default 60)")
    ap.add_argument("--jobs", type=int, default=1000, help="jobs in the catalog, none due (default 1000)")
    ap.add_argument("--counts", default="1,3,10", help="comma-separated numbers of instances (default 1,3,10)")
    args = ap.parse_args()
    counts = [int(x) for x in args.counts.split(",")]
    logdir = Path(tempfile.mkdtemp(prefix="pgsched-instances-"))
    results = []
    with cluster() as (_, dsn):
        add_jobs(dsn, args.jobs)
        for n in counts:
            m = measure(dsn, n, args.seconds, logdir)
            results.append(m)
            print(json.dumps({"scenario": "instances", "jobs": args.jobs, **m.as_dict()}), flush=True)
    print(f"\n{args.jobs} jobs, none due; --max-workers 2; {args.seconds:.0f} s per row; logs in {logdir}")
    print(f"{'N':>3}  {'xact/s total':>12}  {'xact/s per instance':>19}  {'scheduler CPU %':>15}  "
          f"{'backends CPU %':>14}")
    for m in results:
        d = m.as_dict()
        per = f"{d['transactions_per_s_per_instance']:.3f}" if m.instances else "-"
        print(f"{m.instances:>3}  {m.xacts_per_s:>12.3f}  {per:>19}  {m.scheduler_cpu_percent:>15.3f}  "
              f"{m.backend_cpu_percent:>14.3f}")


if __name__ == "__main__":
    main()
