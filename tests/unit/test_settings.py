"""Scheduler settings: the defaults hold together, and a lease that would expire between heartbeats is refused."""

from __future__ import annotations

import pytest

from pgsched.errors import ConfigError
from pgsched.settings import Settings, default_max_workers


def test_the_defaults_are_consistent() -> None:
    s = Settings(dsn="")
    assert (s.heartbeat_interval, s.dead_after) == (2.0, 10.0)
    assert s.max_workers == default_max_workers()


@pytest.mark.parametrize(("cores", "workers"), [(1, 16), (2, 32), (3, 32), (64, 32), (0, 1)])
def test_the_default_worker_count_is_sixteen_per_core_at_most_thirty_two(cores: int, workers: int) -> None:
    assert default_max_workers(cores) == workers


@pytest.mark.parametrize(("cores", "connections", "workers"),
                         [(2, 97, 24), (2, 297, 32), (1, 97, 16), (2, 20, 5), (2, 3, 1), (8, 0, 1)])
def test_the_default_worker_count_takes_at_most_a_quarter_of_the_servers_connections(
        cores: int, connections: int, workers: int) -> None:
    # 97: PostgreSQL's default max_connections (100) less its 3 superuser_reserved_connections.
    assert default_max_workers(cores, connections) == workers


@pytest.mark.parametrize(("heartbeat", "dead_after"), [(5.0, 10.0), (2.0, 2.0), (0.5, 1.0)])
def test_dead_after_must_leave_room_for_missed_heartbeats(heartbeat: float, dead_after: float) -> None:
    with pytest.raises(ConfigError, match=r"dead_after .* must be at least 3 x heartbeat_interval"):
        Settings(dsn="", heartbeat_interval=heartbeat, dead_after=dead_after)


@pytest.mark.parametrize("sessions", [0, -1, 65])
def test_worker_sessions_is_a_whole_number_from_one_to_sixty_four(sessions: int) -> None:
    assert Settings(dsn="").worker_sessions == 4
    assert Settings(dsn="", worker_sessions=64).worker_sessions == 64
    with pytest.raises(ConfigError, match=r"worker_sessions must be a whole number from 1 to 64, not "):
        Settings(dsn="", worker_sessions=sessions)


def test_serve_refuses_worker_sessions_out_of_range_before_connecting() -> None:
    from click.testing import CliRunner

    from pgsched.commands import main

    result = CliRunner().invoke(main, ["serve", "--worker-sessions", "0", "--dsn", "host=/nonexistent"])
    assert result.exit_code == 2
    assert "--worker-sessions" in result.output and "1<=x<=64" in result.output
