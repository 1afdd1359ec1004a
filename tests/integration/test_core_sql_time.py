"""The scheduler's core SQL (sql/api/40_scheduler.sql) driven with explicit time: no sleeping.

Each function that needs the current time takes it as its last argument, `now` (the scheduler
passes nothing and gets the database's now()). Here every call names the instant, so claiming,
lease renewal, abandoned-run detection, takeover, catch-up and closing are checked at exact
moments: a second before a job is due, at the instant, a lease just inside and just past
dead_after. The real-process tests (tests/acceptance/) keep covering the crash paths.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from tests.integration.helpers import Conn, one, rows, scalar

T = datetime(2030, 6, 1, 12, 0, 0, tzinfo=UTC)  # the tests' "now"; far from the wall clock on purpose
S = timedelta(seconds=1)
DEAD_AFTER = timedelta(seconds=10)
GRACE = timedelta(seconds=2)


def add_job(api: Conn, next_start: datetime, **settings: Any) -> int:
    extra = "".join(f", {k} => %({k})s" for k in settings)
    job = int(scalar(api, f"SELECT pgsched.add_job('ok_fn', '1 minute'{extra})", settings))
    api.execute("UPDATE pgsched.job_stat SET next_start = %s WHERE job_id = %s", (next_start, job))
    return job


def register(api: Conn, at: datetime) -> int:
    return int(scalar(api, "SELECT instance_id FROM pgsched._register_instance_v2('h', 1, 'test', 4, now => %s)",
                      (at,)))


def claim(api: Conn, instance: int, at: datetime, workers: int = 1,
          ahead: timedelta = timedelta(0)) -> list[dict[str, Any]]:
    return rows(api, "SELECT * FROM pgsched._claim_v2(%s, %s, %s, %s, '{}', now => %s)",
                (instance, list(range(100, 100 + workers)), [0] * workers, ahead, at))


def abandoned(api: Conn, instance: int, at: datetime, held: list[int] | None = None) -> dict[int, str]:
    found = rows(api, "SELECT run_id, cause FROM pgsched._abandoned_runs_v2(%s, %s, %s, %s, now => %s)",
                 (instance, DEAD_AFTER, GRACE, held or [], at))
    return {int(r["run_id"]): str(r["cause"]) for r in found}


def test_a_job_is_claimed_at_its_instant_not_a_microsecond_before(api: Conn) -> None:
    job = add_job(api, T)
    me = register(api, T - 5 * S)
    assert claim(api, me, T - timedelta(microseconds=1)) == []
    [run] = claim(api, me, T)
    assert (run["job_id"], run["plan_time"], run["started_at"]) == (job, T, T)
    st = one(api, "SELECT state, last_start, total_runs, total_crashes, consecutive_crashes FROM pgsched.job_stat "
                  "WHERE job_id = %s", (job,))
    # mark_start counts the run as a crash until mark_end says otherwise.
    assert st == {"state": "starting", "last_start": T, "total_runs": 1, "total_crashes": 1,
                  "consecutive_crashes": 1}
    assert scalar(api, "SELECT heartbeat_at FROM pgsched.job_run WHERE run_id = %s", (run["run_id"],)) == T


def test_claim_ahead_starts_the_run_at_its_plan_time(api: Conn) -> None:
    job = add_job(api, T)
    me = register(api, T - 5 * S)
    assert claim(api, me, T - 2 * S, ahead=S) == []
    [run] = claim(api, me, T - timedelta(milliseconds=500), ahead=S)
    assert (run["job_id"], run["started_at"]) == (job, T)


def test_schedule_delay_is_subtracted_from_next_start_for_the_plan_time(api: Conn) -> None:
    job = add_job(api, T + 90 * S, schedule_delay=timedelta(seconds=90))
    me = register(api, T)
    assert claim(api, me, T + 89 * S) == []
    [run] = claim(api, me, T + 90 * S)
    assert (run["job_id"], run["plan_time"], run["started_at"]) == (job, T, T + 90 * S)


def test_next_due_and_behind_read_the_given_time(api: Conn) -> None:
    job = add_job(api, T)
    assert one(api, "SELECT next_due FROM pgsched._next_due_v2('{}', now => %s)", (T - S,))["next_due"] == T
    late = timedelta(seconds=1)
    assert rows(api, "SELECT job_id FROM pgsched._behind_v2(%s, 10, now => %s)", (late, T + late)) == []
    assert rows(api, "SELECT job_id FROM pgsched._behind_v2(%s, 10, now => %s)",
                (late, T + late + timedelta(microseconds=1))) == [{"job_id": job}]


def test_heartbeat_renews_held_leases_at_the_given_time_and_reports_lost_ones(api: Conn) -> None:
    add_job(api, T)
    me = register(api, T)
    [run] = claim(api, me, T)
    beat = one(api, "SELECT * FROM pgsched._heartbeat_v2(%s, 4, %s, %s, now => %s)",
               (me, [run["run_id"]], [run["lease_token"]], T + 2 * S))
    assert beat["lost"] == []
    assert scalar(api, "SELECT heartbeat_at FROM pgsched.job_run WHERE run_id = %s", (run["run_id"],)) == T + 2 * S
    assert scalar(api, "SELECT heartbeat_at FROM pgsched.instance WHERE instance_id = %s", (me,)) == T + 2 * S
    # A token that is not the run's (another instance took it over) is a lost lease: not renewed.
    beat = one(api, "SELECT * FROM pgsched._heartbeat_v2(%s, 4, %s, %s, now => %s)",
               (me, [run["run_id"]], [run["lease_token"] + 1000], T + 4 * S))
    assert beat["lost"] == [run["run_id"]]
    assert scalar(api, "SELECT heartbeat_at FROM pgsched.job_run WHERE run_id = %s", (run["run_id"],)) == T + 2 * S


def test_a_lease_is_stale_exactly_after_dead_after(api: Conn) -> None:
    add_job(api, T)
    holder = register(api, T)
    other = register(api, T)
    [run] = claim(api, holder, T)
    # The holder's session (this connection) is alive: only the lease's age can make it stale.
    assert abandoned(api, other, T + DEAD_AFTER) == {}
    assert abandoned(api, other, T + DEAD_AFTER + timedelta(microseconds=1)) == {run["run_id"]: "stale"}
    # A renewal at T + 5 s moves the instant.
    api.execute("SELECT * FROM pgsched._heartbeat_v2(%s, 4, %s, %s, now => %s)",
                (holder, [run["run_id"]], [run["lease_token"]], T + 5 * S))
    assert abandoned(api, other, T + 5 * S + DEAD_AFTER) == {}
    assert abandoned(api, other, T + 6 * S + DEAD_AFTER) == {run["run_id"]: "stale"}


def test_a_stopped_holder_and_a_lost_own_run_are_found_at_once(api: Conn) -> None:
    add_job(api, T)
    holder = register(api, T)
    other = register(api, T)
    [run] = claim(api, holder, T)
    # The holder's own run, not in what it holds (a claim whose reply was lost): 'lost'.
    assert abandoned(api, holder, T + S, held=[]) == {run["run_id"]: "lost"}
    assert abandoned(api, holder, T + S, held=[run["run_id"]]) == {}
    api.execute("SELECT pgsched._instance_stop_v2(%s, now => %s)", (holder, T + S))
    assert scalar(api, "SELECT stopped_at FROM pgsched.instance WHERE instance_id = %s", (holder,)) == T + S
    assert abandoned(api, other, T + S) == {run["run_id"]: "stopped"}


def test_a_holder_whose_session_is_gone_is_found_after_the_grace(api: Conn, db: str) -> None:
    add_job(api, T)
    other = register(api, T)
    with psycopg.connect(db, autocommit=True) as gone:
        holder = register(gone, T)
        [run] = claim(gone, holder, T)
    # The holder's session ended (its backend leaves pg_stat_activity as the connection closes).
    for _ in range(200):
        if not rows(api, "SELECT 1 FROM pg_stat_activity WHERE pid = (SELECT backend_pid FROM pgsched.instance "
                         "WHERE instance_id = %s)", (holder,)):
            break
        api.execute("SELECT pg_sleep(0.01)")  # the backend's exit is asynchronous; bounded wait, no timing assert
    assert abandoned(api, other, T + GRACE) == {}
    assert abandoned(api, other, T + GRACE + timedelta(microseconds=1)) == {run["run_id"]: "gone"}


def test_a_holder_whose_session_the_servers_restart_ended_has_dead_after_to_come_back(api: Conn, db: str) -> None:
    """After a server restart every scheduler's session is gone, and each reconnects on its own
    backoff: the first back closed a slower peer's runs as crashes (successes it was about to
    write among them). A holder whose last heartbeat predates the server's start is gone only
    dead_after after that start; one that heartbeated since, as before, after the grace."""
    started = scalar(api, "SELECT pg_postmaster_start_time()")
    add_job(api, started - 2 * S)
    other = register(api, started)
    with psycopg.connect(db, autocommit=True) as gone:
        holder = register(gone, started - S)
        [run] = claim(gone, holder, started - S)
    for _ in range(200):
        if not rows(api, "SELECT 1 FROM pg_stat_activity WHERE pid = (SELECT backend_pid FROM pgsched.instance "
                         "WHERE instance_id = %s)", (holder,)):
            break
        api.execute("SELECT pg_sleep(0.01)")
    assert abandoned(api, other, started + GRACE + S) == {}  # past the grace, within dead_after of the start
    assert abandoned(api, other, started + DEAD_AFTER - 2 * S) == {}
    assert abandoned(api, other, started + DEAD_AFTER + timedelta(microseconds=1)) == {run["run_id"]: "gone"}
    # A holder that heartbeated after the server's start and then lost its session: the grace.
    api.execute("UPDATE pgsched.instance SET heartbeat_at = %s WHERE instance_id = %s", (started + S, holder))
    assert abandoned(api, other, started + S + GRACE + timedelta(microseconds=1)) == {run["run_id"]: "gone"}


def test_take_over_starts_the_next_attempt_at_the_given_time(api: Conn) -> None:
    job = add_job(api, T, allow_stale_reentry=True)
    holder = register(api, T)
    taker = register(api, T)
    [run] = claim(api, holder, T)
    at = T + DEAD_AFTER + S
    assert abandoned(api, taker, at) == {run["run_id"]: "stale"}
    [taken] = rows(api, "SELECT * FROM pgsched._take_over_v2(%s, %s, %s, %s, %s, now => %s)",
                   (taker, [run["run_id"]], [run["lease_token"]], [7], [0], at))
    assert (taken["run_id"], taken["attempt"], taken["started_at"]) == (run["run_id"], 2, at)
    assert taken["lease_token"] != run["lease_token"]
    r = one(api, "SELECT instance_id, heartbeat_at FROM pgsched.job_run WHERE run_id = %s", (run["run_id"],))
    assert r == {"instance_id": taker, "heartbeat_at": at}
    # Fenced on the old token: a second takeover with it does nothing.
    assert rows(api, "SELECT * FROM pgsched._take_over_v2(%s, %s, %s, %s, %s, now => %s)",
                (holder, [run["run_id"]], [run["lease_token"]], [8], [0], at + S)) == []
    st = one(api, "SELECT total_runs, total_crashes FROM pgsched.job_stat WHERE job_id = %s", (job,))
    assert st == {"total_runs": 2, "total_crashes": 2}


def test_catch_up_records_missed_plans_at_the_given_time(api: Conn) -> None:
    job = add_job(api, T)
    decision = {"job_id": job, "old_next": T.isoformat(), "new_next": (T + 10 * S).isoformat(), "missed": 3,
                "first": T.isoformat(), "last": (T + 2 * S).isoformat(), "policy": "latest"}
    assert scalar(api, "SELECT pgsched._catch_up_v2(%s, now => %s)", (json.dumps([decision]), T + 11 * S)) == 1
    missed = one(api, "SELECT plan_time, finished_at, outcome, result FROM pgsched.job_run WHERE job_id = %s",
                 (job,))
    assert (missed["plan_time"], missed["finished_at"], missed["outcome"]) == (T, T + 11 * S, "missed")
    assert missed["result"]["count"] == 3
    assert one(api, "SELECT next_start, total_missed FROM pgsched.job_stat WHERE job_id = %s", (job,)) == {
        "next_start": T + 10 * S, "total_missed": 3}
    # Written against the next_start it decided on: a second, stale decision changes nothing.
    assert scalar(api, "SELECT pgsched._catch_up_v2(%s, now => %s)", (json.dumps([decision]), T + 12 * S)) == 0


def test_a_close_records_the_skipped_slots_at_the_run_s_finish(api: Conn) -> None:
    job = add_job(api, T)
    me = register(api, T)
    [run] = claim(api, me, T)
    end = {"run_id": run["run_id"], "outcome": "success", "finished_at": (T + 5 * S).isoformat(),
           "next_start": (T + 6 * S).isoformat(), "lease_token": run["lease_token"], "skipped": 4,
           "skipped_first": (T + S).isoformat(), "skipped_last": (T + 4 * S).isoformat(), "schedule_delay_s": 0}
    assert [r["_finish_runs"] for r in rows(api, "SELECT * FROM pgsched._finish_runs(%s)",
                                            (json.dumps([end]),))] == [run["run_id"]]
    hist = rows(api, "SELECT outcome, plan_time, finished_at FROM pgsched.job_run WHERE job_id = %s ORDER BY run_id",
                (job,))
    assert hist == [{"outcome": "success", "plan_time": T, "finished_at": T + 5 * S},
                    {"outcome": "skipped", "plan_time": T + S, "finished_at": T + 5 * S}]
    st = one(api, "SELECT state, next_start, total_successes, total_crashes, total_skipped FROM pgsched.job_stat "
                  "WHERE job_id = %s", (job,))
    assert st == {"state": "scheduled", "next_start": T + 6 * S, "total_successes": 1, "total_crashes": 0,
                  "total_skipped": 4}
