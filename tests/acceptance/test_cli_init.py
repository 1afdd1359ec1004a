"""`pgsched init` as a user runs it: a subprocess, its exit code and output, its DSN resolution."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from pgsched import migrate
from tests.conftest import PgServer


@dataclass(frozen=True)
class Result:
    code: int
    out: str
    err: str

    @property
    def both(self) -> str:
        return self.out + self.err


def pgsched_bin() -> str:
    beside = Path(sys.executable).parent / "pgsched"
    found = str(beside) if beside.exists() else shutil.which("pgsched")
    assert found, "the pgsched console script is not installed"
    return found


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without any PG* or PGSCHED_* variable, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "PGSCHED_"))}
    env.update(extra)
    return env


def pgsched(*args: str, env: dict[str, str] | None = None) -> Result:
    p = subprocess.run([pgsched_bin(), *args], env=clean_env() if env is None else env,
                       capture_output=True, text=True, timeout=60, check=False)
    return Result(p.returncode, p.stdout, p.stderr)


def installed(dsn: str) -> bool:
    with psycopg.connect(dsn, autocommit=True) as c:
        row = c.execute("SELECT to_regclass('pgsched.migration') IS NOT NULL").fetchone()
    return bool(row and row[0])


def libpq_env(dsn: str) -> dict[str, str]:
    names = {"host": "PGHOST", "port": "PGPORT", "user": "PGUSER", "dbname": "PGDATABASE",
             "password": "PGPASSWORD"}
    params = psycopg.conninfo.conninfo_to_dict(dsn)
    return {names[k]: str(v) for k, v in params.items() if k in names and v is not None}


@pytest.fixture
def other_db(pg_server: PgServer) -> Iterator[str]:
    """A second empty database, to tell which DSN a command used."""
    name = pg_server.create_db(template=None)
    try:
        yield pg_server.dsn(name)
    finally:
        pg_server.drop_db(name)


REFUSED = "host=127.0.0.1 port=1 dbname=nowhere user=nobody connect_timeout=5"


def test_init_then_up_to_date(empty_db: str) -> None:
    n = migrate.code_version()
    first = pgsched("init", "--dsn", empty_db)
    assert first.code == 0, first.both
    assert f"applied migrations {', '.join(str(i) for i in range(1, n + 1))}; schema version {n}" in first.out
    assert "PL/Python schedule functions:" in first.out
    second = pgsched("init", "--dsn", empty_db)
    assert second.code == 0, second.both
    assert f"schema version {n} is up to date" in second.out
    assert "applied" not in second.out
    assert installed(empty_db)


def test_init_no_plpython(empty_db: str) -> None:
    r = pgsched("init", "--dsn", empty_db, "--no-plpython")
    assert r.code == 0, r.both
    assert "PL/Python schedule functions: not available" in r.out


def test_dsn_option_beats_pgsched_dsn(empty_db: str, other_db: str) -> None:
    r = pgsched("init", "--dsn", empty_db, env=clean_env(PGSCHED_DSN=other_db))
    assert r.code == 0, r.both
    assert (installed(empty_db), installed(other_db)) == (True, False)


def test_pgsched_dsn_beats_libpq_env(empty_db: str, other_db: str) -> None:
    r = pgsched("init", env=clean_env(PGSCHED_DSN=empty_db, **libpq_env(other_db)))
    assert r.code == 0, r.both
    assert (installed(empty_db), installed(other_db)) == (True, False)


def test_libpq_env_is_used_last(empty_db: str, other_db: str) -> None:
    r = pgsched("init", env=clean_env(**libpq_env(other_db)))
    assert r.code == 0, r.both
    assert (installed(empty_db), installed(other_db)) == (False, True)


def test_pgsched_dsn_alone(empty_db: str) -> None:
    r = pgsched("init", env=clean_env(PGSCHED_DSN=empty_db))
    assert r.code == 0, r.both
    assert installed(empty_db)


@pytest.mark.parametrize(
    ("dsn", "code"),
    [
        (f"{REFUSED} password=secret", 1),
        ("postgresql://nobody:secret@127.0.0.1:1/nowhere?connect_timeout=5", 1),
        # libpq cannot parse these: a bad --dsn, refused before any connection (click's usage error)
        ("host=127.0.0.1 port=1 password=secret this-is-not-a-dsn", 2),
        ("password='secret", 2),
    ],
    ids=["refused", "url", "junk", "unterminated"],
)
def test_bad_dsn_is_a_clean_error(dsn: str, code: int) -> None:
    r = pgsched("init", "--dsn", dsn)
    assert r.code == code, r.both
    assert r.err.startswith("Error: ") if code == 1 else "Error: Invalid value for --dsn" in r.err, r.both
    assert "Traceback" not in r.both
    assert "secret" not in r.both


def test_bad_pgsched_dsn_is_a_clean_error() -> None:
    r = pgsched("init", env=clean_env(PGSCHED_DSN=f"{REFUSED} password=secret"))
    assert (r.code, "Traceback" in r.both, "secret" in r.both) == (1, False, False), r.both
    assert "127.0.0.1" in r.err


def test_newer_schema_is_a_clean_error(empty_db: str) -> None:
    assert pgsched("init", "--dsn", empty_db).code == 0
    with psycopg.connect(empty_db, autocommit=True) as c:
        c.execute("INSERT INTO pgsched.migration (version, name, checksum) VALUES (999, 'future', 'x')")
    r = pgsched("init", "--dsn", empty_db)
    assert r.code == 1, r.both
    assert "newer than this pgsched" in r.err and "999" in r.err
    assert "Traceback" not in r.both


def test_init_with_the_pg_cron_compatibility_schema(empty_db: str) -> None:
    r = pgsched("init", "--dsn", empty_db, "--pg-cron-compat")
    assert r.code == 0, r.both
    assert "pg_cron compatibility schema cron: installed" in r.out
    with psycopg.connect(empty_db, autocommit=True) as c:
        row = c.execute("SELECT cron.schedule('nightly', '0 3 * * *', 'SELECT 1')").fetchone()
        assert row is not None
        assert c.execute("SELECT jobname FROM cron.job").fetchall() == [("nightly",)]
    again = pgsched("init", "--dsn", empty_db)  # kept without the flag
    assert again.code == 0 and "pg_cron compatibility schema cron: installed" in again.out, again.both


def test_init_refuses_the_compatibility_schema_over_a_foreign_cron_schema(empty_db: str) -> None:
    with psycopg.connect(empty_db, autocommit=True) as c:
        c.execute("CREATE SCHEMA cron")
    r = pgsched("init", "--dsn", empty_db, "--pg-cron-compat")
    assert r.code == 1 and "a schema named cron exists and pgsched did not create it" in r.err, r.both
    with psycopg.connect(empty_db, autocommit=True) as c:  # nothing was written
        assert c.execute("SELECT to_regnamespace('pgsched')").fetchone() == (None,)
