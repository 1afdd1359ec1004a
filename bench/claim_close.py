"""The scheduler's two per-run statements, the claim and the close, timed against another release.

    ./dev bench claim_close [--against 9971113|minimal] [--rounds 12] [--block 150] [--runs 8]
                            [--concurrency] [--dependencies] [--pids-changed]

One cluster, two databases: `a` gets the schema of the release at git ref --against (checked out
into a temporary worktree and installed by its own `pgsched.migrate`), `b` this tree's. Each has
400 trivial jobs always due. A client then does what a scheduler's round does, with raw SQL and
--runs runs a round (8 unless given): close the runs of the previous round, claim as many more
(0.1.0's `_finish_runs` and `_claim`; this release's `_close_runs` and `_claim_v2`), as a
scheduler with that many idle workers does. Blocks of --block rounds alternate
between the two databases --rounds times, so that both see the same machine; the figures are the
medians of the blocks' mean milliseconds per statement. No Python of either scheduler is timed:
this isolates the database's side of a round. Besides the times, each side's backend CPU a run
(user + system, from /proc: the bench runs beside its cluster). --against minimal: both databases
get this tree's schema, and `a` runs MINIMAL instead of pgsched's statements, a floor for them:
the same row writes on the same tables, with their indexes, triggers and foreign keys, and nothing
else (no settings in the launch row, no next due time, no history partitions, no keys, no
dependencies, no events). --dependencies: half of this tree's jobs (the odd
ids) run after the job before them, with no schedule of their own: each success of an upstream
makes its dependent due in the close, and a later claim starts it. --pids-changed: every close
says that another worker ran the run than the one the claim recorded (the scheduler's owner
matching, or a worker that reconnected as the job's owner), as with jobs of several owners.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import psycopg
from common import cluster, seconds_or_zero, worktree
from psycopg.types.json import Jsonb
from scheduler import add_jobs

ROOT = Path(__file__).resolve().parent.parent
# Each release's names for the two statements.
STATEMENTS = {
    "a": ("SELECT run_id, started_at, lease_token, job_id FROM pgsched._claim(%s, %s, %s, '0', '{}')",
          "SELECT * FROM pgsched._finish_runs(%s)"),
    "b": ("SELECT run_id, started_at, lease_token, job_id FROM pgsched._claim_v2(%s, %s, %s, '0', '{}')",
          "SELECT * FROM pgsched._close_runs(%s)"),
}
# A claim and a close that write what every run's claim and close write, and no more: the run's row
# (inserted, then its outcome and end updated in place), its job's state and counters (the crash
# counted at the start and taken back at the end, as pgsched's marks do), a plan from the job's
# next start, and the job's kind and proc returned for the launch. The close takes the same JSON
# array as _close_runs and sets the next start from it (these jobs are always due).
MINIMAL = ("""
WITH due AS (SELECT s.job_id, s.next_start, row_number() OVER (ORDER BY s.next_start, s.job_id) AS n
               FROM (SELECT s.job_id, s.next_start FROM pgsched.job_stat s
                      WHERE s.state = 'scheduled' AND s.next_start <= now()
                      ORDER BY s.next_start, s.job_id LIMIT cardinality(%(w)s::integer[])
                        FOR UPDATE SKIP LOCKED) s),
runs AS (INSERT INTO pgsched.job_run_live (job_id, plan_time, trigger, started_at, worker_pid, backend_pid,
                                           instance_id, lease_token, heartbeat_at)
         SELECT d.job_id, d.next_start, 'schedule', now(), (%(w)s::integer[])[d.n], (%(b)s::integer[])[d.n],
                %(i)s, nextval('pgsched.lease_token_seq'), now()
           FROM due d ON CONFLICT ON CONSTRAINT job_run_plan_key DO NOTHING
         RETURNING run_id, job_id, started_at, lease_token),
started AS (UPDATE pgsched.job_stat s SET state = 'starting', current_run_id = r.run_id, last_start = r.started_at,
                   total_runs = s.total_runs + 1, total_crashes = s.total_crashes + 1,
                   consecutive_crashes = s.consecutive_crashes + 1
              FROM runs r WHERE s.job_id = r.job_id)
SELECT r.run_id, r.started_at, r.lease_token, r.job_id, j.kind, j.proc_schema, j.proc_name
  FROM runs r JOIN pgsched.job j ON j.job_id = r.job_id""", """
WITH e AS (SELECT * FROM jsonb_to_recordset(%s) AS x(run_id bigint, finished_at timestamptz, next_start timestamptz)),
ended AS (UPDATE pgsched.job_run_live r SET outcome = 'success', finished_at = e.finished_at
            FROM e WHERE r.run_id = e.run_id AND r.outcome = 'running'
          RETURNING r.job_id, e.finished_at, e.next_start)
UPDATE pgsched.job_stat s
   SET state = 'scheduled', current_run_id = NULL, next_start = d.next_start, last_finish = d.finished_at,
       last_successful_finish = d.finished_at, last_run_success = true, total_successes = s.total_successes + 1,
       total_crashes = s.total_crashes - 1, consecutive_crashes = 0, consecutive_failures = 0
  FROM ended d WHERE s.job_id = d.job_id""")
# What pgsched's scheduler session sets that bears on these statements (pgsched.store.Store).
SCHEDULER_SESSION = ("SET pgsched.internal = on", "SET synchronous_commit = off", "SET jit = off")
# The pids of the workers claimed for, and of their backends (never looked up): --runs of each.
WORKERS: list[int] = []
BACKENDS: list[int] = []
# --pids-changed: the worker and backend each close says really ran the run (None: those claimed for).
RAN_ON: list[int | None] = [None, None]


def install(dsn: str, tree: Path) -> None:
    """The schema of the pgsched in `tree`, installed by that tree's own code."""
    subprocess.run([sys.executable, "-c", "import sys, psycopg; from pgsched import migrate; "
                    "migrate.init(psycopg.connect(sys.argv[1], autocommit=True))", dsn],
                   check=True, cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)})
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE FUNCTION public.noop(job_id int, config jsonb) RETURNS void LANGUAGE sql "
                     "AS 'SELECT NULL'")
    add_jobs(dsn, 400, "noop", "1 millisecond", fixed=False, delay_s=0)


class Client:
    """One database's scheduler-like session: its instance, and the runs claimed but not yet closed."""

    def __init__(self, name: str, dsn: str) -> None:
        self.minimal = name == "minimal"
        self.claim_sql, self.close_sql = MINIMAL if self.minimal else STATEMENTS[name]
        self.conn = psycopg.connect(dsn, autocommit=True)
        for setting in SCHEDULER_SESSION:
            self.conn.execute(setting)
        # API 1's name, which every release has (0.1.0 has no _v2; later ones keep it: 41_api1.sql).
        row = self.conn.execute("SELECT instance_id FROM pgsched._register_instance('bench', 1, 'x', 8)").fetchone()
        assert row is not None
        self.instance_id = int(row[0])
        self.open: list[dict[str, Any]] = []
        # @after jobs: the scheduler closes their runs with no next start (pgsched.state.end_of_run)
        self.after = {int(r[0]) for r in self.conn.execute(
            "SELECT job_id FROM pgsched.jobs WHERE schedule = '@after'").fetchall()} if name == "b" else set()
        self.claim_ms: list[float] = []
        self.close_ms: list[float] = []
        self.cpu_us: list[float] = []  # the backend's CPU a run, per block

    def block(self, rounds: int, keep: bool = True) -> None:
        claim = close = 0.0
        runs = 0
        cpu = seconds_or_zero(self.conn.info.backend_pid)
        for _ in range(rounds):
            t0 = time.perf_counter()
            if self.open:
                cur = self.conn.execute(self.close_sql, (Jsonb(self.open),))
                if cur.description is not None:
                    cur.fetchall()
            t1 = time.perf_counter()
            params: Any = ({"w": WORKERS, "b": BACKENDS, "i": self.instance_id} if self.minimal
                           else (self.instance_id, WORKERS, BACKENDS))
            rows = [r[:4] for r in self.conn.execute(self.claim_sql, params).fetchall()]
            t2 = time.perf_counter()
            close += t1 - t0
            claim += t2 - t1
            runs += len(rows)
            # What the scheduler sends for a trivial successful run, due again at once.
            self.open = [{"run_id": run_id, "outcome": "success", "sqlstate": None, "message": None,
                          "next_start": None if job_id in self.after else started.isoformat(),
                          "finished_at": started.isoformat(),
                          "disable_reason": None, "rows_affected": None, "result": None, "skipped": 0,
                          "skipped_first": None, "skipped_last": None,
                          "worker_pid": RAN_ON[0], "backend_pid": RAN_ON[1],
                          "lease_token": token, "scopes": None, "schedule_delay_s": 0.0}
                         for run_id, started, token, job_id in rows]
        if keep:
            self.claim_ms.append(1000 * claim / rounds)
            self.close_ms.append(1000 * close / rounds)
            self.cpu_us.append(1e6 * (seconds_or_zero(self.conn.info.backend_pid) - cpu) / max(1, runs))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--against", default="9971113",
                    help="git ref of the other release (default: 0.1.0), or minimal: MINIMAL's statements")
    ap.add_argument("--rounds", type=int, default=12, help="blocks per database")
    ap.add_argument("--block", type=int, default=150, help="claim+close rounds per block")
    ap.add_argument("--runs", type=int, default=8, help="runs claimed and closed a round (idle workers)")
    ap.add_argument("--concurrency", action="store_true",
                    help="this tree's jobs: half on one concurrency key with a limit of 100 (never binding)")
    ap.add_argument("--dependencies", action="store_true",
                    help="this tree's jobs: half run after the job before them (no schedule of their own)")
    ap.add_argument("--pids-changed", action="store_true",
                    help="every close names another worker and backend than the claim recorded")
    args = ap.parse_args()
    if not 1 <= args.runs <= 400:
        ap.error("--runs: between 1 and 400 (the jobs always due)")
    WORKERS[:] = range(100_000, 100_000 + args.runs)
    BACKENDS[:] = range(200_000, 200_000 + args.runs)
    if args.pids_changed:
        RAN_ON[:] = [300_000, 400_000]
    minimal = args.against == "minimal"
    with (nullcontext(ROOT) if minimal else worktree(args.against)) as other, cluster() as (_, dsn):
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE DATABASE a")
            conn.execute("CREATE DATABASE b")
        dsns = {name: psycopg.conninfo.make_conninfo(dsn, dbname=name) for name in ("a", "b")}
        install(dsns["a"], other)
        install(dsns["b"], ROOT)
        if args.concurrency:
            with psycopg.connect(dsns["b"], autocommit=True) as conn:
                conn.execute("SELECT pgsched.set_concurrency_limit('bench', 100)")
                conn.execute("UPDATE pgsched.job SET concurrency_key = 'bench' WHERE job_id % 2 = 1")
        if args.dependencies:
            with psycopg.connect(dsns["b"], autocommit=True) as conn:
                conn.execute("UPDATE pgsched.job SET depends_on = ARRAY[job_id - 1], schedule = '@after' "
                             "WHERE job_id % 2 = 1")
                conn.execute("UPDATE pgsched.job_stat SET next_start = NULL WHERE job_id % 2 = 1")
        # A release from 0.2.0 on has this tree's statement names.
        with psycopg.connect(dsns["a"]) as conn:
            v2 = conn.execute("SELECT to_regproc('pgsched._close_runs') IS NOT NULL").fetchone()
        clients = {name: Client("minimal" if minimal and name == "a" else "b" if v2 and v2[0] else name, d)
                   for name, d in dsns.items()}
        for c in clients.values():
            c.block(args.block, keep=False)  # warm: plans, caches
        for _ in range(args.rounds):
            for c in clients.values():
                c.block(args.block)
        out: dict[str, Any] = {"scenario": "claim_close", "against": args.against, "runs_per_round": args.runs,
                               "concurrency": args.concurrency, "dependencies": args.dependencies,
                               "pids_changed": args.pids_changed}
        for name, c in clients.items():
            label = args.against if name == "a" else "this tree"
            claim_ms, close_ms = statistics.median(c.claim_ms), statistics.median(c.close_ms)
            # The database's side of one run: its share of a claim and of a close.
            out[label] = {"claim_ms": round(claim_ms, 3), "close_ms": round(close_ms, 3),
                          "us_per_run": round(1000 * (claim_ms + close_ms) / args.runs, 1),
                          "backend_cpu_us_per_run": round(statistics.median(c.cpu_us), 1)}
            c.conn.close()
        a, b = clients["a"], clients["b"]
        out["claim_ratio"] = round(statistics.median(b.claim_ms) / statistics.median(a.claim_ms), 3)
        out["close_ratio"] = round(statistics.median(b.close_ms) / statistics.median(a.close_ms), 3)
        print(json.dumps(out))


if __name__ == "__main__":
    main()
