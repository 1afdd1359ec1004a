"""Test harness: one throwaway PostgreSQL cluster per test session, a fresh database per test.

The cluster is made by pgsched.embedded (initdb in a temp dir, a free port) unless
PGSCHED_TEST_DSN names an existing cluster (a superuser DSN); either way the
suite only creates and drops databases whose names start with `pgsched_test_`,
so it never touches anything it did not create. Each test's database is cloned
from a template that already has the schema, which is much faster than running
the migrations per test.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from pgsched import migrate
from pgsched.embedded import Cluster

TEMPLATE = "pgsched_test_template"


@dataclass
class PgServer:
    """Where the tests' databases live. `cluster` is None for an external PGSCHED_TEST_DSN."""

    admin_dsn: str
    cluster: Cluster | None
    plpython: bool

    def dsn(self, dbname: str) -> str:
        params = psycopg.conninfo.conninfo_to_dict(self.admin_dsn)
        params["dbname"] = dbname
        return psycopg.conninfo.make_conninfo(**{k: str(v) for k, v in params.items() if v is not None})

    def create_db(self, template: str | None = TEMPLATE) -> str:
        name = f"pgsched_test_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            if template:
                conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                    sql.Identifier(name), sql.Identifier(template)))
            else:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return name

    def drop_db(self, name: str) -> None:
        assert name.startswith("pgsched_test_")
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def _fast_settings() -> dict[str, str]:
    # Durability is irrelevant for a throwaway cluster; speed is not.
    return {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off",
            "max_connections": "200", "shared_buffers": "128MB"}


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    external = os.environ.get("PGSCHED_TEST_DSN")
    tmp: str | None = None
    cluster: Cluster | None = None
    if external:
        admin = external
    else:
        tmp = tempfile.mkdtemp(prefix="pgsched-test-")
        os.chmod(tmp, 0o755)
        cluster = Cluster(datadir=Path(tmp) / "data", settings=_fast_settings())
        cluster.initdb()
        cluster.start()
        admin = cluster.dsn()
    server = PgServer(admin_dsn=admin, cluster=cluster, plpython=False)
    try:
        server.drop_db(TEMPLATE)
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(TEMPLATE)))
        with psycopg.connect(server.dsn(TEMPLATE), autocommit=True) as conn:
            server.plpython = migrate.init(conn).plpython
        yield server
    finally:
        if cluster is not None:
            cluster.stop("immediate")
        else:
            with psycopg.connect(admin, autocommit=True) as conn:
                rows = conn.execute(
                    "SELECT datname FROM pg_database WHERE datname LIKE 'pgsched\\_test\\_%'").fetchall()
            for (name,) in rows:
                server.drop_db(name)
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture
def db(pg_server: PgServer) -> Iterator[str]:
    """DSN of a fresh database with the pgsched schema installed."""
    name = pg_server.create_db()
    try:
        yield pg_server.dsn(name)
    finally:
        pg_server.drop_db(name)


@pytest.fixture
def empty_db(pg_server: PgServer) -> Iterator[str]:
    """DSN of a fresh database without pgsched."""
    name = pg_server.create_db(template=None)
    try:
        yield pg_server.dsn(name)
    finally:
        pg_server.drop_db(name)


@pytest.fixture
def conn(db: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    with psycopg.connect(db, autocommit=True) as c:
        yield c
