"""The messages of the process contract between the scheduler and its workers, and the rules both sides share.

A worker writes one JSON object per line on its stdout, each an event below with its kind
in the "event" key; the scheduler (pgsched.launcher) reads them back into these records.
A line with an unknown kind or missing fields is a protocol error, never guessed at.
Owned here because the worker, the Python job runner (pgsched.pyjob) and the scheduler
all speak it: the message cap and a run's application_name are defined once, here (the
SQL side is checked against them by tests/integration/test_protocol.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

# Messages and stored text stay small: history rows are read by people.
MAX_MESSAGE = 4000


def cap(text: str) -> str:
    """`text` within MAX_MESSAGE characters (cut with '...' when longer)."""
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 3] + "..."


def run_app_name(job_id: int, run_id: int, lease_token: int | None) -> str:
    """application_name of a run's backend: names the job, the run and the lease in pg_stat_activity.

    The lease token is in it so that a stale attempt's backend is never confused with a
    takeover's (pgsched._terminate_run_backend finds backends by this name, never by pid).
    The SQL side formats it as pgsched._run_app_name does.
    """
    return f"pgsched job {job_id} run {run_id} lease {lease_token}"


@dataclass(frozen=True)
class Ready:
    """The worker is connected (and its app modules imported): it can take a run."""

    KIND: ClassVar[str] = "ready"
    pid: int
    backend_pid: int
    role: str | None = None
    database: str | None = None  # None: the scheduler's own


@dataclass(frozen=True)
class Backend:
    """The worker switched sessions for a run (another owner's, or a new one: the idle one was closed)."""

    KIND: ClassVar[str] = "backend"
    run_id: int
    backend_pid: int
    role: str | None = None
    database: str | None = None  # None: the scheduler's own
    # The [role, database] of the other sessions it keeps (pgsched.worker.Session): where a run of
    # those owners finds a session without opening one.
    parked: list[list[str | None]] = field(default_factory=list)


@dataclass(frozen=True)
class Done:
    """A run ended: ok, or the error (sqlstate, message). `lost`: the connection died with it;
    `owner_unusable`: no session as the job's owner could be had, by the owner's doing (the job is
    disabled); `parked`: the worker's parked sessions, when they changed since it last said."""

    KIND: ClassVar[str] = "done"
    run_id: int
    ok: bool
    sqlstate: str | None = None
    message: str | None = None
    lost: bool = False
    owner_unusable: bool = False
    rows_affected: int | None = None
    result: Any = None
    scopes: list[str] | None = None  # a scoped job's plan run: the keys its scope_query returned
    parked: list[list[str | None]] | None = None


@dataclass(frozen=True)
class Lost:
    """The worker's idle session was lost: replace it and close its stdin (it exits then, or at once)."""

    KIND: ClassVar[str] = "lost"


@dataclass(frozen=True)
class Failed:
    """The worker could not start (connect, or import the app modules): it exits."""

    KIND: ClassVar[str] = "error"
    message: str


Event = Ready | Backend | Done | Lost | Failed
_KINDS: dict[str, type[Ready] | type[Backend] | type[Done] | type[Lost] | type[Failed]] = {
    c.KIND: c for c in (Ready, Backend, Done, Lost, Failed)}
# Each kind's field names, read once: an event is written and read on every run (asdict would
# also deep-copy the result).
_FIELDS = {c: tuple(f.name for f in fields(c)) for c in _KINDS.values()}


class ProtocolError(ValueError):
    """A line a worker wrote is not one of the events above."""


def encode(event: Event) -> str:
    return json.dumps({"event": event.KIND, **{name: getattr(event, name) for name in _FIELDS[type(event)]}})


def decode(line: bytes | str) -> Event:
    try:
        obj = json.loads(line)
    except ValueError as e:
        raise ProtocolError(f"not JSON: {line[:200]!r}") from e
    if not isinstance(obj, dict):
        raise ProtocolError(f"not an object: {line[:200]!r}")
    cls = _KINDS.get(str(obj.pop("event", "")))
    if cls is None:
        raise ProtocolError(f"unknown event kind in {line[:200]!r}")
    known = _FIELDS[cls]
    parked = obj.get("parked")
    if parked is not None and not (isinstance(parked, list) and all(
            isinstance(k, list) and len(k) == 2 and all(v is None or isinstance(v, str) for v in k) for k in parked)):
        raise ProtocolError(f"{cls.KIND} event whose parked is not a list of [role, database]: {line[:200]!r}")
    try:
        return cls(**{k: v for k, v in obj.items() if k in known})
    except TypeError as e:
        raise ProtocolError(f"{cls.KIND} event with missing fields: {line[:200]!r}") from e
