"""Cost of the database's schedule path, PL/Python against plain SQL (sql/api/05_cron.sql).

    ./dev bench schedule_sql [--calls 200] [--repeat 3]

One throwaway embedded cluster, two databases: `pgsched init` with PL/Python (when the server has it) and
`pgsched init --no-plpython`-equivalent (migrate.init(plpython=False): the plain-SQL engine). In each, per
expression of EXPRESSIONS:

* add_job: `SELECT pgsched.add_job('noop', EXPR, timezone => 'Europe/Berlin')` --calls times in one transaction
  rolled back (the cron check and the first next_start are what differ between the paths);
* next_runs(EXPR, 100, 'Europe/Berlin'): --calls // 10 calls.

A figure is the best of --repeat runs divided by the number of calls, in ms per call. Prints one JSON line per
(path, expression) and a table.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import psycopg
from common import cluster
from psycopg import sql

from pgsched import migrate

EXPRESSIONS = ("*/5 * * * *", "30 2 * * *", "0 9 * * MON-FRI", "0 0 12 * * 5#3", "0 0 0 L * * 2026-2099")


def best_ms(repeat: int, calls: int, conn: psycopg.Connection[tuple[Any, ...]], stmt: str,
            args: tuple[Any, ...]) -> float:
    best = float("inf")
    for _ in range(repeat):
        with conn.transaction(force_rollback=True):
            t0 = time.perf_counter()
            for _ in range(calls):
                conn.execute(stmt, args).fetchall()
            best = min(best, time.perf_counter() - t0)
    return best / calls * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    rows: list[dict[str, Any]] = []
    with cluster() as (_, dsn):
        paths: list[tuple[str, str]] = []
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE DATABASE bench_sql")
            state = conn.execute("SELECT plpython FROM pgsched.api_state").fetchone()
            if state and state[0]:
                paths.append(("plpython", dsn))
        sql_dsn = psycopg.conninfo.make_conninfo(dsn, dbname="bench_sql")
        with psycopg.connect(sql_dsn, autocommit=True) as conn:
            migrate.init(conn, plpython=False)
            conn.execute(sql.SQL("CREATE FUNCTION public.noop(job_id int, config jsonb) RETURNS void "
                                 "LANGUAGE sql AS 'SELECT NULL'"))
        paths.append(("sql", sql_dsn))
        for path, d in paths:
            with psycopg.connect(d, autocommit=True) as conn:
                for expr in EXPRESSIONS:
                    add = best_ms(a.repeat, a.calls, conn,
                                  "SELECT pgsched.add_job('noop', %s, timezone => 'Europe/Berlin')", (expr,))
                    nxt = best_ms(a.repeat, max(a.calls // 10, 1), conn,
                                  "SELECT pgsched.next_runs(%s, 100, 'Europe/Berlin')", (expr,))
                    row = {"path": path, "schedule": expr, "add_job_ms": round(add, 3),
                           "next_runs_100_ms": round(nxt, 3)}
                    print(json.dumps(row), flush=True)
                    rows.append(row)
    print(f"\n{'path':<10} {'schedule':<24} {'add_job ms':>11} {'next_runs(100) ms':>18}")
    for r in rows:
        print(f"{r['path'][:10]:<10} {r['schedule']:<24} {r['add_job_ms']:>11} {r['next_runs_100_ms']:>18}")


if __name__ == "__main__":
    main()
