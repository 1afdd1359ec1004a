"""Cron expressions: the dialect pgsched accepts, its parser and the next-firing search.

This module owns what a cron string means.  ``pgsched.schedule`` re-exports everything
public here and is the name other code imports; the split only keeps each file small.

Dialect
    5 fields ``minute hour day-of-month month day-of-week``; 6 fields put SECONDS FIRST
    (``second minute hour dom month dow``); 7 fields add a year last (1970-2099).
    Per field: ``*``, ``n``, ``a-b``, ``*/n``, ``a/n``, ``a-b/n`` and comma lists.  Months
    JAN-DEC and days SUN-SAT by name (any case); day-of-week 0-7 with 0 and 7 both Sunday.
    ``?`` means ``*`` in day-of-month and day-of-week.  ``L`` (or ``$``) in day-of-month is the
    month's last day; ``d#n`` (n 1-5) the n-th weekday d of the month; ``dL`` the month's last
    weekday d.  Macros @yearly @annually @monthly @weekly @daily @midnight @hourly.
    When both day fields are restricted a day matches if EITHER matches; a field that
    begins with ``*`` (``*``, ``*/2``) or is ``?`` counts as unrestricted, and then both
    must match. That is Vixie cron's rule, which pg_cron follows.

Time and DST
    Expressions are matched against LOCAL wall-clock time in the schedule's zone.  A matching
    wall time that does not exist (spring-forward gap) fires at the first instant after the
    gap, so all the gap's matching times collapse into one firing; a wall time that occurs
    twice (fall-back overlap) fires once, at its first occurrence.  Consequence: an hourly job
    fires 23 times on the spring day and also 23 times on the autumn day (the repeated hour's
    second pass is not a new wall time), and an every-minute job sees one firing for the gap.

Pure: stdlib only (PL/Python imports this in the server's own Python) and no clock.
"""

from __future__ import annotations

import math
import re
from bisect import bisect_left
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

_SECOND = timedelta(seconds=1)
_FORMS = "expected 5 fields (min hour dom month dow), 6 (sec first) or 7 (sec first, year last)"
_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_MONTH_NAMES = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
_MONTHS = {n: i + 1 for i, n in enumerate(_MONTH_NAMES)}
_DAYS = {n: i for i, n in enumerate(("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"))}
_NAMES = "|".join([*_MONTHS, *_DAYS])
_LOOKS_FIELD = re.compile(rf"(?:[0-9*/,?LW#$-]|{_NAMES})+", re.IGNORECASE)
_ITEM = re.compile(r"(\*|\?|\w+(?:-\w+)?)(?:/(\w+))?")
_MDAYS = (0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
_MAX_MDAYS = (0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
_LAST_YEAR = 9998  # datetime stops at 9999; leave room for UTC offsets


class ScheduleError(ValueError):
    """Bad schedule input.

    ``argument`` is the API argument at fault ('schedule', 'timezone', 'initial_start',
    'schedule_interval', ...); ``str(e)`` names it and says which form is accepted.
    """

    argument: str
    message: str

    def __init__(self, argument: str, message: str) -> None:
        super().__init__(f"invalid {argument}: {message}")
        self.argument = argument
        self.message = message


@dataclass(frozen=True)
class Cron:
    """A parsed cron expression; every field is a sorted tuple of allowed values."""

    expr: str  # normalised text: single spaces, names upper case, macros lower case
    seconds: tuple[int, ...]
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: tuple[int, ...]  # plain day-of-month values
    months: tuple[int, ...]
    weekdays: tuple[int, ...]  # 0 = Sunday
    years: tuple[int, ...] | None  # None: any year
    last_day: bool = False
    nth_weekdays: tuple[tuple[int, int], ...] = ()  # (weekday, n)
    last_weekdays: tuple[int, ...] = ()
    # The field begins with '*' or is '?' (Vixie's DOM_STAR/DOW_STAR): then a day must
    # match both day fields, otherwise either.
    dom_any: bool = True
    dow_any: bool = True

    def __str__(self) -> str:
        return self.expr


def looks_like_cron(text: str) -> bool:
    """Whether ``text`` is shaped like cron (a macro, or 5-7 fields of cron characters/names).

    Used to tell a cron schedule from an interval literal such as '1 day'; it does not
    validate, parse_cron does.
    """
    stripped = text.strip()
    if stripped.lower() in _MACROS:
        return True
    fields = stripped.split()
    return 5 <= len(fields) <= 7 and all(_LOOKS_FIELD.fullmatch(f) for f in fields)


def _is_leap(y: int) -> bool:
    return y % 4 == 0 and (y % 100 != 0 or y % 400 == 0)


def month_days(y: int, m: int) -> int:
    """Days in month ``m`` of year ``y`` (Gregorian)."""
    return 29 if m == 2 and _is_leap(y) else _MDAYS[m]


class _Field:
    def __init__(self, expr: str, name: str, lo: int, hi: int, names: dict[str, int]) -> None:
        self.expr, self.name, self.lo, self.hi, self.names = expr, name, lo, hi, names

    def fail(self, what: str) -> ScheduleError:
        msg = f"cron expression '{self.expr}': field '{self.name}' {what}; {_FORMS}"
        return ScheduleError("schedule", msg)

    def value(self, token: str, *, range_end: bool = False) -> int:
        if token.isdigit():
            v = int(token)
        elif token in self.names:
            v = self.names[token]
            # 'FRI-SUN' should mean Friday through Sunday, not a reversed range
            if range_end and self.name == "day-of-week" and v == 0:
                v = 7
        else:
            raise self.fail(f"has bad value '{token}'")
        if not self.lo <= v <= self.hi:
            raise self.fail(f"value {v} out of range {self.lo}-{self.hi}")
        return v

    def expand(self, text: str) -> set[int]:
        out: set[int] = set()
        for item in text.split(","):
            m = _ITEM.fullmatch(item)
            if not m:
                raise self.fail(f"has bad item '{item}'" if item else "has an empty item")
            base, step_text = m.group(1), m.group(2)
            if base == "?" and (text != "?" or self.name not in ("day-of-month", "day-of-week")):
                raise self.fail("allows '?' only alone, in day-of-month or day-of-week")
            if base in ("*", "?"):
                first, last = self.lo, self.hi
            elif "-" in base:
                a, b = base.split("-")
                first, last = self.value(a), self.value(b, range_end=True)
                if first > last:
                    raise self.fail(f"has reversed range {base}")
            else:
                first = self.value(base)
                last = self.hi if step_text else first
            step = 1
            if step_text:
                if not step_text.isdigit() or int(step_text) == 0:
                    raise self.fail(f"has bad step '{step_text}' (expected a positive integer)")
                # pg_cron refuses a step above the field's largest value ('*/60' minutes): it
                # can only mean the first value, so it is more likely a typo than a schedule.
                if len(step_text) > 9 or int(step_text) > self.hi:
                    raise self.fail(f"has step {step_text}, larger than its largest value {self.hi}")
                step = int(step_text)
            out.update(range(first, last + 1, step))
        return out


def parse_cron(expr: str) -> Cron:
    """Parse a cron expression (see the module docstring); raises ScheduleError('schedule')."""
    text = " ".join(expr.split()).upper()
    macro = text.lower()
    fields = _MACROS[macro].split() if macro in _MACROS else text.split()
    if len(fields) not in (5, 6, 7):
        raise ScheduleError("schedule", f"cron expression '{expr}' has {len(fields)} fields; {_FORMS}")
    if len(fields) == 5:
        fields = ["0", *fields]
    norm = macro if macro in _MACROS else text

    def field(name: str, lo: int, hi: int, names: dict[str, int] | None = None) -> _Field:
        return _Field(norm, name, lo, hi, names or {})

    seconds = field("second", 0, 59).expand(fields[0])
    minutes = field("minute", 0, 59).expand(fields[1])
    hours = field("hour", 0, 23).expand(fields[2])
    months = field("month", 1, 12, _MONTHS).expand(fields[4])
    years = field("year", 1970, 2099).expand(fields[6]) if len(fields) == 7 else None

    dom_f = field("day-of-month", 1, 31)
    dom_items = fields[3].split(",")
    last_day = any(i in ("L", "$") for i in dom_items)
    plain = [i for i in dom_items if i not in ("L", "$")]
    if any(i.endswith("W") for i in plain):
        raise dom_f.fail("uses 'W' (nearest weekday), which is not supported")
    days = dom_f.expand(",".join(plain)) if plain else set()

    dow_f = field("day-of-week", 0, 7, _DAYS)
    nth: set[tuple[int, int]] = set()
    lasts: set[int] = set()
    plain = []
    for item in fields[5].split(","):
        if "#" in item:
            wd, _, n = item.partition("#")
            if n not in ("1", "2", "3", "4", "5"):
                raise dow_f.fail(f"has bad '{item}' (expected weekday#n with n 1-5)")
            nth.add((dow_f.value(wd) % 7, int(n)))
        elif len(item) > 1 and item.endswith("L"):
            lasts.add(dow_f.value(item[:-1]) % 7)
        else:
            plain.append(item)
    weekdays = {d % 7 for d in dow_f.expand(",".join(plain))} if plain else set()

    cron = Cron(
        expr=norm,
        seconds=tuple(sorted(seconds)),
        minutes=tuple(sorted(minutes)),
        hours=tuple(sorted(hours)),
        days=tuple(sorted(days)),
        months=tuple(sorted(months)),
        weekdays=tuple(sorted(weekdays)),
        years=tuple(sorted(years)) if years is not None else None,
        last_day=last_day,
        nth_weekdays=tuple(sorted(nth)),
        last_weekdays=tuple(sorted(lasts)),
        dom_any=fields[3].startswith("*") or fields[3] == "?",
        dow_any=fields[5].startswith("*") or fields[5] == "?",
    )
    _check_possible(cron)
    return cron


def _check_possible(c: Cron) -> None:
    # Catch '0 0 31 2 *' without a clock: when day-of-month decides alone, some allowed
    # month must be long enough (February counted as 29).  With a year field the set of
    # months is finite, so it is checked exactly.
    never = ScheduleError("schedule", f"cron expression '{c.expr}' can never fire (no such day); {_FORMS}")
    if c.years is not None:
        if not any(day_list(c, y, m) for y in c.years for m in c.months):
            raise never
    elif (c.dom_any or c.dow_any) and not c.last_day and not any(
        c.days and c.days[0] <= _MAX_MDAYS[m] for m in c.months
    ):
        raise never


def day_list(c: Cron, y: int, m: int) -> list[int]:
    """The days of month ``m`` of year ``y`` that ``c``'s day fields match (its months not looked at)."""
    n = month_days(y, m)
    if len(c.days) == 31 and len(c.weekdays) == 7 and (c.dom_any or c.dow_any):
        return list(range(1, n + 1))  # both fields match every day: the common '* *', without sets
    dom = {d for d in c.days if d <= n}
    if c.last_day:
        dom.add(n)
    first = (date(y, m, 1).weekday() + 1) % 7  # weekday of the 1st, 0 = Sunday
    dow: set[int] = set()
    for wd in c.weekdays:
        dow.update(range(1 + (wd - first) % 7, n + 1, 7))
    for wd, k in c.nth_weekdays:
        d = 1 + (wd - first) % 7 + 7 * (k - 1)
        if d <= n:
            dow.add(d)
    last_wd = (first + n - 1) % 7
    dow.update(n - (last_wd - wd) % 7 for wd in c.last_weekdays)
    # Vixie cron: if either day field begins with '*' both must match, otherwise either may.
    return sorted(dom & dow if c.dom_any or c.dow_any else dom | dow)


def matches_minute(c: Cron, wall: datetime) -> bool:
    """Whether the local wall time's minute matches `c` (its seconds and years are not looked at)."""
    return (wall.minute in c.minutes and wall.hour in c.hours and wall.month in c.months
            and wall.day in day_list(c, wall.year, wall.month))


def _next_wall(c: Cron, lb: datetime, ylimit: int) -> datetime | None:
    """The first local wall time >= lb (whole seconds) that matches, or None up to ylimit."""
    y, mo, d, h, mi, s = lb.year, lb.month, lb.day, lb.hour, lb.minute, lb.second
    # Each step finds the first allowed value >= the current one; when a field runs out the
    # next larger field is bumped and all smaller ones restart at their minimum, so the loop
    # visits at most a few values per field instead of scanning time.
    while y <= ylimit:
        if c.years is not None:
            i = bisect_left(c.years, y)
            if i == len(c.years):
                return None
            if c.years[i] != y:
                y, mo, d, h, mi, s = c.years[i], 1, 1, 0, 0, 0
                continue
        i = bisect_left(c.months, mo)
        if i == len(c.months):
            y, mo, d, h, mi, s = y + 1, 1, 1, 0, 0, 0
            continue
        if c.months[i] != mo:
            mo, d, h, mi, s = c.months[i], 1, 0, 0, 0
        days = day_list(c, y, mo)
        i = bisect_left(days, d)
        if i == len(days):
            mo, d, h, mi, s = mo + 1, 1, 0, 0, 0
            continue
        if days[i] != d:
            d, h, mi, s = days[i], 0, 0, 0
        i = bisect_left(c.hours, h)
        if i == len(c.hours):
            d, h, mi, s = d + 1, 0, 0, 0
            continue
        if c.hours[i] != h:
            h, mi, s = c.hours[i], 0, 0
        i = bisect_left(c.minutes, mi)
        if i == len(c.minutes):
            h, mi, s = h + 1, 0, 0
            continue
        if c.minutes[i] != mi:
            mi, s = c.minutes[i], 0
        i = bisect_left(c.seconds, s)
        if i == len(c.seconds):
            mi, s = mi + 1, 0
            continue
        return datetime(y, mo, d, h, mi, c.seconds[i])
    return None


def utc(t: datetime, name: str = "time") -> datetime:
    """``t`` converted to UTC; naive datetimes are refused (they have no instant)."""
    if t.tzinfo is None or t.utcoffset() is None:
        raise ValueError(f"{name} must be timezone-aware, got naive {t.isoformat()}")
    return t.astimezone(UTC)


def _transition(tz: ZoneInfo, before: datetime, after: datetime) -> datetime:
    """The first instant in (before, after] whose UTC offset is that of ``after``."""
    target = after.astimezone(tz).utcoffset()
    lo, hi = math.floor(before.timestamp()), math.ceil(after.timestamp())
    # tzdata transitions fall on whole seconds, so a bisection over seconds is exact.
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if datetime.fromtimestamp(mid, tz).utcoffset() == target:
            hi = mid
        else:
            lo = mid
    return datetime.fromtimestamp(hi, UTC)


def resolve_local(wall: datetime, tz: ZoneInfo) -> datetime:
    """The UTC instant of naive local ``wall`` in ``tz`` under the DST rule (module docstring)."""
    first = wall.replace(tzinfo=tz).astimezone(UTC)  # fold=0: first occurrence in an overlap
    if first.astimezone(tz).replace(tzinfo=None) == wall:
        return first
    # In a gap fold=0 applies the pre-gap offset (landing after the gap) and fold=1 the
    # post-gap offset (landing before it), so the transition lies between the two.
    return _transition(tz, wall.replace(tzinfo=tz, fold=1).astimezone(UTC), first)


def cron_next(cron: Cron, tz: ZoneInfo, after: datetime) -> datetime:
    """The first firing instant strictly after ``after``, in UTC."""
    after_u = utc(after, "after")
    local = after_u.astimezone(tz)
    if local.fold:
        # In the repeated hour's second pass: every wall time up to the overlap's end has
        # already fired on the first pass, so resume at that end.
        early = local.replace(fold=0).utcoffset()
        late = local.utcoffset()
        assert early is not None and late is not None
        start = _transition(tz, after_u - (early - late), after_u)
        lb = start.replace(tzinfo=None) + early
    else:
        lb = local.replace(tzinfo=None, microsecond=0) + _SECOND
    ylimit = min(cron.years[-1] if cron.years else lb.year + 100, _LAST_YEAR)
    while True:
        wall = _next_wall(cron, lb, ylimit)
        if wall is None:
            raise ScheduleError(
                "schedule",
                f"cron expression '{cron.expr}' never fires after {after_u.isoformat()}"
                f" (searched to the end of {ylimit}); expected an expression with a future firing",
            )
        found = resolve_local(wall, tz)
        if found > after_u:
            return found
        # wall was in a gap whose single firing is not after `after`: continue past the gap
        lb = max(wall + _SECOND, found.astimezone(tz).replace(tzinfo=None))


def cron_next_n(cron: Cron, tz: ZoneInfo, after: datetime, n: int) -> list[datetime]:
    """The next ``n`` firing instants strictly after ``after``, in UTC."""
    out: list[datetime] = []
    t = after
    for _ in range(n):
        t = cron_next(cron, tz, t)
        out.append(t)
    return out


def validate_cron_at(cron: Cron, tz: ZoneInfo, now: datetime) -> None:
    """Raise ScheduleError('schedule') unless ``cron`` fires after ``now`` within 100 years."""
    cron_next(cron, tz, now)
