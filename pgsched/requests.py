"""Requests from people, heard on pgsched_catalog: trigger_job (start a manual run on an idle
worker of this scheduler) and cancel_job (cancel a run this scheduler holds).

The payloads are sql/api/50_requests.sql's. A trigger names its run's plan_time, and a run is
unique by (job, scope, plan_time), so when several schedulers hear one, it runs once. None of
this is on the claim's path: a request costs a statement only when one arrived.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime, timedelta

import psycopg

from pgsched.recovery import Recovery
from pgsched.state import Outcome

log = logging.getLogger("pgsched.scheduler")

# A trigger not started within this long (its job kept running, or no worker was free) is dropped.
TRIGGER_TTL = 600.0
# While a trigger waits for its job's run in progress to end (maybe on another instance,
# whose close wakes nobody), it is tried again this often.
TRIGGER_RETRY = 0.25
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def parse_request(payload: str) -> tuple[str, int, str] | None:
    """('trigger', job_id, micros) or ('cancel', run_id, role) from a request's payload; None if malformed."""
    kind, _, rest = payload.partition(":")
    ident, _, arg = rest.partition(":")
    if kind not in ("trigger", "cancel") or not ident.isdigit() or not arg:
        return None
    if kind == "trigger" and not arg.lstrip("-").isdigit():
        return None
    return kind, int(ident), arg


def plan_time_of(micros: str) -> datetime:
    """The exact instant a trigger names (microseconds since the epoch, no float rounding)."""
    return EPOCH + timedelta(microseconds=int(micros))


class Requests(Recovery):
    """The scheduler's handling of trigger_job and cancel_job."""

    def _take_requests(self) -> None:
        """Act on the requests the last notifications brought: cancels now, triggers when a worker is free."""
        if self.store is None or not self.store.requests:
            return
        payloads, self.store.requests = self.store.requests, []
        for payload in payloads:
            req = parse_request(payload)
            if req is None:
                log.warning("ignoring a malformed request %r", payload)
                continue
            kind, ident, arg = req
            if kind == "cancel":
                run = self.runs.get(ident)
                if run is not None and run.forced is None:
                    log.info("run %s of job %s: cancelled by %s", run.run_id, run.job.job_id, arg)
                    run.cancelled_by = arg
                    self._stop_run(run, Outcome.CANCELLED)
            elif not self.stopping:
                self._triggers[(ident, plan_time_of(arg))] = time.monotonic() + TRIGGER_TTL

    def _trigger_wait(self) -> float | None:
        """Seconds until pending triggers should be tried again (None: none pending)."""
        return TRIGGER_RETRY if self._triggers else None

    def _start_triggers(self) -> None:
        """Start the pending manual runs on idle workers; a job still running keeps its request."""
        if not self._triggers or self.store is None or self.instance_id is None:
            return
        if self.stopping or self.standby:
            self._triggers.clear()
            return
        # A triggered job's last run may have ended with its close held back (dispatch): until
        # it is written, the job is still running in the database and the trigger would wait.
        self._flush(now=True)
        for key, give_up in list(self._triggers.items()):
            job_id, plan_time = key
            if time.monotonic() > give_up:
                log.warning("job %s: the run triggered for %s did not start within %.0fs: dropped", job_id,
                            plan_time.isoformat(), TRIGGER_TTL)
                del self._triggers[key]
                continue
            worker = next((w for w in self.workers.values() if w.idle), None)
            if worker is None:
                return
            try:
                claimed = self.store.start_manual(self.instance_id, job_id, plan_time,
                                                  (worker.pid, worker.backend_pid or 0))
            except psycopg.errors.ObjectInUse:
                continue  # a run of the job is in progress: after it
            del self._triggers[key]
            if claimed is None:
                continue  # another scheduler started it, or it is not ours (module, gone)
            if claimed.run is not None:
                claimed.run.manual = True
            self._launch_claimed([claimed], "triggered")
