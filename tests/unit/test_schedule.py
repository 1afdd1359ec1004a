"""Unit tests for pgsched.schedule (and the cron dialect it re-exports): literal datetimes, no clock."""

from __future__ import annotations

import random
import time
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgsched.schedule import (
    Interval,
    Schedule,
    ScheduleError,
    add_interval,
    backoff_delay,
    check_interval,
    check_new_interval,
    cron_next,
    cron_next_n,
    first_start,
    looks_like_cron,
    next_after_crash,
    next_after_failure,
    next_after_success,
    parse_cron,
    previous_slots,
    skipped_slots,
    validate_cron_at,
    zone,
)

BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")
LORD_HOWE = ZoneInfo("Australia/Lord_Howe")
UTCZ = ZoneInfo("UTC")
HOUR = Interval(micros=3_600_000_000)
DAY = Interval(days=1)
MONTH = Interval(months=1)


def u(y: int, mo: int, d: int, h: int = 0, mi: int = 0, s: int = 0, us: int = 0) -> datetime:
    return datetime(y, mo, d, h, mi, s, us, tzinfo=UTC)


def loc(tz: ZoneInfo, y: int, mo: int, d: int, h: int = 0, mi: int = 0, s: int = 0) -> datetime:
    return datetime(y, mo, d, h, mi, s, tzinfo=tz)


def nxt(expr: str, after: datetime, n: int = 1, tz: ZoneInfo = UTCZ) -> list[datetime]:
    return cron_next_n(parse_cron(expr), tz, after, n)


def walls(times: list[datetime], tz: ZoneInfo) -> list[str]:
    return [t.astimezone(tz).strftime("%a %m-%d %H:%M:%S%z") for t in times]


# --------------------------------------------------------------------------- inputs


@pytest.mark.parametrize(
    "text",
    [
        "@yearly",
        "@Annually",
        "@MONTHLY",
        "@weekly",
        "@daily",
        "@midnight",
        "@hourly",
        "*/5 * * * *",
        "0 30 9 * * MON-FRI",
        "0 0 12 * * ? 2030",
        "0 0 L * *",
        "0 0 * * mon#2",
        "0 0 * jan,feb 5L",
        "  1  2  3  4  5  ",
    ],
)
def test_looks_like_cron_true(text: str) -> None:
    assert looks_like_cron(text)


@pytest.mark.parametrize(
    "text",
    [
        "1 year 2 months 3 days",
        "5 minutes",
        "1 day",
        "01:00:00",
        "@reboot",
        "* * * *",
        "1 2 3 4 5 6 7 8",
        "1 mon 2 days 3 hours 4 mins",
        "every 5 minutes",
        "0 0 * * MONDAY",
        "",
    ],
)
def test_looks_like_cron_false(text: str) -> None:
    assert not looks_like_cron(text)


def test_zone() -> None:
    assert zone(None) == ZoneInfo("UTC")
    assert zone("") == ZoneInfo("UTC")
    assert zone("Europe/Berlin") is BERLIN
    for bad in ("Mars/Olympus", "../../etc/passwd", "Europe/"):
        with pytest.raises(ScheduleError) as exc:
            zone(bad)
        assert exc.value.argument == "timezone"
        assert f"unknown time zone '{bad}'" in str(exc.value)
        assert "IANA name such as 'Europe/Berlin'" in str(exc.value)


def test_new_intervals_are_at_least_a_millisecond_and_stored_ones_still_plan() -> None:
    check_new_interval(Interval(micros=1000), fixed=True)
    with pytest.raises(ScheduleError, match="shorter than 1 millisecond"):
        check_new_interval(Interval(micros=999), fixed=True, argument="every")
    # A job given a shorter period before the rule keeps running: the scheduler's Schedule takes it.
    Schedule(interval=Interval(micros=1), cron=None)


@pytest.mark.parametrize(
    ("iv", "fixed", "fragment"),
    [
        (Interval(), False, "not positive"),
        (Interval(days=-1), False, "not positive"),
        (Interval(days=1, micros=-1), True, "not positive"),
        (Interval(months=1, days=1), True, "month intervals cannot be combined"),
        (Interval(months=1, micros=1), True, "month intervals cannot be combined"),
    ],
)
def test_check_interval_rejects(iv: Interval, fixed: bool, fragment: str) -> None:
    with pytest.raises(ScheduleError) as exc:
        check_interval(iv, fixed=fixed, argument="schedule_interval")
    assert exc.value.argument == "schedule_interval"
    assert fragment in str(exc.value)
    assert str(exc.value).startswith("invalid schedule_interval: ")
    assert "expected" in str(exc.value)


def test_check_interval_accepts() -> None:
    check_interval(Interval(months=1, days=2, micros=3), fixed=False)
    check_interval(Interval(months=13), fixed=True)
    check_interval(Interval(days=1, micros=1), fixed=True)
    check_interval(Interval(micros=1), fixed=True)


def test_interval_helpers() -> None:
    assert Interval(months=1, days=2, micros=3_600_000_000).approx_timedelta() == timedelta(days=32, hours=1)
    assert Interval.from_timedelta(timedelta(days=2, seconds=5)) == Interval(0, 2, 5_000_000)
    assert str(Interval(1, 2, 3_723_000_001)) == "1 mon 2 days 01:02:03.000001"
    assert str(Interval(days=1)) == "1 day"
    assert str(Interval()) == "00:00:00"


def test_schedule_invariants() -> None:
    with pytest.raises(ValueError):
        Schedule(interval=None, cron=None)
    with pytest.raises(ValueError):
        Schedule(interval=HOUR, cron=parse_cron("@daily"))
    with pytest.raises(ValueError, match="timezone-aware"):
        Schedule(interval=HOUR, cron=None, origin=datetime(2026, 1, 1))
    with pytest.raises(ScheduleError):
        Schedule(interval=Interval(months=1, days=1), cron=None, fixed=True)


def test_naive_datetimes_are_refused() -> None:
    s = Schedule(interval=HOUR, cron=None)
    with pytest.raises(ValueError, match="timezone-aware"):
        next_after_success(s, plan_time=datetime(2026, 1, 1), finish=u(2026, 1, 1))
    with pytest.raises(ValueError, match="timezone-aware"):
        cron_next(parse_cron("@daily"), UTCZ, datetime(2026, 1, 1))
    with pytest.raises(ValueError, match="timezone-aware"):
        add_interval(datetime(2026, 1, 1), DAY, BERLIN)


# --------------------------------------------------------------------------- interval arithmetic


def test_add_interval_months_clamp_from_origin() -> None:
    jan31 = u(2026, 1, 31, 12)
    assert add_interval(jan31, MONTH, UTCZ) == u(2026, 2, 28, 12)
    assert add_interval(jan31, MONTH, UTCZ, 2) == u(2026, 3, 31, 12)
    assert add_interval(jan31, MONTH, UTCZ, 3) == u(2026, 4, 30, 12)
    assert add_interval(u(2024, 1, 31), MONTH, UTCZ) == u(2024, 2, 29)
    assert add_interval(u(2026, 3, 31), MONTH, UTCZ, -1) == u(2026, 2, 28)
    assert add_interval(u(2026, 1, 1), Interval(months=1, days=1, micros=1_000_000), UTCZ) == u(2026, 2, 2, 0, 0, 1)


def test_add_interval_days_keep_local_wall_time_but_hours_do_not() -> None:
    before = loc(BERLIN, 2026, 3, 28, 9)  # 08:00 UTC, CET
    assert add_interval(before, DAY, BERLIN) == loc(BERLIN, 2026, 3, 29, 9)  # 07:00 UTC, CEST
    assert add_interval(before, DAY, BERLIN) == u(2026, 3, 29, 7)
    assert add_interval(before, Interval(micros=24 * 3_600_000_000), BERLIN) == u(2026, 3, 29, 8)  # 10:00 CEST
    assert add_interval(before, DAY, UTCZ) == u(2026, 3, 29, 8)
    autumn = loc(BERLIN, 2026, 10, 24, 9)
    assert add_interval(autumn, DAY, BERLIN) == u(2026, 10, 25, 8)  # 09:00 CET


def test_add_interval_into_gap_and_overlap() -> None:
    # 2026-03-28 02:30 CET + 1 day = 2026-03-29 02:30, which does not exist: first instant after the gap
    assert add_interval(loc(BERLIN, 2026, 3, 28, 2, 30), DAY, BERLIN) == u(2026, 3, 29, 1)
    # 2026-10-24 02:30 CEST + 1 day = 02:30 twice: the first occurrence (still CEST)
    assert add_interval(loc(BERLIN, 2026, 10, 24, 2, 30), DAY, BERLIN) == u(2026, 10, 25, 0, 30)
    # New York 2026-03-08 02:30 does not exist either -> 03:00 EDT = 07:00 UTC
    assert add_interval(loc(NEW_YORK, 2026, 3, 7, 2, 30), DAY, NEW_YORK) == u(2026, 3, 8, 7)


# --------------------------------------------------------------------------- interval schedules


def test_fixed_interval_next_start_skips_missed_slots() -> None:
    s = Schedule(interval=HOUR, cron=None, fixed=True, origin=u(2026, 1, 1, 9))
    plan = u(2026, 1, 1, 9)
    assert next_after_success(s, plan_time=plan, finish=u(2026, 1, 1, 9, 10)) == u(2026, 1, 1, 10)
    assert next_after_success(s, plan_time=plan, finish=u(2026, 1, 1, 10)) == u(2026, 1, 1, 11)  # strictly after
    assert next_after_success(s, plan_time=plan, finish=u(2026, 1, 1, 12, 30)) == u(2026, 1, 1, 13)
    # no origin: aligned to the plan time
    s2 = Schedule(interval=Interval(micros=600_000_000), cron=None, fixed=True)
    assert next_after_success(s2, plan_time=u(2026, 1, 1, 9, 3), finish=u(2026, 1, 1, 9, 25)) == u(2026, 1, 1, 9, 33)
    # a finish before the plan time (clock skew) does not repeat the plan
    assert next_after_success(s2, plan_time=u(2026, 1, 1, 9, 3), finish=u(2026, 1, 1, 9)) == u(2026, 1, 1, 9, 13)


def test_drifting_interval_next_start() -> None:
    s = Schedule(interval=HOUR, cron=None, fixed=False, origin=u(2026, 1, 1, 9))
    assert next_after_success(s, plan_time=u(2026, 1, 1, 9), finish=u(2026, 1, 1, 9, 10, 5)) == u(2026, 1, 1, 10, 10, 5)
    mixed = Schedule(interval=Interval(months=1, days=1), cron=None, fixed=False, tz=BERLIN)
    assert next_after_success(mixed, plan_time=u(2026, 1, 31), finish=u(2026, 1, 31, 1)) == loc(BERLIN, 2026, 3, 1, 2)
    assert skipped_slots(s, plan_time=u(2026, 1, 1, 9), finish=u(2026, 1, 5)) == (0, None, None)
    assert previous_slots(s, since=u(2026, 1, 1), now=u(2026, 1, 2), limit=10) == []


def test_monthly_fixed_schedule_from_jan_31() -> None:
    s = Schedule(interval=MONTH, cron=None, fixed=True, origin=loc(BERLIN, 2026, 1, 31, 6), tz=BERLIN)
    plan = loc(BERLIN, 2026, 1, 31, 6)
    assert next_after_success(s, plan_time=plan, finish=loc(BERLIN, 2026, 1, 31, 7)) == loc(BERLIN, 2026, 2, 28, 6)
    assert next_after_success(s, plan_time=plan, finish=loc(BERLIN, 2026, 3, 1)) == loc(BERLIN, 2026, 3, 31, 6)
    assert next_after_success(s, plan_time=plan, finish=loc(BERLIN, 2026, 4, 2)) == loc(BERLIN, 2026, 4, 30, 6)
    assert previous_slots(s, since=plan, now=loc(BERLIN, 2026, 6, 1), limit=10) == [
        loc(BERLIN, 2026, 2, 28, 6),
        loc(BERLIN, 2026, 3, 31, 6),
        loc(BERLIN, 2026, 4, 30, 6),
        loc(BERLIN, 2026, 5, 31, 6),
    ]
    # 30 years later the k estimate from the calendar is still exact
    assert next_after_success(s, plan_time=plan, finish=loc(BERLIN, 2056, 2, 29, 7)) == loc(BERLIN, 2056, 3, 31, 6)


def test_daily_fixed_schedule_keeps_local_time_across_dst() -> None:
    origin = loc(BERLIN, 2026, 3, 25, 9)
    s = Schedule(interval=DAY, cron=None, fixed=True, origin=origin, tz=BERLIN)
    slots = previous_slots(s, since=origin, now=loc(BERLIN, 2026, 3, 31, 9), limit=100)
    assert [t.astimezone(BERLIN).hour for t in slots] == [9] * 6
    assert slots[3:5] == [u(2026, 3, 29, 7), u(2026, 3, 30, 7)]  # CEST now
    assert all(t.tzinfo is UTC for t in slots)
    autumn = next_after_success(s, plan_time=origin, finish=loc(BERLIN, 2026, 10, 25, 8, 59))
    assert autumn == loc(BERLIN, 2026, 10, 25, 9) == u(2026, 10, 25, 8)


def test_large_k_is_computed_not_iterated() -> None:
    origin = u(2016, 1, 1)
    second = Schedule(interval=Interval(micros=1_000_000), cron=None, fixed=True, origin=origin)
    day = Schedule(interval=DAY, cron=None, fixed=True, origin=origin, tz=BERLIN)
    finish = u(2026, 5, 17, 13, 14, 15, 500)
    t0 = time.perf_counter()
    assert next_after_success(second, plan_time=origin, finish=finish) == u(2026, 5, 17, 13, 14, 16)
    assert next_after_success(day, plan_time=origin, finish=finish) == loc(BERLIN, 2026, 5, 18, 1)
    assert skipped_slots(second, plan_time=origin, finish=finish, limit=5) == (
        5,
        u(2016, 1, 1, 0, 0, 1),
        u(2016, 1, 1, 0, 0, 5),
    )
    assert first_start(second, finish) == u(2026, 5, 17, 13, 14, 16)
    assert time.perf_counter() - t0 < 0.05


def test_first_start() -> None:
    now = u(2026, 5, 1, 10, 17)
    assert first_start(Schedule(interval=HOUR, cron=None), now) == now
    future = Schedule(interval=HOUR, cron=None, origin=u(2026, 5, 2))
    assert first_start(future, now) == u(2026, 5, 2)
    past_fixed = Schedule(interval=HOUR, cron=None, fixed=True, origin=u(2026, 5, 1, 0, 30))
    assert first_start(past_fixed, now) == u(2026, 5, 1, 10, 30)
    assert first_start(past_fixed, u(2026, 5, 1, 10, 30)) == u(2026, 5, 1, 10, 30)  # a slot at now is not missed
    past_drift = Schedule(interval=HOUR, cron=None, fixed=False, origin=u(2026, 5, 1, 0, 30))
    assert first_start(past_drift, now) == now
    daily = parse_cron("0 0 * * *")
    assert first_start(Schedule(interval=None, cron=daily), now) == u(2026, 5, 2)
    assert first_start(Schedule(interval=None, cron=daily, origin=u(2026, 6, 1)), now) == u(2026, 6, 1)
    assert first_start(Schedule(interval=None, cron=daily, origin=u(2026, 6, 1, 1)), now) == u(2026, 6, 2)
    assert first_start(Schedule(interval=None, cron=daily, origin=u(2020, 1, 1)), now) == u(2026, 5, 2)


def test_skipped_slots() -> None:
    s = Schedule(interval=Interval(micros=600_000_000), cron=None, fixed=True, origin=u(2026, 1, 1))
    plan = u(2026, 1, 1, 9)
    assert skipped_slots(s, plan_time=plan, finish=u(2026, 1, 1, 9, 5)) == (0, None, None)
    assert skipped_slots(s, plan_time=plan, finish=u(2026, 1, 1, 9, 10)) == (
        1,
        u(2026, 1, 1, 9, 10),
        u(2026, 1, 1, 9, 10),
    )
    assert skipped_slots(s, plan_time=plan, finish=u(2026, 1, 1, 9, 45)) == (
        4,
        u(2026, 1, 1, 9, 10),
        u(2026, 1, 1, 9, 40),
    )
    assert skipped_slots(s, plan_time=plan, finish=u(2026, 1, 2), limit=3) == (
        3,
        u(2026, 1, 1, 9, 10),
        u(2026, 1, 1, 9, 30),
    )
    c = Schedule(interval=None, cron=parse_cron("*/15 * * * *"))
    assert skipped_slots(c, plan_time=plan, finish=u(2026, 1, 1, 9, 50)) == (
        3,
        u(2026, 1, 1, 9, 15),
        u(2026, 1, 1, 9, 45),
    )
    assert skipped_slots(c, plan_time=plan, finish=u(2026, 1, 1, 9, 10)) == (0, None, None)
    assert skipped_slots(c, plan_time=plan, finish=u(2026, 1, 2), limit=2)[0] == 2


def test_previous_slots() -> None:
    c = Schedule(interval=None, cron=parse_cron("0 * * * *"))
    assert previous_slots(c, since=u(2026, 1, 1, 9), now=u(2026, 1, 1, 12), limit=10) == [
        u(2026, 1, 1, 10),
        u(2026, 1, 1, 11),
        u(2026, 1, 1, 12),
    ]
    assert previous_slots(c, since=u(2026, 1, 1, 9), now=u(2026, 1, 2), limit=2) == [
        u(2026, 1, 1, 10),
        u(2026, 1, 1, 11),
    ]
    f = Schedule(interval=HOUR, cron=None, fixed=True, origin=u(2026, 1, 1, 0, 30))
    assert previous_slots(f, since=u(2026, 1, 1, 9), now=u(2026, 1, 1, 11, 30), limit=10) == [
        u(2026, 1, 1, 9, 30),
        u(2026, 1, 1, 10, 30),
        u(2026, 1, 1, 11, 30),
    ]
    once = Schedule(interval=None, cron=parse_cron("0 0 12 1 1 * 2030"))
    assert previous_slots(once, since=u(2029, 1, 1), now=u(2040, 1, 1), limit=10) == [u(2030, 1, 1, 12)]


# --------------------------------------------------------------------------- cron semantics


def test_cron_five_fields() -> None:
    assert nxt("*/5 * * * *", u(2026, 1, 1, 10, 2, 30), 3) == [
        u(2026, 1, 1, 10, 5),
        u(2026, 1, 1, 10, 10),
        u(2026, 1, 1, 10, 15),
    ]
    assert nxt("*/5 * * * *", u(2026, 1, 1, 10, 5), 1) == [u(2026, 1, 1, 10, 10)]  # strictly after
    assert nxt("*/5 * * * *", u(2026, 1, 1, 10, 4, 59, 999_999), 1) == [u(2026, 1, 1, 10, 5)]
    assert nxt("59 23 31 12 *", u(2026, 6, 1)) == [u(2026, 12, 31, 23, 59)]
    assert nxt("0 0 1 1 *", u(2026, 12, 31, 23, 59, 59)) == [u(2027, 1, 1)]


def test_cron_six_fields_are_seconds_first() -> None:
    assert nxt("30 * * * * *", u(2026, 1, 1, 10, 0, 0), 3) == [
        u(2026, 1, 1, 10, 0, 30),
        u(2026, 1, 1, 10, 1, 30),
        u(2026, 1, 1, 10, 2, 30),
    ]
    got = nxt("0 30 9 * * MON-FRI", u(2026, 1, 2, 9, 30), 3)  # Friday 09:30 exactly
    assert walls(got, UTCZ) == [
        "Mon 01-05 09:30:00+0000",
        "Tue 01-06 09:30:00+0000",
        "Wed 01-07 09:30:00+0000",
    ]
    assert nxt("*/20 0 0 * * *", u(2026, 1, 1, 0, 0, 30), 2) == [u(2026, 1, 1, 0, 0, 40), u(2026, 1, 2)]


def test_cron_seven_fields_with_year() -> None:
    assert nxt("0 0 12 * * * 2030", u(2026, 3, 1), 2) == [u(2030, 1, 1, 12), u(2030, 1, 2, 12)]
    assert nxt("0 0 0 1 1 * 2027-2029/2", u(2026, 3, 1), 2) == [u(2027, 1, 1), u(2029, 1, 1)]
    with pytest.raises(ScheduleError, match="never fires"):
        cron_next(parse_cron("0 0 0 1 1 * 2027"), UTCZ, u(2027, 1, 1))


def test_cron_names_steps_lists() -> None:
    assert nxt("0 12 * jan,Mar sun", u(2026, 1, 20), 3) == [
        u(2026, 1, 25, 12),
        u(2026, 3, 1, 12),
        u(2026, 3, 8, 12),
    ]
    assert nxt("0 0 * * 7", u(2026, 1, 1), 1) == nxt("0 0 * * 0", u(2026, 1, 1), 1) == [u(2026, 1, 4)]
    assert walls(nxt("0 0 * * FRI-SUN", u(2026, 1, 1), 3), UTCZ) == [
        "Fri 01-02 00:00:00+0000",
        "Sat 01-03 00:00:00+0000",
        "Sun 01-04 00:00:00+0000",
    ]
    assert nxt("10-40/15 3 * * *", u(2026, 1, 1), 3) == [
        u(2026, 1, 1, 3, 10),
        u(2026, 1, 1, 3, 25),
        u(2026, 1, 1, 3, 40),
    ]
    assert nxt("50/5 3 * * *", u(2026, 1, 1), 3) == [
        u(2026, 1, 1, 3, 50),
        u(2026, 1, 1, 3, 55),
        u(2026, 1, 2, 3, 50),
    ]
    assert nxt("0 1,13 * * *", u(2026, 1, 1, 2), 2) == [u(2026, 1, 1, 13), u(2026, 1, 2, 1)]
    assert nxt("0 0 ? * MON", u(2026, 1, 1), 1) == [u(2026, 1, 5)]
    assert parse_cron("  0  0 ?  *  mon ").expr == "0 0 ? * MON"


def test_cron_dow_step_from_a_value_runs_to_7_which_is_sunday() -> None:
    # 'a/n' means 'a-<field max>/n' in every field; day-of-week's max is 7 (Sunday again), so
    # '1/2' is '1-7/2' (as Vixie cron and pg_cron read the range; both refuse '1/2' itself)
    # and includes Sunday. croniter stops at 6 (README, "Schedules"; test_cron_oracle.py).
    for a, b in (("1/2", "1-7/2"), ("3/2", "3-7/2"), ("1/3", "1-7/3"), ("7/2", "7")):
        assert parse_cron(f"0 0 * * {a}").weekdays == parse_cron(f"0 0 * * {b}").weekdays, a
    assert parse_cron("0 0 * * 1/2").weekdays == (0, 1, 3, 5)
    assert walls(nxt("0 0 * * 1/2", u(2026, 1, 1), 4), UTCZ) == [
        "Fri 01-02 00:00:00+0000",
        "Sun 01-04 00:00:00+0000",
        "Mon 01-05 00:00:00+0000",
        "Wed 01-07 00:00:00+0000",
    ]
    assert parse_cron("0 0 * * 0/2").weekdays == parse_cron("0 0 * * */2").weekdays == (0, 2, 4, 6)


def test_cron_last_day_and_nth_weekday() -> None:
    assert nxt("0 0 L * *", u(2026, 1, 1), 3) == [u(2026, 1, 31), u(2026, 2, 28), u(2026, 3, 31)]
    assert nxt("0 0 $ 2 *", u(2027, 3, 1), 1) == [u(2028, 2, 29)]
    assert nxt("0 0 15,L * *", u(2026, 2, 1), 3) == [u(2026, 2, 15), u(2026, 2, 28), u(2026, 3, 15)]
    assert nxt("0 0 * * MON#2", u(2026, 1, 1), 2) == [u(2026, 1, 12), u(2026, 2, 9)]
    assert nxt("0 0 * * 1#5", u(2026, 1, 1), 2) == [u(2026, 3, 30), u(2026, 6, 29)]
    assert nxt("0 0 * * 5L", u(2026, 1, 1), 2) == [u(2026, 1, 30), u(2026, 2, 27)]
    assert nxt("0 0 * * friL,MON#1", u(2026, 1, 1), 3) == [u(2026, 1, 5), u(2026, 1, 30), u(2026, 2, 2)]


def test_cron_dom_dow_or_rule() -> None:
    # both restricted: the 13th OR any Friday
    assert nxt("0 0 13 * FRI", u(2026, 1, 1), 4) == [
        u(2026, 1, 2),
        u(2026, 1, 9),
        u(2026, 1, 13),
        u(2026, 1, 16),
    ]
    # only one restricted: that one decides
    assert nxt("0 0 13 * *", u(2026, 1, 1), 2) == [u(2026, 1, 13), u(2026, 2, 13)]
    assert nxt("0 0 * * FRI", u(2026, 1, 1), 2) == [u(2026, 1, 2), u(2026, 1, 9)]
    assert nxt("0 0 13 * ?", u(2026, 1, 1), 1) == [u(2026, 1, 13)]
    # restriction is textual: '1-31' restricts, so it ORs with Monday (i.e. every day)
    assert nxt("0 0 1-31 * MON", u(2026, 1, 1), 2) == [u(2026, 1, 2), u(2026, 1, 3)]


@pytest.mark.parametrize(
    ("macro", "expected"),
    [
        ("@yearly", u(2027, 1, 1)),
        ("@annually", u(2027, 1, 1)),
        ("@monthly", u(2026, 6, 1)),
        ("@weekly", u(2026, 5, 17)),
        ("@daily", u(2026, 5, 16)),
        ("@midnight", u(2026, 5, 16)),
        ("@HOURLY", u(2026, 5, 15, 11)),
    ],
)
def test_cron_macros(macro: str, expected: datetime) -> None:
    assert nxt(macro, u(2026, 5, 15, 10, 30)) == [expected]  # 2026-05-15 is a Friday
    assert parse_cron(macro).expr == macro.lower()


@pytest.mark.parametrize(
    ("expr", "fragment"),
    [
        ("* * * *", "has 4 fields"),
        ("* * * * * * * *", "has 8 fields"),
        ("", "has 0 fields"),
        ("0 24 * * *", "field 'hour' value 24 out of range 0-23"),
        ("60 * * * *", "field 'minute' value 60 out of range 0-59"),
        ("0 0 0 * * *  ", None),
        ("0 0 32 * *", "field 'day-of-month' value 32 out of range 1-31"),
        ("0 0 0 * *", "field 'day-of-month' value 0 out of range 1-31"),
        ("0 0 * 13 *", "field 'month' value 13 out of range 1-12"),
        ("0 0 * * 8", "field 'day-of-week' value 8 out of range 0-7"),
        ("0 0 * * * * 1969", "field 'year' value 1969 out of range 1970-2099"),
        ("5-3 * * * *", "reversed range 5-3"),
        ("*/0 * * * *", "bad step '0'"),
        ("1/x * * * *", "bad step 'X'"),
        ("*/60 10 * * *", "field 'minute' has step 60, larger than its largest value 59"),
        ("*/5000000000 10 * * *", "has step 5000000000, larger than its largest value 59"),
        ("0 0 */32 * *", "field 'day-of-month' has step 32"),
        ("0 0 * */13 *", "field 'month' has step 13"),
        ("0 0 * * 1/8", "field 'day-of-week' has step 8"),
        ("*/59 */23 */31 */12 */7", None),
        ("1,,2 * * * *", "empty item"),
        ("1, * * * *", "empty item"),
        ("0 0 * FOO *", "bad value 'FOO'"),
        ("0 0 * MON *", "bad value 'MON'"),
        ("0 0 * * JAN", "bad value 'JAN'"),
        ("0 0 * * MON#6", "weekday#n with n 1-5"),
        ("0 0 * * L", "bad value 'L'"),
        ("0 0 15W * *", "'W'"),
        ("0 ? * * *", "'?' only"),
        ("0 0 ?,1 * *", "'?' only"),
        ("0 0 * * * junk", "field 'day-of-week'"),
        ("0 0 31 2 *", "can never fire"),
        ("0 0 30 2 *", "can never fire"),
        ("0 0 31 4,6,9,11 *", "can never fire"),
        ("0 0 0 29 2 * 2027", "can never fire"),
        ("0 0 0 * * MON#5 2026", None),
        ("1-2-3 * * * *", "bad item"),
        ("@reboot", "has 1 fields"),
    ],
)
def test_cron_rejections(expr: str, fragment: str | None) -> None:
    if fragment is None:  # counterexamples that must parse
        parse_cron(expr)
        return
    with pytest.raises(ScheduleError) as exc:
        parse_cron(expr)
    assert exc.value.argument == "schedule"
    assert fragment in str(exc.value)
    assert "expected" in str(exc.value)


def test_cron_error_names_the_forms() -> None:
    with pytest.raises(ScheduleError) as exc:
        parse_cron("0 24 * * *")
    assert str(exc.value) == (
        "invalid schedule: cron expression '0 24 * * *': field 'hour' value 24 out of range 0-23;"
        " expected 5 fields (min hour dom month dow), 6 (sec first) or 7 (sec first, year last)"
    )


def test_validate_cron_at() -> None:
    validate_cron_at(parse_cron("0 0 29 2 *"), UTCZ, u(2026, 1, 1))
    validate_cron_at(parse_cron("0 0 0 1 1 * 2030"), UTCZ, u(2026, 1, 1))
    with pytest.raises(ScheduleError) as exc:
        validate_cron_at(parse_cron("0 0 0 1 1 * 2020-2025"), UTCZ, u(2026, 1, 1))
    assert exc.value.argument == "schedule" and "never fires" in str(exc.value)


# --------------------------------------------------------------------------- DST


def test_daily_0230_across_berlin_gap_and_overlap() -> None:
    spring = nxt("30 2 * * *", u(2026, 3, 27, 12), 3, BERLIN)
    assert spring == [u(2026, 3, 28, 1, 30), u(2026, 3, 29, 1), u(2026, 3, 30, 0, 30)]  # gap day: 03:00 CEST
    assert walls(spring, BERLIN)[1] == "Sun 03-29 03:00:00+0200"
    autumn = nxt("30 2 * * *", u(2026, 10, 24, 12), 2, BERLIN)
    assert autumn == [u(2026, 10, 25, 0, 30), u(2026, 10, 26, 1, 30)]  # once, at the first (CEST) 02:30


def test_daily_0230_across_new_york_transitions() -> None:
    assert nxt("30 2 * * *", u(2026, 3, 7, 12), 2, NEW_YORK) == [u(2026, 3, 8, 7), u(2026, 3, 9, 6, 30)]
    assert nxt("30 1 * * *", u(2026, 10, 31, 12), 2, NEW_YORK) == [
        u(2026, 11, 1, 5, 30),
        u(2026, 11, 2, 6, 30),
    ]


def test_hourly_across_berlin_transitions() -> None:
    spring = nxt("0 * * * *", u(2026, 3, 28, 23, 30), 3, BERLIN)
    assert walls(spring, BERLIN) == [
        "Sun 03-29 01:00:00+0100",
        "Sun 03-29 03:00:00+0200",
        "Sun 03-29 04:00:00+0200",
    ]
    # The autumn 02:00 fires once (CEST); the real hour 01:00-02:00 UTC has no firing.
    autumn = nxt("0 * * * *", u(2026, 10, 24, 23, 30), 3, BERLIN)
    assert autumn == [u(2026, 10, 25, 0), u(2026, 10, 25, 2), u(2026, 10, 25, 3)]
    # From inside the repeated hour's second pass the next firing is 03:00 CET.
    assert nxt("0 * * * *", u(2026, 10, 25, 1, 30), 1, BERLIN) == [u(2026, 10, 25, 2)]
    assert nxt("* * * * * *", u(2026, 10, 25, 1, 0, 0), 1, BERLIN) == [u(2026, 10, 25, 2)]


def test_every_minute_across_berlin_gap_fires_once_for_the_gap() -> None:
    got = nxt("* * * * *", u(2026, 3, 29, 0, 58), 4, BERLIN)
    assert got == [u(2026, 3, 29, 0, 59), u(2026, 3, 29, 1), u(2026, 3, 29, 1, 1), u(2026, 3, 29, 1, 2)]
    assert walls(got, BERLIN)[1:3] == ["Sun 03-29 03:00:00+0200", "Sun 03-29 03:01:00+0200"]
    # 'at second 30' in the gap collapses too
    assert nxt("30 * * * * *", u(2026, 3, 29, 0, 59, 30), 2, BERLIN) == [
        u(2026, 3, 29, 1),
        u(2026, 3, 29, 1, 0, 30),
    ]


def test_lord_howe_half_hour_gap_and_overlap() -> None:
    # 2026-10-04 02:00 -> 02:30 (+10:30 -> +11): 02:00 and 02:15 collapse into 02:30 = 15:30 UTC
    gap = nxt("*/15 * * * *", u(2026, 10, 3, 15, 10), 3, LORD_HOWE)
    assert gap == [u(2026, 10, 3, 15, 15), u(2026, 10, 3, 15, 30), u(2026, 10, 3, 15, 45)]
    assert walls(gap, LORD_HOWE) == [
        "Sun 10-04 01:45:00+1030",
        "Sun 10-04 02:30:00+1100",
        "Sun 10-04 02:45:00+1100",
    ]
    # 2026-04-05 02:00 -> 01:30 (+11 -> +10:30): 01:30 and 01:45 fire on the first pass only
    overlap = nxt("*/15 * * * *", u(2026, 4, 4, 14, 20), 4, LORD_HOWE)
    assert overlap == [
        u(2026, 4, 4, 14, 30),
        u(2026, 4, 4, 14, 45),
        u(2026, 4, 4, 15, 30),
        u(2026, 4, 4, 15, 45),
    ]
    assert walls(overlap, LORD_HOWE)[2] == "Sun 04-05 02:00:00+1030"
    assert nxt("45 1 * * *", u(2026, 4, 4, 14, 50), 1, LORD_HOWE) == [u(2026, 4, 5, 15, 15)]


def test_monthly_interval_into_gap() -> None:
    s = Schedule(interval=MONTH, cron=None, fixed=True, origin=loc(BERLIN, 2026, 2, 28, 2, 30), tz=BERLIN)
    assert next_after_success(s, plan_time=s.origin or u(2026, 1, 1), finish=u(2026, 3, 1)) == u(2026, 3, 28, 1, 30)
    s29 = Schedule(interval=MONTH, cron=None, fixed=True, origin=loc(BERLIN, 2026, 2, 26, 2, 30), tz=BERLIN)
    assert next_after_success(s29, plan_time=u(2026, 2, 26), finish=u(2026, 3, 1)) == u(2026, 3, 26, 1, 30)


# --------------------------------------------------------------------------- backoff


def test_backoff_sequence_bounds() -> None:
    s = Schedule(interval=Interval(days=1), cron=None)  # default cap 5 days
    rng = random.Random(42)
    retry = timedelta(minutes=5)
    for n in range(1, 16):
        d = backoff_delay(s, failures=n, retry_period=retry, rng=rng)
        base = min(retry * 2 ** (n - 1), timedelta(days=5))
        assert base * 0.9 <= d <= min(base * 1.1, timedelta(days=5))
    assert backoff_delay(s, failures=15, retry_period=retry, rng=random.Random(1)) <= timedelta(days=5)
    # deterministic for a seed
    a = [backoff_delay(s, failures=n, retry_period=retry, rng=random.Random(7)) for n in (1, 2, 3)]
    b = [backoff_delay(s, failures=n, retry_period=retry, rng=random.Random(7)) for n in (1, 2, 3)]
    assert a == b


def test_backoff_caps_floor_and_overflow() -> None:
    s = Schedule(interval=HOUR, cron=None)
    rng = random.Random(3)
    assert backoff_delay(s, failures=10**6, retry_period=timedelta(minutes=1), rng=rng) <= timedelta(hours=5)
    assert backoff_delay(s, failures=10**6, retry_period=timedelta(minutes=1), rng=rng) >= timedelta(hours=4.5)
    assert backoff_delay(
        s, failures=3, retry_period=timedelta(hours=1), rng=rng, cap=timedelta(minutes=10)
    ) <= timedelta(minutes=10)
    assert backoff_delay(s, failures=1, retry_period=timedelta(0), rng=rng) == timedelta(seconds=1)
    # An explicit sub-second retry_period is honoured (within jitter); only zero gets the 1 s floor.
    tiny = backoff_delay(s, failures=1, retry_period=timedelta(milliseconds=10), rng=rng)
    assert timedelta(milliseconds=9) <= tiny <= timedelta(milliseconds=11)
    monthly = Schedule(interval=MONTH, cron=None)
    assert backoff_delay(monthly, failures=40, retry_period=timedelta(hours=1), rng=rng) <= timedelta(days=150)
    # cap = 5 * the 1-day gap after the fixed reference (a Monday)
    weekday = Schedule(interval=None, cron=parse_cron("0 30 9 * * MON-FRI"))
    delay = backoff_delay(weekday, failures=50, retry_period=timedelta(hours=1), rng=rng)
    assert timedelta(days=4.5) <= delay <= timedelta(days=5)
    with pytest.raises(ValueError):
        backoff_delay(s, failures=0, retry_period=timedelta(minutes=1), rng=rng)


def test_failure_never_past_next_fixed_slot() -> None:
    s = Schedule(interval=HOUR, cron=None, fixed=True, origin=u(2026, 1, 1))
    kw = {"plan_time": u(2026, 1, 1, 9), "finish": u(2026, 1, 1, 9, 10), "retry_period": timedelta(minutes=5)}
    first = next_after_failure(s, failures=1, rng=random.Random(0), **kw)  # type: ignore[arg-type]
    assert u(2026, 1, 1, 9, 14, 30) <= first <= u(2026, 1, 1, 9, 15, 30)
    later = next_after_failure(s, failures=6, rng=random.Random(0), **kw)  # type: ignore[arg-type]
    assert later == u(2026, 1, 1, 10)  # 160 min backoff, but the 10:00 slot comes first
    cron = Schedule(interval=None, cron=parse_cron("*/20 * * * *"))
    assert next_after_failure(cron, failures=9, rng=random.Random(0), **kw) == u(2026, 1, 1, 9, 20)  # type: ignore[arg-type]
    drifting = Schedule(interval=HOUR, cron=None, fixed=False)
    t = next_after_failure(drifting, failures=6, rng=random.Random(0), **kw)  # type: ignore[arg-type]
    assert u(2026, 1, 1, 9, 10) + timedelta(minutes=144) <= t <= u(2026, 1, 1, 9, 10) + timedelta(minutes=176)


@pytest.mark.parametrize("seed", range(20))
def test_a_retry_period_twice_the_gap_between_runs_waits_for_the_next_regular_run(seed: int) -> None:
    """The README's way to give a job pg_cron's behaviour after a failure (no retry before the next
    scheduled run): a daily cron with a retry_period of two days, failing a second after its run
    began, runs next at the next day's 03:00, whatever the jitter drawn."""
    daily = Schedule(interval=None, cron=parse_cron("0 3 * * *"))
    t = next_after_failure(daily, plan_time=u(2026, 1, 1, 3), finish=u(2026, 1, 1, 3, 0, 1), failures=1,
                           retry_period=timedelta(days=2), rng=random.Random(seed))
    assert t == u(2026, 1, 2, 3)


def test_crash_backoff_from_detection_time() -> None:
    s = Schedule(interval=DAY, cron=None, fixed=True, origin=u(2026, 1, 1))
    now = u(2026, 1, 1, 3)
    t = next_after_crash(
        s,
        plan_time=u(2026, 1, 1),
        now=now,
        crashes=2,
        retry_period=timedelta(minutes=10),
        rng=random.Random(5),
    )
    assert now + timedelta(minutes=18) <= t <= now + timedelta(minutes=22)
    capped = next_after_crash(
        s,
        plan_time=u(2026, 1, 1),
        now=now,
        crashes=30,
        retry_period=timedelta(minutes=10),
        rng=random.Random(5),
    )
    assert capped == u(2026, 1, 2)


# --------------------------------------------------------------------------- property test


def _numeric(lo: int, hi: int, field: tuple[int, int] | None = None) -> st.SearchStrategy[tuple[str, frozenset[int]]]:
    """A field text using values lo..hi and the set it must mean; '*' and open steps span ``field``."""
    bottom, top = field or (lo, hi)

    @st.composite
    def build(draw: st.DrawFn) -> tuple[str, frozenset[int]]:
        kind = draw(st.sampled_from(["*", "n", "a-b", "*/n", "a-b/n", "a/n", "list"]))
        a = draw(st.integers(lo, hi))
        b = draw(st.integers(a, hi))
        n = draw(st.integers(1, max(1, (hi - lo) // 2)))
        if kind == "*":
            return "*", frozenset(range(bottom, top + 1))
        if kind == "n":
            return str(a), frozenset({a})
        if kind == "a-b":
            return f"{a}-{b}", frozenset(range(a, b + 1))
        if kind == "*/n":
            return f"*/{n}", frozenset(range(bottom, top + 1, n))
        if kind == "a-b/n":
            return f"{a}-{b}/{n}", frozenset(range(a, b + 1, n))
        if kind == "a/n":
            return f"{a}/{n}", frozenset(range(a, top + 1, n))
        return f"{a},{b}", frozenset({a, b})

    return build()


_DOW = st.sampled_from(
    [
        ("*", None),
        ("?", None),
        ("MON-FRI", frozenset(range(1, 6))),
        ("0", frozenset({0})),
        ("sat,sun", frozenset({0, 6})),
        ("7", frozenset({0})),
        ("2-4", frozenset({2, 3, 4})),
    ]
)
_DOM = st.one_of(
    st.sampled_from([("*", None), ("?", None), ("L", None)]),
    _numeric(1, 28, (1, 31)).map(lambda f: (f[0], None if f[0] == "*" else f[1])),
)
_TRANSITIONS = [u(2026, 3, 29, 1), u(2026, 10, 25, 1)]


def _in(value: int, allowed: frozenset[int] | None) -> bool:
    return allowed is None or value in allowed


def _matches(wall: datetime, sets: dict[str, frozenset[int] | None], dom_text: str, dow_text: str) -> bool:
    """Independent oracle: does the local wall time match (Vixie's rule for the day fields)?"""
    if not (_in(wall.second, sets["second"] or frozenset({0})) and _in(wall.minute, sets["minute"])):
        return False
    if not (_in(wall.hour, sets["hour"]) and _in(wall.month, sets["month"])):
        return False
    last = (date(wall.year + wall.month // 12, wall.month % 12 + 1, 1) - timedelta(days=1)).day
    dom_ok = wall.day == last if dom_text == "L" else _in(wall.day, sets["dom"])
    dow_ok = _in(wall.isoweekday() % 7, sets["dow"])
    star = any(text.startswith("*") or text == "?" for text in (dom_text, dow_text))
    return (dom_ok and dow_ok) if star else (dom_ok or dow_ok)


def _fires_at(t: datetime, sets: dict[str, frozenset[int] | None], dom_text: str, dow_text: str) -> bool:
    local = t.astimezone(BERLIN)
    if local.fold == 0 and _matches(local.replace(tzinfo=None), sets, dom_text, dow_text):
        return True
    if t != _TRANSITIONS[0]:
        return False
    # the spring transition instant also stands for every matching wall time in the gap
    return any(
        _matches(datetime(2026, 3, 29, 2, m, s), sets, dom_text, dow_text)
        for m in range(60)
        for s in (sets["second"] or {0})
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    second=st.one_of(st.none(), _numeric(0, 59)),
    minute=_numeric(0, 59),
    # hours around the Berlin transitions (01:00-03:00 local) make the DST cases likely
    hour=st.one_of(_numeric(0, 23), _numeric(1, 3, (0, 23))),
    dom=_DOM,
    month=st.one_of(st.just(("*", frozenset(range(1, 13)))), _numeric(1, 12)),
    dow=_DOW,
    after=st.one_of(
        st.builds(
            lambda base, off: base + timedelta(seconds=off),
            st.sampled_from(_TRANSITIONS),
            st.integers(-3 * 3600, 3 * 3600),
        ),
        st.datetimes(datetime(2026, 1, 1), datetime(2026, 12, 31), timezones=st.just(UTC)),
    ),
)
def test_cron_next_property(
    second: tuple[str, frozenset[int]] | None,
    minute: tuple[str, frozenset[int]],
    hour: tuple[str, frozenset[int]],
    dom: tuple[str, frozenset[int] | None],
    month: tuple[str, frozenset[int]],
    dow: tuple[str, frozenset[int] | None],
    after: datetime,
) -> None:
    fields = [minute[0], hour[0], dom[0], month[0], dow[0]]
    expr = " ".join(([second[0]] if second else []) + fields)
    sets: dict[str, frozenset[int] | None] = {
        "second": second[1] if second else None,
        "minute": minute[1],
        "hour": hour[1],
        "dom": dom[1],
        "month": month[1],
        "dow": dow[1],
    }
    got = cron_next(parse_cron(expr), BERLIN, after)
    assert got > after and got.tzinfo is UTC
    assert _fires_at(got, sets, dom[0], dow[0]), (expr, after, got)
    # brute force: no firing between `after` and `got`, scanned per minute (seconds from the set)
    step = timedelta(minutes=1)
    t = after.replace(second=0, microsecond=0)
    end = min(got, after + timedelta(hours=6))
    while t < end:
        for s in sorted(sets["second"] or {0}):
            c = t + timedelta(seconds=s)
            if after < c < got:
                assert not _fires_at(c, sets, dom[0], dow[0]), (expr, after, got, c)
        t += step


def test_vixie_day_rule_star_prefixed_field_means_and() -> None:
    utc = zone("UTC")
    # Both restricted: either matches (the 1st or 15th, or any Monday).
    either = cron_next_n(parse_cron("0 0 1,15 * MON"), utc, u(2026, 6, 1, 1), 4)
    assert [t.day for t in either] == [8, 15, 22, 29]
    # '*/13' begins with '*': both must match (1st/14th/27th that are Thursdays).
    both = cron_next_n(parse_cron("0 0 */13 * THU"), utc, u(2026, 1, 1, 1), 3)
    assert all(t.day in (1, 14, 27) and t.isoweekday() == 4 for t in both)
    assert both[0] == u(2026, 5, 14)


def test_schedule_delay_rule_and_its_inverse() -> None:
    from pgsched.schedule import eligible_at, plan_of

    plan = datetime(2026, 3, 29, 0, 30, tzinfo=UTC)  # a night with a DST change in Berlin: elapsed time regardless
    delay = timedelta(days=1, minutes=5)
    assert eligible_at(plan, delay) == datetime(2026, 3, 30, 0, 35, tzinfo=UTC)
    assert plan_of(eligible_at(plan, delay), delay) == plan
