"""The sessions a worker keeps (pgsched.worker.Session, serve --worker-sessions): a worker that runs
the jobs of several owners takes a parked session back instead of opening one, and nothing of a
run reaches the next one on a session that was parked in between."""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from pgsched import launcher, protocol, worker
from pgsched.launcher import Worker
from tests.integration.test_scheduler import one, serve
from tests.integration.test_worker import PROBE, Conn, events, insert_run, proxy

# Each run: the pid of the backend that ran it and the role it ran as.
RAN = "INSERT INTO ran VALUES (pg_backend_pid(), current_user)"


@pytest.fixture
def owners(conn: Conn) -> Iterator[list[str]]:
    """Three login roles that may insert into `ran` and `seen` (dropped after the test)."""
    names = [f"owner_{uuid.uuid4().hex[:8]}" for _ in range(3)]
    conn.execute("CREATE TABLE ran (pid int, role text)")
    conn.execute("CREATE TABLE seen (pid int, setting text, role text, temp_table boolean, advisory_locks bigint, "
                 "listening bigint, prepared bigint, cursors bigint)")
    for name in names:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)))
        conn.execute(sql.SQL("GRANT INSERT ON ran, seen TO {}").format(sql.Identifier(name)))
    try:
        yield names
    finally:
        for name in names:
            # Roles are the cluster's, not the test database's.
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (name,))
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


@contextlib.contextmanager
def started(db: str, sessions: int) -> Iterator[tuple[Worker, protocol.Ready]]:
    w = launcher.launch(db, sessions=sessions)
    try:
        ready = events(w, protocol.Ready)[-1]
        assert isinstance(ready, protocol.Ready)
        yield w, ready
    finally:
        w.close_stdin()
        launcher.reap(w, timeout=5)


def run_as(w: Worker, role: str, run_id: int, command: str = RAN) -> tuple[protocol.Backend | None, protocol.Done]:
    """Send a command run as `role`; the Backend event it caused (None: it ran on the session it was in)
    and its Done."""
    w.send({**insert_run(role), "run_id": run_id, "command": command, "app": f"pgsched job 1 run {run_id} lease 1"})
    seen = events(w, protocol.Done)
    backend = [e for e in seen if isinstance(e, protocol.Backend)]
    done = [e for e in seen if isinstance(e, protocol.Done)]
    assert len(backend) <= 1 and len(done) == 1, seen
    return (backend[0] if backend else None), done[0]


def worker_backends(conn: Conn) -> set[int]:
    """The backends of the one worker the test started (pgsched's only sessions in the cluster)."""
    return {int(r[0]) for r in conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() "
        "AND application_name LIKE 'pgsched%%'").fetchall()}


def wait_backends(conn: Conn, want: set[int]) -> None:
    deadline = time.monotonic() + 5
    while worker_backends(conn) != want and time.monotonic() < deadline:
        time.sleep(0.02)
    assert worker_backends(conn) == want


def test_a_worker_takes_back_the_parked_session_of_an_owner_it_ran_before(db: str, conn: Conn,
                                                                        owners: list[str]) -> None:
    a, b, _ = owners
    with started(db, sessions=3) as (w, ready):
        first = ready.backend_pid
        to_a, done = run_as(w, a, 1)
        assert to_a is not None and done.ok and to_a.role == a and to_a.parked == [[ready.role, None]]
        to_b, done = run_as(w, b, 2)
        assert to_b is not None and done.ok and to_b.parked == [[ready.role, None], [a, None]]
        again_a, done = run_as(w, a, 3)
        # The same backend as a's first run: the session was parked, not closed.
        assert again_a is not None and done.ok and again_a.backend_pid == to_a.backend_pid
        assert again_a.parked == [[ready.role, None], [b, None]]
        same_a, done = run_as(w, a, 4)
        assert same_a is None and done.ok
        back, done = run_as(w, str(ready.role), 5)
        assert back is not None and done.ok and back.backend_pid == first
        assert conn.execute("SELECT pid, role FROM ran ORDER BY pid, role").fetchall() == sorted([
            (to_a.backend_pid, a), (to_b.backend_pid, b), (to_a.backend_pid, a), (to_a.backend_pid, a),
            (first, ready.role)])
        # Three sessions open: the one it is in and two parked, as it said.
        wait_backends(conn, {first, to_a.backend_pid, to_b.backend_pid})


def test_the_least_recently_used_session_is_closed_beyond_the_limit_and_one_session_parks_none(
        db: str, conn: Conn, owners: list[str]) -> None:
    a, b, _ = owners
    with started(db, sessions=2) as (w, ready):
        to_a, _ = run_as(w, a, 1)
        to_b, _ = run_as(w, b, 2)
        assert to_a is not None and to_b is not None and to_b.parked == [[a, None]]
        # The scheduler's-role session, the least recently used, was closed.
        wait_backends(conn, {to_a.backend_pid, to_b.backend_pid})
    with started(db, sessions=1) as (w, ready):
        to_a, _ = run_as(w, a, 1)
        assert to_a is not None and to_a.parked == []
        wait_backends(conn, {to_a.backend_pid})
        back, _ = run_as(w, str(ready.role), 2)
        assert back is not None and back.backend_pid not in (ready.backend_pid, to_a.backend_pid)


# What a run may leave in its session (pgsched.oneround's reset for one statement, DISCARD ALL for several).
LEAVE = {
    "one statement": "SELECT set_config('myapp.left', 'yes', false), pg_advisory_lock(4242)",
    "several statements": "SELECT set_config('myapp.left', 'yes', false); CREATE TEMP TABLE left_tmp (x int); "
                          "SELECT pg_advisory_lock(4242); LISTEN left_channel; PREPARE left_stmt AS SELECT 1; "
                          "DECLARE left_cur CURSOR WITH HOLD FOR SELECT 1",
}


@pytest.mark.parametrize("left_by", sorted(LEAVE))
def test_nothing_a_run_leaves_reaches_the_next_run_on_a_session_that_was_parked_in_between(
        db: str, conn: Conn, owners: list[str], left_by: str) -> None:
    """A parked session was reset after its last run, like any idle one."""
    a, b, _ = owners
    with started(db, sessions=2) as (w, _):
        to_a, done = run_as(w, a, 1, LEAVE[left_by])
        assert to_a is not None and done.ok, done
        to_b, done = run_as(w, b, 2)
        assert to_b is not None and done.ok
        back, done = run_as(w, a, 3, PROBE)
        assert back is not None and back.backend_pid == to_a.backend_pid and done.ok, done
        assert conn.execute("SELECT * FROM seen").fetchall() == [(to_a.backend_pid, None, a, False, 0, 0, 0, 0)]


def test_a_parked_session_the_server_closed_is_replaced_and_the_run_does_not_crash(
        db: str, conn: Conn, owners: list[str]) -> None:
    """The worker sees the parked session's socket close while it waits, drops it, and opens a new one
    when the owner's run comes: no Lost, no crash."""
    a, b, _ = owners
    with started(db, sessions=3) as (w, _):
        to_a, _ = run_as(w, a, 1)
        run_as(w, b, 2)
        assert to_a is not None
        conn.execute("SELECT pg_terminate_backend(%s)", (to_a.backend_pid,))
        time.sleep(0.2)
        w.send({**insert_run(a), "run_id": 3, "command": RAN})
        seen = events(w, protocol.Done)
        assert not any(isinstance(e, protocol.Lost) for e in seen), seen
        [back] = [e for e in seen if isinstance(e, protocol.Backend)]
        [done] = [e for e in seen if isinstance(e, protocol.Done)]
        assert done.ok and not done.lost, done
        assert back.backend_pid != to_a.backend_pid and back.role == a
        assert w.proc.poll() is None


def _proxy_holding_the_end(db: str) -> str:
    """A DSN through a proxy that passes a session on both ways but, when the server closes it, keeps
    the client's side open: the server's last message arrives, the end of the stream never does."""
    held: list[socket.socket] = []

    def relay(client: socket.socket, server: socket.socket) -> None:
        held.append(client)  # never closed while the test runs

        def up() -> None:
            with contextlib.suppress(OSError):
                while data := client.recv(65536):
                    server.sendall(data)

        threading.Thread(target=up, daemon=True).start()
        with contextlib.suppress(OSError):
            while data := server.recv(65536):
                client.sendall(data)
        server.close()

    return proxy(db, relay)


def test_an_idle_session_whose_server_said_fatal_is_dead_before_its_end_arrives(db: str, conn: Conn) -> None:
    """A terminated backend's FATAL comes before the end of its stream (here, the end never comes): the
    session is over at the FATAL. Polling for the end took such a session for alive, and a worker
    took it back for a run."""
    idle = psycopg.connect(_proxy_holding_the_end(db), autocommit=True)
    try:
        pid = idle.info.backend_pid
        conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
        assert select.select([idle.fileno()], [], [], 5)[0], "the FATAL did not arrive"
        deadline = time.monotonic() + 5
        while conn.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone() != (0,):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert not worker._idle_session_alive(idle)
        assert idle.closed
    finally:
        idle.close()
    # A live idle session through the same kind of proxy stays alive, and usable.
    live = psycopg.connect(_proxy_holding_the_end(db), autocommit=True)
    try:
        assert worker._idle_session_alive(live) and worker._idle_session_alive(live)
        assert live.execute("SELECT 1").fetchone() == (1,)
    finally:
        live.close()


def test_a_parked_session_found_dead_when_taken_back_is_replaced(db: str, conn: Conn, owners: list[str]) -> None:
    """Session.become on its own (nobody watches the parked socket): the dead session is closed and a
    new one opened as the owner."""
    a, b, _ = owners
    session = worker.Session(db, keep=3)
    try:
        session.become(a)
        dead = session.backend_pid
        session.become(b)
        conn.execute("SELECT pg_terminate_backend(%s)", (dead,))
        deadline = time.monotonic() + 5
        while conn.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (dead,)).fetchone() != (0,):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        session.become(a)
        assert session.backend_pid != dead and session.role == a
        assert session.conn.execute("SELECT session_user::text, pg_backend_pid()").fetchone() == (
            a, session.backend_pid)
        assert [k for k, _ in session.parked_keys()] == [session.default_role, b]
    finally:
        session.close()


def test_parked_sessions_unused_for_a_while_are_closed(db: str, conn: Conn, owners: list[str]) -> None:
    """Session.expire with an explicit clock: each parked session closes PARKED_IDLE_S after it was parked."""
    a, b, _ = owners
    session = worker.Session(db, keep=3)
    try:
        first = session.backend_pid
        session.become(a)
        session.become(b)
        default_at, a_at = session.parked[(session.default_role, None)][1], session.parked[(a, None)][1]
        assert default_at < a_at
        left = session.expire(default_at + worker.PARKED_IDLE_S - 0.001)
        assert len(session.parked) == 2 and left == pytest.approx(0.001)
        left = session.expire(default_at + worker.PARKED_IDLE_S)
        assert list(session.parked) == [(a, None)] and left == pytest.approx(a_at - default_at)
        assert session.expire(a_at + worker.PARKED_IDLE_S) is None and not session.parked
        assert session.role == b and not session.conn.closed
        deadline = time.monotonic() + 5
        while conn.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (first,)).fetchone() != (0,):
            assert time.monotonic() < deadline, "the parked session's backend is still there"
            time.sleep(0.02)
    finally:
        session.close()


def test_with_the_servers_slots_full_parked_sessions_give_way_then_the_run_fails_without_disabling_its_job(
        db: str, conn: Conn, owners: list[str]) -> None:
    """A database's CONNECTION LIMIT (which binds the owners, not a superuser) stands in for a full server:
    the worker closes its parked sessions and opens the owner's; when even that is refused, the run
    fails (53300, taken from the refusal's text: libpq gives no SQLSTATE for a refused start-up) and is
    retried as any failure: the job is not disabled, and the worker goes on."""
    a, b, c = owners
    name = psycopg.conninfo.conninfo_to_dict(db)["dbname"]
    with started(db, sessions=3) as (w, _):
        run_as(w, a, 1)
        run_as(w, b, 2)  # parked: the scheduler's role's, a's
        in_db = int(conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                                 ).fetchone()[0])  # type: ignore[index]
        conn.execute(sql.SQL("ALTER DATABASE {} CONNECTION LIMIT {}").format(sql.Identifier(str(name)),
                                                                            sql.Literal(in_db)))
        try:
            to_c, done = run_as(w, c, 3)
            assert done.ok and to_c is not None and to_c.parked == [[b, None]], (to_c, done)
            # Now the only session to give way is b's, parked: the next new one finds no slot.
            conn.execute(sql.SQL("ALTER DATABASE {} CONNECTION LIMIT {}").format(sql.Identifier(str(name)),
                                                                                sql.Literal(in_db - 2)))
            _, done = run_as(w, a, 4)
            assert (done.ok, done.sqlstate, done.owner_unusable) == (False, "53300", False), done
            assert "too many connections" in str(done.message), done
            assert done.parked == [], done  # b's, given back: the scheduler is told
            again, done = run_as(w, c, 5)
            assert again is None and done.ok, done  # still in c's session
        finally:
            conn.execute(sql.SQL("ALTER DATABASE {} CONNECTION LIMIT -1").format(sql.Identifier(str(name))))


def test_the_scheduler_gives_runs_to_workers_that_keep_their_owners_sessions(db: str, conn: Conn,
                                                                             owners: list[str]) -> None:
    """Jobs of three owners, two workers of four sessions each, through the scheduler: a worker opens at
    most one session per owner (six in all; with one session a worker it opens many more), every run
    runs as its owner, and each run's row names the backend that ran it. (Which worker a run goes to
    is tests/unit/test_dispatch.py's.)"""
    conn.execute("CREATE TABLE ran_by (pid int, role text, run_id bigint)")
    for owner in owners:
        conn.execute(sql.SQL("GRANT INSERT ON ran_by TO {}").format(sql.Identifier(owner)))
    jobs = []
    for i in range(6):
        jobs.append(one(conn, "SELECT pgsched.schedule(%s, '1 second', %s)", f"ran_by_{i}",
                        "INSERT INTO ran_by VALUES (pg_backend_pid(), current_user, "
                        "current_setting('pgsched.run_id')::bigint)"))
        conn.execute("UPDATE pgsched.job SET owner = %s::regrole WHERE job_id = %s", (owners[i % 3], jobs[-1]))

    def enough() -> bool:
        return int(one(conn, "SELECT count(*) FROM ran_by")) >= 30

    serve(db, enough, timeout=30, max_workers=2, worker_sessions=4)
    ran = conn.execute("SELECT r.pid, r.role, j.owner::text, h.backend_pid, h.outcome FROM ran_by r "
                       "JOIN pgsched.job_run h ON h.run_id = r.run_id JOIN pgsched.job j ON j.job_id = h.job_id"
                       ).fetchall()
    assert len(ran) >= 30
    assert all(role == owner and pid == recorded and outcome == "success"
               for pid, role, owner, recorded, outcome in ran), ran
    assert len({pid for pid, *_ in ran}) <= 6, ran
