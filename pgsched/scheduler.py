"""The scheduler loop: one thread that sleeps until something is due, then does it.

It waits on the LISTEN connection's socket, the workers' pipes and a signal
wake-up pipe, with a timeout at the earliest of: the next job's start, a run's
deadline, the next heartbeat or the safety re-read. Then it reaps what ended
(mark_end, one transaction for all of them, held up to 10 ms for more), enforces
timeouts, and claims what is due for its idle workers (mark_start, one statement). Time is database
time (clock.py). `run(until=...)` bounds the loop for tests. A schema that does
not serve this code's internal API (pgsched/api.py), found on connect, on a
reconnect or after an SQL error, stops the loop with SchemaVersionMismatch.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta

import psycopg

from pgsched import __version__, app, catchup, dispatch, launcher, schedule
from pgsched.config import redact
from pgsched.errors import DeployError, SchemaVersionMismatch, first_line
from pgsched.requests import Requests
from pgsched.settings import Settings, default_max_workers
from pgsched.state import log_change, unusable
from pgsched.store import Store

__all__ = ["Scheduler", "Settings"]

log = logging.getLogger("pgsched.scheduler")

# Overdue by more than this (seconds), a job is looked at by the catch-up pass.
CATCH_UP_LATE = 1.0


class Scheduler(Requests):
    """The loop; its parts are in pgsched.dispatch (runs in hand), pgsched.recovery (leases) and
    pgsched.requests (trigger_job, cancel_job)."""

    # -- public ---------------------------------------------------------------------------
    def request_stop(self) -> None:
        if not self.stopping:
            log.info("stopping: no new runs; waiting up to %ss for %d running", self.settings.shutdown_timeout,
                     len(self.runs))
        if not self.stopping and self.sd is not None:
            self.sd.stopping()
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
                began = time.monotonic()
                self._tick()
                if self.metrics is not None:
                    self.metrics.ticked(time.monotonic() - began)
                if self.sd is not None:
                    self.sd.tick()
                self._wait()
            self._flush()
        finally:
            try:
                self.held_records.write()
            finally:
                self._shutdown()

    # -- one round of work -------------------------------------------------------------
    def _tick(self) -> None:
        if self.reload_requested:
            self._reload()
        self._read_workers()
        launcher.reap_strays(self.workers)
        self._enforce_deadlines()
        if self.store is None and time.monotonic() >= self._reconnect_at:
            self._connect(startup=False)
        if self.store is None:
            return
        try:
            if self.standby:
                self._flush()
                self._check_standby()
                if self.standby or self.store is None:  # still a standby, or a start that failed
                    return
                # Promoted: go on with this round (workers, plan, claims) instead of
                # sleeping until the next heartbeat first.
            if self.stopping and not self._peers_woken:
                # Jobs this instance no longer claims go to the others now, not at their next heartbeat.
                self._peers_woken = True
                self.store.wake_peers()
            if self.store.drain_notifies():
                self.dirty = True
                if self.store.catalog_changed:  # a job may have been deleted
                    self.store.catalog_changed = False
                    self._cancel_deleted_runs()
            # Also those found pending when it began to listen (Store.take_pending_requests).
            self._take_requests()
            now_mono = time.monotonic()
            if now_mono >= self._heartbeat_at:
                assert self.instance_id is not None
                self._heartbeat(startup=False)
            if self.dirty or now_mono >= self._safety_at:
                self._refresh_plan()
            self._ensure_workers()
            if not self.stopping:
                self._claim_due()
            self._start_triggers()
            self._flush()
        except psycopg.Error as e:
            if self._connection_gone(e):
                self._lost_connection(e)
                return
            # A statement failed on a connection that is still there: a lock timeout (any role
            # may lock pgsched.job), a catalog row the client cannot read (written by hand). It
            # must not stop the other jobs, nor cost a reconnect: report it, pause claiming a
            # moment, and go on. The schema may also have changed under us: `init` of a release
            # whose API window no longer includes ours drops functions we call; then stop with
            # the one message that says so (SchemaVersionMismatch), not the same error each round.
            self._check_schema()
            log.error("database error in the scheduler loop (continuing): %s", first_line(e))
            self._hold_claims_until = time.monotonic() + 1.0
            self.dirty = True

    def _refresh_plan(self) -> None:
        assert self.store is not None
        self.dirty = False
        if self._catch_up_due and not any(w.idle for w in self.workers.values()):
            # The catch-up after a start or a reconnect waits for an idle worker and then runs in
            # the round that claims: a decision taken while the workers were still connecting
            # would be stale by the time a run could start (with a 2 s schedule, 'latest' would
            # run the plan before the latest). Until then nothing can be claimed anyway; the
            # round a worker's report wakes looks again (no query).
            self.dirty = True
            self._safety_at = time.monotonic() + self.settings.safety_interval
            return
        if self._catch_up_due or time.monotonic() >= self._safety_at:
            self._catch_up_due = False
            self._catch_up()
        self._safety_at = time.monotonic() + self.settings.safety_interval
        next_due, unplanned = self.store.next_due()
        if unplanned:
            self._plan_unplanned()
            next_due, _ = self.store.next_due()
        # Runs that ended but are not written yet still hold their job as 'starting' in the
        # catalog: their next starts (and scope retries) are known only here.
        held = dispatch.held_wakeups(self.pending)
        self.next_due = min([t for t in (next_due, *held) if t is not None], default=None)

    def _catch_up(self) -> None:
        """Apply each overdue job's catch-up policy (pgsched/catchup.py): what runs, what is missed."""
        assert self.store is not None
        changes = []
        for b in self.store.behind(timedelta(seconds=CATCH_UP_LATE)):
            if b.schedule is None or b.schedule.by_database:
                continue
            # Lateness counts from when the plan became due, its jitter included: a plan of a
            # catch_up = 'none' job that waited for its jitter is not late for that. The horizon is
            # the claim's (claim_ahead): a plan the next claim takes ahead of its time is the latest
            # one, else the decision could choose the plan before it a few ms before it is claimed.
            now = self.clock.now() + timedelta(seconds=self.settings.claim_ahead) - b.jitter
            try:
                d = catchup.decide(b.schedule, b.policy, plan=schedule.plan_of(b.next_start, b.schedule_delay),
                                   horizon=schedule.plan_of(now, b.schedule_delay))
            except (ValueError, OverflowError):
                continue  # the claim or the end of the run disables it with the reason
            if d.missed:
                log.warning("job %s is behind (catch_up = %s): %d plan(s) from %s to %s missed; next plan %s",
                            b.job_id, b.policy.mode, d.missed, _iso(d.first_missed), _iso(d.last_missed),
                            d.plan.isoformat())
            if d.missed or d.plan != schedule.plan_of(b.next_start, b.schedule_delay):
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
        log.error("job %s disabled: %s", job_id, reason)
        log_change(job_id, None, self.store.disable(job_id, reason), reason)

    # -- connection ---------------------------------------------------------------------
    def _connect(self, *, startup: bool) -> None:
        try:
            store = Store(self.settings.dsn, self.clock, code_modules=self.settings.apps)
        except psycopg.OperationalError as e:
            if startup and self._reconnect_delay == 0.2:
                log.warning("cannot connect to %s: %s", redact(self.settings.dsn), first_line(e))
            self._schedule_reconnect()
            return
        try:
            # At start and on every reconnect (a reconnect may follow `init` of another release):
            # outside the API window (pgsched/api.py) this raises, and `serve` stops with its message.
            store.check_version()
            self.store = store
            was = self.settings.max_workers
            self._fit_workers_to_server()
            if self.instance_id is not None and self.settings.max_workers != was:
                log.info("max_workers=%s, the default for this machine and a server of %s connections (was %s)",
                         self.settings.max_workers, store.connection_budget, was)
                self._retire_surplus_workers()
            # Registered by number: once libpq drops a lost connection, conn.fileno() raises,
            # so _lost_connection could not name the socket any other way.
            self._db_fd = store.fileno()
            self._selector.register(self._db_fd, selectors.EVENT_READ, "db")
            self._reconnect_delay = 0.2
            if store.in_recovery():
                if not self.standby:
                    log.info("the server is a standby (read-only): idle until it is promoted")
                    if self.sd is not None:
                        self.sd.ready("the server is a standby (read-only): idle until it is promoted")
                self.standby = True
                self._safety_at = time.monotonic() + self.settings.standby_poll
                return
            self._become_active(first=self.instance_id is None)
        except (SchemaVersionMismatch, DeployError):
            store.close()
            raise
        except psycopg.OperationalError as e:
            self._lost_connection(e)
        except psycopg.Error as e:
            # Not the connection: a statement that met the schema in the middle of a change.
            # Outside our API window that stops us; a reconnect otherwise tries again later
            # rather than end the process (with the runs it holds) over one statement.
            self._check_schema()
            if startup:
                raise
            self._lost_connection(e)

    def _fit_workers_to_server(self) -> None:
        """The default worker count (none was set) within the connected server's share
        (settings.default_max_workers), at every connect and reload: before any worker starts, and
        after a server restart that changed max_connections. The caller retires the workers
        beyond it (_retire_surplus_workers)."""
        if self.store is None or not self.settings.max_workers_default:
            return
        fitted = default_max_workers(connections=self.store.connection_budget)
        if fitted != self.settings.max_workers:
            self.settings = replace(self.settings, max_workers=fitted)

    def _connection_gone(self, e: psycopg.Error) -> bool:
        """Whether `e` lost the connection. psycopg raises OperationalError for a lock timeout or a
        cancelled statement too, after which the connection is still there (Store.lost)."""
        return isinstance(e, psycopg.OperationalError) and (self.store is None or self.store.lost())

    def _check_schema(self) -> None:
        """After an SQL error: raise SchemaVersionMismatch if the schema no longer serves our API."""
        if self.store is None:
            return
        try:
            self.store.check_version()
        except psycopg.OperationalError as e:
            self._lost_connection(e)  # the check runs again on reconnecting
        except psycopg.Error:
            pass  # it cannot tell; the error is reported as it is

    def _become_active(self, *, first: bool) -> None:
        assert self.store is not None
        self.standby = False
        # Now, not at the end of the round: the first workers then fork and connect while this
        # process registers, beats and plans, instead of after it.
        self._ensure_workers()
        if not self.store.listening:  # connected while the server was a standby
            self.store.listen()
        self.store.take_pending_requests()
        if first and self.settings.apps:
            self._deploy()
        if first:
            self.instance_id = self.store.register_instance(socket.gethostname(), os.getpid(), __version__,
                                                            self.settings.max_workers)
            log.info("scheduler instance %s started (max_workers=%s%s)", self.instance_id, self.settings.max_workers,
                     f", the default for this machine and a server of {self.store.connection_budget} connections"
                     if self.settings.max_workers_default else "")
            # Its own thread and connection, from the first time the server takes writes on.
            self._purger.start()
        else:
            log.info("reconnected to the database")
            assert self.instance_id is not None
            if not self.store.instance_exists(self.instance_id):
                # Cut off for longer than the history's retention: our runs were taken over and our
                # row pruned (pgsched.purge_history). The runs still in hand lose their leases at the
                # next heartbeat, as after any takeover.
                old = self.instance_id
                self.instance_id = self.store.register_instance(socket.gethostname(), os.getpid(), __version__,
                                                                self.settings.max_workers)
                log.warning("scheduler instance %s was removed while this process was cut off from the "
                            "database: registered again as instance %s", old, self.instance_id)
        # A server restart ends every session, so each scheduler comes here after one.
        armed = self.store.arm_restart_jobs()
        if armed:
            log.info("%d @restart job(s) due: the server started at a time they have not run for", armed)
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
            raise DeployError(f"cannot deploy the jobs of {', '.join(self.settings.apps)}: {first_line(e)}") from None
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
            try:
                self._become_active(first=self.instance_id is None)
            except (SchemaVersionMismatch, DeployError):
                raise
            except psycopg.Error as e:
                # As when connecting (_connect): a new connection tries the start again, instead
                # of a loop that goes on half started (no instance registered, or its @restart
                # jobs not armed). Also for an OperationalError on a connection still there (a
                # lock timeout: any role may lock pgsched.job), which _tick would take as one
                # failed statement.
                if not self._connection_gone(e):
                    self._check_schema()
                if self.store is not None:  # (the schema's check may have found the connection lost)
                    self._lost_connection(e)

    # -- waiting ---------------------------------------------------------------------------
    def _wait(self) -> None:
        timeout = self._wait_seconds()
        if timeout > 0 or self.held_records.overdue():
            self.held_records.write()
        if timeout <= 0:
            return
        for key, _ in self._selector.select(timeout):
            if key.data == "wake":
                with contextlib.suppress(BlockingIOError):
                    while self._wake_r.recv(4096):
                        pass

    def _wait_seconds(self) -> float:
        now_mono = time.monotonic()
        # Each deadline counts only while the round it is for can run: a heartbeat, a plan's
        # re-read or a claim need a connection to a primary. Disconnected, the next thing to do
        # is to reconnect; on a standby, to look whether it was promoted (_safety_at). Counted
        # regardless, a heartbeat that cannot happen stays due and the loop spun at 100 % CPU.
        connected = self.store is not None and not self.standby
        if self.store is None:
            # Also a tick every half dead_after: /healthz says a loop that has not ticked for
            # dead_after is hung, and the reconnect backoff reaches 12 s.
            candidates = [min(self._reconnect_at - now_mono, self.settings.dead_after / 2)]
        elif self.standby:
            candidates = [self._safety_at - now_mono]
        else:
            candidates = [self._safety_at - now_mono, self._heartbeat_at - now_mono]
        now = self.clock.now()
        if (connected and self.next_due is not None and any(w.idle for w in self.workers.values())
                and not self.stopping):
            due_in = (self.next_due - now).total_seconds() - self.settings.claim_ahead
            candidates.append(max(due_in, self._hold_claims_until - now_mono))
        for run in self.runs.values():
            for t in (run.deadline if run.forced is None else None, run.terminate_at):
                if t is not None:
                    candidates.append((t - now).total_seconds())
        if self.stopping and self.stop_deadline is not None:
            candidates.append(self.stop_deadline - now_mono)
        for limit in (self._trigger_wait(), self.sd.wait_limit() if self.sd is not None else None):
            if limit is not None:
                candidates.append(limit)
        if self.pending:
            close_at = self._flush_at if self._pending_since is None else \
                max(self._flush_at, self._pending_since + dispatch.CLOSE_WAIT_S)
            candidates.append(0.05 if self.store is None else close_at - now_mono)
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
        self._fit_workers_to_server()
        self._purger.every = self.settings.purge_interval  # from its next look on
        log.info("SIGHUP: settings reloaded (max_workers=%s)", self.settings.max_workers)
        self._retire_surplus_workers()

    def _retire_surplus_workers(self) -> None:
        """Workers beyond max_workers (lowered by a reload or a reconnect) end: an idle one now, a
        busy one when its run ends."""
        live = [w for w in self.workers.values() if not w.retiring]
        for w in live[self.settings.max_workers:]:
            w.retiring = True
            if w.run is None:
                w.close_stdin()

    def _shutdown(self) -> None:
        self._purger.stop()
        # Nothing in flight: the peers are told now and take over the next plans, instead of after
        # the idle workers are reaped (a second on a slow host). With runs in flight the instance
        # stays alive until they are gone, so no peer closes them as abandoned.
        stopped_first = not self.runs
        if stopped_first:
            self._mark_stopped()
        for worker in list(self.workers.values()):
            worker.close_stdin()
        for worker in list(self.workers.values()):
            launcher.reap(worker, timeout=2.0)
        self.workers.clear()
        launcher.stop_fork_server()
        if not stopped_first:
            self._mark_stopped()
        if self.store is not None:
            self._statements_done += self.store.statements
            self.store.close()
            self.store = None
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()
        self.log_stats("scheduler stopped")

    def _mark_stopped(self) -> None:
        """The instance's row says it stopped, which wakes the peers (errors ignored: a peer finds a
        dead instance by its heartbeat)."""
        if self.store is None or self.instance_id is None:
            return
        with contextlib.suppress(psycopg.Error):
            self.store.stop_instance(self.instance_id)

    def log_stats(self, what: str) -> None:
        """One line of counters (also on SIGUSR1). Each scheduler statement is one transaction."""
        statements = self._statements_done + (self.store.statements if self.store is not None else 0)
        per_run = statements / self.runs_ended if self.runs_ended else 0.0
        counters = {"runs_started": self.runs_started, "runs_ended": self.runs_ended, "running": len(self.runs),
                    "scheduler_transactions": statements, "per_run": round(per_run, 2)}
        log.info("%s: runs_started=%d runs_ended=%d running=%d scheduler_transactions=%d per_run=%.2f",
                 what, self.runs_started, self.runs_ended, len(self.runs), statements, per_run,
                 extra={"stats": what, **counters, "instance_id": self.instance_id})


def _iso(t: datetime | None) -> str | None:
    return None if t is None else t.isoformat()
