"""The scheduler's in-memory records: a job's settings, a claimed run and its job's definition.

Only runs in progress are held in memory; the catalog stays the source of truth.
JobSettings is the Python side of the one definition of a job's settings, SQL's
pgsched.job_settings (sql/api/10_jobs.sql): same names, order and defaults, which
tests/integration/test_settings_contract.py checks against the database.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta
from typing import Any

from pgsched.catchup import Policy
from pgsched.cron import Cron
from pgsched.protocol import run_app_name
from pgsched.schedule import Schedule

# A job's priority: seconds of precedence among due jobs. SQL's _check_settings (sql/api/10_jobs.sql)
# refuses the same range (tests/integration/test_priority.py checks both ends on both sides).
PRIORITY_MIN, PRIORITY_MAX = -3600, 3600
# A concurrency key's length, as _check_settings and set_concurrency_limit refuse it.
MAX_CONCURRENCY_KEY = 200
# PostgreSQL's integer and bigint: a job's id, a run's id and rows_affected are these.
INT4_MAX = 2**31 - 1
INT8_MIN, INT8_MAX = -(2**63), 2**63 - 1


@dataclass(frozen=True)
class JobSettings:
    """A job's settings, as SQL's pgsched.job_settings defines them (intervals as timedelta)."""

    schedule: str
    fixed_schedule: bool = True
    initial_start: datetime | None = None
    timezone: str | None = None
    config: Any = None
    scheduled: bool = True
    job_name: str | None = None
    max_runtime: timedelta | None = None
    max_retries: int = -1
    retry_period: timedelta = timedelta(minutes=5)
    catch_up: str = "latest"
    catch_up_window: timedelta | None = None
    max_plans_per_tick: int = 100
    schedule_delay: timedelta = timedelta(0)
    allow_stale_reentry: bool = False
    scope_query: str | None = None
    database: str | None = None  # the database its runs' sessions open in; None: the scheduler's own
    priority: int = 0  # seconds of precedence among due jobs (the claim's order; README "Priority")
    exclude: str | None = None  # minutes not to run in, a 5-field cron (pgsched/exclusion.py)
    jitter: timedelta = timedelta(0)  # each planned start is delayed by up to this (README "Jitter")
    concurrency_key: str | None = None  # runs sharing it are limited over every instance (README "Concurrency limits")
    depends_on: list[int] | None = None  # the ids of the jobs it runs after (README "Dependencies")
    history: str = "all"  # which ended runs keep a row: all, failures, none (README "History and retention")
    success_retention: timedelta | None = None  # None: the database's (pgsched.set_retention)
    failure_retention: timedelta | None = None  # None: the database's

    @classmethod
    def from_launch_row(cls, row: dict[str, Any]) -> JobSettings:
        """The settings in a claim's launch row (pgsched._launch_row_v2): each by its own name, an
        interval setting in seconds as `<name>_s` (extract(epoch ...), as SQL reads it).

        A setting missing from the row raises KeyError: the launch row and this class disagree.
        """
        return cls(**{name: read(row[column]) for name, column, read in _LAUNCH_COLUMNS})


# How each setting is read from the launch row: typed columns as they come, an interval from its
# seconds. Worked out once: it runs for every claimed run.
_SECONDS: dict[str, Any] = {
    "timedelta": lambda v: timedelta(seconds=v),
    "timedelta | None": lambda v: None if v is None else timedelta(seconds=v),
}
_LAUNCH_COLUMNS: list[tuple[str, str, Any]] = [
    (f.name, f"{f.name}_s", _SECONDS[str(f.type)]) if str(f.type) in _SECONDS else (f.name, f.name, lambda v: v)
    for f in fields(JobSettings)
]


@dataclass(frozen=True)
class Job:
    """A job's definition as the claim read it."""

    job_id: int
    job_name: str
    kind: str  # proc | command | python
    owner: str | None  # None: the owner role was dropped
    proc_schema: str | None
    proc_name: str | None
    is_procedure: bool | None  # None: the proc no longer exists
    command: str | None
    code_module: str | None
    code_function: str | None
    config: Any
    schedule: Schedule
    max_runtime: timedelta | None
    max_retries: int
    retry_period: timedelta
    catch_up: Policy = field(default_factory=Policy)
    schedule_delay: timedelta = timedelta(0)  # a plan becomes eligible this long after its plan time
    allow_stale_reentry: bool = False
    scope_query: str | None = None  # a scoped job: each plan runs once per key this query returns
    database: str | None = None  # its runs' sessions open in this database; None: the scheduler's own
    exclude: Cron | None = None  # its exclusion window: plans in these minutes are skipped
    depends_on: tuple[int, ...] = ()  # its upstream jobs: a scheduled plan runs only after they succeeded


@dataclass
class Run:
    """One claimed run: its identity, its job, and the job_stat counters before it started."""

    run_id: int
    job: Job
    plan_time: datetime
    started_at: datetime
    consecutive_failures: int  # before this run
    consecutive_crashes: int  # before this run
    lease_token: int
    scope: str = ""  # '' for a plan run; a scope key for one scope of a scoped job's plan
    attempt: int = 1  # 2 and up: a takeover of a stale run of the same plan, or a scope's retry
    worker_pid: int | None = None
    backend_pid: int | None = None
    deadline: datetime | None = None
    terminate_at: datetime | None = None  # when a cancelled run gets terminated/killed
    forced: str | None = None  # 'timeout' or 'cancelled' once the scheduler decided to stop the run
    pids_changed: bool = False  # another worker or backend than the claim recorded ran it
    manual: bool = False  # started by trigger_job: its end leaves the schedule as it is (like run_job)
    cancelled_by: str | None = None  # the role whose cancel_job request stopped it

    @property
    def fans_out(self) -> bool:
        """The plan run of a scoped job: it queues one run per scope instead of running the job."""
        return not self.scope and self.job.scope_query is not None

    @property
    def config(self) -> Any:
        """The config the job receives: a scope run's has its scope key under "scope"."""
        if not self.scope:
            return self.job.config
        if isinstance(self.job.config, dict):
            return {**self.job.config, "scope": self.scope}
        return {"scope": self.scope} if self.job.config is None else {"config": self.job.config, "scope": self.scope}

    @property
    def app_name(self) -> str:
        """application_name of the run's backend (pgsched.protocol.run_app_name)."""
        return run_app_name(self.job.job_id, self.run_id, self.lease_token)
