"""How long the other instances take to go on with a job every second when the instance doing it stops.

    ./dev bench takeover [--tries 5]

One throwaway cluster, default settings. Each try starts two `pgsched serve --max-workers 2` (three for the
saturated case), adds one job every second whose run lasts 0.3 s, lets it run, and then, per case:

* between: kill -9 of the instance that ran the last run (scheduler and workers at once), just after that run ended;
* during: the same, while it runs a run (which the survivor closes as a crash; the job's retry_period is 1 s);
* graceful: SIGTERM of that instance between two runs;
* saturated: an instance with one worker keeps it busy 8 s with a Python job only it can run, while a job every
  second is due (it last ran there); the figure is the longest stall between two starts of that job.

The figure is the time from the event to the next start of the job on another instance (database clock), or the
longest stall for `saturated`. Prints one JSON line per case with min, median and max over the tries.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import signal
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
from common import children, cluster, spawn_serve, stop_serve
from psycopg.rows import dict_row

from pgsched import migrate

REPO = Path(__file__).resolve().parent.parent
JOB = "SELECT pgsched.add_job('public.sleeper', '1 second', config => %s, retry_period => '1 second')"
SLEEPER = """CREATE OR REPLACE PROCEDURE public.sleeper(job_id integer, config jsonb) LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_sleep((config->>'s')::float8); END $$"""


def q(dsn: str, sql: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as c:
        cur = c.execute(sql, params)
        return cur.fetchall() if cur.description else []


def wait(probe: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = probe()
        if v:
            return v
        time.sleep(0.02)
    raise TimeoutError(what)


def runs(dsn: str, job: int) -> list[dict[str, Any]]:
    return q(dsn, "SELECT run_id, outcome, started_at, instance_id FROM pgsched.job_run WHERE job_id = %s "
                  "AND started_at IS NOT NULL ORDER BY started_at", (job,))


def with_db(dsn: str, db: str) -> str:
    return psycopg.conninfo.make_conninfo(dsn, dbname=db)


def now(dsn: str) -> datetime:
    t: datetime = q(dsn, "SELECT clock_timestamp() AS t")[0]["t"]
    return t


class Instances:
    def __init__(self, dsn: str, tmp: Path) -> None:
        self.dsn, self.tmp = dsn, tmp
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    def start(self, *args: str) -> int:
        log = self.tmp / f"serve-{len(self.procs)}-{time.monotonic_ns()}.log"
        p = spawn_serve(self.dsn, log, *args)
        iid: int = wait(lambda: q(self.dsn, "SELECT instance_id FROM pgsched.instance WHERE pid = %s", (p.pid,)),
                        15, "instance row")[0]["instance_id"]
        self.procs[iid] = p
        return iid

    def kill_host(self, iid: int) -> None:
        p = self.procs.pop(iid)
        for pid in [p.pid, *children(p.pid)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        p.wait()

    def stop(self, iid: int) -> None:
        stop_serve(self.procs.pop(iid))

    def stop_all(self) -> None:
        for iid in list(self.procs):
            self.stop(iid)


def one_try(base_dsn: str, case: str, tmp: Path, n: int) -> float:
    db = f"takeover_{case}_{n}"
    q(base_dsn, f"CREATE DATABASE {db} TEMPLATE bench_template")
    dsn = with_db(base_dsn, db)
    inst = Instances(dsn, tmp)
    try:
        if case == "saturated":
            return saturated(dsn, inst)
        ids = [inst.start("--max-workers", "2"), inst.start("--max-workers", "2")]
        job = int(q(dsn, JOB, (json.dumps({"s": 3 if case == "during" else 0.3}),))[0]["add_job"])
        if case == "during":
            run = wait(lambda: [r for r in runs(dsn, job) if r["outcome"] == "running"], 10, "a run")[0]
        else:
            count = len(runs(dsn, job))
            wait(lambda: len([r for r in runs(dsn, job) if r["outcome"] == "success"]) >= count + 3, 15, "runs")
            run = [r for r in runs(dsn, job) if r["outcome"] == "success"][-1]
        victim = run["instance_id"]
        assert victim in ids
        t0 = now(dsn)
        if case == "graceful":
            inst.stop(victim)
        else:
            inst.kill_host(victim)
        nxt = wait(lambda: [r for r in runs(dsn, job) if r["started_at"] > t0 and r["instance_id"] != victim],
                   40, "the next run")[0]
        return float((nxt["started_at"] - t0).total_seconds())
    finally:
        inst.stop_all()


def saturated(dsn: str, inst: Instances) -> float:
    busy = inst.start("--max-workers", "1", "--app", "tests.apps.busy_jobs")
    sleeper = wait(lambda: q(dsn, "SELECT job_id FROM pgsched.job WHERE job_name = 'busy.sleep'"), 15,
                   "deploy")[0]["job_id"]
    job = int(q(dsn, JOB, (json.dumps({"s": 0.8}),))[0]["add_job"])
    wait(lambda: len(runs(dsn, job)) >= 3, 15, "runs")
    inst.start("--max-workers", "1")
    time.sleep(3)
    q(dsn, "SELECT pgsched.alter_job(%s, next_start => now())", (sleeper,))
    r = wait(lambda: q(dsn, "SELECT run_id, started_at, instance_id FROM pgsched.job_run WHERE job_id = %s",
                       (sleeper,)), 10, "busy run")[0]
    assert r["instance_id"] == busy
    end = wait(lambda: q(dsn, "SELECT finished_at FROM pgsched.job_run WHERE job_id = %s AND outcome <> 'running'",
                         (sleeper,)), 20, "busy end")[0]["finished_at"]
    starts = [r["started_at"]] + [x["started_at"] for x in runs(dsn, job) if r["started_at"] < x["started_at"] < end]
    starts.append(end)
    return float(max((b - a).total_seconds() for a, b in itertools.pairwise(starts)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tries", type=int, default=5)
    ap.add_argument("--cases", default="between,during,graceful,saturated")
    args = ap.parse_args()
    os.chdir(REPO)  # --app tests.apps.busy_jobs is imported from the current directory
    with cluster() as (_c, dsn), tempfile.TemporaryDirectory() as tmp:
        q(dsn, "CREATE DATABASE bench_template")
        with psycopg.connect(with_db(dsn, "bench_template"), autocommit=True) as c:
            migrate.init(c)
            c.execute(SLEEPER)
        for case in args.cases.split(","):
            figures = [one_try(dsn, case, Path(tmp), n) for n in range(args.tries)]
            print(json.dumps({"case": case, "tries": len(figures), "min_s": round(min(figures), 2),
                              "median_s": round(statistics.median(figures), 2), "max_s": round(max(figures), 2),
                              "all_s": [round(f, 2) for f in figures]}), flush=True)


if __name__ == "__main__":
    main()
