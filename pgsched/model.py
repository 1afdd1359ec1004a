"""The scheduler's in-memory records: a claimed run and its job's definition.

Only runs in progress are held in memory; the catalog stays the source of truth.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from pgsched.catchup import Policy
from pgsched.protocol import run_app_name
from pgsched.schedule import Schedule


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
    attempt: int = 1  # 2 and up: a takeover of a stale run of the same plan
    worker_pid: int | None = None
    backend_pid: int | None = None
    deadline: datetime | None = None
    terminate_at: datetime | None = None  # when a cancelled run gets terminated/killed
    forced: str | None = None  # 'timeout' or 'cancelled' once the scheduler decided to stop the run
    pids_changed: bool = False  # another worker or backend than the claim recorded ran it

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
