"""Fixtures for the SQL API tests: a database with the schema and a set of job targets."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from tests.conftest import PgServer
from tests.integration.helpers import SETUP_SQL, Conn


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
