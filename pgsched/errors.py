"""Error classes named after what happened, so callers catch a class instead of parsing text."""

from __future__ import annotations


class PgschedError(Exception):
    """Base class of every error pgsched raises on purpose."""


class ConfigError(PgschedError):
    """A setting is missing or malformed (DSN, option, environment)."""


class SchemaVersionMismatch(PgschedError):
    """The database's pgsched schema is not the one this code expects."""


class MigrationChecksumMismatch(PgschedError):
    """A migration recorded in the database differs from the file of the same number."""


class ClusterError(PgschedError):
    """The embedded local PostgreSQL could not be created, started or stopped."""


class DeployError(PgschedError):
    """The catalog refused the @pgsched.job declarations of an app (e.g. a name clash)."""


class PgCronConflict(PgschedError):
    """The pg_cron compatibility schema cannot be installed: pg_cron (or another `cron` schema) is there."""


def text_of(e: BaseException) -> str:
    """str(e), or a placeholder when the exception's __str__ itself raises (a handler's exception
    may be of any class): what reports it must not fail in turn."""
    try:
        return str(e)
    except Exception:
        return "<exception str() failed>"  # as the traceback module says it


def first_line(e: BaseException) -> str:
    """The first line of an error's text, for one-line log messages."""
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


# C0 controls (tab aside), DEL and the C1 controls, as Python escapes them.
_CONTROLS = {c: repr(chr(c))[1:-1] for c in (*range(0x20), 0x7F, *range(0x80, 0xA0)) if c != 0x09}


def printable(text: str) -> str:
    """`text` for a terminal or a text log line: control characters escaped (\\n, \\x1b), so that
    text a role wrote (a job's name, an error) cannot move the cursor, erase a line or start a
    line that looks like another record. Line and paragraph separators are escaped too."""
    if text.isprintable():
        return text
    return text.translate(_CONTROLS).replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
