"""`pgsched next`: a schedule's next start times, computed by pgsched's own schedule code
(pgsched.schedule), so it works without PL/Python. Pure: the time comes in."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from pgsched import exclusion, schedule, store
from pgsched.cron import Cron
from pgsched.schedule import Schedule


def parse(expr: str, timezone: str | None) -> Schedule:
    """A schedule given on the command line: a cron expression or an interval ('15 minutes');
    ScheduleError (naming the argument and the accepted form) otherwise."""
    tz = schedule.zone(timezone)
    if schedule.looks_like_cron(expr):
        return Schedule(interval=None, cron=schedule.parse_cron(expr), tz=tz)
    return Schedule(interval=schedule.parse_interval(expr), cron=None, fixed=True, tz=tz)


def next_starts(s: Schedule, *, first: datetime, n: int, delay: timedelta = timedelta(0),
                window: Cron | None = None) -> list[datetime]:
    """`n` start times from `first` (a start, i.e. a plan + delay). After the first, each is the
    next after a run of the previous plan that took no time: exact for fixed and cron schedules,
    the earliest possible for a drifting interval (which counts from each run's end). Plans in
    the exclusion `window` are left out, as the scheduler skips them (pgsched/exclusion.py);
    fewer than `n` if the window leaves none."""
    out: list[datetime] = []
    plan = schedule.plan_of(first, delay)
    while len(out) < n:
        if window is not None and exclusion.excluded(window, s.tz, plan):
            passed = exclusion.next_allowed(s, window, plan_time=plan, finish=plan)
            if passed.plan is None:
                break
            plan = passed.plan
        out.append(schedule.eligible_at(plan, delay))
        plan = schedule.next_after_success(s, plan_time=plan, finish=plan)
    return out


def job_starts(row: dict[str, Any], *, now: datetime, n: int) -> list[datetime]:
    """A job's next `n` starts from its query.job_schedule row (`pgsched next JOB`, the dashboard's
    job page): from its stored next start, or its first start after `now` if it has none yet."""
    s = store.schedule_from_row(row)
    if s.by_database:
        why = ("it runs after its upstream jobs (depends_on)" if schedule.is_after(row["schedule"])
               else "it runs each time the server starts")
        raise schedule.ScheduleError("schedule", f"{row['schedule'].strip()!r} has no start times of its own: {why}")
    delay = row["schedule_delay"] or timedelta(0)
    first = row["next_start"] or schedule.eligible_at(schedule.first_start(s, now), delay)
    window = exclusion.parse(row["exclude"]) if row.get("exclude") else None
    return next_starts(s, first=first, n=n, delay=delay, window=window)
