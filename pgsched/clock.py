"""The scheduler's one clock.

Scheduling decisions use the database's time: the claim query compares
next_start with now() on the server, and the scheduler's own notion of "now"
is anchored on the server time each round trip returns, advanced by the local
monotonic clock in between. Several hosts therefore share one clock and a host
whose wall clock is off does not matter. The schedule and state logic never read
a clock at all (they take `now` as an argument), which is how their tests run
without sleeping.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime:
        """Current database time (aware, UTC)."""
        ...

    def anchor(self, db_now: datetime, rtt: float = 0.0) -> None:
        """Re-anchor on a time the database reported during a round trip of `rtt` seconds."""
        ...


class DbClock:
    """Database time = last server timestamp seen + local monotonic time elapsed since."""

    def __init__(self) -> None:
        self._db = datetime.now(UTC)
        self._mono = time.monotonic()

    def now(self) -> datetime:
        return self._db + timedelta(seconds=time.monotonic() - self._mono)

    def anchor(self, db_now: datetime, rtt: float = 0.0) -> None:
        """The server read db_now at some instant of the round trip that just ended, so the time now
        lies between db_now and db_now + rtt: keep the running estimate if it is inside, else move
        it to the nearest end. A reply read late (the process was paused, or the round trip was
        slow) therefore cannot set the clock back by the delay."""
        lo = db_now.astimezone(UTC)
        hi = lo + timedelta(seconds=max(rtt, 0.0))
        self._db = min(max(self.now(), lo), hi)
        self._mono = time.monotonic()
