"""The claim of queued scope runs from a long queue, the database's side only.

    ./dev bench queue_claim [--queued 10000] [--workers 16] [--claims 30]
    ./dev bench compare --against REF queue_claim

One sharded job with scope runs queued (as a plan run's close queues them; --queued of them
left when the second half begins), then
--claims claims of --workers runs each, every one in its own transaction and followed by the
close of what it took (a plain UPDATE: this times the claim, not the close). Twice: first as the
queue is after its inserts, then after an ANALYZE of the catalog, which a long queue brings about
by itself (autovacuum's analyze threshold) and which changes the plans of a session's claims.
Prints the median milliseconds of the last two thirds of the claims (the first ones plan the
statement) for each, and how many runs the claims took.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import psycopg
from common import cluster


def claims(dsn: str, *, workers: int, count: int, analyze: bool) -> tuple[float, int]:
    """Median ms of a claim (after the first third), and the runs the claims took."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        if analyze:
            conn.execute("ANALYZE pgsched.job_run_live, pgsched.job_stat, pgsched.job")
        instance = conn.execute("SELECT instance_id FROM pgsched._register_instance_v2('bench', 1, 'bench', %s)",
                                (workers,)).fetchone()
        assert instance is not None
        times, taken = [], 0
        for _ in range(count):
            with conn.transaction():
                t = time.perf_counter()
                ids = [r[0] for r in conn.execute(
                    "SELECT run_id FROM pgsched._claim_v2(%s, %s, %s, '0', '{}')",
                    (instance[0], list(range(100, 100 + workers)), [0] * workers)).fetchall()]
                times.append((time.perf_counter() - t) * 1000)
                conn.execute("UPDATE pgsched.job_run SET outcome = 'success', finished_at = now() "
                             "WHERE run_id = ANY (%s)", (ids,))
            taken += len(ids)
    return statistics.median(times[count // 3:]), taken


def run(queued: int, workers: int, count: int) -> dict[str, Any]:
    with cluster() as (_, dsn):
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute("SELECT pgsched.add_job('noop', interval '1 hour', initial_start => now() + "
                               "interval '1 hour', scope_query => 'SELECT 1')").fetchone()
            assert row is not None
            conn.execute("INSERT INTO pgsched.job_run (job_id, scope, plan_time, trigger, outcome) "
                         "SELECT %s, g::text, now() - interval '1 second', 'schedule', 'queued' "
                         "FROM generate_series(1, %s) g", (row[0], queued + workers * count))
        fresh, a = claims(dsn, workers=workers, count=count, analyze=False)
        analyzed, b = claims(dsn, workers=workers, count=count, analyze=True)
    return {"bench": "queue_claim", "queued": queued, "workers": workers, "claims": count,
            "claim_ms": round(fresh, 3), "claim_ms_analyzed": round(analyzed, 3), "runs_taken": a + b}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--queued", type=int, default=10_000, help="scope runs queued when the analyzed half begins")
    ap.add_argument("--workers", type=int, default=16, help="runs a claim takes (idle workers)")
    ap.add_argument("--claims", type=int, default=30, help="claims timed in each half")
    args = ap.parse_args()
    if args.queued < args.workers * args.claims:
        ap.error("--queued: at least --workers x --claims, so that every claim takes a full batch")
    print(json.dumps(run(args.queued, args.workers, args.claims)))


if __name__ == "__main__":
    main()
