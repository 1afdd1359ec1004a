"""Exclusion windows (a job's `exclude` setting): which planned starts a job does not run.

A window is a 5-field cron expression read at minute resolution in the job's time zone: a
plan whose local wall-clock minute matches is not run but recorded as skipped, with the
reason. The scheduler applies it where it takes a plan to run (pgsched/dispatch.py), so the
rule is the same whatever wrote the plan (add_job, alter_job, a catch-up decision, the end of
the previous run), and `next_allowed` plans past the window in one step, the plans inside it
counted rather than claimed one by one. An instant in a repeated hour (autumn's fall-back)
has the same wall minute both times and is excluded both times; a wall time in spring's gap
does not exist, so no instant matches it. Pure: no clock, no database.

Also owns the rule of which windows are refused (`leaves_no_start`: the window would leave a
cron schedule no start; `covers_every_minute`: it would leave any schedule none), which
sql/api/10_jobs.sql's _check_settings applies in SQL (pgsched._exclude_leaves_no_start,
checked against this one by tests/integration/test_exclusion.py).
"""

from __future__ import annotations

from contextlib import suppress
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo

from pgsched import schedule
from pgsched.cron import (
    Cron,
    ScheduleError,
    cron_next,
    day_list,
    matches_minute,
    month_days,
    parse_cron,
    resolve_local,
    utc,
)
from pgsched.schedule import Schedule

FORM = ("a cron expression of 5 fields (min hour dom month dow) naming the minutes in which the job does "
        "not run, such as '* 2 * * *' (02:00-02:59) or '* * 25 12 *' (Christmas Day), in the job's time zone")
# Stretches of the window an interval schedule's plans may fall in, one after the other, before
# next_allowed gives up and the job is disabled. Each costs tens of microseconds, so a bad row
# (a window that takes every plan, written past the API, which cannot tell for an interval)
# costs the scheduler's loop a few milliseconds once. A cron schedule is never searched step by
# step: its way out of the window is found in one go (_free_firing).
MAX_STEPS = 32
# Excluded plans of a cron schedule counted one by one (each a cron search, ~40 us) after the
# first; beyond it the count is a lower bound (Passed.more). An interval's are counted exactly
# by arithmetic, whatever their number.
CRON_COUNT_LIMIT = 32
_INTERVAL_COUNT_LIMIT = 10**12
# Wall-clock steps of _wall_exit: a stretch of the window ends within a month of whole window
# days of each shape, and every month shape recurs within 28 years.
_EXIT_STEPS = 12 * 28 + 100
_MINUTE = timedelta(minutes=1)
_HOUR = timedelta(hours=1)
_DAY = timedelta(days=1)
_MICRO = timedelta(microseconds=1)


def _month_shapes() -> dict[int, tuple[int, ...]]:
    """Per month, years whose month has each (weekday of the 1st, length) that month ever has.

    Which days a cron's day fields match depends on nothing else, and 2000-2027 holds every
    shape (28 years of the Gregorian calendar, exact from 1901 to 2099), so these years stand
    for all of them. sql/api/10_jobs.sql's _exclude_leaves_no_start picks the same years.
    """
    out: dict[int, tuple[int, ...]] = {}
    for m in range(1, 13):
        first: dict[tuple[int, int], int] = {}
        for y in range(2000, 2028):
            first.setdefault((date(y, m, 1).weekday(), month_days(y, m)), y)
        out[m] = tuple(sorted(first.values()))
    return out


_SHAPES = _month_shapes()
_EVERY_MINUTE = parse_cron("* * * * *")


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


def check_pair(cron: Cron, window: Cron) -> None:
    """ScheduleError('exclude') if `window` leaves the cron schedule no start (SQL's _check_settings)."""
    if leaves_no_start(cron, window):
        raise ScheduleError("exclude", f"'{window}' leaves schedule '{cron}' no start: every minute in which "
                                       f"it fires is excluded; exclude must be {FORM}")


def covers_every_minute(window: Cron) -> bool:
    """Whether every minute of every day is in the window: it would leave any schedule no start."""
    return leaves_no_start(_EVERY_MINUTE, window)


@lru_cache(maxsize=1024)
def leaves_no_start(cron: Cron, window: Cron) -> bool:
    """Whether every wall-clock minute in which `cron` fires is in `window`.

    Both are products of minutes, hours and days, so the question splits: some minute or hour
    of the schedule's outside the window's is a way out on every day it fires; otherwise only a
    day it fires on that the window does not name is. Days are compared month shape by month
    shape (_SHAPES), or over the schedule's own years: exact, and about 100 day lists.
    (Wall-clock: a start that only spring's gap moves out of the window does not count.)
    """
    if not (set(cron.minutes) <= set(window.minutes) and set(cron.hours) <= set(window.hours)):
        return False
    months = ([(y, m) for y in cron.years for m in cron.months] if cron.years is not None
              else [(y, m) for m in cron.months for y in _SHAPES[m]])
    return not any(_free_days(cron, window, y, m) for y, m in months)


def _free_days(cron: Cron, window: Cron, y: int, m: int) -> list[int]:
    """The days of month m of year y on which `cron` fires and that `window` does not name."""
    days = day_list(cron, y, m)
    if not days or m not in window.months:
        return days
    named = set(day_list(window, y, m))
    return [d for d in days if d not in named]


def excluded(window: Cron, tz: ZoneInfo, t: datetime) -> bool:
    """Whether the instant `t` falls in a minute of the window, read in `tz`."""
    return matches_minute(window, utc(t).astimezone(tz))


@dataclass(frozen=True)
class Passed:
    """Where a job goes on after an excluded plan: its next plan outside the window (None: none
    found, `why` says why), and the further excluded plans passed over on the way (count, last;
    `more`: there were more than counted, last is the last counted)."""

    plan: datetime | None
    count: int = 0
    last: datetime | None = None
    more: bool = False
    why: str = ""


def first_allowed(window: Cron, tz: ZoneInfo, t: datetime) -> datetime | None:
    """`t` if it is out of the window, else the end of the window's stretch it falls in (None: the
    window has no end there)."""
    return t if not excluded(window, tz, t) else _exit(window, tz, t)


def next_allowed(s: Schedule, window: Cron, *, plan_time: datetime, finish: datetime) -> Passed:
    """After the excluded plan `plan_time`, skipped at `finish`: the first plan outside the window.

    The next plan is the schedule's as after a run that ended at `finish`. A cron schedule goes
    straight to its first firing outside the window (_free_firing), or to None at once if it
    has none (leaves_no_start). An interval schedule jumps to the end of the stretch of the
    window its plan falls in (_wall_exit) and takes its first plan from there, at most
    MAX_STEPS times. Either way the plans passed over are counted, not claimed one by one.
    """
    nxt = schedule.next_after_success(s, plan_time=plan_time, finish=finish)
    if s.cron is not None:
        return _past_cron(s, s.cron, window, nxt)
    count, last, more = 0, None, False
    for _ in range(MAX_STEPS):
        if not excluded(window, s.tz, nxt):
            return Passed(nxt, count, last, more)
        out = _exit(window, s.tz, nxt)
        if out is None:
            return Passed(None, count, last, more, "the window has no end")
        n, _, n_last = schedule.skipped_slots(s, plan_time=nxt, finish=out - _MICRO, limit=_INTERVAL_COUNT_LIMIT)
        count, last = count + 1 + n, n_last or nxt
        nxt = schedule.next_after_success(s, plan_time=nxt, finish=out - _MICRO)
    return Passed(None, count, last, more, f"its next plans fall in {MAX_STEPS} stretches of the window in a "
                                           f"row (up to {nxt.isoformat()})")


def _past_cron(s: Schedule, cron: Cron, window: Cron, nxt: datetime) -> Passed:
    if not excluded(window, s.tz, nxt):
        return Passed(nxt)
    if leaves_no_start(cron, window):
        return Passed(None, why="every minute in which it fires is excluded")
    count, last, more = 0, None, False
    # A firing out of the window on the wall clock may still be in it as an instant (spring's gap
    # moves it to the first instant after the gap): then search again from there.
    for _ in range(8):
        found = _free_firing(cron, window, s.tz, nxt)
        if found is None:
            break
        n, _, n_last = schedule.skipped_slots(s, plan_time=nxt, finish=found - _MICRO, limit=CRON_COUNT_LIMIT)
        count, last, more = count + 1 + n, n_last or nxt, more or n == CRON_COUNT_LIMIT
        if not excluded(window, s.tz, found):
            return Passed(found, count, last, more)
        nxt = found
    return Passed(None, count, last, more, f"it found no firing out of the window after {nxt.isoformat()}")


def _free_firing(cron: Cron, window: Cron, tz: ZoneInfo, after: datetime) -> datetime | None:
    """The first firing of `cron` after `after` whose wall minute is out of the window (None: none).

    Its ways out (leaves_no_start): its minutes outside the window's (a cron of those minutes),
    its hours outside the window's, and the days it fires on that the window does not name.
    """
    found: list[datetime] = []
    for part in (replace(cron, minutes=tuple(m for m in cron.minutes if m not in window.minutes)),
                 replace(cron, hours=tuple(h for h in cron.hours if h not in window.hours))):
        if part.minutes and part.hours:
            with suppress(ScheduleError):  # no firing left (a year field run out)
                found.append(cron_next(part, tz, after))
    day = _free_day_firing(cron, window, tz, after, before=min(found, default=None))
    if day is not None:
        found.append(day)
    return min(found, default=None)


def _free_day_firing(cron: Cron, window: Cron, tz: ZoneInfo, after: datetime,
                     before: datetime | None) -> datetime | None:
    """The first firing after `after` on a day `cron` fires on that the window does not name,
    if it is earlier than `before`; None otherwise. Month by month, at most 28 years ahead."""
    local = utc(after).astimezone(tz)
    y, m = local.year, local.month
    last_year = min(cron.years[-1] if cron.years else y + 28, y + 28)
    while y <= last_year:
        if before is not None and datetime(y, m, 1, tzinfo=tz) > before:
            return None
        if m in cron.months and (cron.years is None or y in cron.years):
            for d in _free_days(cron, window, y, m):
                if (y, m, d) < (local.year, local.month, local.day):
                    continue
                start = resolve_local(datetime(y, m, d), tz) - _MICRO
                t = cron_next(cron, tz, max(utc(after), start))
                if t.astimezone(tz).date() == date(y, m, d):
                    return t
        y, m = (y + 1, 1) if m == 12 else (y, m + 1)
    return None


def _exit(window: Cron, tz: ZoneInfo, t: datetime) -> datetime | None:
    """The first instant after `t` (in the window) that is out of it: its wall-clock end, made an
    instant after `t` (in autumn's repeated hour, the second pass's)."""
    wall = _wall_exit(window, utc(t).astimezone(tz).replace(tzinfo=None))
    if wall is None:
        return None
    first = resolve_local(wall, tz)
    if first > t:
        return first
    second = wall.replace(tzinfo=tz, fold=1).astimezone(UTC)
    return second if second > t else None


def _wall_exit(w: Cron, wall: datetime) -> datetime | None:
    """The first wall-clock minute after `wall`'s that is out of the window `w`.

    Jumps by the largest unit the window covers whole: the rest of an hour, of a day, of a month,
    so a window of a month of Sundays costs a few steps, not 40,000 minutes.
    """
    minutes, hours = set(w.minutes), set(w.hours)
    t = wall.replace(second=0, microsecond=0)
    for _ in range(_EXIT_STEPS):
        if not (t.month in w.months and t.day in day_list(w, t.year, t.month) and t.hour in hours
                and t.minute in minutes):
            if t > wall:
                return t
            t += _MINUTE
            continue
        free_minute = next((m for m in range(t.minute + 1, 60) if m not in minutes), None)
        if free_minute is not None:
            return t.replace(minute=free_minute)
        if len(w.minutes) < 60:  # the next hour has a free minute, or is free itself
            t = t.replace(minute=0) + _HOUR
            continue
        free_hour = next((h for h in range(t.hour + 1, 24) if h not in hours), None)
        if free_hour is not None:
            return t.replace(hour=free_hour, minute=0)
        if len(w.hours) < 24:
            t = t.replace(hour=0, minute=0) + _DAY
            continue
        named = day_list(w, t.year, t.month)
        free_day = next((d for d in range(t.day + 1, month_days(t.year, t.month) + 1) if d not in named), None)
        if free_day is not None:
            return t.replace(day=free_day, hour=0, minute=0)
        t = datetime(t.year + 1, 1, 1) if t.month == 12 else datetime(t.year, t.month + 1, 1)
    return None
