"""The worker: the child side of the process contract.

A worker is `python -m pgsched.worker`, started by the launcher in its own
session (process group) with the DSN in PGSCHED_WORKER_DSN. It keeps one
database connection (and, with PGSCHED_WORKER_SESSIONS above 1, a few parked ones: Session)
and runs one job at a time:

  parent -> worker (stdin, one JSON object per line): a run to execute
  worker -> parent (stdout, one JSON object per line): the events of pgsched.protocol, one record
  type per kind, encoded with protocol.encode:
      Ready(pid, backend_pid, role)         once connected and its app modules imported
      Backend(run_id, backend_pid, role, database, parked)
                                            it switched sessions for a run (another owner's, new or
                                            parked, or a new one: the idle one was closed under it)
      Done(run_id, ok, sqlstate, message, lost, owner_unusable, rows_affected, result, scopes, parked)
                                            a run ended (lost: its connection died with it;
                                            parked: set when its parked sessions changed since)
      Lost()                                its idle session was lost after a run: it exits
      Failed(message)                       it could not connect or import the app modules: it exits

Exit codes: 0 when stdin closes (the parent let it go), 3 when it cannot
connect, 4 after its connection was lost. Any other code or a signal is a crash,
and the parent records it. The worker writes nothing to the catalog: the parent
marks start and end, so a worker that dies needs no clean-up of its own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import re
import select
import signal
import sys
import time
from collections import OrderedDict
from collections.abc import Iterator
from typing import IO, Any

import psycopg
import psycopg.conninfo
from psycopg import sql

from pgsched import forkserver, oneround, protocol, pyjob
from pgsched.protocol import Backend, Done, Failed, Lost, Ready

EXIT_OK = 0
EXIT_CONNECT = 3
EXIT_LOST = 4
# How often (ms) a job's backend checks that its worker is still there (PostgreSQL 14+).
CHECK_CLIENT_MS = 250
# A scoped job's plan queues one run per key: bounded, so that a runaway query cannot flood the history.
MAX_SCOPES = 10_000
MAX_SCOPE_KEY = 200
# A parked session (Session) unused this long is closed: its backend holds one of the server's
# connection slots and some memory.
PARKED_IDLE_S = 60.0
# What the server says when it refuses a session for want of connection slots (SQLSTATE 53300) or
# cannot take one now (57P03), and libpq when nothing listens: refusals that pass, unlike the
# owner's doing (no such role or database, no LOGIN or CONNECT, authentication failed). libpq gives
# no SQLSTATE for a refused start-up, so the text decides; a server that words them in another
# language (lc_messages) has them taken for the owner's doing, as every refusal was in 0.2.0 and earlier.
PASSING_REFUSALS = {
    "too many clients already": "53300", "remaining connection slots are reserved": "53300",
    "too many connections for": "53300", "the database system is starting up": "57P03",
    "the database system is shutting down": "57P03", "the database system is not yet accepting connections": "57P03",
    "the database system is in recovery mode": "57P03", "connection refused": "08001",
}


def _die_with_parent() -> None:
    """Linux: get SIGKILL when the scheduler dies, so no worker outlives it unsupervised."""
    forkserver.prctl(forkserver.PR_SET_PDEATHSIG, signal.SIGKILL)
    # A scheduler that died before the call above sends no signal: we were re-parented already.
    parent = os.environ.get("PGSCHED_PARENT_PID")
    if parent and parent.isdigit() and os.getppid() != int(parent):
        os._exit(EXIT_OK)


def _as_batch_task() -> None:
    """Linux: run as SCHED_BATCH, the policy of processes that are not interactive.

    The scheduler hands a claim's runs out one pipe write after another. A worker woken by one
    preempted it (the kernel favours a task that slept), so on two cores the scheduler waited for
    a core with the rest of the claim in hand, once per run, while the runs it had not handed out
    yet waited with it. A batch task never preempts on waking: it takes a free core, or waits for
    the running task to block or use its slice. Inherited by what a run starts (a Python job's
    subprocesses). Only the default policy is changed: one the scheduler was started with on
    purpose (`chrt`, systemd's CPUSchedulingPolicy) is kept, and a system that refuses the policy
    or has none leaves the worker as it was.
    """
    if not (hasattr(os, "SCHED_BATCH") and hasattr(os, "sched_setscheduler")):
        return
    with contextlib.suppress(OSError):
        if os.sched_getscheduler(0) == os.SCHED_OTHER:
            os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))


def _emit(out: IO[str], event: protocol.Event) -> None:
    try:
        out.write(protocol.encode(event) + "\n")
        out.flush()
    except BrokenPipeError:
        # The scheduler is gone (killed: PR_SET_PDEATHSIG's SIGKILL is on its way); nobody reads us.
        os._exit(EXIT_LOST)


# The run's set-up: application_name names the run in pg_stat_activity; pgsched.run_id,
# pgsched.plan_time and pgsched.scope let the job's SQL know which planned run it is
# (current_setting()), e.g. to process exactly the period its plan time closes. DISCARD ALL
# clears them. The values are bound parameters, so the statement's text is the same at every
# run and psycopg converts it once (composing it per run cost a trivial run a third of the
# worker's CPU).
SET_UP = ("pg_catalog.set_config('application_name', %s, false), pg_catalog.set_config('pgsched.run_id', %s, false), "
          "pg_catalog.set_config('pgsched.plan_time', %s, false), pg_catalog.set_config('pgsched.scope', %s, false)")


_SET_UP_ALONE = f"SELECT {SET_UP % ('$1', '$2', '$3', '$4')}".encode()


def _set_up_values(msg: dict[str, Any]) -> tuple[str, str, str, str]:
    """SET_UP's parameters for a run (its role is the session's: see Session)."""
    return str(msg["app"]), str(msg["run_id"]), str(msg["plan_time"]), str(msg.get("scope") or "")


@functools.lru_cache(maxsize=1024)
def _call(proc_schema: str, proc_name: str, is_procedure: bool, encoding: str) -> bytes:
    """The statement of a function or procedure job, kept per proc: its text is the same at every
    run. A function's carries the run's set-up ($1-$4, evaluated before the call), then
    proc(job_id, config); CALL cannot carry it, so a procedure's is the call alone ($1, $2).
    Encoded in the session's client encoding, as the proc's name is stored."""
    name = sql.SQL("{}.{}").format(sql.Identifier(proc_schema), sql.Identifier(proc_name)).as_string(None)
    if is_procedure:
        return f"CALL {name}($1::integer, $2::jsonb)".encode(encoding)
    return f"SELECT {SET_UP % ('$1', '$2', '$3', '$4')}, {name}($5::integer, $6::jsonb)".encode(encoding)


def _call_params(msg: dict[str, Any], encoding: str) -> list[bytes | None]:
    """The call's job_id and config, as text (the statement casts them)."""
    config = msg.get("config")
    return [str(int(msg["job_id"])).encode(), None if config is None else json.dumps(config).encode(encoding)]


class Session:
    """The worker's connection, opened as the role whose job it runs, and the sessions it keeps.

    A job runs in a session whose session user is the job's owner: nothing its SQL
    does (RESET ROLE, SET ROLE, SET SESSION AUTHORIZATION, RESET ALL) can reach the
    scheduler's role, because the session never had it. A worker keeps its owner's
    connection between runs and switches only when it is given another owner's job,
    or a job in another database (a job's `database`, pg_cron's schedule_in_database:
    the session opens there; None is the scheduler's own).

    With `keep` above 1, the session it switches from is parked instead of closed, up to
    keep - 1 of them, the least recently used closed first: a worker that runs the jobs of
    a few owners in turn takes an idle session back instead of opening a new one (a new
    session costs the server a backend start and authentication, about 5 ms of CPU). A
    parked session was reset after its last run, like any idle one; one unused for
    PARKED_IDLE_S is closed, so a job mix that changed does not hold connection slots.
    """

    def __init__(self, dsn: str, keep: int = 1) -> None:
        self.dsn = dsn
        self.keep = max(1, keep)
        self.conn = self._connect(None)
        row = self.conn.execute("SELECT session_user, pg_backend_pid()").fetchone()
        assert row is not None
        self.default_role: str = row[0]
        self.role: str = row[0]
        self.database: str | None = None
        self.backend_pid: int = row[1]
        # (role, database) -> (idle connection, monotonic time it was parked); oldest first.
        self.parked: OrderedDict[tuple[str, str | None], tuple[psycopg.Connection[Any], float]] = OrderedDict()

    def _connect(self, role: str | None, database: str | None = None) -> psycopg.Connection[Any]:
        params = psycopg.conninfo.conninfo_to_dict(self.dsn)
        if database is not None:
            params["dbname"] = database
        if role is not None:
            # The scheduler's password is not the owner's: libpq finds the owner's in its
            # password file, or the server trusts the scheduler's host for it (docs/security.md).
            params["user"] = role
            params.pop("password", None)
        # A job whose worker died (kill -9, its scheduler killed) is aborted by the server within
        # this interval instead of running on, unwatched, to a commit nobody records. As a
        # connection option it survives DISCARD ALL between runs.
        params["options"] = f"{params.get('options') or ''} -c client_connection_check_interval={CHECK_CLIENT_MS}"
        conn = psycopg.connect(psycopg.conninfo.make_conninfo(**{k: str(v) for k, v in params.items()}),
                               autocommit=True, application_name="pgsched worker idle")
        # DISCARD ALL between runs drops prepared statements, so psycopg must not keep any.
        conn.prepare_threshold = None
        return conn

    def reconnect(self) -> None:
        """A new connection as the current role, after the server closed ours (psycopg.Error if it cannot)."""
        new = self._open(self.role, self.database)
        self.conn.close()
        self._use(new, self.role, self.database)

    def become(self, role: str, database: str | None = None) -> None:
        """Switch to a session as `role` in `database`: a parked one that is still alive, or a new one
        (psycopg.Error if it cannot be opened; the current session is then kept)."""
        if (role, database) == (self.role, self.database):
            return
        found = self.parked.pop((role, database), None)
        if found is not None and _idle_session_alive(found[0]):
            new = found[0]
        else:
            if found is not None:
                found[0].close()
            new = self._open(role, database)
        self._park(self.conn, self.role, self.database)
        self._use(new, role, database)

    def parked_keys(self) -> list[list[str | None]]:
        """The parked sessions' [role, database], for the scheduler's pairing of runs and workers."""
        return [[r, d] for r, d in self.parked]

    def expire(self, now: float) -> float | None:
        """Close parked sessions unused for PARKED_IDLE_S, or closed by the server; seconds until the
        next one expires (None: none parked)."""
        for key, (conn, since) in list(self.parked.items()):
            if now >= since + PARKED_IDLE_S or not _idle_session_alive(conn):
                del self.parked[key]
                conn.close()
        return min((since + PARKED_IDLE_S - now for _, since in self.parked.values()), default=None)

    def _open(self, role: str, database: str | None) -> psycopg.Connection[Any]:
        user = None if role == self.default_role else role
        try:
            return self._connect(user, database)
        except psycopg.OperationalError as e:
            # The server's connection slots are full: give back the parked sessions and try again.
            if not self.parked or passing_refusal(e) != "53300":
                raise
        while self.parked:
            self._close_oldest()
        # Their backends leave the server's count a moment after the close, not at once.
        for pause in (0.005, 0.02, 0.05, 0.1):
            time.sleep(pause)
            with contextlib.suppress(psycopg.OperationalError):
                return self._connect(user, database)
        return self._connect(user, database)

    def close(self) -> None:
        """Close every session, the current one and the parked ones."""
        while self.parked:
            self._close_oldest()
        self.conn.close()

    def _close_oldest(self) -> None:
        self.parked.popitem(last=False)[1][0].close()

    def _park(self, conn: psycopg.Connection[Any], role: str, database: str | None) -> None:
        """Keep the session being left (idle and reset after its run), or close it when none are kept."""
        if self.keep == 1 or conn.closed:
            conn.close()
            return
        self.parked[(role, database)] = (conn, time.monotonic())
        while len(self.parked) > self.keep - 1:
            self._close_oldest()

    def _use(self, conn: psycopg.Connection[Any], role: str, database: str | None) -> None:
        """Make `conn` the session runs go to."""
        # The pid came with the connection's start (libpq's BackendKeyData): no round trip for it.
        # It is the server's own on a direct connection; through a pooler it would not be, but a
        # pooler refuses or drops the options every worker connects with (_connect) anyway.
        self.conn, self.role, self.database, self.backend_pid = conn, role, database, conn.info.backend_pid

    def fds(self) -> list[int]:
        """The parked sessions' sockets (watched while idle: a closed one is dropped at once)."""
        return [c.fileno() for c, _ in self.parked.values() if not c.closed]


def passing_refusal(e: psycopg.Error) -> str | None:
    """The SQLSTATE of a refused session start that passes (PASSING_REFUSALS); None: the owner's doing."""
    text = str(e).lower()
    return next((code for words, code in PASSING_REFUSALS.items() if words in text), None)


def _wait_for_start(msg: dict[str, Any]) -> None:
    # Claimed a little ahead of its plan time: start on the dot, not early.
    delay = float(msg.get("start_at") or 0) - time.monotonic()
    if delay > 0:
        time.sleep(min(delay, 1.0))


def run_one(conn: psycopg.Connection[Any], msg: dict[str, Any], heartbeat: pyjob.Heartbeat) -> tuple[Done, bool]:
    """Execute one run: the result message for the parent, and whether the session was reset after it."""
    run_id = int(msg["run_id"])
    set_up = _set_up_values(msg)
    if msg.get("scope_query"):
        return _fan_out(conn, msg, run_id, set_up), False
    command: str = msg.get("command") or ""
    try:
        if msg["kind"] == "python" or (msg["kind"] == "command" and not one_statement(command)):
            # A Python handler and command text of several statements (the simple query protocol,
            # which has no pipeline) take the set-up in a round trip of its own.
            conn.execute("SELECT " + SET_UP, set_up)
    except psycopg.Error as e:
        return _failed(conn, run_id, e), False
    _wait_for_start(msg)
    if msg["kind"] == "python":
        return pyjob.run(conn, msg, heartbeat), False
    try:
        if msg["kind"] == "proc":
            return _run_proc(conn, msg, run_id, set_up)
        if one_statement(command):
            encoding = conn.info.encoding
            ended = oneround.run_and_reset(conn, command.encode(encoding), (), _set_up_statement(set_up, encoding))
            # Not idle on a live session: the command began a transaction (a lone BEGIN), below.
            if conn.closed or conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
                return _ended(run_id, ended), ended.reset
        else:
            conn.execute(sql.SQL(command))  # several statements: the simple query protocol, no pipeline
        if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            # A command like 'BEGIN; UPDATE ...' left its transaction open: nothing of it is
            # committed, and the session must be clean for the next run.
            conn.execute("ROLLBACK")
            return Done(run_id, ok=False, sqlstate="25001",
                        message="the job left a transaction open (BEGIN without COMMIT); it was rolled back"), False
    except psycopg.Error as e:
        return _failed(conn, run_id, e), False
    except UnicodeEncodeError as e:
        return Done(run_id, ok=False, sqlstate="22021", message=protocol.cap(
            f"the run's text has characters that the session's client encoding ({conn.info.encoding}) "
            f"cannot represent: {e.reason}")), False
    return Done(run_id, ok=True), False


_PARAMETER = re.compile(r"\$[0-9]")


def one_statement(command: str) -> bool:
    """Whether command text is surely one statement that runs as it would alone (pgsched.oneround):
    no ';' but a final one (a ';' in a string or a DO block is taken as a separator: such a command
    takes the simple query protocol, as before), no COPY (which a pipeline cannot carry) and no $n
    (a parameter, which the simple protocol refuses as "there is no parameter $1", where the
    pipeline's Bind would fail as a protocol violation)."""
    body = command.rstrip().rstrip(";")
    return ";" not in body and "copy" not in body.lower() and _PARAMETER.search(body) is None


def _failed(conn: psycopg.Connection[Any], run_id: int, e: psycopg.Error) -> Done:
    return Done(run_id, ok=False, sqlstate=e.sqlstate, lost=conn.closed or conn.broken,
                message=protocol.cap(e.diag.message_primary or str(e) or type(e).__name__))


def _run_proc(conn: psycopg.Connection[Any], msg: dict[str, Any], run_id: int,
              set_up: tuple[str, ...]) -> tuple[Done, bool]:
    """A function or procedure job's call and the session reset after it, in one round trip
    (pgsched.oneround); a reset that did not happen is done again by the caller."""
    encoding = conn.info.encoding
    params = _call_params(msg, encoding)
    if msg["is_procedure"]:
        before = _set_up_statement(set_up, encoding)  # CALL cannot carry it: a statement before it
    else:
        params[:0] = [v.encode(encoding) for v in set_up]
        before = None
    ended = oneround.run_and_reset(conn, _call(msg["proc_schema"], msg["proc_name"], bool(msg["is_procedure"]),
                                               encoding), params, before)
    return _ended(run_id, ended), ended.reset


def _set_up_statement(set_up: tuple[str, ...], encoding: str) -> tuple[bytes, list[bytes | None]]:
    """The run's set-up as a statement of its own, sent in the run's pipeline ahead of a statement
    that cannot carry it (a CALL, command text)."""
    return _SET_UP_ALONE, [v.encode(encoding) for v in set_up]


def _ended(run_id: int, ended: oneround.Ended) -> Done:
    if ended.message is None:
        return Done(run_id, ok=True)
    return Done(run_id, ok=False, sqlstate=ended.sqlstate, lost=ended.lost, message=protocol.cap(ended.message))


def _fan_out(conn: psycopg.Connection[Any], msg: dict[str, Any], run_id: int, set_up: tuple[str, ...]) -> Done:
    """The plan run of a scoped job: read its scope keys, as its owner, in a read-only transaction.

    The query is wrapped as a subquery, so it must be one query returning rows; the first
    column is the key, taken as PostgreSQL's text of it (an enum, a boolean or a jsonb key
    reads as it prints in psql). NULL and empty keys and duplicates are dropped.
    """
    query = sql.SQL("SELECT s.* FROM ({}) AS s LIMIT {}").format(
        sql.SQL(msg["scope_query"]), sql.Literal(MAX_SCOPES + 1))
    try:
        with conn.transaction():
            conn.execute("SELECT " + SET_UP, set_up)
            conn.execute("SET TRANSACTION READ ONLY")
            _wait_for_start(msg)
            # Prepared, i.e. the extended protocol, which takes exactly one statement: a query that
            # closes the parenthesis and appends '; COMMIT; ...' is refused instead of escaping the
            # read-only transaction. (It is deallocated at once, below.)
            conn.prepare_threshold = 0  # prepare=True is ignored while preparing is off (None)
            try:
                res = conn.execute(query, prepare=True).pgresult
                # ... and psycopg forgets its prepared statements only if it sees them deallocated
                # while preparing is on: DISCARD ALL after the run would leave it a stale name.
                conn.execute("DEALLOCATE ALL")
            finally:
                conn.prepare_threshold = None
            assert res is not None
            raw = [res.get_value(i, 0) for i in range(res.ntuples)] if res.nfields else []
    except psycopg.Error as e:
        return Done(run_id, ok=False, sqlstate=e.sqlstate, lost=conn.closed or conn.broken,
                    message=protocol.cap(f"scope_query: {e.diag.message_primary or e}"))
    if not res.nfields:
        # add_job refuses such a query; a row written by hand may still hold one.
        return Done(run_id, ok=False, sqlstate="42P10",
                    message="scope_query: it returns no column (its first column is the scope key)")
    keys = list(dict.fromkeys(k for k in (bytes(v).decode() for v in raw if v is not None) if k))
    if len(raw) > MAX_SCOPES or any(len(k) > MAX_SCOPE_KEY for k in keys):
        return Done(run_id, ok=False, sqlstate="54000",
                    message=f"scope_query returned more than {MAX_SCOPES} rows or a key longer than "
                            f"{MAX_SCOPE_KEY} characters; at most {MAX_SCOPES} keys of at most {MAX_SCOPE_KEY} "
                            "characters are accepted")
    return Done(run_id, ok=True, scopes=keys, result={"scopes": len(keys)})


def reset_session(conn: psycopg.Connection[Any]) -> bool:
    """Nothing a job set (role, GUCs, temp tables, prepared statements, locks) reaches the next run.

    False if the connection is gone (the worker must then exit and be replaced).
    """
    try:
        conn.execute("DISCARD ALL")
    except psycopg.Error:
        if not (conn.closed or conn.broken):
            raise
        return False
    return True


def main() -> int:
    _die_with_parent()
    _as_batch_task()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when we stop
    dsn = os.environ.get("PGSCHED_WORKER_DSN", "")
    out = sys.stdout
    try:
        session = Session(dsn, keep=int(os.environ.get("PGSCHED_WORKER_SESSIONS") or 1))
    except psycopg.Error as e:
        _emit(out, Failed(protocol.cap(str(e))))
        return EXIT_CONNECT
    try:
        pyjob.import_apps([m for m in os.environ.get("PGSCHED_APP_MODULES", "").split(",") if m])
    except Exception as e:
        _emit(out, Failed(protocol.cap(f"cannot import the app modules: {pyjob.describe(e)}")))
        return EXIT_CONNECT
    heartbeat = pyjob.Heartbeat(dsn)
    _emit(out, Ready(pid=os.getpid(), backend_pid=session.backend_pid, role=session.role))
    reported: list[list[str | None]] = []  # the parked sessions the scheduler was told of
    for line in _requests(session, out):
        msg = json.loads(line)
        if not _idle_session_alive(session.conn):
            # The server closed the idle session just as this run was handed over (a restart):
            # nothing of the run has happened yet, so a new session can run it.
            try:
                session.reconnect()
            except psycopg.Error:
                return EXIT_LOST
            reported = _switched(out, session, msg["run_id"])
        owner = msg.get("owner")
        database = msg.get("database") or None
        if not owner:
            # Never fall back to the scheduler's own role.
            _emit(out, Done(msg["run_id"], ok=False, owner_unusable=True, sqlstate="28000",
                            message="the run names no owner: refused"))
            continue
        if (owner, database) != (session.role, session.database):
            try:
                session.become(owner, database)
            except psycopg.Error as e:
                # The owner's doing disables the job (retrying would only fail again); a refusal
                # that passes fails the run, which is retried as any failure.
                passing = passing_refusal(e)
                reported = _report_end(out, session, reported, Done(
                    msg["run_id"], ok=False, owner_unusable=passing is None, sqlstate=e.sqlstate or passing or "28000",
                    message=protocol.cap(f"cannot open a session as the job's owner {owner}"
                                         f"{f' in database {database}' if database else ''}: {str(e).strip()}")))
                continue
            reported = _switched(out, session, msg["run_id"])
        result, was_reset = run_one(session.conn, msg, heartbeat)
        # Report first, then reset (unless the run's pipeline did): the reset overlaps the parent's bookkeeping.
        reported = _report_end(out, session, reported, result)
        if result.lost:
            return EXIT_LOST
        if not was_reset and not reset_session(session.conn):
            _emit(out, Lost())
            return EXIT_LOST
    code = EXIT_LOST if session.conn.closed or session.conn.broken else EXIT_OK
    session.close()
    return code


def _report_end(out: IO[str], session: Session, reported: list[list[str | None]], done: Done) -> list[list[str | None]]:
    """Report a run's end, with the parked sessions if they changed since `reported` (expired, or
    given back for want of slots); the parked ones the scheduler was told of."""
    parked = session.parked_keys()
    _emit(out, done if parked == reported else dataclasses.replace(done, parked=parked))
    return parked


def _switched(out: IO[str], session: Session, run_id: int) -> list[list[str | None]]:
    """Tell the scheduler that a run goes to another session than the last (Backend); the parked ones it was told of."""
    parked = session.parked_keys()
    _emit(out, Backend(run_id=run_id, backend_pid=session.backend_pid, role=session.role,
                       database=session.database, parked=parked))
    return parked


def _requests(session: Session, out: IO[str]) -> Iterator[bytes]:
    """Lines from stdin until it closes.

    While waiting for a run the worker also watches its connection's socket: a
    server restart, pg_terminate_backend or idle_session_timeout ends an idle
    session, and a worker that only found out at its next run would turn that
    run into a crash. It says so at once (Lost), so the parent replaces it and
    closes its stdin, but it keeps reading until then: a run the parent sent
    before it read Lost (after reconnecting to a restarted server, say) still
    arrives, and main() runs it on a new session instead of leaving it to crash.
    stdin is read unbuffered so that select() sees every line that is waiting.
    """
    stdin = sys.stdin.fileno()
    buf = b""
    while True:
        while b"\n" not in buf:
            conn = session.conn  # the session may have switched to another owner's
            watch = [stdin] if conn.closed else [stdin, conn.fileno()]
            until = session.expire(time.monotonic())
            ready, _, _ = select.select([*watch, *session.fds()], [], [], until)
            if watch[-1] in ready and watch[-1] != stdin and not _still_connected(conn):
                _emit(out, Lost())
            # With a run waiting on stdin, the loop in main() reconnects and runs it.
            if stdin in ready:
                chunk = os.read(stdin, 65536)
                if not chunk:
                    return
                buf += chunk
        line, buf = buf.split(b"\n", 1)
        if line.strip():
            yield line


def _idle_session_alive(conn: psycopg.Connection[Any]) -> bool:
    """Whether an idle session is still there, without blocking: only what the server already sent is read."""
    if conn.closed:
        return False
    try:
        ready, _, _ = select.select([conn.fileno()], [], [], 0)
    except psycopg.OperationalError:  # libpq already dropped the socket
        conn.close()
        return False
    return not ready or _still_connected(conn)


def _still_connected(conn: psycopg.Connection[Any]) -> bool:
    """Read what the server sent an idle session; False if it is ending it or closed it."""
    if conn.closed:
        return False
    # A terminated backend sends its last message (FATAL) and exits; the end of the stream follows
    # a moment later. libpq hands a FATAL that arrives while no query runs to the notice handlers,
    # and the connection's status stays OK until the end is read: the FATAL itself says the
    # session is over (a loop that polled for the end took a session terminated a moment before
    # for alive 196 times in 200).
    ending: list[bool] = []

    def on_notice(diag: psycopg.errors.Diagnostic) -> None:
        if diag.severity_nonlocalized in ("FATAL", "PANIC"):
            ending.append(True)

    conn.add_notice_handler(on_notice)
    try:
        for _ in range(4):
            conn.pgconn.consume_input()
            conn.pgconn.is_busy()  # parses what was read: the notice handlers see it now
            if ending or conn.pgconn.status != psycopg.pq.ConnStatus.OK:
                raise psycopg.OperationalError("the connection is lost")
            if not select.select([conn.pgconn.socket], [], [], 0)[0]:
                break
    except (psycopg.OperationalError, OSError):
        conn.close()
        return False
    finally:
        conn.remove_notice_handler(on_notice)
    return True


if __name__ == "__main__":
    sys.exit(main())
