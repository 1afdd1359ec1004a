"""Catch-up policy (pgsched.catchup): which due plans run and which are missed, on an explicit clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from pgsched.catchup import ON_TIME, Decision, Policy, after_run, decide
from pgsched.schedule import Interval, Schedule, parse_cron

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
MIN = timedelta(minutes=1)


def every_minute() -> Schedule:
    return Schedule(interval=Interval(0, 0, 60_000_000), cron=None, fixed=True, origin=T0)


def test_a_job_that_is_not_behind_is_left_alone() -> None:
    for mode in ("latest", "all", "none"):
        assert decide(every_minute(), Policy(mode), plan=T0, horizon=T0 + timedelta(seconds=5)) == Decision(T0)
        # Not yet due at all.
        assert decide(every_minute(), Policy(mode), plan=T0 + MIN, horizon=T0) == Decision(T0 + MIN)


def test_latest_runs_the_most_recent_due_plan_and_misses_the_older_ones() -> None:
    d = decide(every_minute(), Policy("latest"), plan=T0, horizon=T0 + 10 * MIN + timedelta(seconds=30))
    assert d == Decision(T0 + 10 * MIN, 10, T0, T0 + 9 * MIN)


def test_latest_with_a_window_runs_nothing_older_than_it() -> None:
    # Every due plan is older than the window: none runs, the next future one is planned.
    d = decide(every_minute(), Policy("latest", window=timedelta(seconds=20)), plan=T0,
               horizon=T0 + 5 * MIN + timedelta(seconds=30))
    assert d == Decision(T0 + 6 * MIN, 6, T0, T0 + 5 * MIN)


def test_all_replays_every_due_plan_within_the_window_oldest_first() -> None:
    horizon = T0 + 10 * MIN + timedelta(seconds=30)
    assert decide(every_minute(), Policy("all"), plan=T0, horizon=horizon) == Decision(T0)
    d = decide(every_minute(), Policy("all", window=timedelta(minutes=3)), plan=T0, horizon=horizon)
    # Plans at 7:30..10:30 back from the horizon are inside: 8, 9, 10 run; 0..7 are missed.
    assert d == Decision(T0 + 8 * MIN, 8, T0, T0 + 7 * MIN)


def test_all_keeps_at_most_max_plans_per_tick() -> None:
    d = decide(every_minute(), Policy("all", max_plans=4), plan=T0, horizon=T0 + 10 * MIN)
    assert d == Decision(T0 + 7 * MIN, 7, T0, T0 + 6 * MIN)


def test_all_after_a_run_takes_the_next_slot_even_when_it_is_past() -> None:
    s = every_minute()
    assert after_run(s, Policy("all"), plan_time=T0, horizon=T0 + 5 * MIN) == Decision(T0 + MIN)
    # ... but not one older than the window.
    d = after_run(s, Policy("all", window=timedelta(minutes=2)), plan_time=T0, horizon=T0 + 5 * MIN)
    assert d == Decision(T0 + 3 * MIN, 2, T0 + MIN, T0 + 2 * MIN)
    assert after_run(s, Policy("latest"), plan_time=T0, horizon=T0 + 5 * MIN) is None
    assert after_run(s, Policy("none"), plan_time=T0, horizon=T0 + 5 * MIN) is None


def test_none_runs_only_plans_on_time() -> None:
    s = every_minute()
    on_time = T0 + ON_TIME - timedelta(seconds=1)
    assert decide(s, Policy("none"), plan=T0, horizon=on_time) == Decision(T0)
    late = T0 + ON_TIME + timedelta(seconds=1)
    assert decide(s, Policy("none"), plan=T0, horizon=late) == Decision(T0 + MIN, 1, T0, T0)
    # After downtime every due plan is missed; the next one is in the future.
    d = decide(s, Policy("none"), plan=T0, horizon=T0 + 3 * MIN + timedelta(seconds=30))
    assert d == Decision(T0 + 4 * MIN, 4, T0, T0 + 3 * MIN)
    # A window smaller than ON_TIME is stricter.
    d = decide(s, Policy("none", window=timedelta(seconds=2)), plan=T0, horizon=T0 + timedelta(seconds=3))
    assert d == Decision(T0 + MIN, 1, T0, T0)


def test_cron_schedules_catch_up_on_their_firings() -> None:
    s = Schedule(interval=None, cron=parse_cron("*/15 * * * *"), tz=ZoneInfo("UTC"))
    d = decide(s, Policy("latest"), plan=T0, horizon=T0 + timedelta(hours=1, minutes=5))
    assert d == Decision(T0 + timedelta(hours=1), 4, T0, T0 + timedelta(minutes=45))


def test_drifting_schedules_have_no_grid_to_catch_up() -> None:
    s = Schedule(interval=Interval(0, 0, 60_000_000), cron=None, fixed=False)
    horizon = T0 + 10 * MIN
    assert decide(s, Policy("latest"), plan=T0, horizon=horizon) == Decision(T0)
    assert decide(s, Policy("all"), plan=T0, horizon=horizon) == Decision(T0)
    assert decide(s, Policy("none"), plan=T0, horizon=horizon) == Decision(horizon + MIN, 1, T0, T0)
    assert after_run(s, Policy("all"), plan_time=T0, horizon=horizon) is None


@pytest.mark.parametrize("mode", ["latest", "all", "none"])
def test_every_due_plan_is_either_run_or_counted_missed(mode: str) -> None:
    s = every_minute()
    horizon = T0 + 37 * MIN + timedelta(seconds=10)
    policy = Policy(mode, window=timedelta(minutes=9), max_plans=5)
    d = decide(s, policy, plan=T0, horizon=horizon)
    ran: list[datetime] = []
    plan: datetime | None = d.plan
    missed = d.missed
    while plan is not None and plan <= horizon:
        ran.append(plan)
        nxt = after_run(s, policy, plan_time=plan, horizon=horizon)
        plan = nxt.plan if nxt else None
        missed += nxt.missed if nxt else 0
    assert len(ran) + missed == 38, (ran, missed)
    assert ran == sorted(set(ran))



def test_a_window_reaching_before_the_year_1_is_no_limit() -> None:
    """catch_up_window '3000000 days' is taken by the API; horizon - window does not exist."""
    now = T0 + 10 * MIN + timedelta(seconds=30)
    unlimited = decide(every_minute(), Policy("all"), plan=T0, horizon=now)
    assert decide(every_minute(), Policy("all", window=timedelta(days=3_000_000)), plan=T0, horizon=now) == unlimited
