"""Benchmarks for `pgsched serve` (issue 3's targets), each against its own fresh cluster.

    ./dev bench scheduler lag         start lag, 1,000 jobs on staggered 10 s intervals
    ./dev bench scheduler burst       1,000 jobs due at one instant
    ./dev bench scheduler throughput  trivial jobs, runs/s, vs pgbench on the same SQL; transactions per run
    ./dev bench scheduler idle        10,000 jobs none due for 60 s: scheduler CPU and queries/s
    ./dev bench scheduler scale       100,000 jobs: time to ready and RSS
    ./dev bench scheduler startup     from `serve` to the first runs of 16 jobs already due (5 starts)
    ./dev bench scheduler mixed       200 SQL jobs and 200 Python handlers: runs/s of each
    ./dev bench scheduler scopes      one sharded job's plan fanning out to 10,000 scope runs
    ./dev bench scheduler all
    ./dev bench scheduler throughput --http both --rounds 2   with serve --http off and on, in turn
    ./dev bench scheduler throughput --owners 4                the jobs of four owners in turn
    ./dev bench scheduler burst --workers 8                    serve --max-workers 8 (default: serve's own)
    ./dev bench scheduler burst --commands                     the 1,000 jobs as command text (pg_cron's kind)
    ./dev bench scheduler burst --statements                   and the database's time, statement by statement


The cluster runs with PostgreSQL's default durability (fsync and synchronous_commit on).
The scheduler runs as a real subprocess; figures are printed as one JSON object per scenario.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import statistics
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
from common import (
    children,
    cluster,
    cpu_by_part,
    cpu_seconds,
    cpu_spent,
    pgbench_tps,
    serve,
    serve_default_workers,
    sleep_until,
    tree_cpu_seconds,
    wait_for_log,
)
from psycopg import sql

from pgsched.embedded import free_port


def add_jobs(dsn: str, n: int, proc: str, interval: str, *, fixed: bool, delay_s: float, stagger_ms: float = 0) -> None:
    """Insert n jobs directly (add_job per row would dominate the set-up time).

    The first is due delay_s after now (on a whole second), each next one stagger_ms later.
    """
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            """INSERT INTO pgsched.job (job_name, kind, proc_schema, proc_name, schedule, schedule_interval,
                                        fixed_schedule, initial_start)
               SELECT 'bench ' || g, 'proc', 'public', %s, %s, %s::interval, %s,
                      date_trunc('second', now()) + make_interval(secs => %s + (g - 1) * %s / 1000.0)
                 FROM generate_series(1, %s) g""",
            (proc, interval, interval, fixed, delay_s, stagger_ms, n),
        )
        conn.execute("UPDATE pgsched.job_stat s SET next_start = j.initial_start FROM pgsched.job j "
                     "WHERE j.job_id = s.job_id")


# The scheduler's counters, keys of its stats records (pgsched/scheduler.py log_stats) in --log-format json.
STATS_KEYS = ("runs_started", "runs_ended", "running", "scheduler_transactions", "per_run")


def final_stats(log: Path) -> dict[str, float]:
    rec = wait_for_log(log, "scheduler stopped", 30)
    return {k: float(rec[k]) for k in STATS_KEYS}


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


# -- scenarios ---------------------------------------------------------------------------------
@contextlib.contextmanager
def scraped(http: bool) -> Iterator[list[str]]:
    """serve options for --http (on a free port) and, while the block runs, a scrape of /metrics
    every second (Prometheus' default is 15 s: this costs more than a real deployment)."""
    if not http:
        yield []
        return
    port = free_port()
    stop = threading.Event()
    scrapes = [0]

    def scrape() -> None:
        while not stop.wait(1.0):
            with contextlib.suppress(OSError), \
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                r.read()
                scrapes[0] += 1

    t = threading.Thread(target=scrape, daemon=True)
    t.start()
    try:
        yield ["--http", f"127.0.0.1:{port}"]
    finally:
        stop.set()
        t.join()
        if scrapes[0] == 0:
            raise RuntimeError("--http: /metrics was never scraped")


# --priorities: lag and throughput with half the jobs (the even ids) at priority 10; --exclude: half
# of them (the odd ids) with an exclusion window of next month, checked for every run and never
# matching. The workflow settings used rather than left at their defaults (issue 14: the claim
# must stay as fast). --jitter: half of them (the odd ids) with a jitter of 10 ms (the lag counts
# from the delayed start, so that it measures the scheduler, not the delay asked for).
# --concurrency: half of them (the odd ids) on one concurrency key with a limit of 100, so every
# claim takes the key's lock and counts its runs, and the limit never binds (32 workers or fewer).
# --dependencies: half of them (the odd ids) run after the job before them (an even id). In throughput,
# with no schedule of their own ('@after': each success of the upstream gives the dependent a plan, due at
# once, which the claim starts like a scheduled job's); in lag, keeping their schedule (each plan
# asks whether its upstream, due 10 ms earlier, succeeded since the previous one: one more statement
# per run; the lag counts its runs as any other).
# --owners N: the jobs belong to N login roles in turn (job_id modulo N), so that workers open
# sessions as several owners, and the scheduler gives a run to another worker than the claim
# recorded (owner matching) or a worker reconnects as the run's owner: the close then corrects the
# run's pids.
PRIORITIES = False
EXCLUDE = False
JITTER = False
CONCURRENCY = False
DEPENDENCIES = False
OWNERS = 1
COMMANDS = False  # --commands: burst's jobs are command text
# --statements: burst's database time statement by statement (pg_stat_statements, nested ones too,
# planning counted), from 0.2 s before the jobs are due until the last run's close.
STATEMENTS = False
STATEMENTS_SETTINGS = {"shared_preload_libraries": "pg_stat_statements", "pg_stat_statements.track": "all",
                       "pg_stat_statements.track_planning": "on"}
STATEMENTS_SHOWN = 15
# serve --max-workers of the scenarios (--workers; serve's own default unless given).
WORKERS = 8


def prioritise_half(dsn: str, priority: int = 10) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE pgsched.job SET priority = %s WHERE job_id %% 2 = 0", (priority,))


def use_workflow_settings(dsn: str, *, scheduled_dependents: bool) -> None:
    """What --priorities, --exclude, --jitter, --concurrency, --dependencies and --owners ask for."""
    if PRIORITIES:
        prioritise_half(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        if OWNERS > 1:
            conn.execute("GRANT INSERT ON bench_start TO PUBLIC")
            for i in range(OWNERS):
                conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(f"bench_owner_{i}")))
            conn.execute("UPDATE pgsched.job SET owner = format('bench_owner_%%s', job_id %% %s)::regrole",
                         (OWNERS,))
        if EXCLUDE:
            conn.execute("UPDATE pgsched.job SET exclude = format('* * * %%s *', "
                         "extract(month FROM now())::int %% 12 + 1) WHERE job_id %% 2 = %s", (1,))
        if JITTER:
            conn.execute("UPDATE pgsched.job SET jitter = interval '10 milliseconds' WHERE job_id %% 2 = %s", (1,))
        if CONCURRENCY:
            conn.execute("SELECT pgsched.set_concurrency_limit('bench', 100)")
            conn.execute("UPDATE pgsched.job SET concurrency_key = 'bench' WHERE job_id %% 2 = %s", (1,))
        if DEPENDENCIES:
            conn.execute("UPDATE pgsched.job SET depends_on = ARRAY[job_id - 1], "
                         "schedule = CASE WHEN %s THEN schedule ELSE '@after' END "
                         "WHERE job_id %% 2 = 1 AND job_id - 1 IN (SELECT job_id FROM pgsched.job)",
                         (scheduled_dependents,))
            if not scheduled_dependents:
                conn.execute("UPDATE pgsched.job_stat SET next_start = NULL WHERE job_id IN "
                             "(SELECT job_id FROM pgsched.job WHERE schedule = '@after')")


def lag(seconds: float = 40.0, http: bool = False) -> dict[str, Any]:
    """1,000 jobs every 10 s, their starts spread evenly over the 10 s (one due every 10 ms)."""
    with cluster() as (_, dsn):
        add_jobs(dsn, 1000, "mark", "10 seconds", fixed=True, delay_s=3, stagger_ms=10)
        use_workflow_settings(dsn, scheduled_dependents=True)
        with scraped(http) as http_args, serve(dsn, "--max-workers", str(WORKERS), *http_args):
            time.sleep(seconds)
        with psycopg.connect(dsn) as conn:
            # The job records clock_timestamp() as it starts: the actual start. Its plan is the slot it belongs to.
            # With --jitter, from the plan's delayed start (README "Jitter").
            rows = conn.execute(
                """SELECT extract(epoch FROM b.at - p.slot
                                  - pgsched._jitter_us(j.job_id, p.slot, s.jitter_us) * interval '1 microsecond') * 1000
                     FROM bench_start b JOIN pgsched.job j ON j.job_id = b.job_id
                     JOIN pgsched.job_stat s ON s.job_id = b.job_id
                     CROSS JOIN LATERAL (SELECT j.initial_start + floor(extract(epoch FROM b.at - j.initial_start)
                                                / 10) * interval '10 seconds' AS slot) p
                    WHERE b.at > (SELECT min(at) FROM bench_start) + interval '10 seconds'""").fetchall()
            claim = conn.execute("SELECT extract(epoch FROM started_at - plan_time - coalesce(jitter, '0')) * 1000 "
                                 "FROM pgsched.job_run WHERE outcome = 'success'").fetchall()
    lags = [float(r[0]) for r in rows]
    claims = [float(r[0]) for r in claim]
    return {"scenario": "lag", "http": http, "priorities": PRIORITIES, "exclude": EXCLUDE, "jitter": JITTER,
            "concurrency": CONCURRENCY, "dependencies": DEPENDENCIES, "owners": OWNERS,
            "runs": len(lags),
            "p50_ms": round(pct(lags, 50), 2),
            "p99_ms": round(pct(lags, 99), 2), "max_ms": round(max(lags), 2),
            "claim_p50_ms": round(pct(claims, 50), 2), "claim_p99_ms": round(pct(claims, 99), 2),
            "target": "p50 <= 2 ms, p99 <= 10 ms"}


def burst() -> dict[str, Any]:
    with cluster(settings=STATEMENTS_SETTINGS if STATEMENTS else None) as (c, dsn):
        add_jobs(dsn, 1000, "mark", "1 hour", fixed=True, delay_s=4)
        if STATEMENTS:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("CREATE EXTENSION pg_stat_statements")
        if COMMANDS:
            # pg_cron's kind of job: the same row written by command text of one statement.
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("UPDATE pgsched.job SET kind = 'command', proc_schema = NULL, proc_name = NULL, "
                             "command = format('INSERT INTO bench_start (job_id) VALUES (%s)', job_id)")
        with psycopg.connect(dsn) as conn:
            due = conn.execute("SELECT min(initial_start) FROM pgsched.job").fetchone()
        postmaster = c.postmaster_pid()
        assert due is not None and postmaster is not None
        with serve(dsn, "--max-workers", str(WORKERS)) as (proc, _), \
                psycopg.connect(dsn, autocommit=True) as conn:
            # The CPU (and --statements) counted from 0.2 s before the jobs are due: the burst
            # without serve's start-up.
            sleep_until(conn, due[0], early_s=0.2)
            if STATEMENTS:
                conn.execute("SELECT pg_stat_statements_reset()")
            cpu_before = cpu_by_part(conn, proc.pid, postmaster)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                row = conn.execute("SELECT count(DISTINCT job_id) FROM bench_start").fetchone()
                if row and row[0] >= 1000:
                    break
                time.sleep(0.1)
            cpu_after = cpu_by_part(conn, proc.pid, postmaster)
            statements = burst_statements(conn) if STATEMENTS else None
            row = conn.execute("SELECT count(DISTINCT job_id), extract(epoch FROM max(at) - %s), "
                               "extract(epoch FROM min(at) - %s) FROM bench_start", (due[0], due[0])
                               ).fetchone()
            # The burst's rounds: a claim's runs share its transaction's start (started_at), or the
            # plan time when claimed ahead of it; from there to the job's own insert, and to the
            # run's end as its scheduler recorded it.
            rounds = conn.execute(
                "SELECT count(DISTINCT started_at), percentile_cont(0.5) WITHIN GROUP (ORDER BY to_job), "
                "       percentile_cont(0.5) WITHIN GROUP (ORDER BY to_end) "
                "  FROM (SELECT r.started_at, extract(epoch FROM b.at - r.started_at) AS to_job, "
                "               extract(epoch FROM r.finished_at - r.started_at) AS to_end "
                "          FROM pgsched.job_run r JOIN bench_start b USING (job_id)) x").fetchone()
    assert row is not None and rounds is not None
    return {"scenario": "burst", "started": row[0], "last_start_after_s": round(float(row[1]), 3),
            "first_start_after_s": round(float(row[2]), 4), "workers": WORKERS, "commands": COMMANDS,
            "claims": rounds[0], "runs_per_claim": round(row[0] / max(1, rounds[0]), 1),
            "claim_to_job_ms_p50": None if rounds[1] is None else round(1000 * float(rounds[1]), 2),
            "run_ms_p50": None if rounds[2] is None else round(1000 * float(rounds[2]), 2),
            # from 0.2 s before the due time until all had started (polled every 0.1 s)
            **cpu_spent(cpu_before, cpu_after, runs=1000),
            **({"statements": statements} if statements is not None else {}),
            "target": "all 1000 started, the last within 2 s"}


def burst_statements(conn: psycopg.Connection[Any]) -> list[dict[str, Any]]:
    """The statements that took the most database time in the burst, once every run is closed:
    per statement, its calls and plans and its time per run (of 1,000) in microseconds, planning
    apart. A statement's time includes the statements it runs (nested: false), which are listed
    too: the times do not add up."""
    closing = time.monotonic() + 10
    while time.monotonic() < closing and conn.execute(
            "SELECT EXISTS (SELECT 1 FROM pgsched.job_run_live WHERE outcome = 'running')").fetchone() != (False,):
        time.sleep(0.05)
    rows = conn.execute(
        "SELECT calls, plans, total_plan_time, total_exec_time, toplevel, "
        "       left(regexp_replace(query, '\\s+', ' ', 'g'), 110) "
        "  FROM pg_stat_statements WHERE query NOT LIKE '%%pg_stat_statements%%' "
        " ORDER BY total_plan_time + total_exec_time DESC LIMIT %s", (STATEMENTS_SHOWN,)).fetchall()
    runs = 1000  # the burst's jobs, one run each; the totals are in milliseconds
    return [{"calls": r[0], "plans": r[1], "plan_us_per_run": round(1000 * float(r[2]) / runs, 1),
             "exec_us_per_run": round(1000 * float(r[3]) / runs, 1), "nested": not r[4], "query": r[5]} for r in rows]


def scopes(n: int = 10_000) -> dict[str, Any]:
    """One sharded job whose plan fans out to n scope runs, each inserting a row (issue 13: all
    started within 3.5 s of the plan time)."""
    with cluster() as (_, dsn):
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE bench_scope (scope text, at timestamptz DEFAULT clock_timestamp())")
            conn.execute("CREATE FUNCTION public.mark_scope(job_id int, config jsonb) RETURNS void LANGUAGE sql "
                         "AS $$INSERT INTO bench_scope (scope) VALUES (current_setting('pgsched.scope'))$$")
            plan = conn.execute("SELECT date_trunc('second', now()) + interval '4 s'").fetchone()
            assert plan is not None
            conn.execute("SELECT pgsched.add_job('mark_scope', interval '1 hour', initial_start => %s, "
                         "scope_query => %s)", (plan[0], f"SELECT g FROM generate_series(1, {n}) g"))
        with serve(dsn, "--max-workers", str(WORKERS)), psycopg.connect(dsn, autocommit=True) as conn:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                row = conn.execute("SELECT count(*) FROM bench_scope").fetchone()
                if row and row[0] >= n:
                    break
                time.sleep(0.2)
            row = conn.execute(
                "SELECT count(DISTINCT scope), extract(epoch FROM max(at) - %(p)s), "
                "extract(epoch FROM min(at) - %(p)s), "
                "(SELECT extract(epoch FROM r.finished_at - %(p)s) FROM pgsched.job_run r WHERE r.scope = '') "
                "FROM bench_scope", {"p": plan[0]}).fetchone()
    assert row is not None
    return {"scenario": "scopes", "scope_runs": n, "started": row[0], "last_start_after_s": round(float(row[1]), 3),
            "first_start_after_s": round(float(row[2]), 3),
            "keys_read_after_s": None if row[3] is None else round(float(row[3]), 3), "workers": WORKERS,
            "target": f"all {n} scope runs started within 3.5 s (issue 13)"}


def priority() -> dict[str, Any]:
    """1,000 jobs due at one instant, the even half at priority 10 (--workers): the high half must
    all start before any of the low half (issue 14)."""
    with cluster() as (_, dsn):
        add_jobs(dsn, 1000, "mark", "1 hour", fixed=True, delay_s=4)
        prioritise_half(dsn)
        with serve(dsn, "--max-workers", str(WORKERS)), psycopg.connect(dsn, autocommit=True) as conn:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                row = conn.execute("SELECT count(DISTINCT job_id) FROM bench_start").fetchone()
                if row and row[0] >= 1000:
                    break
                time.sleep(0.1)
            row = conn.execute(
                "SELECT count(DISTINCT job_id), max(at) FILTER (WHERE job_id % 2 = 0) < "
                "       min(at) FILTER (WHERE job_id % 2 = 1), "
                "       extract(epoch FROM max(at) FILTER (WHERE job_id % 2 = 0) - min(at)), "
                "       extract(epoch FROM max(at) - min(at)), "
                "       count(*) FILTER (WHERE job_id % 2 = 1 AND at < (SELECT max(at) FROM bench_start "
                "                                                    WHERE job_id % 2 = 0)), "
                "       extract(epoch FROM max(at) FILTER (WHERE job_id % 2 = 0) "
                "                          - min(at) FILTER (WHERE job_id % 2 = 1)) * 1000 "
                "  FROM bench_start").fetchone()
            claimed = conn.execute(
                "SELECT max(run_id) FILTER (WHERE job_id % 2 = 0) < min(run_id) FILTER (WHERE job_id % 2 = 1) "
                "  FROM pgsched.job_run").fetchone()
    assert row is not None and claimed is not None
    # The claim takes every high one first (run ids are in claim order); the round of 8 that holds
    # the last high ones can also hold the first low ones, whose workers may start a moment before
    # theirs: how many did, and by how much, says how strict "before" is at the start.
    return {"scenario": "priority", "started": row[0], "claimed_all_high_before_any_low": claimed[0],
            "started_all_high_before_any_low": row[1], "low_started_before_the_last_high": row[4],
            "overlap_ms": round(max(float(row[5]), 0.0), 2),
            "last_high_after_first_s": round(float(row[2]), 3), "last_after_first_s": round(float(row[3]), 3),
            "target": "all 1000 started, every priority-10 job before any priority-0 one"}


def ageing(seconds: float = 30.0) -> dict[str, Any]:
    """400 jobs at priority 10 always due keep the workers busy; one job at priority 0 is due at T:
    it starts about 10 s after T (the difference in priorities), not never (issue 14's bound)."""
    with cluster() as (_, dsn):
        add_jobs(dsn, 400, "noop", "1 millisecond", fixed=False, delay_s=0)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("UPDATE pgsched.job SET priority = 10")
            low = conn.execute("INSERT INTO pgsched.job (job_name, kind, proc_schema, proc_name, schedule) "
                               "VALUES ('low', 'proc', 'public', 'mark', '1 hour') RETURNING job_id").fetchone()
            assert low is not None
            with serve(dsn, "--max-workers", str(WORKERS)) as (_, log):
                wait_for_log(log, "ready:", 30)
                time.sleep(2)
                due = conn.execute("UPDATE pgsched.job_stat SET next_start = now() WHERE job_id = %s "
                                   "RETURNING next_start", (low[0],)).fetchone()
                assert due is not None
                deadline = time.monotonic() + seconds
                row = None
                while time.monotonic() < deadline:
                    row = conn.execute("SELECT extract(epoch FROM min(at) - %s) FROM bench_start WHERE job_id = %s",
                                       (due[0], low[0])).fetchone()
                    if row and row[0] is not None:
                        break
                    time.sleep(0.1)
    waited = float(row[0]) if row and row[0] is not None else None
    return {"scenario": "ageing", "low_job_started_after_s": None if waited is None else round(waited, 3),
            "bound_s": 10, "target": "the priority-0 job starts about 10 s after it is due, behind 400 "
                                     "priority-10 jobs always due"}


# The SQL one pgsched run costs, as pgbench runs it: the start mark, the job with its
# set-up (one statement, as the worker sends it for a function job), the end mark and
# the session reset. Each client owns one job. The marks run with synchronous_commit
# off, as on the scheduler's connection (PGOPTIONS below; the reset's RESET ALL keeps it). The close
# is API 1's _mark_end, which every schema since 0.1.0 has (`./dev bench compare` runs this
# script against older trees too); since API 2 it is a wrapper over _mark_end_v2. The reset is
# DISCARD ALL's parts but DISCARD PLANS: pgsched's marks run on the scheduler's session, which
# keeps their plans, and a reset that dropped them here made every mark plan its function's
# statements anew (4 and 8 ms a mark, pgbench 450-570 runs/s against 1,300-1,800 before the
# marks' functions grew; 2026-12-03). One query (pgbench's \\;), as DISCARD ALL is one.
PER_RUN_SQL = """\\set j 1000 + :client_id
SELECT pgsched._mark_start(:j, clock_timestamp(), 'schedule') AS rid \\gset
SELECT pg_catalog.set_config('application_name', 'pgsched job', false), public.noop(:j, NULL);
SELECT pgsched._mark_end(:rid, 'success', NULL, NULL, clock_timestamp() + interval '1 hour');
CLOSE ALL\\; RESET ALL\\; DEALLOCATE ALL\\; UNLISTEN *\\;
  SELECT pg_catalog.pg_advisory_unlock_all()\\; DISCARD TEMP\\; DISCARD SEQUENCES;
"""


def throughput(seconds: float = 20.0, http: bool = False) -> dict[str, Any]:
    workers = WORKERS
    with cluster() as (c, dsn):
        add_jobs(dsn, 400, "noop", "1 millisecond", fixed=False, delay_s=0)
        use_workflow_settings(dsn, scheduled_dependents=False)
        with scraped(http) as http_args, serve(dsn, "--max-workers", str(workers), *http_args) as (proc, log):
            wait_for_log(log, "ready:", 30)
            time.sleep(2)
            with psycopg.connect(dsn, autocommit=True) as conn:
                def runs() -> tuple[int, int]:
                    r = conn.execute("SELECT count(*) FILTER (WHERE outcome = 'success'), coalesce(max(run_id), 0) "
                                     "FROM pgsched.job_run").fetchone()
                    return (int(r[0]), int(r[1])) if r else (0, 0)
                pm = c.postmaster_pid()
                assert pm is not None
                (n0, id0), t0, c0, a0 = runs(), time.monotonic(), cpu_seconds(proc.pid), tree_cpu_seconds(proc.pid, pm)
                time.sleep(seconds)
                (n1, id1), t1, c1, a1 = runs(), time.monotonic(), cpu_seconds(proc.pid), tree_cpu_seconds(proc.pid, pm)
                # The sessions the window's runs ran in (each backend pid one session), over the runs
                # claimed in it: the sessions the workers opened in the window plus those they held
                # from before it (at most workers x worker_sessions, against tens of thousands of runs).
                sessions = conn.execute("SELECT count(DISTINCT backend_pid) FROM pgsched.job_run "
                                        "WHERE run_id > %s AND run_id <= %s", (id0, id1)).fetchone()
        stats = final_stats(log)
        rate = (n1 - n0) / (t1 - t0)
        bench = pgbench_tps(c, PER_RUN_SQL, workers, 10, options="-c synchronous_commit=off")
    return {"scenario": "throughput", "http": http, "priorities": PRIORITIES, "exclude": EXCLUDE, "jitter": JITTER,
            "concurrency": CONCURRENCY, "dependencies": DEPENDENCIES, "owners": OWNERS,
            "runs_per_s": round(rate, 1),
            "pgbench_runs_per_s_same_sql": round(bench, 1),
            # The scheduler process's own CPU per run (its workers not included): less noisy than runs/s
            # on a shared machine, and where the cost of --http would show.
            "scheduler_cpu_us_per_run": round(1e6 * (c1 - c0) / max(n1 - n0, 1), 1),
            # Everything a run costs: the scheduler, its workers, and every PostgreSQL process (their
            # backends, the WAL writer, autovacuum). The runs' cost with the machine's other load
            # taken out, where runs/s moves with it (issue 14's comparisons).
            "cpu_us_per_run": round(1e6 * (a1 - a0) / max(n1 - n0, 1), 1),
            "sessions_per_run": round(int(sessions[0]) / max(id1 - id0, 1), 4) if sessions else None,
            "ratio": round(rate / bench, 3), "scheduler_transactions_per_run": stats.get("per_run"),
            "workers": workers, "target": ">= 1000 runs/s and >= 0.5 x pgbench; <= 2 scheduler transactions/run"}


def stats_now(proc: subprocess.Popen[bytes], log: Path) -> dict[str, float]:
    """Ask the scheduler for its counters (SIGUSR1) and read the keys of the record it logs."""
    def records() -> list[dict[str, Any]]:
        out = []
        for line in log.read_text().splitlines():
            with contextlib.suppress(ValueError):
                rec = json.loads(line)
                if rec.get("stats") == "stats":
                    out.append(rec)
        return out

    seen = len(records())
    proc.send_signal(signal.SIGUSR1)
    deadline = time.monotonic() + 5
    while len(found := records()) == seen:
        if time.monotonic() > deadline:
            raise TimeoutError("no stats record")
        time.sleep(0.01)
    return {k: float(found[-1][k]) for k in STATS_KEYS}


def idle(seconds: float = 60.0) -> dict[str, Any]:
    with cluster() as (_, dsn):
        add_jobs(dsn, 10_000, "noop", "1 hour", fixed=True, delay_s=3600)
        with serve(dsn, "--max-workers", str(WORKERS)) as (proc, log):
            wait_for_log(log, "ready:", 60)
            time.sleep(3)
            pids = [proc.pid, *children(proc.pid)]
            with psycopg.connect(dsn, autocommit=True) as conn:
                def xacts() -> int:
                    r = conn.execute("SELECT xact_commit + xact_rollback FROM pg_stat_database "
                                     "WHERE datname = current_database()").fetchone()
                    return int(r[0]) if r else 0
                conn.execute("SELECT pg_stat_clear_snapshot()")
                s0, x0, c0, t0 = stats_now(proc, log), xacts(), sum(cpu_seconds(p) for p in pids), time.monotonic()
                time.sleep(seconds)
                conn.execute("SELECT pg_stat_clear_snapshot()")
                s1, x1, c1, t1 = stats_now(proc, log), xacts(), sum(cpu_seconds(p) for p in pids), time.monotonic()
        wall = t1 - t0
        scheduler_q = s1["scheduler_transactions"] - s0["scheduler_transactions"]
        # Every transaction in the database, ours (two measurement statements) taken out:
        # includes autovacuum and the statistics collector, not only pgsched.
        all_q = max(0, x1 - x0 - 2)
    return {"scenario": "idle", "jobs": 10_000, "seconds": round(wall, 1),
            "scheduler_cpu_percent": round(100 * (c1 - c0) / wall, 3),
            "scheduler_queries_per_s": round(scheduler_q / wall, 3),
            "database_transactions_per_s": round(all_q / wall, 3),
            "target": "CPU <= 0.5 %, <= 1 query/s"}


def scale() -> dict[str, Any]:
    with cluster() as (_, dsn):
        add_jobs(dsn, 100_000, "noop", "1 hour", fixed=True, delay_s=3600)
        t0 = time.monotonic()
        with serve(dsn, "--max-workers", str(WORKERS)) as (proc, log):
            rec = wait_for_log(log, "ready:", 60)
            ready = time.monotonic() - t0
            time.sleep(2)
            sched_rss = rss_mb(proc.pid)
            worker_rss = [rss_mb(p) for p in children(proc.pid)]
        del rec
    return {"scenario": "scale", "jobs": 100_000, "ready_s": round(ready, 2), "scheduler_rss_mb": round(sched_rss, 1),
            "worker_rss_mb_each": round(statistics.mean(worker_rss), 1) if worker_rss else None,
            "target": "ready <= 5 s, scheduler RSS <= 250 MB"}


def mixed(seconds: float = 20.0, workers: int = 8) -> dict[str, Any]:
    """200 trivial SQL jobs and 200 trivial Python handlers (bench/pyjobs.py), all always due."""
    with cluster() as (_, dsn):
        add_jobs(dsn, 200, "noop", "1 millisecond", fixed=False, delay_s=0)
        with serve(dsn, "--max-workers", str(workers), "--app", "bench.pyjobs") as (_, log):
            wait_for_log(log, "ready:", 30)
            time.sleep(2)
            with psycopg.connect(dsn, autocommit=True) as conn:
                def runs() -> dict[str, int]:
                    rows = conn.execute("SELECT j.kind, count(*) FROM pgsched.job_run r JOIN pgsched.job j "
                                        "USING (job_id) WHERE r.outcome = 'success' GROUP BY j.kind").fetchall()
                    return {str(k): int(n) for k, n in rows}
                n0, t0 = runs(), time.monotonic()
                time.sleep(seconds)
                n1, t1 = runs(), time.monotonic()
                failed = conn.execute("SELECT count(*) FROM pgsched.job_run WHERE outcome NOT IN "
                                      "('success', 'running')").fetchone()
    rate = {k: (n1.get(k, 0) - n0.get(k, 0)) / (t1 - t0) for k in ("proc", "python")}
    return {"scenario": "mixed", "sql_runs_per_s": round(rate["proc"], 1),
            "python_runs_per_s": round(rate["python"], 1), "total_runs_per_s": round(sum(rate.values()), 1),
            "not_successful": failed[0] if failed else None, "workers": workers}


def startup(starts: int = 5, jobs: int = 16) -> dict[str, Any]:
    """`pgsched serve` started `starts` times on a database where `jobs` jobs are already due:
    seconds from the process's start to its first run, to its 8th, to its 'ready' line (all 8
    workers connected) and to its instance's registration (before any worker is launched). The
    server's clock and ours are the same machine's."""
    firsts: list[float] = []
    eighths: list[float] = []
    readies: list[float] = []
    instances: list[float] = []
    with cluster() as (_, dsn):
        add_jobs(dsn, jobs, "mark", "1 hour", fixed=False, delay_s=3600)
        for _ in range(starts):
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("TRUNCATE bench_start")
                conn.execute("UPDATE pgsched.job_stat SET next_start = now() - interval '1 second'")
            t0 = time.time()
            with serve(dsn, "--max-workers", str(WORKERS)) as (_, log):
                rec = wait_for_log(log, "ready:", 30)
                instances.append(datetime_epoch(wait_for_log(log, "started (max_workers", 1)) - t0)
                deadline = time.monotonic() + 30
                with psycopg.connect(dsn, autocommit=True) as conn:
                    while True:
                        row = conn.execute("SELECT count(*), min(extract(epoch FROM at)), "
                                           "(array_agg(extract(epoch FROM at) ORDER BY at))[8] FROM bench_start"
                                           ).fetchone()
                        if row and row[0] >= 8:
                            break
                        if time.monotonic() > deadline:
                            raise TimeoutError("fewer than 8 runs started within 30 s")
                        time.sleep(0.05)
            firsts.append(float(row[1]) - t0)
            eighths.append(float(row[2]) - t0)
            readies.append(datetime_epoch(rec) - t0)
    return {"scenario": "startup", "starts": starts, "jobs_due": jobs,
            "first_run_s": round(statistics.median(firsts), 3), "eighth_run_s": round(statistics.median(eighths), 3),
            "ready_s": round(statistics.median(readies), 3),
            "instance_registered_s": round(statistics.median(instances), 3),
            "first_run_each_s": [round(x, 3) for x in firsts],
            "target": "ready to run within 0.3 s of start (issue 13)"}


def datetime_epoch(rec: dict[str, Any]) -> float:
    """The time of a JSON log record, as seconds since the epoch."""
    return datetime.fromisoformat(str(rec["ts"])).timestamp()


SCENARIOS = {"lag": lag, "burst": burst, "throughput": throughput, "idle": idle, "scale": scale, "mixed": mixed,
             "priority": priority, "ageing": ageing, "startup": startup, "scopes": scopes}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("scenario", choices=[*SCENARIOS, "all"])
    ap.add_argument("--http", choices=["off", "on", "both"], default="off",
                    help="lag and throughput: serve --http (scraped every second); both: off and on in turn "
                         "(off-on, on-off, ...), --rounds pairs, then the mean of each")
    ap.add_argument("--rounds", type=int, default=1, help="with --http both: how many off/on pairs")
    ap.add_argument("--workers", type=int, default=None,
                    help="serve --max-workers of every scenario but mixed (default: serve's own, "
                         "on a cluster of 100 connections: 24 on this machine)")
    ap.add_argument("--priorities", action="store_true",
                    help="lag and throughput: half the jobs at priority 10 (the setting used, not left at 0)")
    ap.add_argument("--exclude", action="store_true",
                    help="lag and throughput: half the jobs with an exclusion window (of next month: never "
                         "matching, checked for every run)")
    ap.add_argument("--jitter", action="store_true",
                    help="lag and throughput: half the jobs with a jitter of 10 ms (lag counted from the delayed "
                         "start)")
    ap.add_argument("--concurrency", action="store_true",
                    help="lag and throughput: half the jobs on one concurrency key with a limit of 100 (never "
                         "binding: the claim's lock and count are what is measured)")
    ap.add_argument("--dependencies", action="store_true",
                    help="lag and throughput: half the jobs run after another (throughput: with no schedule of "
                         "their own; lag: keeping theirs, each plan checking its upstream succeeded)")
    ap.add_argument("--commands", action="store_true",
                    help="burst: the jobs are command text (INSERT ..., pg_cron's kind) instead of functions")
    ap.add_argument("--statements", action="store_true",
                    help="burst: the database's time statement by statement (pg_stat_statements on the bench "
                         "cluster; Debian's postgresql-NN and the embedded PostgreSQL 18 have it)")
    ap.add_argument("--owners", type=int, default=1,
                    help="lag and throughput: the jobs belong to this many login roles in turn (default 1: "
                         "the bench's superuser)")
    args = ap.parse_args()
    if args.owners < 1:
        ap.error("--owners: a whole number of roles, 1 or more")
    global PRIORITIES, EXCLUDE, JITTER, CONCURRENCY, DEPENDENCIES, WORKERS, OWNERS, COMMANDS, STATEMENTS
    WORKERS = args.workers or serve_default_workers()
    PRIORITIES, EXCLUDE, JITTER, CONCURRENCY = args.priorities, args.exclude, args.jitter, args.concurrency
    DEPENDENCIES, OWNERS, COMMANDS, STATEMENTS = args.dependencies, args.owners, args.commands, args.statements
    names = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
    for name in names:
        if name not in HTTP_SCENARIOS or args.http != "both":
            kwargs = {"http": args.http == "on"} if name in HTTP_SCENARIOS else {}
            print(json.dumps((HTTP_RUNS.get(name) or SCENARIOS[name])(**kwargs)), flush=True)
            continue
        results: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
        for i in range(args.rounds):
            # off, on, then on, off, ...: the second of a pair is not always the same one.
            for http in ((False, True) if i % 2 == 0 else (True, False)):
                r = HTTP_RUNS[name](http=http)
                print(json.dumps(r), flush=True)
                results[http].append(r)
        print(json.dumps(compare(name, results)), flush=True)


# The scenarios that take http=, and the figure each compares with it on and off.
HTTP_SCENARIOS = {"throughput": ("runs_per_s", "ratio", "scheduler_cpu_us_per_run"),
                  "lag": ("p50_ms", "p99_ms", "max_ms")}
HTTP_RUNS: dict[str, Callable[..., dict[str, Any]]] = {"throughput": throughput, "lag": lag}


def compare(name: str, results: dict[bool, list[dict[str, Any]]]) -> dict[str, Any]:
    """The mean of each figure with --http off and on, and the change in percent."""
    out: dict[str, Any] = {"scenario": f"{name} http off vs on", "rounds": len(results[False])}
    for key in HTTP_SCENARIOS[name]:
        off = statistics.mean(r[key] for r in results[False])
        on = statistics.mean(r[key] for r in results[True])
        out[key] = {"off": round(off, 2), "on": round(on, 2),
                    "change_percent": round(100 * (on - off) / off, 1) if off else None}
    return out



if __name__ == "__main__":
    main()
