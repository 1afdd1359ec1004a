"""The scheduler's database access: the only module that talks SQL.

Every statement here calls a named function from sql/api/ (40_scheduler.sql,
20_runs.sql, 60_code_jobs.sql), so each piece of SQL has one home. The
connection is autocommit: every call is its own transaction (closing runs and
claiming new ones share one pipelined round trip, and with no sync between them, one
transaction: a close the database refuses takes the claim with it). The
store anchors the scheduler's clock on the database time its queries return.
"""

from __future__ import annotations

import json
import logging
import operator
import re
import select
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from pgsched import exclusion, migrate, schedule
from pgsched.catchup import Decision, Policy
from pgsched.clock import Clock
from pgsched.config import pin_search_path
from pgsched.cron import Cron
from pgsched.model import INT8_MAX, Job, JobSettings, Run
from pgsched.schedule import Interval, Schedule
from pgsched.state import AbandonedCause

log = logging.getLogger("pgsched.store")

CHANNEL = "pgsched_catalog"
# The connections the server has for ordinary sessions: max_connections less those reserved for
# superusers and (PostgreSQL 16+) for roles with pg_use_reserved_connections.
CONNECTION_BUDGET = ("pg_catalog.current_setting('max_connections')::integer"
                     " - pg_catalog.current_setting('superuser_reserved_connections')::integer"
                     " - coalesce(pg_catalog.current_setting('reserved_connections', true)::integer, 0)")
# trigger_job and cancel_job wake the schedulers with 'request:<request_id>' (sql/api/50_requests.sql):
# a wake-up only, for anyone may send it; the request is the row, read by Store.read_requests.
REQUEST_PREFIX = "request:"
_REQUEST_ID = re.compile(r"[1-9][0-9]{0,18}")
# Notifications that say only that runs became claimable: queued scope runs (_close_batch), a
# dependent an upstream's success made due (07_dependencies.sql), a concurrency key freed (_end_runs).
RUNS_CLAIMABLE = frozenset({"scopes", "job_run:upstream", "concurrency_key:free"})


@lru_cache(maxsize=4096)
def _cron(expr: str) -> schedule.Cron:
    return schedule.parse_cron(expr)


@lru_cache(maxsize=4096)
def _window(expr: str) -> schedule.Cron:
    """A job's exclusion window, parsed once per text (every claimed run of the job carries it)."""
    return exclusion.parse(expr)


def schedule_from_row(row: dict[str, Any]) -> Schedule:
    """A Schedule from catalog columns; ScheduleError if the row is not a valid schedule."""
    tz = schedule.zone(row["timezone"])
    months = row["months"]
    text = row["schedule"] or ""
    if months is None and (schedule.is_restart(text) or schedule.is_after(text)):
        return Schedule(interval=None, cron=None, tz=tz, by_database=True)
    if months is None:
        if not schedule.looks_like_cron(row["schedule"] or ""):
            raise schedule.ScheduleError(
                "schedule", f"{row['schedule']!r} is neither an interval nor a cron expression")
        return Schedule(interval=None, cron=_cron(row["schedule"]), fixed=True, origin=row["initial_start"], tz=tz)
    iv = Interval(int(months), int(row["days"]), int(row["micros"]))
    return Schedule(interval=iv, cron=None, fixed=bool(row["fixed_schedule"]), origin=row["initial_start"], tz=tz)


@dataclass(frozen=True)
class Claimed:
    """A claimed run, or the reason its job cannot run (bad catalog row)."""

    run: Run | None
    run_id: int
    job_id: int
    worker_pid: int | None
    problem: str | None = None
    # The job's state after the claim, as the database wrote it (None for a scope run: it
    # leaves the state to its plan run).
    job_state: str | None = None


@dataclass(frozen=True)
class Request:
    """A trigger_job or cancel_job request: its row in pgsched.request, the only word on it the scheduler takes."""

    request_id: int
    kind: str  # 'trigger' or 'cancel'
    job_id: int
    plan_time: datetime | None  # a trigger's manual run's
    run_id: int | None  # a cancel's run
    requested_by: str  # the session user who asked
    expires_in: float  # seconds until it is past pgsched._request_ttl()


@dataclass(frozen=True)
class Closed:
    """A run that a close wrote, with its job's state before and after it, as the database decided."""

    run_id: int
    job_id: int
    old_state: str | None
    new_state: str | None


@dataclass(frozen=True)
class Finish:
    """How to close one run (arguments of pgsched._mark_end_v2)."""

    run_id: int
    outcome: str
    sqlstate: str | None
    message: str | None
    next_start: datetime | None
    finished_at: datetime
    disable_reason: str | None = None
    skipped: tuple[int, datetime | None, datetime | None] = (0, None, None)
    # A plan skipped by its job's exclusion window (outcome 'skipped'): the further excluded plans
    # passed over with it, counted in total_skipped.
    excluded: int = 0
    rows_affected: int | None = None
    result: Any = None
    # The worker and backend that really ran it (a worker may have reconnected as the job's owner).
    worker_pid: int | None = None
    backend_pid: int | None = None
    # The schedule_delay (s) next_start was computed with: if the job's delay was changed during the
    # run, the close shifts next_start by the difference, so no plan falls between the two.
    schedule_delay: float | None = None
    # A scoped job's plan run: the scope keys to queue a run for.
    scopes: list[str] | None = None
    # A scope run that failed: when its retry is queued for (state.scope_retry_at; None: none).
    retry_at: datetime | None = None
    # The lease the closing scheduler holds (None: not a scheduler's own run, e.g. one found
    # abandoned): the close is refused if the run's lease is no longer this one.
    lease_token: int | None = None


@dataclass(frozen=True)
class Abandoned:
    """A run found by pgsched._abandoned_runs_v2: its holder is gone, stopped or stale."""

    run_id: int
    job_id: int
    plan_time: datetime
    lease_token: int | None
    cause: AbandonedCause
    holder: str | None
    orphan_app: str
    orphan_pid: int | None  # a backend still running it
    reentry: bool  # allow_stale_reentry: may be taken over rather than closed
    consecutive_crashes: int
    schedule: Schedule | None
    retry_period: timedelta
    schedule_delay: timedelta
    problem: str | None
    after_restart: bool = False  # nobody saw its holder die: found by a scheduler that started after
    scope: str = ""  # a scope run's key: its end does not move the job's schedule
    code_module: str | None = None  # a Python job's module: only an instance that loaded it may take it over
    # A scope run's retry (state.scope_retry_at): its attempt (None: not retried, a plan run or a
    # job whose exclusion window cannot be read), its job's max_retries and exclusion window.
    attempt: int | None = None
    max_retries: int = -1
    exclude: Cron | None = None


@dataclass(frozen=True)
class Heartbeat:
    """What one heartbeat statement returns."""

    lost: list[int]  # runs held here whose lease another scheduler took
    abandoned: list[Abandoned]  # others' runs nobody will finish
    next_due: datetime | None  # the earliest next start of a claimable job (pgsched._next_due_v2)
    unplanned: bool  # some scheduled job has no next start yet


@dataclass(frozen=True)
class Behind:
    """A job whose next plan is overdue (pgsched._behind_v2), with what catch-up needs."""

    job_id: int
    next_start: datetime
    schedule: Schedule | None
    policy: Policy
    schedule_delay: timedelta
    jitter: timedelta = timedelta(0)  # the delay of the plan at next_start (README "Jitter")


class Store:
    """One autocommit connection: LISTEN, claims, run closes, instance heartbeats."""

    def __init__(self, dsn: str, clock: Clock, *, application_name: str = "pgsched scheduler",
                 code_modules: Sequence[str] = ()) -> None:
        self.dsn = dsn
        self.clock = clock
        # Python jobs of these modules may be claimed here; others belong to instances that loaded them.
        self.code_modules = list(code_modules)
        self.conn: psycopg.Connection[dict[str, Any]] = psycopg.connect(
            dsn, autocommit=True, row_factory=dict_row, application_name=application_name
        )
        pin_search_path(self.conn)
        # Our own job_stat writes must not wake us (or our peers) through NOTIFY.
        self.conn.execute("SET pgsched.internal = on")
        # The scheduler's own commits need not wait for the WAL flush: a job's commit is
        # synchronous and comes later in the WAL than the claim that started it, so a
        # durable job implies a durable claim; a close lost in a server crash leaves the
        # run 'running', which mark_start already counted as a crash (the conservative
        # over-count TimescaleDB also accepts). This halves the latency per scheduler round.
        self.conn.execute("SET synchronous_commit = off")
        # The loop is single-threaded: a catalog row someone keeps locked in an open transaction
        # must cost it one failed statement, retried next round, not a freeze.
        self.conn.execute("SET lock_timeout = '1s'")
        # Every statement here is small OLTP work, but a join of set-returning functions is
        # estimated at their default 1,000 rows each, which crosses jit_above_cost: compiling
        # the heartbeat took 60 ms of a 65 ms statement and held up the claims behind it.
        self.conn.execute("SET jit = off")
        # The closes' lock order (sql/api/20_runs.sql) relies on each statement reading what was
        # committed when it began, whatever the database's default isolation.
        self.conn.execute("SET default_transaction_isolation = 'read committed'")
        # A notification that arrives while one of our statements runs is taken off
        # the socket by psycopg, not by drain_notifies, and the socket then no longer
        # wakes the loop: count those through a handler so that none is lost.
        self._notified = 0
        # While a claim closes runs in its transaction (claim()): the notifications that transaction
        # sends us itself, that runs became claimable. See claim().
        self._holding_own = False
        self._held_own: list[str] = []
        self.requests: list[int] = []  # request ids that trigger_job / cancel_job woke us for, not read yet
        self.catalog_changed = False  # a notification other than RUNS_CLAIMABLE arrived since the last drain
        self.conn.add_notify_handler(self._on_notify)
        # A standby refuses LISTEN (it cannot queue notifications): the scheduler
        # calls listen() when the server is promoted.
        self.listening = False
        row = self.conn.execute(f"SELECT pg_catalog.pg_is_in_recovery() AS r, {CONNECTION_BUDGET} AS budget").fetchone()
        assert row is not None
        # Read with the first statement, so that the default worker count costs no round trip.
        self.connection_budget: int = row["budget"]
        if not row["r"]:
            self.listen()
        # Every call below is one autocommit statement, i.e. one transaction: counted
        # so that the scheduler can report its transactions per run.
        self.statements = 0
        self._sent = time.monotonic()  # when the statement last sent went out (see _anchor)

    def _execute(self, query: str, params: Sequence[Any] | None = None) -> psycopg.Cursor[dict[str, Any]]:
        self.statements += 1
        self._sent = time.monotonic()
        return self.conn.execute(query, params)

    def _anchor(self, db_now: datetime) -> None:
        """Anchor the clock on a database time read by the statement last sent (see DbClock.anchor)."""
        self.clock.anchor(db_now, time.monotonic() - self._sent)

    def listen(self) -> None:
        self.conn.execute(f"LISTEN {CHANNEL}")
        self.listening = True

    def take_pending_requests(self) -> None:
        """Queue every pending request, as if its notification had just arrived.

        Requests made while this scheduler did not listen (it was not running, cut off or a
        standby) lost their notifications, not their rows. Called once it listens and its schema
        was checked (Scheduler._become_active), so none falls between LISTEN and this read; one
        also heard is read and acted on once (Requests._take_requests)."""
        self.requests.extend(int(r["request_id"]) for r in self._execute(
            "SELECT request_id FROM pgsched.request ORDER BY request_id"))

    def close(self) -> None:
        if not self.conn.closed:
            self.conn.close()

    def lost(self) -> bool:
        """Whether the connection is gone. psycopg raises OperationalError for a lock timeout or a
        cancelled statement too, after which the connection is fine."""
        return self.conn.closed or self.conn.broken

    def fileno(self) -> int:
        return self.conn.fileno()

    # -- start-up -------------------------------------------------------------
    def check_version(self) -> int:
        return migrate.check_version(self.conn)

    def in_recovery(self) -> bool:
        row = self._execute("SELECT pg_catalog.pg_is_in_recovery() AS r").fetchone()
        return bool(row and row["r"])

    def arm_restart_jobs(self) -> int:
        """Make the @restart jobs that have not run since the server started due (pgsched._arm_restart_jobs)."""
        row = self._execute("SELECT pgsched._arm_restart_jobs() AS n").fetchone()
        return int(row["n"]) if row else 0

    def register_instance(self, host: str, pid: int, version: str, max_workers: int) -> int:
        row = self._execute(
            "SELECT * FROM pgsched._register_instance_v2(%s, %s, %s, %s)", (host, pid, version, max_workers)
        ).fetchone()
        assert row is not None
        self._anchor(row["db_now"])
        return int(row["instance_id"])

    def instance_exists(self, instance_id: int) -> bool:
        row = self._execute("SELECT pgsched._instance_exists(%s) AS e", (instance_id,)).fetchone()
        return bool(row and row["e"])

    def heartbeat(self, instance_id: int, max_workers: int, dead_after: timedelta, grace: timedelta,
                  held: Sequence[tuple[int, int]]) -> Heartbeat:
        """Renew this instance's heartbeat and its runs' leases; one statement (pgsched._heartbeat_v2).

        `held` are (run_id, lease_token) of the runs this process has in hand (running, or
        ended but not yet written). Returns the held runs whose lease is lost, the abandoned
        runs of others, and when the next job is due (pgsched._next_due_v2): a peer's claims and
        closes move next starts without a NOTIFY, so this is how an instance learns, within one
        heartbeat, that work a dead or saturated peer would have done is due.
        """
        rows = self._execute(
            """SELECT h.lost, h.db_now, n.next_due AS next_job_due, n.unplanned, a.*,
                      x.attempt, x.max_retries, x.exclude
                 FROM pgsched._heartbeat_v2(%s, %s, %s, %s) AS h
                 CROSS JOIN pgsched._next_due_v2(%s) AS n
                 LEFT JOIN LATERAL pgsched._abandoned_runs_v2(%s, %s, %s, %s) AS a ON true
                 LEFT JOIN LATERAL pgsched._abandoned_scope_run(a.run_id) AS x ON a.scope <> ''""",
            (instance_id, max_workers, [r for r, _ in held], [t for _, t in held], self.code_modules,
             instance_id, dead_after, grace, [r for r, _ in held]),
        ).fetchall()
        self._anchor(rows[0]["db_now"])
        return Heartbeat(lost=list(rows[0]["lost"]),
                         abandoned=[_abandoned_from_row(r) for r in rows if r["run_id"] is not None],
                         next_due=rows[0]["next_job_due"], unplanned=bool(rows[0]["unplanned"]))

    def deploy(self, modules: Sequence[str], specs: Sequence[dict[str, Any]]) -> list[tuple[int, str, str]]:
        """Write the code jobs of `modules` to the catalog (see 60_code_jobs.sql): (job_id, name, action)."""
        rows = self._execute("SELECT * FROM pgsched._deploy_code_jobs(%s, %s)", (list(modules), Jsonb(list(specs))))
        return [(r["job_id"], r["job_name"], r["action"]) for r in rows]

    def stop_instance(self, instance_id: int) -> None:
        self._execute("SELECT pgsched._instance_stop_v2(%s)", (instance_id,))

    def wake_peers(self) -> None:
        """Wake every scheduler on this database to re-read the catalog (this one is stopping)."""
        self._execute("SELECT pg_catalog.pg_notify(%s, 'instance:stopping')", (CHANNEL,))

    # -- notifications -------------------------------------------------------------
    def _on_notify(self, n: psycopg.Notify) -> None:
        self._arrived(n.payload, n.pid)

    def _arrived(self, payload: str, pid: int) -> None:
        if self._holding_own and payload in RUNS_CLAIMABLE and pid == self.conn.info.backend_pid:
            self._held_own.append(payload)
            return
        self._heard(payload)

    def _heard(self, payload: str) -> None:
        """A notification that asks this scheduler to act: counted until drained, and noted."""
        self._notified += 1
        self._note(payload)

    def _note(self, payload: str) -> None:
        # trigger_job and cancel_job wake us with their request's id (sql/api/50_requests.sql); what
        # to do is read from the request's row, never from the payload.
        # Anyone may notify on the channel: an id that is not a request's (not ASCII digits, or past
        # bigint, which psycopg would send as numeric) is dropped here, not sent to the database.
        request_id = payload[len(REQUEST_PREFIX):]
        if payload.startswith(REQUEST_PREFIX) and _REQUEST_ID.fullmatch(request_id) and int(request_id) <= INT8_MAX:
            self.requests.append(int(request_id))
        # Runs became claimable (queued runs, a free concurrency key): the plan is to be read again,
        # nothing was deleted.
        if payload not in RUNS_CLAIMABLE:
            self.catalog_changed = True

    @property
    def notified(self) -> bool:
        """A notification arrived during one of our statements and is not drained yet."""
        return self._notified > 0

    def drain_notifies(self) -> int:
        """Read pending notifications without blocking; how many arrived."""
        n = self._notified
        self._notified = 0
        pg = self.conn.pgconn
        r, _, _ = select.select([pg.socket], [], [], 0)
        if r:
            pg.consume_input()
        while (note := pg.notifies()) is not None:
            n += 1
            self._note(note.extra.decode(errors="replace"))
        return n

    # -- planning -------------------------------------------------------------
    def next_due(self) -> tuple[datetime | None, bool]:
        row = self._execute("SELECT * FROM pgsched._next_due_v2(%s)", (self.code_modules,)).fetchone()
        assert row is not None
        self._anchor(row["db_now"])
        return row["next_due"], bool(row["unplanned"])

    def unplanned(self, limit: int = 1000) -> list[tuple[int, Schedule | None, str | None]]:
        """Jobs without next_start: (job_id, schedule or None, problem)."""
        out: list[tuple[int, Schedule | None, str | None]] = []
        for row in self._execute("SELECT * FROM pgsched._unplanned(%s)", (limit,)):
            if row["infinite"]:
                out.append((row["job_id"], None, "next_start is not a finite time"))
                continue
            try:
                out.append((row["job_id"], schedule_from_row(row), None))
            except (schedule.ScheduleError, ValueError, OverflowError) as e:
                out.append((row["job_id"], None, f"invalid schedule in the catalog: {e}"))
        return out

    def plan(self, starts: Sequence[tuple[int, datetime]]) -> None:
        if starts:
            self._execute(
                "SELECT pgsched._plan(%s, %s)", ([j for j, _ in starts], [t for _, t in starts])
            )

    # -- runs -------------------------------------------------------------
    def claim(self, instance_id: int, workers: Sequence[tuple[int, int]], ahead: timedelta = timedelta(0),
              finishing: Sequence[Finish] = (), while_waiting: Callable[[], None] = lambda: None,
              ) -> tuple[list[Claimed], datetime | None, list[Closed | None]]:
        """Mark the start of up to len(workers) due runs; worker i gets the i-th run.

        Runs in `finishing` are closed first, in the same round trip and transaction (a pipeline
        without a sync between the two: if the close fails, nothing is claimed and the caller
        keeps the batch). `while_waiting` is called once both statements and their Sync are
        sent, while the database runs them; their results are read after it. Also returns when
        the next unclaimed job is due (None when nothing was claimed: the caller must ask
        next_due()), and, per run of `finishing`, what its close wrote (None: refused, the run
        was already closed or the lease is lost).
        """
        if not workers:
            return [], None, self.close_runs(finishing)
        sent = time.monotonic()
        fin = None
        # A close that makes runs claimable (scope runs queued, a key freed, a dependent made due)
        # notifies every scheduler, ours included. Ours needs no wake-up when the claim after it,
        # in the same transaction, took runs: the claim saw the close, and its next_due says
        # what is still due. Read every round, the plan cost a round 1 ms with 10,000 scope runs
        # queued. A claim that took nothing leaves the caller asking again anyway (dispatch).
        self._holding_own, self._held_own = bool(finishing), []
        try:
            with self.conn.pipeline() as pipeline:
                if finishing:
                    fin = self._close_cursor(finishing)
                cur = self._execute(
                    "SELECT * FROM pgsched._claim_v2(%s, %s, %s, %s, %s)",
                    (instance_id, [w for w, _ in workers], [b for _, b in workers], ahead, self.code_modules),
                )
                # The Sync goes before the caller's work: the server commits as soon as it is done,
                # and holds none of the claim's locks (rows, the keyed claims' advisory lock) while
                # the client writes its logs, however long a write blocks.
                self._send_sync(pipeline)
                try:
                    while_waiting()
                except Exception:
                    # The claim is made: its runs must still reach their workers.
                    log.exception("while the claim was on the database")
            rows = cur.fetchall()
            # psycopg hands _on_notify what it reads while it waits for results; a notification read
            # while the pipeline was still sending stays queued in libpq: taken here, by one rule.
            while (note := self.conn.pgconn.notifies()) is not None:
                self._arrived(note.extra.decode(errors="replace"), note.be_pid)
        finally:
            self._holding_own = False
        if not rows:
            for payload in self._held_own:
                self._heard(payload)
        self._sent = sent  # the round trip began with the pipeline, not with its last statement
        if rows:
            self._anchor(rows[-1]["db_now"])
        closes = _closes(finishing, fin.fetchall() if fin is not None else [])
        return [_claimed_from_row(r) for r in rows], (rows[0]["next_due"] if rows else None), closes

    def _send_sync(self, pipeline: psycopg.Pipeline) -> None:
        """End the pipeline's transaction now, without waiting for its results (they come with the
        pipeline's end, after a second, empty Sync). Pipeline.sync() would wait for them: this is
        its first half, psycopg's own two steps (psycopg 3.1 to 3.3; a test fails if they change)."""
        pipeline._enqueue_sync()
        self.conn.wait(pipeline._communicate_gen())

    def take_over(self, instance_id: int, runs: Sequence[tuple[int, int]],
                  workers: Sequence[tuple[int, int]]) -> list[Claimed]:
        """Start a new attempt of stale runs (run_id, old lease token) on these workers (pgsched._take_over)."""
        if not runs:
            return []
        rows = self._execute(
            "SELECT * FROM pgsched._take_over_v2(%s, %s, %s, %s, %s)",
            (instance_id, [r for r, _ in runs], [t for _, t in runs], [w for w, _ in workers],
             [b for _, b in workers]),
        ).fetchall()
        return [_claimed_from_row(r) for r in rows]

    def behind(self, late: timedelta, limit: int = 1000) -> list[Behind]:
        """Jobs whose next plan is more than `late` overdue (pgsched._behind_v2)."""
        out = []
        for row in self._execute("SELECT * FROM pgsched._behind_v2(%s, %s)", (late, limit)):
            self._anchor(row["db_now"])
            try:
                sched: Schedule | None = schedule_from_row(row)
            except (schedule.ScheduleError, ValueError, OverflowError):
                sched = None  # the claim disables the job with the reason
            out.append(Behind(row["job_id"], row["next_start"], sched, _policy(row),
                              timedelta(seconds=row["schedule_delay_s"] or 0),
                              timedelta(seconds=row["jitter_s"] or 0)))
        return out

    def catch_up(self, changes: Sequence[tuple[Behind, Decision]]) -> int:
        """Write catch-up decisions (pgsched._catch_up_v2); how many jobs changed."""
        if not changes:
            return 0
        payload = [{
            "job_id": b.job_id, "old_next": _iso(b.next_start),
            "new_next": _iso(schedule.eligible_at(d.plan, b.schedule_delay)),
            "missed": d.missed, "first": _iso(d.first_missed), "last": _iso(d.last_missed),
            "policy": f"catch_up = {b.policy.mode}",
        } for b, d in changes]
        row = self._execute("SELECT pgsched._catch_up_v2(%s) AS n", (Jsonb(payload),)).fetchone()
        return int(row["n"]) if row else 0

    def close_runs(self, finishes: Sequence[Finish]) -> list[Closed | None]:
        """Close runs in one statement (one transaction, pgsched._close_runs); per run, what the
        close wrote, or None if the run was no longer open to this close."""
        if not finishes:
            return []
        return _closes(finishes, self._close_cursor(finishes).fetchall())

    def _close_cursor(self, finishes: Sequence[Finish]) -> psycopg.Cursor[dict[str, Any]]:
        payload = [{
            "run_id": f.run_id, "outcome": str(f.outcome), "sqlstate": _text(f.sqlstate), "message": _text(f.message),
            "next_start": _iso(f.next_start), "finished_at": _iso(f.finished_at),
            "disable_reason": _text(f.disable_reason), "rows_affected": f.rows_affected, "result": _json(f.result),
            "skipped": f.skipped[0], "skipped_first": _iso(f.skipped[1]), "skipped_last": _iso(f.skipped[2]),
            "worker_pid": f.worker_pid, "backend_pid": f.backend_pid, "lease_token": f.lease_token,
            "scopes": f.scopes, "schedule_delay_s": f.schedule_delay, "excluded": f.excluded,
            "retry_at": _iso(f.retry_at),
        } for f in finishes]
        return self._execute("SELECT * FROM pgsched._close_runs(%s)", (Jsonb(payload),))

    def read_requests(self, request_ids: Sequence[int], instance_id: int) -> list[Request]:
        """The requests of these ids that are to act on (pgsched._requests): every trigger still pending,
        and the cancels of runs this instance holds (taken: deleted). Ids of no request give nothing."""
        rows = self._execute("SELECT * FROM pgsched._requests(%s::bigint[], %s)", (list(request_ids), instance_id))
        return [Request(request_id=r["request_id"], kind=r["kind"], job_id=r["job_id"], plan_time=r["plan_time"],
                        run_id=r["run_id"], requested_by=r["requested_by"], expires_in=r["expires_in"])
                for r in rows]

    def start_manual(self, instance_id: int, request_id: int, worker: tuple[int, int]) -> Claimed | None:
        """Start the manual run a trigger request asks for (pgsched._start_request) on this worker; None:
        not ours to start. Raises psycopg.errors.ObjectInUse while the job has a run in progress."""
        row = self._execute("SELECT * FROM pgsched._start_request(%s, %s, %s, %s, %s)",
                            (instance_id, request_id, worker[0], worker[1], self.code_modules)).fetchone()
        if row is None:
            return None
        self._anchor(row["db_now"])
        return _claimed_from_row(row)

    def disable(self, job_id: int, reason: str) -> str | None:
        """Disable a job that cannot run; its state after (None: the job is gone)."""
        row = self._execute("SELECT pgsched._disable_job_v2(%s, %s) AS state", (job_id, reason)).fetchone()
        return row["state"] if row else None

    def set_terminating(self, run_id: int) -> bool:
        """Persist TERMINATING for the job whose current run this is; whether it moved from STARTING
        (not for a scope run, whose job's state belongs to its plan run)."""
        row = self._execute("SELECT pgsched._set_terminating(%s) AS moved", (run_id,)).fetchone()
        return bool(row and row["moved"])

    def missing_runs(self, run_ids: Sequence[int]) -> set[int]:
        if not run_ids:
            return set()
        rows = self._execute("SELECT * FROM pgsched._missing_runs(%s) AS r", (list(run_ids),)).fetchall()
        return {int(r["r"]) for r in rows}

    def cancel_backend(self, pid: int) -> bool:
        row = self._execute("SELECT pg_catalog.pg_cancel_backend(%s::integer) AS ok", (pid,)).fetchone()
        return bool(row and row["ok"])

    def take_upstreams(self, run_id: int) -> str | None:
        """A scheduled dependent's run is starting: None (its upstreams' success consumed) when they all
        succeeded since its previous run, else what it waits for (pgsched._take_upstreams)."""
        row = self._execute("SELECT pgsched._take_upstreams(%s) AS why", (run_id,)).fetchone()
        return None if row is None or row["why"] is None else str(row["why"])

    def terminate_run_backend(self, app: str) -> bool:
        """Terminate the backends still running the run whose application_name is `app`."""
        row = self._execute("SELECT pgsched._terminate_run_backend(%s) AS ok", (app,)).fetchone()
        return bool(row and row["ok"])



# A launch row's columns (pgsched._launch_row_v2) that belong to the run, not to its job.
_RUN_COLUMNS = frozenset({"run_id", "scope", "attempt", "plan_time", "started_at", "lease_token", "worker_pid",
                          "backend_pid", "consecutive_failures", "consecutive_crashes", "next_due", "db_now",
                          "job_state"})
# Jobs built from launch rows, by job id, with the row's job columns they were built from: a claim
# of a job unchanged since takes the one built before. Building one (its settings, schedule and
# exclusion window) cost about 60 us of the scheduler's CPU a run on the 2-core machine of
# 2026-11-27, a tenth of its share of a run; comparing the columns, about 2 us. At most JOBS_KEPT
# (a few KB each), the first built going first. Jobs are frozen, so one may serve many runs.
JOBS_KEPT = 1024
_built: dict[int, tuple[tuple[Any, ...], Job]] = {}


@lru_cache(maxsize=8)
def _job_columns(columns: tuple[str, ...]) -> Callable[[dict[str, Any]], tuple[Any, ...]]:
    """The values that make a launch row's job: every column not the run's. A column added to the
    row counts as the job's unless listed in _RUN_COLUMNS, so a kept job never outlives a change.
    The config is compared by its repr: as Python values jsonb's true, 1 and 1.0 are equal."""
    return operator.itemgetter(*(c for c in columns if c not in _RUN_COLUMNS and c != "config"))


def _job_key(row: dict[str, Any]) -> tuple[Any, ...]:
    return (_job_columns(tuple(row))(row), repr(row["config"]))


def _job_from_row(row: dict[str, Any]) -> Job:
    """A launch row's job: the one built from the same job columns before, else a new one."""
    key = _job_key(row)
    job_id = row["job_id"]
    seen = _built.get(job_id)
    if seen is not None and seen[0] == key:
        return seen[1]
    job = _build_job(row)
    _built.pop(job_id, None)
    _built[job_id] = (key, job)
    if len(_built) > JOBS_KEPT:
        _built.pop(next(iter(_built)), None)
    return job


def _build_job(row: dict[str, Any]) -> Job:
    """A launch row's job, its settings read by name (pgsched.model.JobSettings.from_launch_row)."""
    s = JobSettings.from_launch_row(row)
    return Job(
        job_id=row["job_id"], job_name=row["job_name"], kind=row["kind"], owner=row["owner"],
        proc_schema=row["proc_schema"], proc_name=row["proc_name"], is_procedure=row["is_procedure"],
        command=row["command"], code_module=row["code_module"], code_function=row["code_function"],
        config=s.config,
        schedule=schedule_from_row({"schedule": s.schedule, "fixed_schedule": s.fixed_schedule,
                                    "initial_start": s.initial_start, "timezone": s.timezone,
                                    "months": row["months"], "days": row["days"], "micros": row["micros"]}),
        max_runtime=s.max_runtime, max_retries=s.max_retries, retry_period=s.retry_period,
        catch_up=Policy(s.catch_up, s.catch_up_window, s.max_plans_per_tick), schedule_delay=s.schedule_delay,
        allow_stale_reentry=s.allow_stale_reentry, scope_query=s.scope_query, database=s.database,
        exclude=_window(s.exclude) if s.exclude else None, depends_on=tuple(s.depends_on or ()),
    )


def _policy(row: dict[str, Any]) -> Policy:
    window = row["catch_up_window_s"]
    return Policy(row["catch_up"] or "latest", None if window is None else timedelta(seconds=window),
                  int(row["max_plans_per_tick"] or 1))


def _claimed_from_row(row: dict[str, Any]) -> Claimed:
    """A claimed run (from _claim or _take_over), or the reason its job cannot run."""
    state = None if row["scope"] else row["job_state"]
    try:
        job = _job_from_row(row)
    except (schedule.ScheduleError, ValueError, OverflowError) as e:
        return Claimed(None, row["run_id"], row["job_id"], row["worker_pid"], f"invalid schedule in the catalog: {e}",
                       state)
    run = Run(
        run_id=row["run_id"], job=job, plan_time=row["plan_time"], started_at=row["started_at"],
        consecutive_failures=row["consecutive_failures"], consecutive_crashes=row["consecutive_crashes"],
        lease_token=row["lease_token"], scope=row["scope"] or "", attempt=row["attempt"] or 1,
        worker_pid=row["worker_pid"],
        backend_pid=row["backend_pid"],
    )
    return Claimed(run, run.run_id, job.job_id, row["worker_pid"], job_state=state)


def _closes(finishes: Sequence[Finish], rows: Sequence[dict[str, Any]]) -> list[Closed | None]:
    """Per run of `finishes`, its row of pgsched._close_runs (None: not closed by this close)."""
    by_run = {int(r["run_id"]): Closed(int(r["run_id"]), int(r["job_id"]), r["old_state"], r["new_state"])
              for r in rows}
    return [by_run.get(f.run_id) for f in finishes]


def _text(s: str | None) -> str | None:
    """Text PostgreSQL accepts: no NUL characters (a job's error message may carry any bytes), and no
    lone surrogates, written as their escape (a Python job's message or result may hold one, from
    os.fsdecode say: UTF-8 has no encoding of it, and jsonb refuses JSON's escape of one)."""
    if s is None:
        return None
    s = s.replace("\x00", "\\0")
    return s if s.isascii() else s.encode("utf-8", "backslashreplace").decode("utf-8")


def _json(value: Any) -> Any:
    """A result jsonb accepts: NaN, infinities and NULs would make the whole batch of closes fail."""
    if value is None:
        return None
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as e:
        return {"invalid_result": f"not representable as JSON: {e}"}
    return _no_nul(value)


def _no_nul(value: Any) -> Any:
    if isinstance(value, str):
        return _text(value)
    if isinstance(value, dict):
        return {_text(str(k)): _no_nul(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_no_nul(v) for v in value]
    return value


def _iso(t: datetime | None) -> str | None:
    return None if t is None else t.isoformat()


def _abandoned_from_row(row: dict[str, Any]) -> Abandoned:
    sched: Schedule | None = None
    problem = None
    retry_period = schedule_delay = timedelta(0)
    try:
        sched = schedule_from_row(row)
        retry_period = timedelta(seconds=row["retry_period_s"])
        schedule_delay = timedelta(seconds=row["schedule_delay_s"] or 0)
    except (schedule.ScheduleError, ValueError, OverflowError) as e:
        # Absurd values written into the catalog by hand (a retry_period of a million years): the
        # run is closed with its job disabled, and the heartbeat goes on.
        sched, problem = None, f"invalid schedule in the catalog: {e}"
    attempt: int | None = row["attempt"]
    window = None
    if row["exclude"]:
        try:
            window = _window(row["exclude"])
        except (schedule.ScheduleError, ValueError, OverflowError):
            attempt = None  # a window written into the catalog by hand that cannot be read: no retry
    return Abandoned(
        run_id=row["run_id"], job_id=row["job_id"], plan_time=row["plan_time"], lease_token=row["lease_token"],
        cause=AbandonedCause(row["cause"]), holder=row["holder"], orphan_app=row["orphan_app"],
        orphan_pid=row["orphan_pid"], reentry=bool(row["allow_stale_reentry"]),
        consecutive_crashes=row["consecutive_crashes"], schedule=sched,
        retry_period=retry_period, schedule_delay=schedule_delay, problem=problem,
        after_restart=bool(row["after_restart"]), scope=row["scope"] or "", code_module=row["code_module"],
        attempt=attempt, max_retries=-1 if row["max_retries"] is None else row["max_retries"], exclude=window,
    )
