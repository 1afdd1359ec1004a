"""`pgsched serve` as a real process: kill -9 of workers and of the scheduler, a PostgreSQL
restart, a terminated scheduler connection, SIGTERM, live catalog changes, overlap,
timeouts, JSON logs and a standby that gets promoted.

Each test asserts the catalog counters and history outcomes exactly, and checks in
pg_stat_activity that no backend of a dead run is left executing.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from pgsched.embedded import Cluster, free_port
from tests.acceptance.conftest import Conn, ServeFactory, pids_with_marker, query, wait_for
from tests.conftest import PgServer

# Job targets: `sleeper` sleeps config->>'s' seconds (a procedure, like most jobs),
# `stubborn` ignores query cancels (only pg_terminate_backend stops it), `tick` just records that it ran.
SETUP_SQL = """
CREATE TABLE public.ran (job_id integer, at timestamptz DEFAULT clock_timestamp());
CREATE PROCEDURE public.sleeper(job_id integer, config jsonb) LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_sleep((config->>'s')::float8);
    INSERT INTO public.ran (job_id) VALUES (job_id);
END $$;
CREATE PROCEDURE public.stubborn(job_id integer, config jsonb) LANGUAGE plpgsql AS $$
BEGIN
    LOOP
        BEGIN
            PERFORM pg_sleep(30);
        EXCEPTION WHEN query_canceled THEN
            NULL;
        END;
    END LOOP;
END $$;
CREATE PROCEDURE public.tick(job_id integer, config jsonb) LANGUAGE sql
    AS $$ INSERT INTO public.ran (job_id) VALUES (job_id) $$;
"""


@pytest.fixture
def jobs_db(db: str) -> str:
    """`db` with the job targets of SETUP_SQL."""
    with psycopg.connect(db, autocommit=True) as c:
        c.execute(SETUP_SQL)
    return db


@pytest.fixture
def api(jobs_db: str, conn: Conn) -> Conn:
    return conn


# -- helpers ------------------------------------------------------------------------------

def add_job(dsn: str, args: str, params: tuple[Any, ...] | None = None) -> int:
    rows = query(dsn, f"SELECT pgsched.add_job({args}) AS id", params)
    return int(rows[0]["id"])


def stats(dsn: str, job_id: int) -> dict[str, Any]:
    rows = query(dsn, "SELECT * FROM pgsched.job_stats WHERE job_id = %s", (job_id,))
    assert len(rows) == 1
    return rows[0]


def history(dsn: str, job_id: int) -> list[dict[str, Any]]:
    return query(dsn, "SELECT * FROM pgsched.job_history WHERE job_id = %s ORDER BY run_id", (job_id,))


def outcomes(dsn: str, job_id: int) -> list[str]:
    return [r["outcome"] for r in history(dsn, job_id)]


def running_run(dsn: str, job_id: int, timeout: float = 10.0) -> dict[str, Any]:
    """The job's 'running' history row once its worker and backend are known and the backend runs it."""
    def probe() -> dict[str, Any] | None:
        rows = query(dsn, """
            SELECT h.*, a.application_name AS app, a.query AS backend_query
              FROM pgsched.job_history h
              JOIN pg_stat_activity a ON a.pid = h.backend_pid
             WHERE h.job_id = %s AND h.outcome = 'running' AND a.state = 'active'
               AND a.application_name LIKE format('pgsched job %%s run %%s lease %%%%', h.job_id, h.run_id)""",
                     (job_id,))
        return rows[0] if rows else None

    return wait_for(probe, timeout, f"a running run of job {job_id}")


def backend_alive(dsn: str, pid: int) -> bool:
    return bool(query(dsn, "SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)))


def wait_backend_gone(dsn: str, pid: int, timeout: float) -> float:
    """Seconds it took until backend `pid` left pg_stat_activity."""
    t0 = time.monotonic()
    wait_for(lambda: not backend_alive(dsn, pid), timeout, f"backend {pid} to be gone")
    return time.monotonic() - t0


def wait_outcome(dsn: str, run_id: int, timeout: float) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        rows = query(dsn, "SELECT * FROM pgsched.job_history WHERE run_id = %s AND outcome <> 'running'",
                     (run_id,))
        return rows[0] if rows else None

    return wait_for(probe, timeout, f"run {run_id} to end")


def db_now(dsn: str) -> datetime:
    value = query(dsn, "SELECT clock_timestamp() AS t")[0]["t"]
    assert isinstance(value, datetime)
    return value


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (dead, not yet reaped by whoever inherited it) counts as gone.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return False


FAST = ("--shutdown-timeout", "1", "--crash-wait", "1")


# -- 1. kill -9 of a worker ---------------------------------------------------------------

def test_worker_killed_mid_run_is_a_crash(jobs_db: str, serve: ServeFactory) -> None:
    dsn = jobs_db
    slow = add_job(dsn, "'sleeper', '1 hour', config => '{\"s\": 30}', retry_period => '1 minute'")
    ticker = add_job(dsn, "'tick', '1 second'")
    s = serve(dsn, "--max-workers", "3", *FAST)
    run = running_run(dsn, slow)
    wait_for(lambda: stats(dsn, ticker)["total_successes"] >= 1, 5, "the ticker to succeed once")

    # (The harness finds the workers by the marker they inherit: check that it does.)
    assert {s.pid, run["worker_pid"]} <= set(pids_with_marker(s.tag))
    killed_at = query(dsn, "SELECT now() AS t")[0]["t"]
    os.kill(run["worker_pid"], signal.SIGKILL)
    ended = wait_outcome(dsn, run["run_id"], 5)
    assert ended["outcome"] == "crash", ended
    wait_backend_gone(dsn, run["backend_pid"], 3)
    st = stats(dsn, slow)
    assert (st["total_runs"], st["total_crashes"], st["consecutive_crashes"]) == (1, 1, 1), st
    assert (st["total_successes"], st["total_failures"], st["state"]) == (0, 0, "scheduled"), st
    # Crash backoff: retry_period (1 minute) +-10 % jitter, stored.
    assert 50 <= (st["next_start"] - ended["finished_at"]).total_seconds() <= 70, st
    assert outcomes(dsn, slow) == ["crash"]

    # The scheduler and its other runs carry on.
    before = stats(dsn, ticker)["total_successes"]
    wait_for(lambda: stats(dsn, ticker)["total_successes"] >= before + 2, 5, "the ticker to keep succeeding")
    # (total_crashes includes a run in progress until it ends: read both in one snapshot.)
    tick = query(dsn, """SELECT s.total_crashes - (SELECT count(*) FROM pgsched.job_run r
                                                  WHERE r.job_id = s.job_id AND r.outcome = 'running') AS crashes,
                               s.total_failures AS failures
                          FROM pgsched.job_stat s WHERE s.job_id = %s""", (ticker,))[0]
    assert (tick["crashes"], tick["failures"]) == (0, 0), tick
    # (A plan passed over while the instance was still starting is 'skipped': not this test's business.)
    assert {r["outcome"] for r in history(dsn, ticker) if r["plan_time"] >= killed_at} <= {"success", "running"}
    assert s.proc.poll() is None


# -- 2. kill -9 of the scheduler, then restart ---------------------------------------------

def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_scheduler_killed_then_restarted(jobs_db: str, serve: ServeFactory) -> None:
    dsn = jobs_db
    job = add_job(dsn, "'sleeper', '1 hour', config => '{\"s\": 30}', retry_period => '1 second'")
    first = serve(dsn, "--crash-wait", "2", "--shutdown-timeout", "1")
    run = running_run(dsn, job)
    # The worker was forked by the fork server (pgsched/forkserver.py), and is the scheduler's child.
    assert parent_of(run["worker_pid"]) == first.pid
    assert b"pgsched.forkserver" in Path(f"/proc/{run['worker_pid']}/cmdline").read_bytes()

    first.signal(signal.SIGKILL)
    first.wait_exit(5)
    # Its worker dies with it (PR_SET_PDEATHSIG); the worker's backend, busy in pg_sleep, notices that
    # its client is gone (client_connection_check_interval) and aborts the job.
    wait_for(lambda: not pid_alive(run["worker_pid"]), 3, "the worker to die with its scheduler")
    # And so does the fork server, and everything else the scheduler started.
    wait_for(lambda: not pids_with_marker(first.tag), 3, "the scheduler's processes to die with it")
    assert wait_backend_gone(dsn, run["backend_pid"], 3) < 1.5
    assert query(dsn, "SELECT count(*) AS n FROM public.ran WHERE job_id = %s", (job,)) == [{"n": 0}]
    assert outcomes(dsn, job) == ["running"]  # until a scheduler finds it
    # The next run should be quick: the config is read when a run is claimed.
    query(dsn, "SELECT pgsched.alter_job(%s, config => '{\"s\": 0}')", (job,))

    serve(dsn, "--crash-wait", "2", "--shutdown-timeout", "1")
    crashed = wait_outcome(dsn, run["run_id"], 5)
    assert crashed["outcome"] == "crash", crashed
    wait_backend_gone(dsn, run["backend_pid"], 3)
    st = stats(dsn, job)
    assert (st["total_runs"], st["total_crashes"], st["consecutive_crashes"]) == (1, 1, 1), st
    crash_wait = 2.0
    assert st["next_start"] is not None
    gap = (st["next_start"] - crashed["finished_at"]).total_seconds()
    assert crash_wait - 0.1 <= gap <= crash_wait + 1.5, st

    def rerun() -> dict[str, Any] | None:
        rows = [r for r in history(dsn, job) if r["run_id"] != run["run_id"] and r["outcome"] == "success"]
        return rows[0] if rows else None

    again = wait_for(rerun, 8, "the job to run again after the crash wait")
    delay = (again["started_at"] - crashed["finished_at"]).total_seconds()
    assert crash_wait - 0.1 <= delay <= crash_wait + 1.5, (delay, again, crashed)
    assert outcomes(dsn, job) == ["crash", "success"]
    st = stats(dsn, job)
    assert (st["total_runs"], st["total_crashes"], st["total_successes"], st["consecutive_crashes"]) == \
        (2, 1, 1, 0), st


# -- 3. PostgreSQL restarted mid-run ---------------------------------------------------------

def test_postgres_restart_mid_run(pg_server: PgServer, jobs_db: str, serve: ServeFactory) -> None:
    if pg_server.cluster is None:
        pytest.skip("PGSCHED_TEST_DSN names an external server: the test cannot restart it")
    dsn = jobs_db
    job = add_job(dsn, "'sleeper', '1 hour', config => '{\"s\": 30}', retry_period => '1 second'")
    s = serve(dsn, *FAST)
    run = running_run(dsn, job)
    query(dsn, "SELECT pgsched.alter_job(%s, config => '{\"s\": 0}')", (job,))

    pg_server.cluster.restart()
    pg_server.cluster.wait_ready()

    crashed = wait_outcome(dsn, run["run_id"], 10)
    assert crashed["outcome"] == "crash", crashed
    wait_for(lambda: "success" in outcomes(dsn, job), 10, "a successful run after the restart")
    assert outcomes(dsn, job) == ["crash", "success"]
    st = stats(dsn, job)
    assert (st["total_runs"], st["total_crashes"], st["total_successes"], st["total_failures"]) == \
        (2, 1, 1, 0), st
    assert s.proc.poll() is None, s.log()
    assert "reconnected" in s.log()


# -- 4. the scheduler's own connection terminated -------------------------------------------

def test_scheduler_connection_terminated_mid_run(pg_server: PgServer, jobs_db: str, serve: ServeFactory) -> None:
    """The run ends while the scheduler cannot reconnect: its outcome is written once it can."""
    dsn = jobs_db
    dbname = psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]
    job = add_job(dsn, "'sleeper', '1 hour', config => '{\"s\": 1}'")
    s = serve(dsn, *FAST)
    run = running_run(dsn, job)
    old_backend = query(dsn, "SELECT backend_pid FROM pgsched.instance WHERE instance_id = %s",
                        (s.instance_id,))[0]["backend_pid"]
    admin = pg_server.admin_dsn  # another database: the test's own is closed to new connections for a while
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(psycopg.sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS false").format(
            psycopg.sql.Identifier(str(dbname))))
        try:
            assert c.execute("SELECT pg_terminate_backend(%s)", (old_backend,)).fetchone() == (True,)
            # The run ends (the worker's connection was untouched) while the scheduler is cut off.
            s.wait_log(f"run end job={job} run={run['run_id']} outcome=success", 5)
            assert "reconnected" not in s.log()
        finally:
            c.execute(psycopg.sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS true").format(
                psycopg.sql.Identifier(str(dbname))))

    ended = wait_outcome(dsn, run["run_id"], 15)
    assert ended["outcome"] == "success", ended
    assert "reconnected" in s.log()
    assert outcomes(dsn, job) == ["success"]
    st = stats(dsn, job)
    assert (st["total_runs"], st["total_successes"], st["total_crashes"], st["total_failures"]) == \
        (1, 1, 0, 0), st
    assert st["state"] == "scheduled" and st["consecutive_crashes"] == 0, st
    new_backend = query(dsn, "SELECT backend_pid FROM pgsched.instance WHERE instance_id = %s",
                        (s.instance_id,))[0]["backend_pid"]
    assert new_backend != old_backend and backend_alive(dsn, new_backend)
    assert s.proc.poll() is None


def test_a_lock_on_the_catalog_costs_the_loop_a_statement_not_its_connection(jobs_db: str,
                                                                            serve: ServeFactory) -> None:
    """Any role may lock pgsched.job (its UPDATE right allows LOCK TABLE): the loop's statements
    then fail on its 1 s lock_timeout, an OperationalError on a connection that is still there.
    The loop used to take each for a lost connection and reconnect every second."""
    dsn = jobs_db
    job = add_job(dsn, "'tick', '1 second'")
    s = serve(dsn, *FAST)
    wait_for(lambda: len(outcomes(dsn, job)) >= 2, 15, "the job to run")
    backend = query(dsn, "SELECT backend_pid FROM pgsched.instance WHERE instance_id = %s",
                    (s.instance_id,))[0]["backend_pid"]
    with psycopg.connect(dsn) as locker:
        locker.execute("LOCK TABLE pgsched.job IN ACCESS EXCLUSIVE MODE")
        s.wait_log("database error in the scheduler loop (continuing): canceling statement due to lock timeout", 10)
        time.sleep(1.5)
        locker.rollback()
    ran = len(outcomes(dsn, job))
    wait_for(lambda: len(outcomes(dsn, job)) >= ran + 2, 15, "the job to run again after the lock")
    assert "lost the database connection" not in s.log() and "reconnected" not in s.log(), s.log()[-2000:]
    assert query(dsn, "SELECT backend_pid FROM pgsched.instance WHERE instance_id = %s",
                 (s.instance_id,))[0]["backend_pid"] == backend
    assert s.proc.poll() is None


def test_an_instance_purged_while_cut_off_registers_again_and_runs_on(pg_server: PgServer, jobs_db: str,
                                                                     serve: ServeFactory) -> None:
    """The scheduler's connection is cut, and while it cannot reconnect its instance row is purged
    (as purge_history removes an instance silent for longer than the history's retention): on
    reconnecting it registers again, under a new id, and goes on running jobs."""
    dsn = jobs_db
    dbname = psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]
    first = add_job(dsn, "'tick', '1 hour'")
    s = serve(dsn, *FAST)
    wait_for(lambda: outcomes(dsn, first) == ["success"] or None, 10, "a first run")
    old_backend = query(dsn, "SELECT backend_pid FROM pgsched.instance WHERE instance_id = %s",
                        (s.instance_id,))[0]["backend_pid"]
    with psycopg.connect(dsn, autocommit=True) as inside, psycopg.connect(pg_server.admin_dsn, autocommit=True) as c:
        c.execute(psycopg.sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS false").format(
            psycopg.sql.Identifier(str(dbname))))
        try:
            assert c.execute("SELECT pg_terminate_backend(%s)", (old_backend,)).fetchone() == (True,)
            s.wait_log("lost the database connection", 5)
            got = inside.execute("SELECT instances FROM pgsched.purge_history(now => now() + interval '400 days', "
                                 "with_partitions => false)").fetchone()
            assert got == (1,)
        finally:
            c.execute(psycopg.sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS true").format(
                psycopg.sql.Identifier(str(dbname))))
    s.wait_log("was removed while this process was cut off from the database: registered again", 15)
    [row] = query(dsn, "SELECT instance_id, stopped_at FROM pgsched.instance WHERE pid = %s", (s.pid,))
    assert row["instance_id"] != s.instance_id and row["stopped_at"] is None
    second = add_job(dsn, "'tick', '1 hour'")
    wait_for(lambda: outcomes(dsn, second) == ["success"] or None, 10, "a run after registering again")
    assert s.proc.poll() is None, s.log()


# -- 5. SIGTERM ------------------------------------------------------------------------------

def test_sigterm_waits_for_the_run(jobs_db: str, serve: ServeFactory) -> None:
    dsn = jobs_db
    job = add_job(dsn, "'sleeper', '1 hour', config => '{\"s\": 2}'")
    s = serve(dsn, "--shutdown-timeout", "10")
    run = running_run(dsn, job)
    s.signal(signal.SIGTERM)
    assert s.wait_exit(8) == 0
    assert outcomes(dsn, job) == ["success"]
    ended = history(dsn, job)[0]
    assert ended["run_id"] == run["run_id"]
    assert ended["duration"].total_seconds() >= 2
    st = stats(dsn, job)
    assert (st["total_runs"], st["total_successes"], st["total_crashes"]) == (1, 1, 0), st
    inst = query(dsn, "SELECT stopped_at FROM pgsched.instance WHERE instance_id = %s", (s.instance_id,))
    assert inst[0]["stopped_at"] is not None


def test_sigterm_cancels_a_run_past_the_shutdown_timeout(jobs_db: str, serve: ServeFactory) -> None:
    dsn = jobs_db
    job = add_job(dsn, "'sleeper', '1 hour', config => '{\"s\": 60}'")
    s = serve(dsn, "--shutdown-timeout", "1")
    run = running_run(dsn, job)
    t0 = time.monotonic()
    s.signal(signal.SIGTERM)
    assert s.wait_exit(6) == 0
    assert time.monotonic() - t0 < 5
    assert outcomes(dsn, job) == ["cancelled"]
    assert not backend_alive(dsn, run["backend_pid"])
    st = stats(dsn, job)
    assert (st["total_runs"], st["total_crashes"], st["consecutive_crashes"], st["total_failures"]) == \
        (1, 0, 0, 0), st
    assert st["state"] == "scheduled"
    inst = query(dsn, "SELECT stopped_at FROM pgsched.instance WHERE instance_id = %s", (s.instance_id,))
    assert inst[0]["stopped_at"] is not None


# -- 6. catalog changes take effect within 100 ms ------------------------------------------------

def _start_latency(api: Conn, dsn: str, statement: str, params: tuple[Any, ...]) -> float:
    """Seconds from the commit of `statement` (autocommit; its first column is a job id) to the
    started_at of the next run of that job."""
    last = query(dsn, "SELECT coalesce(max(run_id), 0) AS r FROM pgsched.job_run")[0]["r"]
    row = api.execute(statement, params).fetchone()
    committed = api.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None and committed is not None
    job_id = int(row[0])

    def started() -> datetime | None:
        rows = query(dsn, "SELECT started_at FROM pgsched.job_run WHERE job_id = %s AND run_id > %s "
                     "AND started_at IS NOT NULL", (job_id, last))
        return rows[0]["started_at"] if rows else None

    t = wait_for(started, 3, f"job {job_id} to start")
    return float((t - committed[0]).total_seconds())


def _successes(dsn: str, job_id: int) -> int:
    return len([h for h in history(dsn, job_id) if h["outcome"] == "success"])


def test_catalog_changes_take_effect_within_100ms(api: Conn, jobs_db: str, serve: ServeFactory) -> None:
    dsn = jobs_db
    idle = add_job(dsn, "'tick', '1 hour', initial_start => now() + interval '1 minute'")
    serve(dsn, "--max-workers", "2", *FAST).wait_log("ready:", 10)  # its workers are connected
    time.sleep(0.3)  # let it settle into its idle wait

    added = [_start_latency(api, dsn, "SELECT pgsched.add_job('tick', '1 hour')", ()) for _ in range(5)]
    assert max(added) < 0.1, added

    altered = []
    for i in range(5):
        altered.append(_start_latency(api, dsn, "SELECT job_id FROM pgsched.alter_job(%s, next_start => now())",
                                      (idle,)))
        wait_for(lambda n=i + 1: _successes(dsn, idle) == n, 3, "the run to end")  # type: ignore[misc]
    assert max(altered) < 0.1, altered
    assert outcomes(dsn, idle) == ["success"] * 5

    # Paused jobs do not run, whether created paused or paused by alter_job, even when due.
    paused = add_job(dsn, "'tick', '1 hour', scheduled => false")
    query(dsn, "SELECT pgsched.alter_job(%s, scheduled => false)", (idle,))
    query(dsn, "SELECT pgsched.alter_job(%s, next_start => now())", (idle,))
    query(dsn, "SELECT pgsched.alter_job(%s, next_start => now())", (paused,))
    time.sleep(0.5)
    assert history(dsn, paused) == []
    assert len(history(dsn, idle)) == 5
    assert stats(dsn, paused)["state"] == stats(dsn, idle)["state"] == "disabled"
    # ... and resuming one that is due starts it at once.
    resumed = _start_latency(api, dsn, "SELECT job_id FROM pgsched.alter_job(%s, scheduled => true)", (paused,))
    assert resumed < 0.1, resumed
    assert history(dsn, idle)[-1]["outcome"] == "success" and len(history(dsn, idle)) == 5


# -- 7. overlap ---------------------------------------------------------------------------------

def test_overlapping_slots_are_skipped(jobs_db: str, serve: ServeFactory) -> None:
    dsn = jobs_db
    job = add_job(dsn, "'sleeper', '1 second', config => '{\"s\": 2.5}'")
    serve(dsn, "--max-workers", "4", *FAST)
    running_run(dsn, job)  # from the first run on (however long the instance took to start)
    deadline = time.monotonic() + 6.5
    most = 0
    while time.monotonic() < deadline:
        n = query(dsn, "SELECT count(*) AS n FROM pgsched.job_run WHERE job_id = %s AND outcome = 'running'",
                  (job,))[0]["n"]
        most = max(most, n)
        time.sleep(0.02)
    assert most == 1
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as c, c.transaction():
        c.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        st = c.execute("SELECT * FROM pgsched.job_stats WHERE job_id = %s", (job,)).fetchone()
        hist = c.execute("SELECT * FROM pgsched.job_history WHERE job_id = %s ORDER BY run_id", (job,)).fetchall()
    assert st is not None
    done = [h for h in hist if h["outcome"] == "success"]
    skipped = [h for h in hist if h["outcome"] == "skipped"]
    assert len(done) >= 2, hist
    # A fixed 1 s schedule whose runs last 2.5 s (plus start lag): every whole second from a run's
    # plan_time to its finish is a slot that came due while it ran.
    overlapped = sum(int((h["finished_at"] - h["plan_time"]).total_seconds()) for h in done)
    assert overlapped >= 2 * len(done)
    assert st["total_skipped"] == overlapped, (st, hist)
    assert len(skipped) == len(done), hist
    in_flight = 1 if hist[-1]["outcome"] == "running" else 0
    assert st["total_runs"] == len(done) + in_flight, (st, hist)
    # A run in progress counts as a crash until it ends (mark_start raises the counter first).
    assert (st["total_crashes"], st["total_failures"]) == (in_flight, 0), st


# -- 8. max_runtime ------------------------------------------------------------------------------

@pytest.mark.parametrize("proc", ["sleeper", "stubborn"])
def test_timeout_kills_the_backend(jobs_db: str, serve: ServeFactory, proc: str) -> None:
    """`sleeper` stops at the cancel; `stubborn` ignores it and must be terminated after the grace."""
    dsn = jobs_db
    job = add_job(dsn, f"'{proc}', '1 hour', config => '{{\"s\": 30}}', max_runtime => '1 second', "
                  "retry_period => '1 hour'")
    serve(dsn, *FAST)
    run = running_run(dsn, job)
    ended = wait_outcome(dsn, run["run_id"], 6)
    deadline = run["started_at"].timestamp() + 1
    assert ended["outcome"] == "timeout", ended
    wait_for(lambda: not backend_alive(dsn, run["backend_pid"]), 5, "the backend to be gone")
    gone_after = db_now(dsn).timestamp() - deadline
    assert gone_after < 4, gone_after
    st = stats(dsn, job)
    assert (st["total_runs"], st["total_failures"], st["consecutive_failures"], st["total_crashes"],
            st["total_successes"]) == (1, 1, 1, 0, 0), st
    assert st["state"] == "scheduled"
    assert outcomes(dsn, job) == ["timeout"]


# -- 9. JSON logs ---------------------------------------------------------------------------------

def test_json_logs_one_start_and_end_per_run(jobs_db: str, serve: ServeFactory) -> None:
    dsn = jobs_db
    job = add_job(dsn, "'tick', '1 second'")
    other = add_job(dsn, "'sleeper', '1 hour', config => '{\"s\": 0.2}'")
    s = serve(dsn, "--log-format", "json", *FAST)
    wait_for(lambda: stats(dsn, job)["total_successes"] >= 3, 6, "three runs")
    s.signal(signal.SIGTERM)
    assert s.wait_exit(5) == 0
    records = [json.loads(line) for line in s.log_lines()]
    assert all({"ts", "level", "msg"} <= r.keys() for r in records)
    # A run's start and end records carry its fields as keys of their own (python-json-logger).
    starts = Counter(r["run_id"] for r in records if r["msg"].startswith("run start"))
    ends = Counter(r["run_id"] for r in records if r["msg"].startswith("run end"))
    fields = {"job_id", "job_name", "run_id", "outcome", "duration_s", "lag_s", "sqlstate", "instance_id"}
    assert all(fields <= r.keys() for r in records if r["msg"].startswith(("run start", "run end")))
    instance = query(dsn, "SELECT instance_id FROM pgsched.instance")[0]["instance_id"]
    for r in records:
        if r["msg"].startswith("run end"):
            h = next(h for h in history(dsn, r["job_id"]) if h["run_id"] == r["run_id"])
            assert (r["outcome"], r["sqlstate"], r["instance_id"]) == (h["outcome"], h["sqlstate"], instance)
            assert r["job_name"] == query(dsn, "SELECT job_name FROM pgsched.jobs WHERE job_id = %s",
                                          (r["job_id"],))[0]["job_name"]
            assert r["duration_s"] >= 0 and r["lag_s"] >= 0
            if r["job_id"] == other:
                assert r["duration_s"] >= 0.2
    runs = {h["run_id"] for j in (job, other) for h in history(dsn, j) if h["outcome"] not in ("skipped", "missed")}
    assert len(runs) >= 4
    assert starts == Counter(runs), (starts, runs)
    assert ends == Counter(runs), (ends, runs)


# -- 10. standby, then promoted ------------------------------------------------------------------------

@pytest.fixture
def standby(pg_server: PgServer) -> Iterator[Cluster]:
    """A streaming standby of the session cluster (pg_basebackup -R), stopped and removed afterwards."""
    primary = pg_server.cluster
    if primary is None:
        pytest.skip("PGSCHED_TEST_DSN names an external server: no standby can be made of it here")
    tmp = Path(tempfile.mkdtemp(prefix="pgsched-standby-"))
    os.chmod(tmp, 0o755)
    cluster = Cluster(datadir=tmp / "data", port=free_port(), run_as=primary.run_as, bindir=primary.bindir)
    try:
        cluster._chown(tmp)
        proc = subprocess.run(
            [str(primary.bindir / "pg_basebackup"), "-D", str(cluster.datadir), "-h", str(primary.socket_dir),
             "-p", str(primary.port), "-U", "postgres", "-R", "-X", "stream", "-c", "fast", "--no-sync"],
            capture_output=True, text=True, user=primary.run_as, check=False, cwd="/", timeout=60)
        if proc.returncode != 0:
            pytest.fail(f"pg_basebackup failed: {proc.stderr}")
        # The copy carries the primary's port and socket settings; the last line wins.
        with open(cluster.datadir / "postgresql.conf", "a") as f:
            f.write(f"\nport = {cluster.port}\nunix_socket_directories = '{cluster.datadir}'\n")
        cluster.start()
        cluster.wait_ready()
        yield cluster
    finally:
        cluster.stop("immediate")
        shutil.rmtree(tmp, ignore_errors=True)


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return int(r.status), r.read().decode()
    except urllib.error.HTTPError as e:
        return int(e.code), e.read().decode()


def cpu_seconds_over(pid: int, seconds: float) -> float:
    """The CPU time (user and system) process `pid` uses in the next `seconds`."""
    def used() -> float:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    before = used()
    time.sleep(seconds)
    return used() - before


def test_a_scheduler_that_cannot_reach_its_database_waits_between_attempts(serve: ServeFactory) -> None:
    """Nothing listens on the DSN's port: the scheduler retries with backoff, sleeping between."""
    s = serve(f"host=127.0.0.1 port={free_port()} dbname=app user=nobody connect_timeout=1", "--max-workers", "2",
              wait_instance=False)
    s.wait_log("cannot connect", 10)
    assert cpu_seconds_over(s.proc.pid, 2.0) < 0.4
    assert s.proc.poll() is None, s.log()


def test_standby_stays_idle_until_promoted(jobs_db: str, standby: Cluster, serve: ServeFactory,
                                           tmp_path: Path) -> None:
    dsn = jobs_db
    job = add_job(dsn, "'tick', '1 hour'")
    dbname = psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]
    assert isinstance(dbname, str)
    replica = standby.dsn(dbname)
    # (A count of 0 is not None: `or None` keeps waiting.)
    wait_for(lambda: query(replica, "SELECT count(*) AS n FROM pgsched.job WHERE job_id = %s", (job,))[0]["n"]
             or None, 10, "the job to replicate")
    assert query(replica, "SELECT pg_is_in_recovery() AS r")[0]["r"]

    # /readyz says "not ready" on a standby and "ready" once promoted (with pgsched[http]).
    http = importlib.util.find_spec("prometheus_client") is not None
    port = free_port()
    # Under systemd (Type=notify) the start is over once the standby is known: READY=1 then, or
    # systemd kills a start that never ends (TimeoutStartSec) and starts it again, and again.
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify.sock"))
    notify.settimeout(10)
    s = serve(replica, "--max-workers", "2", *FAST, *(["--http", f"127.0.0.1:{port}"] if http else []),
              wait_instance=False, env={"NOTIFY_SOCKET": str(tmp_path / "notify.sock")})
    s.wait_log("standby", 5)
    assert notify.recv(1024).decode() == ("READY=1\nSTATUS=the server is a standby (read-only): idle until it "
                                          "is promoted")
    # Idle means idle: the loop sleeps until its next look at the standby (it used to spin at
    # 100 % CPU on a heartbeat that cannot happen there).
    assert cpu_seconds_over(s.proc.pid, 1.5) < 0.3
    assert s.proc.poll() is None, s.log()
    if http:
        assert get(port, "/readyz") == (503, "the server is a standby (read-only)\n")
        assert get(port, "/healthz")[0] == 200
    assert history(replica, job) == []
    assert stats(replica, job)["total_runs"] == 0

    proc = subprocess.run([str(standby.bindir / "pg_ctl"), "-D", str(standby.datadir), "-w", "promote"],
                          capture_output=True, text=True, user=standby.run_as, check=False, cwd="/")
    assert proc.returncode == 0, proc.stderr
    promoted = db_now(replica)
    s.wait_instance(timeout=10)

    def ran() -> bool:
        assert s.proc.poll() is None, f"pgsched serve exited with {s.proc.returncode}:\n{s.log()}"
        return outcomes(replica, job) == ["success"]

    wait_for(ran, 10, "the due job to run after promotion")
    # Promotion is noticed by polling pg_is_in_recovery() every 5 s (standby_poll).
    assert (history(replica, job)[0]["started_at"] - promoted).total_seconds() < 7
    assert "promoted" in s.log()
    if http:
        assert get(port, "/readyz") == (200, "ready\n")
    # The primary never saw a run: the standby's scheduler wrote only to the promoted server.
    assert history(dsn, job) == []
    # Once promoted and its workers connected, the status says so (READY=1 is sent once).
    assert notify.recv(1024).decode().startswith("STATUS=2 workers connected")
    notify.close()


def test_a_start_that_fails_after_promotion_is_tried_again(jobs_db: str, standby: Cluster,
                                                           serve: ServeFactory) -> None:
    """The start after a promotion fails on an SQL error that is not the connection's (here a
    trigger that refuses the instance's registration): the scheduler drops its connection and
    starts again, as when connecting, until the start succeeds; it neither exits nor goes on half
    started (no instance registered, no job run)."""
    dsn = jobs_db
    job = add_job(dsn, "'tick', '1 hour'")
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("CREATE FUNCTION public.refuse_instance() RETURNS trigger LANGUAGE plpgsql AS "
                  "$$BEGIN RAISE EXCEPTION 'no instance may register (the test)'; END$$")
        c.execute("CREATE TRIGGER refuse_instance BEFORE INSERT ON pgsched.instance "
                  "FOR EACH ROW EXECUTE FUNCTION public.refuse_instance()")
    dbname = psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]
    assert isinstance(dbname, str)
    replica = standby.dsn(dbname)
    # (A count of 0 is not None: without `or None` this returned at once, and on PostgreSQL 18 the
    # instance often registered before the trigger had replicated.)
    wait_for(lambda: query(replica, "SELECT count(*) AS n FROM pg_trigger WHERE tgname = 'refuse_instance'"
                           )[0]["n"] or None, 10, "the trigger to replicate")
    s = serve(replica, "--max-workers", "2", *FAST, wait_instance=False)
    s.wait_log("standby", 5)
    proc = subprocess.run([str(standby.bindir / "pg_ctl"), "-D", str(standby.datadir), "-w", "promote"],
                          capture_output=True, text=True, user=standby.run_as, check=False, cwd="/")
    assert proc.returncode == 0, proc.stderr
    s.wait_log("no instance may register (the test)", 10)
    s.wait_log("was promoted", 1)
    assert s.proc.poll() is None, s.log()
    assert query(replica, "SELECT count(*) AS n FROM pgsched.instance")[0]["n"] == 0
    with psycopg.connect(replica, autocommit=True) as c:
        c.execute("DROP TRIGGER refuse_instance ON pgsched.instance")
    s.wait_instance(timeout=15)
    wait_for(lambda: outcomes(replica, job) == ["success"] or None, 10, "the due job to run once started")
    assert s.proc.poll() is None, s.log()


# -- SIGHUP reloads the settings file; SIGUSR1 logs the counters -------------------------------------

def test_sighup_reloads_settings_and_sigusr1_logs_stats(jobs_db: str, serve: ServeFactory, tmp_path: Path) -> None:
    dsn = jobs_db
    conf = tmp_path / "pgsched.toml"
    conf.write_text("max_workers = 2\nheartbeat_interval = 0.2\n")
    job = add_job(dsn, "'tick', '300 milliseconds'")
    s = serve(dsn, "--config", str(conf), "--log-format", "json", *FAST)
    wait_for(lambda: stats(dsn, job)["total_successes"] >= 1, 6, "a run")
    assert query(dsn, "SELECT max_workers FROM pgsched.instance")[0]["max_workers"] == 2
    conf.write_text("max_workers = 3\nheartbeat_interval = 0.2\n")
    s.signal(signal.SIGHUP)
    wait_for(lambda: query(dsn, "SELECT max_workers FROM pgsched.instance")[0]["max_workers"] == 3 or None,
             5, "the reloaded max_workers in pgsched.instance")
    conf.write_text("max_workers = 'many'\n")
    s.signal(signal.SIGHUP)
    wait_for(lambda: any("settings not reloaded" in line for line in s.log_lines()) or None, 5, "a refusal")
    s.signal(signal.SIGUSR1)
    line = wait_for(lambda: next((x for x in s.log_lines() if '"stats: ' in x), None), 5, "a stats line")
    counters = dict(p.split("=") for p in json.loads(line)["msg"].split(": ", 1)[1].split())
    assert int(counters["runs_ended"]) >= 1 and int(counters["scheduler_transactions"]) > 0
    wait_for(lambda: stats(dsn, job)["total_successes"] >= 3, 6, "runs after the bad reload")
    s.signal(signal.SIGTERM)
    assert s.wait_exit(5) == 0


def test_sighup_with_fewer_workers_retires_the_extra_ones_without_a_crash(jobs_db: str, serve: ServeFactory,
                                                                        tmp_path: Path) -> None:
    """max_workers lowered by SIGHUP: the workers beyond it retire (an idle one at once, a busy one
    after its run), their sessions end, and the jobs go on with what is left, nothing recorded as
    a crash."""
    dsn = jobs_db
    conf = tmp_path / "pgsched.toml"
    conf.write_text("max_workers = 3\nheartbeat_interval = 0.2\n")
    jobs = [add_job(dsn, "'tick', '200 milliseconds'") for _ in range(3)]
    s = serve(dsn, "--config", str(conf), *FAST)

    def workers() -> int:
        return int(query(dsn, "SELECT count(*) AS n FROM pg_stat_activity WHERE datname = current_database() "
                              "AND (application_name = 'pgsched worker idle' OR application_name LIKE 'pgsched job %%')"
                         )[0]["n"])

    wait_for(lambda: workers() == 3 or None, 10, "three workers")
    conf.write_text("max_workers = 1\nheartbeat_interval = 0.2\n")
    s.signal(signal.SIGHUP)
    wait_for(lambda: workers() == 1 or None, 10, "the workers beyond max_workers to retire")
    before = sum(stats(dsn, j)["total_successes"] for j in jobs)
    wait_for(lambda: sum(stats(dsn, j)["total_successes"] for j in jobs) >= before + 6 or None, 10,
             "the jobs to go on with one worker")
    assert workers() == 1
    assert query(dsn, "SELECT max_workers FROM pgsched.instance WHERE pid = %s", (s.pid,))[0]["max_workers"] == 1
    # (job_stats' total_crashes counts a run in progress until it ends: the history says how runs ended)
    assert query(dsn, "SELECT count(*) AS n FROM pgsched.job_history WHERE outcome = 'crash'")[0]["n"] == 0, s.log()
    assert s.proc.poll() is None, s.log()


def test_a_close_the_database_refuses_is_written_once_it_accepts_it(jobs_db: str, serve: ServeFactory) -> None:
    """A run's close fails on an SQL error that is not the connection's (a trigger refuses it): the
    scheduler keeps the run's end, reports the error and goes on; once the database takes the
    close, the run is recorded once, as it ended (a success, not a crash), and the job runs on."""
    dsn = jobs_db
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("CREATE TABLE public.refuse_close (x int)")
        c.execute("INSERT INTO public.refuse_close VALUES (1)")
        c.execute("CREATE FUNCTION public.refuse_close() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN "
                  "IF EXISTS (SELECT 1 FROM public.refuse_close) THEN "
                  "RAISE EXCEPTION 'no run may close (the test)'; END IF; RETURN NEW; END$$")
        c.execute("CREATE TRIGGER refuse_close BEFORE UPDATE ON pgsched.job_run FOR EACH ROW "
                  "WHEN (OLD.outcome = 'running' AND NEW.outcome <> 'running') "
                  "EXECUTE FUNCTION public.refuse_close()")
    job = add_job(dsn, "'tick', '1 hour'")
    s = serve(dsn, "--max-workers", "2", *FAST)
    wait_for(lambda: s.log().count("no run may close (the test)") >= 2 or None, 10, "the close refused twice")
    assert outcomes(dsn, job) == ["running"]
    assert s.proc.poll() is None, s.log()
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("DELETE FROM public.refuse_close")
    wait_for(lambda: outcomes(dsn, job) == ["success"] or None, 10, "the close once the database takes it")
    st = stats(dsn, job)
    assert (st["total_runs"], st["total_successes"], st["total_failures"], st["total_crashes"]) == (1, 1, 0, 0)
    assert st["next_start"] > history(dsn, job)[0]["started_at"]
    assert s.proc.poll() is None, s.log()


# -- several instances on one database ----------------------------------------------------------------

def test_two_instances_never_run_a_plan_twice_and_share_the_load(jobs_db: str, serve: ServeFactory) -> None:
    """Every planned run executes once, checked by a side effect, not only by the unique key."""
    dsn = jobs_db
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE effects (job_id int, plan_time timestamptz, instance text)")
        conn.execute("""CREATE PROCEDURE public.effect(job_id int, config jsonb) LANGUAGE sql AS $$
                        INSERT INTO effects SELECT job_id, r.plan_time, r.instance_id::text
                          FROM pgsched.job_run r
                         WHERE r.job_id = effect.job_id AND r.outcome = 'running' $$""")
        for _ in range(20):
            conn.execute("SELECT add_job('effect', '300 milliseconds')")
    a = serve(dsn, "--max-workers", "2", *FAST)
    b = serve(dsn, "--max-workers", "2", *FAST)
    wait_for(lambda: len(query(dsn, "SELECT 1 FROM effects")) >= 300 or None, 40, "300 runs")
    live = query(dsn, "SELECT instance_id, alive, max_workers FROM pgsched.instances ORDER BY instance_id")
    assert [(r["instance_id"], r["alive"], r["max_workers"]) for r in live] == [
        (a.instance_id, True, 2), (b.instance_id, True, 2)]
    for s in (a, b):
        s.signal(signal.SIGTERM)
    for s in (a, b):
        assert s.wait_exit(10) == 0
    dupes = query(dsn, "SELECT job_id, plan_time, count(*) AS n FROM effects GROUP BY 1, 2 HAVING count(*) > 1")
    assert dupes == []
    per_instance = {r["instance"]: r["n"] for r in query(dsn, "SELECT instance, count(*) AS n FROM effects "
                                                              "GROUP BY 1")}
    assert set(per_instance) == {str(a.instance_id), str(b.instance_id)}  # both took work
    assert query(dsn, "SELECT count(*) AS n FROM pgsched.job_run WHERE outcome IN ('crash', 'failure')") == [
        {"n": 0}]
    inst = query(dsn, "SELECT instance_id, alive, runs_in_progress, stopped_at IS NOT NULL AS stopped "
                      "FROM pgsched.instances ORDER BY instance_id")
    assert [(r["alive"], r["runs_in_progress"], r["stopped"]) for r in inst] == [(False, 0, True)] * 2
