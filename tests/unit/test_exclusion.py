"""Exclusion windows (pgsched/exclusion.py and its use by pgsched.state.end_of_run): explicit
times, real time zones and their DST transitions, no clock."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from pgsched import exclusion, schedule
from pgsched.model import Job
from pgsched.schedule import Interval, Schedule, ScheduleError, cron_next, parse_cron, zone
from pgsched.state import JobState, Outcome, end_of_run

BERLIN = zone("Europe/Berlin")
LORD_HOWE = zone("Australia/Lord_Howe")


def berlin(y: int, mo: int, d: int, h: int = 0, mi: int = 0, s: int = 0, us: int = 0) -> datetime:
    return datetime(y, mo, d, h, mi, s, us, tzinfo=BERLIN)


def every(seconds: int, origin: datetime, tz: str = "Europe/Berlin") -> Schedule:
    return Schedule(interval=Interval(micros=seconds * 10**6), cron=None, fixed=True, origin=origin, tz=zone(tz))


@pytest.mark.parametrize(("expr", "problem"), [
    ("* 2 * *", "is not a cron expression of 5 fields"),
    ("0 * 2 * * *", "is not a cron expression of 5 fields"),
    ("@daily", "is not a cron expression of 5 fields"),
    ("", "is not a cron expression of 5 fields"),
    ("* 25 * * *", "hour"),
    ("0 0 31 2 *", "can never fire"),
    ("x y z w v", "invalid exclude"),
    ("* * * * *", "excludes every minute"),
    ("* * 1-31 * *", "excludes every minute"),
    ("* * * * 0-6", "excludes every minute"),
])
def test_a_bad_window_is_refused_naming_exclude(expr: str, problem: str) -> None:
    with pytest.raises(ScheduleError) as e:
        exclusion.parse(expr)
    assert e.value.argument == "exclude"
    assert problem in str(e.value) and "5 fields (min hour dom month dow)" in str(e.value)


def test_a_window_matches_local_minutes() -> None:
    night = exclusion.parse("* 2 * * *")
    assert not exclusion.excluded(night, BERLIN, berlin(2026, 6, 1, 1, 59, 59))
    assert exclusion.excluded(night, BERLIN, berlin(2026, 6, 1, 2, 0))
    assert exclusion.excluded(night, BERLIN, berlin(2026, 6, 1, 2, 59, 59, 999999))
    assert not exclusion.excluded(night, BERLIN, berlin(2026, 6, 1, 3, 0))
    # The same instant in UTC is 00:00: read in the job's zone, not the server's.
    assert exclusion.excluded(night, BERLIN, datetime(2026, 6, 1, 0, 30, tzinfo=UTC))
    assert not exclusion.excluded(night, zone("UTC"), datetime(2026, 6, 1, 0, 30, tzinfo=UTC))
    christmas = exclusion.parse("* * 25 12 *")
    assert exclusion.excluded(christmas, BERLIN, berlin(2026, 12, 25, 0, 0))
    assert exclusion.excluded(christmas, BERLIN, berlin(2026, 12, 25, 23, 59))
    assert not exclusion.excluded(christmas, BERLIN, berlin(2026, 12, 26, 0, 0))
    weekend_mornings = exclusion.parse("0-29 8 * * SAT,SUN")
    assert exclusion.excluded(weekend_mornings, BERLIN, berlin(2026, 11, 28, 8, 29))  # a Saturday
    assert not exclusion.excluded(weekend_mornings, BERLIN, berlin(2026, 11, 28, 8, 30))
    assert not exclusion.excluded(weekend_mornings, BERLIN, berlin(2026, 11, 27, 8, 0))  # a Friday


def test_spring_forward_has_no_2_oclock_to_exclude() -> None:
    night = exclusion.parse("* 2 * * *")
    # Berlin, 2026-03-29: 01:59:59 CET is followed by 03:00 CEST.
    assert not exclusion.excluded(night, BERLIN, datetime(2026, 3, 29, 0, 59, 59, tzinfo=UTC))
    assert not exclusion.excluded(night, BERLIN, datetime(2026, 3, 29, 1, 0, tzinfo=UTC))


def test_fall_back_excludes_the_repeated_hour_both_times() -> None:
    night = exclusion.parse("* 2 * * *")
    # Berlin, 2026-10-25: 02:00-02:59 CEST (00:00-00:59 UTC), then again as CET (01:00-01:59 UTC).
    assert not exclusion.excluded(night, BERLIN, datetime(2026, 10, 24, 23, 59, tzinfo=UTC))
    assert exclusion.excluded(night, BERLIN, datetime(2026, 10, 25, 0, 30, tzinfo=UTC))
    assert exclusion.excluded(night, BERLIN, datetime(2026, 10, 25, 1, 30, tzinfo=UTC))
    assert not exclusion.excluded(night, BERLIN, datetime(2026, 10, 25, 2, 0, tzinfo=UTC))
    s = every(1800, datetime(2026, 10, 24, 0, 0, tzinfo=UTC))
    passed = exclusion.next_allowed(s, night, plan_time=datetime(2026, 10, 25, 0, 0, tzinfo=UTC),
                                    finish=datetime(2026, 10, 25, 0, 0, 1, tzinfo=UTC))
    # 00:30 (02:30 CEST), 01:00 (02:00 CET), 01:30 (02:30 CET) passed over; 02:00 UTC is 03:00 CET.
    assert passed == exclusion.Passed(datetime(2026, 10, 25, 2, 0, tzinfo=UTC), 3,
                                      datetime(2026, 10, 25, 1, 30, tzinfo=UTC))


def test_lord_howe_half_hour_shift() -> None:
    # Lord Howe, 2026-10-04: 02:00 LHST (+10:30) becomes 02:30 LHDT (+11): 02:00-02:29 does not exist.
    early = exclusion.parse("0-29 2 * * *")
    assert not exclusion.excluded(early, LORD_HOWE, datetime(2026, 10, 3, 15, 29, tzinfo=UTC))  # 01:59 LHST
    assert not exclusion.excluded(early, LORD_HOWE, datetime(2026, 10, 3, 15, 30, tzinfo=UTC))  # 02:30 LHDT
    assert exclusion.excluded(early, LORD_HOWE, datetime(2026, 10, 4, 15, 15, tzinfo=UTC))  # 02:15 LHDT, the 5th
    assert exclusion.excluded(early, LORD_HOWE, datetime(2026, 10, 2, 15, 45, tzinfo=UTC))  # 02:15 LHST, the 3rd


def test_next_allowed_jumps_the_window_and_counts_what_it_passed() -> None:
    night = exclusion.parse("* 2 * * *")
    five = every(300, berlin(2026, 6, 1, 0, 0))
    passed = exclusion.next_allowed(five, night, plan_time=berlin(2026, 6, 1, 2, 0), finish=berlin(2026, 6, 1, 2, 0, 1))
    assert passed == exclusion.Passed(berlin(2026, 6, 1, 3, 0), 11, berlin(2026, 6, 1, 2, 55))
    second = every(1, berlin(2026, 6, 1, 0, 0))
    passed = exclusion.next_allowed(second, night, plan_time=berlin(2026, 6, 1, 2, 0),
                                    finish=berlin(2026, 6, 1, 2, 0, 0, 5000))
    assert passed == exclusion.Passed(berlin(2026, 6, 1, 3, 0), 3599, berlin(2026, 6, 1, 2, 59, 59))
    cron = Schedule(interval=None, cron=parse_cron("*/10 * * * *"), tz=BERLIN)
    passed = exclusion.next_allowed(cron, night, plan_time=berlin(2026, 6, 1, 2, 0), finish=berlin(2026, 6, 1, 2, 0, 1))
    assert passed == exclusion.Passed(berlin(2026, 6, 1, 3, 0), 5, berlin(2026, 6, 1, 2, 50))
    # Not excluded after the first: nothing more passed over.
    passed = exclusion.next_allowed(five, exclusion.parse("0 2 * * *"), plan_time=berlin(2026, 6, 1, 2, 0),
                                    finish=berlin(2026, 6, 1, 2, 0, 1))
    assert passed == exclusion.Passed(berlin(2026, 6, 1, 2, 5), 0, None)


def test_a_whole_excluded_month_is_passed_in_hour_steps() -> None:
    december = exclusion.parse("* * * 12 *")
    hourly = every(3600, berlin(2026, 1, 1, 0, 0))
    passed = exclusion.next_allowed(hourly, december, plan_time=berlin(2026, 12, 1, 0, 0),
                                    finish=berlin(2026, 12, 1, 0, 0, 1))
    assert passed.plan == berlin(2027, 1, 1, 0, 0)
    assert passed.count == 31 * 24 - 1


def test_end_of_run_of_an_excluded_plan_plans_past_the_window_with_the_delay() -> None:
    s = every(300, berlin(2026, 6, 1, 0, 0))
    j = Job(job_id=1000, job_name="j", kind="proc", owner="alice", proc_schema="public", proc_name="p",
            is_procedure=True, command=None, code_module=None, code_function=None, config=None, schedule=s,
            max_runtime=None, max_retries=-1, retry_period=timedelta(minutes=5),
            schedule_delay=timedelta(seconds=30), exclude=exclusion.parse("* 2 * * *"))
    end = end_of_run(j, outcome=Outcome.SKIPPED, plan_time=berlin(2026, 6, 1, 2, 0),
                     finish=berlin(2026, 6, 1, 2, 0, 30, 100), consecutive_failures=0, consecutive_crashes=0,
                     message=None, rng=random.Random(1))
    assert (end.outcome, end.next_state, end.disable_reason) == (Outcome.SKIPPED, JobState.SCHEDULED, None)
    assert end.next_start == berlin(2026, 6, 1, 3, 0, 30)  # 03:00 plus the 30 s delay
    assert end.excluded == (11, berlin(2026, 6, 1, 2, 55))


# Defect: the old rule (31 days or 7 weekdays) called these "every minute", though a restricted
# day field decides alone (Vixie cron's rule).
@pytest.mark.parametrize("expr", ["* * * * SAT,SUN", "* * * * 1-5", "* * 25 * *", "* * 1-15 * *", "* * L * *",
                                  "* * 1-30 * *", "* * 1-15 * SAT", "* * * 1-11 *", "0-58 * * * *"])
def test_a_window_of_some_days_is_not_every_minute(expr: str) -> None:
    window = exclusion.parse(expr)
    assert not exclusion.covers_every_minute(window)
    assert not exclusion.leaves_no_start(parse_cron("* * * * *"), window)


@pytest.mark.parametrize("expr", ["* * * * *", "* * 1-31 * *", "* * * * 0-6", "* * 1-31 * 0-6", "* * 1-30,L * *",
                                  "* * 1-31 * 1", "* * 1 * 0-6", "0-59 0-23 * 1-12 SUN-SAT"])
def test_a_window_of_every_day_covers_every_minute(expr: str) -> None:
    assert exclusion.covers_every_minute(parse_cron(expr))


# (schedule, window, leaves no start)
PAIRS = [
    ("30 10 * * *", "* 10 * * *", True),
    ("* 0-29 * * * *", "0-29 * * * *", True),
    ("0 3 * * *", "* 3 * * *", True),
    ("0 0 * * *", "0 * * * *", True),
    ("0 10 * * 1-5", "* 10 * * MON-FRI", True),
    ("0 10 * * SAT", "* * * * 0,6", True),
    ("0 10 1 * *", "* * 1-7 * *", True),
    ("0 0 29 2 *", "* * 29 * *", True),
    ("0 0 0 1 1 * 2030", "* * 1 1 *", True),
    ("30 10 * * *", "* 10 * 1-11 *", False),   # December
    ("30 10 * * *", "* 10 * * 1-5", False),    # weekends
    ("*/10 * * * *", "* 10 * * *", False),
    ("0 10 * * 1-5", "* 10 * * 1-4", False),   # Fridays
    ("0 10 1 * *", "* * 1-7 * 1-5", True),     # both day fields restricted: days 1-7 or weekdays, every 1st
    ("0 10 1 * *", "* * 2-7 * 1-5", False),    # ... days 2-7 or weekdays: a 1st on a weekend
    ("0 0 29 2 *", "* * * 2 1-6", False),      # a leap day on a Sunday (2032)
    ("0 0 0 1 1 * 2030", "* * * 1 1-5", True),   # 2030-01-01 is a Tuesday
    ("0 0 0 1 1 * 2030,2033", "* * * 1 1-5", False),  # 2033-01-01 is a Saturday
]


@pytest.mark.parametrize(("sched", "window", "none"), PAIRS)
def test_leaves_no_start(sched: str, window: str, none: bool) -> None:
    assert exclusion.leaves_no_start(parse_cron(sched), exclusion.parse(window)) is none
    if none:
        with pytest.raises(ScheduleError) as e:
            exclusion.check_pair(parse_cron(sched), exclusion.parse(window))
        assert e.value.argument == "exclude" and "no start" in str(e.value)


@pytest.mark.parametrize(("sched", "window"), [(p[0], p[1]) for p in PAIRS if len(p[0].split()) == 5])
def test_next_allowed_of_a_cron_schedule_is_the_first_firing_out_of_the_window(sched: str, window: str) -> None:
    """Against the minute-by-minute truth: the schedule's firings after the plan, in turn."""
    s = Schedule(interval=None, cron=parse_cron(sched), tz=BERLIN)
    w = exclusion.parse(window)
    plan = berlin(2026, 6, 1)
    while not exclusion.excluded(w, BERLIN, plan):
        plan = cron_next(s.cron, BERLIN, plan)  # type: ignore[arg-type]
    passed = exclusion.next_allowed(s, w, plan_time=plan, finish=plan + timedelta(seconds=1))
    if exclusion.leaves_no_start(s.cron, w):
        assert passed.plan is None and "every minute in which it fires is excluded" in passed.why
        return
    t, n = plan, 0
    while True:
        t = cron_next(s.cron, BERLIN, t)  # type: ignore[arg-type]
        if not exclusion.excluded(w, BERLIN, t):
            break
        n += 1
    assert passed.plan == t
    # The excluded firings after the plan (the plan itself is the skipped run), counted up to the limit.
    assert passed.count == min(n, exclusion.CRON_COUNT_LIMIT + 1) and passed.more is (n > exclusion.CRON_COUNT_LIMIT)


def _counting(monkeypatch: pytest.MonkeyPatch, module: object, name: str) -> list[int]:
    """Count the calls of module.name (the work next_allowed does), without timing anything."""
    calls: list[int] = []
    real = getattr(module, name)

    def counted(*args: object, **kwargs: object) -> object:
        calls.append(1)
        return real(*args, **kwargs)
    monkeypatch.setattr(module, name, counted)
    return calls


@pytest.mark.parametrize(("sched", "window"), [("30 10 * * *", "* 10 * * *"), ("* 0-29 * * * *", "0-29 * * * *"),
                                               ("0 3 * * *", "* 3 * * *"), ("0 0 * * *", "0 * * * *")])
def test_a_cron_schedule_the_window_takes_whole_is_given_up_at_once(monkeypatch: pytest.MonkeyPatch, sched: str,
                                                                    window: str) -> None:
    # A row written past the API (which refuses it): the scheduler used to search 100,000 steps
    # (20 s to minutes of its loop) before it disabled the job.
    s = Schedule(interval=None, cron=parse_cron(sched), tz=BERLIN)
    w = exclusion.parse(window)
    plan = cron_next(parse_cron(sched), BERLIN, berlin(2026, 6, 1))
    checks = _counting(monkeypatch, exclusion, "excluded")
    steps = _counting(monkeypatch, schedule, "skipped_slots")
    passed = exclusion.next_allowed(s, w, plan_time=plan, finish=plan + timedelta(seconds=1))
    assert passed.plan is None and passed.why == "every minute in which it fires is excluded"
    assert (len(checks), len(steps)) == (1, 0)


@pytest.mark.parametrize(("seconds", "window"), [(86400, "* 10 * * *"), (3600, "30 * * * *"),
                                                 (7 * 86400, "* * * * MON")])
def test_an_interval_schedule_the_window_takes_whole_is_given_up_within_max_steps(
        monkeypatch: pytest.MonkeyPatch, seconds: int, window: str) -> None:
    plan = berlin(2026, 6, 1, 10, 30)  # a Monday
    j = Job(job_id=1000, job_name="j", kind="proc", owner="alice", proc_schema="public", proc_name="p",
            is_procedure=True, command=None, code_module=None, code_function=None, config=None,
            schedule=every(seconds, plan), max_runtime=None, max_retries=-1, retry_period=timedelta(minutes=5),
            exclude=exclusion.parse(window))
    steps = _counting(monkeypatch, schedule, "next_after_success")
    end = end_of_run(j, outcome=Outcome.SKIPPED, plan_time=plan, finish=plan + timedelta(seconds=1),
                     consecutive_failures=0, consecutive_crashes=0, message=None, rng=random.Random(1))
    assert (end.next_start, end.next_state) == (None, JobState.DISABLED)
    assert end.disable_reason is not None and end.disable_reason.startswith(
        f"exclude '{window}' leaves the schedule no start: its next plans fall in {exclusion.MAX_STEPS} stretches")
    assert len(steps) == exclusion.MAX_STEPS + 1


def test_a_long_window_is_one_step_whatever_the_schedule(monkeypatch: pytest.MonkeyPatch) -> None:
    steps = _counting(monkeypatch, schedule, "next_after_success")
    # Every second, January to November excluded: one jump, the 28 million plans counted by arithmetic.
    second = every(1, berlin(2026, 1, 1))
    passed = exclusion.next_allowed(second, exclusion.parse("* * * 1-11 *"), plan_time=berlin(2026, 1, 1),
                                    finish=berlin(2026, 1, 1, 0, 0, 0, 5000))
    assert passed.plan == berlin(2026, 12, 1) and passed.count == 334 * 86400 - 1 and not passed.more
    assert len(steps) == 2
    # A weekend: Saturday 00:00 to Monday 00:00 in one step.
    hourly = every(3600, berlin(2026, 1, 1))
    passed = exclusion.next_allowed(hourly, exclusion.parse("* * * * SAT,SUN"), plan_time=berlin(2026, 11, 28),
                                    finish=berlin(2026, 11, 28, 0, 0, 1))
    assert passed == exclusion.Passed(berlin(2026, 11, 30), 47, berlin(2026, 11, 29, 23, 0))
    # A cron schedule every second: the plans passed over are counted up to a limit, no further.
    cron = Schedule(interval=None, cron=parse_cron("* * * * * *"), tz=BERLIN)
    found = _counting(monkeypatch, exclusion, "cron_next")
    passed = exclusion.next_allowed(cron, exclusion.parse("* * * 1-11 *"), plan_time=berlin(2026, 1, 1),
                                    finish=berlin(2026, 1, 1, 0, 0, 0, 5000))
    assert passed.plan == berlin(2026, 12, 1) and passed.more and passed.count == exclusion.CRON_COUNT_LIMIT + 1
    assert len(found) <= 3
