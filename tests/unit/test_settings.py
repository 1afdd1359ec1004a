"""Scheduler settings: the defaults hold together, and a lease that would expire between heartbeats is refused."""

from __future__ import annotations

import pytest

from pgsched.errors import ConfigError
from pgsched.settings import Settings


def test_the_defaults_are_consistent() -> None:
    s = Settings(dsn="")
    assert (s.heartbeat_interval, s.dead_after) == (2.0, 10.0)


@pytest.mark.parametrize(("heartbeat", "dead_after"), [(5.0, 10.0), (2.0, 2.0), (0.5, 1.0)])
def test_dead_after_must_leave_room_for_missed_heartbeats(heartbeat: float, dead_after: float) -> None:
    with pytest.raises(ConfigError, match=r"dead_after .* must be at least 3 x heartbeat_interval"):
        Settings(dsn="", heartbeat_interval=heartbeat, dead_after=dead_after)
