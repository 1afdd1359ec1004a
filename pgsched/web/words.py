"""A schedule in plain words beside its expression ('every 15 minutes', 'daily at 02:30').
Common cron shapes only; anything else reads as "cron: <expression>" rather than a guess."""

from __future__ import annotations

import re

from pgsched import schedule

_DOW = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]


def _hm(h: str, m: str) -> str:
    return f"{int(h):02d}:{int(m):02d}"


def describe(expr: str | None, timezone: str | None = None) -> str:
    if not expr:
        return "not scheduled"
    tz = f" ({timezone})" if timezone else ""
    text = expr.strip()
    if schedule.is_after(text):
        return "after its upstream jobs"
    if schedule.is_restart(text):
        return "when the server starts"
    if not schedule.looks_like_cron(text):
        try:
            schedule.parse_interval(text)
        except schedule.ScheduleError:
            return text
        return f"every {text}"
    f = text.split()
    if len(f) != 5:
        return f"cron: {text}"
    m, h, dom, mon, dow = f
    num = re.compile(r"^\d+$")
    if f == ["*"] * 5:
        return "every minute"
    if m.startswith("*/") and num.match(m[2:]) and h == dom == mon == dow == "*":
        return f"every {int(m[2:])} minutes"
    if num.match(m) and h == dom == mon == dow == "*":
        return f"hourly at minute {int(m)}"
    if num.match(m) and h.startswith("*/") and num.match(h[2:]) and dom == mon == dow == "*":
        return f"every {int(h[2:])} hours at minute {int(m)}"
    if num.match(m) and num.match(h) and mon == "*":
        if dom == dow == "*":
            return f"daily at {_hm(h, m)}{tz}"
        if dom == "*" and num.match(dow) and int(dow) <= 7:
            return f"every {_DOW[int(dow)]} at {_hm(h, m)}{tz}"
        if dom == "*" and dow == "1-5":
            return f"weekdays at {_hm(h, m)}{tz}"
        if num.match(dom) and dow == "*":
            return f"monthly on day {int(dom)} at {_hm(h, m)}{tz}"
    return f"cron: {text}"
