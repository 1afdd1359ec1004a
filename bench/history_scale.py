"""Reading the history when job_run holds tens of millions of rows (issue 12, README "History and retention").

    ./dev bench history_scale [--rows 50000000] [--jobs 100] [--repeat 200]

A throwaway cluster with this checkout's schema, --jobs jobs, and the partitions the schedulers'
purge makes at the defaults (a day each, 31 days ahead). job_run is then filled with --rows closed
runs, as closes leave them: each in the partition of its end of retention, those ends spread
over the next 30 days (a tenth failures, kept 30 days, the rest successes, 7), the jobs taking turns.
Then, --repeat times each, after an ANALYZE:

* `job_history` for one job, its last 20 runs (what `pgsched history JOB` and the dashboard ask);
* `job_stats` for all the jobs.

Prints the fill time and, per query, the median, the 99th percentile and the max in ms, as the
client sees them (round trip included, over a Unix socket).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import psycopg
from common import cluster

CHUNK = 5_000_000  # rows inserted by one statement


def timed(conn: psycopg.Connection[Any], query: str, params: tuple[Any, ...], repeat: int) -> dict[str, float]:
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        conn.execute(query, params).fetchall()
        times.append(1000 * (time.perf_counter() - began))
    times.sort()
    return {"median_ms": round(statistics.median(times), 3), "p99_ms": round(times[int(0.99 * (len(times) - 1))], 3),
            "max_ms": round(times[-1], 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=50_000_000, help="closed runs in job_run (default 50,000,000)")
    ap.add_argument("--jobs", type=int, default=100, help="jobs the runs belong to (default 100)")
    ap.add_argument("--repeat", type=int, default=200, help="times each query is timed (default 200)")
    args = ap.parse_args()
    with cluster() as (_, dsn), psycopg.connect(dsn, autocommit=True) as conn:
        jobs = [int(r[0]) for r in conn.execute(
            "SELECT pgsched.add_job('noop', '1 hour', scheduled => false) FROM generate_series(1, %s)",
            (args.jobs,)).fetchall()]
        conn.execute("SELECT * FROM pgsched.purge_history()")  # the partitions, as a scheduler's first turn
        partitions = conn.execute("SELECT count(*) FROM pgsched._history_partitions").fetchone()
        t = time.monotonic()
        for start in range(0, args.rows, CHUNK):
            n = min(CHUNK, args.rows - start)
            # Run i's retention ends (30 days) * i/rows from now, the rows still kept spread over
            # the partitions; a tenth are failures (kept 30 days), the rest successes (7 days).
            conn.execute("""
                INSERT INTO pgsched.job_run (job_id, plan_time, started_at, finished_at, outcome, keep_until)
                SELECT j.ids[1 + i %% j.n], k - r - interval '1 second', k - r - interval '1 second', k - r,
                       CASE WHEN i %% 10 = 0 THEN 'failure' ELSE 'success' END, k
                  FROM generate_series(%s::bigint, %s::bigint) AS i,
                       (SELECT %s::integer[] AS ids, %s::integer AS n) j,
                       LATERAL (SELECT now() + interval '1 minute' + interval '30 days' * (i::float8 / %s) AS k,
                                       CASE WHEN i %% 10 = 0 THEN interval '30 days' ELSE interval '7 days' END
                                           AS r) x""",
                         (start + 1, start + n, jobs, len(jobs), args.rows))
            print(json.dumps({"rows_so_far": start + n, "seconds": round(time.monotonic() - t, 1)}), flush=True)
        conn.execute("ANALYZE pgsched.job_run")
        fill_s = time.monotonic() - t
        total = conn.execute("SELECT count(*) FROM pgsched.job_run").fetchone()
        size = conn.execute("SELECT pg_size_pretty(sum(pg_total_relation_size(relid))) "
                            "FROM pg_partition_tree('pgsched.job_run')").fetchone()
        assert total is not None and size is not None and partitions is not None
        job = jobs[len(jobs) // 2]
        history = timed(conn, "SELECT * FROM pgsched.job_history WHERE job_id = %s ORDER BY run_id DESC LIMIT 20",
                        (job,), args.repeat)
        stats = timed(conn, "SELECT * FROM pgsched.job_stats", (), args.repeat)
    print(json.dumps({"rows": int(total[0]), "size": size[0], "partitions": int(partitions[0]), "jobs": args.jobs,
                      "fill_s": round(fill_s, 1), "job_history_last_20": history, "job_stats_all": stats,
                      "target": "each under 5 ms"}))


if __name__ == "__main__":
    main()
