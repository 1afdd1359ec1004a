"""One worker driven alone: its CPU and its backend's a trivial run (issue 13, the worker's share).

    ./dev bench worker_alone [--runs 10000] [--kind function|procedure|command] [--gap-ms 0]

A fresh cluster (no schema: the worker needs none) and one `python -m pgsched.worker`, launched
as `serve` launches one (pgsched.launcher), sent --runs runs of a trivial job one after the
other, each sent as soon as the last one's report came back, as the scheduler would. Over the
runs (after 200 to warm up): the worker's CPU a run and its backend's (user + system, from
/proc) and a run's wall time, from handing it over to reading its report. No scheduler, no
claims: what is left is the worker's own cost, its pipe, its session and its job. One JSON
object. --gap-ms: wait this long after each report before sending the next run, as a worker of a
burst waits for the scheduler's next claim: the same worker and backend then cost more a run
(their caches gone cold, the idle cores halted: on this machine, a VM, 1.1-1.4 times at 1 ms
and 2.4-2.8 times at 5 ms).
"""

from __future__ import annotations

import argparse
import json
import select
import time
from typing import Any

import psycopg
from common import cluster, cpu_seconds

from pgsched import launcher, protocol

WARM_UP = 200


def run_message(run_id: int, role: str, kind: str) -> dict[str, Any]:
    """A run of the trivial job, as the scheduler sends it (pgsched.dispatch)."""
    return {"run_id": run_id, "job_id": 1, "kind": "command" if kind == "command" else "proc", "owner": role,
            "database": None, "proc_schema": "public", "proc_name": "noop" if kind == "function" else "noop_proc",
            "is_procedure": kind == "procedure", "command": "SELECT public.noop(1, NULL)", "config": None,
            "app": f"pgsched job 1 run {run_id} lease 1", "job_name": "noop", "scope_query": None,
            "code_module": None, "code_function": None, "plan_time": "2026-11-27T00:00:00+00:00",
            "lease_token": 1, "scope": "", "attempt": 1, "start_at": 0}


def drive(w: launcher.Worker, role: str, kind: str, first: int, n: int, gap_s: float = 0.0) -> None:
    for run_id in range(first, first + n):
        if gap_s:
            time.sleep(gap_s)
        w.send(run_message(run_id, role, kind))
        while True:
            select.select([w], [], [], 5.0)  # as the scheduler waits for its workers
            if not w.read():
                raise SystemExit(f"the worker exited: {launcher.reap(w, timeout=1)}")
            done = [e for e in w.events if isinstance(e, protocol.Done)]
            if done:
                w.events.clear()
                if not done[-1].ok:
                    raise SystemExit(f"the run failed: {done[-1]}")
                break


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=10_000)
    ap.add_argument("--kind", choices=("function", "procedure", "command"), default="function")
    ap.add_argument("--gap-ms", type=float, default=0.0,
                    help="idle time between a run's report and the next run (default 0: back to back)")
    args = ap.parse_args()
    with cluster(install=False) as (_, dsn), psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE PROCEDURE public.noop_proc(job_id int, config jsonb) LANGUAGE sql AS 'SELECT NULL'")
        w = launcher.launch(dsn)
        try:
            while not any(isinstance(e, protocol.Ready) for e in w.events):
                select.select([w], [], [], 5.0)
                if not w.read():
                    raise SystemExit(f"the worker did not start: {launcher.reap(w, timeout=1)}")
            ready = next(e for e in w.events if isinstance(e, protocol.Ready))
            w.events.clear()
            role = str(ready.role)
            drive(w, role, args.kind, 1, WARM_UP, args.gap_ms / 1000)
            cpu0, backend0, t0 = cpu_seconds(w.pid), cpu_seconds(int(ready.backend_pid or 0)), time.monotonic()
            drive(w, role, args.kind, WARM_UP + 1, args.runs, args.gap_ms / 1000)
            cpu1, backend1, t1 = cpu_seconds(w.pid), cpu_seconds(int(ready.backend_pid or 0)), time.monotonic()
        finally:
            w.close_stdin()
            launcher.reap(w, timeout=5)
    n = args.runs
    print(json.dumps({"kind": args.kind, "runs": n, "gap_ms": args.gap_ms,
                      "worker_us": round(1e6 * (cpu1 - cpu0) / n, 1),
                      "backend_us": round(1e6 * (backend1 - backend0) / n, 1),
                      "wall_us": round(1e6 * (t1 - t0) / n, 1)}))


if __name__ == "__main__":
    main()
