"""A job's statement and the session reset after it, sent to the server in one round trip.

The worker runs a function or procedure job, and command text of one statement, as one
pipeline (libpq's pipeline mode, through psycopg's libpq wrapper `psycopg.pq`): the run's
set-up where the statement cannot carry it (a CALL, command text), the job's statement, then
DISCARD ALL, each followed by a Sync. The server takes them one after the
other without waiting for the worker, so a run costs the worker and its backend one exchange
instead of two. Each Sync ends its statement's transaction: the job's work is committed (or
rolled back) before the reset, and the reset runs outside any transaction, as DISCARD ALL must;
a procedure's CALL is alone in its transaction, so it may COMMIT. A job that fails does not
stop the reset after its Sync: a failed run's session is reset all the same.

Nor does a failed set-up stop the statement after it. The set-up only sets a few settings
(set_config of application_name and pgsched.*), which fails when the connection is lost (then
nothing after it runs either) or when a cancel lands in those microseconds (the scheduler's:
cancel_job, a deleted job, a stop). A job must not run without them: its application_name is how
the scheduler finds its backend to terminate it. So the worker then cancels the statement, again
every CANCEL_EVERY_S until its answer is in (a cancel that finds the backend between two
statements is dropped), and the run has the statement's outcome: cancelled, or what it did if
it ended first. Sent as a round trip of its own before the statement, the set-up cost a trivial
command run about 100 us of the worker's and its backend's CPU (`./dev bench worker_alone --kind
command`).

Each statement is sent as PQexecParams sends one alone (Parse, Bind, Execute, Sync), so a
command such as VACUUM runs as it would by itself. Command text of several statements
(pg_cron-style) needs the simple query protocol, which has no pipeline: the worker runs it and
resets the session in two exchanges (worker.one_statement decides).
"""

from __future__ import annotations

import select
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import pq

RESET = b"DISCARD ALL"
# After a failed set-up: how often the statement after it is cancelled until its answer is in.
CANCEL_EVERY_S = 0.05
# libpq answers None once between two statements' results; more in a row means nothing else is coming.
_MAX_NONE_IN_A_ROW = 3


@dataclass(frozen=True)
class Ended:
    """What the pipeline did: the statement's error (its SQLSTATE and message; none when it
    succeeded), whether the session was reset, and whether the connection was lost."""

    sqlstate: str | None = None
    message: str | None = None
    reset: bool = False
    lost: bool = False


def run_and_reset(conn: psycopg.Connection[Any], query: bytes, params: Sequence[bytes | None],
                  set_up: tuple[bytes, Sequence[bytes | None]] | None = None) -> Ended:
    """Execute `set_up` (a statement and its parameters) if given, then `query` (its placeholders
    $1, $2, ...; `params` as text, None for NULL), then DISCARD ALL, each in its own transaction,
    in one round trip.

    `conn` is in autocommit mode and idle on entry, and left so unless the connection was lost.
    """
    pg = conn.pgconn
    encoding = conn.info.encoding
    pg.enter_pipeline_mode()
    res: pq.abc.PGresult | None = None
    # Whether the statement's Sync was answered: its transaction ended, so its outcome is known
    # even if the connection is lost during the reset (the worker then reports the run as it
    # ended, and its lost session afterwards; a committed run is not a crash).
    ended = reset = False
    try:
        if set_up is not None:
            pg.send_query_params(set_up[0], set_up[1] or None)
            pg.pipeline_sync()
        pg.send_query_params(query, params or None)
        pg.pipeline_sync()
        pg.send_query_params(RESET, None)
        pg.pipeline_sync()
        lost = False
        if set_up is not None:
            before, lost = _until_sync(pg)
            if lost:
                res = before  # its error says why (a terminated session's), not libpq's afterword
            elif before is not None and before.status == pq.ExecStatus.FATAL_ERROR:
                _cancel_until_answered(pg)
        if not lost:
            res, lost = _until_sync(pg)
        if not lost:
            ended = True
            done, _ = _until_sync(pg)
            reset = done is not None and done.status == pq.ExecStatus.COMMAND_OK
    finally:
        if pg.status != pq.ConnStatus.BAD:
            pg.exit_pipeline_mode()
    if res is not None and res.status == pq.ExecStatus.FATAL_ERROR:
        return Ended(sqlstate=_text(res.error_field(pq.DiagnosticField.SQLSTATE), encoding),
                     message=(_text(res.error_field(pq.DiagnosticField.MESSAGE_PRIMARY), encoding)
                              or _text(res.error_message, encoding) or "the job's statement failed"),
                     reset=reset, lost=not ended)
    if not ended:
        return Ended(message=_text(pg.error_message, encoding) or "the connection was lost", lost=True)
    return Ended(reset=reset)


def _cancel_until_answered(pg: pq.abc.PGconn) -> None:
    """Cancel the statement in progress until its answer has begun to arrive (or the connection
    is gone): the statement after a failed set-up."""
    cancel = pg.get_cancel()
    try:
        # Busy first: libpq may have read the answer already, with the set-up's (the socket then
        # has nothing more to say until the next statement, and waiting on it would never end).
        while pg.status != pq.ConnStatus.BAD and pg.is_busy():
            cancel.cancel()
            if select.select([pg.socket], [], [], CANCEL_EVERY_S)[0]:
                pg.consume_input()
    except psycopg.OperationalError:
        return  # lost: the reading that follows says so


def _until_sync(pg: pq.abc.PGconn) -> tuple[pq.abc.PGresult | None, bool]:
    """The result of the statement before the next Sync (its error if it failed, None if it
    returned none) and whether the connection was lost meanwhile."""
    first: pq.abc.PGresult | None = None
    none_in_a_row = 0
    while True:
        res = pg.get_result()
        if res is None:
            none_in_a_row += 1
            if pg.status == pq.ConnStatus.BAD or none_in_a_row > _MAX_NONE_IN_A_ROW:
                return first, True
            continue
        none_in_a_row = 0
        if res.status == pq.ExecStatus.PIPELINE_SYNC:
            return first, False
        if first is None or (res.status == pq.ExecStatus.FATAL_ERROR and first.status != pq.ExecStatus.FATAL_ERROR):
            first = res  # the first error says why (a terminated session's, before libpq's "server closed")
        if pg.status == pq.ConnStatus.BAD:
            return first, True


def _text(raw: bytes | None, encoding: str) -> str | None:
    return raw.decode(encoding, "replace").strip() or None if raw else None
