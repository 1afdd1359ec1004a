"""Exclusion windows (a job's `exclude` setting): which planned starts a job does not run.

A window is a 5-field cron expression read at minute resolution in the job's time zone: a
plan whose local wall-clock minute matches is not run but recorded as skipped, with the
reason. The scheduler applies it where it takes a plan to run (pgsched/dispatch.py), so the
rule is the same whatever wrote the plan (add_job, alter_job, a catch-up decision, the end of
the previous run), and `next_allowed` plans past the window in one step, the plans inside it
counted rather than claimed one by one. An instant in a repeated hour (autumn's fall-back)
has the same wall minute both times and is excluded both times; a wall time in spring's gap
does not exist, so no instant matches it. Pure: no clock, no database.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from pgsched import schedule
from pgsched.cron import Cron, ScheduleError, matches_minute, parse_cron, utc
from pgsched.schedule import Schedule

FORM = ("a cron expression of 5 fields (min hour dom month dow) naming the minutes in which the job does "
        "not run, such as '* 2 * * *' (02:00-02:59) or '* * 25 12 *' (Christmas Day), in the job's time zone")
# Steps (excluded minutes or whole hours in a row) next_allowed takes before it gives up and the
# job is disabled: a window with no way out within them (every minute of a whole month is 744
# steps) leaves the job nothing to run.
MAX_MINUTES = 100_000
_MINUTE = timedelta(minutes=1)
_MICRO = timedelta(microseconds=1)


def parse(expr: str) -> Cron:
    """The window of `expr`; ScheduleError('exclude') names what is wrong (as SQL's _check_settings)."""
    if expr.strip().startswith("@") or len(expr.split()) != 5:
        raise ScheduleError("exclude", f"'{expr}' is not a cron expression of 5 fields; exclude must be {FORM}")
    try:
        window = parse_cron(expr)
    except ScheduleError as e:
        raise ScheduleError("exclude", f"{e.message}; exclude must be {FORM}") from None
    if covers_every_minute(window):
        raise ScheduleError("exclude", f"'{expr}' excludes every minute: the job would never run; "
                                       f"exclude must be {FORM}")
    return window


def covers_every_minute(window: Cron) -> bool:
    """Whether every minute of every day matches (SQL's _check_settings has the same rule)."""
    every_day = (window.dom_any and window.dow_any) or len(window.days) == 31 or len(window.weekdays) == 7
    return len(window.minutes) == 60 and len(window.hours) == 24 and len(window.months) == 12 and every_day


def excluded(window: Cron, tz: ZoneInfo, t: datetime) -> bool:
    """Whether the instant `t` falls in a minute of the window, read in `tz`."""
    return matches_minute(window, utc(t).astimezone(tz))


@dataclass(frozen=True)
class Passed:
    """Where a job goes on after an excluded plan: its next plan outside the window (None: none
    within MAX_MINUTES), and the further excluded plans passed over on the way (count, last)."""

    plan: datetime | None
    count: int = 0
    last: datetime | None = None


def next_allowed(s: Schedule, window: Cron, *, plan_time: datetime, finish: datetime) -> Passed:
    """After the excluded plan `plan_time`, skipped at `finish`: the first plan outside the window.

    The next plan is the schedule's as after a run that ended at `finish`; while it falls in an
    excluded minute, every plan up to the end of that minute (of its local hour, where the window
    has every minute of the hour) is passed over, counted, and the search goes on from there: an
    excluded hour of a job every second costs one step, not 3,600. (A DST change falls on a
    local hour boundary, so none lies inside a step.)
    """
    nxt = schedule.next_after_success(s, plan_time=plan_time, finish=finish)
    whole_hours = len(window.minutes) == 60
    count, last = 0, None
    for _ in range(MAX_MINUTES):
        if not excluded(window, s.tz, nxt):
            return Passed(nxt, count, last)
        wall = utc(nxt).astimezone(s.tz)
        step_end = utc(nxt) - timedelta(seconds=wall.second, microseconds=wall.microsecond) + \
            (_MINUTE * (60 - wall.minute) if whole_hours else _MINUTE)
        more, _, more_last = schedule.skipped_slots(s, plan_time=nxt, finish=step_end - _MICRO, limit=10_000_000)
        count += 1 + more
        last = more_last or nxt
        nxt = schedule.next_after_success(s, plan_time=nxt, finish=step_end - _MICRO)
    return Passed(None, count, last)
