"""Where the connection string comes from, and the search path of pgsched's own sessions.

Order: an explicit --dsn, else PGSCHED_DSN, else the usual libpq environment
(PGHOST, PGDATABASE, PGSERVICE, ... and service files), which an empty
conninfo string hands to libpq unchanged.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

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


def pin_search_path(conn: psycopg.Connection[Any]) -> None:
    """Make `conn`, a session of pgsched's own (the scheduler's, the purge's, the metrics', init's),
    resolve unqualified names in pg_catalog only. With the database's default path, a role that
    may create in `public` could define, say, public.pg_cancel_backend(smallint): a better match
    for a parameter psycopg sends as smallint than pg_catalog's (integer), so the scheduler would
    run that role's function with its own rights. Not for the sessions a job runs in: its SQL
    resolves names as its owner's sessions do."""
    conn.execute("SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', false)")


def dsn_problem(dsn: str) -> str | None:
    """Why libpq cannot parse `dsn` (None: it can), in words that quote nothing of it: libpq's own
    message echoes the offending token, which may be the password."""
    try:
        psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return ("not a valid connection string: give key=value pairs (host=db dbname=app user=pgsched; "
                "a value with spaces in single quotes) or a URI (postgresql://user@host/dbname, with "
                "special characters percent-encoded)")
    return None


def scrub(text: str, dsn: str) -> str:
    """`text` with the DSN's password replaced, wherever a driver message may have echoed it."""
    try:
        password = psycopg.conninfo.conninfo_to_dict(dsn).get("password")
    except psycopg.ProgrammingError:
        return text
    return text.replace(str(password), "***") if password else text


def redact(dsn: str) -> str:
    """The DSN with any password removed, for logs and error messages."""
    try:
        params = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "<unparsable DSN>"
    if "password" in params:
        params["password"] = "***"
    return psycopg.conninfo.make_conninfo(**{k: str(v) for k, v in params.items() if v is not None})


# Settings a --config file may hold (TOML, top-level keys); command-line options win.
FILE_SETTINGS: dict[str, type] = {
    "max_workers": int,
    "shutdown_timeout": float,
    "crash_wait": float,
    "safety_interval": float,
    "heartbeat_interval": float,
    "dead_after": float,
    "terminate_grace": float,
    "metrics_max_jobs": int,
    "purge_interval": float,
    "worker_sessions": int,
}
# Of those, the ones where 0 means "off" (the others must be positive).
ZERO_MEANS_OFF = frozenset({"purge_interval"})


# `serve` options a --config file may hold besides the settings (read once, at start: a
# SIGHUP re-reads only FILE_SETTINGS). The DSNs only without a password: a settings file is
# rarely guarded like a secret; the password goes in PGPASSWORD, ~/.pgpass or a service file.
SERVE_OPTIONS: dict[str, type] = {"dsn": str, "log_format": str, "log_level": str, "app": list, "http": str,
                                  "metrics_dsn": str}
FILE_DSNS = frozenset({"dsn", "metrics_dsn"})


def _load_toml(path: str) -> dict[str, object]:
    import tomllib

    from pgsched.errors import ConfigError

    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"cannot read settings file {path}: {e}") from None
    return data


def read_settings_file(path: str) -> dict[str, object]:
    """The scheduler settings in a TOML file, checked by name and type."""
    from pgsched.errors import ConfigError

    out: dict[str, object] = {}
    for key, value in _load_toml(path).items():
        if key in SERVE_OPTIONS:
            continue
        kind = FILE_SETTINGS.get(key)
        if kind is None:
            raise ConfigError(f"{path}: unknown setting {key!r}; known: "
                              f"{', '.join(sorted([*FILE_SETTINGS, *SERVE_OPTIONS]))}")
        zero_ok = key in ZERO_MEANS_OFF
        if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value) or value < 0 \
                or (value == 0 and not zero_ok):
            raise ConfigError(f"{path}: {key} must be a positive number{' or 0 (off)' if zero_ok else ''}, "
                              f"not {value!r}")
        out[key] = kind(value)
    return out


def read_serve_options(path: str) -> dict[str, object]:
    """The `serve` options in a TOML settings file (SERVE_OPTIONS), checked by type; a DSN
    holding a password is refused."""
    from pgsched.errors import ConfigError

    out: dict[str, object] = {}
    for key, value in _load_toml(path).items():
        kind = SERVE_OPTIONS.get(key)
        if kind is None:
            continue
        if kind is list:
            if isinstance(value, str):
                value = [value]
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ConfigError(f"{path}: {key} must be a module name or a list of them, not {value!r}")
        elif not isinstance(value, kind):
            raise ConfigError(f"{path}: {key} must be a string, not {value!r}")
        if key in FILE_DSNS:
            _check_file_dsn(path, key, str(value))
        out[key] = value
    return out


def _check_file_dsn(path: str, key: str, dsn: str) -> None:
    """ConfigError, quoting nothing of `dsn`, when libpq cannot parse it or it holds a password."""
    from pgsched.errors import ConfigError

    try:
        has_password = "password" in psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        raise ConfigError(f"{path}: {key} is not a valid libpq connection string") from None
    if has_password:
        raise ConfigError(f"{path}: the {key} may not hold a password (a settings file is no place for a "
                          "secret): use PGPASSWORD, a ~/.pgpass file or a service file")
