"""Catch-up after downtime and schedule_delay, with a real scheduler on a real database.

Downtime is simulated the way the catalog sees it: a job's next_start is set ten
plans back, as if every scheduler had been down since then. Every due plan must
end up either run or recorded as missed (a 'missed' history row with its range,
and job_stat.total_missed), per the job's catch_up policy.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from typing import Any

import pytest

from pgsched import catchup
from pgsched.scheduler import Scheduler
from pgsched.settings import Settings
from pgsched.store import Store
from tests.integration.test_scheduler import Conn, one, serve

MINUTE = timedelta(minutes=1)
ON_TIME = catchup.ON_TIME


@pytest.fixture
def hits(conn: Conn) -> Conn:
    conn.execute("CREATE TABLE hits (job_id int, plan_time timestamptz)")
    conn.execute("""CREATE PROCEDURE public.hit(job_id int, config jsonb) LANGUAGE sql
                    AS $$ INSERT INTO hits VALUES (job_id, current_setting('pgsched.plan_time')::timestamptz) $$""")
    return conn


def behind_job(conn: Conn, settings: str = "") -> tuple[int, datetime]:
    """A job every minute (on whole minutes) whose next plan is ten minutes ago; returns (job, that plan)."""
    job = one(conn, f"SELECT add_job('hit', '1 minute', initial_start => date_trunc('minute', now()) - "
                    f"interval '1 day'{settings})")
    first = one(conn, "UPDATE pgsched.job_stat SET next_start = date_trunc('minute', now()) - interval '10 minutes' "
                      "WHERE job_id = %s RETURNING next_start", job)
    return job, first


def ran(conn: Conn, job: int) -> list[datetime]:
    return [r[0] for r in conn.execute(
        "SELECT plan_time FROM pgsched.job_history WHERE job_id = %s AND outcome = 'success' ORDER BY run_id",
        (job,))]


def missed(conn: Conn, job: int) -> list[dict[str, Any]]:
    return [r[0] for r in conn.execute(
        "SELECT result FROM pgsched.job_history WHERE job_id = %s AND outcome = 'missed' ORDER BY run_id", (job,))]


def covered(ranges: list[dict[str, Any]]) -> list[datetime]:
    """The plans (whole minutes) a list of 'missed' ranges stands for; checks each range's count."""
    out: list[datetime] = []
    for r in ranges:
        first, last = datetime.fromisoformat(r["first"]), datetime.fromisoformat(r["last"])
        plans = [first + k * MINUTE for k in range(int((last - first) / MINUTE) + 1)]
        assert len(plans) == r["count"], r
        out += plans
    return out


def total_missed(conn: Conn, job: int) -> int:
    return int(one(conn, "SELECT total_missed FROM pgsched.job_stats WHERE job_id = %s", job))


def assert_every_plan_accounted_for(conn: Conn, job: int, first: datetime, last: datetime) -> None:
    runs, gone = ran(conn, job), covered(missed(conn, job))
    assert sorted(runs) == runs and len(set(runs)) == len(runs), runs  # oldest first, none twice
    assert not set(runs) & set(gone), (runs, gone)
    expected = [first + k * MINUTE for k in range(int((last - first) / MINUTE) + 1)]
    assert sorted(runs + gone) == expected, (runs, gone)
    assert total_missed(conn, job) == len(gone)
    # The side effect agrees with the history: each run ran its own plan once.
    effects = [r[0] for r in conn.execute("SELECT plan_time FROM hits WHERE job_id = %s ORDER BY 1", (job,))]
    assert effects == sorted(runs)


def test_latest_runs_the_most_recent_plan_once_and_records_the_rest(db: str, hits: Conn) -> None:
    job, first = behind_job(hits)
    serve(db, lambda: len(ran(hits, job)) >= 1, timeout=10)
    runs = ran(hits, job)
    assert len(runs) == 1
    latest = runs[0]
    assert latest >= first + 10 * MINUTE and latest.second == 0
    assert_every_plan_accounted_for(hits, job, first, latest)
    assert covered(missed(hits, job))[0] == first


def test_all_replays_the_plans_inside_the_window_oldest_first(db: str, hits: Conn) -> None:
    job, first = behind_job(hits, ", catch_up => 'all'")
    hits.execute("UPDATE pgsched.job SET catch_up_window = interval '4 minutes 30 seconds' WHERE job_id = %s", (job,))
    now = one(hits, "SELECT date_trunc('minute', now())")
    serve(db, lambda: bool(ran(hits, job)) and ran(hits, job)[-1] >= now, timeout=10)
    runs = ran(hits, job)
    # The window reaches back 4.5 minutes from now: the last 5 (or 4, at the start of a minute) plans.
    assert 4 <= len(runs) <= 5, runs
    assert runs[-1] == now
    assert_every_plan_accounted_for(hits, job, first, runs[-1])


def test_all_keeps_at_most_max_plans_per_tick(db: str, hits: Conn) -> None:
    job, first = behind_job(hits, ", catch_up => 'all'")
    hits.execute("UPDATE pgsched.job SET max_plans_per_tick = 3 WHERE job_id = %s", (job,))
    serve(db, lambda: len(ran(hits, job)) >= 3, timeout=10)
    runs = ran(hits, job)
    assert len(runs) == 3, runs
    assert runs == [runs[0] + k * MINUTE for k in range(3)]
    assert_every_plan_accounted_for(hits, job, first, runs[-1])


def test_all_without_limits_replays_every_missed_plan(db: str, hits: Conn) -> None:
    job, first = behind_job(hits, ", catch_up => 'all'")
    serve(db, lambda: len(ran(hits, job)) >= 11, timeout=10)
    runs = ran(hits, job)
    assert runs[:11] == [first + k * MINUTE for k in range(11)]
    assert missed(hits, job) == [] and total_missed(hits, job) == 0


def test_none_runs_no_late_plan(db: str, hits: Conn) -> None:
    job, first = behind_job(hits, ", catch_up => 'none'")
    t0 = one(hits, "SELECT now()")
    deadline = time.monotonic() + 2.0
    serve(db, lambda: time.monotonic() > deadline, timeout=10)
    # No late plan ran (a plan that came due during the test, or within ON_TIME before its start
    # (the test may begin just after a whole minute), may have: it is on time).
    assert [p for p in ran(hits, job) if p < t0 - ON_TIME] == []
    gone = covered(missed(hits, job))
    # Every plan from the first to the test's start is missed or ran on time (the latest, when the
    # test began within ON_TIME of a whole minute).
    on_time = [p for p in ran(hits, job) if p <= t0]
    assert gone[0] == first and len(gone) + len(on_time) >= 11 and gone[-1] <= t0
    assert len(on_time) <= 1 and all(p == gone[-1] + MINUTE for p in on_time), (gone, on_time)
    nxt = one(hits, "SELECT next_start FROM pgsched.job_stats WHERE job_id = %s", job)
    assert nxt > t0 and (nxt == gone[-1] + MINUTE or ran(hits, job))
    assert total_missed(hits, job) == len(gone)


def test_schedule_delay_makes_a_plan_eligible_that_long_after_its_time(db: str, hits: Conn) -> None:
    job = one(hits, "SELECT add_job('hit', '1 second', initial_start => date_trunc('second', now()) + "
                    "interval '1 second')")
    hits.execute("UPDATE pgsched.job SET schedule_delay = interval '1.5 seconds' WHERE job_id = %s", (job,))
    hits.execute("UPDATE pgsched.job_stat SET next_start = next_start + interval '1.5 seconds' WHERE job_id = %s",
                 (job,))
    serve(db, lambda: len(ran(hits, job)) >= 4, timeout=15)
    rows = hits.execute("SELECT plan_time, started_at FROM pgsched.job_history WHERE job_id = %s "
                        "AND outcome = 'success' ORDER BY run_id", (job,)).fetchall()
    for plan, started in rows:
        assert plan.microsecond == 0, plan  # plans stay on the schedule's grid
        assert started - plan >= timedelta(seconds=1.5), (plan, started)
        assert started - plan < timedelta(seconds=2.5), (plan, started)
    # The job reads its own plan time, not the delayed start.
    effects = [r[0] for r in hits.execute("SELECT plan_time FROM hits WHERE job_id = %s ORDER BY 1", (job,))]
    assert effects == [p for p, _ in rows]


def test_changing_schedule_delay_during_a_run_drops_no_plan(db: str, hits: Conn) -> None:
    hits.execute("""CREATE PROCEDURE public.slow_hit(job_id int, config jsonb) LANGUAGE plpgsql AS $$
                    BEGIN INSERT INTO hits VALUES (job_id, current_setting('pgsched.plan_time')::timestamptz);
                          PERFORM pg_sleep(1.2); END $$""")
    job = one(hits, "SELECT add_job('slow_hit', '2 seconds', initial_start => date_trunc('second', now()) + "
                    "interval '1 second', schedule_delay => '1 second')")
    origin = one(hits, "SELECT initial_start FROM pgsched.jobs WHERE job_id = %s", job)
    changed: list[bool] = []

    def until() -> bool:
        if not changed and one(hits, "SELECT count(*) FROM pgsched.job_run WHERE job_id = %s AND outcome = "
                                     "'running'", job):
            hits.execute("SELECT alter_job(%s, schedule_delay => '0')", (job,))
            changed.append(True)
        return len(ran(hits, job)) >= 3

    serve(db, until, timeout=15)
    plans = ran(hits, job)
    # Every plan is on the schedule's grid, and each grid slot from the first to the last run was
    # run or recorded as skipped.
    assert all((p - origin) % timedelta(seconds=2) == timedelta(0) for p in plans), (origin, plans)
    skipped = [r[0] for r in hits.execute("SELECT result FROM pgsched.job_history WHERE job_id = %s "
                                          "AND outcome = 'skipped'", (job,))]
    covered = {datetime.fromisoformat(r["first"]) + k * timedelta(seconds=2)
               for r in skipped for k in range(r["count"])}
    grid = {plans[0] + k * timedelta(seconds=2) for k in range(int((plans[-1] - plans[0]) / timedelta(seconds=2)) + 1)}
    assert grid <= set(plans) | covered, (plans, skipped)


def test_none_counts_lateness_from_the_plans_jittered_start(db: str, hits: Conn) -> None:
    """A plan that waited for its jitter (README "Jitter") is not late for that: found 3 s after
    its delayed start, a catch_up = 'none' plan runs even though its plan time is 20-60 s ago."""
    job = one(hits, "SELECT add_job('hit', '1 minute', catch_up => 'none', jitter => '1 minute')")
    # A plan instant P whose delay J(P) is over 20 s and P + J(P) is 3 s ago (+- 0.5 s): the
    # schedule's grid is anchored on P (initial_start a day before it).
    plan = one(hits, """
        SELECT p FROM (SELECT now() - interval '3 seconds' - d * interval '1 millisecond' AS p
                         FROM generate_series(20000, 59999) d) c
         WHERE abs(extract(epoch FROM c.p + pgsched._jitter_us(%s, c.p, 60000000) * interval '1 microsecond'
                                        - (now() - interval '3 seconds'))) < 0.5
         LIMIT 1""", job)
    hits.execute("UPDATE pgsched.job SET initial_start = %s - interval '1 day' WHERE job_id = %s", (plan, job))
    hits.execute("UPDATE pgsched.job_stat SET next_start = %s WHERE job_id = %s", (plan, job))
    serve(db, lambda: bool(ran(hits, job)) or bool(missed(hits, job)), timeout=10)
    assert (ran(hits, job), missed(hits, job)) == ([plan], [])


class _StoppedClock:
    """The scheduler's clock held at one instant: the catch-up decision's 'now' is the test's."""

    def __init__(self, at: datetime) -> None:
        self.at = at

    def now(self) -> datetime:
        return self.at

    def anchor(self, db_now: datetime, rtt: float = 0.0) -> None:
        pass


@pytest.mark.parametrize(("before_plan", "latest_is_that_plan"), [
    (timedelta(milliseconds=6), True),  # within claim_ahead: the next claim takes it ahead, so it is the latest
    (timedelta(milliseconds=30), False),  # beyond it: the plan before is the latest
])
def test_latest_is_taken_at_the_claims_horizon(db: str, hits: Conn, before_plan: timedelta,
                                               latest_is_that_plan: bool) -> None:
    # The decision a few ms before a plan is due: with a 'now' of the decision's own, 'latest'
    # chose the plan before, and the claim 8 ms later started it a whole period late (CI, 3d0d824).
    job, _ = behind_job(hits)
    plan = one(hits, "SELECT date_trunc('minute', now()) - interval '2 minutes'")
    sched = Scheduler(Settings(dsn=db, claim_ahead=0.02), clock=_StoppedClock(plan - before_plan))
    sched.store = Store(db, sched.clock)
    try:
        sched._catch_up()
    finally:
        sched.store.close()
    chosen = one(hits, "SELECT next_start FROM pgsched.job_stat WHERE job_id = %s", job)
    assert chosen == (plan if latest_is_that_plan else plan - MINUTE)
