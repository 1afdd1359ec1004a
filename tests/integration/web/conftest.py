"""Fixtures for the dashboard's tests (HTTP and browser): a database installed by a
non-superuser scheduler role, roles alice and bob that must give their password (the test
cluster trusts local connections, so their lines are put first in pg_hba.conf), and jobs."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta

import psycopg
import pytest

from tests.conftest import PgServer
from tests.integration.helpers import Conn, scalar
from tests.integration.test_security import PASSWORD, OwnerDb, owner_database


@dataclass
class WebDb:
    odb: OwnerDb
    passwords_checked: bool

    @property
    def dsn(self) -> str:
        """What `pgsched web --dsn` gets: the database, as the superuser (no password in it)."""
        return self.odb.dsn()


@pytest.fixture(scope="module")
def webdb(pg_server: PgServer) -> Iterator[WebDb]:
    with owner_database(pg_server) as odb:
        hba = None if pg_server.cluster is None else pg_server.cluster.datadir / "pg_hba.conf"
        original = hba.read_text() if hba else None
        if hba is not None and original is not None:
            roles = f"{odb.alice},{odb.bob}"
            hba.write_text(f"local all {roles} scram-sha-256\nhost all {roles} all scram-sha-256\n" + original)
            with psycopg.connect(pg_server.admin_dsn, autocommit=True) as admin:
                admin.execute("SELECT pg_reload_conf()")
        try:
            yield WebDb(odb, hba is not None)
        finally:
            if hba is not None and original is not None:
                hba.write_text(original)
                with psycopg.connect(pg_server.admin_dsn, autocommit=True) as admin:
                    admin.execute("SELECT pg_reload_conf()")


@pytest.fixture
def wadmin(webdb: WebDb) -> Iterator[Conn]:
    """The superuser on the web database; every job is deleted after the test."""
    with webdb.odb.connect() as conn:
        yield conn
        conn.execute("DELETE FROM pgsched.job")


def schedule_as(webdb: WebDb, role: str, name: str, command: str = "SELECT public.job_ok(0, NULL)",
                every: str = "1 hour") -> int:
    with webdb.odb.connect(role) as c:
        return int(str(scalar(c, "SELECT pgsched.schedule(%s, %s, %s)", (name, every, command))))


def fail_once(webdb: WebDb, role: str, job_id: int) -> None:
    """Run the job in `role`'s session (run_job): it fails, and its history says why."""
    with webdb.odb.connect(role) as c, contextlib.suppress(psycopg.Error):
        c.execute("CALL pgsched.run_job(%s)", (job_id,))


def add_runs(admin: Conn, job_id: int, start: datetime, n: int, step: timedelta,
             outcomes: tuple[str, ...] = ("success", "failure", "success", "skipped")) -> None:
    """`n` finished runs of a job from `start`, one per `step`, each lasting a third of a step."""
    admin.execute(
        "INSERT INTO pgsched.job_run (job_id, plan_time, started_at, finished_at, outcome, sqlstate, message) "
        "SELECT %(job)s, t, CASE WHEN o = 'skipped' THEN NULL ELSE t END, t + %(step)s / 3, o, "
        "       CASE WHEN o = 'failure' THEN 'P0001' END, CASE WHEN o = 'failure' THEN 'boom ' || i END "
        "  FROM generate_series(0, %(n)s - 1) i, "
        "       LATERAL (SELECT %(start)s::timestamptz + i * %(step)s AS t, "
        "                       (%(outcomes)s::text[])[1 + i %% cardinality(%(outcomes)s::text[])] AS o) x",
        {"job": job_id, "start": start, "n": n, "step": step, "outcomes": list(outcomes)})


__all__ = ["PASSWORD", "WebDb", "add_runs", "fail_once", "schedule_as"]
