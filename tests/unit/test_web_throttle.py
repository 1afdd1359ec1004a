"""Sign-in throttling (pgsched/web/throttle.py) with an explicit clock: the two limits, the sliding
window, what a success clears, and the table's bound."""

from __future__ import annotations

from pgsched.web.throttle import SignInThrottle


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_role_is_refused_after_its_limit_until_the_oldest_attempt_leaves_the_window() -> None:
    clock = Clock()
    t = SignInThrottle(per_role=3, per_client=10, window=60.0, clock=clock)
    for _ in range(3):
        assert t.wait("10.0.0.1", "alice") == 0.0
        t.refused("10.0.0.1", "alice")
        clock.now += 10
    # attempts at 1000, 1010, 1020; now 1030: free again at 1060
    assert t.wait("10.0.0.1", "alice") == 30.0
    assert t.wait("10.0.0.1", "bob") == 0.0  # another role from the same client
    assert t.wait("10.0.0.2", "alice") == 0.0  # the same role from elsewhere
    clock.now = 1059.9
    assert t.wait("10.0.0.1", "alice") > 0
    clock.now = 1060.0
    assert t.wait("10.0.0.1", "alice") == 0.0
    t.refused("10.0.0.1", "alice")  # back at the limit: free when 1010's leaves
    assert t.wait("10.0.0.1", "alice") == 10.0


def test_a_client_trying_many_roles_is_refused_for_all_of_them() -> None:
    clock = Clock()
    t = SignInThrottle(per_role=3, per_client=5, window=60.0, clock=clock)
    for i in range(5):
        t.refused("10.0.0.1", f"role{i}")
    assert t.wait("10.0.0.1", "someone_else") == 60.0
    assert t.wait("10.0.0.9", "someone_else") == 0.0


def test_a_success_clears_its_role_count_not_the_clients() -> None:
    clock = Clock()
    t = SignInThrottle(per_role=2, per_client=3, window=60.0, clock=clock)
    t.refused("c", "alice")
    t.refused("c", "alice")
    assert t.wait("c", "alice") > 0
    t.accepted("c", "alice")
    assert t.wait("c", "alice") == 0.0
    t.refused("c", "bob")  # the client's third refusal in the window
    assert t.wait("c", "alice") == 60.0


def test_the_table_stays_within_its_bound() -> None:
    clock = Clock()
    t = SignInThrottle(per_role=5, per_client=5, window=60.0, clock=clock, max_keys=100)
    for i in range(1000):
        t.refused(f"10.0.{i // 256}.{i % 256}", "alice")
        clock.now += 0.001
        assert len(t._refused) <= 100
    # the newest are kept: the last client still has its two keys
    assert t.wait("10.0.3.231", "alice") == 0.0 and ("10.0.3.231", "alice") in t._refused
    # asking creates nothing
    for i in range(500):
        t.wait(f"192.168.0.{i}", "x")
    assert len(t._refused) <= 100
