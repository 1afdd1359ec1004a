"""Several `pgsched serve` instances on one database: what happens to their runs when one of
them dies (kill -9), is paused past its lease (SIGSTOP), or when PostgreSQL restarts under all
of them.

Real processes, a real server. Each test checks the history rows, the job_stats counters, the
side effects the jobs wrote (keyed by their plan time, so a plan run twice shows), the backends
left in pg_stat_activity and the instances' own logs.
"""

from __future__ import annotations

import signal
import socket
import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgsched import __version__
from pgsched.config import FILE_SETTINGS
from tests.acceptance.conftest import Serve, ServeFactory, query, wait_for
from tests.acceptance.test_serve import (
    FAST,
    SETUP_SQL,
    add_job,
    backend_alive,
    db_now,
    history,
    outcomes,
    running_run,
    stats,
    wait_backend_gone,
    wait_outcome,
)
from tests.conftest import PgServer

# `effect_sleep` writes a side effect naming its planned run, then sleeps config->>'s' seconds,
# all in the one transaction of its CALL: a run terminated while it sleeps leaves no effect.
EFFECT_SQL = """
CREATE TABLE public.effect (job_id integer, plan_time timestamptz, run_id bigint,
                            at timestamptz DEFAULT clock_timestamp());
CREATE PROCEDURE public.effect_sleep(job_id integer, config jsonb) LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.effect (job_id, plan_time, run_id)
    VALUES (job_id, current_setting('pgsched.plan_time')::timestamptz, current_setting('pgsched.run_id')::bigint);
    PERFORM pg_sleep((config->>'s')::float8);
END $$;
"""

# Short leases for the SIGSTOP tests (a --config file: these are not command-line options).
HEARTBEAT = 0.3
DEAD_AFTER = 2.0


@pytest.fixture
def jobs_db(db: str) -> str:
    """`db` with test_serve's job targets and `effect_sleep`."""
    with psycopg.connect(db, autocommit=True) as c:
        c.execute(SETUP_SQL)
        c.execute(EFFECT_SQL)
    return db


@pytest.fixture
def lease_conf(tmp_path: Path) -> Path:
    assert {"heartbeat_interval", "dead_after"} <= FILE_SETTINGS.keys()
    path = tmp_path / "short-lease.toml"
    path.write_text(f"heartbeat_interval = {HEARTBEAT}\ndead_after = {DEAD_AFTER}\n")
    return path


# -- helpers ------------------------------------------------------------------------------

def run_row(dsn: str, run_id: int) -> dict[str, Any]:
    rows = query(dsn, "SELECT * FROM pgsched.job_history WHERE run_id = %s", (run_id,))
    assert len(rows) == 1, rows
    return rows[0]


def holder_and_other(run: dict[str, Any], a: Serve, b: Serve) -> tuple[Serve, Serve]:
    """(the instance that holds `run`, the other one)."""
    assert run["instance_id"] in (a.instance_id, b.instance_id), (run, a.instance_id, b.instance_id)
    return (a, b) if run["instance_id"] == a.instance_id else (b, a)


def instance_pid(dsn: str, instance_id: int) -> int:
    return int(query(dsn, "SELECT pid FROM pgsched.instance WHERE instance_id = %s", (instance_id,))[0]["pid"])


def alive_by_instance(dsn: str) -> dict[int, bool]:
    return {int(r["instance_id"]): bool(r["alive"])
            for r in query(dsn, "SELECT instance_id, alive FROM pgsched.instances")}


def effects_for(dsn: str, job_id: int, plan_time: datetime) -> list[dict[str, Any]]:
    return query(dsn, "SELECT * FROM public.effect WHERE job_id = %s AND plan_time = %s", (job_id, plan_time))


def successes_since(dsn: str, job_id: int, since: datetime, instance_id: int | None = None) -> list[dict[str, Any]]:
    return [h for h in history(dsn, job_id)
            if h["outcome"] == "success" and h["started_at"] > since
            and (instance_id is None or h["instance_id"] == instance_id)]


def counters(dsn: str, job_id: int) -> tuple[int, int, int, int]:
    st = stats(dsn, job_id)
    return st["total_runs"], st["total_crashes"], st["total_successes"], st["total_failures"]


def sleep_until(t: float) -> None:
    time.sleep(max(0.0, t - time.monotonic()))


def wait_stopped(s: Serve) -> None:
    wait_for(lambda: Path(f"/proc/{s.pid}/stat").read_text().split(") ")[1][0] == "T", 2,
             f"pgsched serve pid {s.pid} to stop", interval=0.001)


def sigstop_between_statements(dsn: str, s: Serve, timeout: float = 5.0) -> None:
    """SIGSTOP `s` at a moment when none of its statements is in flight or unread.

    A pause that lands inside a statement (its reply computed before the pause, read after
    it) is another case, with its own test below
    (test_instance_paused_during_its_heartbeat_still_finds_its_lease_lost).
    """
    backend = query(dsn, "SELECT backend_pid FROM pgsched.instance WHERE instance_id = %s",
                    (s.instance_id,))[0]["backend_pid"]
    probe = ("SELECT state, state_change, now() - state_change > interval '30 milliseconds' AS quiet "
             "FROM pg_stat_activity WHERE pid = %s")
    deadline = time.monotonic() + timeout
    while True:
        before = query(dsn, probe, (backend,))
        if before and before[0]["state"] == "idle" and before[0]["quiet"]:
            s.signal(signal.SIGSTOP)
            wait_stopped(s)
            after = query(dsn, probe, (backend,))
            if after and after[0]["state"] == "idle" and after[0]["state_change"] == before[0]["state_change"]:
                return
            s.signal(signal.SIGCONT)
        if time.monotonic() > deadline:
            raise AssertionError(f"no quiet moment to stop instance {s.instance_id} in {timeout}s")
        time.sleep(0.005)


@pytest.fixture
def resume_stopped() -> Iterator[list[Serve]]:
    """Instances a test SIGSTOPped: SIGCONTed at teardown if the test failed first (a stopped
    process would not act on the serve fixture's SIGTERM)."""
    stopped: list[Serve] = []
    yield stopped
    for s in stopped:
        s.signal(signal.SIGCONT)


# -- 1. kill -9 of the instance holding a run, default settings ----------------------------

def test_kill_9_of_the_holder_fails_over_to_the_survivor(jobs_db: str, serve: ServeFactory) -> None:
    dsn = jobs_db
    a = serve(dsn, "--max-workers", "2")
    b = serve(dsn, "--max-workers", "2")
    assert a.instance_id is not None and b.instance_id is not None
    assert instance_pid(dsn, a.instance_id) == a.pid and instance_pid(dsn, b.instance_id) == b.pid

    long_job = add_job(dsn, "'sleeper', '1 hour', config => '{\"s\": 30}', retry_period => '1 second'")
    ticker = add_job(dsn, "'tick', '1 second'")
    run = running_run(dsn, long_job)
    # The next run should be quick: the config is read when a run is claimed.
    query(dsn, "SELECT pgsched.alter_job(%s, config => '{\"s\": 0}')", (long_job,))
    victim, survivor = holder_and_other(run, a, b)
    assert instance_pid(dsn, run["instance_id"]) == victim.pid
    assert survivor.instance_id is not None and victim.instance_id is not None

    # Kill just after a tick ended, so that no tick run is in progress on the victim.
    done = stats(dsn, ticker)["total_successes"]
    wait_for(lambda: stats(dsn, ticker)["total_successes"] > done, 3, "a tick to end")

    before_kill = db_now(dsn)
    t0 = time.monotonic()
    victim.signal(signal.SIGKILL)
    victim.wait_exit(5)

    crashed = wait_outcome(dsn, run["run_id"], 6)
    took = time.monotonic() - t0
    assert crashed["outcome"] == "crash", crashed
    assert took <= 5.0, f"the run of the killed instance was closed {took:.2f}s after the kill"
    assert (crashed["finished_at"] - before_kill).total_seconds() <= 5.0, (crashed, before_kill)
    assert crashed["instance_id"] == victim.instance_id, crashed
    assert crashed["message"].startswith(f"instance {victim.instance_id} "), crashed
    assert "lost its database session" in crashed["message"], crashed
    wait_backend_gone(dsn, run["backend_pid"], 1)
    assert f"run {run['run_id']} of job {long_job} recorded as a crash" in survivor.log()
    st = stats(dsn, long_job)
    assert (st["total_runs"], st["total_crashes"], st["consecutive_crashes"], st["total_successes"],
            st["total_failures"]) == (1, 1, 1, 0, 0), st
    # Crash backoff: retry_period (1 s) +-10 %, stored.
    assert 0.85 <= (st["next_start"] - crashed["finished_at"]).total_seconds() <= 1.15, (st, crashed)

    # The frequent job goes on on the survivor.
    wait_for(lambda: successes_since(dsn, ticker, before_kill, survivor.instance_id) or None,
             max(0.1, 5 - (time.monotonic() - t0)), "a tick on the survivor after the kill")

    # The long job runs again on the survivor once its backoff is over.
    def rerun() -> dict[str, Any] | None:
        rows = successes_since(dsn, long_job, before_kill)
        return rows[0] if rows else None

    again = wait_for(rerun, 5, "the long job to run again")
    assert again["instance_id"] == survivor.instance_id and again["run_id"] != run["run_id"], again
    delay = (again["started_at"] - crashed["finished_at"]).total_seconds()
    assert 0.85 <= delay <= 1.5, (delay, again, crashed)
    assert outcomes(dsn, long_job) == ["crash", "success"]
    assert counters(dsn, long_job) == (2, 1, 1, 0)

    alive = alive_by_instance(dsn)
    assert alive == {victim.instance_id: False, survivor.instance_id: True}, alive
    # The view and the count in one statement (one snapshot): a tick may start between two queries.
    view = query(dsn, "SELECT v.*, (SELECT count(*) FROM pgsched.job_run r WHERE r.instance_id = v.instance_id "
                      "AND r.outcome = 'running') AS running_rows "
                      "FROM pgsched.instances v WHERE v.instance_id = %s", (survivor.instance_id,))[0]
    assert (view["host"], view["pid"], view["version"]) == (socket.gethostname(), survivor.pid, __version__)
    assert view["started_at"] <= view["heartbeat_at"] and view["stopped_at"] is None
    assert view["runs_in_progress"] == view["running_rows"]
    assert survivor.proc.poll() is None
    # The ticker never crashed: only the long run was in progress on the victim.
    tick_runs = [h for h in history(dsn, ticker) if h["outcome"] != "skipped"]
    assert {h["outcome"] for h in tick_runs} <= {"success", "running"}, tick_runs
    after = [h for h in tick_runs if h["started_at"] > before_kill]
    assert after and {h["instance_id"] for h in after} == {survivor.instance_id}, after


def test_a_scheduler_starting_during_a_failover_does_not_impose_the_crash_wait(
        jobs_db: str, serve: ServeFactory) -> None:
    """crash_wait is for a restart (nobody saw the holder die), not for a failover that a scheduler
    which just started happens to find first: the killed instance's job keeps its crash backoff."""
    dsn = jobs_db
    a = serve(dsn, "--max-workers", "2")
    b = serve(dsn, "--max-workers", "2")
    job = add_job(dsn, "'sleeper', '1 hour', config => '{\"s\": 30}', retry_period => '1 second'")
    run = running_run(dsn, job)
    query(dsn, "SELECT pgsched.alter_job(%s, config => '{\"s\": 0}')", (job,))
    victim, peer = holder_and_other(run, a, b)
    victim.signal(signal.SIGKILL)
    victim.wait_exit(5)
    wait_for(lambda: not backend_alive(dsn, int(query(
        dsn, "SELECT backend_pid FROM pgsched.instance WHERE instance_id = %s", (victim.instance_id,))[0]
        ["backend_pid"])), 3, "the victim's session to end")
    newcomer = serve(dsn, "--max-workers", "2")  # its first heartbeat finds the run with no grace
    crashed = wait_outcome(dsn, run["run_id"], 6)
    assert crashed["outcome"] == "crash", crashed
    closer = newcomer if f"run {run['run_id']} of job {job} recorded as a crash" in newcomer.log() else peer
    st = stats(dsn, job)
    assert 0.85 <= (st["next_start"] - crashed["finished_at"]).total_seconds() <= 1.15, (closer.log(), st)
    again = wait_for(lambda: successes_since(dsn, job, crashed["finished_at"]) or None, 5, "the job to run again")
    assert again[0]["instance_id"] in (peer.instance_id, newcomer.instance_id)


# -- 2. a paused holder loses its lease; its run is closed, not finished ---------------------

def test_paused_instance_loses_its_lease_and_does_not_finish_the_run(
        jobs_db: str, serve: ServeFactory, lease_conf: Path, resume_stopped: list[Serve]) -> None:
    dsn = jobs_db
    a = serve(dsn, "--config", str(lease_conf), "--max-workers", "2", *FAST)
    b = serve(dsn, "--config", str(lease_conf), "--max-workers", "2", *FAST)
    job = add_job(dsn, "'effect_sleep', '1 hour', config => '{\"s\": 6}', retry_period => '1 hour'")
    run = running_run(dsn, job)
    paused, other = holder_and_other(run, a, b)

    resume_stopped.append(paused)
    sigstop_between_statements(dsn, paused)
    t0 = time.monotonic()
    try:
        crashed = wait_outcome(dsn, run["run_id"], DEAD_AFTER + 4)
        took = time.monotonic() - t0
        assert crashed["outcome"] == "crash", crashed
        # Found at the first heartbeat of the other instance after the lease is dead_after old.
        assert took <= DEAD_AFTER + 5 * HEARTBEAT, f"stale run closed {took:.2f}s after SIGSTOP"
        assert crashed["message"].startswith("stale lease"), crashed
        assert f"instance {paused.instance_id} " in crashed["message"], crashed
        assert crashed["instance_id"] == paused.instance_id and crashed["attempt"] == 1, crashed
        # Its backend was terminated although the paused scheduler's worker is still running.
        wait_backend_gone(dsn, run["backend_pid"], 1)
        assert f"run {run['run_id']} of job {job} recorded as a crash: stale lease" in other.log()
    finally:
        paused.signal(signal.SIGCONT)
        resumed = time.monotonic()

    paused.wait_log("lease lost", 3)
    sleep_until(resumed + 3)
    # The resumed holder did not write its end over the crash.
    assert run_row(dsn, run["run_id"]) == crashed
    assert outcomes(dsn, job) == ["crash"]
    assert effects_for(dsn, job, run["plan_time"]) == []
    assert query(dsn, "SELECT count(*) AS n FROM public.effect") == [{"n": 0}]
    st = stats(dsn, job)
    assert (st["total_runs"], st["total_crashes"], st["consecutive_crashes"], st["total_successes"],
            st["total_failures"], st["state"]) == (1, 1, 1, 0, 0, "scheduled"), st
    assert not backend_alive(dsn, run["backend_pid"])

    # The resumed instance is alive and healthy: with the other one stopped, it runs new work.
    assert paused.proc.poll() is None, paused.log()
    assert paused.instance_id is not None and alive_by_instance(dsn)[paused.instance_id] is True
    other.signal(signal.SIGTERM)
    assert other.wait_exit(10) == 0
    since = db_now(dsn)
    ticker = add_job(dsn, "'tick', '300 milliseconds'")
    wait_for(lambda: len(successes_since(dsn, ticker, since, paused.instance_id)) >= 2 or None, 5,
             "the resumed instance to run the new job")
    # (A 300 ms schedule on a busy 2-core machine may skip a slot: not a failure.)
    assert {h["outcome"] for h in history(dsn, ticker)} <= {"success", "running", "skipped"}
    assert outcomes(dsn, job) == ["crash"]


# -- 2b. the same pause, landing inside the holder's heartbeat statement ---------------------------

def test_instance_paused_during_its_heartbeat_still_finds_its_lease_lost(
        jobs_db: str, serve: ServeFactory, lease_conf: Path, resume_stopped: list[Serve]) -> None:
    """The pause of test 2, landing while the holder's heartbeat statement is in flight.

    The heartbeat's reply then predates the pause (it says the lease is still ours), and the
    next heartbeat is one interval after the resume; the run's end (its worker lost its
    terminated backend) is read first. The end must still be refused (fencing) and the holder
    must still say that it lost the lease, not report an end it never recorded. A row lock
    on the holder's pgsched.instance row holds its heartbeat (an UPDATE of that row) inside
    the statement while the process is stopped.
    """
    dsn = jobs_db
    a = serve(dsn, "--config", str(lease_conf), "--max-workers", "2", *FAST)
    b = serve(dsn, "--config", str(lease_conf), "--max-workers", "2", *FAST)
    job = add_job(dsn, "'effect_sleep', '1 hour', config => '{\"s\": 6}', retry_period => '1 hour'")
    run = running_run(dsn, job)
    paused, other = holder_and_other(run, a, b)

    with psycopg.connect(dsn) as locker:
        locker.execute("SELECT 1 FROM pgsched.instance WHERE instance_id = %s FOR UPDATE", (paused.instance_id,))
        backend = query(dsn, "SELECT backend_pid FROM pgsched.instance WHERE instance_id = %s",
                        (paused.instance_id,))[0]["backend_pid"]
        wait_for(lambda: query(dsn, "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock' "
                                    "AND query LIKE '%%_heartbeat%%'", (backend,)) or None,
                 2, "the holder's heartbeat to wait for the row lock")
        resume_stopped.append(paused)
        paused.signal(signal.SIGSTOP)
        wait_stopped(paused)
        locker.commit()  # the heartbeat completes on the server; its reply waits for the process
    try:
        crashed = wait_outcome(dsn, run["run_id"], DEAD_AFTER + 4)
        assert crashed["outcome"] == "crash" and crashed["message"].startswith("stale lease"), crashed
        wait_backend_gone(dsn, run["backend_pid"], 1)
        assert f"run {run['run_id']} of job {job} recorded as a crash: stale lease" in other.log()
        time.sleep(0.2)  # the paused holder's worker has read its terminated connection
    finally:
        paused.signal(signal.SIGCONT)
        resumed = time.monotonic()

    sleep_until(resumed + 2)
    assert run_row(dsn, run["run_id"]) == crashed
    assert effects_for(dsn, job, run["plan_time"]) == []
    assert counters(dsn, job) == (1, 1, 0, 0)
    assert paused.proc.poll() is None, paused.log()
    assert "lease lost" in paused.log(), paused.log()


# -- 3. the same with allow_stale_reentry: the plan is taken over --------------------------------

def test_paused_instance_run_is_taken_over_with_allow_stale_reentry(
        jobs_db: str, serve: ServeFactory, lease_conf: Path, resume_stopped: list[Serve]) -> None:
    dsn = jobs_db
    a = serve(dsn, "--config", str(lease_conf), "--max-workers", "2", *FAST)
    b = serve(dsn, "--config", str(lease_conf), "--max-workers", "2", *FAST)
    # allow_stale_reentry set in the job's creating transaction, so that its first run has it.
    with psycopg.connect(dsn) as c:
        row = c.execute("SELECT pgsched.add_job('effect_sleep', '1 hour', config => '{\"s\": 4}', "
                        "retry_period => '1 hour')").fetchone()
        assert row is not None
        job = int(row[0])
        c.execute("UPDATE pgsched.job SET allow_stale_reentry = true WHERE job_id = %s", (job,))
    run = running_run(dsn, job)
    assert run["attempt"] == 1
    paused, taker = holder_and_other(run, a, b)

    resume_stopped.append(paused)
    sigstop_between_statements(dsn, paused)
    t0 = time.monotonic()
    try:
        def taken() -> dict[str, Any] | None:
            r = run_row(dsn, run["run_id"])
            assert r["outcome"] == "running", f"the stale run was closed instead of taken over: {r}"
            return r if r["attempt"] == 2 else None

        second = wait_for(taken, DEAD_AFTER + 4, "the stale run to be taken over")
        took = time.monotonic() - t0
        assert took <= DEAD_AFTER + 5 * HEARTBEAT, f"stale run taken over {took:.2f}s after SIGSTOP"
        assert second["instance_id"] == taker.instance_id, second
        assert second["plan_time"] == run["plan_time"] and second["job_id"] == job, second
        wait_backend_gone(dsn, run["backend_pid"], 1)
        # The new attempt runs on the taker's worker (under the application_name of its new lease).
        now_running = running_run(dsn, job, timeout=2)
        assert now_running["run_id"] == run["run_id"] and now_running["attempt"] == 2, now_running
        assert now_running["backend_pid"] != run["backend_pid"]
        assert "taken over as a new attempt" in taker.log()
        # Resume the paused instance while the new attempt is still running.
        assert run_row(dsn, run["run_id"])["outcome"] == "running"
    finally:
        paused.signal(signal.SIGCONT)

    paused.wait_log("lease lost", 3)
    ended = wait_outcome(dsn, run["run_id"], 6)
    assert ended["outcome"] == "success", ended
    assert (ended["run_id"], ended["attempt"], ended["instance_id"], ended["plan_time"]) == \
        (run["run_id"], 2, taker.instance_id, run["plan_time"]), ended
    assert outcomes(dsn, job) == ["success"]
    effects = effects_for(dsn, job, run["plan_time"])
    assert len(effects) == 1 and effects[0]["run_id"] == run["run_id"], effects
    assert query(dsn, "SELECT count(*) AS n FROM public.effect") == [{"n": 1}]
    st = stats(dsn, job)
    # Two attempts started; the lost one stays counted as a crash.
    assert (st["total_runs"], st["total_crashes"], st["total_successes"], st["total_failures"],
            st["consecutive_crashes"], st["state"]) == (2, 1, 1, 0, 0, "scheduled"), st
    time.sleep(0.5)  # the resumed instance must not write anything over it afterwards either
    assert run_row(dsn, run["run_id"]) == ended
    assert paused.proc.poll() is None, paused.log()
    assert alive_by_instance(dsn) == {a.instance_id: True, b.instance_id: True}


# -- 4. PostgreSQL restarted under three instances ------------------------------------------------

def test_postgres_restart_under_three_instances(pg_server: PgServer, jobs_db: str, serve: ServeFactory) -> None:
    if pg_server.cluster is None:
        pytest.skip("PGSCHED_TEST_DSN names an external server: the test cannot restart it")
    dsn = jobs_db
    instances = [serve(dsn, "--max-workers", "3", *FAST) for _ in range(3)]
    ids = {s.instance_id for s in instances}
    assert len(ids) == 3

    quick = [add_job(dsn, "'effect_sleep', '1 second', config => '{\"s\": 0.3}'") for _ in range(7)]
    # Three runs that are certainly in progress when the server goes down.
    slow = [add_job(dsn, "'effect_sleep', '1 second', config => '{\"s\": 30}'") for _ in range(3)]
    jobs = quick + slow
    long_runs = [running_run(dsn, j)["run_id"] for j in slow]
    for j in slow:
        query(dsn, "SELECT pgsched.alter_job(%s, config => '{\"s\": 0.3}')", (j,))
    wait_for(lambda: all(stats(dsn, j)["total_successes"] >= 1 for j in quick), 5, "every quick job to run")

    in_progress = {r["run_id"] for r in query(dsn, "SELECT run_id FROM pgsched.job_run WHERE outcome = 'running'")}
    assert set(long_runs) <= in_progress
    before = db_now(dsn)
    pg_server.cluster.restart()
    pg_server.cluster.wait_ready()
    # The restart's end is the new server's start, not when this test first reads its clock: a
    # scheduler that reconnects and forks a worker at once (the fork server) may start a run
    # before this test's own reconnection.
    after = query(dsn, "SELECT pg_postmaster_start_time() AS t")[0]["t"]
    assert before < after <= db_now(dsn)
    restarted = time.monotonic()

    def all_back() -> bool:
        for s in instances:
            assert s.proc.poll() is None, s.log()
        return all(successes_since(dsn, j, after) for j in jobs) and \
            alive_by_instance(dsn) == dict.fromkeys(ids, True)

    wait_for(all_back, 12, "every job to succeed again on the reconnected instances", interval=0.2)
    sleep_until(restarted + 8)
    assert alive_by_instance(dsn) == dict.fromkeys(ids, True)
    for s in instances:
        assert "reconnected" in s.log(), s.log()
    assert query(dsn, "SELECT count(*) AS n FROM pgsched.instance") == [{"n": 3}]

    for s in instances:
        s.signal(signal.SIGTERM)
    for s in instances:
        assert s.wait_exit(10) == 0
    assert query(dsn, "SELECT run_id FROM pgsched.job_run WHERE outcome = 'running'") == []

    runs = [h for j in jobs for h in history(dsn, j) if h["started_at"] is not None]
    by_outcome = Counter(h["outcome"] for h in runs)
    assert set(by_outcome) <= {"success", "crash"}, by_outcome
    crashes = [h for h in runs if h["outcome"] == "crash"]
    # Every run still in progress when the server went down is a crash ...
    for rid in long_runs:
        assert run_row(dsn, rid)["outcome"] == "crash", run_row(dsn, rid)
    straddling = [h for h in runs if h["started_at"] < before and h["finished_at"] > after]
    assert all(h["outcome"] == "crash" for h in straddling), straddling
    # ... every other run started before the restart ended before it ...
    early = [h for h in runs if h["started_at"] < after and h["outcome"] != "crash"]
    assert all(h["finished_at"] < after for h in early), [h for h in early if h["finished_at"] >= after]
    # ... and only such runs are crashes: none started after the restart.
    late = [(h["run_id"], h["instance_id"], h["started_at"], h["message"]) for h in crashes if h["started_at"] >= after]
    assert late == [], f"runs started after the restart ended as crashes: {late}"
    assert all(h["run_id"] in in_progress or h["started_at"] > before for h in crashes), (crashes, in_progress)
    assert len(crashes) >= len(slow)

    # Side effects: no plan ran twice; every success wrote its effect once; a crash (terminated
    # mid-transaction) wrote none.
    effects = query(dsn, "SELECT job_id, plan_time, run_id FROM public.effect")
    twice = [k for k, n in Counter((e["job_id"], e["plan_time"]) for e in effects).items() if n > 1]
    assert twice == []
    effect_runs = Counter(e["run_id"] for e in effects)
    success_runs = {h["run_id"] for h in runs if h["outcome"] == "success"}
    assert set(effect_runs) == success_runs, (set(effect_runs) ^ success_runs)
    # The counters agree with the history, job by job: nothing counted twice or lost.
    for j in jobs:
        hist = [h for h in runs if h["job_id"] == j]
        n_crash = sum(h["outcome"] == "crash" for h in hist)
        n_success = sum(h["outcome"] == "success" for h in hist)
        assert counters(dsn, j) == (len(hist), n_crash, n_success, 0), (j, hist)
        assert successes_since(dsn, j, after), j


# -- 5. load sharing: joining and leaving -----------------------------------------------------

def max_concurrent(rows: list[dict[str, Any]]) -> int:
    """The most runs of `rows` (started_at, finished_at) in progress at one instant."""
    edges = sorted([(r["started_at"], 1) for r in rows] + [(r["finished_at"], -1) for r in rows],
                   key=lambda e: (e[0], e[1]))
    n = best = 0
    for _, d in edges:
        n += d
        best = max(best, n)
    return best


def test_an_instance_that_joins_or_leaves_changes_the_spread_within_seconds(
        jobs_db: str, serve: ServeFactory) -> None:
    dsn = jobs_db
    for _ in range(12):
        add_job(dsn, "'effect_sleep', '500 milliseconds', config => '{\"s\": 0.2}'")
    a = serve(dsn, "--max-workers", "2", *FAST)
    time.sleep(2)
    joined = db_now(dsn)
    b = serve(dsn, "--max-workers", "3", *FAST)
    first_b = wait_for(lambda: [h for h in query(dsn, "SELECT started_at FROM pgsched.job_history "
                                                     "WHERE instance_id = %s AND outcome = 'success'",
                                                 (b.instance_id,))] or None, 5, "a run on the instance that joined")
    assert (first_b[0]["started_at"] - joined).total_seconds() < 3.0
    time.sleep(3)
    a.signal(signal.SIGTERM)
    assert a.wait_exit(10) == 0
    left = db_now(dsn)
    time.sleep(3)
    b.signal(signal.SIGTERM)
    assert b.wait_exit(10) == 0
    rows = query(dsn, "SELECT instance_id, started_at, finished_at, outcome FROM pgsched.job_history "
                      "WHERE outcome NOT IN ('skipped', 'missed')")
    assert {r["outcome"] for r in rows} == {"success"}, Counter(r["outcome"] for r in rows)
    # Nobody ran more than its --max-workers at once; both did run work while both were up.
    by = {i: [r for r in rows if r["instance_id"] == i] for i in (a.instance_id, b.instance_id)}
    assert max_concurrent(by[a.instance_id]) <= 2 and max_concurrent(by[b.instance_id]) <= 3
    both_up = [r for r in rows if joined < r["started_at"] < left]
    assert {r["instance_id"] for r in both_up} == {a.instance_id, b.instance_id}
    # Once `a` left, everything ran on `b`, and it used more than two workers at once.
    after = [r for r in rows if r["started_at"] > left]
    assert after and {r["instance_id"] for r in after} == {b.instance_id}
    assert max_concurrent(after) == 3
    dupes = query(dsn, "SELECT job_id, plan_time FROM public.effect GROUP BY 1, 2 HAVING count(*) > 1")
    assert dupes == []


# -- 6. a sharded job over several instances ---------------------------------------------------

def test_scope_runs_spread_over_instances_and_run_once_each(jobs_db: str, serve: ServeFactory) -> None:
    dsn = jobs_db
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("CREATE TABLE tenants (id text)")
        c.execute("INSERT INTO tenants SELECT 't' || g FROM generate_series(1, 6) g")
        c.execute("""CREATE TABLE shard_effect (scope text, plan_time timestamptz, instance text)""")
        c.execute("""CREATE PROCEDURE public.per_tenant(job_id int, config jsonb) LANGUAGE plpgsql AS $$
                     BEGIN
                         INSERT INTO shard_effect SELECT config->>'scope',
                                current_setting('pgsched.plan_time')::timestamptz, r.instance_id::text
                           FROM pgsched.job_run r WHERE r.run_id = current_setting('pgsched.run_id')::bigint;
                         PERFORM pg_sleep(0.3);
                     END $$""")
    job = add_job(dsn, "'per_tenant', '2 seconds', scope_query => 'SELECT id FROM tenants'")
    a = serve(dsn, "--max-workers", "2", *FAST)
    b = serve(dsn, "--max-workers", "2", *FAST)

    def plans_done() -> int:
        rows = query(dsn, "SELECT plan_time FROM shard_effect GROUP BY 1 HAVING count(DISTINCT scope) = 6")
        return len(rows)

    wait_for(lambda: plans_done() >= 3 or None, 30, "three plans with all six scopes done")
    for s in (a, b):
        s.signal(signal.SIGTERM)
    for s in (a, b):
        assert s.wait_exit(10) == 0
    dupes = query(dsn, "SELECT scope, plan_time, count(*) AS n FROM shard_effect GROUP BY 1, 2 HAVING count(*) > 1")
    assert dupes == []
    ran_on = {r["instance"] for r in query(dsn, "SELECT DISTINCT instance FROM shard_effect")}
    assert ran_on == {str(a.instance_id), str(b.instance_id)}  # both instances took scope runs
    hist = history(dsn, job)
    # Each (scope, plan) has one history row; every scope run that ended succeeded.
    keys = Counter((h["scope"], h["plan_time"]) for h in hist)
    assert max(keys.values()) == 1
    assert {h["outcome"] for h in hist if h["scope"]} <= {"success", "queued", "cancelled"}
    assert all(h["result"] == {"scopes": 6} for h in hist if not h["scope"] and h["outcome"] == "success")


def test_a_scope_run_of_a_killed_instance_is_retried_by_the_survivor(jobs_db: str, serve: ServeFactory) -> None:
    """kill -9 of the instance running one scope of a sharded job: the survivor closes the scope run
    as a crash and queues its retry (attempt 2) after the job's backoff, not crash_wait (a failover,
    not a restart), and runs it; the scope's work is done once, the crash counted once."""
    dsn = jobs_db
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("CREATE TABLE tenants (id text)")
        c.execute("INSERT INTO tenants VALUES ('us'), ('eu')")
        c.execute("CREATE TABLE shard_effect (scope text, attempt int, instance bigint)")
        # us's first attempt hangs until killed; every other run writes its effect at once.
        c.execute("""CREATE PROCEDURE public.hang_us(job_id int, config jsonb) LANGUAGE plpgsql AS $$
                     DECLARE r pgsched.job_run;
                     BEGIN
                         SELECT * INTO r FROM pgsched.job_run WHERE run_id = current_setting('pgsched.run_id')::bigint;
                         IF r.scope = 'us' AND r.attempt = 1 THEN
                             PERFORM pg_sleep(60);
                         END IF;
                         INSERT INTO shard_effect VALUES (r.scope, r.attempt, r.instance_id);
                     END $$""")
    a = serve(dsn, "--max-workers", "2", "--shutdown-timeout", "1")
    b = serve(dsn, "--max-workers", "2", "--shutdown-timeout", "1")
    # Both past their first heartbeat: a scheduler's first one takes what it finds for a restart's.
    wait_for(lambda: all("ready:" in s.log() for s in (a, b)), 10, "both instances to be ready")
    job = add_job(dsn, "'hang_us', '1 hour', retry_period => '1 second', scope_query => 'SELECT id FROM tenants'")
    # eu's run closed, not just its effect committed (before its end mark): killed in between, it
    # would be a crash too, and retried.
    wait_for(lambda: query(dsn, "SELECT 1 FROM pgsched.job_run WHERE job_id = %s AND scope = 'eu' "
                                "AND outcome = 'success'", (job,)) or None, 15, "eu's run to end")
    def us_running() -> dict[str, Any] | None:
        rows = query(dsn, "SELECT * FROM pgsched.job_run WHERE job_id = %s AND scope = 'us' "
                          "AND outcome = 'running' AND worker_pid IS NOT NULL", (job,))
        return rows[0] if rows else None

    stuck = wait_for(us_running, 10, "us's run to start")
    victim, survivor = holder_and_other(stuck, a, b)
    victim.signal(signal.SIGKILL)
    victim.wait_exit(5)

    crashed = wait_outcome(dsn, stuck["run_id"], 8)
    assert crashed["outcome"] == "crash" and "lost its database session" in crashed["message"], crashed
    retried = wait_for(lambda: query(dsn, "SELECT * FROM shard_effect WHERE scope = 'us'") or None, 8,
                       "us's retry to run")
    assert retried == [{"scope": "us", "attempt": 2, "instance": survivor.instance_id}], retried
    # The job's work commits before its end mark: wait for the retry's end, not just its effect.
    def us_ended() -> list[dict[str, Any]] | None:
        rows = query(dsn, "SELECT attempt, trigger, outcome, plan_time, finished_at, instance_id "
                          "FROM pgsched.job_run WHERE job_id = %s AND scope = 'us' ORDER BY run_id", (job,))
        return None if any(r["outcome"] == "running" for r in rows) else rows

    us = wait_for(us_ended, 5, "us's retry to end")
    assert [(r["attempt"], r["trigger"], r["outcome"]) for r in us] == [(1, "schedule", "crash"),
                                                                        (2, "retry", "success")], us
    # The backoff on attempt 1 (retry_period, 1 s, ±10 %) from the crash's close: no crash_wait.
    assert 0.85 <= (us[1]["plan_time"] - us[0]["finished_at"]).total_seconds() <= 1.15, us
    assert us[1]["instance_id"] == survivor.instance_id
    assert "scope 'us': retry (attempt 2) asked" in survivor.log()
    assert query(dsn, "SELECT scope, count(*) AS n FROM shard_effect GROUP BY 1 ORDER BY 1") == [
        {"scope": "eu", "n": 1}, {"scope": "us", "n": 1}]
    st = stats(dsn, job)
    assert (st["state"], st["total_runs"], st["total_successes"], st["total_crashes"]) == ("scheduled", 4, 3, 1), st
