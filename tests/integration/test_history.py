"""History that stays bounded (issue 12, README "History and retention"): the database's retention
and its settings view, a job's own retention and history level, pgsched.purge_history (by outcome,
in batches, idempotent, two sessions at once), the pruning of stopped instances, and the
schedulers' turn at the purge. Time is a parameter: purge_history(now => ...) and the rows' own
finished_at, never a sleep.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from pgsched.retention import Purger
from tests.integration import test_core_sql_time as core
from tests.integration.helpers import Conn, add_job, as_new_role, one, rows, scalar, snapshot, stats
from tests.integration.test_scheduler import run_scheduler

NOW = datetime(2030, 6, 1, 12, 0, tzinfo=UTC)


def ended_run(conn: Conn, job_id: int, outcome: str, ended_ago: timedelta, plan_offset: int = 0) -> int:
    """A run of `job_id` that ended `ended_ago` before NOW with `outcome` (its row as a close leaves it)."""
    at = NOW - ended_ago
    return int(scalar(conn, """INSERT INTO pgsched.job_run (job_id, plan_time, started_at, finished_at, outcome)
                               VALUES (%s, %s, %s, %s, %s) RETURNING run_id""",
                      (job_id, at - timedelta(seconds=1 + plan_offset), at - timedelta(seconds=1), at, outcome)))


def left(conn: Conn, job_id: int) -> list[tuple[str, timedelta]]:
    """(outcome, age at NOW) of the job's rows, oldest first."""
    return [(r["outcome"], NOW - r["finished_at"]) for r in rows(
        conn, "SELECT outcome, finished_at FROM pgsched.job_run WHERE job_id = %s AND finished_at IS NOT NULL "
                 "ORDER BY finished_at", (job_id,))]


def purge(conn: Conn, max_rows: int | None = None, now: datetime = NOW) -> tuple[int, int]:
    r = one(conn, "SELECT * FROM pgsched.purge_history(now => %s, max_rows => %s)", (now, max_rows))
    return int(r["runs"]), int(r["instances"])


def days(n: float) -> timedelta:
    return timedelta(days=n)


# -- the database's retention ------------------------------------------------------------------

def test_settings_show_the_default_retention_and_set_retention_changes_it(api: Conn) -> None:
    shown = {r["name"]: r for r in rows(api, "SELECT * FROM pgsched.settings")}
    assert shown["success_retention"]["value"] == shown["success_retention"]["default_value"] == "7 days"
    assert shown["failure_retention"]["value"] == shown["failure_retention"]["default_value"] == "30 days"
    assert shown["last_purge"]["value"] is None
    assert one(api, "SELECT * FROM pgsched.set_retention(success => '2 days')") == {
        "success_retention": days(2), "failure_retention": days(30), "partition_width": days(1)}
    # NULL keeps the other
    assert one(api, "SELECT * FROM pgsched.set_retention(failure => '90 days')") == {
        "success_retention": days(2), "failure_retention": days(90), "partition_width": days(1)}
    assert scalar(api, "SELECT value FROM pgsched.settings WHERE name = 'success_retention'") == "2 days"


@pytest.mark.parametrize(("call", "message"), [
    ("SELECT pgsched.set_retention(success => '0')", "invalid success: 00:00:00 is zero"),
    ("SELECT pgsched.set_retention(failure => '-1 day')", "invalid failure: -1 days is negative"),
    ("SELECT pgsched.add_job('ok_fn', '1 hour', success_retention => '0')", "invalid success_retention: "),
    ("SELECT pgsched.add_job('ok_fn', '1 hour', failure_retention => '-5 minutes')",
     "invalid failure_retention: -00:05:00 is negative"),
    ("SELECT pgsched.add_job('ok_fn', '1 hour', history => 'some')", "invalid history: 'some'"),
])
def test_bad_retention_or_history_level_is_refused_with_its_form_and_nothing_written(api: Conn, call: str,
                                                                                    message: str) -> None:
    before = snapshot(api), rows(api, "SELECT * FROM pgsched.history_policy")
    with pytest.raises(psycopg.errors.InvalidParameterValue) as e:
        api.execute(call)
    assert message in str(e.value)
    # the form is named in the hint
    assert e.value.diag.message_hint and ("positive duration" in e.value.diag.message_hint
                                          or "'failures'" in e.value.diag.message_hint)
    assert (snapshot(api), rows(api, "SELECT * FROM pgsched.history_policy")) == before


def test_a_null_history_level_is_a_null_value_error(api: Conn) -> None:
    with pytest.raises(psycopg.errors.NullValueNotAllowed, match="invalid history: NULL"):
        api.execute("SELECT pgsched.add_job('ok_fn', '1 hour', history => NULL)")


def test_only_administrators_set_the_retention_or_purge(api: Conn, db: str) -> None:
    with as_new_role(api, db, "keeper") as role:
        assert role
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied to set the retention"):
            api.execute("SELECT pgsched.set_retention(success => '1 day')")
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied to purge"):
            api.execute("SELECT pgsched.purge_history()")
        # ... but reads the policy, and sets its own job's
        assert scalar(api, "SELECT value FROM pgsched.settings WHERE name = 'success_retention'") == "7 days"
        job_id = add_job(api, "'ok_fn', '1 hour', success_retention => '1 day', history => 'failures'")
        assert one(api, "SELECT history, success_retention FROM pgsched.jobs WHERE job_id = %s", (job_id,)) == {
            "history": "failures", "success_retention": days(1)}
    assert scalar(api, "SELECT value FROM pgsched.settings WHERE name = 'success_retention'") == "7 days"


def test_alter_job_sets_and_returns_a_jobs_retention_to_the_databases(api: Conn) -> None:
    job_id = add_job(api, "'ok_fn', '1 hour'")
    assert one(api, "SELECT history, success_retention, failure_retention FROM pgsched.jobs WHERE job_id = %s",
               (job_id,)) == {"history": "all", "success_retention": None, "failure_retention": None}
    api.execute("SELECT pgsched.alter_job(%s, history => 'none', failure_retention => '1 year')", (job_id,))
    assert one(api, "SELECT history, failure_retention FROM pgsched.jobs WHERE job_id = %s", (job_id,)) == {
        "history": "none", "failure_retention": timedelta(days=365)}
    # NULL keeps it; '0' returns it to the database's
    api.execute("SELECT pgsched.alter_job(%s, max_retries => 2)", (job_id,))
    assert scalar(api, "SELECT failure_retention FROM pgsched.jobs WHERE job_id = %s", (job_id,)) == days(365)
    api.execute("SELECT pgsched.alter_job(%s, failure_retention => '0')", (job_id,))
    assert scalar(api, "SELECT failure_retention FROM pgsched.jobs WHERE job_id = %s", (job_id,)) is None


# -- purge_history ---------------------------------------------------------------------------------

def test_purge_keeps_each_run_for_its_outcomes_retention(api: Conn) -> None:
    job_id = add_job(api, "'ok_fn', '1 hour'")
    for i, outcome in enumerate(("success", "skipped", "missed", "failure", "timeout", "crash", "cancelled")):
        for age in (6.9, 7.1, 29.9, 30.1):
            ended_run(api, job_id, outcome, days(age), plan_offset=i)
    running = int(scalar(api, """INSERT INTO pgsched.job_run (job_id, plan_time, started_at)
                                 VALUES (%s, %s, %s) RETURNING run_id""", (job_id, NOW - days(90), NOW - days(90))))
    queued = int(scalar(api, """INSERT INTO pgsched.job_run (job_id, scope, plan_time, outcome)
                                VALUES (%s, 'eu', %s, 'queued') RETURNING run_id""", (job_id, NOW - days(90))))
    # 3 kinds of success x 3 ages past 7 days, 4 kinds of failure x 1 age past 30 days
    assert purge(api) == (9 + 4, 0)
    kept = left(api, job_id)
    assert sorted(o for o, age in kept if age > days(7) and o in ("success", "skipped", "missed")) == []
    assert sorted(o for o, age in kept if age == days(29.9)) == ["cancelled", "crash", "failure", "timeout"]
    assert all(age < days(30) for _, age in kept)
    assert len(kept) == 3 + 4 * 3
    assert scalar(api, "SELECT count(*) FROM pgsched.job_run WHERE run_id IN (%s, %s)", (running, queued)) == 2
    # again: nothing more goes
    assert purge(api) == (0, 0)


def test_a_jobs_own_retention_replaces_the_databases_for_its_runs_only(api: Conn) -> None:
    short = add_job(api, "'ok_fn', '1 hour', success_retention => '1 day'")
    long = add_job(api, "'ok_fn', '1 hour', failure_retention => '1 year'")
    default = add_job(api, "'ok_fn', '1 hour'")
    for job_id in (short, long, default):
        ended_run(api, job_id, "success", days(2))
        ended_run(api, job_id, "failure", days(40))
    api.execute("SELECT pgsched.set_retention(success => '3 days')")
    assert purge(api) == (3, 0)
    assert left(api, short) == []
    assert left(api, long) == [("failure", days(40)), ("success", days(2))]
    assert left(api, default) == [("success", days(2))]


def test_purge_in_batches_deletes_the_oldest_first(api: Conn) -> None:
    job_id = add_job(api, "'ok_fn', '1 hour'")
    for i in range(5):
        ended_run(api, job_id, "success", days(8 + i), plan_offset=i)
    assert [purge(api, max_rows=2)[0] for _ in range(4)] == [2, 2, 1, 0]
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="invalid max_rows: 0 is less than 1"):
        purge(api, max_rows=0)


def test_two_sessions_purging_at_once_neither_waits_nor_deletes_a_row_twice(api: Conn, db: str) -> None:
    job_id = add_job(api, "'ok_fn', '1 hour'")
    for i in range(40):
        ended_run(api, job_id, "success", days(8), plan_offset=i)
    with psycopg.connect(db) as first, psycopg.connect(db) as second:
        second.execute("SET lock_timeout = '2s'")
        # the rows only, as a scheduler's batch: a partition made or dropped would hold job_run_live's
        # lock to the end of this open transaction
        got_first = first.execute("SELECT runs FROM pgsched.purge_history(now => %s, max_rows => 25, "
                                  "with_partitions => false)", (NOW,)).fetchone()
        # first's transaction is open and holds its 25 rows: second skips them
        got_second = second.execute("SELECT runs FROM pgsched.purge_history(now => %s)", (NOW,)).fetchone()
        second.commit()
        first.commit()
    assert got_first is not None and got_second is not None
    assert (got_first[0], got_second[0]) == (25, 15)
    assert left(api, job_id) == []


def test_stopped_instances_are_pruned_after_the_longer_retention_unless_a_run_is_in_progress(api: Conn) -> None:
    def instance(stopped_ago: timedelta | None, heartbeat_ago: timedelta) -> int:
        return int(scalar(api, """INSERT INTO pgsched.instance (host, pid, version, max_workers, heartbeat_at,
                                                                stopped_at)
                                  VALUES ('h', 1, 'v', 1, %s, %s) RETURNING instance_id""",
                          (NOW - heartbeat_ago, None if stopped_ago is None else NOW - stopped_ago)))
    stopped_long_ago = instance(days(31), days(31))
    stopped_lately = instance(days(29), days(29))
    silent_long = instance(None, days(31))  # killed: never wrote stopped_at
    busy = instance(days(31), days(31))
    job_id = add_job(api, "'ok_fn', '1 hour'")
    api.execute("""INSERT INTO pgsched.job_run (job_id, plan_time, started_at, instance_id)
                   VALUES (%s, %s, %s, %s)""", (job_id, NOW, NOW, busy))
    kept_run = ended_run(api, job_id, "failure", days(1))
    api.execute("UPDATE pgsched.job_run SET instance_id = %s WHERE run_id = %s", (stopped_long_ago, kept_run))
    assert purge(api) == (0, 2)
    assert sorted(r["instance_id"] for r in rows(api, "SELECT instance_id FROM pgsched.instance")) == sorted(
        [stopped_lately, busy])
    assert silent_long not in [r["instance_id"] for r in rows(api, "SELECT instance_id FROM pgsched.instance")]
    # the kept run still names the instance it ran on
    assert scalar(api, "SELECT instance_id FROM pgsched.job_run WHERE run_id = %s", (kept_run,)) == stopped_long_ago


# -- history levels ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("level", "kept"), [
    ("all", ["failure", "success"]), ("failures", ["failure"]), ("none", []),
])
def test_a_jobs_history_level_decides_which_ended_runs_keep_a_row(api: Conn, level: str, kept: list[str]) -> None:
    ok = add_job(api, "'ok_fn', '1 hour', history => %s", (level,))
    bad = add_job(api, "'bad_fn', '1 hour', history => %s", (level,))
    api.execute("CALL pgsched.run_job(%s)", (ok,))
    with pytest.raises(psycopg.errors.DivisionByZero):
        api.execute("CALL pgsched.run_job(%s)", (bad,))
    got = sorted(r["outcome"] for r in rows(api, "SELECT outcome FROM pgsched.job_run WHERE job_id IN (%s, %s)",
                                            (ok, bad)))
    assert got == kept
    # the counters are there whatever the level
    assert (stats(api, ok)["total_successes"], stats(api, bad)["total_failures"]) == (1, 1)


def test_with_history_none_a_crash_is_still_counted_and_its_row_goes_at_its_close(api: Conn) -> None:
    job_id = add_job(api, "'ok_fn', '1 hour', history => 'none'")
    run_id = scalar(api, "SELECT pgsched._mark_start(%s, now(), 'manual')", (job_id,))
    # started and not ended: the row is there, and the crash already counted (mark_start)
    assert scalar(api, "SELECT outcome FROM pgsched.job_run WHERE run_id = %s", (run_id,)) == "running"
    assert stats(api, job_id)["total_crashes"] == 1
    # found abandoned and closed as a crash, as a takeover does
    assert scalar(api, "SELECT pgsched._mark_end_v2(%s, 'crash', NULL, 'worker died', NULL)", (run_id,)) is True
    assert scalar(api, "SELECT count(*) FROM pgsched.job_run WHERE job_id = %s", (job_id,)) == 0
    s = stats(api, job_id)
    assert (s["total_runs"], s["total_crashes"], s["consecutive_crashes"], s["state"]) == (1, 1, 1, "scheduled")


def test_the_scheduler_keeps_only_the_failures_of_a_failures_job_and_still_queues_scope_runs(
        db: str, jobs: Conn) -> None:
    ok = add_job(jobs, "'hit', '1 second', history => 'failures'")
    bad = add_job(jobs, "'fail', '1 second', history => 'failures', max_retries => 0")
    scoped = add_job(jobs, "'hit', '1 hour', history => 'none', scope_query => $$SELECT unnest(ARRAY['a', 'b'])$$")

    def done(_: Any) -> bool:
        return bool(scalar(jobs, "SELECT count(*) FROM hits WHERE job_id = %s", (ok,)) >= 2
                    and scalar(jobs, "SELECT count(*) FROM hits WHERE job_id = %s", (scoped,)) >= 2
                    and stats(jobs, bad)["total_failures"] >= 1)

    run_scheduler(db, done, timeout=30)
    assert done(None)
    assert scalar(jobs, "SELECT count(*) FROM pgsched.job_run WHERE job_id = %s AND outcome <> 'running'", (ok,)) == 0
    assert stats(jobs, ok)["total_successes"] >= 2
    assert scalar(jobs, "SELECT count(*) FROM pgsched.job_run WHERE job_id = %s AND outcome = 'failure'", (bad,)) >= 1
    # the plan run found two scopes and queued them before its row went; each ran once
    assert sorted(r["scope"] for r in rows(jobs, "SELECT scope FROM pgsched.job_run WHERE job_id = %s "
                                                 "AND outcome NOT IN ('running', 'queued')", (scoped,))) == []
    assert scalar(jobs, "SELECT count(*) FROM hits WHERE job_id = %s", (scoped,)) == 2


# -- the schedulers' turn -------------------------------------------------------------------------------

def test_one_instance_a_turn_purges_and_the_others_skip_it(api: Conn, db: str) -> None:
    assert scalar(api, "SELECT pgsched._purge_turn('15 minutes', %s)", (NOW,)) is True
    assert scalar(api, "SELECT pgsched._purge_turn('15 minutes', %s)", (NOW + timedelta(minutes=14),)) is False
    assert scalar(api, "SELECT pgsched._purge_turn('15 minutes', %s)", (NOW + timedelta(minutes=15),)) is True
    api.execute("UPDATE pgsched.history_policy SET purged_at = NULL")
    job_id = add_job(api, "'ok_fn', '1 hour'")
    for i in range(12):
        ended_run(api, job_id, "success", days(3000), plan_offset=i)
    purgers = [Purger(db, every=3600, batch=5) for _ in range(3)]
    turns: list[bool] = []
    threads = [threading.Thread(target=lambda p=p: turns.append(p.purge_if_turn())) for p in purgers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for p in purgers:
        p.stop()
    assert sorted(turns) == [False, False, True]
    assert sum(p.runs_purged for p in purgers) == 12
    assert left(api, job_id) == []
    assert scalar(api, "SELECT value FROM pgsched.settings WHERE name = 'last_purge'") is not None


def test_a_running_scheduler_applies_the_retention_on_its_own(db: str, jobs: Conn) -> None:
    job_id = add_job(jobs, "'hit', '1 hour'")
    old = ended_run(jobs, job_id, "success", days(3000))
    sched = run_scheduler(db, lambda s: s._purger.turns > 0, timeout=20, purge_interval=0.2)
    assert sched._purger.turns >= 1
    assert scalar(jobs, "SELECT count(*) FROM pgsched.job_run WHERE run_id = %s", (old,)) == 0
    # and made job_run's partitions ahead (its first steps; a step whose lock was busy waits for the next turn)
    assert scalar(jobs, "SELECT count(*) FROM pgsched._history_partitions") >= 1


@pytest.mark.parametrize(("level", "kept"), [("all", ["missed", "skipped", "success"]), ("failures", []),
                                             ("none", [])])
def test_skip_and_miss_records_follow_the_history_level_and_the_counters_do_not(api: Conn, level: str,
                                                                                kept: list[str]) -> None:
    job_id = core.add_job(api, core.T, history=level)
    me = core.register(api, core.T)
    [run] = core.claim(api, me, core.T)
    end = {"run_id": run["run_id"], "outcome": "success", "finished_at": (core.T + 5 * core.S).isoformat(),
           "next_start": (core.T + 6 * core.S).isoformat(), "lease_token": run["lease_token"], "skipped": 4,
           "skipped_first": (core.T + core.S).isoformat(), "skipped_last": (core.T + 4 * core.S).isoformat(),
           "schedule_delay_s": 0}
    api.execute("SELECT * FROM pgsched._finish_runs(%s)", (json.dumps([end]),))
    decision = {"job_id": job_id, "old_next": (core.T + 6 * core.S).isoformat(),
                "new_next": (core.T + 20 * core.S).isoformat(), "missed": 3,
                "first": (core.T + 6 * core.S).isoformat(), "last": (core.T + 8 * core.S).isoformat(),
                "policy": "latest"}
    assert scalar(api, "SELECT pgsched._catch_up_v2(%s, now => %s)",
                  (json.dumps([decision]), core.T + 21 * core.S)) == 1
    assert sorted(r["outcome"] for r in rows(api, "SELECT outcome FROM pgsched.job_run WHERE job_id = %s",
                                             (job_id,))) == kept
    assert one(api, "SELECT total_successes, total_skipped, total_missed FROM pgsched.job_stat WHERE job_id = %s",
               (job_id,)) == {"total_successes": 1, "total_skipped": 4, "total_missed": 3}


def test_an_at_restart_run_keeps_its_row_whatever_the_level_so_it_runs_once_per_server_start(api: Conn) -> None:
    job_id = int(scalar(api, "SELECT pgsched.add_job('ok_fn', '@restart', history => 'none')"))
    start = scalar(api, "SELECT pg_postmaster_start_time()")
    api.execute("UPDATE pgsched.job_stat SET next_start = %s WHERE job_id = %s", (start, job_id))
    me = core.register(api, core.T)
    [run] = core.claim(api, me, core.T)
    end = {"run_id": run["run_id"], "outcome": "success", "finished_at": core.T.isoformat(), "next_start": None,
           "lease_token": run["lease_token"], "schedule_delay_s": 0}
    api.execute("SELECT * FROM pgsched._finish_runs(%s)", (json.dumps([end]),))
    # the close left next_start at the server start (the schedule has no next firing): the claim
    # passes over the plan that ran, by its row, and clears it
    assert core.claim(api, me, core.T + core.S) == []
    assert stats(api, job_id)["next_start"] is None
    assert [r["plan_time"] for r in rows(api, "SELECT plan_time FROM pgsched.job_run WHERE job_id = %s",
                                         (job_id,))] == [start]
    # nor does the purge take it while this server start lasts, however old it is
    assert purge(api, now=core.T + days(3000))[0] == 0
    assert scalar(api, "SELECT pgsched._arm_restart_jobs()") == 0


def test_a_triggered_runs_row_stays_whatever_the_level_and_at_least_as_long_as_schedulers_retry_it(
        api: Conn) -> None:
    job_id = add_job(api, "'ok_fn', '1 hour', history => 'none'")
    api.execute("SELECT pgsched.set_retention(success => '1 minute', failure => '1 minute')")
    me = core.register(api, core.T)
    plan = scalar(api, "SELECT pgsched.trigger_job(%s)", (job_id,))
    request = scalar(api, "SELECT request_id FROM pgsched.request WHERE job_id = %s AND plan_time = %s",
                     (job_id, plan))
    [run] = rows(api, "SELECT * FROM pgsched._start_request(%s, %s, %s, %s)", (me, request, 100, 0))
    end = {"run_id": run["run_id"], "outcome": "success", "next_start": None, "lease_token": run["lease_token"]}
    api.execute("SELECT * FROM pgsched._finish_runs(%s)", (json.dumps([end]),))
    # another scheduler that heard the request retries it: the request went with the start, and it
    # does not run again; nor would a request of the same plan_time, for the run's row says it ran
    assert rows(api, "SELECT * FROM pgsched._start_request(%s, %s, %s, %s)", (me, request, 101, 0)) == []
    again = scalar(api, "INSERT INTO pgsched.request (kind, job_id, plan_time, requested_by) "
                        "VALUES ('trigger', %s, %s, current_user) RETURNING request_id", (job_id, plan))
    assert rows(api, "SELECT * FROM pgsched._start_request(%s, %s, %s, %s)", (me, again, 101, 0)) == []
    finished = scalar(api, "SELECT finished_at FROM pgsched.job_run WHERE run_id = %s", (run["run_id"],))
    assert purge(api, now=finished + timedelta(minutes=9)) == (0, 0)
    assert purge(api, now=finished + timedelta(minutes=11)) == (1, 0)


def test_a_scheduler_whose_instance_row_was_pruned_while_it_was_cut_off_registers_again(db: str, jobs: Conn) -> None:
    job_id = add_job(jobs, "'hit', '1 second'")

    def hits() -> int:
        return int(scalar(jobs, "SELECT count(*) FROM hits WHERE job_id = %s", (job_id,)))

    seen: dict[str, int] = {}

    def until(s: Any) -> bool:
        if "first" not in seen:
            if s.instance_id is None or hits() < 1:
                return False
            # what a peer's purge does to an instance cut off for longer than the retention, and the cut
            seen["first"], seen["hits"] = s.instance_id, hits()
            jobs.execute("DELETE FROM pgsched.instance WHERE instance_id = %s", (s.instance_id,))
            jobs.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                         "WHERE application_name = 'pgsched scheduler' AND datname = current_database()")
            return False
        return bool(s.instance_id != seen["first"] and hits() >= seen["hits"] + 2)

    sched = run_scheduler(db, until, timeout=30)
    assert "first" in seen and sched.instance_id != seen["first"]
    assert hits() >= seen["hits"] + 2
    assert scalar(jobs, "SELECT count(*) FROM pgsched.instance WHERE instance_id = %s", (sched.instance_id,)) == 1


# -- time partitions (migration 0015) ---------------------------------------------------------------

def partitions(conn: Conn) -> list[tuple[datetime, datetime]]:
    return [(r["lower"], r["upper"]) for r in rows(conn, "SELECT lower, upper FROM pgsched._history_partitions "
                                                         "ORDER BY lower")]


def where(conn: Conn, run_id: int) -> tuple[str, datetime | None]:
    """The table a run's row is in, and its end of retention."""
    r = one(conn, "SELECT tableoid::regclass::text AS t, keep_until FROM pgsched.job_run WHERE run_id = %s",
            (run_id,))
    return str(r["t"]), r["keep_until"]


def test_partitions_are_made_ahead_as_far_as_the_longer_retention_and_dropped_whole_once_past(api: Conn) -> None:
    assert partitions(api) == []  # none until a purge (the schedulers' first turn) makes them
    assert purge(api, now=NOW) == (0, 0)
    made = partitions(api)
    day = timedelta(days=1)
    # a day each, from the day of NOW, contiguous, past NOW + 30 days (failures) + a day
    assert made[0][0] == datetime(2030, 6, 1, tzinfo=UTC) and all(u - lo == day for lo, u in made)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(made))
    assert made[-1][1] >= NOW + days(31) > made[-1][0]
    policy = one(api, "SELECT partitions_from, partitions_until FROM pgsched.history_policy")
    assert (policy["partitions_from"], policy["partitions_until"]) == (made[0][0], made[-1][1])
    # a second purge makes nothing new; a week later the week's partitions are dropped, and as
    # many made ahead
    assert one(api, "SELECT * FROM pgsched.purge_history(now => %s)", (NOW,))["partitions"] == 0
    assert partitions(api) == made
    assert one(api, "SELECT * FROM pgsched.purge_history(now => %s)", (NOW + days(7),))["partitions"] == 7
    later = partitions(api)
    assert later[0] == made[7] and later[-1][1] >= NOW + days(38)
    assert one(api, "SELECT partitions_from FROM pgsched.history_policy")["partitions_from"] == made[7][0]


def test_a_close_moves_the_row_to_the_partition_of_its_end_of_retention_which_goes_whole(api: Conn) -> None:
    now = scalar(api, "SELECT now()")
    purge(api, now=now)
    ok = add_job(api, "'ok_fn', '1 hour'")
    bad = add_job(api, "'bad_fn', '1 hour'")
    own = add_job(api, "'ok_fn', '1 hour', success_retention => '2 days'")
    far = add_job(api, "'ok_fn', '1 hour', success_retention => '90 days'")  # past the partitions made
    for job_id in (ok, own, far):
        api.execute("CALL pgsched.run_job(%s)", (job_id,))
    with pytest.raises(psycopg.errors.DivisionByZero):
        api.execute("CALL pgsched.run_job(%s)", (bad,))
    run = {j: int(scalar(api, "SELECT max(run_id) FROM pgsched.job_run WHERE job_id = %s", (j,)))
           for j in (ok, bad, own, far)}
    finished = {j: scalar(api, "SELECT finished_at FROM pgsched.job_run WHERE run_id = %s", (r,))
                for j, r in run.items()}
    for job_id, keep in ((ok, days(7)), (bad, days(30)), (own, days(2))):
        table, until = where(api, run[job_id])
        assert until == finished[job_id] + keep
        assert table.startswith("pgsched.job_run_2") and table != "pgsched.job_run_live"
    assert where(api, run[far]) == ("pgsched.job_run_live", None)
    # job_history reads them all, under the reader's row-level security as before
    assert sorted(r["run_id"] for r in rows(api, "SELECT run_id FROM pgsched.job_history")) == sorted(run.values())
    # eight days on: the success's partition is dropped whole; the failure's stays; the row kept
    # past the partitions goes by the purge's batch once its own 90 days are past
    got = one(api, "SELECT * FROM pgsched.purge_history(now => %s)", (now + days(8),))
    assert got["partitions"] >= 7 and got["runs"] == 0
    assert sorted(r["run_id"] for r in rows(api, "SELECT run_id FROM pgsched.job_run")) == sorted(
        [run[bad], run[far]])
    assert purge(api, now=now + days(91))[0] == 1
    assert rows(api, "SELECT run_id FROM pgsched.job_run") == []
    # the counters stay
    assert stats(api, ok)["total_successes"] == 1 and stats(api, bad)["total_failures"] == 1


def test_rows_that_keep_a_run_from_happening_twice_stay_in_the_live_table(api: Conn) -> None:
    purge(api, now=scalar(api, "SELECT now()"))
    job_id = add_job(api, "'ok_fn', '1 hour'")
    # a run trigger_job started on a scheduler (it has an instance), as _start_request marks it
    instance = scalar(api, "SELECT instance_id FROM pgsched._register_instance_v2('h', 1, 'v', 1)")
    manual = scalar(api, "SELECT pgsched._mark_start(%s, now(), 'manual', 1, 1, %s, 1)", (job_id, instance))
    api.execute("SELECT pgsched._mark_end_v2(%s, 'success', NULL, NULL, NULL)", (manual,))
    assert where(api, manual) == ("pgsched.job_run_live", None)
    restart = add_job(api, "'ok_fn', '@restart'")
    plan = scalar(api, "SELECT pg_postmaster_start_time()")
    run = scalar(api, "SELECT pgsched._mark_start(%s, %s, 'schedule')", (restart, plan))
    api.execute("SELECT pgsched._mark_end_v2(%s, 'success', NULL, NULL, NULL)", (run,))
    assert where(api, run) == ("pgsched.job_run_live", None)
    # ... which is what passes over the server start it ran for (the claim's key)
    assert scalar(api, "SELECT pgsched._arm_restart_jobs()") == 0


@pytest.mark.parametrize(("width", "message"), [
    ("0.5 seconds", "invalid partition: 00:00:00.5 is less than a second"),
    ("1 month", "invalid partition: 1 mon is in months"),
])
def test_a_bad_partition_width_is_refused_and_nothing_written(api: Conn, width: str, message: str) -> None:
    before = rows(api, "SELECT * FROM pgsched.history_policy")
    with pytest.raises(psycopg.errors.InvalidParameterValue) as e:
        api.execute("SELECT pgsched.set_retention(partition => %s::interval)", (width,))
    assert message in str(e.value) and "'1 day'" in str(e.value)
    assert rows(api, "SELECT * FROM pgsched.history_policy") == before


def test_a_narrower_width_applies_to_the_partitions_made_after(api: Conn) -> None:
    api.execute("SELECT pgsched.set_retention(success => '1 minute', failure => '2 minutes', partition => '30 s')")
    assert scalar(api, "SELECT value FROM pgsched.settings WHERE name = 'partition_width'") == "00:00:30"
    purge(api, now=NOW)
    made = partitions(api)
    assert made[0][0] == NOW and all(u - lo == timedelta(seconds=30) for lo, u in made)
    assert len(made) == 5  # two minutes and a width beyond NOW


def test_two_sessions_taking_partition_steps_at_once_one_gives_way(api: Conn, db: str) -> None:
    purge(api, now=NOW)
    made = partitions(api)
    steps = rows(api, "SELECT * FROM pgsched._history_steps(%s)", (NOW + days(1),))
    assert [(s["step"], s["lower"]) for s in steps] == [("drop", made[0][0]), ("create", made[-1][1])]
    drop, create = steps
    call = "SELECT pgsched._history_step(%(step)s, %(name)s, %(lower)s, %(upper)s)"
    with psycopg.connect(db) as first, psycopg.connect(db, autocommit=True) as second:
        second.execute("SET lock_timeout = '5s'")
        assert scalar(first, call, create) is True  # its transaction open: job_run_live's lock held
        began = datetime.now(UTC)
        # the same step and another, each given up after the step's own lock wait (50 ms)
        assert (scalar(second, call, create), scalar(second, call, drop)) == (False, False)
        assert datetime.now(UTC) - began < timedelta(seconds=1)
        first.commit()
        # the step another session took is not taken twice; the one left is taken now
        assert (scalar(second, call, create), scalar(second, call, drop)) == (False, True)
    assert partitions(api) == [*made[1:], (create["lower"], create["upper"])]


def test_partition_steps_a_busy_lock_left_are_taken_again_soon_not_at_the_next_turn(api: Conn, db: str) -> None:
    purger = Purger(db, every=3600, busy_retry=0.05)
    try:
        with psycopg.connect(db) as report:
            # A report reading the live history holds a lock every attach waits for.
            report.execute("LOCK TABLE pgsched.job_run_live IN ACCESS SHARE MODE")
            assert purger.purge_if_turn() is True
            assert purger.deferred and partitions(api) == []
            purger.start()
            time.sleep(0.3)  # retries after 0.05, 0.1 and 0.2 s, all while the lock is held
            assert purger.deferred and partitions(api) == []
        # The report ended: the steps are taken at the next retry, within the turn (the next turn
        # is an hour away).
        deadline = time.monotonic() + 5
        while purger.deferred and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not purger.deferred
        assert partitions(api) != [] and purger.turns == 1
    finally:
        purger.stop()
