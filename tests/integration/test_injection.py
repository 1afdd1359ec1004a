"""Injection table (issue 5): names, commands, configs, time zones and schedules full of
quotes, semicolons, dollar quotes, comments, control characters and 100,000-character
strings never execute anything, and are stored and shown verbatim or rejected with a
clean error.

Run as a superuser, so that an injected statement would have every right to succeed:
a canary table must survive and no object may appear. A command job's text is SQL by
design: storing it runs nothing, and run_job runs exactly that text, as its owner.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.integration.helpers import Conn, one, rows, scalar, snapshot

PAYLOADS = {
    "quote": "'",
    "quotes": "it''s 'quoted' \"twice\"",
    "semicolon": ";",
    "drop": "x'; DROP TABLE public.canary; --",
    "close paren drop": "'); DROP TABLE public.canary; --",
    "identifier drop": "\"; DROP TABLE public.canary; --",
    "dollar": "$$",
    "dollar drop": "$$; DROP TABLE public.canary; $$",
    "tagged dollar": "$x$; CREATE TABLE public.injected (x int); $x$",
    "comment": "-- a comment",
    "block comment": "/* open",
    "backslash": "\\'; CREATE TABLE public.injected (x int); --",
    "format codes": "%s %I %L %%",
    "concat": "'||(SELECT 1)||'",
    "control": "\t\n\r\x01\x07\x1b[31m\x1f\x7f",
    "unicode": "\u202e\u200b\ufeff é 日本 🙂",
    "long": "'; DROP TABLE public.canary; --" * 3334,  # 100,020 characters
}
ERROR_OK = {"22023", "22004"}


@pytest.fixture(scope="module")
def inj(module_api: Conn) -> Iterator[Conn]:
    module_api.execute("""
        CREATE TABLE public.canary (x int);
        INSERT INTO public.canary VALUES (1);
        CREATE FUNCTION public.raise_msg(job_id integer, config jsonb) RETURNS void LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION USING ERRCODE = 'PI001', MESSAGE = config->>'msg'; END $$;
    """)
    yield module_api


@pytest.fixture
def c(inj: Conn) -> Iterator[Conn]:
    objects = inventory(inj)
    yield inj
    inj.execute("DELETE FROM pgsched.job; DELETE FROM public.ran")
    assert scalar(inj, "SELECT x FROM public.canary") == 1
    assert inventory(inj) == objects, "an object appeared or disappeared"


def inventory(conn: Conn) -> tuple[Any, ...]:
    """Every relation, function and role there is (temporary ones aside)."""
    return tuple(conn.execute(q).fetchall() for q in (
        "SELECT relnamespace::regnamespace::text, relname FROM pg_class "
        "WHERE relpersistence <> 't' AND relnamespace <> 'pg_toast'::regnamespace ORDER BY 1, 2",
        "SELECT oid::regprocedure::text FROM pg_proc ORDER BY 1",
        "SELECT rolname FROM pg_roles ORDER BY 1"))


def job_row(conn: Conn, job_id: int) -> dict[str, Any]:
    return one(conn, "SELECT j.*, s.job_name AS stats_job_name FROM pgsched.jobs j "
                     "JOIN pgsched.job_stats s USING (job_id) WHERE job_id = %s", (job_id,))


def attempt(conn: Conn, query: str, params: tuple[Any, ...]) -> tuple[str | None, Any]:
    """(SQLSTATE or None, first column of the result)."""
    before = snapshot(conn)
    try:
        row = conn.execute(query, params).fetchone()
    except psycopg.Error as e:
        assert e.sqlstate in ERROR_OK, (e.sqlstate, e.diag.message_primary, query)
        assert snapshot(conn) == before
        return e.sqlstate, None
    return None, row[0] if row else None


@dataclass(frozen=True)
class Field:
    """How to put a payload into one place, and where it must come back verbatim."""

    check: Callable[[Conn, str], None]


def via_add_job_name(conn: Conn, p: str) -> None:
    state, job_id = attempt(conn, "SELECT pgsched.add_job('ok_fn', '1 hour', job_name => %s)", (p,))
    if state is None:
        r = job_row(conn, job_id)
        assert (r["job_name"], r["stats_job_name"]) == (p, p)
        assert scalar(conn, "SELECT pgsched.add_job('ok_fn', '1 hour', job_name => %s, if_not_exists => true)",
                      (p,)) == job_id
    else:  # only the empty-ish and the too long are refused
        assert p.strip() == "" or len(p) > 500


def via_schedule_name(conn: Conn, p: str) -> None:
    state, job_id = attempt(conn, "SELECT pgsched.schedule(%s, '1 hour', 'SELECT 1')", (p,))
    if state is None:
        assert job_row(conn, job_id)["job_name"] == p
        assert scalar(conn, "SELECT pgsched.schedule(%s, '2 hours', 'SELECT 2')", (p,)) == job_id
        assert scalar(conn, "SELECT pgsched.unschedule(%s)", (p,)) is True
        assert scalar(conn, "SELECT count(*) FROM pgsched.jobs") == 0
    else:
        assert p.strip() == "" or len(p) > 500


def via_alter_job_name(conn: Conn, p: str) -> None:
    job_id = scalar(conn, "SELECT pgsched.add_job('ok_fn', '1 hour')")
    state, _ = attempt(conn, "SELECT job_id FROM pgsched.alter_job(%s, job_name => %s)", (job_id, p))
    if state is None:
        assert job_row(conn, job_id)["job_name"] == p


def via_command(conn: Conn, p: str) -> None:
    state, job_id = attempt(conn, "SELECT pgsched.schedule('cmd', '1 hour', %s)", (p,))
    if state is None:  # stored, not run
        assert job_row(conn, job_id)["command"] == p
        assert scalar(conn, "SELECT pgsched.schedule(%s, %s)", ("1 hour", p)) > job_id
    else:
        assert p.strip() == ""


def via_config(conn: Conn, p: str) -> None:
    config = {p: p, "msg": p, "nested": [p, {p: None}]}
    job_id = scalar(conn, "SELECT pgsched.add_job('ok_fn', '1 hour', config => %s)", (Jsonb(config),))
    assert job_row(conn, job_id)["config"] == config
    conn.execute("CALL pgsched.run_job(%s)", (job_id,))
    assert rows(conn, "SELECT config FROM public.ran") == [{"config": config}]
    conn.execute("SELECT * FROM pgsched.alter_job(%s, config_merge => %s)", (job_id, Jsonb({"m": p})))
    assert job_row(conn, job_id)["config"] == {**config, "m": p}


def via_error_message(conn: Conn, p: str) -> None:
    """A job's error message is shown verbatim in job_history."""
    job_id = scalar(conn, "SELECT pgsched.add_job('raise_msg', '1 hour', config => %s)", (Jsonb({"msg": p}),))
    with pytest.raises(psycopg.Error) as e:
        conn.execute("CALL pgsched.run_job(%s)", (job_id,))
    assert e.value.sqlstate == "PI001"
    assert rows(conn, "SELECT outcome, sqlstate, message FROM pgsched.job_history WHERE job_id = %s", (job_id,)) \
        == [{"outcome": "failure", "sqlstate": "PI001", "message": p}]


def via_timezone(conn: Conn, p: str) -> None:
    state, _ = attempt(conn, "SELECT pgsched.add_job('ok_fn', '1 hour', timezone => %s)", (p,))
    assert state == "22023"
    job_id = scalar(conn, "SELECT pgsched.add_job('ok_fn', '1 hour')")
    state, _ = attempt(conn, "SELECT job_id FROM pgsched.alter_job(%s, timezone => %s)", (job_id, p))
    assert state == "22023"


def via_schedule_text(conn: Conn, p: str) -> None:
    for query, params in (("SELECT pgsched.add_job('ok_fn', %s)", (p,)),
                          ("SELECT pgsched.add_job('ok_fn', %s || ' 1 hour')", (p,)),
                          ("SELECT pgsched.add_job('ok_fn', '1 hour ' || %s)", (p,)),
                          ("SELECT pgsched.schedule('s', %s, 'SELECT 1')", (p,)),
                          ("SELECT pgsched.add_job('ok_fn', '*/5 * * * * ' || %s)", (p,))):
        state, _ = attempt(conn, query, params)
        assert state == "22023", (query, p[:50])


def via_catch_up(conn: Conn, p: str) -> None:
    state, _ = attempt(conn, "SELECT pgsched.add_job('ok_fn', '1 hour', catch_up => %s)", (p,))
    assert state == "22023"


FIELDS = {
    "add_job job_name": via_add_job_name,
    "schedule job_name": via_schedule_name,
    "alter_job job_name": via_alter_job_name,
    "command": via_command,
    "config": via_config,
    "error message": via_error_message,
    "timezone": via_timezone,
    "schedule": via_schedule_text,
    "catch_up": via_catch_up,
}


@pytest.mark.parametrize("payload", list(PAYLOADS.values()), ids=list(PAYLOADS))
@pytest.mark.parametrize("field", list(FIELDS.values()), ids=list(FIELDS))
def test_payload_is_stored_verbatim_or_rejected_and_runs_nothing(
        c: Conn, field: Callable[[Conn, str], None], payload: str) -> None:
    field(c, payload)


def test_a_command_runs_exactly_its_text(c: Conn) -> None:
    """The command is the owner's SQL, run as written: quotes and dollar quotes inside it are data."""
    text = "INSERT INTO public.ran (via) VALUES ($$x'; DROP TABLE public.canary; --$$), ('$$'), (E'\\\\'';')"
    job_id = scalar(c, "SELECT pgsched.schedule('cmd', '1 hour', %s)", (text,))
    c.execute("CALL pgsched.run_job(%s)", (job_id,))
    assert [r["via"] for r in rows(c, "SELECT via FROM public.ran ORDER BY via")] == \
        sorted(["x'; DROP TABLE public.canary; --", "$$", "\\';"])
