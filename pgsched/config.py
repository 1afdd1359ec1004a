"""Where the connection string comes from.

Order: an explicit --dsn, else PGSCHED_DSN, else the usual libpq environment
(PGHOST, PGDATABASE, PGSERVICE, ... and service files), which an empty
conninfo string hands to libpq unchanged.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import psycopg.conninfo

# Any of these means the user pointed libpq somewhere; without them, `serve` may
# start its embedded cluster instead of guessing at a local socket.
LIBPQ_TARGET_VARS = ("PGHOST", "PGHOSTADDR", "PGPORT", "PGDATABASE", "PGSERVICE", "PGSERVICEFILE")


def resolve_dsn(explicit: str | None, environ: Mapping[str, str] | None = None) -> str | None:
    """The DSN to use, or None when nothing at all is configured."""
    env = os.environ if environ is None else environ
    if explicit:
        return explicit
    if env.get("PGSCHED_DSN"):
        return env["PGSCHED_DSN"]
    if any(env.get(name) for name in LIBPQ_TARGET_VARS):
        return ""
    return None


def redact(dsn: str) -> str:
    """The DSN with any password removed, for logs and error messages."""
    try:
        params = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "<unparsable DSN>"
    if "password" in params:
        params["password"] = "***"
    return psycopg.conninfo.make_conninfo(**{k: str(v) for k, v in params.items() if v is not None})
