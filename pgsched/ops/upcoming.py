"""`pgsched next`: a schedule's next start times, computed by pgsched's own schedule code
(pgsched.schedule), so it works without PL/Python. Pure: the time comes in."""

from __future__ import annotations

from datetime import datetime, timedelta

from pgsched import schedule
from pgsched.schedule import Schedule


def parse(expr: str, timezone: str | None) -> Schedule:
    """A schedule given on the command line: a cron expression or an interval ('15 minutes');
    ScheduleError (naming the argument and the accepted form) otherwise."""
    tz = schedule.zone(timezone)
    if schedule.looks_like_cron(expr):
        return Schedule(interval=None, cron=schedule.parse_cron(expr), tz=tz)
    return Schedule(interval=schedule.parse_interval(expr), cron=None, fixed=True, tz=tz)


def next_starts(s: Schedule, *, first: datetime, n: int, delay: timedelta = timedelta(0)) -> list[datetime]:
    """`n` start times from `first` (a start, i.e. a plan + delay). After the first, each is the
    next after a run of the previous plan that took no time: exact for fixed and cron schedules,
    the earliest possible for a drifting interval (which counts from each run's end)."""
    out = [first]
    plan = schedule.plan_of(first, delay)
    while len(out) < n:
        plan = schedule.next_after_success(s, plan_time=plan, finish=plan)
        out.append(schedule.eligible_at(plan, delay))
    return out
