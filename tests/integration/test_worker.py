"""The worker process on its own (pgsched.launcher + pgsched.worker), against a real database."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import psycopg.conninfo
import pytest
from psycopg import sql

from pgsched import launcher, oneround, protocol, pyjob, worker
from pgsched.launcher import Worker

Conn = psycopg.Connection[tuple[Any, ...]]


def events(w: Worker, want: type[protocol.Event], timeout: float = 10.0) -> list[protocol.Event]:
    """Read the worker's reports until one of kind `want` arrives; all of them, in order."""
    seen: list[protocol.Event] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = w.read()
        seen += w.events
        w.events.clear()
        if any(isinstance(e, want) for e in seen):
            return seen
        assert alive, f"the worker exited ({launcher.reap(w, timeout=1)}) before '{want}': {seen}"
        time.sleep(0.01)
    raise AssertionError(f"no '{want}' from the worker within {timeout}s: {seen}")


def connected_worker(db: str, conn: Conn) -> tuple[Worker, int | None, str]:
    """A worker that has reported Ready, its backend pid and role; the table `ran` for insert_run."""
    conn.execute("CREATE TABLE ran (x int)")
    w = launcher.launch(db)
    ready = events(w, protocol.Ready)[-1]
    assert isinstance(ready, protocol.Ready)
    return w, ready.backend_pid, str(ready.role)


def insert_run(role: str) -> dict[str, Any]:
    """A run of a command job inserting one row into `ran` (its backend's pid), as the scheduler sends it."""
    return {"run_id": 1, "job_id": 1, "kind": "command", "owner": role,
            "command": "INSERT INTO ran VALUES (pg_backend_pid())",
            "config": None, "app": "pgsched job 1 run 1 lease 1", "job_name": "t", "plan_time": "2026-01-01T00:00Z",
            "lease_token": 1, "scope": "", "scope_query": None, "start_at": 0}


def function_run(role: str, run_id: int, name: str, *, procedure: bool = False, scope: str = "",
                 config: Any = None) -> dict[str, Any]:
    """A run of the function (or procedure) public.<name>(job_id, config), as the scheduler sends it."""
    return {"run_id": run_id, "job_id": 1, "kind": "proc", "owner": role, "proc_schema": "public",
            "proc_name": name, "is_procedure": procedure, "config": config,
            "app": f"pgsched job 1 run {run_id} lease 1", "job_name": "t", "plan_time": "2026-01-01T00:00:00+00:00",
            "lease_token": 1, "scope": scope, "scope_query": None, "start_at": 0}


def ran_on_a_new_session(w: Worker, conn: Conn, old_backend: int | None) -> None:
    """The worker reconnected (a new backend, the one it reported) and ran insert_run's run
    successfully, once."""
    seen = events(w, protocol.Done)
    backend = [e for e in seen if isinstance(e, protocol.Backend)]
    assert backend and backend[0].backend_pid != old_backend, seen
    done = next(e for e in seen if isinstance(e, protocol.Done))
    assert done.ok is True, done
    assert conn.execute("SELECT x FROM ran").fetchall() == [(backend[0].backend_pid,)]


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="no SCHED_BATCH on this system")
def test_a_worker_is_a_batch_task(db: str, conn: Conn) -> None:
    """A worker woken by a run handed to it must not preempt the scheduler handing out the others
    (pgsched.worker._as_batch_task)."""
    if os.sched_getscheduler(0) != os.SCHED_OTHER:
        pytest.skip("the test runner does not run with the default policy: a worker keeps what it inherits")
    w, _, role = connected_worker(db, conn)
    try:
        assert os.sched_getscheduler(w.pid) == os.SCHED_BATCH
        w.send(insert_run(role))
        done = [e for e in events(w, protocol.Done) if isinstance(e, protocol.Done)]
        assert done[0].ok is True, done
        assert os.sched_getscheduler(w.pid) == os.SCHED_BATCH
    finally:
        w.close_stdin()
        launcher.reap(w, timeout=5)


def test_a_run_handed_over_as_the_idle_session_dies_runs_on_a_new_session(db: str, conn: Conn) -> None:
    """A server restart closes an idle worker's session just as the scheduler gives it a run:
    nothing of the run has happened, so the worker reconnects and runs it (no crash)."""
    w, old_backend, role = connected_worker(db, conn)
    try:
        os.kill(w.pid, signal.SIGSTOP)  # so that the lost session and the run arrive together
        conn.execute("SELECT pg_terminate_backend(%s)", (old_backend,))
        w.send(insert_run(role))
        time.sleep(0.2)
        os.kill(w.pid, signal.SIGCONT)
        ran_on_a_new_session(w, conn, old_backend)
    finally:
        w.close_stdin()
        launcher.reap(w, timeout=5)


def test_a_run_of_another_owner_runs_on_a_session_as_that_owner_and_its_backend_is_the_one_reported(
        db: str, conn: Conn) -> None:
    w, old_backend, _ = connected_worker(db, conn)
    owner = f"other_owner_{uuid.uuid4().hex[:8]}"
    conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(owner)))
    try:
        conn.execute(sql.SQL("GRANT INSERT ON ran TO {}").format(sql.Identifier(owner)))
        w.send(insert_run(owner))
        seen = events(w, protocol.Done)
        [backend] = [e for e in seen if isinstance(e, protocol.Backend)]
        assert (backend.role, backend.backend_pid != old_backend) == (owner, True), seen
        assert [e.ok for e in seen if isinstance(e, protocol.Done)] == [True], seen
        # The pid reported is the session's that ran the job (the scheduler records it in the run's row).
        assert conn.execute("SELECT x FROM ran").fetchall() == [(backend.backend_pid,)]
    finally:
        try:
            w.close_stdin()
            launcher.reap(w, timeout=5)
        finally:
            # Roles are the cluster's, not the test database's.
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(owner)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(owner)))


def test_a_worker_whose_idle_session_dies_says_so_and_still_runs_what_was_sent_before_it_was_replaced(
        db: str, conn: Conn) -> None:
    """After a server restart the scheduler may reconnect and hand out runs before it has read that
    its workers lost their sessions. The worker reports Lost at once but goes on reading until its
    stdin closes, so such a run runs on a new session instead of crashing with the worker."""
    w, old_backend, role = connected_worker(db, conn)
    try:
        conn.execute("SELECT pg_terminate_backend(%s)", (old_backend,))
        assert [type(e) for e in events(w, protocol.Lost)] == [protocol.Lost]
        time.sleep(0.2)
        assert w.proc.poll() is None, "the worker exited with a run possibly on its way"
        w.send(insert_run(role))
        ran_on_a_new_session(w, conn, old_backend)
    finally:
        w.close_stdin()
    assert launcher.reap(w, timeout=5) == 0


def test_a_worker_whose_idle_session_died_exits_when_its_stdin_closes(db: str, conn: Conn) -> None:
    w = launcher.launch(db)
    ready = events(w, protocol.Ready)[-1]
    assert isinstance(ready, protocol.Ready)
    conn.execute("SELECT pg_terminate_backend(%s)", (ready.backend_pid,))
    events(w, protocol.Lost)
    w.close_stdin()
    assert launcher.reap(w, timeout=5) == 4  # EXIT_LOST: its session is gone


def test_a_job_whose_worker_dies_is_aborted_by_the_server(db: str, conn: Conn) -> None:
    """The worker's session checks that its client is there (client_connection_check_interval): a job
    whose worker was killed stops within a moment instead of running on to an unrecorded commit."""
    conn.execute("CREATE TABLE ran (x int)")
    w = launcher.launch(db)
    try:
        ready = events(w, protocol.Ready)[-1]
        assert isinstance(ready, protocol.Ready)
        backend = ready.backend_pid
        assert conn.execute("SELECT setting FROM pg_settings WHERE name = 'client_connection_check_interval'"
                            ).fetchone() is not None
        w.send({"run_id": 1, "job_id": 1, "kind": "command", "owner": str(ready.role),
                "command": "INSERT INTO ran VALUES (1); SELECT pg_sleep(30)", "config": None,
                "app": "pgsched job 1 run 1 lease 1", "job_name": "t", "plan_time": "2026-01-01T00:00Z",
                "lease_token": 1, "scope": "", "scope_query": None, "start_at": 0})
        active = "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND state = 'active' AND query LIKE '%%pg_sleep%%'"
        deadline = time.monotonic() + 5
        while not conn.execute(active, (backend,)).fetchone():
            assert time.monotonic() < deadline, "the job never started"
            time.sleep(0.02)
        os.killpg(w.pid, signal.SIGKILL)
        killed = time.monotonic()
        while conn.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (backend,)).fetchone():
            assert time.monotonic() - killed < 3, "the orphan backend is still running the job"
            time.sleep(0.02)
        assert time.monotonic() - killed < 1.5
        assert conn.execute("SELECT count(*) FROM ran").fetchone() == (0,)  # rolled back, not committed
    finally:
        launcher.reap(w, timeout=5)


def test_a_function_run_sees_its_set_up_whatever_its_values_hold(db: str, conn: Conn) -> None:
    """The run's set-up travels as bound parameters: a scope key with '%' and quotes (a tenant's
    name, say) reaches the job as it is, and a second run of the same function with other values
    (the statement's text kept by the worker) sees its own."""
    conn.execute("CREATE TABLE seen (run_id text, plan_time text, scope text, app text)")
    conn.execute("""CREATE FUNCTION public.note(job_id int, config jsonb) RETURNS void LANGUAGE sql AS $$
                    INSERT INTO seen VALUES (current_setting('pgsched.run_id'), current_setting('pgsched.plan_time'),
                                             current_setting('pgsched.scope'), current_setting('application_name'))
                    $$""")
    w, _, role = connected_worker(db, conn)
    try:
        for run_id, scope in ((7, "50%off 'a' %s \"b\""), (8, "")):
            w.send(function_run(role, run_id, "note", scope=scope, config={"x": "%s"}))
            done = [e for e in events(w, protocol.Done) if isinstance(e, protocol.Done)]
            assert done[-1].ok is True, done
        assert conn.execute("SELECT * FROM seen ORDER BY run_id").fetchall() == [
            ("7", "2026-01-01T00:00:00+00:00", "50%off 'a' %s \"b\"", "pgsched job 1 run 7 lease 1"),
            ("8", "2026-01-01T00:00:00+00:00", "", "pgsched job 1 run 8 lease 1")]
    finally:
        w.close_stdin()
        launcher.reap(w, timeout=5)


@pytest.mark.parametrize("kind", ["procedure", "one-statement command", "command of several statements"])
def test_a_procedure_or_command_run_sees_its_set_up_sent_ahead_of_it(db: str, conn: Conn, kind: str) -> None:
    """A CALL and command text cannot carry the set-up as a function's SELECT does: a procedure and
    a one-statement command get it as a statement of its own in the run's pipeline
    (pgsched.oneround: set-up, job, reset, one round trip), command text of several statements in
    a round trip before it. Each run sees its own values, and a failing command fails with its
    own error, its session reset all the same."""
    conn.execute("CREATE TABLE seen (run_id text, plan_time text, scope text, app text)")
    note = ("INSERT INTO seen VALUES (current_setting('pgsched.run_id'), current_setting('pgsched.plan_time'), "
            "current_setting('pgsched.scope'), current_setting('application_name'))")
    conn.execute(f"CREATE PROCEDURE public.note(job_id int, config jsonb) LANGUAGE sql AS $${note}$$")
    w, _, role = connected_worker(db, conn)

    def run(run_id: int, scope: str, command: str) -> protocol.Done:
        if kind == "procedure" and command == note:
            msg = function_run(role, run_id, "note", procedure=True, scope=scope)
        else:
            msg = {**insert_run(role), "run_id": run_id, "scope": scope, "command": command,
                   "app": f"pgsched job 1 run {run_id} lease 1", "plan_time": "2026-01-01T00:00:00+00:00"}
        w.send(msg)
        done = [e for e in events(w, protocol.Done) if isinstance(e, protocol.Done)]
        assert done[-1].run_id == run_id, done
        return done[-1]

    several = "SELECT 1; " if kind.startswith("command of several") else ""
    try:
        for run_id, scope in ((7, "50%off 'a' %s \"b\""), (8, "")):
            assert run(run_id, scope, several + note).ok is True
        failed = run(9, "x", several + "SELECT 1/0")
        assert (failed.ok, failed.sqlstate) == (False, "22012"), failed
        assert run(10, "", several + note).ok is True
        assert conn.execute("SELECT * FROM seen ORDER BY run_id::int").fetchall() == [
            ("7", "2026-01-01T00:00:00+00:00", "50%off 'a' %s \"b\"", "pgsched job 1 run 7 lease 1"),
            ("8", "2026-01-01T00:00:00+00:00", "", "pgsched job 1 run 8 lease 1"),
            ("10", "2026-01-01T00:00:00+00:00", "", "pgsched job 1 run 10 lease 1")]
    finally:
        w.close_stdin()
        launcher.reap(w, timeout=5)


def test_a_statement_after_a_failed_set_up_is_cancelled_and_a_set_up_lost_says_why(db: str) -> None:
    """The set-up shares the run's pipeline, so its failure does not stop the statement after it:
    a job must not run without its application_name (how the scheduler finds its backend), so the
    statement is cancelled. A session terminated during the set-up reports the server's reason."""
    with psycopg.connect(db, autocommit=True) as c:
        t0 = time.monotonic()
        ended = oneround.run_and_reset(c, b"SELECT pg_sleep(20)", (), (b"SELECT 1/0", []))
        assert time.monotonic() - t0 < 5, "the statement after the failed set-up ran on"
        assert (ended.sqlstate, ended.lost) == ("57014", False), ended
        assert c.execute("SELECT 1").fetchone() == (1,)  # the session is usable, idle again
        assert c.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        # A statement that ends before the cancel reaches it keeps its outcome.
        ended = oneround.run_and_reset(c, b"SELECT 1", (), (b"SELECT 1/0", []))
        assert ended.sqlstate in (None, "57014"), ended
    with psycopg.connect(db, autocommit=True) as c:
        ended = oneround.run_and_reset(c, b"SELECT 1", (), (b"SELECT pg_terminate_backend(pg_backend_pid())", []))
        assert ended.lost and ended.sqlstate == "57P01", ended
        assert ended.message and "terminating connection due to administrator command" in ended.message, ended


def test_a_function_whose_name_holds_percent_signs_is_the_one_called(db: str, conn: Conn) -> None:
    """psycopg reads placeholders in a statement's whole text, quoted identifiers included: the
    worker doubles a '%' of the proc's name, so "a%b" runs (not a placeholder error) and "a%%b" is
    "a%%b" (not "a%b"), as a function and as a procedure."""
    conn.execute("CREATE TABLE called (name text)")
    for name in ("a%b", "a%%b", "p%s"):
        kind = "PROCEDURE" if name.startswith("p") else "FUNCTION"
        returns = "" if kind == "PROCEDURE" else "RETURNS void"
        conn.execute(f"CREATE {kind} public.\"{name}\"(job_id int, config jsonb) {returns} LANGUAGE sql "
                     f"AS $$INSERT INTO called VALUES ('{name}')$$")
    w, _, role = connected_worker(db, conn)
    try:
        for run_id, name in enumerate(("a%%b", "a%b", "p%s"), start=1):
            w.send(function_run(role, run_id, name, procedure=name.startswith("p")))
            done = [e for e in events(w, protocol.Done) if isinstance(e, protocol.Done)]
            assert done[-1].ok is True, done
        assert [r[0] for r in conn.execute("SELECT name FROM called").fetchall()] == ["a%%b", "a%b", "p%s"]
    finally:
        w.close_stdin()
        launcher.reap(w, timeout=5)


# What a run may leave in its session: a setting, a temp table, a session advisory lock, a LISTEN,
# and (last, as it changes who runs the rest) another current role. The function and the procedure
# note their backend, to show that the next run had the same session.
LEAVE = """
    PERFORM set_config('myapp.left', 'yes', false);
    CREATE TEMP TABLE left_tmp (x int);
    PERFORM pg_advisory_lock(4242);
    EXECUTE 'LISTEN left_channel';
    INSERT INTO left_by VALUES (pg_backend_pid());
    PERFORM set_config('role', 'isolation_other', false);
"""
# The same, then prepared statements and a holdable cursor, which only command text can leave.
LEAVE_COMMAND = ("SELECT set_config('myapp.left', 'yes', false); CREATE TEMP TABLE left_tmp (x int); "
                 "SELECT pg_advisory_lock(4242); LISTEN left_channel; INSERT INTO left_by VALUES (pg_backend_pid()); "
                 "PREPARE left_stmt AS SELECT 1; DECLARE left_cur CURSOR WITH HOLD FOR SELECT 1; "
                 "SET ROLE isolation_other")
# The same in one statement, which takes the pipeline with its reset (pgsched.oneround).
LEAVE_ONE_STATEMENT = ("SELECT set_config('myapp.left', 'yes', false), pg_advisory_lock(4242), "
                       "set_config('role', 'isolation_other', false)")
# What the next run sees of it (a setting once set reads '' after a reset; the run's own unnamed
# portal is a cursor without a name).
PROBE = """INSERT INTO seen VALUES (
    pg_backend_pid(), nullif(current_setting('myapp.left', true), ''), current_user::text,
    to_regclass('pg_temp.left_tmp') IS NOT NULL,
    (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()),
    (SELECT count(*) FROM pg_listening_channels()), (SELECT count(*) FROM pg_prepared_statements),
    (SELECT count(*) FROM pg_cursors WHERE name <> ''))"""


@pytest.mark.parametrize("left_by", ["function", "procedure", "command", "one-statement command", "failed function",
                                     "failed procedure"])
def test_nothing_a_run_leaves_in_its_session_reaches_the_next_run(db: str, conn: Conn, left_by: str) -> None:
    """The worker resets its session after every run, the function and procedure runs' reset sent
    with their call (pgsched.oneround), a failed run's too: the next run on the same session sees no
    setting, role, temp table, advisory lock, LISTEN, prepared statement or cursor of the last."""
    conn.execute("DO $$ BEGIN CREATE ROLE isolation_other; EXCEPTION WHEN duplicate_object THEN NULL; END $$")
    conn.execute("CREATE TABLE left_by (pid int)")
    conn.execute("CREATE TABLE seen (pid int, setting text, role text, temp_table boolean, advisory_locks bigint, "
                 "listening bigint, prepared bigint, cursors bigint)")
    conn.execute("GRANT INSERT ON left_by, seen TO isolation_other")
    fail = "RAISE EXCEPTION 'failed on purpose';" if left_by.startswith("failed") else ""
    for kind in ("FUNCTION", "PROCEDURE"):
        returns = "RETURNS void" if kind == "FUNCTION" else ""
        conn.execute(f"CREATE {kind} public.leave_{kind.lower()}(job_id int, config jsonb) {returns} "
                     f"LANGUAGE plpgsql AS $$BEGIN {LEAVE} {fail} END$$")
    conn.execute(f"CREATE FUNCTION public.probe(job_id int, config jsonb) RETURNS void LANGUAGE sql AS $${PROBE}$$")
    w, backend, role = connected_worker(db, conn)
    try:
        if left_by.endswith("command"):
            leave = {**insert_run(role), "command": LEAVE_COMMAND if left_by == "command" else LEAVE_ONE_STATEMENT}
        else:
            kind = left_by.split()[-1]
            leave = function_run(role, 1, f"leave_{kind}", procedure=kind == "procedure")
        w.send(leave)
        done = [e for e in events(w, protocol.Done) if isinstance(e, protocol.Done)]
        assert done[-1].ok is not bool(fail), done
        if fail:
            assert done[-1].sqlstate == "P0001" and done[-1].message == "failed on purpose", done
        elif left_by != "one-statement command":
            assert conn.execute("SELECT pid FROM left_by").fetchall() == [(backend,)]
        w.send(function_run(role, 2, "probe"))
        done = [e for e in events(w, protocol.Done) if isinstance(e, protocol.Done)]
        assert done[-1].ok is True, done
        assert conn.execute("SELECT * FROM seen").fetchall() == [(backend, None, role, False, 0, 0, 0, 0)]
    finally:
        w.close_stdin()
        launcher.reap(w, timeout=5)


def test_a_procedure_job_may_commit_between_its_steps(db: str, conn: Conn) -> None:
    """A procedure's CALL is alone in its transaction (the session reset follows it, after a Sync):
    it may COMMIT, and what it committed before it failed stays committed."""
    conn.execute("CREATE TABLE steps (n int)")
    conn.execute("""CREATE PROCEDURE public.stepwise(job_id int, config jsonb) LANGUAGE plpgsql AS $$
                    BEGIN
                        INSERT INTO steps VALUES (1); COMMIT;
                        INSERT INTO steps VALUES (2); COMMIT;
                        IF (config->>'fail')::boolean THEN
                            INSERT INTO steps VALUES (3);
                            RAISE EXCEPTION 'step 3 failed';
                        END IF;
                    END $$""")
    w, _, role = connected_worker(db, conn)
    try:
        for run_id, fail in ((1, False), (2, True)):
            w.send(function_run(role, run_id, "stepwise", procedure=True, config={"fail": fail}))
            done = [e for e in events(w, protocol.Done) if isinstance(e, protocol.Done)]
            assert (done[-1].ok, done[-1].sqlstate, done[-1].message) == (
                (False, "P0001", "step 3 failed") if fail else (True, None, None)), done
        assert conn.execute("SELECT n FROM steps ORDER BY n").fetchall() == [(1,), (1,), (2,), (2,)]
    finally:
        w.close_stdin()
        launcher.reap(w, timeout=5)


@pytest.mark.parametrize("procedure", [False, True])
def test_a_call_whose_session_is_terminated_reports_the_run_lost_and_the_worker_exits(
        db: str, conn: Conn, procedure: bool) -> None:
    """A function or procedure run and its reset travel together (pgsched.oneround): when the
    server ends the session in the middle of the call, the worker reports the run lost (with the
    server's message) instead of waiting for the reset's answer, and exits to be replaced."""
    kind, returns = ("PROCEDURE", "") if procedure else ("FUNCTION", "RETURNS void")
    conn.execute(f"CREATE {kind} public.sleepy(job_id int, config jsonb) {returns} LANGUAGE sql "
                 "AS $$SELECT pg_sleep(30)$$")
    w, backend, role = connected_worker(db, conn)
    try:
        w.send(function_run(role, 1, "sleepy", procedure=procedure))
        active = "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND state = 'active' AND query LIKE '%%sleepy%%'"
        deadline = time.monotonic() + 5
        while not conn.execute(active, (backend,)).fetchone():
            assert time.monotonic() < deadline, "the job never started"
            time.sleep(0.02)
        conn.execute("SELECT pg_terminate_backend(%s)", (backend,))
        done = [e for e in events(w, protocol.Done) if isinstance(e, protocol.Done)]
        assert (done[-1].ok, done[-1].lost, done[-1].sqlstate) == (False, True, "57P01"), done
        assert done[-1].message and "terminat" in done[-1].message, done
        assert launcher.reap(w, timeout=5) == 4  # EXIT_LOST
    finally:
        w.close_stdin()
        launcher.reap(w, timeout=5)


def test_one_statement_commands_run_as_alone_and_a_transaction_left_open_is_rolled_back(db: str, conn: Conn) -> None:
    """Command text of one statement travels with the session reset (pgsched.oneround), as
    PQexecParams would send it alone: VACUUM may run (it is in no transaction block), a failure
    reports its SQLSTATE, a lone BEGIN fails the run as a transaction left open, rolled back,
    and the next run's session is clean; several statements still run (the simple protocol)."""
    w, _, role = connected_worker(db, conn)
    try:
        for run_id, (command, want) in enumerate((
                ("VACUUM ran", (True, None)),
                ("INSERT INTO ran VALUES (1);", (True, None)),
                ("INSERT INTO no_such_table VALUES (1)", (False, "42P01")),
                ("BEGIN", (False, "25001")),
                ("INSERT INTO ran VALUES (2); INSERT INTO ran VALUES (3)", (True, None))), start=1):
            w.send({**insert_run(role), "run_id": run_id, "command": command})
            done = [e for e in events(w, protocol.Done) if isinstance(e, protocol.Done)]
            assert (done[-1].ok, done[-1].sqlstate) == want, (command, done)
        # 2 and 3 are committed: the run after BEGIN was not inside the transaction it left.
        assert [r[0] for r in conn.execute("SELECT x FROM ran ORDER BY x").fetchall()] == [1, 2, 3]
    finally:
        w.close_stdin()
        launcher.reap(w, timeout=5)


def proxy(db: str, relay: Callable[[socket.socket, socket.socket], None]) -> str:
    """A DSN through a local TCP proxy for one session: `relay(client, server)` runs in a thread of
    its own once the client connected and the proxy reached the server's socket."""
    params = psycopg.conninfo.conninfo_to_dict(db)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def accept() -> None:
        client, _ = listener.accept()
        server = socket.socket(socket.AF_UNIX)
        server.connect(f"{params['host']}/.s.PGSQL.{params.get('port') or 5432}")
        relay(client, server)

    threading.Thread(target=accept, daemon=True).start()
    return psycopg.conninfo.make_conninfo(db, host="127.0.0.1", port=str(listener.getsockname()[1]),
                                          sslmode="disable")


def _proxy_cutting_before_the_reset(db: str) -> str:
    """A DSN through a proxy that forwards a session both ways, except that it closes it right
    after passing on a pipelined run's statement and Sync, before its DISCARD ALL reaches the server."""
    def relay(client: socket.socket, server: socket.socket) -> None:
        def down() -> None:
            with contextlib.suppress(OSError):
                while data := server.recv(65536):
                    client.sendall(data)

        threading.Thread(target=down, daemon=True).start()
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                # The reset's Parse message: 'P', its length (4 bytes), the unnamed statement's "".
                at = data.find(b"\x00DISCARD ALL\x00")
                if at >= 5:
                    server.sendall(data[:at - 5])  # the run's statement and its Sync only
                    time.sleep(0.5)  # their answer reaches the worker
                    client.shutdown(socket.SHUT_RDWR)
                    break
                server.sendall(data)
        client.close()
        server.close()

    return proxy(db, relay)


@pytest.mark.parametrize("outcome", ["success", "failure"])
def test_a_run_whose_session_is_lost_during_the_reset_is_reported_as_it_ended(
        db: str, conn: Conn, outcome: str) -> None:
    """The run's Sync was answered, so its transaction ended: a session lost only during the reset
    after it does not turn a committed run (or a plain failure) into a crash. The worker reports
    the run as it ended, then its lost session, and exits to be replaced."""
    conn.execute("CREATE TABLE ran (x int)")
    conn.execute("CREATE FUNCTION public.ins(job_id int, config jsonb) RETURNS void LANGUAGE sql "
                 "AS $$INSERT INTO ran VALUES (job_id)$$")
    w = launcher.launch(_proxy_cutting_before_the_reset(db))
    try:
        ready = events(w, protocol.Ready)[-1]
        assert isinstance(ready, protocol.Ready)
        w.send(function_run(str(ready.role), 1, "ins" if outcome == "success" else "no_such_function"))
        seen = events(w, protocol.Lost)
        done = [e for e in seen if isinstance(e, protocol.Done)]
        assert len(done) == 1 and done[0].lost is False, seen
        if outcome == "success":
            assert done[0].ok is True, seen
            assert conn.execute("SELECT x FROM ran").fetchall() == [(1,)]
        else:
            assert (done[0].ok, done[0].sqlstate) == (False, "42883"), seen
        assert launcher.reap(w, timeout=5) == 4  # EXIT_LOST: replaced, as for any lost session
    finally:
        w.close_stdin()
        launcher.reap(w, timeout=5)


def test_a_run_on_a_session_already_gone_is_reported_lost(db: str, conn: Conn) -> None:
    """The pipeline cannot even be sent (the server ended the session a moment before): the run is
    reported lost, as a run whose connection died, not a worker that died of an exception."""
    conn.execute("CREATE FUNCTION public.noop2(job_id int, config jsonb) RETURNS void LANGUAGE sql AS 'SELECT NULL'")
    session = worker.Session(db)
    try:
        conn.execute("SELECT pg_terminate_backend(%s)", (session.backend_pid,))
        time.sleep(0.3)
        for _ in range(2):  # the first finds out, the second starts on a session known to be closed
            done, reset = worker.run_one(session.conn, function_run(session.role, 1, "noop2"), pyjob.Heartbeat(db))
            assert (done.ok, done.lost, reset) == (False, True, False), done
    finally:
        session.conn.close()


def test_a_scope_the_database_encoding_cannot_carry_fails_the_run_not_the_worker(db: str, conn: Conn) -> None:
    """An SQL_ASCII database: a run whose scope key is not ASCII fails with 22021, saying why,
    instead of raising out of the worker, and the session runs the next run. (Driven through
    run_one: the scheduler's own database is not SQL_ASCII, a job's `database` may be.)"""
    conn.execute("CREATE DATABASE ascii_only ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0")
    ascii_db = psycopg.conninfo.make_conninfo(db, dbname="ascii_only")
    try:
        with psycopg.connect(ascii_db, autocommit=True) as a:
            a.execute("CREATE TABLE ran (x int)")
            a.execute("CREATE FUNCTION public.ins(job_id int, config jsonb) RETURNS void LANGUAGE sql "
                      "AS $$INSERT INTO ran VALUES (job_id)$$")
            session = worker.Session(ascii_db)
            try:
                role = str(a.execute("SELECT current_user").fetchone()[0].decode())  # type: ignore[index]
                for run_id, scope in ((1, "München"), (2, "Munich")):
                    done, _ = worker.run_one(session.conn, function_run(role, run_id, "ins", scope=scope),
                                             pyjob.Heartbeat(ascii_db))
                    if scope == "Munich":
                        assert done.ok is True, done
                    else:
                        assert (done.ok, done.sqlstate) == (False, "22021"), done
                        assert done.message and "client encoding" in done.message, done
                    assert worker.reset_session(session.conn)
                assert a.execute("SELECT count(*) FROM ran").fetchone() == (1,)
            finally:
                session.conn.close()
    finally:
        conn.execute("DROP DATABASE ascii_only WITH (FORCE)")
