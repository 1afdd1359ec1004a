"""Leases and runs nobody will finish.

Each heartbeat renews this instance's leases; a run whose lease another scheduler
took (we were paused or cut off) is stopped without recording an end. Runs of
others found abandoned (pgsched._abandoned_runs_v2) are taken over when their job
allows stale reentry and a worker is idle here, or closed as crashes (a scope run's
crash then asks for its retry, as its own scheduler would have).
"""

from __future__ import annotations

import logging
import signal
import time
from datetime import datetime, timedelta

from pgsched import schedule
from pgsched.dispatch import Dispatch, log_scope_retry
from pgsched.state import REENTRANT_CAUSES, AbandonedCause, JobState, Outcome, RunEnd, after_crash, scope_retry_at
from pgsched.store import Abandoned, Finish

log = logging.getLogger("pgsched.scheduler")

# Why a run was found abandoned, by pgsched._abandoned_runs_v2' cause.
_ABANDONED = {
    AbandonedCause.STOPPED: "{holder} stopped before the run ended",
    AbandonedCause.GONE: "{holder} lost its database session (process killed or connection lost) before the run "
                         "ended",
    AbandonedCause.STALE: "stale lease: {holder} did not renew it for {dead_after}s (paused or cut off)",
    AbandonedCause.SESSION: "the session that called run_job ended before the run did",
    AbandonedCause.LOST: "this scheduler lost track of the run (a claim or close lost with the connection)",
}
# What becomes of a plan run found stale (a scope run's is retried, see _abandoned_finish).
_STALE_PLAN = ("; the plan is not run again automatically: run_job() runs the job now, allow_stale_reentry lets an "
               "idempotent job's plan be taken over")


class Recovery(Dispatch):
    # -- crashes found in the catalog -------------------------------------------------
    def _held(self) -> list[tuple[int, int]]:
        """(run, lease token) this process has in hand: running, or ended with the end not yet written."""
        return [*((r.run_id, r.lease_token) for r in self.runs.values()),
                *((f.run_id, f.lease_token) for f in self.pending if f.lease_token is not None)]

    def _heartbeat(self, *, startup: bool) -> None:
        """Renew our heartbeat and leases; give up runs whose lease we lost; handle others' abandoned runs."""
        assert self.store is not None and self.instance_id is not None
        # The grace spares a scheduler whose connection merely dropped for a moment. At our own
        # start there is none: a holder whose session is gone now died before we came up, and
        # its runs are the ones a restart finds crashed (crash_wait applies, see _abandoned_finish).
        grace = timedelta(0) if startup else timedelta(seconds=self.settings.heartbeat_interval)
        beat = self.store.heartbeat(self.instance_id, self.settings.max_workers, self._dead_after, grace,
                                    self._held())
        self._heartbeat_at = time.monotonic() + self.settings.heartbeat_interval
        # Our peers' closes and claims send no NOTIFY (that would be a wake-up per run at full
        # throughput): a job a peer left due (it died between runs, or all its workers are busy)
        # is learnt here, one heartbeat at most after it came due.
        if beat.next_due is not None and (self.next_due is None or beat.next_due < self.next_due):
            self.next_due = beat.next_due
        if beat.unplanned:
            self.dirty = True
        self._lose_runs(beat.lost)
        self._close_abandoned(self._take_over(beat.abandoned), startup=startup)

    def _lose_runs(self, lost: list[int]) -> None:
        """Runs whose lease is no longer ours (found stale and closed or taken over by another
        scheduler while we were paused or cut off): stop them, and never write their end."""
        for run_id in lost:
            self.pending = [f for f in self.pending if f.run_id != run_id]
            run = self.runs.pop(run_id, None)
            if run is None:
                log.warning("run %s: lease lost after the run ended; its end is not recorded here", run_id)
                continue
            log.warning("run %s of job %s: lease lost (another scheduler found it stale): killing its worker "
                        "without recording an end", run_id, run.job.job_id)
            worker = self.workers.get(run.worker_pid or -1)
            if worker is not None and worker.run is run:
                worker.run = None
                worker.retiring = True
                worker.signal_group(signal.SIGKILL)
            self._terminate_backend(run)

    @property
    def _dead_after(self) -> timedelta:
        return timedelta(seconds=self.settings.dead_after)

    def _take_over(self, found: list[Abandoned]) -> list[Abandoned]:
        """Run again, on our idle workers, the abandoned runs of allow_stale_reentry jobs; the rest are returned.

        A reentrant run that finds no idle worker here is left to the next heartbeat (ours
        or another instance's): taking it over is the point, closing it would lose the plan.
        """
        assert self.store is not None and self.instance_id is not None
        reentry = [a for a in found if a.reentry and a.cause in REENTRANT_CAUSES
                   and (a.code_module is None or a.code_module in self.settings.apps)]
        if not reentry:
            return found
        idle = [w for w in self.workers.values() if w.idle] if not self.stopping else []
        taking = reentry[:len(idle)]
        for a in taking:
            self._terminate_abandoned_backend(a)
        claimed = self.store.take_over(self.instance_id, [(a.run_id, a.lease_token or 0) for a in taking],
                                       [(w.pid, w.backend_pid or 0) for w in idle[:len(taking)]])
        for c in claimed:
            log.warning("run %s of job %s: taken over as a new attempt (allow_stale_reentry)", c.run_id, c.job_id)
        self._launch_claimed(claimed, "taken over")
        return [a for a in found if a not in reentry]

    def _close_abandoned(self, found: list[Abandoned], *, startup: bool) -> None:
        """Close runs whose scheduler or session is gone, or whose lease went stale, as crashes."""
        assert self.store is not None
        if not found:
            return
        now = self.clock.now()
        finishes = [self._abandoned_finish(a, now, startup) for a in found]
        closes = self.store.close_runs(finishes)
        # Refusals are not ours to report: another scheduler closed or took the run first.
        self._log_closes(finishes, closes, ours=False)
        for a, f, c in zip(found, finishes, closes, strict=True):
            if c is not None and f.retry_at is not None:
                log_scope_retry(a.run_id, a.job_id, a.scope, (a.attempt or 1) + 1, f.retry_at)
        self.dirty = True  # their jobs have new next starts; our own writes send us no NOTIFY

    def _terminate_abandoned_backend(self, a: Abandoned) -> None:
        # The backend may still be executing the run's query: an orphan nobody will ever read.
        if a.orphan_pid:
            log.warning("terminating orphan backend %s of run %s (job %s)", a.orphan_pid, a.run_id, a.job_id)
            assert self.store is not None
            self.store.terminate_run_backend(a.orphan_app)

    def _log_abandoned(self, a: Abandoned, why: str) -> None:
        log.warning("run %s of job %s recorded as a crash: %s", a.run_id, a.job_id, why,
                    extra={"run_id": a.run_id, "job_id": a.job_id, "outcome": "crash", "abandoned": str(a.cause),
                           "instance_id": self.instance_id})

    def _abandoned_finish(self, a: Abandoned, now: datetime, startup: bool) -> Finish:
        self._terminate_abandoned_backend(a)
        why = _ABANDONED[a.cause].format(holder=a.holder, dead_after=self.settings.dead_after)
        if a.scope:
            # One scope of a plan: its end does not move the job's schedule (its plan run's does). It
            # is retried on its own, as when its own scheduler closes it (Dispatch._end_run); found at
            # a restart, no sooner than crash_wait (see below).
            retry_at = None
            if a.schedule is not None and a.attempt is not None:
                retry_at = scope_retry_at(
                    a.schedule, max_retries=a.max_retries, retry_period=a.retry_period, exclude=a.exclude,
                    outcome=Outcome.CRASH, attempt=a.attempt, finish=now, rng=self.rng,
                    not_before=now + timedelta(seconds=self.settings.crash_wait) if startup and a.after_restart
                    else None)
            if retry_at is not None:
                why += "; the scope is retried unless the job's next plan comes first"
            self._log_abandoned(a, why)
            return Finish(run_id=a.run_id, outcome=Outcome.CRASH, sqlstate=None, message=why, next_start=None,
                          finished_at=now, lease_token=a.lease_token, retry_at=retry_at)
        if a.cause is AbandonedCause.STALE:
            why += _STALE_PLAN
        self._log_abandoned(a, why)
        if a.schedule is None:
            end = RunEnd(Outcome.CRASH, None, JobState.DISABLED, a.problem or "invalid schedule")
        else:
            end = after_crash(a.schedule, plan_time=a.plan_time, now=now, crashes=a.consecutive_crashes,
                              retry_period=a.retry_period, rng=self.rng, delay=a.schedule_delay)
        nxt, skipped = end.next_start, end.skipped
        if nxt is not None and startup and a.after_restart:
            # Found by a scheduler that just started, and nobody saw its holder die: the job
            # may be what brought the last one down, so it waits crash_wait (a failover does
            # not). The slots it thereby passes over are recorded like any skipped slots.
            nxt = max(nxt, now + timedelta(seconds=self.settings.crash_wait))
            if a.schedule is not None:
                last = schedule.plan_of(nxt, a.schedule_delay) - timedelta(microseconds=1)
                skipped = schedule.skipped_slots(a.schedule, plan_time=a.plan_time, finish=last)
        return Finish(run_id=a.run_id, outcome=Outcome.CRASH, sqlstate=None, message=end.disable_reason or why,
                      next_start=nxt, finished_at=now, disable_reason=end.disable_reason, skipped=skipped,
                      # Fenced on the lease we found stale: if its holder or another scheduler acted
                      # first (a takeover), this close is refused.
                      lease_token=a.lease_token, schedule_delay=a.schedule_delay.total_seconds())
