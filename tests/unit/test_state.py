"""State machine and end-of-run decisions: pure, with literal times."""

from __future__ import annotations

import logging
import random
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from pgsched import exclusion
from pgsched.model import Job
from pgsched.schedule import Interval, Schedule, parse_cron, zone
from pgsched.state import ALLOWED, JobState, Outcome, end_of_run, log_change
from pgsched.state import scope_retry_at as retry_at_of

T0 = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


def job(schedule: Schedule, *, max_retries: int = -1, retry: timedelta = timedelta(minutes=5)) -> Job:
    return Job(job_id=1000, job_name="j", kind="proc", owner="alice", proc_schema="public", proc_name="p",
               is_procedure=True, command=None, code_module=None, code_function=None, config=None,
               schedule=schedule, max_runtime=None, max_retries=max_retries, retry_period=retry)


def scope_retry_at(j: Job, **when: Any) -> datetime | None:
    """state.scope_retry_at with the settings of `j`, as the scheduler's close passes them."""
    return retry_at_of(j.schedule, max_retries=j.max_retries, retry_period=j.retry_period, exclude=j.exclude, **when)


EVERY_HOUR = Schedule(interval=Interval(micros=3600 * 10**6), cron=None, fixed=True, origin=T0)
DRIFT_HOUR = Schedule(interval=Interval(micros=3600 * 10**6), cron=None, fixed=False)


# TimescaleDB's machine, written out so that a change to ALLOWED is a visible test change.
# The database holds the table that is enforced (pgsched._state_allowed); ALLOWED mirrors it, and
# tests/integration/test_job_state.py checks both, and that every other transition is refused.
EXPECTED = {
    ("scheduled", "starting"), ("scheduled", "disabled"),
    ("starting", "scheduled"), ("starting", "terminating"), ("starting", "disabled"),
    ("terminating", "scheduled"), ("terminating", "disabled"),
    ("disabled", "scheduled"),
}


def test_the_transition_table_is_timescaledbs() -> None:
    assert {(str(s), str(d)) for s in ALLOWED for d in ALLOWED[s]} == EXPECTED


def test_state_changes_are_logged_as_the_database_reports_them(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="pgsched.state")
    log_change(7, "starting", "disabled", "run 3 ended: failure")
    log_change(7, "starting", "starting", "unchanged: nothing to say")
    log_change(7, "scheduled", None, "the job is gone")
    log_change(7, None, "starting", "run 4 claimed")
    log_change(7, "starting", "scheduled", "run 4 ended: success")
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.INFO, "job 7: starting -> disabled (run 3 ended: failure)"),
        (logging.DEBUG, "job 7: now starting (run 4 claimed)"),
        (logging.DEBUG, "job 7: starting -> scheduled (run 4 ended: success)"),
    ]


def test_success_on_fixed_schedule_takes_next_slot_after_finish() -> None:
    # Run planned at 12:00 finished at 14:30: 13:00 and 14:00 were missed, next is 15:00.
    end = end_of_run(job(EVERY_HOUR), outcome=Outcome.SUCCESS, plan_time=T0, finish=T0 + timedelta(hours=2.5),
                     consecutive_failures=0, consecutive_crashes=0, message=None, rng=random.Random(1))
    assert end.next_start == T0 + timedelta(hours=3)
    assert end.next_state is JobState.SCHEDULED and end.disable_reason is None


def test_success_on_drifting_schedule_counts_from_finish() -> None:
    finish = T0 + timedelta(minutes=7)
    end = end_of_run(job(DRIFT_HOUR), outcome=Outcome.SUCCESS, plan_time=T0, finish=finish,
                     consecutive_failures=3, consecutive_crashes=0, message=None, rng=random.Random(1))
    assert end.next_start == finish + timedelta(hours=1)


def test_success_on_cron_schedule() -> None:
    s = Schedule(interval=None, cron=parse_cron("0 30 9 * * *"), tz=zone("Europe/Berlin"))
    end = end_of_run(job(s), outcome=Outcome.SUCCESS, plan_time=T0, finish=T0,
                     consecutive_failures=0, consecutive_crashes=0, message=None, rng=random.Random(1))
    assert end.next_start == datetime(2026, 6, 2, 7, 30, tzinfo=UTC)  # 09:30 CEST


def test_failure_backoff_doubles_within_jitter_and_is_capped() -> None:
    retry = timedelta(minutes=1)
    j = job(DRIFT_HOUR, retry=retry)
    delays = []
    for failures_before in range(10):
        end = end_of_run(j, outcome=Outcome.FAILURE, plan_time=T0, finish=T0, consecutive_failures=failures_before,
                         consecutive_crashes=0, message="x", rng=random.Random(failures_before))
        assert end.next_start is not None
        delays.append(end.next_start - T0)
    for n, d in enumerate(delays[:6]):
        base = retry * 2**n
        assert base * 0.9 <= d <= base * 1.1, (n, d)
    # Capped at 5 schedule intervals (5 h) whatever the count.
    assert all(d <= timedelta(hours=5) for d in delays)
    assert delays[9] >= timedelta(hours=5) * 0.9  # 2**9 minutes would be 8.5 h


def test_failure_never_waits_past_next_fixed_slot() -> None:
    j = job(EVERY_HOUR, retry=timedelta(minutes=50))
    finish = T0 + timedelta(minutes=30)
    end = end_of_run(j, outcome=Outcome.FAILURE, plan_time=T0, finish=finish, consecutive_failures=4,
                     consecutive_crashes=0, message="x", rng=random.Random(0))
    assert end.next_start == T0 + timedelta(hours=1)


@pytest.mark.parametrize(("max_retries", "failures_before", "disabled"), [
    (-1, 1000, False), (0, 0, True), (2, 1, False), (2, 2, True), (3, 2, False),
])
def test_max_retries_disables(max_retries: int, failures_before: int, disabled: bool) -> None:
    end = end_of_run(job(DRIFT_HOUR, max_retries=max_retries), outcome=Outcome.FAILURE, plan_time=T0, finish=T0,
                     consecutive_failures=failures_before, consecutive_crashes=0, message="boom",
                     rng=random.Random(0))
    assert (end.next_state is JobState.DISABLED) is disabled
    if disabled:
        assert end.disable_reason is not None
        assert f"max_retries = {max_retries}" in end.disable_reason and "boom" in end.disable_reason


def test_timeout_counts_as_failure_for_retries() -> None:
    end = end_of_run(job(DRIFT_HOUR, max_retries=0), outcome=Outcome.TIMEOUT, plan_time=T0, finish=T0,
                     consecutive_failures=0, consecutive_crashes=0, message=None, rng=random.Random(0))
    assert end.next_state is JobState.DISABLED


def test_crash_backs_off_on_crash_count() -> None:
    retry = timedelta(minutes=1)
    starts = [end_of_run(job(DRIFT_HOUR, retry=retry), outcome=Outcome.CRASH, plan_time=T0, finish=T0,
                         consecutive_failures=0, consecutive_crashes=c, message=None,
                         rng=random.Random(7)).next_start for c in range(4)]
    got = [t - T0 for t in starts if t is not None]
    assert len(got) == 4
    for c, d in enumerate(got):
        assert retry * 2**c * 0.9 <= d <= retry * 2**c * 1.1


def test_cancelled_run_is_not_a_failure() -> None:
    end = end_of_run(job(EVERY_HOUR, max_retries=0), outcome=Outcome.CANCELLED, plan_time=T0,
                     finish=T0 + timedelta(minutes=1), consecutive_failures=0, consecutive_crashes=0,
                     message=None, rng=random.Random(0))
    assert end.next_state is JobState.SCHEDULED
    assert end.next_start == T0 + timedelta(hours=1)


def test_a_cron_without_further_firings_disables_the_job() -> None:
    once = Schedule(interval=None, cron=parse_cron("0 0 0 1 1 * 2026"))
    end = end_of_run(job(once), outcome=Outcome.SUCCESS, plan_time=T0, finish=T0, consecutive_failures=0,
                     consecutive_crashes=0, message=None, rng=random.Random(0))
    assert end.next_state is JobState.DISABLED and end.next_start is None
    assert end.disable_reason is not None and "no further start" in end.disable_reason


def test_after_crash_backs_off_or_disables_a_schedule_without_a_next_start() -> None:
    from pgsched.state import after_crash

    end = after_crash(DRIFT_HOUR, plan_time=T0, now=T0, crashes=1, retry_period=timedelta(minutes=1),
                      rng=random.Random(0))
    assert end.next_state is JobState.SCHEDULED and end.next_start is not None
    assert timedelta(seconds=54) <= end.next_start - T0 <= timedelta(seconds=66)
    once = Schedule(interval=None, cron=parse_cron("0 0 0 1 1 * 2026"))
    gone = after_crash(once, plan_time=T0, now=T0, crashes=1, retry_period=timedelta(minutes=1),
                       rng=random.Random(0))
    assert gone.next_state is JobState.DISABLED and gone.next_start is None
    assert gone.disable_reason is not None and "no further start" in gone.disable_reason


@pytest.mark.parametrize("text", [" @restart ", "@after"])
@pytest.mark.parametrize("outcome", [Outcome.SUCCESS, Outcome.FAILURE, Outcome.CRASH, Outcome.TIMEOUT])
def test_a_job_the_database_plans_keeps_its_plan_whatever_the_outcome(outcome: Outcome, text: str) -> None:
    """@restart: no next start and no retry before the server starts again (pgsched._arm_restart_jobs);
    @after: none before its upstreams succeed again (sql/api/07_dependencies.sql)."""
    from pgsched.state import after_crash
    from pgsched.store import schedule_from_row

    s = schedule_from_row({"schedule": text, "timezone": None, "months": None})
    assert s.by_database and s.cron is None and s.interval is None
    start = datetime(2026, 5, 1, 12, tzinfo=UTC)
    end = end_of_run(job(s, max_retries=0), outcome=outcome, plan_time=start, finish=start + timedelta(seconds=3),
                     consecutive_failures=5, consecutive_crashes=5, message="boom", rng=random.Random(1))
    assert (end.outcome, end.next_start, end.next_state, end.disable_reason) == \
        (outcome, None, JobState.SCHEDULED, None)
    crash = after_crash(s, plan_time=start, now=start + timedelta(minutes=1), crashes=3,
                        retry_period=timedelta(seconds=1), rng=random.Random(1))
    assert (crash.next_start, crash.next_state) == (None, JobState.SCHEDULED)


def test_a_restart_schedule_has_neither_interval_nor_cron() -> None:
    with pytest.raises(ValueError, match="neither interval nor cron"):
        Schedule(interval=Interval(0, 0, 1), cron=None, by_database=True)
    with pytest.raises(ValueError, match="exactly one"):
        Schedule(interval=None, cron=None)


@pytest.mark.parametrize(("outcome", "retried"), [
    (Outcome.FAILURE, True), (Outcome.TIMEOUT, True), (Outcome.CRASH, True),
    (Outcome.SUCCESS, False), (Outcome.CANCELLED, False), (Outcome.SKIPPED, False),
])
def test_a_scope_run_is_retried_after_a_failure_timeout_or_crash_only(outcome: Outcome, retried: bool) -> None:
    at = scope_retry_at(job(DRIFT_HOUR), outcome=outcome, attempt=1, finish=T0, rng=random.Random(0))
    assert (at is not None) is retried


def test_a_scope_retry_backs_off_on_its_attempt_within_jitter_and_the_cap() -> None:
    retry = timedelta(minutes=1)
    for attempt in range(1, 13):  # 2**11 minutes is past the cap of 5 h
        at = scope_retry_at(job(DRIFT_HOUR, retry=retry), outcome=Outcome.FAILURE, attempt=attempt, finish=T0,
                            rng=random.Random(attempt))
        assert at is not None
        base = min(retry * 2 ** (attempt - 1), timedelta(hours=5))
        assert base * 0.9 <= at - T0 <= min(base * 1.1, timedelta(hours=5)), (attempt, at - T0)


@pytest.mark.parametrize(("max_retries", "attempt", "retried"), [
    (-1, 1000, True), (0, 1, False), (2, 1, True), (2, 2, True), (2, 3, False),
])
def test_max_retries_bounds_a_scope_s_attempts(max_retries: int, attempt: int, retried: bool) -> None:
    at = scope_retry_at(job(DRIFT_HOUR, max_retries=max_retries), outcome=Outcome.FAILURE, attempt=attempt,
                        finish=T0, rng=random.Random(0))
    assert (at is not None) is retried


def test_a_scope_retry_in_the_exclusion_window_waits_for_its_end() -> None:
    j = replace(job(DRIFT_HOUR, retry=timedelta(minutes=1)), exclude=exclusion.parse("* 12 * * *"))
    at = scope_retry_at(j, outcome=Outcome.FAILURE, attempt=1, finish=T0, rng=random.Random(0))
    assert at == T0 + timedelta(hours=1)  # 13:00 UTC, the window's first minute out
    outside = replace(j, exclude=exclusion.parse("* 3 * * *"))
    at = scope_retry_at(outside, outcome=Outcome.FAILURE, attempt=1, finish=T0, rng=random.Random(0))
    assert at is not None and timedelta(seconds=54) <= at - T0 <= timedelta(seconds=66)


def test_a_scope_retry_comes_no_sooner_than_not_before_and_then_out_of_the_window() -> None:
    """A scope run found crashed at a restart waits crash_wait (recovery passes not_before)."""
    j = job(DRIFT_HOUR, retry=timedelta(seconds=1))
    at = scope_retry_at(j, outcome=Outcome.CRASH, attempt=1, finish=T0, rng=random.Random(0),
                        not_before=T0 + timedelta(seconds=30))
    assert at == T0 + timedelta(seconds=30)
    late = scope_retry_at(j, outcome=Outcome.CRASH, attempt=1, finish=T0, rng=random.Random(0),
                          not_before=T0 - timedelta(seconds=30))
    assert late is not None and timedelta(seconds=0.9) <= late - T0 <= timedelta(seconds=1.1)
    # The wait ends in the window (13:00:10): the retry waits for its end.
    windowed = replace(j, exclude=exclusion.parse("0 13 * * *"))
    at = scope_retry_at(windowed, outcome=Outcome.CRASH, attempt=1, finish=T0, rng=random.Random(0),
                        not_before=T0 + timedelta(minutes=60, seconds=10))
    assert at == T0 + timedelta(hours=1, minutes=1)


@pytest.mark.parametrize("text", ["@restart", "@after"])
def test_a_scope_of_a_job_the_database_plans_is_not_retried(text: str) -> None:
    """As its plan runs (test_a_job_the_database_plans_keeps_its_plan_whatever_the_outcome)."""
    from pgsched.store import schedule_from_row

    s = schedule_from_row({"schedule": text, "timezone": None, "months": None})
    assert scope_retry_at(job(s), outcome=Outcome.FAILURE, attempt=1, finish=T0, rng=random.Random(0)) is None
