"""Running one @pgsched.job handler: its transaction, its lease heartbeat, its result or error.

Used by the worker (scheduled runs) and by `pgsched run` (a run now). The
handler gets the worker's connection with autocommit off: it is committed when
the handler returns and rolled back when it raises. run.heartbeat() renews the
run's lease on a separate connection, because a write on the handler's own,
uncommitted transaction would be invisible to everyone else; it raises
LeaseLost when the run is no longer this worker's (another scheduler closed it).

pgsched.app is imported where a handler is looked up, not with this module: every worker
imports this one, and one that runs only SQL jobs never needs the declarations (see pgsched).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import traceback
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import psycopg
import psycopg.adapt
import psycopg.types.json

from pgsched import protocol
from pgsched.config import pin_search_path
from pgsched.errors import PgschedError, text_of
from pgsched.protocol import Done

if TYPE_CHECKING:
    from pgsched import app, worker

TRACEBACK_LINES = 15


def import_apps(modules: list[str]) -> list[str]:
    """Import the app modules so their @pgsched.job declarations register. Returns a warning for
    each job an import declared in a module that no --app names (a package's __init__ importing
    its jobs module, a handler moved to a helper module): the deploy, the claim and the disabling
    of jobs gone from the code all go by the module a handler is defined in, so such a job is
    neither deployed nor run by this instance."""
    from pgsched import app

    stray: list[str] = []
    for name in modules:
        before = set(app.REGISTRY)
        importlib.import_module(name)
        stray += [f"--app {name}: importing it declared job {s.name!r} ({s.module}.{s.function}) in module "
                  f"{s.module}, which no --app names: this instance neither deploys nor runs it "
                  f"(add --app {s.module} if it should)"
                  for n, s in app.REGISTRY.items() if n not in before and s.module not in modules]
    return stray


def find(msg: dict[str, Any]) -> app.JobSpec | None:
    from pgsched import app  # here, not at the top: see the module's docstring

    spec = app.REGISTRY.get(msg.get("job_name") or "")
    if spec is not None and (spec.module, spec.function) == (msg.get("code_module"), msg.get("code_function")):
        return spec
    return next((s for s in app.REGISTRY.values()
                 if (s.module, s.function) == (msg.get("code_module"), msg.get("code_function"))), None)


class Heartbeat:
    """The lease renewal connection of one worker, opened on first use."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.conn: psycopg.Connection[Any] | None = None

    def beat(self, run_id: int, lease_token: int | None) -> bool:
        if self.conn is None or self.conn.closed:
            self.conn = psycopg.connect(self.dsn, autocommit=True, application_name="pgsched heartbeat")
            pin_search_path(self.conn)
        row = self.conn.execute("SELECT pgsched._renew_lease(%s, %s)", (run_id, lease_token)).fetchone()
        return bool(row and row[0])

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


def describe(e: BaseException) -> str:
    """Type, message and the last frames of the traceback, within protocol.MAX_MESSAGE.

    Never raises: an exception whose __str__ raises is described as the traceback module
    describes it, instead of taking the worker down with it."""
    text = text_of(e)
    head = f"{type(e).__name__}: {text}" if text else type(e).__name__  # KeyboardInterrupt(): its name alone
    try:
        frames = traceback.format_exception(type(e), e, e.__traceback__)
    except Exception:  # the traceback module guards str(e), not every attribute a handler's class may break
        frames = []
    tail = "".join(frames).rstrip().splitlines()[-TRACEBACK_LINES:]
    return protocol.cap("\n".join([head, *tail]))


# A handler that caught a database error and returned: its transaction is in the error state, and
# COMMIT would roll it back while the run said success.
CAUGHT_ERROR = ("the handler caught a database error and went on: its transaction was in the error state, "
                "so it was rolled back (nothing of the run was committed); let the error propagate, or "
                "roll back to a savepoint (with run.connection.transaction(): ...) where it is expected")


def run(conn: psycopg.Connection[Any], msg: dict[str, Any], heartbeat: Heartbeat) -> Done:
    """Run the handler of `msg` on `conn` (in autocommit mode on entry and on return).

    A KeyboardInterrupt or SystemExit from the handler is raised on, its transaction rolled back:
    the worker then exits (a crash, as for a signal) and `pgsched run` records it (run_now).
    """
    from pgsched import app

    run_id = int(msg["run_id"])
    spec = find(msg)
    if spec is None:
        return Done(run_id, ok=False, sqlstate="42883",
                    message=f"no @pgsched.job handler {msg.get('code_module')}.{msg.get('code_function')} "
                            "is loaded in this worker")
    plan = msg.get("plan_time")
    handle = app.Run(
        job_id=msg["job_id"], job_name=msg.get("job_name") or spec.name, run_id=msg["run_id"],
        plan_time=datetime.fromisoformat(plan) if isinstance(plan, str) else datetime.now().astimezone(),
        attempt=int(msg.get("attempt") or 1), scope=msg.get("scope") or "", config=msg.get("config"),
        connection=conn, _heartbeat=lambda: heartbeat.beat(msg["run_id"], msg.get("lease_token")),
    )
    saved = ClientState.save(conn)
    conn.autocommit = False
    try:
        returned = spec.handler(handle)
        if returned is not None and not isinstance(returned, app.Result):
            raise TypeError(f"the handler returned {type(returned).__name__}; expected pgsched.Result or None")
        if conn.pgconn.transaction_status == psycopg.pq.TransactionStatus.INERROR:
            conn.rollback()
            return Done(run_id, ok=False, sqlstate="25P02", message=CAUGHT_ERROR)
        # Checked and encoded before the commit: a Result that cannot be stored fails the run with
        # its work rolled back, not after the work is committed (a failure that would then be retried).
        rows_affected, result = returned.encoded() if returned is not None else (None, None)
        conn.commit()
        return Done(run_id, ok=True, rows_affected=rows_affected, result=result)
    except Exception as e:
        lost = conn.closed or conn.broken
        if not lost:
            conn.rollback()
        message = protocol.cap(str(e)) if isinstance(e, app.ResultError) else describe(e)
        return Done(run_id, ok=False, lost=lost, sqlstate=getattr(e, "sqlstate", None), message=message)
    finally:
        # Also on a BaseException: its transaction is still open, and switching to autocommit
        # mid-transaction would raise a ProgrammingError that hides it.
        saved.restore(conn)


@dataclass
class ClientState:
    """What a handler may change on its connection client-side, to be put back after its run.

    The worker's reset (DISCARD ALL) clears the session on the server; these live in psycopg's
    connection object, which the next run of the worker is handed: a run left read-only, a
    dict row factory or a loader reading integers as text would reach it. The adapters map and
    the notice/notify handler lists have no public setter: they are put back through psycopg's
    own attributes where it has them (psycopg 3.3 does: tests/integration/test_code_job_edges.py
    checks it), and left as they are otherwise. What a handler changes in the process
    (psycopg.adapters, a module's globals) is not the connection's, and stays.
    """

    row_factory: Any
    cursor_factory: Any
    server_cursor_factory: Any
    prepare_threshold: int | None
    prepared_max: int | None
    adapters: Any
    notice_handlers: list[Any] | None
    notify_handlers: list[Any] | None

    @classmethod
    def save(cls, conn: psycopg.Connection[Any]) -> ClientState:
        """The connection's state now; the handler is given a copy of its adapters map to change."""
        state = cls(
            row_factory=conn.row_factory, cursor_factory=conn.cursor_factory,
            server_cursor_factory=conn.server_cursor_factory, prepare_threshold=conn.prepare_threshold,
            prepared_max=conn.prepared_max, adapters=getattr(conn, "_adapters", None),
            notice_handlers=_copied(getattr(conn, "_notice_handlers", None)),
            notify_handlers=_copied(getattr(conn, "_notify_handlers", None)))
        if hasattr(conn, "_adapters"):
            # A map that copies what the handler registers on write: the connection's own is untouched.
            conn._adapters = psycopg.adapt.AdaptersMap(conn.adapters)
        return state

    def restore(self, conn: psycopg.Connection[Any]) -> None:
        """End an open transaction (rolled back), back to autocommit, and put the saved state back."""
        if conn.closed or conn.broken:
            return  # the worker replaces it
        with contextlib.suppress(psycopg.Error):  # lost meanwhile: the worker's reset finds out
            if conn.pgconn.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                conn.rollback()
        if conn.closed or conn.broken:
            return
        conn.autocommit = True
        # None: the server's defaults (a worker sets none of them). Each setter takes the
        # connection's lock: set only what the handler changed (a run's path).
        if conn.read_only is not None:
            conn.read_only = None
        if conn.isolation_level is not None:
            conn.isolation_level = None
        if conn.deferrable is not None:
            conn.deferrable = None
        conn.row_factory = self.row_factory
        conn.cursor_factory = self.cursor_factory
        conn.server_cursor_factory = self.server_cursor_factory
        if hasattr(conn, "_adapters"):
            conn._adapters = self.adapters
        for name, handlers in (("_notice_handlers", self.notice_handlers), ("_notify_handlers", self.notify_handlers)):
            if handlers is not None:
                getattr(conn, name)[:] = handlers
        if conn.prepare_threshold != self.prepare_threshold:
            # The handler prepared statements: the reset (DISCARD ALL) deallocates them, so psycopg must
            # forget their names, which it does when it sees DEALLOCATE ALL while preparing is on (as in
            # worker._fan_out).
            with contextlib.suppress(psycopg.Error):
                conn.execute("DEALLOCATE ALL")
            conn.prepare_threshold = self.prepare_threshold
        if self.prepared_max is not None:
            conn.prepared_max = self.prepared_max


def _copied(handlers: object) -> list[Any] | None:
    return list(handlers) if isinstance(handlers, list) else None


class EndNotRecorded(PgschedError):
    """`pgsched run`: the run's end was not written, because the run was already closed (a scheduler
    that found its session gone, or took it for abandoned, closed it as a crash)."""


def run_now(dsn: str, job_id: int) -> Done:
    """Run a Python job once, now, in this process, recorded like any run (trigger 'manual').

    The app modules must already be imported. The handler gets a session of the job's owner in
    the job's database, opened as a worker opens one (pgsched.worker.Session), not the caller's:
    the run marks are the caller's (the scheduler's role), the job's SQL is its owner's. Returns
    the run's outcome; raises EndNotRecorded when the run was closed by someone else meanwhile.
    """
    from pgsched import app, worker

    with psycopg.connect(dsn, autocommit=True, application_name=f"pgsched run {job_id}") as conn:
        conn.prepare_threshold = None
        # The owner's name as a login takes it (regrole's text would quote it), as the claim reads it.
        # On the caller's search path (run_job, below, keeps it): operators are pg_catalog's by name.
        row = conn.execute(
            """SELECT j.job_name, j.kind, j.code_module, j.code_function, j.config, r.rolname, j.database
                 FROM pgsched.job j LEFT JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) j.owner::oid
                WHERE j.job_id OPERATOR(pg_catalog.=) %s""", (job_id,)).fetchone()
        if row is None:
            raise app.JobDeclarationError(f"job {job_id} not found")
        name, kind, module, function, config, owner, database = row
        if kind != "python":
            conn.execute("CALL pgsched.run_job(%s)", (job_id,))
            return Done(0, ok=True)
        if owner is None:
            raise app.JobDeclarationError(f"job {job_id}: its owner role no longer exists")
        # From here on the session only marks the run, as the scheduler's would (a SQL job's
        # run_job, above, runs the job's SQL in it and keeps the caller's path).
        pin_search_path(conn)
        # Opened before the run is marked: a session that cannot be had records no run.
        session = worker.Session(dsn)
        try:
            try:
                session.become(owner, database or None)
            except psycopg.Error as e:
                raise app.JobDeclarationError(
                    f"job {job_id}: cannot open a session as the job's owner {owner}"
                    f"{f' in database {database}' if database else ''}: {str(e).strip()}") from None
            run_id, plan = conn.execute(
                "SELECT pgsched._mark_start(%s, t, 'manual', %s, %s), t FROM pg_catalog.clock_timestamp() AS t",
                (job_id, os.getpid(), session.backend_pid)).fetchone() or (None, None)
            assert run_id is not None and plan is not None
            msg = {"run_id": run_id, "job_id": job_id, "job_name": name, "code_module": module,
                   "code_function": function, "config": config, "lease_token": None, "plan_time": plan.isoformat()}
            return _run_and_end(conn, session, dsn, msg)
        finally:
            # Only now, the end written: a scheduler takes a manual run whose session is gone for
            # abandoned, and would close a run that succeeded as a crash in the gap.
            session.close()


def _run_and_end(conn: psycopg.Connection[Any], session: worker.Session, dsn: str, msg: dict[str, Any]) -> Done:
    """Run the handler in the owner's session and write the run's end with the marking session `conn`,
    whatever happens after the start: an exception (a KeyboardInterrupt among them) is recorded as the
    run's failure, then raised on."""
    run_id, job_id = int(msg["run_id"]), int(msg["job_id"])
    try:
        done = _run_in_session(session, dsn, msg)
    except BaseException as e:
        failed = Done(run_id, ok=False, sqlstate=getattr(e, "sqlstate", None), message=describe(e))
        if not _mark_end(conn, failed):
            e.add_note(_not_recorded(job_id, failed))
        raise
    if not _mark_end(conn, done):
        raise EndNotRecorded(_not_recorded(job_id, done))
    return done


def _run_in_session(session: worker.Session, dsn: str, msg: dict[str, Any]) -> Done:
    """The run's set-up (as a worker's), then the handler (run), on the owner's session."""
    from pgsched import worker

    heartbeat = Heartbeat(dsn)
    try:
        session.conn.execute("SELECT " + worker.SET_UP,
                             (f"pgsched run {msg['job_id']}", str(msg["run_id"]), msg["plan_time"], ""))
        return run(session.conn, msg, heartbeat)
    except psycopg.Error as e:
        return Done(int(msg["run_id"]), ok=False, sqlstate=e.sqlstate, message=describe(e))
    finally:
        heartbeat.close()


def _mark_end(conn: psycopg.Connection[Any], done: Done) -> bool:
    """Write the run's end as the scheduler writes one (its values cleaned by the same functions:
    a NUL or a NaN would make the statement fail and leave the run open); False if the run was no
    longer open."""
    from pgsched import store

    row = conn.execute(
        "SELECT pgsched._mark_end_v2(%s, %s, %s, %s, NULL, pg_catalog.clock_timestamp(), NULL, %s, %s)",
        (done.run_id, "success" if done.ok else "failure", store._text(done.sqlstate), store._text(done.message),
         done.rows_affected, psycopg.types.json.Jsonb(store._json(done.result))),
    ).fetchone()
    return bool(row and row[0])


def _not_recorded(job_id: int, done: Done) -> str:
    outcome = "success" if done.ok else f"failure: {done.message}"
    return (f"job {job_id} run {done.run_id}: its end ({outcome}) was not recorded: the run was already "
            "closed, by a scheduler that took it for abandoned (see job_history)")
