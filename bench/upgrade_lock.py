"""`pgsched init` over a large history, and the first purge after it (issue 12, README "History and retention").

    ./dev bench upgrade_lock [--from REV] [--rows 5000000]

A throwaway cluster is set up by the code of commit REV (default: the last commit before job_run
was partitioned, run from a `git archive` of it), and its pgsched.job_run filled with --rows ended
runs of 100 jobs, their ends spread evenly over the last 60 days. Then this checkout's `init`
upgrades it while a probe session reads pgsched.job_run by key every 5 ms (as a scheduler's claim
and close do): the longest probe is how long the upgrade held the table away from running
schedulers. Then the schedulers' first purge, as pgsched/retention.py takes it, the probe still
running: the partition steps (the validation of job_run_live's constraint over every old row, the
partitions made ahead), then batch after batch (pgsched.retention.BATCH runs) until nothing is past
the retention (7 days for these successes): the time of each, the longest batch, and the rows
inside the retention before and after (none may be lost).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psycopg
from common import cluster

from pgsched import migrate
from pgsched.retention import BATCH, Purger

ROOT = Path(__file__).resolve().parent.parent
BEFORE_PARTITIONS = "9d4e4fc"


def init_with(rev: str, dsn: str) -> None:
    """`init` as the code of `rev` does it, in a fresh database."""
    tree = Path(tempfile.mkdtemp(prefix="pgsched-rev-"))
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-C", str(tree), "-xf", "-"], input=archive, check=True)
    code = ("import psycopg, sys\nfrom pgsched import migrate\n"
            "with psycopg.connect(sys.argv[1], autocommit=True) as c: migrate.init(c)\n")
    subprocess.run([sys.executable, "-c", code, dsn], check=True, env={**os.environ, "PYTHONPATH": str(tree)})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--from", dest="rev", default=BEFORE_PARTITIONS,
                    help=f"the release before (default {BEFORE_PARTITIONS})")
    ap.add_argument("--rows", type=int, default=5_000_000, help="ended runs in job_run (default 5,000,000)")
    args = ap.parse_args()
    with cluster(install=False) as (_, dsn):
        init_with(args.rev, dsn)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SELECT pgsched.add_job('noop', '1 hour', scheduled => false) FROM generate_series(1, 100)")
            t = time.monotonic()
            conn.execute("""INSERT INTO pgsched.job_run (job_id, plan_time, started_at, finished_at, outcome)
                            SELECT 1000 + i %% 100, e - interval '1 second', e - interval '1 second', e, 'success'
                              FROM generate_series(1, %s) AS i,
                                   LATERAL (SELECT now() - interval '60 days' * (1 - i::float8 / %s) AS e) x""",
                         (args.rows, args.rows))
            conn.execute("VACUUM ANALYZE pgsched.job_run")
            fill_s = time.monotonic() - t
            # One instant judges "inside the retention" before and after, and the purge: rows that
            # merely aged past it while the bench ran are not losses.
            at = conn.execute("SELECT now()").fetchone()
            assert at is not None
            inside = conn.execute("SELECT count(*) FROM pgsched.job_run WHERE finished_at >= %s - interval "
                                  "'7 days'", (at[0],)).fetchone()
            assert inside is not None

        longest = {"init": 0.0, "steps": 0.0}
        phase = "init"
        stop = threading.Event()

        def probe() -> None:
            with psycopg.connect(dsn, autocommit=True) as p:
                while not stop.is_set():
                    began = time.monotonic()
                    p.execute("SELECT outcome FROM pgsched.job_run WHERE run_id = 1")
                    longest[phase] = max(longest[phase], time.monotonic() - began)
                    time.sleep(0.005)

        prober = threading.Thread(target=probe)
        prober.start()
        time.sleep(0.5)
        with psycopg.connect(dsn, autocommit=True) as conn:
            t = time.monotonic()
            migrate.init(conn)
            init_s = time.monotonic() - t
        time.sleep(0.5)
        phase = "steps"
        with psycopg.connect(dsn, autocommit=True) as conn:
            t = time.monotonic()
            made, _, deferred, longest_step = Purger(dsn, 0).take_partition_steps(conn)
            steps_s = time.monotonic() - t
        time.sleep(0.5)
        stop.set()
        prober.join()

        with psycopg.connect(dsn, autocommit=True) as conn:
            batches, purged, worst = 0, 0, 0.0
            t = time.monotonic()
            while True:
                b = time.monotonic()
                row = conn.execute("SELECT runs FROM pgsched.purge_history(now => %s, max_rows => %s, "
                                   "with_partitions => false)", (at[0], BATCH)).fetchone()
                worst = max(worst, time.monotonic() - b)
                assert row is not None
                batches, purged = batches + 1, purged + int(row[0])
                if row[0] < BATCH:
                    break
            purge_s = time.monotonic() - t
            after = conn.execute("SELECT count(*) FROM pgsched.job_run WHERE finished_at >= %s - interval "
                                 "'7 days'", (at[0],)).fetchone()
            left = conn.execute("SELECT count(*) FROM pgsched.job_run").fetchone()
            assert after is not None and left is not None
    print(json.dumps({
        "from": args.rev, "rows": args.rows, "fill_s": round(fill_s, 1),
        "init_s": round(init_s, 3), "longest_probe_during_init_ms": round(1000 * longest["init"], 1),
        "partition_steps_s": round(steps_s, 2), "partitions_made": made, "steps_deferred": deferred,
        "longest_step_ms": round(1000 * longest_step, 1),
        "longest_probe_during_steps_ms": round(1000 * longest["steps"], 1),
        "purged": purged, "purge_batches": batches, "purge_s": round(purge_s, 1),
        "longest_purge_batch_ms": round(1000 * worst, 1),
        "rows_inside_retention_before": int(inside[0]), "rows_inside_retention_after": int(after[0]),
        "rows_left": int(left[0]),
    }))


if __name__ == "__main__":
    main()
