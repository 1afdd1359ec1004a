"""The operator commands' pure parts: status's verdict, `next`'s start times, --since, request payloads."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from pgsched import exclusion
from pgsched.ops import health, upcoming
from pgsched.ops.query import parse_duration
from pgsched.schedule import ScheduleError

NOW = datetime(2026, 3, 28, 12, 0, tzinfo=UTC)


def inst(i: int, alive: bool, heartbeat_ago: timedelta, stopped: bool = False) -> dict[str, Any]:
    return {"instance_id": i, "host": "h", "pid": 100 + i, "alive": alive, "heartbeat_at": NOW - heartbeat_ago,
            "stopped_at": NOW if stopped else None}


def job(j: int, state: str, reason: str | None = None) -> dict[str, Any]:
    return {"job_id": j, "job_name": f"j{j}", "state": state, "disabled_reason": reason}


def test_status_verdicts() -> None:
    live = inst(1, True, timedelta(seconds=1))
    assert health.judge([live], [job(1, "scheduled"), job(2, "disabled")], NOW).code == health.HEALTHY  # paused
    v = health.judge([live], [job(2, "disabled", "disabled after 3 consecutive failures")], NOW)
    assert (v.code, v.word) == (health.DEGRADED, "degraded") and "job 2 (j2) disabled" in v.reasons[0]
    died = inst(2, False, timedelta(minutes=5))
    assert health.judge([live, died], [], NOW).code == health.DEGRADED
    # Stopped cleanly, or dead long ago: not alarming.
    assert health.judge([live, inst(3, False, timedelta(minutes=5), stopped=True),
                         inst(4, False, timedelta(days=2))], [], NOW).code == health.HEALTHY
    down = health.judge([died], [job(2, "disabled", "x")], NOW)
    assert down.code == health.DOWN and down.reasons[0] == "no live scheduler instance"
    assert health.judge([], [], NOW).code == health.DOWN


def test_next_starts_fixed_drifting_cron_and_delay() -> None:
    s = upcoming.parse("15 minutes", None)
    assert upcoming.next_starts(s, first=NOW, n=3) == [NOW, NOW + timedelta(minutes=15), NOW + timedelta(minutes=30)]
    delayed = upcoming.next_starts(s, first=NOW + timedelta(seconds=5), n=2, delay=timedelta(seconds=5))
    assert delayed == [NOW + timedelta(seconds=5), NOW + timedelta(minutes=15, seconds=5)]
    cron = upcoming.parse("30 2 * * *", "Europe/Berlin")  # 29 March 2026: the clocks go forward at 02:00
    first = datetime(2026, 3, 28, 1, 30, tzinfo=UTC)  # 02:30 CET
    got = upcoming.next_starts(cron, first=first, n=3)
    assert [t.isoformat() for t in got] == ["2026-03-28T01:30:00+00:00", "2026-03-29T01:00:00+00:00",
                                            "2026-03-30T00:30:00+00:00"]
    for bad, tz in (("* * *", None), ("every day", None), ("15 minutes", "Mars/Olympus")):
        with pytest.raises(ScheduleError):
            upcoming.parse(bad, tz)


def test_next_starts_leave_out_the_exclusion_window() -> None:
    s = upcoming.parse("30 minutes", "Europe/Berlin")
    night = exclusion.parse("* 2-3 * * *")
    first = datetime(2026, 6, 1, 23, 0, 10, tzinfo=UTC)  # the plan of 01:00 CEST, plus its delay
    got = upcoming.next_starts(s, first=first, n=4, window=night, delay=timedelta(seconds=10))
    # 01:00 and 01:30 local, then 02:00-03:59 left out, 04:00 and 04:30 (each plus the delay).
    assert [t.isoformat() for t in got] == ["2026-06-01T23:00:10+00:00", "2026-06-01T23:30:10+00:00",
                                            "2026-06-02T02:00:10+00:00", "2026-06-02T02:30:10+00:00"]
    # A stored first start inside the window (written before the window was there): the next outside it.
    inside = upcoming.next_starts(s, first=datetime(2026, 6, 2, 0, 30, 10, tzinfo=UTC), n=1, window=night,
                                  delay=timedelta(seconds=10))
    assert inside == [datetime(2026, 6, 2, 2, 0, 10, tzinfo=UTC)]


def test_durations() -> None:
    assert parse_duration("1h30m", "--since") == timedelta(hours=1, minutes=30)
    assert parse_duration("90s", "--since") == timedelta(seconds=90)
    assert parse_duration("2d", "--since") == timedelta(days=2)
    for bad in ("", "1", "h", "1x", "-1h", "1h garbage", "0s"):
        with pytest.raises(ValueError, match=r"--since: .* use a number and a unit"):
            parse_duration(bad, "--since")


@pytest.mark.parametrize(("text", "why"), [("@after", "it runs after its upstream jobs"),
                                           (" @restart", "it runs each time the server starts")])
def test_a_job_the_database_plans_has_no_start_times_to_show(text: str, why: str) -> None:
    row = {"schedule": text, "fixed_schedule": True, "initial_start": None, "timezone": None, "next_start": None,
           "schedule_delay": None, "exclude": None, "months": None, "days": None, "micros": None}
    with pytest.raises(ScheduleError, match=f"'{text.strip()}' has no start times of its own: {why}"):
        upcoming.job_starts(row, now=datetime(2030, 1, 1, tzinfo=UTC), n=3)
