"""Where a trivial run's CPU goes (issue 13: at most 0.6 ms a run, all processes counted).

    ./dev bench cpu_split [--workers N] [--seconds 20] [--rounds 1] [--dependencies]

The throughput load of `./dev bench scheduler throughput` (400 trivial function jobs always due,
a fresh cluster, `serve --max-workers N`); over --seconds, the CPU (user + system, from /proc) of
each process a run involves, per run: the scheduler process, its workers, the scheduler's
backend (its claims and closes), the workers' backends (the jobs, their set-up and the session
reset) and PostgreSQL's other processes (the WAL writer, autovacuum, the purge's session). Runs
are counted from job_stat. One JSON object per round. --dependencies: the load of `throughput
--dependencies` (half the jobs '@after' the one before them), alternated round by round with the
load without, so that the cost of the dependency's bookkeeping shows part by part.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import psycopg
import scheduler
from common import PARTS, cluster, cpu_by_part, serve, serve_default_workers, wait_for_log
from scheduler import add_jobs


def one_round(workers: int, seconds: float, dependencies: bool) -> dict[str, Any]:
    scheduler.DEPENDENCIES = dependencies
    with cluster() as (c, dsn):
        add_jobs(dsn, 400, "noop", "1 millisecond", fixed=False, delay_s=0)
        scheduler.use_workflow_settings(dsn, scheduled_dependents=False)
        with serve(dsn, "--max-workers", str(workers)) as (proc, log), \
                psycopg.connect(dsn, autocommit=True) as conn:
            wait_for_log(log, "ready:", 30)
            time.sleep(2)
            pm = c.postmaster_pid()
            assert pm is not None

            def runs() -> int:
                row = conn.execute("SELECT coalesce(sum(total_successes), 0) FROM pgsched.job_stat").fetchone()
                return int(row[0]) if row else 0

            n0, t0, c0 = runs(), time.monotonic(), cpu_by_part(conn, proc.pid, pm)
            time.sleep(seconds)
            n1, t1, c1 = runs(), time.monotonic(), cpu_by_part(conn, proc.pid, pm)
    n = max(n1 - n0, 1)
    per_run = {f"{k}_us": round(1e6 * (c1[k] - c0[k]) / n, 1) for k in PARTS}
    return {"workers": workers, "dependencies": dependencies, "runs_per_s": round(n / (t1 - t0), 1), **per_run,
            "total_us": round(sum(per_run.values()), 1), "target_total_us": 600}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=None,
                    help="serve --max-workers (default: serve's own on a cluster of 100 connections)")
    ap.add_argument("--seconds", type=float, default=20.0, help="length of the measure (default 20)")
    ap.add_argument("--rounds", type=int, default=1, help="rounds, each on a fresh cluster (default 1)")
    ap.add_argument("--dependencies", action="store_true",
                    help="each round twice, without and with half the jobs '@after' another (the order "
                         "alternating)")
    args = ap.parse_args()
    for i in range(args.rounds):
        for deps in ((False, True) if i % 2 == 0 else (True, False)) if args.dependencies else (False,):
            print(json.dumps(one_round(args.workers or serve_default_workers(), args.seconds, deps)), flush=True)


if __name__ == "__main__":
    main()
