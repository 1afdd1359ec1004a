"""Server time of each `pgsched web` page with many jobs and much history (issue 17's figures).

    ./dev bench web                        10,000 jobs, 10,000,000 runs of history over 7 days
    ./dev bench web --rows 1000000 --repeat 5
    ./dev bench web --no-window-index      the same without migration 0007's index on job_run
                                           (finished_at) and with the history's previous row-level
                                           security policy (EXISTS per run): the figures before it

A fresh cluster (PostgreSQL's default durability); jobs and history are inserted directly
(set-up, not measured), then each page is requested `--repeat` times in-process through
Starlette's TestClient (so the time is the server's: the queries, the templates and the ASGI
stack, without a network), as two viewers: the database owner in --single-user mode (sees
every job; row-level security does not filter its rows) and a signed-in role that owns a
tenth of the jobs (row-level security filters every row it reads). One JSON object per
viewer: the median and the worst time per page, in milliseconds.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import time
from typing import Any

import psycopg
from common import cluster
from psycopg import sql
from starlette.testclient import TestClient

from pgsched.embedded import Cluster
from pgsched.web.app import create_app


def load(c: Cluster, dsn: str, jobs: int, rows: int, window_index: bool) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE ROLE bench_viewer LOGIN PASSWORD 'bench'")
        # The dashboard signs in only where PostgreSQL checks the password (the cluster trusts local users).
        hba = c.datadir / "pg_hba.conf"
        hba.write_text("local all bench_viewer scram-sha-256\nhost all bench_viewer all scram-sha-256\n"
                       + hba.read_text())
        conn.execute("SELECT pg_reload_conf()")
        conn.execute(
            "INSERT INTO pgsched.job (job_name, owner, kind, command, schedule, schedule_interval, fixed_schedule) "
            "SELECT 'bench job ' || g, CASE WHEN g %% 10 = 0 THEN 'bench_viewer'::regrole "
            "       ELSE current_user::regrole END, 'command', 'SELECT 1', '1 minute', '1 minute', true "
            "  FROM generate_series(1, %s) g", (jobs,))
        conn.execute("UPDATE pgsched.job_stat SET next_start = now() + random() * interval '1 minute'")
        ids = [r[0] for r in conn.execute("SELECT job_id FROM pgsched.job ORDER BY job_id")]
        lo = ids[0]
        t0 = time.monotonic()
        step = 1_000_000
        for start in range(0, rows, step):
            n = min(step, rows - start)
            # Row i: job lo + i % jobs, planned evenly over the last 7 days; 95% success, 4% failure
            # (with a message), the rest timeout, skipped, missed; durations up to 2 s, lag up to 0.5 s.
            conn.execute(
                "INSERT INTO pgsched.job_run (job_id, plan_time, started_at, finished_at, outcome, sqlstate, "
                "                             message) "
                "SELECT %(lo)s + i %% %(jobs)s, p, CASE WHEN o IN ('skipped', 'missed') THEN NULL "
                "       ELSE p + random() * interval '0.5 s' END, "
                "       p + interval '0.5 s' + random() * interval '2 s', o, "
                "       CASE WHEN o = 'failure' THEN '22012' END, "
                "       CASE WHEN o = 'failure' THEN 'division by zero in run ' || i END "
                "  FROM generate_series(%(a)s, %(b)s) i, "
                "       LATERAL (SELECT now() - interval '7 days' + i * (interval '7 days' / %(rows)s) AS p, "
                "                       CASE WHEN i %% 100 < 95 THEN 'success' WHEN i %% 100 < 99 THEN 'failure' "
                "                            ELSE (ARRAY['timeout', 'skipped', 'missed'])[1 + i %% 3] END AS o) x",
                {"lo": lo, "jobs": jobs, "a": start, "b": start + n - 1, "rows": rows})
            print(f"history: {start + n} of {rows} rows ({time.monotonic() - t0:.0f} s)", flush=True)
        if not window_index:
            conn.execute("DROP INDEX pgsched.job_run_finished_idx")
            conn.execute("ALTER POLICY job_run_read ON pgsched.job_run "
                         "USING (EXISTS (SELECT 1 FROM pgsched.job j WHERE j.job_id = job_run.job_id))")
        conn.execute("VACUUM ANALYZE pgsched.job_run")
        conn.execute("VACUUM ANALYZE pgsched.job")
        conn.execute("VACUUM ANALYZE pgsched.job_stat")


PAGES = ["/", "/jobs", "/jobs?page=100", "/jobs?q=job+99&sort=last_outcome&dir=desc", "/jobs/{job}",
         "/timeline?window=5m", "/timeline?window=1h", "/timeline?window=24h", "/timeline?window=7d", "/live"]


def measure(client: TestClient, job: int, repeat: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for page in PAGES:
        path = page.format(job=job)
        times = []
        statuses = set()
        for _ in range(repeat):
            t = time.perf_counter()
            r = client.get(path)
            times.append((time.perf_counter() - t) * 1000)
            statuses.add(r.status_code)  # 503: the page's query exceeded the dashboard's statement_timeout
            if r.status_code not in (200, 503):
                # Another answer (a refusal, an error page) would be timed as if it were the page.
                raise SystemExit(f"{path}: HTTP {r.status_code}: {r.text[:200]}")
        note = re.search(r'id="timeline-note">([^<]*)<', r.text)
        out[path] = {"median_ms": round(statistics.median(times), 1), "max_ms": round(max(times), 1),
                     **({"note": note.group(1)} if note else {}),
                     **({"status": sorted(statuses)} if statuses != {200} else {})}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-window-index", dest="window_index", action="store_false",
                    help="without the index on job_run (finished_at) and with the EXISTS policy (before 0007)")
    args = ap.parse_args()
    with cluster() as (c, dsn):
        t = time.monotonic()
        load(c, dsn, args.jobs, args.rows, args.window_index)
        print(f"loaded {args.jobs} jobs and {args.rows} runs in {time.monotonic() - t:.0f} s", flush=True)
        with psycopg.connect(dsn) as conn:
            job = conn.execute("SELECT min(job_id) FROM pgsched.job WHERE owner = 'bench_viewer'::regrole"
                               ).fetchone()[0]  # type: ignore[index]
            # job_run is partitioned (migration 0015): its parent holds no rows itself.
            size = conn.execute(sql.SQL("SELECT pg_size_pretty(sum(pg_catalog.pg_total_relation_size(relid))) "
                                        "FROM pg_catalog.pg_partition_tree('pgsched.job_run')")
                                ).fetchone()[0]  # type: ignore[index]
        # --single-user answers a loopback host only (pgsched/web/server.py); TestClient's default
        # host, "testserver", got the refusal on every page.
        with TestClient(create_app(dsn, single_user=True), base_url="http://127.0.0.1") as owner:
            print(json.dumps({"viewer": "owner (--single-user)", "jobs": args.jobs, "rows": args.rows,
                              "window_index": args.window_index,
                              "job_run_size": size, "pages": measure(owner, job, args.repeat)}), flush=True)
        with TestClient(create_app(dsn)) as client:
            token = re.search(r'name="csrf" value="([^"]+)"', client.get("/signin").text).group(1)  # type: ignore[union-attr]
            r = client.post("/signin", data={"role": "bench_viewer", "password": "bench", "csrf": token})
            assert r.status_code == 200 and "bench_viewer" in r.text, r.text[:300]
            print(json.dumps({"viewer": "bench_viewer (owns 1/10 of the jobs; row-level security)",
                              "pages": measure(client, job, args.repeat)}), flush=True)


if __name__ == "__main__":
    main()
