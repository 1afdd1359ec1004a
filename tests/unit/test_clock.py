"""DbClock: anchored on the database's time, advanced by the monotonic clock (explicit, no sleeping)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest

from pgsched.clock import DbClock

T = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


class Mono:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def mono(monkeypatch: pytest.MonkeyPatch) -> Mono:
    m = Mono()
    monkeypatch.setattr(time, "monotonic", m)
    return m


def test_a_fresh_anchor_sets_the_time_and_the_monotonic_clock_advances_it(mono: Mono) -> None:
    c = DbClock()
    c.anchor(T)
    mono.t += 2.5
    assert c.now() == T + timedelta(seconds=2.5)


def test_a_reply_read_late_does_not_set_the_clock_back(mono: Mono) -> None:
    c = DbClock()
    c.anchor(T)
    # The server stamped T + 1 s, then the process was paused 10 s before reading the reply:
    # the round trip lasted 10.2 s and the clock, advanced by the monotonic clock, is right.
    mono.t += 11.0
    c.anchor(T + timedelta(seconds=1), rtt=10.2)
    assert c.now() == T + timedelta(seconds=11)


def test_an_estimate_outside_the_round_trip_is_moved_to_its_nearest_end(mono: Mono) -> None:
    c = DbClock()
    c.anchor(T)
    mono.t += 1.0
    # The server is ahead of our estimate (T + 1 s) by 5 s: move to the earliest possible time.
    c.anchor(T + timedelta(seconds=6), rtt=0.1)
    assert c.now() == T + timedelta(seconds=6)
    # ... and behind it: move to the latest possible time.
    mono.t += 1.0
    c.anchor(T + timedelta(seconds=3), rtt=0.5)
    assert c.now() == T + timedelta(seconds=3.5)
