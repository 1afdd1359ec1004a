"""Schedule semantics: the one place that decides when a job runs next.

Owns: schedule input validation (ScheduleError), PostgreSQL-style interval arithmetic in a
time zone, fixed (aligned) and drifting interval schedules, cron schedules (the dialect lives
in ``pgsched.cron`` and is re-exported here), first start, next start after success, failure
and crash (exponential backoff with jitter), skipped slots and catch-up slots.

Pure: no database, no clock, no global randomness.  Every function takes the instants it
needs (``now``, ``finish``, ...) and a ``random.Random``; all datetimes must be
timezone-aware (naive ones raise ValueError) and results are in UTC.  Imported by the
scheduler and by PL/Python in the server's own Python, so only the stdlib is used.

DST rule (cron, and the month/day parts of intervals) -- work on LOCAL wall-clock time in the
schedule's zone:

* a wall time that does not exist (spring-forward gap) means the first instant after the gap:
  Europe/Berlin 2026-03-29 02:30 -> 03:00 CEST (01:00 UTC); several such times in one gap
  collapse into that one instant, so a job fires once for the whole gap;
* a wall time that occurs twice (fall-back overlap) means its first occurrence (fold=0), so
  it fires once; an hourly cron job therefore has a two-hour gap on the autumn night (the
  repeated hour's second pass is never a firing).

The time part of an interval is absolute elapsed time (PostgreSQL's timestamptz + interval):
'1 day' keeps 09:00 local across a DST change, '24 hours' does not.

Fixed interval schedules have slots ``origin + k*interval`` (k = 0, 1, ...), each computed
from the origin (so a Jan 31 monthly schedule gives Feb 28, Mar 31, Apr 30); missed slots are
skipped, never run late in a burst.  Drifting schedules start the next run ``interval``
after the previous one finished.  Cron is always aligned.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from pgsched.cron import (
    Cron,
    ScheduleError,
    cron_next,
    cron_next_n,
    looks_like_cron,
    month_days,
    parse_cron,
    resolve_local,
    utc,
    validate_cron_at,
)

__all__ = [
    "Cron",
    "Interval",
    "Schedule",
    "ScheduleError",
    "add_interval",
    "backoff_delay",
    "check_interval",
    "check_new_interval",
    "cron_next",
    "cron_next_n",
    "eligible_at",
    "first_start",
    "is_after",
    "is_restart",
    "looks_like_cron",
    "next_after_crash",
    "next_after_failure",
    "next_after_success",
    "parse_cron",
    "parse_interval",
    "plan_of",
    "previous_slots",
    "skipped_slots",
    "validate_cron_at",
    "zone",
]

_MICRO = timedelta(microseconds=1)
_DAY_US = 86_400_000_000
_MIN_DELAY = timedelta(seconds=1)
# Any reference works as long as it is fixed, so the default cap of a cron schedule
# does not depend on when it is computed.
_CRON_REFERENCE = datetime(2001, 1, 1, tzinfo=UTC)
_FALLBACK_PERIOD = timedelta(days=1)


@dataclass(frozen=True)
class Interval:
    """A PostgreSQL interval: months and days are calendar units, micros is elapsed time."""

    months: int = 0
    days: int = 0
    micros: int = 0

    @classmethod
    def from_timedelta(cls, td: timedelta) -> Interval:
        """Days become calendar days, as psycopg sends a timedelta to PostgreSQL."""
        return cls(0, td.days, td.seconds * 1_000_000 + td.microseconds)

    def approx_timedelta(self) -> timedelta:
        """Length with a month as 30 days and a day as 24 hours (for caps and estimates)."""
        return timedelta(days=30 * self.months + self.days, microseconds=self.micros)

    def __str__(self) -> str:
        sign, us = ("-", -self.micros) if self.micros < 0 else ("", self.micros)
        secs, us = divmod(us, 1_000_000)
        clock = f"{sign}{secs // 3600:02d}:{secs // 60 % 60:02d}:{secs % 60:02d}"
        parts = [f"{self.months} mon{'s' * (abs(self.months) != 1)}"] if self.months else []
        parts += [f"{self.days} day{'s' * (abs(self.days) != 1)}"] if self.days else []
        parts += [clock + (f".{us:06d}" if us else "")] if self.micros or not parts else []
        return " ".join(parts)


_UNITS: dict[str, tuple[str, int]] = {}
for _names, _unit, _factor in (
    (("microsecond", "microseconds", "us", "usec", "usecs"), "micros", 1),
    (("millisecond", "milliseconds", "ms", "msec", "msecs"), "micros", 1_000),
    (("second", "seconds", "s", "sec", "secs"), "micros", 1_000_000),
    (("minute", "minutes", "m", "min", "mins"), "micros", 60_000_000),
    (("hour", "hours", "h", "hr", "hrs"), "micros", 3_600_000_000),
    (("day", "days", "d"), "days", 1),
    (("week", "weeks", "w"), "days", 7),
    (("month", "months", "mon", "mons"), "months", 1),
    (("year", "years", "y", "yr", "yrs"), "months", 12),
):
    for _n in _names:
        _UNITS[_n] = (_unit, _factor)
_INTERVAL_TOKEN = re.compile(r"\s*(?:(\d+(?:\.\d+)?)\s*([a-z]+)|(\d+):(\d{2})(?::(\d{2}(?:\.\d{1,6})?))?)\s*,?", re.I)


def parse_interval(text: str) -> Interval:
    """An interval literal in the subset PostgreSQL and pgsched read alike: '5 minutes',
    '1 day 02:00:00', '1 month', '90 s'. Fractions of days and months spill as PostgreSQL's do."""
    form = "an interval such as '30 seconds', '5 minutes', '1 day 02:00:00' or '1 month'"
    body = text.strip()
    if body.startswith("@"):
        body = body[1:]
    months, days, micros = 0, 0.0, 0.0
    pos, seen = 0, False
    while pos < len(body):
        m = _INTERVAL_TOKEN.match(body, pos)
        if not m or m.end() == pos:
            raise ScheduleError("schedule", f"'{text}' is not an interval: expected {form}")
        pos, seen = m.end(), True
        if m.group(1) is not None:
            unit = _UNITS.get(m.group(2).lower())
            if unit is None:
                raise ScheduleError("schedule", f"'{text}': unknown unit '{m.group(2)}'; expected {form}")
            value = float(m.group(1)) * unit[1]
            if unit[0] == "months":
                whole = int(value)
                months += whole
                days += (value - whole) * 30
            elif unit[0] == "days":
                days += value
            else:
                micros += value
        else:
            micros += (int(m.group(3)) * 3600 + int(m.group(4)) * 60 + float(m.group(5) or 0)) * 1_000_000
    if not seen:
        raise ScheduleError("schedule", f"'{text}' is not an interval: expected {form}")
    whole_days = int(days)
    micros += (days - whole_days) * 86_400_000_000
    return Interval(months, whole_days, round(micros))


def zone(name: str | None) -> ZoneInfo:
    """The IANA time zone ``name``; None or '' means UTC."""
    if not name:
        return ZoneInfo("UTC")
    try:
        return ZoneInfo(name)
    except (KeyError, ValueError, OSError):
        # ZoneInfoNotFoundError is a KeyError; malformed keys ('../x') raise ValueError
        raise ScheduleError(
            "timezone", f"unknown time zone '{name}': expected an IANA name such as 'Europe/Berlin' or 'UTC'"
        ) from None


def check_interval(iv: Interval, *, fixed: bool, argument: str = "schedule") -> None:
    """Reject non-positive intervals and, on fixed schedules, months mixed with days/time."""
    if iv.months < 0 or iv.days < 0 or iv.micros < 0 or not (iv.months or iv.days or iv.micros):
        raise ScheduleError(
            argument,
            f"interval '{iv}' is not positive: expected an interval greater than zero with no negative"
            " part, such as '30 seconds', '1 day' or '1 month'",
        )
    if fixed and iv.months and (iv.days or iv.micros):
        raise ScheduleError(
            argument,
            f"interval '{iv}': month intervals cannot be combined with day or time parts on a fixed"
            " schedule; expected whole months (e.g. '1 month') or days and time (e.g. '30 days')",
        )


# The shortest period a new schedule may have, as pgsched._check_min_period has it: the
# scheduler's own resolution. Only new settings are held to it (a stored shorter one, from
# before the rule, still runs).
MIN_INTERVAL_MICROS = 1000


def check_new_interval(iv: Interval, *, fixed: bool, argument: str = "schedule") -> None:
    """check_interval, and the shortest period a job may be given (1 ms)."""
    check_interval(iv, fixed=fixed, argument=argument)
    if not iv.months and not iv.days and iv.micros < MIN_INTERVAL_MICROS:
        raise ScheduleError(
            argument, f"interval '{iv}' is shorter than 1 millisecond: expected an interval of at least"
            " 1 millisecond, such as '30 seconds'")


def _add_months(wall: datetime, n: int) -> datetime:
    y, m = divmod(wall.year * 12 + wall.month - 1 + n, 12)
    return wall.replace(year=y, month=m + 1, day=min(wall.day, month_days(y, m + 1)))


def add_interval(t: datetime, iv: Interval, tz: ZoneInfo, k: int = 1) -> datetime:
    """``t + k*iv`` as PostgreSQL computes timestamptz + interval with TimeZone = ``tz``.

    Months, then days, move the local calendar date keeping the wall time (DST rule in the
    module docstring); the time part is then added as elapsed time.
    """
    u = utc(t, "t")
    months, days = iv.months * k, iv.days * k
    if months or days:
        wall = u.astimezone(tz).replace(tzinfo=None)
        if months:
            wall = _add_months(wall, months)
        u = resolve_local(wall + timedelta(days=days), tz)
    return u + timedelta(microseconds=iv.micros * k)


RESTART = "@restart"
AFTER = "@after"


def is_restart(text: str) -> bool:
    """Whether a schedule's text is pg_cron's @restart (as sql/api/00_internal.sql reads it)."""
    return text.strip() == RESTART


def is_after(text: str) -> bool:
    """Whether a schedule's text is @after: the job runs after its upstream jobs (README "Dependencies")."""
    return text.strip() == AFTER


@dataclass(frozen=True)
class Schedule:
    """When a job runs: exactly one of ``interval`` and ``cron``, or neither for ``by_database``.

    ``by_database``: the job has no times of its own; the database plans its runs, never the
    functions of this module, which do not take such a schedule (pgsched.state.end_of_run and
    after_crash keep its next start). That is pg_cron's @restart (one run each time the server
    starts: pgsched._arm_restart_jobs) and @after (a run after its upstream jobs succeeded:
    sql/api/07_dependencies.sql).
    """

    interval: Interval | None
    cron: Cron | None
    fixed: bool = True  # ignored for cron, which is always aligned
    origin: datetime | None = None  # initial_start: alignment origin of fixed interval schedules
    tz: ZoneInfo = field(default_factory=lambda: ZoneInfo("UTC"))
    by_database: bool = False

    def __post_init__(self) -> None:
        if self.by_database and (self.interval, self.cron) != (None, None):
            raise ValueError("a by_database Schedule has neither interval nor cron")
        if not self.by_database and (self.interval is None) == (self.cron is None):
            raise ValueError("a Schedule needs exactly one of interval and cron")
        if self.interval is not None:
            check_interval(self.interval, fixed=self.fixed)
        if self.origin is not None:
            utc(self.origin, "origin")

    @property
    def aligned(self) -> bool:
        """Whether runs keep to a grid (fixed interval or cron) rather than drifting."""
        return self.cron is not None or self.fixed


def _slot(s: Schedule, origin: datetime, k: int) -> datetime:
    assert s.interval is not None
    return add_interval(origin, s.interval, s.tz, k)


def _first_slot_after(s: Schedule, origin: datetime, t: datetime) -> tuple[int, datetime]:
    """The smallest k >= 0 whose slot is strictly after ``t``, and that slot."""
    iv = s.interval
    assert iv is not None
    origin, t = utc(origin, "origin"), utc(t)
    if origin > t:
        return 0, origin
    if not (iv.months or iv.days):
        k = (t - origin) // (_MICRO * iv.micros) + 1
        return k, origin + _MICRO * (iv.micros * k)
    # Calendar units make slots uneven, so estimate k from the calendar (months) or the
    # nominal length (days: DST moves a slot by at most an hour or so), then correct it.
    if iv.months:
        a, b = origin.astimezone(s.tz), t.astimezone(s.tz)
        k = ((b.year - a.year) * 12 + b.month - a.month) // iv.months
    else:
        k = (t - origin) // (_MICRO * (iv.days * _DAY_US + iv.micros))
    k = max(k, 0)
    slot = _slot(s, origin, k)
    while k > 0 and slot > t:
        k -= 1
        slot = _slot(s, origin, k)
    while slot <= t:
        k += 1
        slot = _slot(s, origin, k)
    return k, slot


def eligible_at(plan: datetime, delay: timedelta) -> datetime:
    """When a plan may start: its plan time + the job's schedule_delay, as elapsed time (job_stat.next_start).

    The one Python statement of the rule; the SQL one is pgsched._delayed (sql/api/10_jobs.sql).
    """
    return plan + delay


def plan_of(next_start: datetime, delay: timedelta) -> datetime:
    """The plan time a next_start (or any eligible instant) belongs to: the inverse of eligible_at."""
    return next_start - delay


def first_start(s: Schedule, now: datetime) -> datetime:
    """When a newly added (or re-enabled) job first runs.

    Interval: the origin if it is in the future; a fixed schedule with a past origin takes its
    first slot at or after ``now``, a drifting one starts ``now``; no origin means ``now``.
    Cron: the first firing after ``now``, or at/after a future origin.
    """
    now = utc(now, "now")
    origin = utc(s.origin, "origin") if s.origin is not None else None
    if s.cron is not None:
        if origin is not None and origin > now:
            return cron_next(s.cron, s.tz, origin - _MICRO)
        return cron_next(s.cron, s.tz, now)
    if origin is None or origin >= now:
        return now if origin is None else origin
    if not s.fixed:
        return now
    return _first_slot_after(s, origin, now - _MICRO)[1]


def next_after_success(s: Schedule, *, plan_time: datetime, finish: datetime) -> datetime:
    """The next start after a successful run planned at ``plan_time`` that ended at ``finish``.

    Fixed interval: the first slot strictly after both (missed slots are skipped); the origin
    defaults to ``plan_time``.  Drifting: ``finish + interval``.  Cron: the next firing.
    """
    plan_time, finish = utc(plan_time, "plan_time"), utc(finish, "finish")
    # A finish before plan_time (clock skew) must not re-run the same plan.
    after = max(plan_time, finish)
    if s.cron is not None:
        return cron_next(s.cron, s.tz, after)
    assert s.interval is not None
    if not s.fixed:
        return add_interval(finish, s.interval, s.tz)
    return _first_slot_after(s, s.origin or plan_time, after)[1]


def skipped_slots(
    s: Schedule, *, plan_time: datetime, finish: datetime, limit: int = 1000
) -> tuple[int, datetime | None, datetime | None]:
    """Regular slots p with plan_time < p <= finish that came due while a run was in progress.

    Returns (count, first, last) over the counted slots; count stops at ``limit``, and then
    ``last`` is the limit-th slot (there may be more).  Drifting schedules have none.
    """
    plan_time, finish = utc(plan_time, "plan_time"), utc(finish, "finish")
    if limit <= 0 or (s.cron is None and not s.fixed):
        return 0, None, None
    if s.cron is not None:
        found = _cron_between(s.cron, s.tz, plan_time, finish, limit)
        return (len(found), found[0], found[-1]) if found else (0, None, None)
    origin = s.origin or plan_time
    k1, first = _first_slot_after(s, origin, plan_time)
    k2, _ = _first_slot_after(s, origin, finish)
    count = min(k2 - k1, limit)
    if count <= 0:
        return 0, None, None
    return count, first, _slot(s, origin, k1 + count - 1)


def previous_slots(s: Schedule, *, since: datetime, now: datetime, limit: int) -> list[datetime]:
    """Regular plan times p with since < p <= now, oldest first, at most ``limit`` (catch-up).

    A fixed interval schedule without an origin is aligned to ``since``.  Drifting: [].
    """
    since, now = utc(since, "since"), utc(now, "now")
    if s.cron is not None:
        return _cron_between(s.cron, s.tz, since, now, limit)
    if not s.fixed:
        return []
    origin = s.origin or since
    k, slot = _first_slot_after(s, origin, since)
    out: list[datetime] = []
    while slot <= now and len(out) < limit:
        out.append(slot)
        k += 1
        slot = _slot(s, origin, k)
    return out


def _cron_between(cron: Cron, tz: ZoneInfo, lo: datetime, hi: datetime, limit: int) -> list[datetime]:
    out: list[datetime] = []
    t = lo
    while len(out) < limit:
        try:
            t = cron_next(cron, tz, t)
        except ScheduleError:  # no firing left (year field exhausted)
            break
        if t > hi:
            break
        out.append(t)
    return out


def _period(s: Schedule) -> timedelta:
    if s.interval is not None:
        return s.interval.approx_timedelta()
    assert s.cron is not None
    try:
        a = cron_next(s.cron, s.tz, _CRON_REFERENCE)
        return cron_next(s.cron, s.tz, a) - a
    except ScheduleError:  # fewer than two firings: nothing to measure
        return _FALLBACK_PERIOD


def backoff_delay(
    s: Schedule, *, failures: int, retry_period: timedelta, rng: random.Random, cap: timedelta | None = None
) -> timedelta:
    """Delay before retrying after ``failures`` consecutive failures (or crashes), >= 1.

    ``retry_period * 2**(failures-1)`` capped at ``cap`` (default: 5 periods of the schedule,
    months as 30 days; for cron the gap between two firings after a fixed reference), times
    a jitter factor drawn once from ``rng.uniform(0.9, 1.1)``, capped again. The floor is
    1 s, or the retry_period itself when the user asked for less: it only guards against a
    zero delay turning a failing job into a hot loop.
    """
    if failures < 1:
        raise ValueError(f"failures must be >= 1, got {failures}")
    if retry_period < timedelta(0):
        raise ValueError(f"retry_period must not be negative, got {retry_period}")
    cap_us = (cap if cap is not None else 5 * _period(s)) // _MICRO
    # Beyond 2**64 the cap wins anyway; stopping there keeps huge counts cheap.
    base_us = min((retry_period // _MICRO) << min(failures - 1, 64), cap_us)
    jittered = min(round(base_us * rng.uniform(0.9, 1.1)), cap_us)
    floor = min(_MIN_DELAY, retry_period * 0.9) if retry_period > timedelta(0) else _MIN_DELAY
    return max(_MICRO * jittered, floor)


def next_after_failure(
    s: Schedule,
    *,
    plan_time: datetime,
    finish: datetime,
    failures: int,
    retry_period: timedelta,
    rng: random.Random,
    cap: timedelta | None = None,
) -> datetime:
    """``finish`` + backoff; aligned schedules never wait past their next regular slot."""
    delay = backoff_delay(s, failures=failures, retry_period=retry_period, rng=rng, cap=cap)
    t = utc(finish, "finish") + delay
    if s.aligned:
        t = min(t, next_after_success(s, plan_time=plan_time, finish=finish))
    return t


def next_after_crash(
    s: Schedule,
    *,
    plan_time: datetime,
    now: datetime,
    crashes: int,
    retry_period: timedelta,
    rng: random.Random,
    cap: timedelta | None = None,
) -> datetime:
    """Like next_after_failure on the crash count, measured from ``now`` (crash detected)."""
    return next_after_failure(
        s, plan_time=plan_time, finish=now, failures=crashes, retry_period=retry_period, rng=rng, cap=cap
    )
