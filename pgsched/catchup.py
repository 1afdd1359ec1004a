"""Catch-up policy: which of a job's due plans run, and which are recorded as missed.

A job is *behind* when its next plan came due and, by the time a scheduler looks,
later plans are due too (the schedulers were down, or every worker was busy). Per
job (job.catch_up):

* ``latest`` (default): run the most recent due plan once; the older ones are missed.
* ``all``: run every due plan, oldest first, no further back than catch_up_window, and
  at most max_plans_per_tick of them each time the job is found behind (the older ones
  are missed). A job runs one plan at a time, so the replay is sequential: after each
  run the next plan is the next slot after the one that ran (see `after_run`).
* ``none``: run only plans that are on time: a plan found more than ON_TIME (or
  catch_up_window, if smaller) after it became eligible is missed, and the job waits for
  its next future plan.

For every mode, a plan older than catch_up_window is missed. Missed plans are never
dropped silently: the caller records their count and range ('missed' history row,
job_stat.total_missed).

Plans are plan times; ``horizon`` is the latest plan time that is eligible now, i.e.
now - schedule_delay. Pure: no clock, no database.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from pgsched import schedule
from pgsched.cron import utc
from pgsched.schedule import Schedule

# How late a plan of a catch_up = 'none' job may start and still count as on time.
ON_TIME = timedelta(seconds=10)
# Slots enumerated at most when a job is far behind (a cron job every second after a
# day of downtime); beyond this the count of missed plans is a lower bound.
MAX_SLOTS = 200_000


@dataclass(frozen=True)
class Policy:
    mode: str = "latest"  # latest | all | none
    window: timedelta | None = None
    max_plans: int = 100


@dataclass(frozen=True)
class Decision:
    """The plan to run next, and the due plans passed over (count, first, last)."""

    plan: datetime
    missed: int = 0
    first_missed: datetime | None = None
    last_missed: datetime | None = None


def _minus(t: datetime, window: timedelta) -> datetime | None:
    """`t - window`; None (no limit) for a window reaching before the year 1, which the API takes."""
    try:
        return t - window
    except OverflowError:
        return None


def decide(s: Schedule, policy: Policy, *, plan: datetime, horizon: datetime) -> Decision:
    """For a job whose next plan is ``plan`` (due: plan <= horizon), what runs next.

    Returns ``Decision(plan)`` unchanged when the job is not behind.
    """
    plan, horizon = utc(plan, "plan"), utc(horizon, "horizon")
    if plan > horizon:
        return Decision(plan)
    oldest = None if policy.window is None else _minus(horizon, policy.window)
    if policy.mode == "none":
        grace = ON_TIME if policy.window is None else min(ON_TIME, policy.window)
        oldest = horizon - grace
    if not s.aligned:
        # Drifting: no grid of plans, just one that is late; only 'none' passes it over.
        if policy.mode == "none" and oldest is not None and plan < oldest:
            assert s.interval is not None
            return Decision(schedule.add_interval(horizon, s.interval, s.tz), 1, plan, plan)
        return Decision(plan)
    due = [plan, *schedule.previous_slots(s, since=plan, now=horizon, limit=MAX_SLOTS)]
    keep = [p for p in due if oldest is None or p >= oldest]
    if policy.mode == "all":
        keep = keep[-policy.max_plans:]
    elif keep:
        keep = keep[-1:]
    if keep and keep[0] == plan:
        return Decision(plan)
    missed = due[: len(due) - len(keep)]
    # Nothing left to run now: the next plan is the first one after the horizon.
    nxt = keep[0] if keep else schedule.next_after_success(s, plan_time=due[-1], finish=horizon)
    return Decision(nxt, len(missed), missed[0], missed[-1])


def after_run(s: Schedule, policy: Policy, *, plan_time: datetime, horizon: datetime) -> Decision | None:
    """Next plan of a catch_up = 'all' job after the run of ``plan_time``: the next slot, even if due.

    None for the other modes (and drifting schedules): their next start is the usual
    one, with overrun slots recorded as skipped.
    """
    if policy.mode != "all" or not s.aligned:
        return None
    nxt = schedule.next_after_success(s, plan_time=plan_time, finish=plan_time)
    return decide(s, policy, plan=nxt, horizon=horizon)
