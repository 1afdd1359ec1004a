"""Runs in hand: claiming due runs for idle workers, launching them, reading the workers'
reports, timeouts and cancellation, and recording each end (mark_end, batched: ends wait up to
CLOSE_WAIT_S for others, to share a round trip with them and with the next claim).
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import signal
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import psycopg

from pgsched import exclusion, launcher, protocol
from pgsched.errors import first_line
from pgsched.faults import crashpoint
from pgsched.launcher import Worker
from pgsched.loop_state import LoopState
from pgsched.model import Run
from pgsched.state import JobState, Outcome, RunEnd, end_of_run, log_change, scope_retry_at
from pgsched.store import Claimed, Closed, Finish

log = logging.getLogger("pgsched.scheduler")

# How long a run that ended may wait to be closed together with others (_closes_held).
CLOSE_WAIT_S = 0.01
# How many workers may be starting (launched, not yet connected) at once: one per core.
STARTING_AT_ONCE = max(1, len(os.sched_getaffinity(0)))


def closes_wait(ended: int, since: float, now: float, max_workers: int) -> bool:
    """Whether `ended` runs, the first held back at `since`, wait for more before they are closed
    (monotonic seconds): until two claims' worth ended, or for CLOSE_WAIT_S."""
    return ended < 2 * max_workers and now < since + CLOSE_WAIT_S


def log_scope_retry(run_id: int, job_id: int, scope: str, attempt: int, at: datetime) -> None:
    """The retry a scope run's close asks for (whichever scheduler closes it)."""
    log.info("run %s of job %s, scope %r: retry (attempt %d) asked for %s (not queued if the job's next plan "
             "comes first)", run_id, job_id, scope, attempt, at.isoformat())


def held_wakeups(pending: Sequence[Finish]) -> list[datetime]:
    """When the runs of closes not yet written make something due: their jobs' next starts and the
    scope retries they ask for. A claim made meanwhile cannot know them (its next_due leaves them out)."""
    return [t for f in pending for t in (f.next_start, f.retry_at) if t is not None]


SessionKey = tuple[str | None, str | None]  # (role, database) of a worker's session


def parked_sessions(reported: list[list[str | None]]) -> frozenset[SessionKey]:
    """A worker's parked sessions as it reported them (protocol.decode checked their shape)."""
    return frozenset((k[0], k[1]) for k in reported)


def pair_by_session(runs: Sequence[SessionKey],
                    workers: Sequence[tuple[SessionKey, frozenset[SessionKey]]]) -> list[int]:
    """For each run (the session it needs), the index of the worker it goes to, each worker
    taking one (at least as many workers as runs): first the workers whose current session is the
    run's; then as many of the other runs as can be, to workers that hold their session, current
    or parked; then the rest in order.

    The second step is a maximum matching, not first come first served. Taken in turn, runs of
    owners A and B facing a worker that keeps A and B parked and one that keeps only A could
    leave B to open a new session (about 5 ms of CPU, ten runs' worth) where both had one. To
    get there a run may leave its worker's current session for another worker keeping it parked
    (a switch to a parked session costs a fraction of a new one), sometimes where another pairing
    as large would have left it in place. In a simulation of eight owners on sixteen workers of
    four sessions (claims of 6 to 12 runs, owners at random), 13 % of the runs opened a session
    taken in turn, 2 % this way.
    """
    chosen: list[int | None] = [None] * len(runs)
    taken: dict[int, int] = {}  # worker -> run
    free = list(range(len(workers)))
    for r, key in enumerate(runs):
        for n, i in enumerate(free):
            if workers[i][0] == key:
                del free[n]
                chosen[r], taken[i] = i, r
                break
    if len(taken) < len(runs):
        holding: dict[SessionKey, list[int]] = {}  # the workers holding each session, current ones first
        for i, (current, _) in enumerate(workers):
            holding.setdefault(current, []).append(i)
        for i, (_, parked) in enumerate(workers):
            for key in parked:
                holding.setdefault(key, []).append(i)
        # Augmenting paths, searched without recursion (up to max_workers deep). A search that fails
        # changes nothing, so the workers it visited stay visited for the next run's search (Kuhn's
        # algorithm: each search at most once over every worker until one succeeds).
        seen: set[int] = set()
        for start in range(len(runs)):
            if chosen[start] is not None:
                continue
            # path: (run, worker it would take from the run next on the stack); stack: each run's
            # candidates not tried yet (the workers keeping its session parked before those whose
            # current session it is: a run on a parked session is moved first).
            path: list[tuple[int, int]] = []
            stack: list[tuple[int, Iterator[int] | None]] = [(start, None)]
            end: tuple[int, int] | None = None
            while stack:
                r, candidates = stack[-1]
                if candidates is None:
                    holders = holding.get(runs[r], [])
                    idle = next((w for w in holders if w not in taken), None)
                    if idle is not None:
                        end = (r, idle)
                        break
                    candidates = iter(reversed(holders))
                    stack[-1] = (r, candidates)
                nxt = next((w for w in candidates if w not in seen), None)
                if nxt is None:
                    stack.pop()
                    if path:
                        path.pop()
                    continue
                seen.add(nxt)
                path.append((r, nxt))
                stack.append((taken[nxt], None))
            if end is None:
                continue
            for r, i in (end, *reversed(path)):
                chosen[r], taken[i] = i, r
            seen.clear()
    rest = [i for i in range(len(workers)) if i not in taken]
    return [c if c is not None else rest.pop(0) for c in chosen]


class Dispatch(LoopState):
    def _claim_due(self) -> None:
        assert self.store is not None and self.instance_id is not None
        ahead = timedelta(seconds=self.settings.claim_ahead)
        if self.next_due is None or self.next_due > self.clock.now() + ahead:
            return
        if time.monotonic() < self._hold_claims_until:
            return
        idle = [w for w in self.workers.values() if w.idle]
        if not idle:
            return
        # Runs that just ended are closed in the same round trip as the claim, unless they wait
        # for more (_closes_held).
        held = self._closes_held()
        batch = [] if held else self._take_pending()
        try:
            claimed, next_due, closes = self.store.claim(
                self.instance_id, [(w.pid, w.backend_pid or 0) for w in idle], ahead, finishing=batch,
                while_waiting=self.held_records.write)
        except psycopg.Error:
            self.pending = batch + self.pending  # written after reconnecting; closing is idempotent
            raise
        self._log_closes(batch, closes)
        if batch:
            self._flush_at = 0.0
            crashpoint("after_mark_end")
        crashpoint("after_mark_start")
        # The jobs of held-back closes are still running in the database: the claim's next_due
        # leaves out their next starts and scope retries, which only their runs' ends know.
        nexts = held_wakeups(self.pending) if held else []
        if claimed:
            self.next_due = min([t for t in (next_due, *nexts) if t is not None], default=None)
        else:
            # What looked due was taken, moved or is locked by someone's open transaction:
            # ask when the next one is, but do not spin on a row we cannot have (unless it was
            # one of ours, held back: closed below, and looked at again at once).
            self.dirty = True
            if not held:
                self._hold_claims_until = time.monotonic() + 0.05
        self._launch_claimed(claimed, "claimed")
        if held and len(claimed) < len(idle):
            # Fewer runs than idle workers: one of the held-back jobs may be due. Closed now,
            # after the claimed runs went to their workers (were the close refused, they run).
            self._flush(now=True)

    def _launch_claimed(self, claimed: list[Claimed], how: str) -> None:
        """Hand each claimed (or taken-over) run to its worker; a run that cannot run disables its job."""
        self._match_owners(claimed)
        for c in claimed:
            log_change(c.job_id, None, c.job_state, f"run {c.run_id} {how}")
            worker = self.workers.get(c.worker_pid or -1)
            if c.run is None or worker is None:
                self._fail_unrunnable(c.run_id, c.job_id, c.problem or "no worker for the run")
                continue
            try:
                self._launch_run(worker, c.run)
            except (ValueError, OverflowError) as e:
                # A setting the catalog holds that a run's start cannot use (a time past the
                # year 9999): this job's run fails and the job is disabled; the loop goes on.
                self._fail_unrunnable(c.run_id, c.job_id, f"its settings cannot be used: {e}")

    def _match_owners(self, claimed: list[Claimed]) -> None:
        """Give each run a worker already connected as its owner where one was claimed for, else
        one that keeps an idle session of its owner (pgsched.worker.Session), as many as can be
        (pair_by_session: a run may move off its owner's current session to a worker keeping it
        parked, so that another run keeps its own).

        The claim pairs runs and workers blindly; re-pairing them among the same workers
        saves a new session for every run whose owner already has one. The pids the
        run row records are corrected when the run is closed.
        """
        runs = [c for c in claimed if c.run is not None]
        free = [self.workers[c.worker_pid] for c in runs if c.worker_pid in self.workers]
        if len(free) < len(runs):
            return
        pairs = pair_by_session([(c.run.job.owner, c.run.job.database) for c in runs if c.run is not None],
                                [((w.role, w.database), w.parked) for w in free])
        for c, i in zip(runs, pairs, strict=True):
            w = free[i]
            assert c.run is not None
            if (c.run.worker_pid, c.run.backend_pid) != (w.pid, w.backend_pid):
                c.run.worker_pid, c.run.backend_pid, c.run.pids_changed = w.pid, w.backend_pid, True
        claimed[:] = [replace(c, worker_pid=c.run.worker_pid)
                      if c.run is not None and c.run.worker_pid != c.worker_pid else c for c in claimed]

    def _launch_run(self, worker: Worker, run: Run) -> None:
        job = run.job
        if (job.exclude is not None and not run.scope and not run.manual
                and exclusion.excluded(job.exclude, job.schedule.tz, run.plan_time)):
            self._skip_excluded(run)
            return
        if job.owner is None:
            self._fail_unrunnable(run.run_id, job.job_id,
                                  "the job's owner role no longer exists: delete the job or give it a new owner")
            return
        if job.kind == "proc" and job.is_procedure is None:
            self._fail_unrunnable(run.run_id, job.job_id,
                                  f"proc {job.proc_schema}.{job.proc_name}(integer, jsonb) does not exist")
            return
        # A scheduled dependent's plan (an @after job is given plans only once its upstreams succeeded).
        # Its retries and the takeover of its run are the same plan, which took the upstreams' success.
        if job.depends_on and not job.schedule.by_database and not run.scope and not run.manual \
                and run.attempt == 1 and run.consecutive_failures == 0:
            why = self._upstreams_wait(run)
            if why is not None:
                self._skip_waiting(run, why)
                return
        if job.max_runtime is not None:
            try:
                run.deadline = run.started_at + job.max_runtime
            except OverflowError:  # past the year 9999 (the API takes such a max_runtime): no deadline
                run.deadline = None
        worker.run = run
        self.runs[run.run_id] = run
        self.runs_started += 1
        lag = (run.started_at - run.plan_time).total_seconds()
        if self.metrics is not None:
            self.metrics.run_started(lag)
        if log.isEnabledFor(logging.INFO):
            self.held_records.info("run start job=%s name=%r run=%s plan=%s%s lag=%.3fs worker=%s", job.job_id,
                                   job.job_name, run.run_id, run.plan_time.isoformat(),
                                   f" scope={run.scope!r}" if run.scope else "", lag, worker.pid,
                                   extra=self._run_fields(run, "running", None, None))
        try:
            worker.send({
                "run_id": run.run_id, "job_id": job.job_id, "kind": job.kind, "owner": job.owner,
                "database": job.database,
                "proc_schema": job.proc_schema, "proc_name": job.proc_name, "is_procedure": job.is_procedure,
                "command": job.command, "config": run.config, "app": run.app_name, "job_name": job.job_name,
                "scope_query": job.scope_query if run.fans_out else None,
                "code_module": job.code_module, "code_function": job.code_function,
                "plan_time": run.plan_time.isoformat(), "lease_token": run.lease_token, "scope": run.scope,
                "attempt": run.attempt,
                # CLOCK_MONOTONIC is system-wide: the worker waits for this very instant,
                # whatever its own set-up took.
                "start_at": time.monotonic() + max(0.0, (run.started_at - self.clock.now()).total_seconds()),
            })
        except OSError:
            # The worker died between claim and send; reaping it records the crash.
            worker.retiring = True

    def _run_fields(self, run: Run, outcome: str, duration: float | None, sqlstate: str | None) -> dict[str, Any]:
        """A run's start or end record's own keys (pgsched.logs.RUN_FIELDS), for --log-format json."""
        return {"job_id": run.job.job_id, "job_name": run.job.job_name, "run_id": run.run_id,
                "outcome": str(outcome), "duration_s": duration,
                "lag_s": (run.started_at - run.plan_time).total_seconds(), "sqlstate": sqlstate,
                "instance_id": self.instance_id, "scope": run.scope or None}

    def _skip_excluded(self, run: Run) -> None:
        """A claimed plan in a minute of its job's exclusion window: closed as skipped, not run (its
        worker stays idle), and the job planned past the window."""
        job = run.job
        now = self.clock.now()
        end = end_of_run(job, outcome=Outcome.SKIPPED, plan_time=run.plan_time, finish=now,
                         consecutive_failures=run.consecutive_failures,
                         consecutive_crashes=run.consecutive_crashes, message=None, rng=self.rng)
        message = f"plan in an excluded minute (exclude '{job.exclude}')"
        count, last = end.excluded
        if count and end.excluded_more:
            message += f"; at least {count} later plan(s) too, the last counted at {last.isoformat() if last else '?'}"
        elif count:
            message += f"; the {count} later plan(s) up to {last.isoformat() if last else '?'} too"
        self._close_skipped(run, end, message, now, excluded=count)

    def _close_skipped(self, run: Run, end: RunEnd, message: str, now: datetime, *, excluded: int = 0) -> None:
        """Close a claimed plan that was not run as skipped (its worker stays idle), planning the job as `end` says."""
        job = run.job
        if end.disable_reason:
            log.error("job %s (%s) %s", job.job_id, job.job_name, end.disable_reason)
            message = f"{message} [{end.disable_reason}]"
        log.info("run skipped job=%s run=%s plan=%s: %s", job.job_id, run.run_id, run.plan_time.isoformat(), message)
        if self.metrics is not None:
            self.metrics.closed_unrun(Outcome.SKIPPED)
        self.pending.append(Finish(
            run_id=run.run_id, outcome=Outcome.SKIPPED, sqlstate=None, message=message, next_start=end.next_start,
            finished_at=now, disable_reason=end.disable_reason, skipped=end.skipped, excluded=excluded,
            lease_token=run.lease_token, schedule_delay=job.schedule_delay.total_seconds()))
        if end.next_start is not None and (self.next_due is None or end.next_start < self.next_due):
            self.next_due = end.next_start

    def _upstreams_wait(self, run: Run) -> str | None:
        """What a scheduled dependent's plan waits for (None: it may run, its upstreams' success taken)."""
        assert self.store is not None
        try:
            return self.store.take_upstreams(run.run_id)
        except psycopg.Error as e:
            # Not run on a guess: skipped, and written once the connection is back (self.pending).
            log.error("run %s of job %s: cannot read its upstream jobs: %s", run.run_id, run.job.job_id, first_line(e))
            return f"its upstream jobs could not be read ({first_line(e)})"

    def _skip_waiting(self, run: Run, why: str) -> None:
        """A scheduled dependent's plan whose upstreams have not all succeeded since its previous run:
        closed as skipped with the reason (its worker stays idle), and the job planned as after a run."""
        job = run.job
        now = self.clock.now()
        end = end_of_run(job, outcome=Outcome.SUCCESS, plan_time=run.plan_time, finish=now,
                         consecutive_failures=0, consecutive_crashes=0, message=None, rng=self.rng)
        self._close_skipped(run, end, f"plan skipped: {why}", now)

    def _fail_unrunnable(self, run_id: int, job_id: int, reason: str) -> None:
        """A claimed run whose job cannot run at all: close it and disable the job (no crash loop)."""
        log.error("job %s cannot run and is disabled: %s", job_id, reason)
        if self.metrics is not None:
            self.metrics.closed_unrun(Outcome.FAILURE)
        now = self.clock.now()
        self.pending.append(Finish(run_id=run_id, outcome=Outcome.FAILURE, sqlstate="55000", message=reason,
                                   next_start=None, finished_at=now, disable_reason=reason))

    # -- workers ------------------------------------------------------------------------
    def _ensure_workers(self) -> None:
        if self.stopping or self.store is None or self.standby:
            return
        if time.monotonic() < self._spawn_at:
            return
        live = [w for w in self.workers.values() if not w.retiring]
        # A new worker's start costs CPU: its connection's (and, when it is not forked from the fork
        # server, 0.1 to 0.3 s of importing psycopg). Launched all at once on two cores, the first
        # is ready only when most of them are; a core's worth at a time gives the first runs a
        # worker sooner, and all of them no later (forked: first run 0.29 s against 0.31-0.33 s,
        # all eight 0.34 s against 0.31-0.33 s).
        starting = sum(1 for w in live if not w.ready)
        for _ in range(min(self.settings.max_workers - len(live), STARTING_AT_ONCE - starting)):
            w = launcher.launch(self.settings.dsn, self.settings.apps, self.settings.worker_sessions)
            self.workers[w.pid] = w
            self._selector.register(w.proc.stdout, selectors.EVENT_READ, w)  # type: ignore[arg-type]

    def _read_workers(self) -> None:
        for worker in list(self.workers.values()):
            alive = worker.read()
            for ev in worker.events:
                self._on_worker_event(worker, ev)
            worker.events.clear()
            if not alive:
                self._reap(worker)

    def _on_worker_event(self, worker: Worker, ev: protocol.Event) -> None:
        if isinstance(ev, protocol.Ready | protocol.Backend):
            worker.backend_pid = ev.backend_pid
            worker.role = ev.role or None
            worker.database = ev.database
            if isinstance(ev, protocol.Backend):
                worker.parked = parked_sessions(ev.parked)
            if worker.run is not None:
                worker.run.backend_pid, worker.run.pids_changed = worker.backend_pid, True
        if isinstance(ev, protocol.Ready):
            worker.ready = True
            self._spawn_failures = 0
            self.dirty = self.dirty or self.next_due is not None
            if not self._announced_ready and \
                    sum(1 for w in self.workers.values() if w.ready) >= self.settings.max_workers:
                self._announced_ready = True
                log.info("ready: %d workers connected, %.2fs after start", len(self.workers),
                         time.monotonic() - self.started_mono)
                if self.sd is not None:
                    self.sd.ready(f"{len(self.workers)} workers connected, instance {self.instance_id}")
        elif isinstance(ev, protocol.Done):
            if ev.parked is not None:
                worker.parked = parked_sessions(ev.parked)
            run = worker.run
            if run is None or run.run_id != ev.run_id:
                log.warning("worker %s reported an unknown run %s", worker.pid, ev.run_id)
                return
            sqlstate = ev.sqlstate
            detail = ev.message
            msg: str | None
            if ev.ok:
                outcome, sqlstate, msg = Outcome.SUCCESS, None, None
            elif ev.lost:
                outcome, msg = Outcome.CRASH, f"database connection lost: {detail}"
            else:
                outcome, msg = Outcome.FAILURE, detail
            if run.forced:
                outcome = Outcome(run.forced)
                msg = self._forced_message(run, msg)
            if ev.owner_unusable:
                # A dropped role or one that may not log in: retrying would only fail again.
                worker.run = None
                self._end_run(run, Outcome.FAILURE, sqlstate, msg, disable_reason=msg)
                return
            if ev.lost or run.forced:
                worker.retiring = True
            worker.run = None
            success = outcome is Outcome.SUCCESS
            # A run its worker reported done, but recorded as forced (its timeout or cancel came
            # as it ended), committed its work: a scope's retry would do it again.
            self._end_run(run, outcome, sqlstate, msg, ev.rows_affected, ev.result if success else None,
                          scopes=ev.scopes if success else None, retry=not ev.ok)
            if worker.retiring:
                worker.close_stdin()
        elif isinstance(ev, protocol.Lost):
            # Its idle session died (a server restart, a terminated backend): replace it. Closing
            # its stdin lets it exit; a run sent before this was read still reaches it, and it
            # runs that run on a new session.
            worker.retiring = True
            if worker.run is None:
                worker.close_stdin()
        elif isinstance(ev, protocol.Failed):
            # Typically the connection limit, or a server still starting: back off rather than
            # respawn in a loop. Workers of one round fail together: that is one failure, not eight.
            if time.monotonic() >= self._spawn_at:
                self._spawn_failures += 1
            delay = min(0.1 * 2 ** self._spawn_failures, 5.0) * self.rng.uniform(0.8, 1.2)
            self._spawn_at = max(self._spawn_at, time.monotonic() + delay)
            log.error("worker %s could not start (retrying in %.1fs): %s", worker.pid, delay, ev.message)

    def _reap(self, worker: Worker) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(worker.proc.stdout)  # type: ignore[arg-type]
        code = launcher.reap(worker, timeout=1.0)
        self.workers.pop(worker.pid, None)
        run = worker.run
        if run is None:
            if code not in (0, 4, None):
                log.warning("idle worker %s %s", worker.pid, launcher.describe_exit(code))
            return
        worker.run = None
        how = launcher.describe_exit(code)
        if run.forced:
            outcome, msg = Outcome(run.forced), self._forced_message(run, None)
        else:
            outcome, msg = Outcome.CRASH, f"worker process {worker.pid} {how} during the run"
        log.warning("run %s of job %s: worker %s %s", run.run_id, run.job.job_id, worker.pid, how)
        self._terminate_backend(run)
        self._end_run(run, outcome, None, msg)

    def _forced_message(self, run: Run, detail: str | None) -> str:
        if run.forced == Outcome.TIMEOUT:
            return f"exceeded max_runtime {run.job.max_runtime}" + (f" ({detail})" if detail else "")
        why = f"cancelled by {run.cancelled_by} (cancel_job)" if run.cancelled_by else "cancelled by scheduler shutdown"
        return why + (f" ({detail})" if detail else "")

    def _terminate_backend(self, run: Run) -> None:
        """Terminate the run's backend (an orphan once its worker is gone); retried after a reconnect."""
        self._orphans.append(run.app_name)
        self._terminate_orphans()

    def _terminate_orphans(self) -> None:
        if self.store is None:
            return
        while self._orphans:
            try:
                self.store.terminate_run_backend(self._orphans[0])
            except psycopg.OperationalError:
                return  # the connection is gone: kept, and tried again after reconnecting
            except psycopg.Error as e:
                log.error("cannot terminate the backend of %r: %s", self._orphans[0], first_line(e))
            self._orphans.pop(0)

    # -- ends of runs -------------------------------------------------------------------
    def _end_run(self, run: Run, outcome: Outcome, sqlstate: str | None, message: str | None,
                 rows_affected: int | None = None, result: object = None, disable_reason: str | None = None,
                 scopes: list[str] | None = None, retry: bool = True) -> None:
        self.runs.pop(run.run_id, None)
        self.runs_ended += 1
        finish = self.clock.now()
        if self.metrics is not None:
            self.metrics.run_ended(outcome, (finish - run.started_at).total_seconds())
        job = run.job
        if run.scope:
            # One scope of a plan: its end is its own; the job's next start is its plan run's business.
            # The plan is not read again for it: the last claim said whether queued scope runs were
            # left (its next_due is then now), and a close that makes others claimable (the next
            # plan's run of this scope, a key freed) notifies, unless a claim in its own
            # transaction took runs and said what is due (store.Store.claim).
            if log.isEnabledFor(logging.INFO):
                duration = (finish - run.started_at).total_seconds()
                self.held_records.info("run end job=%s run=%s scope=%r outcome=%s duration=%.3fs%s", job.job_id,
                                       run.run_id, run.scope, outcome, duration,
                                       f" error={message!r}" if message else "",
                                       extra=self._run_fields(run, outcome, duration, sqlstate))
            retry_at = None if disable_reason is not None or not retry else scope_retry_at(
                job.schedule, max_retries=job.max_retries, retry_period=job.retry_period, exclude=job.exclude,
                outcome=outcome, attempt=run.attempt, finish=finish, rng=self.rng)
            self.pending.append(Finish(
                run_id=run.run_id, outcome=outcome, sqlstate=sqlstate, message=message, next_start=None,
                finished_at=finish, lease_token=run.lease_token, rows_affected=rows_affected, result=result,
                worker_pid=run.worker_pid if run.pids_changed else None,
                backend_pid=run.backend_pid if run.pids_changed else None, retry_at=retry_at))
            if retry_at is not None:
                log_scope_retry(run.run_id, job.job_id, run.scope, run.attempt + 1, retry_at)
                if self.next_due is None or retry_at < self.next_due:
                    self.next_due = retry_at
            return
        end = end_of_run(job, outcome=outcome, plan_time=run.plan_time, finish=finish,
                         consecutive_failures=run.consecutive_failures,
                         consecutive_crashes=run.consecutive_crashes, message=message, rng=self.rng)
        if run.manual:
            # Like run_job: recorded as any run, but the schedule and the job's state are left alone.
            end = replace(end, next_start=None, disable_reason=None, skipped=(0, None, None))
        elif disable_reason is not None:
            end = replace(end, next_state=JobState.DISABLED, disable_reason=disable_reason, next_start=None)
        if end.disable_reason:
            log.error("job %s (%s) %s", job.job_id, job.job_name, end.disable_reason)
            # The history row says why this was the last run, besides the job's own error.
            if message != end.disable_reason:
                message = f"{message} [{end.disable_reason}]" if message else end.disable_reason
        if log.isEnabledFor(logging.INFO):
            duration = (finish - run.started_at).total_seconds()
            self.held_records.info("run end job=%s run=%s outcome=%s duration=%.3fs%s", job.job_id, run.run_id,
                                   outcome, duration, f" error={message!r}" if message else "",
                                   extra=self._run_fields(run, outcome, duration, sqlstate))
        self.pending.append(Finish(
            run_id=run.run_id, outcome=outcome, sqlstate=sqlstate, message=message, next_start=end.next_start,
            finished_at=finish, disable_reason=end.disable_reason, skipped=end.skipped, lease_token=run.lease_token,
            rows_affected=rows_affected, result=result, scopes=scopes,
            schedule_delay=job.schedule_delay.total_seconds(),
            worker_pid=run.worker_pid if run.pids_changed else None,
            backend_pid=run.backend_pid if run.pids_changed else None,
        ))
        if scopes is not None:
            log.info("run %s of job %s queued %d scope run(s) for plan %s", run.run_id, job.job_id, len(scopes),
                     run.plan_time.isoformat())
        if end.next_start is not None and (self.next_due is None or end.next_start < self.next_due):
            self.next_due = end.next_start

    def _closes_held(self) -> bool:
        """Whether the runs that ended (self.pending) wait for more before they are closed.

        A close's database cost is mostly its statements' start, whatever the number of runs
        (bench/claim_close.py): under load, closes that wait up to CLOSE_WAIT_S, or until two
        claims' worth of runs ended, share one round trip. The price: a run's end is written up
        to CLOSE_WAIT_S later (its job's next run, a dependent's plan, a concurrency key's place
        wait as long), and a scheduler killed meanwhile leaves it to be closed as a crash.
        """
        if not self.pending or self.stopping or any(f.scopes is not None for f in self.pending):
            return False  # a plan run's close queues its scope runs: at once
        now = time.monotonic()
        if self._pending_since is None:
            self._pending_since = now
        return closes_wait(len(self.pending), self._pending_since, now, self.settings.max_workers)

    def _take_pending(self) -> list[Finish]:
        """The runs to close now, all of them."""
        batch, self.pending = self.pending, []
        self._pending_since = None
        return batch

    def _flush(self, *, now: bool = False) -> None:
        """Close the runs that ended, unless they wait for more (now: they do not)."""
        if not self.pending or self.store is None or (not now and self._closes_held()):
            return
        batch = self._take_pending()
        try:
            closes = self.store.close_runs(batch)
        except psycopg.Error:
            self.pending = batch + self.pending  # written after reconnecting; _mark_end is idempotent
            self._flush_at = time.monotonic() + 1.0  # not in a tight loop if the database refuses it
            raise
        self._flush_at = 0.0
        self._log_closes(batch, closes)
        crashpoint("after_mark_end")

    def _log_closes(self, batch: list[Finish], closes: list[Closed | None], *, ours: bool = True) -> None:
        """Log what the database did with each close: the job's state it wrote, or a refusal.

        A refused close of one of our runs (`ours`): someone else closed the run, typically
        because our lease went stale while we were paused and another scheduler took the run
        (fencing)."""
        for f, c in zip(batch, closes, strict=True):
            if c is not None:
                log_change(c.job_id, c.old_state, c.new_state, f"run {f.run_id} ended: {f.outcome}")
            elif ours and f.lease_token is not None:
                log.warning("run %s: end (%s) not recorded: lease lost (another scheduler closed or took over "
                            "the run while this one was paused or cut off), or it was closed already",
                            f.run_id, f.outcome)

    def _enforce_deadlines(self) -> None:
        now = self.clock.now()
        for run in list(self.runs.values()):
            if run.forced is None and run.deadline is not None and now >= run.deadline:
                self._stop_run(run, Outcome.TIMEOUT)
            elif run.terminate_at is not None and now >= run.terminate_at:
                worker = self.workers.get(run.worker_pid or -1)
                log.warning("run %s of job %s did not stop after cancel: terminating", run.run_id, run.job.job_id)
                self._terminate_backend(run)
                if worker is not None:
                    worker.signal_group(signal.SIGKILL)
                run.terminate_at = None
        if self.stopping and self.stop_deadline is not None and time.monotonic() >= self.stop_deadline:
            for run in list(self.runs.values()):
                if run.forced is None:
                    self._stop_run(run, Outcome.CANCELLED)

    def _stop_run(self, run: Run, why: Outcome) -> None:
        """Move a run to TERMINATING: cancel its query now, kill it after a grace period."""
        run.forced = why
        run.terminate_at = self.clock.now() + timedelta(seconds=self.settings.terminate_grace)
        if self.store is None:
            return
        try:
            if self.store.set_terminating(run.run_id):
                log_change(run.job.job_id, JobState.STARTING, JobState.TERMINATING, f"run {run.run_id}: {why}")
            if run.backend_pid:
                self.store.cancel_backend(run.backend_pid)
        except psycopg.OperationalError as e:
            self._lost_connection(e)
        except psycopg.Error as e:
            # E.g. a superuser's backend that a non-superuser scheduler may not signal: the grace
            # period still ends with the worker's process group killed.
            log.error("run %s: cannot cancel its query: %s", run.run_id, first_line(e))

    def _cancel_deleted_runs(self) -> None:
        assert self.store is not None
        for run_id in self.store.missing_runs(list(self.runs)):
            run = self.runs.get(run_id)
            if run is not None and run.forced is None:
                log.info("job %s was deleted while run %s was in progress: cancelling it", run.job.job_id, run_id)
                self._stop_run(run, Outcome.CANCELLED)
