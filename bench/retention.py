"""History at full throughput with and without retention (issue 12, README "History and retention").

    ./dev bench retention [--seconds 600] [--retention 60] [--partition 10] [--purge-interval 10] [--rounds 1]
                        [--without defaults|off] [--log-over 1]

Each round runs the throughput load of `./dev bench scheduler throughput` (400 trivial function jobs
always due, `serve --max-workers 8`, a fresh cluster) twice, in turn: without retention, and with it
(`set_retention` of --retention seconds for every outcome and partitions of --partition seconds,
the purge every --purge-interval seconds).
"Without" is, with --without defaults (the default), the default policy (7 and 30 days, partitions
of a day): the purge runs as often and makes the partitions, every close moves its row into one,
and nothing is old enough to go within the run, so it is retention's pruning that is compared;
with --without off, the schedulers' purge is off (`purge_interval = 0`): no partition is made and
every row stays in job_run_live, as in release 0.1.0.
For each it prints:

* runs/s, counted from job_stat (the counters retention does not remove), and CPU per run of the
  scheduler, its workers and every PostgreSQL process;
* the peak of pgsched.job_run's rows and of its size with its indexes (sampled every 2 s);
* with retention: the purges (from the scheduler's log), the partitions they dropped, their
  longest partition step (an attach or a drop: about the time it held job_run_live's lock) and
  their longest batch (which holds the row locks of the runs it deletes until its commit);
* the claim's and the close's statements as the server timed them: calls, mean and max from
  pg_stat_statements, and p50/p99 from the server's log, which logs every statement slower than
  --log-over ms (`log_min_duration_statement`): the k-th slowest of n calls is exact as long as
  k <= the statements logged, otherwise the percentile is below --log-over (printed as "<");
* the partition steps' statements (ATTACH PARTITION, DROP TABLE, nested in pgsched._history_step:
  `pg_stat_statements.track = all`): calls and max. Each takes job_run_live's lock (and a drop
  job_run's) and holds it until its transaction commits, right after;
* the longest any session waited for a lock, as the server logged it (`log_lock_waits`,
  `deadlock_timeout` 5 ms: every wait longer than 5 ms is logged with its length), by statement.

Both runs of a pair log and track alike, so their cost is in both.

One JSON object per run, then one line comparing the two.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
from common import cluster, serve, tree_cpu_seconds, wait_for_log
from scheduler import add_jobs


def successes(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT coalesce(sum(total_successes), 0) FROM pgsched.job_stat").fetchone()
    return int(row[0]) if row else 0


STATEMENTS = {"claim": "%pgsched._claim_v2(%", "close": "%pgsched._close_runs(%"}
STEPS = {"attach": "ALTER TABLE pgsched.job_run ATTACH PARTITION%", "drop": "DROP TABLE pgsched.job_run\\_%"}
DURATION = re.compile(r"duration: ([0-9.]+) ms\s+execute [^:]*: (.*)$")
ACQUIRED = re.compile(r"process (\d+) acquired (\w+) on (.+?) after ([0-9.]+) ms")


def statement_times(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, pattern in {**STATEMENTS, **STEPS}.items():
        r = conn.execute("SELECT sum(calls), sum(calls * mean_exec_time) / nullif(sum(calls), 0), "
                         "max(stddev_exec_time), max(max_exec_time) FROM pg_stat_statements "
                         "WHERE query LIKE %s", (pattern,)).fetchone()
        assert r is not None
        out[name] = {"calls": int(r[0] or 0), "mean_ms": round(float(r[1] or 0), 3),
                     "stddev_ms": round(float(r[2] or 0), 3), "max_ms": round(float(r[3] or 0), 1)}
    return out


def percentile(slow: list[float], calls: int, q: float, floor_ms: float) -> float | str:
    """The q-quantile of `calls` durations of which `slow` are all those above floor_ms."""
    k = max(1, math.ceil((1 - q) * calls))  # the k-th slowest
    ranked = sorted(slow, reverse=True)
    return round(ranked[k - 1], 2) if k <= len(ranked) else f"<{floor_ms}"


def server_log(path: Path, offset: int, timed: dict[str, Any], floor_ms: float) -> dict[str, Any]:
    """The claim's and the close's p50/p99 and the lock waits, from the server's log after `offset`."""
    slow: dict[str, list[float]] = {name: [] for name in STATEMENTS}
    waits: list[tuple[float, str, str]] = []
    lines = path.read_bytes()[offset:].decode(errors="replace").splitlines()
    for i, line in enumerate(lines):
        if m := DURATION.search(line):
            for name, pattern in STATEMENTS.items():
                if pattern.strip("%") in m.group(2):
                    slow[name].append(float(m.group(1)))
        elif m := ACQUIRED.search(line):
            statement = next((x.split("STATEMENT:", 1)[1].strip()[:80] for x in lines[i + 1:i + 4]
                              if "STATEMENT:" in x), "?")
            waits.append((float(m.group(4)), m.group(2), statement))
    out: dict[str, Any] = {}
    for name in STATEMENTS:
        calls = timed[name]["calls"]
        out[name] = {**timed[name], "p50_ms": percentile(slow[name], calls, 0.5, floor_ms),
                     "p99_ms": percentile(slow[name], calls, 0.99, floor_ms)}
    out.update({name: timed[name] for name in STEPS})
    waits.sort(reverse=True)
    out["lock_waits_over_5ms"] = len(waits)
    out["lock_waits_over_50ms"] = sum(1 for w in waits if w[0] > 50)
    out["longest_lock_waits"] = [{"ms": w[0], "lock": w[1], "statement": w[2]} for w in waits[:3]]
    return out


def one_run(seconds: float, retention_s: float | None, partition_s: float, purge_interval: float,
            log_over_ms: float, without: str) -> dict[str, Any]:
    config = Path(tempfile.mkstemp(prefix="pgsched-bench-", suffix=".toml")[1])
    purge_off = retention_s is None and without == "off"
    config.write_text(f"purge_interval = {0 if purge_off else purge_interval}\n")
    settings = {"shared_preload_libraries": "pg_stat_statements", "pg_stat_statements.track": "all",
                "log_min_duration_statement": f"'{log_over_ms}ms'", "log_lock_waits": "on",
                "deadlock_timeout": "'5ms'"}
    with cluster(settings=settings) as (c, dsn):
        add_jobs(dsn, 400, "noop", "1 millisecond", fixed=False, delay_s=0)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION pg_stat_statements")
            if retention_s is not None:
                conn.execute("SELECT pgsched.set_retention(success => make_interval(secs => %s), "
                             "failure => make_interval(secs => %s), partition => make_interval(secs => %s))",
                             (retention_s, retention_s, partition_s))
        with serve(dsn, "--max-workers", "8", "--config", str(config)) as (proc, log), \
                psycopg.connect(dsn, autocommit=True) as conn:
            wait_for_log(log, "ready:", 30)
            time.sleep(2)
            conn.execute("SELECT pg_stat_statements_reset()")
            log_from = c.logfile.stat().st_size
            pm = c.postmaster_pid()
            assert pm is not None
            n0, t0, a0 = successes(conn), time.monotonic(), tree_cpu_seconds(proc.pid, pm)
            peak_rows = peak_bytes = 0
            while time.monotonic() - t0 < seconds:
                time.sleep(2)
                # job_run is partitioned: its size is its partitions' (the parent has no storage)
                r = conn.execute("SELECT (SELECT count(*) FROM pgsched.job_run), "
                                 "(SELECT sum(pg_total_relation_size(relid)) "
                                 "   FROM pg_partition_tree('pgsched.job_run'))").fetchone()
                assert r is not None
                peak_rows, peak_bytes = max(peak_rows, int(r[0])), max(peak_bytes, int(r[1]))
            n1, t1, a1 = successes(conn), time.monotonic(), tree_cpu_seconds(proc.pid, pm)
            end_rows = conn.execute("SELECT count(*) FROM pgsched.job_run").fetchone()
            timed = server_log(c.logfile, log_from, statement_times(conn), log_over_ms)
        purges = [json.loads(line) for line in log.read_text().splitlines()
                  if line.startswith("{") and "history purged" in line]
    config.unlink()
    longest = [p["longest_batch_ms"] for p in purges if p.get("runs")]
    return {
        "retention_s": retention_s, "purge": not purge_off, "seconds": round(t1 - t0, 1),
        "runs_per_s": round((n1 - n0) / (t1 - t0), 1),
        "cpu_us_per_run": round(1e6 * (a1 - a0) / max(n1 - n0, 1), 1),
        "peak_job_run_rows": peak_rows, "peak_job_run_mb": round(peak_bytes / 2**20, 1),
        "job_run_rows_at_end": int(end_rows[0]) if end_rows else None,
        "purges": len(purges), "runs_purged": sum(int(p.get("runs", 0)) for p in purges),
        "purge_batches": sum(int(p.get("batches", 0)) for p in purges),
        "longest_batch_ms": max(longest) if longest else None,
        "partitions_dropped": sum(int(p.get("partitions_dropped", 0)) for p in purges),
        "longest_step_ms": max((float(p.get("longest_step_ms", 0)) for p in purges), default=None),
        **timed,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=600.0, help="length of each run (default 600: 10 minutes)")
    ap.add_argument("--retention", type=float, default=60.0, help="retention of every outcome, s (default 60)")
    ap.add_argument("--partition", type=float, default=10.0, help="partition width, s (default 10)")
    ap.add_argument("--purge-interval", type=float, default=10.0, help="serve's purge_interval, s (default 10)")
    ap.add_argument("--rounds", type=int, default=1, help="pairs of runs, without then with (default 1)")
    ap.add_argument("--without", choices=["defaults", "off"], default="defaults",
                    help="the run without retention: the default policy (partitions made, nothing dropped "
                         "within the run) or the purge off (every row stays in job_run_live)")
    ap.add_argument("--log-over", type=float, default=1.0,
                    help="the server logs the statements slower than this, ms (default 1)")
    args = ap.parse_args()
    results: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
    for _ in range(args.rounds):
        for with_retention in (False, True):
            r = one_run(args.seconds, args.retention if with_retention else None, args.partition,
                        args.purge_interval, args.log_over, args.without)
            results[with_retention].append(r)
            print(json.dumps(r), flush=True)
    mean = {k: sum(r["runs_per_s"] for r in v) / len(v) for k, v in results.items()}
    print(json.dumps({"runs_per_s_without": round(mean[False], 1), "runs_per_s_with": round(mean[True], 1),
                      "change_pct": round(100 * (mean[True] / mean[False] - 1), 1),
                      "peak_job_run_rows_without": max(r["peak_job_run_rows"] for r in results[False]),
                      "peak_job_run_rows_with": max(r["peak_job_run_rows"] for r in results[True])}))


if __name__ == "__main__":
    main()
