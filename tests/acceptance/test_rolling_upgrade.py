"""Upgrading instances one at a time, and what an instance does with a schema it cannot work with.

The rolling upgrade is run for real: release 0.1.0 (API 1), installed from its commit into its
own virtual environment (tests/previous_release.py), runs a job every second on three
instances; `pgsched init` of this code runs under them; then they are replaced one at a time
by this code's `serve`. The job must never stop for more than a few seconds, no plan may run
twice, no instance may log an SQL error, and every run must end with its real outcome.

The other tests fake a schema outside this code's API window (pgsched/api.py): on start, on a
reconnect and while running (functions it calls dropped under it), `serve` stops with one
message naming both versions and a non-zero exit, never a loop of SQL errors.
"""

from __future__ import annotations

import itertools
import re
import signal
import subprocess
import time
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

import pgsched
from pgsched import api, migrate
from tests import previous_release
from tests.acceptance.conftest import PGSCHED, Serve, ServeFactory, query, wait_for
from tests.acceptance.test_serve import SETUP_SQL, add_job, history, stats

# A run writes a row naming its plan (so a plan run twice shows), then takes a moment, so that
# instances are stopped with runs in progress now and then.
EFFECT_SQL = """
CREATE TABLE public.effect (plan_time timestamptz, run_id bigint, at timestamptz DEFAULT clock_timestamp());
CREATE PROCEDURE public.effect(job_id integer, config jsonb) LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.effect (plan_time, run_id)
    VALUES (current_setting('pgsched.plan_time')::timestamptz, current_setting('pgsched.run_id')::bigint);
    PERFORM pg_sleep((config->>'s')::float8);
END $$;
"""

# The job may stop for at most this long between two runs (it runs every second).
MAX_GAP = 3.0

# A line an instance logs when SQL failed, in either release's words.
SQL_ERROR = re.compile(r" (ERROR|CRITICAL) |database error|Traceback|psycopg\.errors", re.IGNORECASE)
# During the rolling upgrade not even a warning is expected (a lost connection, a job behind),
# but for the reconnect the test forces on 0.1.0's instances after init (in 0.1.0's words; which
# of the two depends on whether the instance was reading when its backend was terminated).
FORCED_RECONNECT = ("lost the database connection: consuming input failed: server closed the connection unexpectedly",
                    "lost the database connection: terminating connection due to administrator command")
# The same ended connection, seen by psycopg when it drops 0.1.0's pipeline (its pipelined claim)
# that was open at that moment: a warning of psycopg's own, as often as not.
FORCED_PIPELINE = "WARNING psycopg: error ignored terminating <psycopg.Pipeline [BAD]"
# An init that applies migrations holds job and job_stat until its commit (README "Upgrading"): a
# statement of 0.1.0 that waited longer than its 1 s lock_timeout is cancelled, and 0.1.0 takes
# that for a lost connection and reconnects (CI of 2026-11-29, init 1.8 s). Allowed only when init
# took that long.
LOCK_WAIT = "lost the database connection: canceling statement due to lock timeout"
# What a statement of 0.1.0 that waited on init's locks finds after init committed: job_run become
# the partitioned table, whose parent has no job_run_plan_key (migration 0015; the key is
# job_run_live's), or, inside the body of one of its functions as it began, a function that body
# called replaced by another. (The functions 0.1.0 calls itself keep their oids through init:
# tests/integration/test_api_compat.py.)
RACED_INIT = re.compile(r"database error in the scheduler loop \(continuing\): (cache lookup failed for function"
                        r"|constraint \"job_run_plan_key\" for table \"job_run\" does not exist)")
BEHIND = re.compile(r" WARNING pgsched\.scheduler: job \d+ is behind \(catch_up = latest\): \d+ plan\(s\) ")
HELD_RUN = re.compile(r"skipped: run (\d+) was still in progress")
NOT_QUIET = re.compile(r" (WARNING|ERROR|CRITICAL) |database error|Traceback|psycopg\.errors", re.IGNORECASE)


def execute(dsn: str, statement: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(statement)


def fake_api(dsn: str, api_version: int, oldest: int, release: str, drop: tuple[str, ...] = ()) -> None:
    """What `init` of another release would leave: its _api(), and without the functions in `drop`."""
    with psycopg.connect(dsn, autocommit=True) as c, c.transaction():
        c.execute(sql.SQL("CREATE OR REPLACE FUNCTION pgsched._api(OUT api_version integer, "
                          "OUT oldest_api_served integer, OUT release text) "
                          "LANGUAGE sql AS $$ SELECT {}, {}, {} $$").format(
            sql.Literal(api_version), sql.Literal(oldest), sql.Literal(release)))
        if drop:
            c.execute("SELECT pgsched._drop_functions(%s)", (list(drop),))


def stops_with_one_message(s: Serve, *needles: str, timeout: float = 15.0) -> str:
    """`s` exits non-zero with one line naming the versions (needles), and no SQL error before it."""
    code = s.wait_exit(timeout)
    lines = s.log_lines()
    naming = [line for line in lines if all(n in line for n in needles)]
    assert code != 0, lines
    assert len(naming) == 1, lines
    assert naming[0].startswith("Error: "), lines
    assert not [line for line in lines if line != naming[0] and SQL_ERROR.search(line)], lines
    return naming[0]


# -- a schema outside the window ----------------------------------------------------------------

NEWER = api.API_VERSION + 1


def test_serve_refuses_a_schema_that_no_longer_serves_its_api(db: str, serve: ServeFactory) -> None:
    fake_api(db, NEWER, NEWER, "9.1.0")
    s = serve(db, wait_instance=False)
    line = stops_with_one_message(s, f"API is {NEWER} (release 9.1.0", f"pgsched {pgsched.__version__} speaks "
                                  f"API {api.API_VERSION}", timeout=10)
    assert "replace this instance with pgsched 9.1.0" in line
    assert query(db, "SELECT count(*) AS n FROM pgsched.instance")[0]["n"] == 0


def test_a_running_instance_stops_when_a_later_release_drops_its_api(db: str, serve: ServeFactory) -> None:
    """`init` of a release two APIs ahead drops what this one calls: it stops at its next call."""
    execute(db, SETUP_SQL)
    job = add_job(db, "'tick', '1 second'")
    s = serve(db)
    wait_for(lambda: stats(db, job)["total_successes"] >= 2, 10, "two runs")
    fake_api(db, NEWER + 1, NEWER, "9.2.0", drop=("_claim_v2", "_heartbeat_v2", "_next_due_v2"))
    t0 = time.monotonic()
    stops_with_one_message(s, f"API is {NEWER + 1} (release 9.2.0", f"speaks API {api.API_VERSION}")
    # Its next heartbeat (2 s) or claim (1 s) fails, and the check that follows stops it.
    assert time.monotonic() - t0 < 5


def test_a_reconnecting_instance_checks_the_api_again(db: str, serve: ServeFactory) -> None:
    s = serve(db)
    s.wait_log("ready:", 30)  # its start is over: the connection is lost in the loop, not in the start
    fake_api(db, NEWER, NEWER, "9.1.0")  # nothing it calls changed: it notices when it reconnects
    backend = query(db, "SELECT backend_pid FROM pgsched.instance WHERE instance_id = %s",
                    (s.instance_id,))[0]["backend_pid"]
    query(db, "SELECT pg_terminate_backend(%s)", (backend,))
    stops_with_one_message(s, f"API is {NEWER} (release 9.1.0", f"speaks API {api.API_VERSION}")
    assert "lost the database connection" in s.log()


def test_a_reconnect_that_meets_an_sql_error_tries_again(db: str, serve: ServeFactory) -> None:
    """A schema in the middle of a change (here: _heartbeat_v2 missing while the API still serves
    this instance) fails a reconnect's statements: the instance tries again later, it does not
    end (with the runs it holds) over it."""
    s = serve(db)
    # Its start is over (the loop logs "ready:"): a statement failing during the start ends the
    # process, as it should, and the rename below once came before the start's first heartbeat
    # (CI, PostgreSQL 18, a loaded host: 0.27 s after the instance was registered).
    s.wait_log("ready:", 30)
    heartbeat = query(db, "SELECT 'pgsched._heartbeat_v2'::regproc::regprocedure::text AS f")[0]["f"]
    execute(db, f"ALTER FUNCTION {heartbeat} RENAME TO _heartbeat_away")
    backend = query(db, "SELECT backend_pid FROM pgsched.instance WHERE instance_id = %s",
                    (s.instance_id,))[0]["backend_pid"]
    query(db, "SELECT pg_terminate_backend(%s)", (backend,))
    s.wait_log("function pgsched._heartbeat_v2(", 10)
    execute(db, f"ALTER FUNCTION {heartbeat.replace('_heartbeat_v2', '_heartbeat_away', 1)} RENAME TO _heartbeat_v2")
    s.wait_log("reconnected to the database", 15)
    assert s.proc.poll() is None and "Traceback" not in s.log()


def test_serve_on_a_schema_of_release_0_1_0_says_to_run_init(empty_db: str, serve: ServeFactory) -> None:
    previous_release.init(empty_db)
    s = serve(empty_db, wait_instance=False)
    line = stops_with_one_message(s, "API is 1 (release 0.1.0", f"pgsched {pgsched.__version__} speaks API 2",
                                  timeout=10)
    assert f"run `pgsched init` of pgsched {pgsched.__version__}" in line


# -- the rolling upgrade ----------------------------------------------------------------------------

def pgsched_init(executable: Path, dsn: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run([str(executable), "init", "--dsn", dsn], env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def successes(dsn: str, job: int) -> list[datetime]:
    return [h["started_at"] for h in history(dsn, job) if h["outcome"] == "success"]


def longest_gap(starts: list[datetime]) -> timedelta:
    return max((b - a for a, b in itertools.pairwise(starts)), default=timedelta(0))


def unexplained_skips(dsn: str, skipped: list[dict[str, Any]], raced_pids: list[int],
                      init_window: tuple[datetime, datetime]) -> list[dict[str, Any]]:
    """The skipped plans that the upgrade's own disturbances do not explain.

    0.1.0's instance that lost the race (its pid in `raced_pids`) claims nothing for 1 s after the
    database error; when every instance lost it, a plan that came due meanwhile started late, by
    up to 1 s, within 2 s of init's commit, and on a 1-second schedule the next slot came due while
    it ran (0.3 s), and was skipped as "still in progress". Such a run started over 0.5 s late
    (runs otherwise start within milliseconds): on the machine of 2026-11-27 evening, one due a
    quarter of a second into the pause started 0.75 s late and its next slot was skipped.
    An upgrade from 0.1.0 also applies migrations, so init holds `job` and `job_stat` from its
    first file to its commit (README "Upgrading"), and the test then ends the old instances'
    sessions to make them reconnect: a plan that came due in that window (from init's start to 2 s
    after its commit) may start over 0.5 s late on any instance, on a loaded machine (CI of
    2026-11-29: init took 1.9 s, and a skip named such a run of an instance that raced nothing).
    Any other skip is a fault."""
    unexplained = []
    for r in skipped:
        held = HELD_RUN.search(r["message"] or "")
        explained = held and query(
            dsn, "SELECT 1 FROM pgsched.job_run r JOIN pgsched.instances i USING (instance_id) "
                 "WHERE r.run_id = %s AND r.started_at - r.plan_time > interval '0.5 s' AND i.version = %s "
                 "  AND r.started_at BETWEEN %s AND %s::timestamptz + interval '2 s' "
                 "  AND (i.pid = ANY (%s) OR r.plan_time BETWEEN %s AND %s::timestamptz + interval '2 s')",
            (int(held.group(1)), previous_release.RELEASE, *init_window, raced_pids, *init_window))
        if not explained:
            unexplained.append(r)
    return unexplained


@pytest.mark.slow
def test_rolling_upgrade_from_release_0_1_0(empty_db: str, serve: ServeFactory) -> None:
    dsn = empty_db
    old = previous_release.venv() / "bin" / "pgsched"
    pgsched_init(old, dsn, previous_release.old_env())
    execute(dsn, EFFECT_SQL)
    execute(dsn, SETUP_SQL)
    args = ("--max-workers", "3", "--shutdown-timeout", "10")
    olds = [serve(dsn, *args, executable=old, env=previous_release.ENV_CHANGES) for _ in range(3)]
    # First plans after the instances are ready: a first run started late would make the next
    # slot come due while it runs, and skip it, before any upgrade.
    first = "initial_start => now() + interval '2 s'"
    job = add_job(dsn, f"'effect', '1 second', config => '{{\"s\": 0.3}}', {first}")
    # More work, so that every instance claims often: psycopg prepares a statement on its fifth
    # execution, and a prepared `SELECT * FROM pgsched._claim(...)` is what fails, at every claim,
    # if the new SQL changed the shape of its result ("cached plan must not change result type").
    ticks = [add_job(dsn, f"'tick', '1 second', {first}") for _ in range(6)]
    wait_for(lambda: all(stats(dsn, j)["total_successes"] >= 10 for j in [job, *ticks]), 30,
             "ten runs of each job on release 0.1.0")

    t0 = time.monotonic()
    init_started = query(dsn, "SELECT clock_timestamp() AS t")[0]["t"]
    out = pgsched_init(PGSCHED, dsn)
    init_seconds = time.monotonic() - t0
    # This release's migrations go to the second ledger, which 0.1.0's instances do not read.
    assert f"applied migrations {', '.join(str(v) for v in range(6, migrate.code_version() + 1))}" in out, out
    assert f"internal API 2 (release {pgsched.__version__}); instances of API 1 to 2 may run on it" in out
    upgraded_at = query(dsn, "SELECT clock_timestamp() AS t")[0]["t"]
    # 0.1.0's instances check the schema on every reconnect: make them reconnect to the new one.
    # At a moment no run is in progress: a run whose instance has no session is abandoned, and
    # an instance that reconnects first records it as a crash (the failover rule, not the upgrade).
    # An instance whose statement waited on init's locks past its lock_timeout has reconnected
    # already, or is between two attempts (no session to end): so end the sessions older than
    # init's commit, as often as it takes, until each instance has one newer.
    sessions: dict[str, Any] = {}
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        query(dsn, "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) AS n FROM pg_stat_activity "
                   "WHERE application_name = 'pgsched scheduler' AND backend_start <= %s AND NOT EXISTS "
                   "(SELECT 1 FROM pgsched.job_run_live WHERE outcome = 'running')", (upgraded_at,))
        sessions = query(dsn, "SELECT count(*) FILTER (WHERE backend_start > %s) AS new, "
                              "count(*) FILTER (WHERE backend_start <= %s) AS old FROM pg_stat_activity "
                              "WHERE application_name = 'pgsched scheduler'", (upgraded_at, upgraded_at))[0]
        if sessions == {"new": len(olds), "old": 0}:
            break
        time.sleep(0.01)
    assert sessions == {"new": len(olds), "old": 0}
    time.sleep(4)  # three instances of 0.1.0 on the new schema
    for s in olds:
        assert s.proc.poll() is None, s.log()[-3000:]
        assert "reconnected" in s.log(), s.log()[-3000:]

    news: list[Serve] = []
    for s in olds:  # one at a time
        s.signal(signal.SIGTERM)
        assert s.wait_exit(20) == 0, s.log()
        news.append(serve(dsn, *args))
        time.sleep(3)
    time.sleep(2)
    for s in news:
        s.signal(signal.SIGTERM)
    for s in news:
        assert s.wait_exit(20) == 0, s.log()

    raced = {s.pid: [line for line in s.log_lines() if RACED_INIT.search(line)] for s in olds}
    raced_pids = [pid for pid, lines in raced.items() if lines]
    everything = history(dsn, job)
    # Every run closed with its real outcome: no crash, no run left open, nothing missed, and
    # nothing skipped but what the allowed race with init explains (below).
    assert Counter(r["outcome"] for r in everything).keys() <= {"success", "skipped"}, everything
    skipped = [r for r in everything if r["outcome"] == "skipped"]
    assert not unexplained_skips(dsn, skipped, raced_pids, (init_started, upgraded_at)), (skipped, raced)
    runs = [r for r in everything if r["outcome"] == "success"]
    st = stats(dsn, job)
    assert (st["total_crashes"], st["total_failures"], st["total_missed"]) == (0, 0, 0)
    assert (st["total_successes"], st["total_skipped"]) == (len(runs), sum(r["result"]["count"] for r in skipped))
    # No plan ran twice: one run and one side effect per plan.
    plans = Counter(r["plan_time"] for r in runs)
    effects = Counter(r["plan_time"] for r in query(dsn, "SELECT plan_time FROM public.effect"))
    assert max(plans.values()) == 1 and effects == plans
    # The job never stopped for long: not at init, not while instances were replaced.
    starts = [r["started_at"] for r in runs]
    gap = longest_gap(starts)
    print(f"rolling upgrade: {len(runs)} runs, longest gap between two starts {gap.total_seconds():.3f} s, "
          f"init took {init_seconds:.2f} s, {len(raced_pids)} old instance(s) raced it, {len(skipped)} skip(s)")
    assert gap <= timedelta(seconds=MAX_GAP), gap
    # Both releases ran it after the new init: the old instances kept working on the new schema.
    by_version = {r["instance_id"]: r["version"]
                  for r in query(dsn, "SELECT instance_id, version FROM pgsched.instances")}
    after = Counter(by_version[r["instance_id"]] for r in runs if r["started_at"] > upgraded_at)
    assert after[previous_release.RELEASE] >= 3 and after[pgsched.__version__] >= 3, after
    assert sorted(by_version.values()) == [previous_release.RELEASE] * 3 + [pgsched.__version__] * 3
    # The other jobs too: every run closed, every one a success.
    closed = Counter(r["outcome"] for j in ticks for r in history(dsn, j))
    assert closed.keys() <= {"success", "skipped", "missed"} and closed["success"] > 100, closed
    tick_skips = [r for j in ticks for r in history(dsn, j) if r["outcome"] == "skipped"]
    assert not unexplained_skips(dsn, tick_skips, raced_pids, (init_started, upgraded_at)), (tick_skips, raced)
    # A plan of theirs due while init held job and job_stat (an upgrade with migrations, README
    # "Upgrading") and the old instances paused after the race may start so late that the catch-up
    # ('latest') records it missed: only plans due from init's start to 2 s after its commit (CI of
    # 2026-11-29, init 1.81 s on a slow machine, all three old instances raced: one such record).
    tick_missed = [r for j in ticks for r in history(dsn, j) if r["outcome"] == "missed"]
    assert all(init_started - timedelta(seconds=1) <= datetime.fromisoformat(r["result"]["first"])
               and datetime.fromisoformat(r["result"]["last"]) <= upgraded_at + timedelta(seconds=2)
               for r in tick_missed), (tick_missed, init_started, upgraded_at)
    # No instance of either release logged an SQL error, nor any warning, but two kinds in an old
    # instance: the connection this test ended on purpose, and at most one lost race with init's
    # commit (README "Upgrading": a function 0.1.0 calls that gained an argument is a new function,
    # and the old one is dropped; a statement of 0.1.0 planned just before init committed and run
    # just after it finds the old one gone; the instance's loop goes on).
    assert all(len(lines) <= 1 for lines in raced.values()), raced
    # (A plan recorded missed says so in a 'behind' warning: those records are checked above.)
    errors = {s.pid: [line for line in s.log_lines() if NOT_QUIET.search(line) and not BEHIND.search(line)
                      and not (s in olds and (any(f in line for f in FORCED_RECONNECT) or FORCED_PIPELINE in line
                                              or RACED_INIT.search(line)
                                              or (init_seconds > 1.0 and LOCK_WAIT in line)))]
              for s in [*olds, *news]}
    assert not any(errors.values()), errors


@pytest.mark.slow
def test_init_again_and_again_under_running_instances_is_quiet(db: str, serve: ServeFactory) -> None:
    """The rolling upgrade's init, repeated under load: one init meets the instances' statements
    only now and then, thirty of them nearly always do (before init replaced functions in place
    and gave way to running statements, this logged about one SQL error per three inits). On a
    slow machine an init can hold a round up past a plan of these 1-second jobs: that plan is
    missed as the catch-up policy says, with its warning, which is the scheduler's report of a
    delay, not an error (seen once on the machine of 2026-11-27 evening). Any other warning or error
    fails the test: among them a 0.1.0 statement that waited past its 1 s lock_timeout for a lock
    the reapply held, which 0.1.0 logs as a lost connection. That was seen twice in thirty inits on
    that machine, and 36 times in one CI run, while every reapply replaced the triggers on job and
    job_stat, locking them
    against writes until its commit; a reapply now leaves the views and triggers whose text did
    not change (pgsched._replace_if_changed), and these reapply the same files."""
    execute(db, SETUP_SQL)
    jobs = [add_job(db, "'tick', '1 second', initial_start => now() + interval '3 s'") for _ in range(20)]
    old = previous_release.venv() / "bin" / "pgsched"
    instances = [serve(db, "--max-workers", "4", executable=old, env=previous_release.ENV_CHANGES)
                 for _ in range(3)]
    time.sleep(2)
    for _ in range(30):
        execute(db, "UPDATE pgsched.api_state SET checksum = 'another release'")  # so that init re-applies
        assert "schema version" in pgsched_init(PGSCHED, db)
        time.sleep(0.3)
    time.sleep(1.5)
    errors = {s.pid: [line for line in s.log_lines() if NOT_QUIET.search(line) and not BEHIND.search(line)]
              for s in instances}
    assert not any(errors.values()), errors
    assert all(s.proc.poll() is None for s in instances)
    # (A run in progress counts as a crash until it ends: read the closed runs' outcomes.)
    # A round held up by an init may start a run late enough that the slot after it is skipped
    # (recorded as such); nothing may fail or crash.
    outcomes = query(db, "SELECT outcome, count(*) AS n FROM pgsched.job_run WHERE outcome <> 'running' GROUP BY 1")
    assert {r["outcome"] for r in outcomes} <= {"success", "skipped", "missed"}, outcomes
    assert all("was still in progress" in r["message"] for r in query(
        db, "SELECT message FROM pgsched.job_run WHERE outcome = 'skipped'")), outcomes
    assert sum(stats(db, j)["total_successes"] for j in jobs) > 100
