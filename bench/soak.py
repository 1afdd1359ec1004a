"""A long run (issue 16's soak; not part of the test suite): do memory, descriptors or connections grow?

    ./dev bench soak [--minutes 60] [--instances 3] [--max-workers 6] [--seed 7]

One embedded cluster with default durability; about 100 runs/s in all: 170 SQL jobs every 1 to 5 s
writing an effect row naming their plan (bench/chaos.py's jobs, on a fixed grid), 40 Python handlers
every 2 s doing the same (bench/soakjobs.py; one in ten fails), 10 SQL jobs every 5 s that fail,
5 every 10 s that time out (max_runtime 200 ms, they sleep 2 s), 2 every 15 s that end their own
session (a lost connection mid-run). `--instances` `pgsched serve` run them. Every minute the
script samples, per instance, the scheduler's and its workers' RSS and open descriptors, and the
database's client connections. At the end it checks: RSS at the end against the first sample after
five minutes of warm-up (growth must stay under 10 %; a worker's RSS grows for its first few
minutes as it meets each kind of job, and a replaced worker starts small again), descriptors and connections (constant),
duplicates (a plan with two effect rows: 0) and plans of the fixed-grid jobs missed outside the
catch-up policy (0). Prints one JSON object; exit status 1 if a check fails. Logs are kept in the
directory it names.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
from chaos import SETTLE, Db, RunRow, create_jobs, find_gaps
from common import children, spawn_serve, stop_serve

from pgsched import migrate
from pgsched.embedded import Cluster

WARM_UP = float(os.environ.get("PGSCHED_SOAK_WARM_UP", "300"))


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def sample(procs: list[subprocess.Popen[bytes]], db: Db) -> dict[str, Any]:
    out: dict[str, Any] = {"t": round(time.monotonic()), "schedulers": [], "connections": 0}
    for p in procs:
        kids = [k for k in children(p.pid) if Path(f"/proc/{k}").exists()]
        out["schedulers"].append({
            "rss_kb": rss_kb(p.pid), "fds": fds(p.pid), "workers": len(kids),
            "workers_rss_kb": sum(rss_kb(k) for k in kids), "workers_fds": sum(fds(k) for k in kids)})
    out["connections"] = int(db.value("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                      "AND backend_type = 'client backend'") or 0)
    return out


def add_other_jobs(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        for i in range(10):
            c.execute("SELECT pgsched.schedule(%s, '5 seconds', 'SELECT 1/0')", (f"soak fail {i}",))
        for i in range(5):
            row = c.execute("SELECT pgsched.schedule(%s, '10 seconds', 'SELECT pg_sleep(2)')",
                            (f"soak timeout {i}",)).fetchone()
            assert row is not None
            c.execute("SELECT FROM pgsched.alter_job(%s, max_runtime => '200 milliseconds')", (row[0],))
        for i in range(2):
            c.execute("SELECT pgsched.schedule(%s, '15 seconds', 'SELECT pg_terminate_backend(pg_backend_pid())')",
                      (f"soak lost {i}",))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=60.0)
    ap.add_argument("--instances", type=int, default=3)
    ap.add_argument("--max-workers", type=int, default=6)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="pgsched-bench-soak-"))
    tmp.chmod(0o755)
    c = Cluster(datadir=tmp / "data", settings={"max_connections": "200"})
    procs: list[subprocess.Popen[bytes]] = []
    try:
        c.initdb()
        c.start()
        c.wait_ready()
        with psycopg.connect(c.dsn(), autocommit=True) as conn:
            migrate.init(conn)
        start, rate = create_jobs(c.dsn(), 170, random.Random(args.seed), 0.05)
        with psycopg.connect(c.dsn(), autocommit=True) as conn:
            conn.execute("CREATE SCHEMA IF NOT EXISTS soak")
            conn.execute("CREATE TABLE soak.effect (job_id int NOT NULL, plan_time timestamptz NOT NULL, "
                         "run_id bigint NOT NULL)")
        add_other_jobs(c.dsn())
        env_path = str(Path(__file__).resolve().parent)
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (env_path, os.environ.get("PYTHONPATH")) if p)
        logs = [tmp / f"instance-{i}.log" for i in range(args.instances)]
        procs = [spawn_serve(c.dsn(), log, "--max-workers", str(args.max_workers), "--app", "soakjobs")
                 for log in logs]
        db = Db(c.dsn())
        began = time.monotonic()
        samples: list[dict[str, Any]] = []
        print(f"soak: {args.minutes:.0f} min, {args.instances} instances, ~{rate + 20 + 2.5:.0f} runs/s planned; "
              f"logs in {tmp}", flush=True)
        while time.monotonic() - began < args.minutes * 60:
            time.sleep(60)
            samples.append(sample(procs, db))
            print(json.dumps(samples[-1]), flush=True)
        time.sleep(SETTLE)
        end = db.value("SELECT now()")
        for p in procs:
            stop_serve(p)
        warm = [s for s in samples if s["t"] - began >= WARM_UP] or samples
        first, last = warm[0], warm[-1]

        def total(s: dict[str, Any], key: str) -> int:
            return sum(int(x[key]) for x in s["schedulers"])

        def per_worker(s: dict[str, Any]) -> float:
            return total(s, "workers_rss_kb") / max(1, total(s, "workers"))

        growth = {
            "schedulers_rss": round(total(last, "rss_kb") / total(first, "rss_kb") - 1, 4),
            "worker_rss_each": round(per_worker(last) / per_worker(first) - 1, 4),
        }
        fd_range = [min(total(s, "fds") for s in warm), max(total(s, "fds") for s in warm)]
        conn_range = [min(s["connections"] for s in warm), max(s["connections"] for s in warm)]
        jobs = [(int(j), int(iv), origin) for j, iv, origin in db.rows(
            "SELECT job_id, extract(epoch FROM schedule_interval)::int, initial_start FROM pgsched.job "
            "WHERE job_name LIKE 'chaos %' ORDER BY job_id")]
        runs = [RunRow(*r) for r in db.rows(
            "SELECT run_id, job_id, plan_time, outcome, result, message, instance_id, started_at, finished_at "
            "FROM pgsched.job_run WHERE job_id = ANY (%s) ORDER BY run_id", ([j for j, _, _ in jobs],))]
        gaps, _ = find_gaps(jobs, runs, end - timedelta(seconds=SETTLE))
        duplicates = int(db.value(
            "SELECT count(*) FROM (SELECT job_id, plan_time FROM chaos.effect GROUP BY 1, 2 HAVING count(*) > 1 "
            "UNION ALL SELECT job_id, plan_time FROM soak.effect GROUP BY 1, 2 HAVING count(*) > 1) d") or 0)
        outcomes = dict(db.rows("SELECT outcome, count(*) FROM pgsched.job_run GROUP BY 1 ORDER BY 1"))
        seconds = (end - start).total_seconds()
        summary = {
            "scenario": "soak", "minutes": args.minutes, "instances": args.instances,
            "runs_per_s": round(sum(n for o, n in outcomes.items() if o not in ("skipped", "missed")) / seconds, 1),
            "outcomes": outcomes, "rss_growth": growth,
            "schedulers_rss_mb": [round(total(first, "rss_kb") / 1024, 1), round(total(last, "rss_kb") / 1024, 1)],
            "worker_rss_mb_each": [round(per_worker(first) / 1024, 1), round(per_worker(last) / 1024, 1)],
            "fds_min_max": fd_range, "connections_min_max": conn_range,
            "connections_median": statistics.median(s["connections"] for s in warm),
            "duplicates": duplicates, "missed_outside_policy": sum(len(g.slots) for g in gaps), "logs": str(tmp),
        }
        db.close()
        print(json.dumps(summary))
        ok = (growth["schedulers_rss"] < 0.10 and growth["worker_rss_each"] < 0.10 and not duplicates and not gaps)
        if not ok:
            raise SystemExit(1)
    finally:
        for p in procs:
            stop_serve(p)
        c.stop("immediate")


if __name__ == "__main__":
    main()
