"""`pgsched watch`: follow pgsched_events (README "Events") and describe each event that this
role may see. Only the kind and the ids are taken from a payload; the job's name and the run's error are read
through the views, so row-level security decides: an event about a job this role cannot
see is not shown."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

from pgsched.errors import printable
from pgsched.ops import query

CHANNEL = "pgsched_events"
EVENTS = ("run_end", "job_disabled")  # README "Events"
FAILED = ("failure", "timeout", "crash", "cancelled")  # the outcomes a run_end is sent for


# A run_end names a run that ended a moment ago, or one whose close was written late (its
# scheduler cut off, the catalog locked): one that ended before the watch began, by more than
# this, is a notification sent again (anyone may NOTIFY), not news.
RECENT_S = 60.0
# The runs whose end was shown, remembered to show none twice: the latest this many.
REMEMBERED = 10_000


def follow(conn: query.Conn, *, limit: int | None = None, timeout: float | None = None,
           on_listening: Callable[[], None] | None = None) -> Iterator[dict[str, Any]]:
    """The visible events as they come, each with its details, each run's end once; stops after
    `limit` events or `timeout` seconds without one shown (None: never): events this role may not
    see, or that the views do not bear out, do not hold it open."""
    conn.execute(f"LISTEN {CHANNEL}")
    if on_listening is not None:
        on_listening()
    shown = 0
    began = time.monotonic()
    ended: dict[int, None] = {}  # the runs whose end was shown, oldest first
    deadline = None if timeout is None else began + timeout
    while limit is None or shown < limit:
        wait = None if deadline is None else deadline - time.monotonic()
        if wait is not None and wait <= 0:
            return
        # Read first, then query: the generator holds the connection while it waits.
        payloads = [n.payload for n in conn.notifies(timeout=wait, stop_after=1)]
        for payload in payloads:
            if limit is not None and shown >= limit:
                return
            event = describe(conn, payload, max_age=time.monotonic() - began + RECENT_S)
            if event is None:
                continue
            if event["event"] == "run_end":
                if event["run_id"] in ended:
                    continue
                ended[event["run_id"]] = None
                if len(ended) > REMEMBERED:
                    del ended[next(iter(ended))]
            shown += 1
            if timeout is not None:
                deadline = time.monotonic() + timeout
            yield event


def _id(value: Any) -> int | None:
    """An id as the payload must carry it: a JSON integer (None: anything else)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def describe(conn: query.Conn, payload: str, max_age: float = RECENT_S) -> dict[str, Any] | None:
    """The event a payload announces, or None. Anyone may NOTIFY on the channel, so only the kind
    and the ids are taken from it; all else is read through the views, and an event they do not
    bear out (no such run of that job, a run that did not fail or ended more than `max_age`
    seconds ago, a job neither disabled nor given a reason) is dropped, as is one this role may
    not see."""
    try:
        event = json.loads(payload)
    except ValueError:
        return None
    if not isinstance(event, dict) or event.get("event") not in EVENTS:
        return None
    job_id, run_id = _id(event.get("job_id")), _id(event.get("run_id"))
    if job_id is None or (event.get("run_id") is not None and run_id is None) or \
            (event["event"] == "run_end" and run_id is None):
        return None
    found = query.event_details(conn, run_id, job_id)
    if found is None or found["job_id"] != job_id:
        return None
    details = dict(found)
    ended_ago = details.pop("ended_ago_s")
    if event["event"] == "run_end" and (details["outcome"] not in FAILED or (ended_ago or 0.0) > max_age):
        return None
    # (A running job disabled meanwhile, by its upstream's pause say, is 'starting' with the reason
    # set until its run ends.)
    if event["event"] == "job_disabled" and details["state"] != "disabled" and not details["disabled_reason"]:
        return None
    return {"event": event["event"], "run_id": run_id, **details}


def text(e: dict[str, Any]) -> str:
    """One line for a person: what roles wrote (a job's name, an error) cannot break it into
    others or drive the terminal (errors.printable)."""
    plan = e.get("plan_time")
    head = f"{plan.isoformat() if plan is not None else '-'} job {e['job_id']} ({e.get('job_name')})"
    if e["event"] == "job_disabled":
        return printable(f"{head} DISABLED: {e.get('disabled_reason') or 'no reason recorded'}")
    err = f" [{e['sqlstate']}]" if e.get("sqlstate") else ""
    return printable(f"{head} run {e['run_id']} attempt {e.get('attempt')} {str(e.get('outcome')).upper()}{err}: "
                     f"{e.get('message') or ''}".rstrip(": "))
