"""pgsched beside pg_cron: 1,000 jobs due at one minute boundary, started by each in turn (issue 13).

    ./dev bench peers [--jobs 1000]

One throwaway cluster with pg_cron preloaded (Debian's postgresql-NN-cron for the server in use;
the script says so and exits 0 where it is not installed), one database. Each job inserts one row
into a table whose `at` column defaults to clock_timestamp(): the moment the job's statement ran.
Both schedulers run with their default settings: pg_cron 1.4 with libpq connections to the server
(cron.max_running_jobs 32), pgsched `serve` with its default worker count.

First pg_cron: --jobs jobs `* * * * *` scheduled, the next minute boundary B waited for, each
job's first start after B read, then the jobs unscheduled. Then pgsched in the same database:
the same number of command jobs `* * * * *`, due at the next boundary, `serve` started well
before it. For each: how many started within 60 s, the lag of the median and of the last start
after the boundary, and the ratio pg_cron / pgsched. One JSON line per scheduler, then a table.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
from common import serve

from pgsched import migrate
from pgsched.embedded import Cluster, find_bindir

DB = "peers"


def next_boundary(conn: psycopg.Connection[Any], lead_s: float) -> datetime:
    """The first whole minute at least lead_s seconds ahead (the database's clock)."""
    row = conn.execute("SELECT date_trunc('minute', now() + make_interval(secs => %s)) + interval '1 minute'",
                       (lead_s,)).fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def wait_until(conn: psycopg.Connection[Any], at: datetime) -> None:
    row = conn.execute("SELECT extract(epoch FROM %s - clock_timestamp())", (at,)).fetchone()
    assert row is not None
    time.sleep(max(0.0, float(row[0])))


def starts(conn: psycopg.Connection[Any], boundary: datetime, jobs: int, timeout: float = 60) -> list[float]:
    """Seconds from `boundary` to each job's first start after it (waits until all started or timeout)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = conn.execute("SELECT count(DISTINCT job) FROM peers_start WHERE at >= %s", (boundary,)).fetchone()
        if row and row[0] >= jobs:
            break
        time.sleep(0.2)
    rows = conn.execute("SELECT extract(epoch FROM min(at) - %s) FROM peers_start WHERE at >= %s GROUP BY job",
                        (boundary, boundary)).fetchall()
    return sorted(float(r[0]) for r in rows)


def summary(name: str, lags: list[float], jobs: int, extra: dict[str, Any]) -> dict[str, Any]:
    return {"scheduler": name, "jobs": jobs, "started": len(lags),
            "p50_s": round(statistics.median(lags), 3) if lags else None,
            "last_s": round(max(lags), 3) if lags else None, **extra}


def run_pg_cron(conn: psycopg.Connection[Any], jobs: int) -> dict[str, Any]:
    conn.execute("CREATE EXTENSION pg_cron")
    version = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'pg_cron'").fetchone()
    conn.execute("SELECT cron.schedule('peer ' || g, '* * * * *', "
                 "                     format('INSERT INTO peers_start (job) VALUES (%%s)', g)) "
                 "  FROM generate_series(1, %s) g", (jobs,))
    boundary = next_boundary(conn, 5)
    wait_until(conn, boundary)
    lags = starts(conn, boundary, jobs)
    conn.execute("SELECT cron.unschedule(jobid) FROM cron.job")
    conn.execute("DROP EXTENSION pg_cron")
    return summary("pg_cron", lags, jobs, {"version": version[0] if version else None})


def run_pgsched(conn: psycopg.Connection[Any], dsn: str, jobs: int) -> dict[str, Any]:
    migrate.init(conn)
    conn.execute("INSERT INTO pgsched.job (job_name, kind, command, schedule) "
                 "SELECT 'peer ' || g, 'command', format('INSERT INTO peers_start (job) VALUES (%%s)', g), "
                 "       '* * * * *' FROM generate_series(1, %s) g", (jobs,))
    boundary = next_boundary(conn, 8)
    # Every job's next start at the boundary, as pg_cron's: set here so that no run comes first.
    conn.execute("UPDATE pgsched.job_stat SET next_start = %s", (boundary,))
    with serve(dsn):
        wait_until(conn, boundary)
        lags = starts(conn, boundary, jobs)
    return summary("pgsched", lags, jobs, {})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=1000)
    args = ap.parse_args()
    bindir = find_bindir()
    if not (bindir.parent / "lib" / "pg_cron.so").exists():
        print(f"peers: pg_cron is not installed for the server in {bindir} (Debian: apt-get install "
              f"postgresql-NN-cron for its version NN); skipped")
        return
    tmp = tempfile.mkdtemp(prefix="pgsched-bench-peers-")
    Path(tmp).chmod(0o755)
    cluster = Cluster(datadir=Path(tmp) / "data", settings={
        "shared_preload_libraries": "'pg_cron'", "cron.database_name": f"'{DB}'", "max_connections": "200"})
    try:
        cluster.initdb()
        cluster.start()
        cluster.wait_ready()
        with psycopg.connect(cluster.dsn(), autocommit=True) as c:
            c.execute(f"CREATE DATABASE {DB}")
        cluster.restart()  # pg_cron's launcher connects to cron.database_name at start
        cluster.wait_ready()
        dsn = cluster.dsn(DB)
        results = []
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE peers_start (job int, at timestamptz DEFAULT clock_timestamp())")
            results.append(run_pg_cron(conn, args.jobs))
            conn.execute("TRUNCATE peers_start")
            results.append(run_pgsched(conn, dsn, args.jobs))
        for r in results:
            print(json.dumps(r), flush=True)
        cron, ours = results
        print(f"\n{'':10} {'started':>8} {'p50 s':>8} {'last s':>8}   ({args.jobs} jobs due at one minute boundary, "
              f"{datetime.now():%Y-%m-%d}, {sys.platform}, PostgreSQL in {bindir})")
        for r in results:
            print(f"{r['scheduler']:10} {r['started']:>8} {r['p50_s']!s:>8} {r['last_s']!s:>8}")
        if cron["last_s"] and ours["last_s"]:
            print(f"{'ratio':10} {'':>8} {cron['p50_s'] / ours['p50_s']:>8.1f} {cron['last_s'] / ours['last_s']:>8.1f}"
                  "   (pg_cron / pgsched)")
    finally:
        cluster.destroy()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
