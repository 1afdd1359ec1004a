"""PostgreSQL failovers under load (issue 16; not part of the test suite).

    ./dev bench failover [--failovers 3] [--every 30] [--jobs 200] [--instances 3] [--seed 7]

A primary and a streaming-replication standby (pg_basebackup), both embedded clusters with
default durability; `--jobs` command jobs every 1 to 5 s writing an effect row naming their plan
(bench/chaos.py's jobs); `--instances` `pgsched serve` processes given one multi-host DSN
(`host=a,b port=... target_session_attrs=read-write`). Every `--every` seconds: kill -9 the
primary's postmaster and all its processes, promote the standby (pg_ctl promote), and once the
jobs run again re-seed the dead server as the new standby, in its own directory and port, so the
DSN keeps naming both. Per failover it reports: the runs in flight at the kill (read on the old
primary just before it) and what became of them on the new one (closed as crash, or never
replicated: their start mark was lost with the primary's last WAL), the seconds until jobs ran
again, and the seconds promotion took. At the end, on the last primary: duplicates (a plan with
two effect rows: must be 0) and plans missed outside the catch-up policy (bench/chaos.py's grid
check: must be 0). Why an asynchronous standby cannot cause a duplicate: a run's effect is
committed by the job after its start mark, later in the WAL, which the standby replays in order;
if the effect reached it, so did the start mark, and the plan is not claimed again.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
from chaos import LEAD_IN, SETTLE, Db, RunRow, create_jobs, find_gaps
from common import spawn_serve, stop_serve

from pgsched import migrate
from pgsched.embedded import Cluster


def effects(c: Cluster) -> int:
    return int(Db(c.dsn()).value("SELECT count(*) FROM chaos.effect") or 0)


def wait(probe: Any, timeout: float, what: str) -> float:
    """Seconds until `probe()` is true; TimeoutError after `timeout`."""
    t0 = time.monotonic()
    while not probe():
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"no {what} within {timeout}s")
        time.sleep(0.05)
    return time.monotonic() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--failovers", type=int, default=3)
    ap.add_argument("--every", type=float, default=30.0, help="seconds of normal running before each failover")
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--instances", type=int, default=3)
    ap.add_argument("--max-workers", type=int, default=6)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="pgsched-bench-failover-"))
    tmp.chmod(0o755)
    primary = Cluster(datadir=tmp / "a" / "data", settings={"max_connections": "200"})
    standby: Cluster | None = None
    procs = []
    try:
        primary.initdb()
        primary.start()
        primary.wait_ready()
        with psycopg.connect(primary.dsn(), autocommit=True) as c:
            migrate.init(c)
        start, rate = create_jobs(primary.dsn(), args.jobs, random.Random(args.seed), 0.4)
        standby = primary.standby(tmp / "b" / "data")
        standby.start()
        standby.wait_ready()
        dsn = psycopg.conninfo.make_conninfo(
            host=f"{primary.socket_dir},{standby.socket_dir}", port=f"{primary.port},{standby.port}",
            dbname="postgres", user="postgres", target_session_attrs="read-write", connect_timeout="2")
        logs = [tmp / f"instance-{i}.log" for i in range(args.instances)]
        procs = [spawn_serve(dsn, log, "--max-workers", str(args.max_workers)) for log in logs]
        time.sleep(LEAD_IN + 5)
        print(f"{args.jobs} jobs ({rate:.0f} runs/s planned), {args.instances} instances; failover every "
              f"{args.every:.0f}s", flush=True)
        report: list[dict[str, Any]] = []
        for k in range(args.failovers):
            time.sleep(args.every)
            old = Db(primary.dsn())
            in_flight = [int(r[0]) for r in old.rows("SELECT run_id FROM pgsched.job_run WHERE outcome = 'running'")]
            old.close()
            primary.kill()
            killed = time.monotonic()
            standby.promote()
            promote_s = time.monotonic() - killed
            at_promotion = effects(standby)
            back_s = promote_s + wait(
                lambda c=standby, n=at_promotion + args.jobs // 5: effects(c) >= n, 120, "runs on the promoted standby")
            new = Db(standby.dsn())
            # The in-flight runs as the new primary has them, once the instances have closed them.
            wait(lambda db=new, ids=in_flight: not db.rows(
                "SELECT 1 FROM pgsched.job_run WHERE run_id = ANY (%s) AND outcome = 'running'", (ids,)),
                120, "in-flight runs closed")
            fate = dict(new.rows("SELECT outcome, count(*) FROM pgsched.job_run WHERE run_id = ANY (%s) GROUP BY 1",
                                 (in_flight,)))
            new.close()
            lost = len(in_flight) - sum(fate.values())
            report.append({"failover": k + 1, "runs_in_flight": len(in_flight), "their_outcomes": fate,
                           "not_replicated": lost, "promote_s": round(promote_s, 2),
                           "jobs_run_again_after_s": round(back_s, 2)})
            print(json.dumps(report[-1]), flush=True)
            # Re-seed the dead server as the new standby, in its directory and on its port.
            dead_dir, dead_port = primary.datadir, primary.port
            shutil.rmtree(dead_dir)
            primary = standby
            standby = primary.standby(dead_dir, port=dead_port)
            standby.start()
            standby.wait_ready()
        time.sleep(SETTLE + 5)
        end_db = Db(primary.dsn())
        end = end_db.value("SELECT now()")
        for p in procs:
            stop_serve(p)
        jobs = [(int(j), int(iv), origin) for j, iv, origin in end_db.rows(
            "SELECT job_id, extract(epoch FROM schedule_interval)::int, initial_start FROM pgsched.job "
            "WHERE job_name LIKE 'chaos %' ORDER BY job_id")]
        runs = [RunRow(*r) for r in end_db.rows(
            "SELECT run_id, job_id, plan_time, outcome, result, message, instance_id, started_at, finished_at "
            "FROM pgsched.job_run ORDER BY run_id")]
        duplicates = end_db.rows("SELECT job_id, plan_time FROM chaos.effect GROUP BY 1, 2 HAVING count(*) > 1")
        gaps, _ = find_gaps(jobs, runs, end - timedelta(seconds=SETTLE))
        summary = {"scenario": "failover", "failovers": report, "duplicates": len(duplicates),
                   "missed_outside_policy": sum(len(g.slots) for g in gaps), "runs": len(runs),
                   "seconds": round((end - start).total_seconds()), "logs": str(tmp)}
        end_db.close()
        print(json.dumps(summary))
        if duplicates or gaps:
            raise SystemExit(1)
    finally:
        for p in procs:
            stop_serve(p)
        primary.destroy()
        if standby is not None:
            standby.destroy()


if __name__ == "__main__":
    main()
