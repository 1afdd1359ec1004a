"""parse_interval: the interval literals pgsched reads exactly as PostgreSQL does."""

from __future__ import annotations

import pytest

from pgsched.schedule import Interval, ScheduleError, parse_interval


@pytest.mark.parametrize(("text", "expected"), [
    ("5 minutes", Interval(0, 0, 300_000_000)),
    ("1 day 02:00:00", Interval(0, 1, 7_200_000_000)),
    ("1 month", Interval(1, 0, 0)),
    ("2 years 3 mons", Interval(27, 0, 0)),
    ("90 s", Interval(0, 0, 90_000_000)),
    ("250 ms", Interval(0, 0, 250_000)),
    ("1.5 days", Interval(0, 1, 43_200_000_000)),
    ("1.5 months", Interval(1, 15, 0)),
    ("@ 1 hour", Interval(0, 0, 3_600_000_000)),
    ("1 week, 2 days", Interval(0, 9, 0)),
    ("00:00:01.5", Interval(0, 0, 1_500_000)),
])
def test_parses_like_postgresql(text: str, expected: Interval) -> None:
    assert parse_interval(text) == expected


@pytest.mark.parametrize("text", ["", "five minutes", "5 fortnights", "5 minutes; DROP TABLE x", "-", "1:2:3:4",
                                  "50 seconds c", "5 secondc", "1 hour ago"])
def test_rejects_with_the_accepted_form(text: str) -> None:
    with pytest.raises(ScheduleError, match="expected an interval such as"):
        parse_interval(text)
