"""pgsched's cron engine against croniter 7, an independent implementation used as an oracle.

Owns the differential test of ``pgsched.schedule`` (parse_cron, cron_next) against croniter
(``second_at_beginning=True`` for pgsched's seconds-first 6/7-field forms,
``implement_cron_bug=True`` for Vixie cron's day-field rule, which pgsched and pg_cron follow),
and one small test per difference the README documents ("Schedules"), so that the
documentation is itself tested.

The random test draws 5-, 6- and 7-field expressions in the syntax both engines share (numbers,
names, ranges, steps, lists, ``?``, ``L``, ``d#n``, last weekday, macros, years), a time zone
and a start instant, mostly close to a real DST transition, and compares the next ``FIRES``
firings of each engine. Only the documented differences are set aside, each under a named
constant below; everything else must agree to the second.

    PGSCHED_ORACLE_N=20000 .venv/bin/python -m pytest -q tests/unit/test_cron_oracle.py

runs the large version (default: ``DEFAULT_N`` expressions, a second or two);
``PGSCHED_ORACLE_SEED`` draws a different sample.
"""

from __future__ import annotations

import os
import random
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from croniter import CroniterBadCronError, CroniterBadDateError, CroniterUnsupportedSyntaxError, croniter

from pgsched.schedule import Cron, ScheduleError, cron_next, cron_next_n, parse_cron, zone

DEFAULT_N = 1000
N = int(os.environ.get("PGSCHED_ORACLE_N", str(DEFAULT_N)))
SEED = int(os.environ.get("PGSCHED_ORACLE_SEED", "20261122"))
FIRES = 5  # firings compared per expression and start

# Zones with the transitions that matter: Berlin and New York (one-hour shifts at 02:00 local,
# on different dates), Lord Howe (a 30-minute shift, southern hemisphere), Sao Paulo (its
# gap was at midnight, so the day itself starts at 01:00; DST ended in 2019).
ZONES = ("UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "America/Sao_Paulo")
YEARS = range(2016, 2031)

# -- the documented differences ----------------------------------------------------------------
# Each is either never generated (syntax) or set aside from the compared firings (DST), and
# each has its own test below that pins what both engines do.

# pgsched fires a wall time that occurs twice (autumn fall-back) once, at its first
# occurrence; croniter fires it again on the second pass. Set aside: croniter's firings on
# the second pass of a repeated hour (pgsched must have none there, and that is compared).
FALL_BACK_SECOND_PASS = "croniter fires the repeated hour's second pass"

# pgsched fires matching wall times that do not exist (spring-forward gap) once, at the first
# instant after the gap. croniter agrees when the hour field is restricted and the second is
# 0; with an unrestricted hour (`*`, all 24) it skips the gap's times, and a seconds field
# moves its firing to that second after the gap (03:00:15, not 03:00:00). Set aside: firings
# of either engine in the minute after a spring-forward transition whose wall time does not
# match the expression -- which is only ever a gap being resolved.
SPRING_GAP_RESOLUTION = "gap resolution: croniter skips the gap's times or keeps their second"

# `a/n` in day-of-week: pgsched reads it as `a-7/n` (Vixie cron and pg_cron have only the
# range form, where 7 is Sunday), croniter as `a-6/n` and `7/n` as `0/n`. The two differ
# when the steps from a >= 1 reach 7 (`1/2`, `3/2`, `1/3`, `1/6`, any `7/n`): never generated.
DOW_STEP_FROM_VALUE_REACHING_SUNDAY = "dow a/n with a >= 1 reaching 7"

# croniter reads an equal range `a-a` (`5-5`, `JAN-JAN`) as the whole field; pgsched as `a`.
# Never generated.
EQUAL_RANGE = "a-a range"

# `d#n` and the last weekday with a restricted day-of-month: pgsched applies the day rule (either
# field matches), croniter ignores the day-of-month. croniter also refuses plain weekdays and
# `d#n` in one list. Generated only with an unrestricted day-of-month and not mixed.
NTH_WEEKDAY_WITH_DAY_OF_MONTH = "d#n or dL with a restricted day-of-month"

# croniter takes a day-of-month list with 31 distinct entries for `*`, counting `L` as one: so
# `2-31,L` (30 days and L) runs every day. Never generated.
THIRTY_DAYS_AND_L = "a day-of-month list of 30 days and L"

# Spellings, translated rather than excluded: pgsched's `$` (last day of month) is croniter's
# `L`; pgsched's last weekday `dL` (`5L`, `FRIL`) is croniter's `Ld` with a number (`L5`).


# -- generating expressions in both spellings --------------------------------------------------
_MONTH_NAMES = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
_DAY_NAMES = ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")


@dataclass(frozen=True)
class Spec:
    """A field's value range and names (value -> name)."""

    name: str
    lo: int
    hi: int
    names: dict[int, str]


SECOND = Spec("second", 0, 59, {})
MINUTE = Spec("minute", 0, 59, {})
HOUR = Spec("hour", 0, 23, {})
DOM = Spec("day-of-month", 1, 31, {})
MONTH = Spec("month", 1, 12, {i + 1: n for i, n in enumerate(_MONTH_NAMES)})
# 7 is Sunday too; its name SUN stands for 7 only as a range end (pgsched's 'FRI-SUN').
DOW = Spec("day-of-week", 0, 7, dict(enumerate(_DAY_NAMES)))


def _value(rng: random.Random, spec: Spec, v: int, *, range_end: bool = False) -> str:
    name = spec.names.get(0 if range_end and v == 7 else v)
    if name and rng.random() < 0.3:
        return rng.choice([name, name.lower(), name.title()])
    return str(v)


def _dow_step_differs(a: int, n: int) -> bool:
    return a == 7 or (a >= 1 and (7 - a) % n == 0)  # DOW_STEP_FROM_VALUE_REACHING_SUNDAY


def _item(rng: random.Random, spec: Spec) -> str:
    """One list item: n, a-b, a/n or a-b/n (never an equal range: EQUAL_RANGE)."""
    span = spec.hi - spec.lo
    kind = rng.choice(["n", "n", "range", "step", "rangestep"])
    if kind == "n":
        return _value(rng, spec, rng.randint(spec.lo, spec.hi))
    a, b = sorted(rng.sample(range(spec.lo, spec.hi + 1), 2))
    if kind == "range":
        return f"{_value(rng, spec, a)}-{_value(rng, spec, b, range_end=True)}"
    n = rng.randint(1, max(1, span // 2))
    if kind == "step":
        while spec is DOW and _dow_step_differs(a, n):
            a, n = rng.randint(0, 6), rng.randint(1, 4)
        return f"{_value(rng, spec, a)}/{n}"
    return f"{_value(rng, spec, a)}-{_value(rng, spec, b, range_end=True)}/{n}"


def _field(rng: random.Random, spec: Spec, *, common: str | None = None) -> str:
    """A plain field: '*', '*/n', an item or a list of items; ``common`` is a frequent value."""
    r = rng.random()
    if common is not None and r < 0.35:
        return common
    if r < 0.5:
        return "*"
    if r < 0.6:
        return f"*/{rng.randint(1, spec.hi)}"  # a step is at most the largest value (as pg_cron)
    if r < 0.8:
        return _item(rng, spec)
    return ",".join(_item(rng, spec) for _ in range(rng.randint(2, 3)))


def _day_fields(rng: random.Random) -> tuple[str, str, str, str]:
    """(dom, dow) in pgsched's spelling, then in croniter's."""
    r = rng.random()
    if r < 0.15:
        # last day of month, alone or in a list: pgsched spells it 'L' or '$', croniter 'L'
        items = [rng.choice(["L", "$"])] + [_item(rng, DOM) for _ in range(rng.randint(0, 1))]
        rng.shuffle(items)
        dom = ",".join(items)
        if len(parse_cron(f"0 0 {dom} * *").days) == 30:  # THIRTY_DAYS_AND_L
            return _day_fields(rng)
        dow = _field(rng, DOW)
        return dom, dow, dom.replace("$", "L"), dow
    if r < 0.3:
        # nth / last weekdays: with an unrestricted day-of-month only, and not mixed with plain
        # weekdays (NTH_WEEKDAY_WITH_DAY_OF_MONTH)
        dom = rng.choice(["*", "?", f"*/{rng.randint(2, 10)}"])
        nth: list[str] = []
        nth_c: list[str] = []
        for _ in range(rng.randint(1, 2)):
            d = rng.randint(0, 7)
            if rng.random() < 0.5:
                k = rng.randint(1, 5)
                nth.append(f"{_value(rng, DOW, d)}#{k}")
                nth_c.append(f"{d}#{k}")
            else:
                nth.append(f"{_value(rng, DOW, d)}L")
                nth_c.append(f"L{d}")  # croniter's spelling takes a number only
        return dom, ",".join(nth), dom, ",".join(nth_c)
    dom = rng.choice(["?", _field(rng, DOM)]) if r < 0.35 else _field(rng, DOM)
    dow = _field(rng, DOW)
    if dom == "?" and dow == "?":
        dow = "*"
    return dom, dow, dom, dow


def _year_field(rng: random.Random, start_year: int) -> str:
    # around the start: some expressions run out of years, and both engines must then stop
    lo, hi = max(1970, start_year - 3), min(2099, start_year + 12)
    r = rng.random()
    if r < 0.3:
        return "*"
    a, b = sorted(rng.sample(range(lo, hi + 1), 2))
    if r < 0.5:
        return str(rng.randint(start_year, hi))
    if r < 0.7:
        return f"{a}-{b}"
    if r < 0.85:
        return f"{a}/{rng.randint(1, 5)}"
    return ",".join(str(y) for y in sorted(rng.sample(range(lo, hi + 1), 3)))


_MACROS = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")


def expression(rng: random.Random, start_year: int) -> tuple[str, str]:
    """A random expression in pgsched's spelling and the same one in croniter's."""
    if rng.random() < 0.03:
        macro = rng.choice(_MACROS)
        return macro, macro
    nfields = rng.choice([5, 6, 7])
    minute = _field(rng, MINUTE, common="0")
    # hours 1-3 are where the transitions of these zones happen
    hour = _field(rng, HOUR, common=rng.choice(["1", "2", "3", "1-3", "2-4"]))
    dom, dow, dom_c, dow_c = _day_fields(rng)
    month = _field(rng, MONTH)
    fields = [minute, hour, dom, month, dow]
    fields_c = [minute, hour, dom_c, month, dow_c]
    if nfields >= 6:
        second = _field(rng, SECOND, common="0")
        fields.insert(0, second)
        fields_c.insert(0, second)
    if nfields == 7:
        year = _year_field(rng, start_year)
        fields.append(year)
        fields_c.append(year)
    return " ".join(fields), " ".join(fields_c)


def _transitions(tz: ZoneInfo) -> list[datetime]:
    """The instants in YEARS at which ``tz`` changes its UTC offset (to the second)."""

    def offset(ts: int) -> timedelta | None:
        return datetime.fromtimestamp(ts, tz).utcoffset()

    out = []
    day = 86400
    ts, end = (int(datetime(y, 1, 1, tzinfo=UTC).timestamp()) for y in (YEARS.start, YEARS.stop))
    for lo in range(ts, end, day):
        hi = lo + day
        if offset(lo) != offset(hi):  # transitions are months apart: at most one per day
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if offset(mid) == offset(lo) else (lo, mid)
            out.append(datetime.fromtimestamp(hi, UTC))
    return out


TRANSITIONS = {name: _transitions(ZoneInfo(name)) for name in ZONES}


def start_instant(rng: random.Random, tz_name: str) -> datetime:
    """Mostly close to one of the zone's transitions, so frequent and daily expressions cross it."""
    transitions = TRANSITIONS[tz_name]
    micro = rng.choice([0, 0, 0, 500_000])  # croniter works on float timestamps: no 1 µs edges
    if not transitions or rng.random() < 0.15:
        first = datetime(YEARS.start, 1, 1, tzinfo=UTC)
        seconds = rng.randint(0, (YEARS.stop - YEARS.start) * 365 * 86400)
        return first + timedelta(seconds=seconds, microseconds=micro)
    near = rng.choice(transitions)
    spread = rng.choice([120, 2 * 3600, 2 * 3600, 3 * 86400, 40 * 86400])
    return near + timedelta(seconds=rng.randint(-spread, spread), microseconds=micro)


# -- running both engines ----------------------------------------------------------------------
UTC_ZONE = zone("UTC")
_SECOND = timedelta(seconds=1)


def ours(cron: Cron, tz: ZoneInfo, start: datetime) -> tuple[list[datetime], bool]:
    """pgsched's next FIRES firings (UTC) and whether it stopped early (no firing left)."""
    out: list[datetime] = []
    t = start
    try:
        for _ in range(FIRES):
            t = cron_next(cron, tz, t)
            out.append(t)
    except ScheduleError:
        return out, True
    return out, False


def theirs(expr: str, tz: ZoneInfo, start: datetime) -> tuple[list[datetime], bool]:
    """croniter's next FIRES firings (UTC) and whether it stopped early."""
    it = croniter(expr, start.astimezone(tz), second_at_beginning=True, implement_cron_bug=True)
    out: list[datetime] = []
    try:
        for _ in range(FIRES):
            out.append(it.get_next(datetime).astimezone(UTC))
    except CroniterBadDateError:
        return out, True
    return out, False


def _matches(cron: Cron, wall: datetime) -> bool:
    """Whether the naive local ``wall`` time is one the expression names (UTC has no DST)."""
    t = wall.replace(tzinfo=UTC)
    try:
        return cron_next(cron, UTC_ZONE, t - _SECOND) == t
    except ScheduleError:
        return False


def _offset(t: datetime, tz: ZoneInfo) -> timedelta:
    off = t.astimezone(tz).utcoffset()
    assert off is not None
    return off


def set_aside(cron: Cron, tz: ZoneInfo, fire: datetime, *, croniter_side: bool) -> str | None:
    """The documented difference a firing only one engine has belongs to, if any."""
    local = fire.astimezone(tz)
    if croniter_side and local.fold == 1 and _offset(local.replace(fold=0), tz) != local.utcoffset():
        return FALL_BACK_SECOND_PASS
    # pgsched resolves a gap to its first instant exactly; croniter to a second within the minute
    window = timedelta(minutes=1) if croniter_side else _SECOND
    if _offset(fire - window, tz) < _offset(fire, tz) and not _matches(cron, local.replace(tzinfo=None)):
        return SPRING_GAP_RESOLUTION
    return None


@dataclass
class Outcome:
    """What one comparison run found."""

    expressions: int = 0
    firings: int = 0  # firings both engines have, compared
    near_transition: int = 0  # ... of which within 3 hours of a DST transition
    never: int = 0  # expressions both engines say can never fire
    set_aside: Counter[str] = field(default_factory=Counter)
    mismatches: list[str] = field(default_factory=list)


def _near_transition(t: datetime, tz: ZoneInfo) -> bool:
    return _offset(t - timedelta(hours=3), tz) != _offset(t + timedelta(hours=3), tz)


def _show(fires: list[datetime], end: bool, tz: ZoneInfo) -> list[str]:
    return [f.astimezone(tz).isoformat() for f in fires] + (["no more"] if end else [])


def compare_one(out: Outcome, ours_expr: str, theirs_expr: str, tz: ZoneInfo, start: datetime) -> None:
    """Compare both engines' next firings of one expression after ``start``; record into ``out``."""
    where = f"{ours_expr!r} (croniter {theirs_expr!r}) in {tz.key} after {start.isoformat()}"
    out.expressions += 1
    try:
        cron = parse_cron(ours_expr)
    except ScheduleError:
        # pgsched refuses an impossible date at once ('0 0 30 2 *'); croniter must find none
        try:
            refused = theirs(theirs_expr, tz, start)
        except (CroniterBadCronError, CroniterUnsupportedSyntaxError) as e:
            out.mismatches.append(f"{where}: both refuse it, croniter as bad syntax ({e})")
            return
        if refused != ([], True):
            out.mismatches.append(f"{where}: pgsched refuses it, croniter fires {refused[0]}")
        out.never += 1
        return
    try:
        b, b_end = theirs(theirs_expr, tz, start)
    except (CroniterBadCronError, CroniterUnsupportedSyntaxError) as e:
        out.mismatches.append(f"{where}: croniter refuses it: {e}")
        return
    a, a_end = ours(cron, tz, start)
    # Each list is a prefix of its engine's sequence: compare up to where both are complete.
    ends = [x[-1] for x, end in ((a, a_end), (b, b_end)) if not end]
    horizon = min(ends) if ends else None
    a_cut = [f for f in a if horizon is None or f <= horizon]
    b_cut = [f for f in b if horizon is None or f <= horizon]
    # A firing both engines have is compared whatever it is; one only one engine has must be
    # a documented difference.
    reasons: list[str] = []
    kept: list[list[datetime]] = []
    for mine, other, croniter_side in ((a_cut, b_cut, False), (b_cut, a_cut, True)):
        keep = []
        for f in mine:
            reason = None if f in other else set_aside(cron, tz, f, croniter_side=croniter_side)
            if reason:
                reasons.append(reason)
            else:
                keep.append(f)
        kept.append(keep)
    if kept[0] != kept[1] or (horizon is None and a_end != b_end):
        out.mismatches.append(
            f"{where}:\n    pgsched  {_show(a, a_end, tz)}\n    croniter {_show(b, b_end, tz)}")
        return
    out.set_aside.update(reasons)
    out.firings += len(kept[0])
    out.near_transition += sum(_near_transition(f, tz) for f in kept[0])


def compare(n: int, seed: int) -> Outcome:
    """``n`` random expressions, zones and starts drawn from ``seed``."""
    rng = random.Random(seed)
    out = Outcome()
    for _ in range(n):
        tz_name = rng.choice(ZONES)
        start = start_instant(rng, tz_name)
        ours_expr, theirs_expr = expression(rng, start.year)
        compare_one(out, ours_expr, theirs_expr, ZoneInfo(tz_name), start)
    return out


def test_pgsched_matches_croniter_on_random_expressions_across_dst() -> None:
    out = compare(N, SEED)
    summary = (f"{out.expressions} expressions, {out.firings} firings compared ({out.near_transition} within"
               f" 3 h of a DST transition), {out.never} never fire; set aside: {dict(out.set_aside)}")
    print(summary)
    first = "\n".join(out.mismatches[:5])
    assert out.mismatches == [], f"{len(out.mismatches)} mismatches ({summary}); first:\n{first}"
    # the sample must reach what it is meant to test
    assert out.firings >= 3 * N
    assert out.near_transition >= N // 10


# Hourly, sub-hourly and daily forms whose firings fall on the transition hours.
SWEEP = ("0 * * * *", "30 * * * *", "*/20 * * * *", "15 30 * * * *", "0 30 1-3 * * *", "30 2 * * *", "0 0 * * *")


def test_every_transition_of_every_zone() -> None:
    """Every transition of YEARS in every zone, from 2.5 hours before it."""
    out = Outcome()
    for tz_name, transitions in TRANSITIONS.items():
        for t in transitions:
            for expr in SWEEP:
                compare_one(out, expr, expr, ZoneInfo(tz_name), t - timedelta(minutes=150))
    first = "\n".join(out.mismatches[:5])
    assert out.mismatches == [], f"{len(out.mismatches)} mismatches of {out.expressions}; first:\n{first}"
    assert out.set_aside[FALL_BACK_SECOND_PASS] > 0 and out.set_aside[SPRING_GAP_RESOLUTION] > 0


# -- the documented differences, pinned --------------------------------------------------------
BERLIN = ZoneInfo("Europe/Berlin")


def _ours_local(expr: str, tz: ZoneInfo, after: datetime, n: int) -> list[str]:
    return [t.astimezone(tz).isoformat() for t in cron_next_n(parse_cron(expr), tz, after, n)]


def _theirs_local(expr: str, tz: ZoneInfo, after: datetime, n: int) -> list[str]:
    it = croniter(expr, after.astimezone(tz), second_at_beginning=True, implement_cron_bug=True)
    return [it.get_next(datetime).isoformat() for _ in range(n)]


def test_fall_back_repeated_time_runs_once_in_pgsched_twice_in_croniter() -> None:
    # Berlin 2026-10-25: 03:00 CEST becomes 02:00 CET, so 02:30 happens twice.
    after = datetime(2026, 10, 25, 0, 10, tzinfo=UTC)  # 02:10 CEST
    assert _ours_local("30 2 * * *", BERLIN, after, 2) == ["2026-10-25T02:30:00+02:00", "2026-10-26T02:30:00+01:00"]
    assert _theirs_local("30 2 * * *", BERLIN, after, 2) == ["2026-10-25T02:30:00+02:00", "2026-10-25T02:30:00+01:00"]


@pytest.mark.parametrize(
    ("expr", "tz_name", "after", "pgsched", "croniter_first"),
    [
        # restricted hour, second 0: both run at the first instant after the gap
        ("30 2 * * *", "Europe/Berlin", datetime(2026, 3, 29, 0, 40, tzinfo=UTC),
         "2026-03-29T03:00:00+02:00", "2026-03-29T03:00:00+02:00"),
        ("30 2 * * *", "America/New_York", datetime(2026, 3, 8, 6, 0, tzinfo=UTC),
         "2026-03-08T03:00:00-04:00", "2026-03-08T03:00:00-04:00"),
        ("10 2 * * *", "Australia/Lord_Howe", datetime(2026, 10, 3, 14, 0, tzinfo=UTC),
         "2026-10-04T02:30:00+11:00", "2026-10-04T02:30:00+11:00"),
        # unrestricted hour: croniter skips the time that does not exist
        ("30 * * * *", "Europe/Berlin", datetime(2026, 3, 29, 0, 40, tzinfo=UTC),
         "2026-03-29T03:00:00+02:00", "2026-03-29T03:30:00+02:00"),
        ("10 * * * *", "Australia/Lord_Howe", datetime(2026, 10, 3, 15, 20, tzinfo=UTC),
         "2026-10-04T02:30:00+11:00", "2026-10-04T03:10:00+11:00"),
        # a seconds field: croniter keeps the second after the gap
        ("15 30 2 * * *", "Europe/Berlin", datetime(2026, 3, 29, 0, 40, tzinfo=UTC),
         "2026-03-29T03:00:00+02:00", "2026-03-29T03:00:15+02:00"),
    ],
)
def test_spring_gap(expr: str, tz_name: str, after: datetime, pgsched: str, croniter_first: str) -> None:
    tz = ZoneInfo(tz_name)
    assert _ours_local(expr, tz, after, 1) == [pgsched]
    assert _theirs_local(expr, tz, after, 1) == [croniter_first]


def test_dow_step_from_a_value_reaches_sunday_in_pgsched_only() -> None:
    after = datetime(2026, 1, 1, tzinfo=UTC)  # a Thursday
    utc = ZoneInfo("UTC")
    # pgsched: 1/2 is 1-7/2 = Mon, Wed, Fri, Sun; croniter: 1-6/2 = Mon, Wed, Fri
    assert parse_cron("0 0 * * 1/2").weekdays == parse_cron("0 0 * * 1-7/2").weekdays == (0, 1, 3, 5)
    days = ["2026-01-02", "2026-01-04", "2026-01-05", "2026-01-07"]
    assert [t[:10] for t in _ours_local("0 0 * * 1/2", utc, after, 4)] == days
    assert [t[:10] for t in _theirs_local("0 0 * * 1/2", utc, after, 4)] == ["2026-01-02", "2026-01-05",
                                                                         "2026-01-07", "2026-01-09"]
    # 7/2: Sunday only in pgsched; croniter reads 7 as 0 and steps from there (Sun, Tue, Thu, Sat)
    assert parse_cron("0 0 * * 7/2").weekdays == (0,)
    assert [t[:10] for t in _theirs_local("0 0 * * 7/2", utc, after, 4)] == ["2026-01-03", "2026-01-04",
                                                                         "2026-01-06", "2026-01-08"]
    # with a start of 0 they agree
    assert _ours_local("0 0 * * 0/2", utc, after, 6) == _theirs_local("0 0 * * 0/2", utc, after, 6)


def test_equal_range_is_one_value_in_pgsched_and_the_whole_field_in_croniter() -> None:
    after = datetime(2026, 1, 1, tzinfo=UTC)
    utc = ZoneInfo("UTC")
    assert _ours_local("5-5 * * * *", utc, after, 2) == ["2026-01-01T00:05:00+00:00", "2026-01-01T01:05:00+00:00"]
    assert _theirs_local("5-5 * * * *", utc, after, 2) == ["2026-01-01T00:01:00+00:00", "2026-01-01T00:02:00+00:00"]


def test_thirty_days_and_l_are_not_every_day() -> None:
    after = datetime(2026, 4, 1, 12, tzinfo=UTC)
    utc = ZoneInfo("UTC")
    # the 2nd to the 31st, and the last day: not April 1st (nor May 1st)
    assert [t[:10] for t in _ours_local("0 0 2-31,L * *", utc, after, 30)][-2:] == ["2026-04-30", "2026-05-02"]
    # croniter counts 31 entries and reads the field as '*'
    assert [t[:10] for t in _theirs_local("0 0 2-31,L * *", utc, after, 30)][-2:] == ["2026-04-30", "2026-05-01"]


def test_nth_weekday_with_a_restricted_day_of_month() -> None:
    after = datetime(2026, 1, 1, tzinfo=UTC)
    utc = ZoneInfo("UTC")
    # pgsched: the 15th or the third Friday (the day rule); croniter: the third Friday only
    assert [t[:10] for t in _ours_local("0 0 15 * 5#3", utc, after, 4)] == ["2026-01-15", "2026-01-16",
                                                                        "2026-02-15", "2026-02-20"]
    assert [t[:10] for t in _theirs_local("0 0 15 * 5#3", utc, after, 4)] == ["2026-01-16", "2026-02-20",
                                                                          "2026-03-20", "2026-04-17"]
    # plain weekdays and d#n in one list: pgsched accepts (Mondays and the third Friday)
    assert [t[:10] for t in _ours_local("0 0 * * 1,5#3", utc, after, 4)] == ["2026-01-05", "2026-01-12",
                                                                         "2026-01-16", "2026-01-19"]
    with pytest.raises(CroniterUnsupportedSyntaxError):
        croniter("0 0 * * 1,5#3", after)


def test_spellings_of_last_day_and_last_weekday() -> None:
    after = datetime(2026, 1, 1, tzinfo=UTC)
    utc = ZoneInfo("UTC")
    # '$' is pgsched's other spelling of L; croniter has only L
    assert _ours_local("0 0 $ * *", utc, after, 3) == _theirs_local("0 0 L * *", utc, after, 3)
    # the last Friday: pgsched 5L (Quartz's spelling), croniter L5
    assert _ours_local("0 0 * * 5L", utc, after, 3) == _theirs_local("0 0 * * L5", utc, after, 3)
    for expr in ("0 0 $ * *", "0 0 * * 5L"):
        with pytest.raises(CroniterBadCronError):
            croniter(expr, after)


def test_seconds_first_six_and_seven_fields_agree() -> None:
    after = datetime(2026, 3, 1, 12, 0, 7, tzinfo=UTC)
    for expr in ("*/15 30 9-17 * * MON-FRI", "10 0 0 1 1 ? 2027-2029"):
        assert _ours_local(expr, BERLIN, after, 3) == _theirs_local(expr, BERLIN, after, 3)
