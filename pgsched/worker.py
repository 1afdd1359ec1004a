"""The worker: the child side of the process contract.

A worker is `python -m pgsched.worker`, started by the launcher in its own
session (process group) with the DSN in PGSCHED_WORKER_DSN. It keeps one
database connection and runs one job at a time:

  parent -> worker (stdin, one JSON object per line): a run to execute
  worker -> parent (stdout, one JSON object per line):
      {"event": "ready", "pid": .., "backend_pid": ..}          once connected
      {"event": "done", "run_id": .., "ok": true}                the job succeeded
      {"event": "done", "run_id": .., "ok": false, "sqlstate": .., "message": .., "lost": bool}

Exit codes: 0 when stdin closes (the parent let it go), 3 when it cannot
connect, 4 after its connection was lost. Any other code or a signal is a crash,
and the parent records it. The worker writes nothing to the catalog: the parent
marks start and end, so a worker that dies needs no clean-up of its own.
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import signal
import sys
import time
from collections.abc import Iterator
from typing import IO, Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

EXIT_OK = 0
EXIT_CONNECT = 3
EXIT_LOST = 4
# Messages and stored text stay small: history rows are read by people.
MAX_MESSAGE = 4000


def _die_with_parent() -> None:
    """Linux: get SIGKILL when the scheduler dies, so no worker outlives it unsupervised."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL)
    except OSError:
        pass


def _emit(out: IO[str], obj: dict[str, Any]) -> None:
    out.write(json.dumps(obj) + "\n")
    out.flush()


def job_statement(msg: dict[str, Any]) -> tuple[sql.SQL | sql.Composed, tuple[Any, ...] | None]:
    """The statement that runs a job: CALL/SELECT proc(job_id, config), or the command text."""
    if msg["kind"] == "command":
        return sql.SQL(msg["command"]), None
    verb = "CALL" if msg["is_procedure"] else "SELECT"
    stmt = sql.SQL(verb + " {}.{}(%s::integer, %s::jsonb)").format(
        sql.Identifier(msg["proc_schema"]), sql.Identifier(msg["proc_name"])
    )
    config = msg.get("config")
    return stmt, (msg["job_id"], None if config is None else Jsonb(config))


def run_one(conn: psycopg.Connection[Any], msg: dict[str, Any]) -> dict[str, Any]:
    """Execute one run; the result message for the parent."""
    result: dict[str, Any] = {"event": "done", "run_id": msg["run_id"], "ok": True}
    try:
        setup = sql.SQL("SET application_name = {}").format(sql.Literal(msg["app"]))
        if msg.get("owner") and msg["owner"] != msg.get("session_user"):
            setup = sql.SQL("; ").join([setup, sql.SQL("SET ROLE {}").format(sql.Identifier(msg["owner"]))])
        conn.execute(setup)
        # Claimed a little ahead of its plan time: start on the dot, not early.
        if msg.get("wait"):
            time.sleep(min(float(msg["wait"]), 1.0))
        stmt, params = job_statement(msg)
        conn.execute(stmt, params)
    except psycopg.Error as e:
        lost = conn.closed or conn.broken
        result.update(ok=False, sqlstate=e.sqlstate, lost=lost,
                      message=(e.diag.message_primary or str(e) or type(e).__name__)[:MAX_MESSAGE])
        if lost:
            return result
    try:
        # Nothing a job set (role, GUCs, temp tables, prepared statements) reaches the next run.
        conn.execute("DISCARD ALL")
    except psycopg.Error:
        if not (conn.closed or conn.broken):
            raise
        # The outcome stands; the worker exits after reporting and is replaced.
        result["lost"] = True
    return result


def main() -> int:
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when we stop
    dsn = os.environ.get("PGSCHED_WORKER_DSN", "")
    out = sys.stdout
    try:
        conn = psycopg.connect(dsn, autocommit=True, application_name="pgsched worker idle")
        # DISCARD ALL between runs drops prepared statements, so psycopg must not keep any.
        conn.prepare_threshold = None
    except psycopg.Error as e:
        _emit(out, {"event": "error", "message": str(e)[:MAX_MESSAGE]})
        return EXIT_CONNECT
    info = conn.execute("SELECT pg_backend_pid(), session_user").fetchone()
    assert info is not None
    backend_pid, session_user = info
    _emit(out, {"event": "ready", "pid": os.getpid(), "backend_pid": backend_pid})
    for line in _requests(conn):
        msg = json.loads(line)
        msg["session_user"] = session_user
        result = run_one(conn, msg)
        _emit(out, result)
        if result.get("lost"):
            return EXIT_LOST
    return EXIT_LOST if conn.closed or conn.broken else EXIT_OK


def _requests(conn: psycopg.Connection[Any]) -> Iterator[bytes]:
    """Lines from stdin until it closes, or until the idle connection is lost.

    While waiting for a run the worker also watches its connection's socket: a
    server restart, pg_terminate_backend or idle_session_timeout ends an idle
    session, and a worker that only found out at its next run would turn that
    run into a crash. Exiting at once (EXIT_LOST) lets the parent replace it
    before giving it work. stdin is read unbuffered so that select() sees
    every line that is waiting.
    """
    stdin = sys.stdin.fileno()
    sock = conn.fileno()
    buf = b""
    while True:
        while b"\n" not in buf:
            ready, _, _ = select.select([stdin, sock], [], [])
            if sock in ready and not _still_connected(conn):
                return
            if stdin in ready:
                chunk = os.read(stdin, 65536)
                if not chunk:
                    return
                buf += chunk
        line, buf = buf.split(b"\n", 1)
        if line.strip():
            yield line


def _still_connected(conn: psycopg.Connection[Any]) -> bool:
    """Read what the server sent an idle session; False if it closed the connection."""
    try:
        conn.pgconn.consume_input()
    except psycopg.OperationalError:
        conn.close()
        return False
    if conn.pgconn.status != psycopg.pq.ConnStatus.OK:
        conn.close()
        return False
    return True


if __name__ == "__main__":
    sys.exit(main())
