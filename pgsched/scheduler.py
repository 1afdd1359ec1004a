"""The scheduler loop: one thread that sleeps until something is due, then does it.

It waits on the LISTEN connection's socket, the workers' pipes and a signal
wake-up pipe, with a timeout at the earliest of: the next job's start, a run's
deadline, the next heartbeat or the safety re-read. Then it reaps what ended
(mark_end, one transaction for all of them), enforces timeouts, and claims
what is due for its idle workers (mark_start, one statement). Time is database
time (clock.py). `run(until=...)` bounds the loop for tests.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import selectors
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

import psycopg

from pgsched import __version__, app, catchup, launcher, schedule
from pgsched.clock import Clock, DbClock
from pgsched.config import redact
from pgsched.errors import DeployError, SchemaVersionMismatch
from pgsched.faults import crashpoint
from pgsched.launcher import Worker
from pgsched.model import Run
from pgsched.state import JobState, Outcome, RunEnd, after_crash, end_of_run, transition, unusable
from pgsched.store import Abandoned, Claimed, Finish, Store

log = logging.getLogger("pgsched.scheduler")


@dataclass(frozen=True)
class Settings:
    dsn: str
    max_workers: int = 8
    shutdown_timeout: float = 30.0
    crash_wait: float = 300.0  # after a scheduler start, a crashed job waits this long before running again
    safety_interval: float = 30.0  # re-read the catalog at least this often, NOTIFY or not
    # Every heartbeat_interval an instance renews its own heartbeat and its runs' leases, and
    # looks for runs of others that nobody will finish: a dead instance's runs are found
    # within about two intervals (its session is gone), a paused one's after dead_after
    # (its leases went stale).
    heartbeat_interval: float = 2.0
    dead_after: float = 10.0
    terminate_grace: float = 2.0  # between cancelling a run's query and killing it
    reconnect_max: float = 10.0
    standby_poll: float = 5.0
    # Runs due within this many seconds are claimed early and their worker waits for the
    # plan time, so the claim's latency does not become start lag.
    claim_ahead: float = 0.02
    # Modules with @pgsched.job handlers: imported by the workers; their jobs are claimed only here
    # and on other instances that loaded them.
    apps: tuple[str, ...] = ()


class Scheduler:
    def __init__(self, settings: Settings, *, clock: Clock | None = None, rng: random.Random | None = None) -> None:
        self.settings = settings
        self.clock = clock or DbClock()
        self.rng = rng or random.Random()
        self.store: Store | None = None
        self.instance_id: int | None = None
        self.workers: dict[int, Worker] = {}
        self.runs: dict[int, Run] = {}
        self.pending: list[Finish] = []
        self.next_due: datetime | None = None
        self.dirty = True
        self.stopping = False
        self.stop_deadline: float | None = None
        self.reload_requested = False
        self.reloader: Callable[[], Settings] | None = None
        self.standby = False
        self.started_mono = time.monotonic()
        self.runs_started = 0
        self._announced_ready = False
        self.runs_ended = 0
        self._statements_done = 0  # by connections already closed
        self._orphans: list[str] = []  # application_names of runs whose backends are still to terminate
        self._hold_claims_until = 0.0
        self._spawn_failures = 0
        self._spawn_at = 0.0
        self._safety_at = 0.0
        self._catch_up_due = True
        self._heartbeat_at = 0.0
        self._reconnect_at = 0.0
        self._reconnect_delay = 0.2
        self._selector = selectors.DefaultSelector()
        self._db_fd = -1  # the store's socket as registered in the selector
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)

    # -- public ---------------------------------------------------------------------------
    def request_stop(self) -> None:
        if not self.stopping:
            log.info("stopping: no new runs; waiting up to %ss for %d running", self.settings.shutdown_timeout,
                     len(self.runs))
        self.stopping = True
        if self.stop_deadline is None:
            self.stop_deadline = time.monotonic() + self.settings.shutdown_timeout
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")

    def _stop_overdue(self) -> bool:
        """Outcomes still unwritten long after the shutdown deadline (the database is gone)."""
        grace = self.settings.terminate_grace + self.settings.reconnect_max
        return (self.stopping and self.stop_deadline is not None and not self.runs and bool(self.pending)
                and time.monotonic() > self.stop_deadline + grace)

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, lambda *_: self.request_stop())
        signal.signal(signal.SIGINT, lambda *_: self.request_stop())
        signal.signal(signal.SIGHUP, lambda *_: self._request_reload())
        signal.signal(signal.SIGUSR1, lambda *_: self.log_stats("stats"))
        signal.set_wakeup_fd(self._wake_w.fileno(), warn_on_full_buffer=False)

    def run(self, until: Callable[[], bool] | None = None) -> None:
        """Run until stopped (signal or request_stop) or until `until()` is true."""
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        try:
            self._connect(startup=True)
            while True:
                if until is not None and until():
                    self.request_stop()
                if self.stopping and not self.runs and not self.pending:
                    break
                if self._stop_overdue():
                    log.error("stopping without writing %d run outcome(s): the database is unreachable; the "
                              "next scheduler closes those runs as crashes", len(self.pending))
                    break
                self._tick()
                self._wait()
            self._flush()
        finally:
            self._shutdown()

    # -- one round of work -------------------------------------------------------------
    def _tick(self) -> None:
        if self.reload_requested:
            self._reload()
        self._read_workers()
        self._enforce_deadlines()
        if self.store is None and time.monotonic() >= self._reconnect_at:
            self._connect(startup=False)
        if self.store is None:
            return
        try:
            if self.standby:
                self._flush()
                self._check_standby()
                if self.standby:
                    return
                # Promoted: go on with this round (workers, plan, claims) instead of
                # sleeping until the next heartbeat first.
            if self.store.drain_notifies():
                self.dirty = True
                self._cancel_deleted_runs()
            now_mono = time.monotonic()
            if now_mono >= self._heartbeat_at:
                assert self.instance_id is not None
                # A run whose scheduler died just before we started is hidden from our first
                # heartbeat by the grace period (its session may come back): it is still one that
                # crashed across a start, and gets the crash wait.
                self._heartbeat(startup=now_mono - self.started_mono < 2 * self.settings.heartbeat_interval)
            if self.dirty or now_mono >= self._safety_at:
                self._refresh_plan()
            self._ensure_workers()
            if not self.stopping:
                self._claim_due()
            self._flush()
        except psycopg.OperationalError as e:
            self._lost_connection(e)
        except psycopg.Error as e:
            # A catalog row the client cannot read (written by hand) must not stop the other
            # jobs: report it, pause claiming a moment, and go on.
            log.error("database error in the scheduler loop (continuing): %s", _first_line(e))
            self._hold_claims_until = time.monotonic() + 1.0
            self.dirty = True

    def _refresh_plan(self) -> None:
        assert self.store is not None
        self.dirty = False
        if self._catch_up_due or time.monotonic() >= self._safety_at:
            self._catch_up_due = False
            self._catch_up()
        self._safety_at = time.monotonic() + self.settings.safety_interval
        next_due, unplanned = self.store.next_due()
        if unplanned:
            self._plan_unplanned()
            next_due, _ = self.store.next_due()
        # Runs that ended but are not written yet still hold their job as 'starting' in the
        # catalog: their next starts are known only here.
        for f in self.pending:
            if f.next_start is not None and (next_due is None or f.next_start < next_due):
                next_due = f.next_start
        self.next_due = next_due

    def _catch_up(self) -> None:
        """Apply each overdue job's catch-up policy (pgsched/catchup.py): what runs, what is missed."""
        assert self.store is not None
        changes = []
        for b in self.store.behind(timedelta(seconds=CATCH_UP_LATE)):
            if b.schedule is None:
                continue
            now = self.clock.now()
            try:
                d = catchup.decide(b.schedule, b.policy, plan=b.next_start - b.schedule_delay,
                                   horizon=now - b.schedule_delay)
            except (ValueError, OverflowError):
                continue  # the claim or the end of the run disables it with the reason
            if d.missed:
                log.warning("job %s is behind (catch_up = %s): %d plan(s) from %s to %s missed; next plan %s",
                            b.job_id, b.policy.mode, d.missed, _iso(d.first_missed), _iso(d.last_missed),
                            d.plan.isoformat())
            if d.missed or d.plan != b.next_start - b.schedule_delay:
                changes.append((b, d))
        self.store.catch_up(changes)

    def _plan_unplanned(self) -> None:
        assert self.store is not None
        now = self.clock.now()
        starts = []
        for job_id, sched, problem in self.store.unplanned():
            if sched is not None:
                try:
                    starts.append((job_id, schedule.first_start(sched, now)))
                    continue
                except (ValueError, OverflowError) as e:
                    problem = unusable(e)
            self._disable_bad_job(job_id, problem or "invalid schedule")
        self.store.plan(starts)

    def _disable_bad_job(self, job_id: int, reason: str) -> None:
        assert self.store is not None
        transition(job_id, JobState.SCHEDULED, JobState.DISABLED, reason)
        log.error("job %s disabled: %s", job_id, reason)
        self.store.disable(job_id, reason)

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
        # Runs that just ended are closed in the same round trip as the claim.
        batch, self.pending = self.pending, []
        try:
            claimed, next_due = self.store.claim(
                self.instance_id, [(w.pid, w.backend_pid or 0) for w in idle], ahead, finishing=batch)
        except psycopg.Error:
            self.pending = batch + self.pending  # written after reconnecting; closing is idempotent
            raise
        if batch:
            crashpoint("after_mark_end")
        crashpoint("after_mark_start")
        if claimed:
            self.next_due = next_due
        else:
            # What looked due was taken, moved or is locked by someone's open transaction:
            # ask when the next one is, but do not spin on a row we cannot have.
            self.dirty = True
            self._hold_claims_until = time.monotonic() + 0.05
        self._match_owners(claimed)
        for c in claimed:
            worker = self.workers.get(c.worker_pid or -1)
            if c.run is None or worker is None:
                transition(c.job_id, JobState.SCHEDULED, JobState.STARTING, f"run {c.run_id} claimed")
                self._fail_unrunnable(c.run_id, c.job_id, c.problem or "no worker for the run")
                continue
            self._launch_run(worker, c.run)

    def _match_owners(self, claimed: list[Claimed]) -> None:
        """Give each run a worker already connected as its owner where one was claimed for.

        The claim pairs runs and workers blindly; re-pairing them among the same workers
        saves a reconnect for every run whose owner already has a session. The pids the
        run row records are corrected when the run is closed.
        """
        runs = [c for c in claimed if c.run is not None]
        free = [self.workers[c.worker_pid] for c in runs if c.worker_pid in self.workers]
        if len(free) < len(runs):
            return
        paired: dict[int, Worker] = {}
        for c in runs:
            assert c.run is not None
            match = next((w for w in free if w.role == c.run.job.owner), None)
            if match is not None:
                free.remove(match)
                paired[c.run_id] = match
        for c in runs:
            w = paired.get(c.run_id) or free.pop(0)
            assert c.run is not None
            if (c.run.worker_pid, c.run.backend_pid) != (w.pid, w.backend_pid):
                c.run.worker_pid, c.run.backend_pid, c.run.pids_changed = w.pid, w.backend_pid, True
        claimed[:] = [replace(c, worker_pid=c.run.worker_pid) if c.run is not None else c for c in claimed]

    def _launch_run(self, worker: Worker, run: Run) -> None:
        job = run.job
        if not run.scope:  # a scope run leaves the job's state to its plan run
            transition(job.job_id, JobState.SCHEDULED, JobState.STARTING, f"run {run.run_id} claimed")
        if job.owner is None:
            self._fail_unrunnable(run.run_id, job.job_id,
                                  "the job's owner role no longer exists: delete the job or give it a new owner")
            return
        if job.kind == "proc" and job.is_procedure is None:
            self._fail_unrunnable(run.run_id, job.job_id,
                                  f"proc {job.proc_schema}.{job.proc_name}(integer, jsonb) does not exist")
            return
        if job.max_runtime is not None:
            run.deadline = run.started_at + job.max_runtime
        worker.run = run
        self.runs[run.run_id] = run
        self.runs_started += 1
        lag = (run.started_at - run.plan_time).total_seconds()
        log.info("run start job=%s name=%r run=%s plan=%s%s lag=%.3fs worker=%s", job.job_id, job.job_name,
                 run.run_id, run.plan_time.isoformat(), f" scope={run.scope!r}" if run.scope else "", lag, worker.pid)
        try:
            worker.send({
                "run_id": run.run_id, "job_id": job.job_id, "kind": job.kind, "owner": job.owner,
                "proc_schema": job.proc_schema, "proc_name": job.proc_name, "is_procedure": job.is_procedure,
                "command": job.command, "config": run.config, "app": run.app_name, "job_name": job.job_name,
                "scope_query": job.scope_query if run.fans_out else None,
                "code_module": job.code_module, "code_function": job.code_function,
                "plan_time": run.plan_time.isoformat(), "lease_token": run.lease_token, "scope": run.scope,
                # CLOCK_MONOTONIC is system-wide: the worker waits for this very instant,
                # whatever its own set-up took.
                "start_at": time.monotonic() + max(0.0, (run.started_at - self.clock.now()).total_seconds()),
            })
        except OSError:
            # The worker died between claim and send; reaping it records the crash.
            worker.retiring = True

    def _fail_unrunnable(self, run_id: int, job_id: int, reason: str) -> None:
        """A claimed run whose job cannot run at all: close it and disable the job (no crash loop)."""
        transition(job_id, JobState.STARTING, JobState.DISABLED, reason)
        log.error("job %s cannot run and is disabled: %s", job_id, reason)
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
        for _ in range(self.settings.max_workers - len(live)):
            w = launcher.launch(self.settings.dsn, self.settings.apps)
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

    def _on_worker_event(self, worker: Worker, ev: dict[str, object]) -> None:
        kind = ev.get("event")
        if kind in ("ready", "backend"):
            worker.backend_pid = int(str(ev["backend_pid"]))
            worker.role = str(ev.get("role") or "") or None
            if worker.run is not None:
                worker.run.backend_pid, worker.run.pids_changed = worker.backend_pid, True
        if kind == "ready":
            worker.ready = True
            self._spawn_failures = 0
            self.dirty = self.dirty or self.next_due is not None
            if not self._announced_ready and all(w.ready for w in self.workers.values()):
                self._announced_ready = True
                log.info("ready: %d workers connected, %.2fs after start", len(self.workers),
                         time.monotonic() - self.started_mono)
        elif kind == "done":
            run = worker.run
            if run is None or run.run_id != ev.get("run_id"):
                log.warning("worker %s reported an unknown run %s", worker.pid, ev.get("run_id"))
                return
            raw_state = ev.get("sqlstate")
            sqlstate = raw_state if isinstance(raw_state, str) else None
            detail = str(ev.get("message")) if ev.get("message") is not None else None
            msg: str | None
            if ev.get("ok"):
                outcome, sqlstate, msg = Outcome.SUCCESS, None, None
            elif ev.get("lost"):
                outcome, msg = Outcome.CRASH, f"database connection lost: {detail}"
            else:
                outcome, msg = Outcome.FAILURE, detail
            if run.forced:
                outcome = Outcome(run.forced)
                msg = self._forced_message(run, msg)
            if ev.get("owner_unusable"):
                # A dropped role or one that may not log in: retrying would only fail again.
                worker.run = None
                self._end_run(run, Outcome.FAILURE, sqlstate, msg, disable_reason=msg)
                return
            if ev.get("lost") or run.forced:
                worker.retiring = True
            worker.run = None
            rows = ev.get("rows_affected")
            scopes = ev.get("scopes")
            self._end_run(run, outcome, sqlstate, msg, rows if isinstance(rows, int) else None,
                          ev.get("result") if outcome is Outcome.SUCCESS else None,
                          scopes=[str(k) for k in scopes] if isinstance(scopes, list) and outcome is Outcome.SUCCESS
                          else None)
            if worker.retiring:
                worker.close_stdin()
        elif kind == "lost":
            worker.retiring = True  # its connection died after its run ended: replace it
        elif kind == "error":
            # Typically the connection limit, or a server still starting: back off rather than
            # respawn in a loop. Workers of one round fail together: that is one failure, not eight.
            if time.monotonic() >= self._spawn_at:
                self._spawn_failures += 1
            delay = min(0.1 * 2 ** self._spawn_failures, 5.0) * self.rng.uniform(0.8, 1.2)
            self._spawn_at = max(self._spawn_at, time.monotonic() + delay)
            log.error("worker %s could not start (retrying in %.1fs): %s", worker.pid, delay, ev.get("message"))

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
        return "cancelled by scheduler shutdown" + (f" ({detail})" if detail else "")

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
            self._orphans.pop(0)

    # -- ends of runs -------------------------------------------------------------------
    def _end_run(self, run: Run, outcome: Outcome, sqlstate: str | None, message: str | None,
                 rows_affected: int | None = None, result: object = None, disable_reason: str | None = None,
                 scopes: list[str] | None = None) -> None:
        self.runs.pop(run.run_id, None)
        self.runs_ended += 1
        finish = self.clock.now()
        job = run.job
        if run.scope:
            # One scope of a plan: its end is its own; the job's next start is its plan run's business.
            log.info("run end job=%s run=%s scope=%r outcome=%s duration=%.3fs%s", job.job_id, run.run_id,
                     run.scope, outcome, (finish - run.started_at).total_seconds(),
                     f" error={message!r}" if message else "")
            self.pending.append(Finish(
                run_id=run.run_id, outcome=outcome, sqlstate=sqlstate, message=message, next_start=None,
                finished_at=finish, lease_token=run.lease_token, rows_affected=rows_affected, result=result,
                worker_pid=run.worker_pid if run.pids_changed else None,
                backend_pid=run.backend_pid if run.pids_changed else None))
            return
        end = end_of_run(job, outcome=outcome, plan_time=run.plan_time, finish=finish,
                         consecutive_failures=run.consecutive_failures,
                         consecutive_crashes=run.consecutive_crashes, message=message, rng=self.rng)
        if disable_reason is not None:
            end = replace(end, next_state=JobState.DISABLED, disable_reason=disable_reason, next_start=None)
        current = JobState.TERMINATING if run.forced else JobState.STARTING
        transition(job.job_id, current, end.next_state, f"run {run.run_id} ended: {outcome}")
        if end.disable_reason:
            log.error("job %s (%s) %s", job.job_id, job.job_name, end.disable_reason)
            # The history row says why this was the last run, besides the job's own error.
            if message != end.disable_reason:
                message = f"{message} [{end.disable_reason}]" if message else end.disable_reason
        log.info("run end job=%s run=%s outcome=%s duration=%.3fs%s", job.job_id, run.run_id, outcome,
                 (finish - run.started_at).total_seconds(), f" error={message!r}" if message else "")
        self.pending.append(Finish(
            run_id=run.run_id, outcome=outcome, sqlstate=sqlstate, message=message, next_start=end.next_start,
            finished_at=finish, disable_reason=end.disable_reason, skipped=end.skipped, lease_token=run.lease_token,
            rows_affected=rows_affected, result=result, scopes=scopes,
            worker_pid=run.worker_pid if run.pids_changed else None,
            backend_pid=run.backend_pid if run.pids_changed else None,
        ))
        if scopes is not None:
            log.info("run %s of job %s queued %d scope run(s) for plan %s", run.run_id, job.job_id, len(scopes),
                     run.plan_time.isoformat())
        if end.next_start is not None and (self.next_due is None or end.next_start < self.next_due):
            self.next_due = end.next_start

    def _flush(self) -> None:
        if not self.pending or self.store is None:
            return
        batch, self.pending = self.pending, []
        try:
            self.store.finish(batch)
        except psycopg.Error:
            self.pending = batch + self.pending  # written after reconnecting; _mark_end is idempotent
            raise
        crashpoint("after_mark_end")

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
        transition(run.job.job_id, JobState.STARTING, JobState.TERMINATING, f"run {run.run_id}: {why}")
        run.forced = why
        run.terminate_at = self.clock.now() + timedelta(seconds=self.settings.terminate_grace)
        if self.store is None:
            return
        try:
            self.store.set_terminating(run.run_id)
            if run.backend_pid:
                self.store.cancel_backend(run.backend_pid)
        except psycopg.OperationalError as e:
            self._lost_connection(e)

    def _cancel_deleted_runs(self) -> None:
        assert self.store is not None
        for run_id in self.store.missing_runs(list(self.runs)):
            run = self.runs.get(run_id)
            if run is not None and run.forced is None:
                log.info("job %s was deleted while run %s was in progress: cancelling it", run.job.job_id, run_id)
                self._stop_run(run, Outcome.CANCELLED)

    # -- crashes found in the catalog -------------------------------------------------
    def _held(self) -> list[tuple[int, int]]:
        """(run, lease token) this process has in hand: running, or ended with the end not yet written."""
        return [*((r.run_id, r.lease_token) for r in self.runs.values()),
                *((f.run_id, f.lease_token) for f in self.pending if f.lease_token is not None)]

    def _heartbeat(self, *, startup: bool) -> None:
        """Renew our heartbeat and leases; give up runs whose lease we lost; handle others' abandoned runs."""
        assert self.store is not None and self.instance_id is not None
        lost, found = self.store.heartbeat(self.instance_id, self.settings.max_workers, self._dead_after,
                                           timedelta(seconds=self.settings.heartbeat_interval), self._held())
        self._heartbeat_at = time.monotonic() + self.settings.heartbeat_interval
        self._lose_runs(lost)
        self._close_abandoned(self._take_over(found), startup=startup)

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
        reentry = [a for a in found if a.reentry and a.cause in ("stopped", "gone", "stale")]
        if not reentry:
            return found
        idle = [w for w in self.workers.values() if w.idle] if not self.stopping else []
        taking = reentry[:len(idle)]
        for a in taking:
            self._terminate_abandoned_backend(a)
        claimed = self.store.take_over(self.instance_id, [(a.run_id, a.lease_token or 0) for a in taking],
                                       [(w.pid, w.backend_pid or 0) for w in idle[:len(taking)]])
        self._match_owners(claimed)
        for c in claimed:
            log.warning("run %s of job %s: taken over as a new attempt (allow_stale_reentry)", c.run_id, c.job_id)
            worker = self.workers.get(c.worker_pid or -1)
            if c.run is None or worker is None:
                transition(c.job_id, JobState.SCHEDULED, JobState.STARTING, f"run {c.run_id} taken over")
                self._fail_unrunnable(c.run_id, c.job_id, c.problem or "no worker for the run")
                continue
            self._launch_run(worker, c.run)
        return [a for a in found if a not in reentry]

    def _close_abandoned(self, found: list[Abandoned], *, startup: bool) -> None:
        """Close runs whose scheduler or session is gone, or whose lease went stale, as crashes."""
        assert self.store is not None
        if not found:
            return
        now = self.clock.now()
        finishes = [self._abandoned_finish(a, now, startup) for a in found]
        self.store.finish(finishes)
        self.dirty = True  # their jobs have new next starts; our own writes send us no NOTIFY

    def _terminate_abandoned_backend(self, a: Abandoned) -> None:
        # The backend may still be executing the run's query: an orphan nobody will ever read.
        if a.orphan_pid:
            log.warning("terminating orphan backend %s of run %s (job %s)", a.orphan_pid, a.run_id, a.job_id)
            assert self.store is not None
            self.store.terminate_run_backend(a.orphan_app)

    def _abandoned_finish(self, a: Abandoned, now: datetime, startup: bool) -> Finish:
        self._terminate_abandoned_backend(a)
        why = _ABANDONED.get(a.cause, "the run's scheduler or session ended before the run did").format(
            holder=a.holder, dead_after=self.settings.dead_after)
        log.warning("run %s of job %s recorded as a crash: %s", a.run_id, a.job_id, why)
        if a.schedule is None:
            end = RunEnd(Outcome.CRASH, None, JobState.DISABLED, a.problem or "invalid schedule")
        else:
            end = after_crash(a.schedule, plan_time=a.plan_time, now=now, crashes=a.consecutive_crashes,
                              retry_period=a.retry_period, rng=self.rng, delay=a.schedule_delay)
        transition(a.job_id, JobState.STARTING, end.next_state, f"run {a.run_id} abandoned: crash")
        nxt = end.next_start
        if nxt is not None and startup:
            nxt = max(nxt, now + timedelta(seconds=self.settings.crash_wait))
        return Finish(run_id=a.run_id, outcome=Outcome.CRASH, sqlstate=None, message=end.disable_reason or why,
                      next_start=nxt, finished_at=now, disable_reason=end.disable_reason, skipped=end.skipped)

    # -- connection ---------------------------------------------------------------------
    def _connect(self, *, startup: bool) -> None:
        try:
            store = Store(self.settings.dsn, self.clock, code_modules=self.settings.apps)
        except psycopg.OperationalError as e:
            if startup and self._reconnect_delay == 0.2:
                log.warning("cannot connect to %s: %s", redact(self.settings.dsn), _first_line(e))
            self._schedule_reconnect()
            return
        try:
            store.check_version()
            self.store = store
            # Registered by number: once libpq drops a lost connection, conn.fileno() raises,
            # so _lost_connection could not name the socket any other way.
            self._db_fd = store.fileno()
            self._selector.register(self._db_fd, selectors.EVENT_READ, "db")
            self._reconnect_delay = 0.2
            if store.in_recovery():
                if not self.standby:
                    log.info("the server is a standby (read-only): idle until it is promoted")
                self.standby = True
                self._safety_at = time.monotonic() + self.settings.standby_poll
                return
            self._become_active(first=self.instance_id is None)
        except (SchemaVersionMismatch, DeployError):
            store.close()
            raise
        except psycopg.OperationalError as e:
            self._lost_connection(e)

    def _become_active(self, *, first: bool) -> None:
        assert self.store is not None
        self.standby = False
        if not self.store.listening:  # connected while the server was a standby
            self.store.listen()
        if first and self.settings.apps:
            self._deploy()
        if first:
            self.instance_id = self.store.register_instance(socket.gethostname(), os.getpid(), __version__,
                                                            self.settings.max_workers)
            log.info("scheduler instance %s started (max_workers=%s)", self.instance_id, self.settings.max_workers)
        else:
            log.info("reconnected to the database")
        assert self.instance_id is not None
        self._terminate_orphans()
        self._heartbeat(startup=first)
        self._catch_up_due = True
        self.dirty = True

    def _deploy(self) -> None:
        """Write the @pgsched.job declarations of our app modules to the catalog (one transaction)."""
        assert self.store is not None
        specs = [s.catalog_row() for s in app.registered(list(self.settings.apps))]
        try:
            deployed = self.store.deploy(self.settings.apps, specs)
        except psycopg.OperationalError:
            raise
        except psycopg.Error as e:
            raise DeployError(f"cannot deploy the jobs of {', '.join(self.settings.apps)}: {_first_line(e)}") from None
        for job_id, name, action in deployed:
            log.log(logging.INFO if action != "unchanged" else logging.DEBUG, "deploy: job %s (%s) %s",
                    job_id, name, action)

    def _check_standby(self) -> None:
        assert self.store is not None
        if time.monotonic() < self._safety_at:
            return
        self._safety_at = time.monotonic() + self.settings.standby_poll
        if not self.store.in_recovery():
            log.info("the server was promoted: starting")
            self._become_active(first=self.instance_id is None)

    def _lost_connection(self, e: Exception) -> None:
        log.warning("lost the database connection: %s", _first_line(e))
        if self.store is not None:
            self._statements_done += self.store.statements
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(self._db_fd)
            self._db_fd = -1
            with contextlib.suppress(Exception):
                self.store.close()
        self.store = None
        self._schedule_reconnect()

    def _schedule_reconnect(self) -> None:
        delay = self._reconnect_delay * self.rng.uniform(0.8, 1.2)
        self._reconnect_at = time.monotonic() + delay
        self._reconnect_delay = min(self._reconnect_delay * 2, self.settings.reconnect_max)

    # -- waiting ---------------------------------------------------------------------------
    def _wait(self) -> None:
        timeout = self._wait_seconds()
        if timeout <= 0:
            return
        for key, _ in self._selector.select(timeout):
            if key.data == "wake":
                with contextlib.suppress(BlockingIOError):
                    while self._wake_r.recv(4096):
                        pass

    def _wait_seconds(self) -> float:
        now_mono = time.monotonic()
        candidates = [self._safety_at - now_mono, self._heartbeat_at - now_mono]
        if self.store is None:
            candidates.append(self._reconnect_at - now_mono)
        now = self.clock.now()
        if self.next_due is not None and any(w.idle for w in self.workers.values()) and not self.stopping:
            due_in = (self.next_due - now).total_seconds() - self.settings.claim_ahead
            candidates.append(max(due_in, self._hold_claims_until - now_mono))
        for run in self.runs.values():
            for t in (run.deadline if run.forced is None else None, run.terminate_at):
                if t is not None:
                    candidates.append((t - now).total_seconds())
        if self.stopping and self.stop_deadline is not None:
            candidates.append(self.stop_deadline - now_mono)
        if self.pending:
            candidates.append(0.05 if self.store is None else 0)
        if self.store is not None and self.store.notified:
            candidates.append(0)  # read during a statement of this round: act on it now
        return max(0.0, min(candidates))

    # -- settings and shutdown ---------------------------------------------------------
    def _request_reload(self) -> None:
        self.reload_requested = True
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")

    def _reload(self) -> None:
        self.reload_requested = False
        if self.reloader is None:
            log.info("SIGHUP: no settings file to reload")
            return
        try:
            new = self.reloader()
        except Exception as e:
            log.error("SIGHUP: settings not reloaded: %s", e)
            return
        self.settings = replace(new, dsn=self.settings.dsn)
        log.info("SIGHUP: settings reloaded (max_workers=%s)", self.settings.max_workers)
        live = [w for w in self.workers.values() if not w.retiring]
        for w in live[self.settings.max_workers:]:
            w.retiring = True
            if w.run is None:
                w.close_stdin()

    def _shutdown(self) -> None:
        for worker in list(self.workers.values()):
            worker.close_stdin()
        for worker in list(self.workers.values()):
            launcher.reap(worker, timeout=2.0)
        self.workers.clear()
        if self.store is not None:
            with contextlib.suppress(psycopg.Error):
                if self.instance_id is not None:
                    self.store.stop_instance(self.instance_id)
            self._statements_done += self.store.statements
            self.store.close()
            self.store = None
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()
        self.log_stats("scheduler stopped")

    def log_stats(self, what: str) -> None:
        """One line of counters (also on SIGUSR1). Each scheduler statement is one transaction."""
        statements = self._statements_done + (self.store.statements if self.store is not None else 0)
        per_run = statements / self.runs_ended if self.runs_ended else 0.0
        log.info("%s: runs_started=%d runs_ended=%d running=%d scheduler_transactions=%d per_run=%.2f",
                 what, self.runs_started, self.runs_ended, len(self.runs), statements, per_run)


# Overdue by more than this (seconds), a job is looked at by the catch-up pass.
CATCH_UP_LATE = 1.0

# Why a run was found abandoned, by pgsched._abandoned_runs' cause.
_ABANDONED = {
    "stopped": "{holder} stopped before the run ended",
    "gone": "{holder} lost its database session (process killed or connection lost) before the run ended",
    "stale": "stale lease: {holder} did not renew it for {dead_after}s (paused or cut off); the plan is not "
             "run again: run_job() to retry it, or allow_stale_reentry for an idempotent job",
    "session": "the session that called run_job ended before the run did",
    "lost": "this scheduler lost track of the run (a claim or close lost with the connection)",
}


def _iso(t: datetime | None) -> str | None:
    return None if t is None else t.isoformat()


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]
