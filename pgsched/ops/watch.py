"""`pgsched watch`: follow pgsched_events (README "Events") and describe each event that this
role may see. The payload carries ids only; the job's name and the run's error are read
through the views, so row-level security decides: an event about a job this role cannot
see is not shown."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

from pgsched.ops import query

CHANNEL = "pgsched_events"


def follow(conn: query.Conn, *, limit: int | None = None, timeout: float | None = None,
           on_listening: Callable[[], None] | None = None) -> Iterator[dict[str, Any]]:
    """The visible events as they come, each with its details; stops after `limit` events or
    `timeout` seconds without one (None: never)."""
    conn.execute(f"LISTEN {CHANNEL}")
    if on_listening is not None:
        on_listening()
    shown = 0
    while limit is None or shown < limit:
        # Read first, then query: the generator holds the connection while it waits.
        payloads = [n.payload for n in conn.notifies(timeout=timeout, stop_after=1)]
        if not payloads:
            return
        for payload in payloads:
            if limit is not None and shown >= limit:
                return
            event = describe(conn, payload)
            if event is not None:
                shown += 1
                yield event


def describe(conn: query.Conn, payload: str) -> dict[str, Any] | None:
    try:
        event = json.loads(payload)
        job_id = int(event["job_id"])
        run_id = None if event.get("run_id") is None else int(event["run_id"])
    except (ValueError, KeyError, TypeError):
        return None  # not one of ours (anyone may NOTIFY on the channel)
    details = query.event_details(conn, run_id, job_id)
    if details is None:
        return None
    return {**event, **details}


def text(e: dict[str, Any]) -> str:
    """One line for a person."""
    head = f"{e.get('plan_time') or '-'} job {e['job_id']} ({e.get('job_name')})"
    if e["event"] == "job_disabled":
        return f"{head} DISABLED: {e.get('disabled_reason') or 'no reason recorded'}"
    err = f" [{e['sqlstate']}]" if e.get("sqlstate") else ""
    return f"{head} run {e['run_id']} attempt {e.get('attempt')} {str(e.get('outcome')).upper()}{err}: " \
           f"{e.get('message') or ''}".rstrip(": ")
