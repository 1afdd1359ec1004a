"""Fixtures for the SQL API tests: a database with the schema and a set of job targets."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from tests.conftest import PgServer
from tests.integration.helpers import SETUP_SQL, Conn, snapshot


@pytest.fixture
def api(conn: Conn) -> Conn:
    """`conn` (autocommit) in a database that also has the job targets of SETUP_SQL."""
    conn.execute(SETUP_SQL)
    return conn


@pytest.fixture(scope="module")
def module_api(pg_server: PgServer) -> Iterator[Conn]:
    """Like `api`, but one database for a whole module: only for tests that write nothing
    (and check that they did not), where a fresh database per test would only cost time."""
    name = pg_server.create_db()
    try:
        with psycopg.connect(pg_server.dsn(name), autocommit=True) as c:
            c.execute(SETUP_SQL)
            yield c
    finally:
        pg_server.drop_db(name)


@pytest.fixture
def api_tx(module_api: Conn) -> Iterator[Conn]:
    """The module's database, with everything a test writes rolled back."""
    before = snapshot(module_api)
    with module_api.transaction(force_rollback=True):
        yield module_api
    assert snapshot(module_api) == before


@pytest.fixture
def jobs(conn: Conn) -> Conn:
    """`conn` with a table `hits` and job targets: hit (inserts a row), fail (22012), nap (sleeps config.s)."""
    conn.execute("CREATE TABLE hits (job_id int, at timestamptz DEFAULT clock_timestamp())")
    conn.execute("""CREATE PROCEDURE public.hit(job_id int, config jsonb) LANGUAGE sql
                    AS $$ INSERT INTO hits (job_id) VALUES (job_id) $$""")
    conn.execute("""CREATE FUNCTION public.fail(job_id int, config jsonb) RETURNS void LANGUAGE plpgsql
                    AS $$ BEGIN RAISE EXCEPTION 'fail %', job_id USING ERRCODE = '22012'; END $$""")
    conn.execute("""CREATE PROCEDURE public.nap(job_id int, config jsonb) LANGUAGE plpgsql
                    AS $$ BEGIN PERFORM pg_sleep((config->>'s')::float8);
                          INSERT INTO hits (job_id) VALUES (job_id); END $$""")
    return conn
