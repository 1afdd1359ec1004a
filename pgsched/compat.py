"""The pg_cron compatibility schema: whether `pgsched init` installs it, and installing it.

Owns the rule of when the schema `cron` (sql/compat/pg_cron.sql) may exist: only on request
(`pgsched init --pg-cron-compat`), never beside the pg_cron extension (both would own
`cron.schedule`), never over a schema `cron` that pgsched did not create. Once installed it is
re-applied by every later init, like the API files, so it follows pgsched's catalog.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from pgsched.errors import PgCronConflict

MARKER = "pgsched pg_cron compatibility"


def installed(cur: psycopg.Cursor[Any]) -> bool:
    """Whether the database has pgsched's `cron` schema."""
    cur.execute("SELECT obj_description(n.oid, 'pg_namespace') FROM pg_namespace n WHERE n.nspname = 'cron'")
    row = cur.fetchone()
    return row is not None and row[0] == MARKER


def check_can_install(cur: psycopg.Cursor[Any]) -> None:
    """Raise PgCronConflict if the schema `cron` is (or would be) someone else's."""
    cur.execute("SELECT extversion FROM pg_extension WHERE extname = 'pg_cron'")
    row = cur.fetchone()
    if row is not None:
        raise PgCronConflict(
            f"the pg_cron extension (version {row[0]}) is installed in this database and owns the schema cron: "
            "move its jobs with `pgsched import pg-cron --dsn ... --disable-source`, DROP EXTENSION pg_cron, "
            "then run `pgsched init --pg-cron-compat` again")
    cur.execute("SELECT obj_description(n.oid, 'pg_namespace') FROM pg_namespace n WHERE n.nspname = 'cron'")
    row = cur.fetchone()
    if row is not None and row[0] != MARKER:
        raise PgCronConflict(
            "a schema named cron exists and pgsched did not create it: rename or drop it to install "
            "the pg_cron compatibility schema")


def install(cur: psycopg.Cursor[Any], text: str) -> None:
    """Create or replace the `cron` schema's objects (the caller has checked check_can_install)."""
    check_can_install(cur)
    cur.execute(sql.SQL(text))  # a file of ours, not user input
