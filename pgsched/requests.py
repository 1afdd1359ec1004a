"""Requests from people: trigger_job (start a manual run on an idle worker of this scheduler) and
cancel_job (cancel a run this scheduler holds).

A request is a row of pgsched.request, written only by those two SECURITY DEFINER functions once
they checked the caller's rights (sql/api/50_requests.sql says why a row and not the payload). The
notification on pgsched_catalog only wakes the scheduler with the row's id: pg_notify is open to
every role, so nothing here takes the job, the plan_time, the run or the requester from a payload.
A trigger's run is started, and its row deleted, in one transaction (pgsched._start_request), so
when several schedulers hear one, it runs once. None of this is on the claim's path: a request
costs statements only when one arrived.
"""

from __future__ import annotations

import logging
import time

import psycopg

from pgsched.recovery import Recovery
from pgsched.state import Outcome

log = logging.getLogger("pgsched.scheduler")

# While a trigger waits for its job's run in progress to end (maybe on another instance,
# whose close wakes nobody), it is tried again this often. How long it is tried is the
# request's own TTL (pgsched._request_ttl(), read with it).
TRIGGER_RETRY = 0.25


class Requests(Recovery):
    """The scheduler's handling of trigger_job and cancel_job."""

    def _take_requests(self) -> None:
        """Act on the requests the last notifications woke us for: cancels now, triggers when a worker is free."""
        if self.store is None or not self.store.requests or self.instance_id is None:
            return
        ids, self.store.requests = self.store.requests, []
        for req in self.store.read_requests(ids, self.instance_id):
            if req.kind == "cancel":
                run = self.runs.get(req.run_id) if req.run_id is not None else None
                if run is not None and run.forced is None:
                    log.info("run %s of job %s: cancelled by %s", run.run_id, run.job.job_id, req.requested_by)
                    run.cancelled_by = req.requested_by
                    self._stop_run(run, Outcome.CANCELLED)
            elif not self.stopping and req.plan_time is not None:
                self._triggers[req.request_id] = (req.job_id, req.plan_time, time.monotonic() + req.expires_in)

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
        for request_id, (job_id, plan_time, give_up) in list(self._triggers.items()):
            if time.monotonic() > give_up:
                log.warning("job %s: the run triggered for %s did not start in time (request %s): dropped", job_id,
                            plan_time.isoformat(), request_id)
                del self._triggers[request_id]
                continue
            worker = next((w for w in self.workers.values() if w.idle), None)
            if worker is None:
                return
            try:
                claimed = self.store.start_manual(self.instance_id, request_id, (worker.pid, worker.backend_pid or 0))
            except psycopg.errors.ObjectInUse:
                continue  # a run of the job is in progress: after it
            del self._triggers[request_id]
            if claimed is None:
                continue  # another scheduler started it, or it is not ours (module, gone)
            if claimed.run is not None:
                claimed.run.manual = True
            self._launch_claimed([claimed], "triggered")
