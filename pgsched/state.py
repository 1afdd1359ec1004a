"""Job states, run outcomes and the decisions taken when a run ends.

The state machine is TimescaleDB's:

    SCHEDULED -> STARTING -> SCHEDULED          a run started and ended
                 STARTING -> TERMINATING -> SCHEDULED   a run was cancelled (timeout, shutdown)
    SCHEDULED | STARTING | TERMINATING -> DISABLED      paused, or max_retries reached
    DISABLED -> SCHEDULED                       re-enabled

The database owns it: job_stat.state is written only by the SQL in sql/api/, and a
trigger there (pgsched._state_allowed, 00_internal.sql) refuses any write, the SQL's own
or one made by hand, that is not in this table. ALLOWED is a mirror of that table for
reading; a test checks that the two agree. The scheduler never asserts a state: it logs
the states the database reports (`log_change`). `end_of_run` is pure: given the job, its
counters and how the run ended, it says the next start and whether the job must be
disabled (the close then writes DISABLED).
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum

from pgsched import catchup, exclusion, schedule
from pgsched.model import Job

log = logging.getLogger("pgsched.state")


class JobState(StrEnum):
    SCHEDULED = "scheduled"
    STARTING = "starting"
    TERMINATING = "terminating"
    DISABLED = "disabled"


class Outcome(StrEnum):
    RUNNING = "running"
    SUCCESS = "success"
    FAILURE = "failure"
    TIMEOUT = "timeout"
    CRASH = "crash"
    CANCELLED = "cancelled"
    SKIPPED = "skipped"
    MISSED = "missed"


# The mirror of pgsched._state_allowed (00_internal.sql), checked against it by
# tests/integration/test_job_state.py. A state written again unchanged is no transition.
ALLOWED: dict[JobState, frozenset[JobState]] = {
    JobState.SCHEDULED: frozenset({JobState.STARTING, JobState.DISABLED}),
    JobState.STARTING: frozenset({JobState.SCHEDULED, JobState.TERMINATING, JobState.DISABLED}),
    JobState.TERMINATING: frozenset({JobState.SCHEDULED, JobState.DISABLED}),
    JobState.DISABLED: frozenset({JobState.SCHEDULED}),
}

# A run starting and ending: in the run start/end log lines already (compared as the strings
# the database reports, so that the hot path builds nothing when debug logging is off).
_ROUTINE = {("scheduled", "starting"), ("starting", "scheduled"), (None, "starting")}


class AbandonedCause(StrEnum):
    """Why pgsched._abandoned_runs_v2 found a run nobody will finish (its `cause` column, exactly these values)."""

    STOPPED = "stopped"  # its scheduler stopped (or its instance row is gone)
    GONE = "gone"  # its scheduler's session ended and it stopped heartbeating (kill -9, lost connection)
    STALE = "stale"  # its lease was not renewed for dead_after (a paused or partitioned scheduler)
    SESSION = "session"  # the session of a run_job call ended
    LOST = "lost"  # a run of our own that we do not hold (a claim or close lost with the connection)


# A stale run of a job with allow_stale_reentry is taken over for these causes; the others close it.
REENTRANT_CAUSES = frozenset({AbandonedCause.STOPPED, AbandonedCause.GONE, AbandonedCause.STALE})


def log_change(job_id: int, before: str | None, after: str | None, why: str) -> None:
    """Log a change of a job's state as the database reported it.

    `before` None: the database said only where the job is now (a claim). Nothing is
    logged when the state did not change (a scope run leaves it to its plan run) or is
    unknown (the job is gone).
    """
    if after is None or before == after:
        return
    level = logging.DEBUG if (before, after) in _ROUTINE else logging.INFO
    if not log.isEnabledFor(level):
        return
    old, new = (None if before is None else JobState(before)), JobState(after)
    if old is None:
        log.log(level, "job %s: now %s (%s)", job_id, new, why)
    else:
        log.log(level, "job %s: %s -> %s (%s)", job_id, old, new, why)


@dataclass(frozen=True)
class RunEnd:
    """What closing a run writes besides its outcome."""

    outcome: Outcome
    next_start: datetime | None  # None: keep the stored one (the job is being disabled)
    # DISABLED: the close disables the job (with disable_reason); the database writes the state.
    next_state: JobState
    disable_reason: str | None = None
    # Regular plans passed over while the run was in progress: (count, first, last).
    skipped: tuple[int, datetime | None, datetime | None] = (0, None, None)
    # A plan skipped by the exclusion window: the further excluded plans passed over with it (count, last).
    excluded: tuple[int, datetime | None] = (0, None)
    # There were more of them than counted (a cron schedule's are counted up to a limit): last is the last counted.
    excluded_more: bool = False


def end_of_run(
    job: Job,
    *,
    outcome: Outcome,
    plan_time: datetime,
    finish: datetime,
    consecutive_failures: int,
    consecutive_crashes: int,
    message: str | None,
    rng: random.Random,
) -> RunEnd:
    """Next start and state after a run of `job` ended with `outcome` at `finish`.

    consecutive_failures / consecutive_crashes are the counters before this run. A
    schedule that has no further start (a cron whose years are over) disables the job.
    The job's schedule_delay shifts every plan: the schedule is evaluated at
    finish - delay, and the next start is the next plan + delay.
    """
    delay = job.schedule_delay
    if job.schedule.by_database:
        # @restart: its one plan is the server's start, no next start until the server starts again
        # (pgsched._arm_restart_jobs); @after: its upstreams' success gives it its plans, and the
        # close takes the next (sql/api/07_dependencies.sql). Neither retries. The stored start is
        # kept; the claim passes over a plan that ran.
        return RunEnd(outcome, None, JobState.SCHEDULED)
    if outcome is Outcome.SKIPPED:
        return _past_window(job, plan_time=plan_time, finish=schedule.plan_of(finish, delay))
    try:
        end = _next(job, outcome=outcome, plan_time=plan_time, finish=schedule.plan_of(finish, delay),
                    failures=consecutive_failures + 1, crashes=consecutive_crashes + 1, message=message, rng=rng)
    except (ValueError, OverflowError) as e:
        return RunEnd(outcome, None, JobState.DISABLED, unusable(e))
    return _delayed(end, delay)


# The ends of a scope run that are tried again (README "Sharded jobs"): as a plan run's, a
# failure, a timeout or a crash; not a cancel, and not a run whose owner cannot run anything.
_SCOPE_RETRIED = frozenset({Outcome.FAILURE, Outcome.TIMEOUT, Outcome.CRASH})


def scope_retry_at(s: schedule.Schedule, *, max_retries: int, retry_period: timedelta, exclude: schedule.Cron | None,
                   outcome: Outcome, attempt: int, finish: datetime, rng: random.Random,
                   not_before: datetime | None = None) -> datetime | None:
    """When a scope run that ended with `outcome` at `finish` is run again; None: it is not.

    A scope's retries are its own: they back off on the scope run's `attempt` (1 for the plan's
    first run of it, one more per retry or takeover) as a plan run backs off on its job's
    consecutive failures, `max_retries` bounds them (the job is never disabled for one scope),
    and a retry in the job's exclusion window waits for its end. The close drops a retry that
    would come at or after the job's next plan, which runs the scope again anyway. A takeover of a
    stale scope run (allow_stale_reentry) is an attempt too, and counts. The job's settings come
    as they are: from the claim's job when its own scheduler closes the run, from the heartbeat's
    read when another scheduler closes it as a crash (pgsched.recovery). `not_before`: no sooner
    than this (a crash found at a restart waits crash_wait, as a plan run's does).
    """
    if outcome not in _SCOPE_RETRIED or s.by_database or 0 <= max_retries < attempt:
        return None
    try:
        at = finish + schedule.backoff_delay(s, failures=attempt, retry_period=retry_period, rng=rng)
        at = at if not_before is None else max(at, not_before)
        return at if exclude is None else exclusion.first_allowed(exclude, s.tz, at)
    except (ValueError, OverflowError):  # absurd settings written into the catalog by hand
        return None


def _past_window(job: Job, *, plan_time: datetime, finish: datetime) -> RunEnd:
    """After a plan its job's exclusion window skipped: the next plan outside the window."""
    assert job.exclude is not None
    try:
        passed = exclusion.next_allowed(job.schedule, job.exclude, plan_time=plan_time, finish=finish)
    except (ValueError, OverflowError) as e:
        return RunEnd(Outcome.SKIPPED, None, JobState.DISABLED, unusable(e))
    if passed.plan is None:
        return RunEnd(Outcome.SKIPPED, None, JobState.DISABLED,
                      f"exclude '{job.exclude}' leaves the schedule no start: {passed.why}")
    return _delayed(RunEnd(Outcome.SKIPPED, passed.plan, JobState.SCHEDULED,
                           excluded=(passed.count, passed.last), excluded_more=passed.more), job.schedule_delay)


def after_crash(s: schedule.Schedule, *, plan_time: datetime, now: datetime, crashes: int,
                retry_period: timedelta, rng: random.Random, delay: timedelta = timedelta(0)) -> RunEnd:
    """Next start of a run found crashed at `now` (crashes: the counter including this one)."""
    if s.by_database:
        return RunEnd(Outcome.CRASH, None, JobState.SCHEDULED)  # as end_of_run: no retry before a restart
    try:
        nxt = schedule.next_after_crash(s, plan_time=plan_time, now=schedule.plan_of(now, delay), crashes=crashes,
                                        retry_period=retry_period, rng=rng)
        skipped = _skipped(s, plan_time, schedule.plan_of(now, delay))
    except (ValueError, OverflowError) as e:
        return RunEnd(Outcome.CRASH, None, JobState.DISABLED, unusable(e))
    return _delayed(RunEnd(Outcome.CRASH, nxt, JobState.SCHEDULED, skipped=skipped), delay)


def _delayed(end: RunEnd, delay: timedelta) -> RunEnd:
    if end.next_start is None or not delay:
        return end
    return replace(end, next_start=schedule.eligible_at(end.next_start, delay))


def _skipped(s: schedule.Schedule, plan_time: datetime, until: datetime) -> tuple[int, datetime | None,
                                                                                datetime | None]:
    return schedule.skipped_slots(s, plan_time=plan_time, finish=until)


def unusable(e: ValueError | OverflowError) -> str:
    """Why a schedule gives no next start: the reason its job is disabled with."""
    if isinstance(e, schedule.ScheduleError):
        return f"the schedule has no further start: {e.message}"
    # Absurd values written into the catalog by hand (a schedule of a million years).
    return f"the schedule cannot be computed: {e}"


def _next(job: Job, *, outcome: Outcome, plan_time: datetime, finish: datetime, failures: int, crashes: int,
          message: str | None, rng: random.Random) -> RunEnd:
    """end_of_run's decision; failures/crashes count this run if it was one. `finish` is already
    shifted back by the job's schedule_delay."""
    s = job.schedule
    if outcome is Outcome.SUCCESS or outcome is Outcome.CANCELLED:
        # catch_up = 'all' replays the plans that came due during the run.
        caught = catchup.after_run(s, job.catch_up, plan_time=plan_time, horizon=finish)
        if caught is not None:
            return RunEnd(outcome, caught.plan, JobState.SCHEDULED,
                          skipped=(caught.missed, caught.first_missed, caught.last_missed))
        nxt = schedule.next_after_success(s, plan_time=plan_time, finish=finish)
        return RunEnd(outcome, nxt, JobState.SCHEDULED, skipped=_skipped(s, plan_time, finish))
    skipped = _skipped(s, plan_time, finish)
    if outcome is Outcome.CRASH:
        nxt = schedule.next_after_crash(
            s, plan_time=plan_time, now=finish, crashes=crashes, retry_period=job.retry_period, rng=rng,
        )
        return RunEnd(outcome, nxt, JobState.SCHEDULED, skipped=skipped)
    nxt = schedule.next_after_failure(
        s, plan_time=plan_time, finish=finish, failures=failures, retry_period=job.retry_period, rng=rng,
    )
    if 0 <= job.max_retries < failures:
        reason = (
            f"disabled after {failures} consecutive failures (max_retries = {job.max_retries})"
            + (f"; last error: {message}" if message else "")
        )
        return RunEnd(outcome, nxt, JobState.DISABLED, reason, skipped)
    return RunEnd(outcome, nxt, JobState.SCHEDULED, skipped=skipped)
