"""Helpers shared by the SQL API integration tests: queries, catalog snapshots, NOTIFY collection,
statements on threads of their own and waiting for their lock waits."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

Conn = psycopg.Connection[tuple[object, ...]]

# Job targets every test can use: functions and procedures of the right and wrong shapes,
# check_config functions, and a table the jobs write to so a test can see that they ran.
SETUP_SQL = """
CREATE TABLE public.ran (job_id integer, config jsonb, via text);
CREATE FUNCTION public.ok_fn(job_id integer, config jsonb) RETURNS void LANGUAGE sql
    AS $$ INSERT INTO public.ran VALUES (job_id, config, 'function') $$;
CREATE PROCEDURE public.ok_proc(job_id integer, config jsonb) LANGUAGE sql
    AS $$ INSERT INTO public.ran VALUES (job_id, config, 'procedure') $$;
CREATE FUNCTION public.bad_fn(job_id integer, config jsonb) RETURNS integer LANGUAGE plpgsql
    AS $$ BEGIN INSERT INTO public.ran VALUES (job_id, config, 'function'); RETURN 1 / 0; END $$;
CREATE PROCEDURE public.bad_proc(job_id integer, config jsonb) LANGUAGE plpgsql
    AS $$ BEGIN INSERT INTO public.ran VALUES (job_id, config, 'procedure');
               RAISE EXCEPTION USING ERRCODE = 'PS001', MESSAGE = 'procedure failed on purpose'; END $$;
CREATE FUNCTION public.wrong_sig(a integer) RETURNS void LANGUAGE sql AS 'SELECT';
CREATE FUNCTION public.wrong_types(job_id text, config json) RETURNS void LANGUAGE sql AS 'SELECT';
CREATE FUNCTION public.check_ok(config jsonb) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF config ? 'bad' THEN
        RAISE EXCEPTION USING ERRCODE = 'PC001', MESSAGE = 'config rejected by check_ok';
    END IF;
END $$;
CREATE PROCEDURE public.check_proc(config jsonb) LANGUAGE plpgsql AS $$
BEGIN
    IF config ? 'bad' THEN
        RAISE EXCEPTION USING ERRCODE = 'PC002', MESSAGE = 'config rejected by check_proc';
    END IF;
END $$;
CREATE FUNCTION public.check_wrong(a integer) RETURNS void LANGUAGE sql AS 'SELECT';
"""


def scalar(conn: Conn, query: str, params: tuple[Any, ...] | dict[str, Any] | None = None) -> Any:
    """The first column of the first row."""
    row = conn.execute(query, params).fetchone()
    assert row is not None, query
    return row[0]


def rows(conn: Conn, query: str, params: tuple[Any, ...] | dict[str, Any] | None = None) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query, params)
        return cur.fetchall()


def one(conn: Conn, query: str, params: tuple[Any, ...] | dict[str, Any] | None = None) -> dict[str, Any]:
    found = rows(conn, query, params)
    assert len(found) == 1, (query, found)
    return found[0]


def job(conn: Conn, job_id: int) -> dict[str, Any]:
    """The job's row in pgsched.jobs as JSON values (stable to compare), without updated_at."""
    value = scalar(conn, "SELECT to_jsonb(j) - 'updated_at' FROM pgsched.jobs j WHERE job_id = %s", (job_id,))
    assert isinstance(value, dict)
    return value


def stats(conn: Conn, job_id: int) -> dict[str, Any]:
    return one(conn, "SELECT * FROM pgsched.job_stats WHERE job_id = %s", (job_id,))


def history(conn: Conn, job_id: int) -> list[dict[str, Any]]:
    return rows(conn, "SELECT * FROM pgsched.job_history WHERE job_id = %s ORDER BY run_id", (job_id,))


Snapshot = tuple[list[Any], list[Any], list[Any]]


def snapshot(conn: Conn) -> Snapshot:
    """Every row of the three catalog tables, for "a rejected call writes nothing"."""
    def table(name: str, key: str) -> list[Any]:
        return [r[0] for r in conn.execute(f"SELECT to_jsonb(t) FROM pgsched.{name} t ORDER BY {key}")]
    return table("job", "job_id"), table("job_stat", "job_id"), table("job_run", "run_id")


def add_job(conn: Conn, args: str, params: tuple[Any, ...] | dict[str, Any] | None = None) -> int:
    """SELECT pgsched.add_job(<args>) and return the id."""
    job_id = scalar(conn, f"SELECT pgsched.add_job({args})", params)
    assert isinstance(job_id, int)
    return job_id


MARKER = "test-marker"


def collect_notifications(listener: Conn, sender: Conn, timeout: float = 5.0) -> list[str]:
    """Payloads on pgsched_catalog up to a marker that `sender` sends now.

    NOTIFYs from one session arrive in commit order, so everything the sender
    committed before the marker has arrived once the marker has: no sleeping.
    """
    sender.execute("SELECT pg_notify('pgsched_catalog', %s)", (MARKER,))
    payloads: list[str] = []
    for n in listener.notifies(timeout=timeout):
        if n.payload == MARKER:
            return payloads
        payloads.append(n.payload)
    raise AssertionError(f"marker not received within {timeout}s; got {payloads}")


@contextmanager
def notices(conn: Conn) -> Iterator[list[str]]:
    """Collect the server notices (RAISE NOTICE) sent to `conn` inside the block."""
    seen: list[str] = []

    def handler(d: psycopg.errors.Diagnostic) -> None:
        seen.append(d.message_primary or "")

    conn.add_notice_handler(handler)
    try:
        yield seen
    finally:
        conn.remove_notice_handler(handler)


@contextmanager
def as_new_role(api: Conn, db: str, prefix: str) -> Iterator[str]:
    """`api` as a new login role that may run ok_fn and owns nothing else; dropped afterwards."""
    role = f"{prefix}_{abs(hash(db)) % 100000}"
    api.execute(f"DROP ROLE IF EXISTS {role}")
    api.execute(f"CREATE ROLE {role} LOGIN")
    try:
        api.execute(f"GRANT EXECUTE ON FUNCTION public.ok_fn(integer, jsonb) TO {role}")
        api.execute(f"SET ROLE {role}")
        try:
            yield role
        finally:
            api.execute("RESET ROLE")
    finally:
        api.execute("DELETE FROM pgsched.job")
        api.execute(f"DROP OWNED BY {role}")
        api.execute(f"DROP ROLE {role}")


def mark_changed(conn: Conn, target: str) -> None:
    """Make a pgsched view or trigger (`target`: 'VIEW pgsched.jobs', 'TRIGGER job_touch ON
    pgsched.job') look like an earlier release's text, so that init's next reapply replaces it
    (pgsched._replace_if_changed keeps the text's digest in the comment)."""
    conn.execute(sql.SQL("COMMENT ON {} IS 'an earlier release''s text'").format(sql.SQL(target)))


def in_thread(db: str, sql_text: str, params: tuple[Any, ...]) -> tuple[threading.Thread, list[BaseException]]:
    """`sql_text` run in a session of its own on a thread, started; the errors it raised."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            with psycopg.connect(db, autocommit=True) as c:
                c.execute(sql_text, params)
        except BaseException as e:  # the caller asserts on them
            errors.append(e)

    t = threading.Thread(target=run)
    t.start()
    return t, errors


def wait_for_a_lock_wait(api: Conn, marker: str) -> None:
    """Until a session of this database whose statement holds `marker` waits for a lock."""
    deadline = datetime.now() + timedelta(seconds=10)
    while not scalar(api, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                          "AND datname = current_database() AND pid <> pg_backend_pid() AND query LIKE %s",
                     (f"%{marker}%",)):
        assert datetime.now() < deadline, f"no session running {marker!r} waited for a lock"
        threading.Event().wait(0.02)
